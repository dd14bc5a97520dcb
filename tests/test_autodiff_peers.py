"""Gradients in float32 against PyTorch autograd, fusion on and off: every primitive with a
gradient rule that PyTorch has, and a dense + GeLU + LayerNorm + Softmax block of odd sizes.
PyTorch is a bench peer (bench/requirements.txt), not a test dependency: without it these skip
(`pip install -r bench/requirements.txt` to run them)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from test_autodiff import CASES

import graphkernel as gk
from graphkernel import Tensor
from graphkernel.frontend import context
from graphkernel.ops import operations as P

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.slow  # every gradient against a peer library (PyTorch)

# The same function in PyTorch, for each op of test_autodiff.CASES (Cast's case is float64).
TORCH: dict[str, Callable[..., Any]] = {
    "Add": lambda x, y: x + y,
    "Sub": lambda x, y: x - y,
    "Mul": lambda x, y: x * y,
    "RealDiv": lambda x, y: x / y,
    "Neg": lambda x: -x,
    "Maximum": torch.maximum,
    "Minimum": torch.minimum,
    "Pow": torch.pow,
    "Sqrt": torch.sqrt,
    "Rsqrt": torch.rsqrt,
    "Reciprocal": torch.reciprocal,
    "Exp": torch.exp,
    "Log": torch.log,
    "Tanh": torch.tanh,
    "Erf": torch.erf,
    "Abs": torch.abs,
    "Floor": lambda x: torch.floor(x) + x,
    "Round": lambda x: torch.round(x) * x,
    "Sign": lambda x: torch.sign(x) * x,
    "Select": lambda x, y: torch.where(x > 0, x, y),
    "ReduceSum": lambda x: x.sum(1),
    "ReduceProd": lambda x: x.prod(0, keepdim=True),
    "ReduceMax": lambda x: x.amax(-1),
    "ReduceMin": lambda x: x.amin((0, 1), keepdim=True),
    "ReduceMean": lambda x: x.mean((0, 2)),
    "Reshape": lambda x: x.reshape(2, 6),
    "Transpose": lambda x: x.permute(2, 0, 1),
    "ExpandDims": lambda x: x.unsqueeze(1),
    "Squeeze": lambda x: x.squeeze(1),
    "BroadcastTo": lambda x: x.expand(2, 3, 4),
    "Tile": lambda x: x.repeat(2, 1, 3),
    "MatMul": lambda x, y: x @ y,
    "BatchMatMul": lambda x, y: x @ y.transpose(-1, -2),
    "GeLU": lambda x: F.gelu(x, approximate="tanh"),
    "FastGeLU": lambda x: x * torch.sigmoid(1.702 * x),
    "Sigmoid": torch.sigmoid,
    "SiLU": F.silu,
    "ReLU": F.relu,
    "ReLU6": lambda x: F.relu6(x * 4.0),
    "HSwish": lambda x: F.hardswish(x * 3.0),
    "Softplus": F.softplus,
    "Square": torch.square,
    "SquaredDifference": lambda x, y: (x - y) ** 2,
    "BiasAdd": lambda x, b: x + b.reshape(1, -1, 1),
    "AddN": lambda x, y: x + y + x,
    "Softmax": lambda x: torch.softmax(x, -1),
    "LogSoftmax": lambda x: torch.log_softmax(x, 0),
    "LayerNorm": lambda x, g, b: F.layer_norm(x, (x.shape[-1],), g, b, eps=1e-7),
    "Sin": torch.sin,
    "Cos": torch.cos,
    "Expm1": torch.expm1,
    "Log1p": torch.log1p,
    "Erfc": torch.erfc,
    "Softsign": F.softsign,
    "Identity": lambda x: x * x,
    # MindSpore's pad is (top, bottom, left, right), F.pad's (left, right, top, bottom).
    "Conv2D": lambda x, w: F.conv2d(F.pad(x, (2, 1, 1, 0)), w, stride=2, dilation=(2, 1),
                                    groups=2),
    "MaxPool": lambda x: F.max_pool2d(x, 3, 2),
    "AvgPool": lambda x: F.avg_pool2d(x, (2, 3), (2, 1)),
    "BatchNorm": lambda x, s, b, m, v: F.batch_norm(x, None, None, s, b, training=True,
                                                    eps=1e-5) + 0 * (m.sum() + v.sum()),
    "Gather": lambda p: p[torch.tensor([[0, 3], [3, 4], [3, 0]])],
    "Slice": lambda x: x[1:3, :, 2:3],
    "StridedSlice": lambda x: x.flip(0)[0::2, 0:5:2, 1],
    "Concat": lambda x, y: torch.cat((x, y, x), 1),
    "Split": lambda x: x.chunk(3, 1)[0] * 2.0 + x.chunk(3, 1)[2],
    "Stack": lambda x, y: torch.stack((x, y * 2.0), -1),
    "Unstack": lambda x: x.unbind(1)[0] * 2.0 + x.unbind(1)[-1],
    "Dropout": lambda x: x * x,
}


@pytest.fixture(params=[False, True], ids=["unfused", "fused"])
def fusion(request: Any) -> Any:
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=request.param)
    yield request.param
    context.set_context(enable_graph_kernel=False)


def compare_with_torch(fn: Callable[..., Any], torch_fn: Callable[..., Any],
                       arrays: list[np.ndarray], rtol: float = 2e-4, atol: float = 2e-5
                       ) -> None:
    """d/d inputs of sum(out * weights) (weights random, so a misplaced gradient shows), from
    graphkernel and from torch.autograd, all in float32."""
    arrays = [a.astype(np.float32) for a in arrays]
    leaves = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = torch_fn(*leaves)
    weights = np.random.default_rng(11).uniform(0.5, 1.5, tuple(out.shape)).astype(np.float32)
    (out * torch.from_numpy(weights)).sum().backward()

    def loss(*xs: Any) -> Any:
        return P.ReduceSum()(fn(*xs) * Tensor(weights))

    grads = gk.grad(loss, tuple(range(len(arrays))))(*[Tensor(a) for a in arrays])
    grads = grads if isinstance(grads, tuple) else (grads,)
    for i, (got, leaf) in enumerate(zip(grads, leaves)):
        want = leaf.grad.numpy()
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got.asnumpy(), want, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")


# Cases of test_autodiff without a torch twin here, each with the reason; test_autodiff checks
# all of them against finite differences. A new case needs a twin or a line here.
NO_TWIN = {
    "Cast": "float64 casts: torch's float32 comparison would test the cast, not the rule",
    # Gradient ops: their own gradient is a second derivative; a torch twin would be
    # torch.autograd.grad(..., create_graph=True) of the forward op, not written yet.
    **{op: "a gradient op (second order)" for op in (
        "FastGeLUGrad", "GeLUGrad", "LogSoftmaxGrad", "ReluGrad", "RsqrtGrad", "SigmoidGrad",
        "SoftmaxGrad", "SqrtGrad", "TanhGrad")},
    "Median": "its twin (torch.median and its gradient) not written yet",
    "SigmoidCrossEntropyWithLogits": "a loss primitive: its twin is torch's loss, not written yet",
    "SoftmaxCrossEntropyWithLogits": "a loss primitive: its twin is torch's loss, not written yet",
}


def test_every_case_without_a_torch_twin_says_why() -> None:
    assert set(CASES) - set(TORCH) == set(NO_TWIN)


@pytest.mark.parametrize("name", sorted(TORCH))
def test_op_gradient_matches_torch_in_float32(name: str, fusion: bool) -> None:
    fn, specs = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)) + 1)
    compare_with_torch(fn, TORCH[name], [make(rng, shape) for make, shape in specs])


def test_dense_gelu_layernorm_softmax_block_matches_torch(fusion: bool) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((37, 70))
    w = rng.standard_normal((70, 130)) * 0.1
    b = rng.standard_normal(130)
    g = rng.uniform(0.5, 1.5, 130)
    beta = rng.standard_normal(130)

    def fn(x: Any, w: Any, b: Any, g: Any, beta: Any) -> Any:
        h = P.GeLU()(P.BiasAdd()(P.MatMul()(x, w), b))
        y = P.LayerNorm(epsilon=1e-5)(h, g, beta)[0]
        return P.Softmax()(y) + y * 0.5

    def torch_fn(x: Any, w: Any, b: Any, g: Any, beta: Any) -> Any:
        h = F.gelu(x @ w + b, approximate="tanh")
        y = F.layer_norm(h, (130,), g, beta, eps=1e-5)
        return torch.softmax(y, -1) + y * 0.5

    compare_with_torch(fn, torch_fn, [x, w, b, g, beta], rtol=1e-3, atol=1e-5)


def test_conv_batchnorm_pool_residual_block_matches_torch(fusion: bool) -> None:
    """A CNN block's gradients (conv, training BatchNorm, ReLU, max pool, grouped strided conv,
    residual, average pool) for the input and every weight."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 2, 9, 8))
    w1 = rng.standard_normal((4, 2, 3, 3)) * 0.3
    gamma, beta = rng.uniform(0.5, 1.5, 4), rng.standard_normal(4)
    w2 = rng.standard_normal((4, 2, 3, 3)) * 0.3

    def fn(x: Any, w1: Any, gamma: Any, beta: Any, w2: Any) -> Any:
        h = P.Conv2D(4, 3, pad_mode="same")(x, w1)
        zeros, ones = Tensor(np.zeros(4, np.float32)), Tensor(np.ones(4, np.float32))
        h = P.ReLU()(P.BatchNorm(is_training=True)(h, gamma, beta, zeros, ones)[0])
        h = P.MaxPool(kernel_size=2, strides=2, pad_mode="same")(h)
        h = P.Conv2D(4, 3, pad_mode="pad", pad=1, group=2)(h, w2) + h
        return P.AvgPool(kernel_size=2, strides=1)(h)

    def torch_fn(x: Any, w1: Any, gamma: Any, beta: Any, w2: Any) -> Any:
        h = F.conv2d(x, w1, padding=1)
        h = F.relu(F.batch_norm(h, None, None, gamma, beta, training=True, eps=1e-5))
        h = F.max_pool2d(F.pad(h, (0, 0, 0, 1), value=-float("inf")), 2, 2)  # 'same': 9 -> 5
        h = F.conv2d(h, w2, padding=1, groups=2) + h
        return F.avg_pool2d(h, 2, 1)

    compare_with_torch(fn, torch_fn, [x, w1, gamma, beta, w2], rtol=1e-3, atol=1e-4)
