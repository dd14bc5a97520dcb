"""Gradients against central finite differences in float64, fusion on and off: every primitive
with a gradient rule, random graphs of them, and the cases the issue names (broadcasting,
reductions with and without keep_dims, MatMul with transposes, LayerNorm, Softmax, GeLU in both
forms). Also the gradient API's shapes (grad, value_and_grad, GradOperation) and its errors."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import graphkernel as gk
from graphkernel import Parameter, Tensor, nn
from graphkernel.errors import GradientError, InputError
from graphkernel.frontend import context
from graphkernel.ir.opset import OPS
from graphkernel.ops import GradOperation
from graphkernel.ops import operations as P
from graphkernel.ops.operations import _grad_ops as G


# Fused on every run; unfused (each op a kernel of its own: the same gradient rules) in the
# slow step.
@pytest.fixture(params=[pytest.param(False, marks=pytest.mark.slow), True],
                ids=["unfused", "fused"])
def fusion(request: Any) -> Any:
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=request.param)
    yield request.param
    context.set_context(enable_graph_kernel=False)


def _away_from_zero(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values in +-[0.3, 1.5]: kinks (Abs, ReLU, Maximum ties) stay out of the difference."""
    return np.asarray(rng.uniform(0.3, 1.5, shape) * rng.choice([-1.0, 1.0], shape))


def _positive(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(0.5, 2.0, shape)


class Weighted(nn.Cell):
    """sum(fn(*inputs)[k] * r_k): a scalar whose gradient reaches every output element with a
    different weight (a plain sum would hide a transposed or misplaced gradient)."""

    def __init__(self, fn: Callable[..., Any], seed: int = 7) -> None:
        super().__init__()
        self.fn = fn
        self.rng = np.random.default_rng(seed)
        self.weights: dict[Any, np.ndarray] = {}

    def construct(self, *xs: Any) -> Any:
        out = self.fn(*xs)
        outs = out if isinstance(out, tuple) else (out,)
        total = None
        for i, o in enumerate(outs):
            key = (i, o.shape)
            if key not in self.weights:
                self.weights[key] = self.rng.uniform(0.5, 1.5, o.shape).astype(o.dtype)
            term = P.ReduceSum()(o * self.weights[key])
            total = term if total is None else total + term
        return total


def finite_differences(cell: nn.Cell, arrays: list[np.ndarray], eps: float = 1e-6
                       ) -> list[np.ndarray]:
    out = []
    for i, a in enumerate(arrays):
        g = np.zeros_like(a)
        for index in np.ndindex(a.shape):
            values = []
            for step in (eps, -eps):
                shifted = [x.copy() for x in arrays]
                shifted[i][index] += step
                values.append(float(cell(*[Tensor(x) for x in shifted]).asnumpy()))
            g[index] = (values[0] - values[1]) / (2 * eps)
        out.append(g)
    return out


def check_gradients(fn: Callable[..., Any], arrays: list[np.ndarray], rtol: float = 1e-5,
                    atol: float = 1e-6) -> list[np.ndarray]:
    """The gradients graphkernel computes for every input match central differences."""
    cell = Weighted(fn)
    positions = tuple(range(len(arrays)))
    grads = gk.grad(cell, positions)(*[Tensor(a) for a in arrays])
    want = finite_differences(cell, arrays)
    for i, (got, expect) in enumerate(zip(grads, want)):
        got = got.asnumpy()
        assert got.shape == arrays[i].shape and got.dtype == arrays[i].dtype
        np.testing.assert_allclose(got, expect, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")
    return [g.asnumpy() for g in grads]


def _first_and_last(items: Any) -> Any:
    """Two items of a Split or Unstack, the middle one unread (its gradient is zeros)."""
    return items[0] * 2.0 + items[-1]


# Every primitive with a gradient rule: how to call it and on what inputs (float64).
A = _away_from_zero
POS = _positive
CASES: dict[str, tuple[Callable[..., Any], list[tuple[Any, tuple[int, ...]]]]] = {
    "Add": (lambda x, y: P.Add()(x, y), [(A, (3, 4)), (A, (4,))]),
    "Sub": (lambda x, y: P.Sub()(x, y), [(A, (3, 1)), (A, (3, 4))]),
    "Mul": (lambda x, y: P.Mul()(x, y), [(A, (2, 3, 4)), (A, (3, 1))]),
    "RealDiv": (lambda x, y: P.RealDiv()(x, y), [(A, (3, 4)), (POS, (1, 4))]),
    "Neg": (lambda x: P.Neg()(x), [(A, (3, 4))]),
    "Maximum": (lambda x, y: P.Maximum()(x, y), [(A, (3, 4)), (A, (4,))]),
    "Minimum": (lambda x, y: P.Minimum()(x, y), [(A, (3, 4)), (A, (3, 4))]),
    "Pow": (lambda x, y: P.Pow()(x, y), [(POS, (3, 4)), (A, (4,))]),
    "Sqrt": (lambda x: P.Sqrt()(x), [(POS, (3, 4))]),
    "Rsqrt": (lambda x: P.Rsqrt()(x), [(POS, (3, 4))]),
    "Reciprocal": (lambda x: P.Reciprocal()(x), [(A, (3, 4))]),
    "Exp": (lambda x: P.Exp()(x), [(A, (3, 4))]),
    "Log": (lambda x: P.Log()(x), [(POS, (3, 4))]),
    "Tanh": (lambda x: P.Tanh()(x), [(A, (3, 4))]),
    "Erf": (lambda x: P.Erf()(x), [(A, (3, 4))]),
    "Abs": (lambda x: P.Abs()(x), [(A, (3, 4))]),
    "Floor": (lambda x: P.Floor()(x) + x, [(A, (3, 4))]),
    "Round": (lambda x: P.Round()(x) * x, [(A, (3, 4))]),
    "Sign": (lambda x: P.Sign()(x) * x, [(A, (3, 4))]),
    "Select": (lambda x, y: P.Select()(P.Greater()(x, 0.0), x, y), [(A, (3, 4)), (A, (4,))]),
    # float64 -> float64, times a cast bool (no gradient flows into a comparison)
    "Cast": (lambda x: P.Cast()(x, gk.float64) * P.Cast()(P.Greater()(x, 0.0), gk.float64),
             [(A, (3, 4))]),
    "ReduceSum": (lambda x: P.ReduceSum()(x, 1), [(A, (3, 4))]),
    "ReduceProd": (lambda x: P.ReduceProd(keep_dims=True)(x, 0), [(A, (3, 4))]),
    "ReduceMax": (lambda x: P.ReduceMax()(x, -1), [(A, (3, 4))]),
    "ReduceMin": (lambda x: P.ReduceMin(keep_dims=True)(x, (0, 1)), [(A, (3, 4))]),
    "ReduceMean": (lambda x: P.ReduceMean()(x, (0, 2)), [(A, (2, 3, 4))]),
    "Reshape": (lambda x: P.Reshape()(x, (2, 6)), [(A, (3, 4))]),
    "Transpose": (lambda x: P.Transpose()(x, (2, 0, 1)), [(A, (2, 3, 4))]),
    "ExpandDims": (lambda x: P.ExpandDims()(x, 1), [(A, (3, 4))]),
    "Squeeze": (lambda x: P.Squeeze(1)(x), [(A, (3, 1, 4))]),
    "BroadcastTo": (lambda x: P.BroadcastTo((2, 3, 4))(x), [(A, (3, 1))]),
    "Tile": (lambda x: P.Tile()(x, (2, 1, 3)), [(A, (3, 2))]),
    "MatMul": (lambda x, y: P.MatMul()(x, y), [(A, (3, 4)), (A, (4, 2))]),
    "BatchMatMul": (lambda x, y: P.BatchMatMul(transpose_b=True)(x, y),
                    [(A, (2, 3, 4)), (A, (2, 5, 4))]),
    "GeLU": (lambda x: P.GeLU()(x), [(A, (3, 4))]),
    "FastGeLU": (lambda x: P.FastGeLU()(x), [(A, (3, 4))]),
    "Sigmoid": (lambda x: P.Sigmoid()(x), [(A, (3, 4))]),
    "SiLU": (lambda x: P.SiLU()(x), [(A, (3, 4))]),
    "ReLU": (lambda x: P.ReLU()(x), [(A, (3, 4))]),
    "ReLU6": (lambda x: P.ReLU6()(x * 4.0), [(A, (3, 4))]),
    "HSwish": (lambda x: P.HSwish()(x * 3.0), [(A, (3, 4))]),
    "Softplus": (lambda x: P.Softplus()(x), [(A, (3, 4))]),
    "Square": (lambda x: P.Square()(x), [(A, (3, 4))]),
    "SquaredDifference": (lambda x, y: P.SquaredDifference()(x, y), [(A, (3, 4)), (A, (4,))]),
    "BiasAdd": (lambda x, b: P.BiasAdd()(x, b), [(A, (2, 3, 4)), (A, (3,))]),
    "AddN": (lambda x, y: P.AddN()((x, y, x)), [(A, (3, 4)), (A, (3, 4))]),
    "Softmax": (lambda x: P.Softmax()(x), [(A, (3, 4))]),
    "LogSoftmax": (lambda x: P.LogSoftmax(axis=0)(x), [(A, (3, 4))]),
    "LayerNorm": (lambda x, g, b: P.LayerNorm()(x, g, b)[0], [(A, (3, 4)), (A, (4,)), (A, (4,))]),
    # Real-network ops (issue 13): odd shapes, stride 2, asymmetric padding, dilation, groups.
    "Sin": (lambda x: P.Sin()(x), [(A, (3, 4))]),
    "Cos": (lambda x: P.Cos()(x), [(A, (3, 4))]),
    "Expm1": (lambda x: P.Expm1()(x), [(A, (3, 4))]),
    "Log1p": (lambda x: P.Log1p()(x), [(POS, (3, 4))]),
    "Erfc": (lambda x: P.Erfc()(x), [(A, (3, 4))]),
    "Softsign": (lambda x: P.Softsign()(x), [(A, (3, 4))]),
    "Identity": (lambda x: P.Identity()(x) * x, [(A, (3, 4))]),
    "Conv2D": (lambda x, w: P.Conv2D(4, (3, 2), pad_mode="pad", pad=(1, 0, 2, 1), stride=2,
                                     dilation=(2, 1), group=2)(x, w),
               [(A, (2, 4, 7, 6)), (A, (4, 2, 3, 2))]),
    "MaxPool": (lambda x: P.MaxPool(kernel_size=3, strides=2)(x), [(A, (2, 3, 7, 6))]),
    "AvgPool": (lambda x: P.AvgPool(kernel_size=(2, 3), strides=(2, 1))(x), [(A, (2, 3, 5, 6))]),
    "BatchNorm": (lambda x, s, b, m, v: P.BatchNorm(is_training=True)(x, s, b, m, v)[0],
                  [(A, (3, 2, 2, 3)), (A, (2,)), (A, (2,)), (A, (2,)), (POS, (2,))]),
    # Repeated indices accumulate into one row of the table.
    "Gather": (lambda p: P.Gather()(p, Tensor(np.array([[0, 3], [3, 4], [3, 0]], np.int32)), 0),
               [(A, (5, 3))]),
    "Slice": (lambda x: P.Slice()(x, (1, 0, 2), (2, -1, 1)), [(A, (3, 1, 4))]),
    "StridedSlice": (lambda x: P.StridedSlice(shrink_axis_mask=4)(x, (-1, 0, 1), (0, 5, 2),
                                                                   (-2, 2, 1)),
                     [(A, (4, 5, 3))]),
    "Concat": (lambda x, y: P.Concat(1)((x, y, x)), [(A, (2, 3)), (A, (2, 1))]),
    "Split": (lambda x: _first_and_last(P.Split(1, 3)(x)), [(A, (2, 6, 1))]),
    "Stack": (lambda x, y: P.Stack(-1)((x, y * 2.0)), [(A, (2, 3)), (A, (2, 3))]),
    "Unstack": (lambda x: _first_and_last(P.Unstack(axis=1)(x)), [(A, (2, 3, 4))]),
    "Dropout": (lambda x: P.Dropout(keep_prob=1.0)(x)[0] * x, [(A, (3, 4))]),
    # The gradient ops first-order rules write, differentiated again (second-order gradients).
    "TanhGrad": (lambda y, dy: G.TanhGrad()(y, dy), [(A, (3, 4)), (A, (3, 4))]),
    "SigmoidGrad": (lambda y, dy: G.SigmoidGrad()(y, dy), [(A, (3, 4)), (A, (3, 4))]),
    "ReluGrad": (lambda dy, y: G.ReluGrad()(dy, y) * y, [(A, (3, 4)), (A, (3, 4))]),
    "SqrtGrad": (lambda y, dy: G.SqrtGrad()(y, dy), [(POS, (3, 4)), (A, (3, 4))]),
    "RsqrtGrad": (lambda y, dy: G.RsqrtGrad()(y, dy), [(POS, (3, 4)), (A, (3, 4))]),
    "FastGeLUGrad": (lambda dy, x: G.FastGeLUGrad()(dy, x), [(A, (3, 4)), (A, (3, 4))]),
    # y (GeLU's output) is recomputed from x: its gradient is zero.
    "GeLUGrad": (lambda dy, x: G.GeLUGrad()(dy, x, x * 1.0), [(A, (3, 4)), (A, (3, 4))]),
    "SoftmaxGrad": (lambda y, dy: G.SoftmaxGrad()(y, dy), [(A, (3, 4)), (A, (3, 4))]),
    "LogSoftmaxGrad": (lambda y, dy: G.LogSoftmaxGrad(axis=0)(y, dy),
                       [(A, (3, 4)), (A, (3, 4))]),
    "Median": (lambda x: (P.Median(axis=1)(x)[0], P.Median(axis=0, keep_dims=True)(x)[0],
                          P.Median(global_median=True)(x)[0]), [(A, (3, 4))]),
    # MindSpore's bprops give the labels no gradient (zeros): they are constants here.
    "SigmoidCrossEntropyWithLogits": (
        lambda x: P.SigmoidCrossEntropyWithLogits()(x, Tensor(np.linspace(0, 1, 12).reshape(
            3, 4))), [(A, (3, 4))]),
    "SoftmaxCrossEntropyWithLogits": (
        lambda x: P.SoftmaxCrossEntropyWithLogits()(x, Tensor(np.eye(4)[[2, 0, 3]]))[0],
        [(A, (3, 4))]),
}


def test_every_op_with_a_gradient_rule_has_a_case() -> None:
    with_rules = {name for name, op in OPS.items() if op.grad is not None}
    # StopGradient's rule is zero by definition, where finite differences see the identity:
    # tests/test_mindspore_api.py::test_stop_gradient_blocks_only_its_path checks it.
    with_rules.discard("StopGradient")
    assert with_rules - set(CASES) == set(), "add a finite-difference case for these ops"


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_gradient_matches_finite_differences(name: str, fusion: bool) -> None:
    fn, specs = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    arrays = [make(rng, shape) for make, shape in specs]
    check_gradients(fn, arrays)


def test_layer_norm_over_two_axes_and_its_statistics(fusion: bool) -> None:
    rng = np.random.default_rng(1)

    def fn(x: Any, g: Any, b: Any) -> Any:
        y, mean, var = P.LayerNorm(begin_norm_axis=1, begin_params_axis=1, epsilon=1e-5)(x, g, b)
        return y, mean, var  # the mean's and variance's gradients add their own terms
    check_gradients(fn, [A(rng, (2, 3, 4)), A(rng, (3, 4)), A(rng, (3, 4))])


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_both_forms(approximate: str, fusion: bool) -> None:
    rng = np.random.default_rng(2)
    check_gradients(lambda x: P.GeLU(approximate=approximate)(x), [A(rng, (4, 5)) * 2])


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul_with_transposes(ta: bool, tb: bool, fusion: bool) -> None:
    rng = np.random.default_rng(3)
    a = A(rng, (4, 3) if ta else (3, 4))
    b = A(rng, (2, 4) if tb else (4, 2))
    check_gradients(lambda x, y: P.MatMul(transpose_a=ta, transpose_b=tb)(x, y), [a, b])


def test_batched_matmul_broadcast_over_batch(fusion: bool) -> None:
    rng = np.random.default_rng(4)
    check_gradients(lambda x, y: P.BatchMatMul()(x, y), [A(rng, (2, 3, 4)), A(rng, (4, 2))])


@pytest.mark.parametrize("keep_dims", [False, True])
@pytest.mark.parametrize("axis", [0, 1, (0, 2), ()])
def test_reductions_with_and_without_keep_dims(axis: Any, keep_dims: bool, fusion: bool) -> None:
    rng = np.random.default_rng(5)

    def fn(x: Any) -> Any:
        s = P.ReduceSum(keep_dims)(x, axis)
        m = P.ReduceMean(keep_dims)(x * x, axis)
        mx = P.ReduceMax(keep_dims)(x, axis)
        return s * m + mx
    check_gradients(fn, [A(rng, (2, 3, 4))])


def test_broadcast_operands_get_gradients_of_their_own_shape(fusion: bool) -> None:
    rng = np.random.default_rng(6)
    grads = check_gradients(lambda x, y, z: (x * y - z) / (y * y + 1.0),
                            [A(rng, (2, 1, 4)), A(rng, (3, 1)), A(rng, ())])
    assert [g.shape for g in grads] == [(2, 1, 4), (3, 1), ()]


def test_softmax_cross_entropy_by_hand(fusion: bool) -> None:
    rng = np.random.default_rng(8)
    labels = np.eye(4)[rng.integers(0, 4, 5)]

    def fn(x: Any) -> Any:
        return -P.ReduceSum()(P.LogSoftmax()(x) * labels, -1)
    check_gradients(fn, [A(rng, (5, 4)) * 3])


# -- random graphs --------------------------------------------------------------------------
UNARY = ["Neg", "Exp", "Tanh", "Sigmoid", "GeLU", "Square", "Abs", "SiLU", "Softplus"]
BINARY = ["Add", "Sub", "Mul", "Maximum", "Minimum"]


def random_program(rng: np.random.Generator, n_inputs: int, steps: int) -> list[tuple[Any, ...]]:
    """Instructions over a growing list of values: broadcasting binaries between a (3, 4)
    value and (4,) or (3, 1) ones, unary ops, reductions with keep_dims, softmax, division by
    a positive value, MatMul against a transposed input."""
    prog: list[tuple[Any, ...]] = []
    for _ in range(steps):
        kind = rng.choice(["unary", "binary", "binary", "reduce", "softmax", "div", "matmul"])
        a = int(rng.integers(0, n_inputs + len(prog)))
        b = int(rng.integers(0, n_inputs + len(prog)))
        if kind == "unary":
            prog.append(("unary", str(rng.choice(UNARY)), a))
        elif kind == "binary":
            prog.append(("binary", str(rng.choice(BINARY)), a, b))
        elif kind == "reduce":
            prog.append(("reduce", str(rng.choice(["ReduceSum", "ReduceMean", "ReduceMax"])), a,
                         int(rng.integers(0, 2))))
        else:
            prog.append((kind, a, b))
    return prog


def run_program(prog: list[tuple[Any, ...]], *xs: Any) -> Any:
    values = list(xs)
    for step in prog:
        if step[0] == "unary":
            out = getattr(P, step[1])()(values[step[2]])
        elif step[0] == "binary":
            out = getattr(P, step[1])()(values[step[2]], values[step[3]])
        elif step[0] == "reduce":
            x = values[step[2]]
            out = getattr(P, step[1])(keep_dims=True)(x, -1 - step[3] if x.ndim > 1 else -1)
        elif step[0] == "softmax":
            out = P.Softmax()(values[step[1]] + values[step[2]])
        elif step[0] == "div":
            out = values[step[1]] / (P.Square()(values[step[2]]) + 0.5)
        else:  # (3, 4) @ (4, 3) -> (3, 3) @ (3, 4): back to (3, 4)
            x = values[step[1]] + values[step[2]] + values[0]
            out = P.MatMul()(P.MatMul(transpose_b=True)(x, values[0]), values[0])
        values.append(out)
    return values[-1] + values[-2] if len(values) > len(xs) + 1 else values[-1]


# Three seeds on every run; the other nine (a compile each, fused and not) in the slow step.
@pytest.mark.parametrize("seed", [*range(3), *(pytest.param(s, marks=pytest.mark.slow)
                                               for s in range(3, 12))])
def test_random_graphs(seed: int, fusion: bool) -> None:
    rng = np.random.default_rng(100 + seed)
    prog = random_program(rng, 3, int(rng.integers(3, 9)))
    arrays = [A(rng, (3, 4)), A(rng, (4,)), A(rng, (3, 1))]
    check_gradients(lambda *xs: run_program(prog, *xs), arrays, rtol=1e-4, atol=1e-5)


def test_fused_and_unfused_gradients_agree_in_float32() -> None:
    rng = np.random.default_rng(9)
    prog = random_program(rng, 3, 8)
    arrays = [A(rng, s).astype(np.float32) for s in ((3, 4), (4,), (3, 1))]
    cell = Weighted(lambda *xs: run_program(prog, *xs))
    results = []
    for fuse in (False, True):
        context.set_context(enable_graph_kernel=fuse)
        grads = gk.grad(cell, (0, 1, 2))(*[Tensor(a) for a in arrays])
        results.append([g.asnumpy() for g in grads])
    context.set_context(enable_graph_kernel=False)
    for unfused, fused in zip(*results):
        assert fused.dtype == np.float32
        np.testing.assert_allclose(fused, unfused, rtol=2e-5, atol=1e-5)


# -- the API ---------------------------------------------------------------------------------
class Affine(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.w = Parameter(np.arange(6, dtype=np.float64).reshape(2, 3) / 10, "w")
        self.b = Parameter(np.ones(3), "b")

    def construct(self, x: Any, y: Any) -> Any:
        return P.ReduceSum()(P.MatMul()(x, self.w) * y + self.b)


def _affine_inputs() -> tuple[Tensor, Tensor]:
    return Tensor(np.array([[1.0, 2.0], [3.0, 4.0]])), Tensor(np.array([[1.0, 0.5, 2.0]]))


def test_grad_positions_and_weights() -> None:
    context.set_context(mode=context.GRAPH_MODE)
    net = Affine()
    x, y = _affine_inputs()
    dx = gk.grad(net)(x, y)
    np.testing.assert_allclose(dx.asnumpy(), y.asnumpy() @ net.w.asnumpy().T * np.ones((2, 1)))
    dx, dy = gk.grad(net, (0, 1))(x, y)
    np.testing.assert_allclose(dy.asnumpy(), (x.asnumpy() @ net.w.asnumpy()).sum(0,
                                                                                   keepdims=True))
    dw, db = gk.grad(net, None, net.trainable_params())(x, y)
    np.testing.assert_allclose(dw.asnumpy(), x.asnumpy().T @ np.broadcast_to(y.asnumpy(),
                                                                             (2, 3)))
    np.testing.assert_allclose(db.asnumpy(), [2.0, 2.0, 2.0])
    (dx2,), (dw2, _) = gk.grad(net, (0,), net.trainable_params())(x, y)
    np.testing.assert_allclose(dx2.asnumpy(), dx.asnumpy())
    np.testing.assert_allclose(dw2.asnumpy(), dw.asnumpy())
    single = gk.grad(net, None, net.b)(x, y)
    np.testing.assert_allclose(single.asnumpy(), [2.0, 2.0, 2.0])


def test_value_and_grad_and_has_aux() -> None:
    context.set_context(mode=context.GRAPH_MODE)
    net = Affine()
    x, y = _affine_inputs()
    value, (dw, db) = gk.value_and_grad(net, None, net.trainable_params())(x, y)
    np.testing.assert_allclose(value.asnumpy(), net(x, y).asnumpy())

    def with_aux(a: Any, b: Any) -> Any:
        out = net(a, b)
        return out, out * 2.0
    (loss, aux), dx = gk.value_and_grad(with_aux, 0, has_aux=True)(x, y)
    np.testing.assert_allclose(aux.asnumpy(), 2 * loss.asnumpy())
    np.testing.assert_allclose(dx.asnumpy(), gk.grad(net)(x, y).asnumpy())
    dx_aux, (aux2,) = gk.grad(with_aux, 0, has_aux=True)(x, y)
    np.testing.assert_allclose(dx_aux.asnumpy(), dx.asnumpy())
    np.testing.assert_allclose(aux2.asnumpy(), aux.asnumpy())


def test_grad_operation() -> None:
    context.set_context(mode=context.GRAPH_MODE)
    net = Affine()
    x, y = _affine_inputs()
    params = gk.ParameterTuple(net.trainable_params())
    dx = GradOperation()(net)(x, y)
    dx_all, dy_all = GradOperation(get_all=True)(net)(x, y)
    np.testing.assert_allclose(dx_all.asnumpy(), dx.asnumpy())
    dw, db = GradOperation(get_by_list=True)(net, params)(x, y)
    (gx, gy), (gw, gb) = GradOperation(get_all=True, get_by_list=True)(net, params)(x, y)
    np.testing.assert_allclose(gw.asnumpy(), dw.asnumpy())
    np.testing.assert_allclose(gy.asnumpy(), dy_all.asnumpy())
    # sens_param: the output's gradient comes last
    doubled = GradOperation(sens_param=True)(net)(x, y, Tensor(np.array(2.0)))
    np.testing.assert_allclose(doubled.asnumpy(), 2 * dx.asnumpy())


def test_grad_inside_a_construct() -> None:
    """A gradient traced inside another cell's construct joins that cell's graph."""
    context.set_context(mode=context.GRAPH_MODE)
    inner = Affine()

    class Outer(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner
            self.grad = GradOperation(get_by_list=True)
            self.params = gk.ParameterTuple(inner.trainable_params())

        def construct(self, x: Any, y: Any) -> Any:
            dw, db = self.grad(self.inner, self.params)(x, y)
            return dw * 2.0, db

    x, y = _affine_inputs()
    exe = gk.compile(Outer(), x, y)
    dw, db = exe(x, y)
    np.testing.assert_allclose(dw.asnumpy(), 2 * gk.grad(inner, None, inner.w)(x, y).asnumpy())
    assert any(n.notes.get("grad_of") for n in exe.stages["0_trace"].nodes)


def test_graph_kernel_cell_gradient_recomputes_inside_one_composite(fusion: bool) -> None:
    class Gk(nn.GraphKernel):
        def construct(self, x: Any, y: Any) -> Any:
            return P.Tanh()(x * y) + P.Exp()(x)

    gkcell = Gk()
    rng = np.random.default_rng(10)
    check_gradients(lambda x, y: gkcell(x, y) * x, [A(rng, (3, 4)), A(rng, (4,))])


def _second_derivative(x: np.ndarray, name: str) -> np.ndarray:
    """d2/dx2 of the op `name` at x, in float64 from the closed forms."""
    t, s = np.tanh(x), 1 / (1 + np.exp(-x))
    phi = np.exp(-x * x / 2) / np.sqrt(2 * np.pi)
    c, a = np.sqrt(2 / np.pi), 0.044715
    u = np.tanh(c * (x + a * x ** 3))
    du = c * (1 + 3 * a * x * x)
    fast = 1 / (1 + np.exp(-1.702 * x))
    forms: dict[str, Callable[[], np.ndarray]] = {
        "Tanh": lambda: -2 * t * (1 - t * t),
        "Sigmoid": lambda: s * (1 - s) * (1 - 2 * s),
        "Sqrt": lambda: -0.25 * x ** -1.5,
        "Rsqrt": lambda: 0.75 * x ** -2.5,
        "GeLU": lambda: (1 - u * u) * (du + x * (3 * a * c * x - u * du * du)),
        "GeLU_none": lambda: phi * (2 - x * x),
        "FastGeLU": lambda: 1.702 * fast * (1 - fast) * (2 + 1.702 * x * (1 - 2 * fast)),
        "ReLU": lambda: np.zeros_like(x)}
    return forms[name]()


SECOND_ORDER = {"Tanh": P.Tanh(), "Sigmoid": P.Sigmoid(), "Sqrt": P.Sqrt(), "Rsqrt": P.Rsqrt(),
                "GeLU": P.GeLU(), "GeLU_none": P.GeLU(approximate="none"),
                "FastGeLU": P.FastGeLU(), "ReLU": P.ReLU()}


@pytest.mark.parametrize("name", sorted(SECOND_ORDER))
def test_grad_of_grad_matches_the_second_derivative(name: str, fusion: bool) -> None:
    op = SECOND_ORDER[name]
    rng = np.random.default_rng(3)
    x = _positive(rng, (3, 4)) if "sqrt" in name.lower() else _away_from_zero(rng, (3, 4))
    first = gk.grad(lambda a: P.ReduceSum()(op(a)))
    second = gk.grad(lambda a: P.ReduceSum()(first(a)))(Tensor(x)).asnumpy()
    np.testing.assert_allclose(second, _second_derivative(x, name), rtol=1e-9, atol=1e-12)


@pytest.mark.slow  # second-order gradients
def test_grad_of_grad_through_a_net_with_tanh(fusion: bool) -> None:
    """The Hessian-vector product of a Dense-Tanh-Dense net against central differences of
    its first-order gradient, in float64; Softmax at the end (SoftmaxGrad differentiated)."""
    rng = np.random.default_rng(4)
    w1, w2 = rng.standard_normal((4, 5)), rng.standard_normal((5, 3))
    v = rng.standard_normal((2, 4))

    def loss(a: Any) -> Any:
        hidden = P.Tanh()(P.MatMul()(a, Tensor(w1)))
        return P.ReduceSum()(P.Softmax()(P.MatMul()(hidden, Tensor(w2))) * Tensor(w2[:2, :]))

    first = gk.grad(loss)
    hvp = gk.grad(lambda a: P.ReduceSum()(first(a) * Tensor(v)))
    x = rng.standard_normal((2, 4))
    eps = 1e-6
    want = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[index] += eps
        down[index] -= eps
        want[index] = (np.sum(first(Tensor(up)).asnumpy() * v) -
                       np.sum(first(Tensor(down)).asnumpy() * v)) / (2 * eps)
    np.testing.assert_allclose(hvp(Tensor(x)).asnumpy(), want, rtol=1e-5, atol=1e-7)


def test_second_order_gradient_without_a_rule_names_the_users_op() -> None:
    context.set_context(mode=context.GRAPH_MODE)
    x = Tensor(np.ones((2, 4), np.float32))
    g, b = Tensor(np.ones((4,), np.float32)), Tensor(np.zeros((4,), np.float32))
    first = gk.grad(lambda a: P.ReduceSum()(P.LayerNorm()(a, g, b)[0] * a))
    with pytest.raises(GradientError, match="second-order gradient of LayerNorm is not "
                                            "supported: .* computed by LayerNormGrad"):
        gk.grad(lambda a: P.ReduceSum()(first(a)))(x)


def test_errors_name_the_problem() -> None:
    context.set_context(mode=context.GRAPH_MODE)
    x = Tensor(np.ones((2, 2), np.float32))
    with pytest.raises(GradientError, match="int32"):
        gk.grad(lambda a: P.ReduceSum()(a))(Tensor(np.ones((2, 2), np.int32)))
    with pytest.raises(InputError, match="both be None"):
        gk.grad(lambda a: a, None)
    with pytest.raises(InputError, match="out of range"):
        gk.grad(lambda a: P.ReduceSum()(a), 3)(x)
    with pytest.raises(GradientError, match="bool"):
        gk.grad(lambda a: P.Greater()(a, 0.0))(x)
