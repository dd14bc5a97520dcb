"""Small configurations of MindCV's ResNet-18, MobileNetV2 and ViT (issue 28), built here from
the same public layer APIs MindCV's model files use (nn.Conv2d with pad_mode="pad" and groups,
BatchNorm2d, ReLU/ReLU6, MaxPool2d, Dense, LayerNorm, GELU, SequentialCell, CellList,
BatchMatMul, Unstack, broadcast_to, an init loop over `cells_and_names` with
`common.initializer` classes): inference and one training step, fused and unfused float32
against the same network in float64."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import graphkernel as gk
import graphkernel.common.initializer as init
from graphkernel import Tensor, nn, ops
from graphkernel.frontend import context
from graphkernel.graph_kernel.pipeline import CompileOptions


def conv_bn_act(cin: int, cout: int, kernel: int, stride: int = 1, group: int = 1,
                act: Any = nn.ReLU, dtype: Any = np.float32) -> nn.SequentialCell:
    layers = [nn.Conv2d(cin, cout, kernel, stride, pad_mode="pad", padding=kernel // 2,
                        group=group, dtype=dtype), nn.BatchNorm2d(cout, dtype=dtype)]
    return nn.SequentialCell(layers + ([act()] if act is not None else []))


class BasicBlock(nn.Cell):
    """ResNet-18's block: two 3x3 convolutions and a shortcut (a strided 1x1 where the shape
    changes)."""

    def __init__(self, cin: int, cout: int, stride: int, dtype: Any) -> None:
        super().__init__()
        self.body = nn.SequentialCell([conv_bn_act(cin, cout, 3, stride, dtype=dtype),
                                       conv_bn_act(cout, cout, 3, act=None, dtype=dtype)])
        self.down_sample = conv_bn_act(cin, cout, 1, stride, act=None, dtype=dtype) \
            if stride != 1 or cin != cout else None
        self.relu = nn.ReLU()

    def construct(self, x: Any) -> Any:
        identity = x if self.down_sample is None else self.down_sample(x)
        return self.relu(self.body(x) + identity)


class ResNet18(nn.Cell):
    """ResNet-18's layout (7x7 stem, max pool, four stages of two blocks, global average pool,
    classifier) at small widths."""

    def __init__(self, widths: tuple[int, ...] = (8, 16, 16, 32), num_classes: int = 10,
                 dtype: Any = np.float32) -> None:
        super().__init__()
        self.stem = nn.SequentialCell([
            nn.Conv2d(3, widths[0], 7, 2, pad_mode="pad", padding=3, dtype=dtype),
            nn.BatchNorm2d(widths[0], dtype=dtype), nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="same")])
        blocks, cin = [], widths[0]
        for stage, width in enumerate(widths):
            for index in range(2):
                stride = 2 if stage and not index else 1
                blocks.append(BasicBlock(cin, width, stride, dtype))
                cin = width
        self.blocks = nn.SequentialCell(blocks)
        self.classifier = nn.Dense(cin, num_classes, dtype=dtype)
        _initialise(self)

    def construct(self, x: Any) -> Any:
        x = self.blocks(self.stem(x))
        return self.classifier(ops.mean(x, (2, 3)))


class InvertedResidual(nn.Cell):
    """MobileNetV2's block: 1x1 expansion, 3x3 depthwise, linear 1x1 projection; the input
    added back where the shape stays."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int, dtype: Any) -> None:
        super().__init__()
        hidden = cin * expand
        layers = [conv_bn_act(cin, hidden, 1, act=nn.ReLU6, dtype=dtype)] if expand != 1 else []
        layers += [conv_bn_act(hidden, hidden, 3, stride, group=hidden, act=nn.ReLU6,
                               dtype=dtype),
                   conv_bn_act(hidden, cout, 1, act=None, dtype=dtype)]
        self.body = nn.SequentialCell(layers)
        self.residual = stride == 1 and cin == cout

    def construct(self, x: Any) -> Any:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Cell):
    """MobileNetV2's layout (stem, inverted residual settings t, c, n, s, a 1x1 head, pool,
    dropout and classifier) with few, narrow blocks."""

    def __init__(self, settings: tuple[tuple[int, int, int, int], ...] = (
            (1, 8, 1, 1), (6, 8, 2, 2), (6, 16, 2, 2)), head: int = 32,
            num_classes: int = 10, drop_rate: float = 0.2, dtype: Any = np.float32) -> None:
        super().__init__()
        layers, cin = [conv_bn_act(3, 8, 3, 2, act=nn.ReLU6, dtype=dtype)], 8
        for t, c, n, s in settings:
            for index in range(n):
                layers.append(InvertedResidual(cin, c, s if index == 0 else 1, t, dtype))
                cin = c
        layers.append(conv_bn_act(cin, head, 1, act=nn.ReLU6, dtype=dtype))
        self.features = nn.SequentialCell(layers)
        self.dropout = nn.Dropout(p=drop_rate)
        self.classifier = nn.Dense(head, num_classes, dtype=dtype)
        _initialise(self)

    def construct(self, x: Any) -> Any:
        x = ops.mean(self.features(x), (2, 3))
        return self.classifier(self.dropout(x))


def _initialise(net: nn.Cell) -> None:
    """The init loop MindCV's models run, through the same initializer API."""
    for _, cell in net.cells_and_names():
        if isinstance(cell, nn.Conv2d):
            cell.weight.set_data(init.initializer(init.HeNormal(mode="fan_out",
                                                                nonlinearity="relu"),
                                                  cell.weight.shape, cell.weight.dtype))
            if cell.bias is not None:
                cell.bias.set_data(init.initializer("zeros", cell.bias.shape, cell.bias.dtype))
        elif isinstance(cell, nn.BatchNorm2d):
            cell.gamma.set_data(init.initializer("ones", cell.gamma.shape, cell.gamma.dtype))
            cell.beta.set_data(init.initializer("zeros", cell.beta.shape, cell.beta.dtype))
        elif isinstance(cell, nn.Dense):
            cell.weight.set_data(init.initializer(init.HeUniform(mode="fan_in",
                                                                 nonlinearity="sigmoid"),
                                                  cell.weight.shape, cell.weight.dtype))
            if cell.bias is not None:
                cell.bias.set_data(init.initializer("zeros", cell.bias.shape, cell.bias.dtype))


def _networks(make: Any) -> tuple[nn.Cell, nn.Cell, nn.Cell]:
    """Two float32 copies and a float64 one of the same weights; the BatchNorm statistics
    and the biases set away from their initial zeros and ones, so inference exercises them."""
    rng = np.random.default_rng(11)
    first = make(np.float32)
    for name, param in first.parameters_and_names():
        if name.endswith(("moving_mean", "beta", "bias")):
            param.set_data(rng.normal(0, 0.1, param.shape))
        elif name.endswith(("moving_variance", "gamma")):
            param.set_data(rng.uniform(0.5, 1.5, param.shape))
    copies = [make(np.float32), make(np.float64)]
    for copy in copies:
        mine = copy.parameters_dict()
        for name, param in first.parameters_and_names():
            mine[name].set_data(param.asnumpy())
    return first, copies[0], copies[1]


NETWORKS = {"resnet18": lambda dtype: ResNet18(dtype=dtype),
            # without dropout: its random mask would differ between the three runs
            "mobilenetv2": lambda dtype: MobileNetV2(drop_rate=0.0, dtype=dtype)}


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


# ViT on every run; the convolutional networks (minutes of compiling, cold) in the slow step.
# (NETWORKS gets "vit" below, after its classes.)
@pytest.mark.parametrize("name", [pytest.param("resnet18", marks=pytest.mark.slow),
                                  pytest.param("mobilenetv2", marks=pytest.mark.slow), "vit"])
def test_inference_fused_unfused_and_float64(name: str) -> None:
    fused, unfused, reference = _networks(NETWORKS[name])
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    outs = {}
    for key, net, array, options in (
            ("fused", fused, x, CompileOptions(enable_graph_kernel=True)),
            ("unfused", unfused, x, CompileOptions(enable_graph_kernel=False)),
            ("float64", reference, x.astype(np.float64), CompileOptions())):
        net.set_train(False)
        outs[key] = gk.compile(net, array, options=options).run_arrays(array)[0]
    assert outs["fused"].shape == (2, 10) and outs["fused"].dtype == np.float32
    assert _relative_error(outs["fused"], outs["unfused"]) < 1e-5
    assert _relative_error(outs["fused"], outs["float64"]) < 1e-5
    assert _relative_error(outs["unfused"], outs["float64"]) < 1e-5


@pytest.mark.slow  # a training step of each network, fused, unfused and in float64
@pytest.mark.parametrize("name", NETWORKS)
def test_one_training_step_fused_unfused_and_float64(name: str) -> None:
    nets = _networks(NETWORKS[name])
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
    labels = rng.integers(0, 10, 4).astype(np.int32)
    before = {k: p.asnumpy().astype(np.float64) for k, p in nets[0].parameters_and_names()}
    losses, after = [], []
    for net, fusion, dtype in zip(nets, (True, False, False),
                                  (np.float32, np.float32, np.float64)):
        context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=fusion)
        loss_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True,
                                                                         reduction="mean"))
        step = nn.TrainOneStepCell(loss_net, nn.Momentum(net.trainable_params(), 0.1, 0.9))
        losses.append(float(step(Tensor(x.astype(dtype)), Tensor(labels)).asnumpy()))
        after.append({k: p.asnumpy().astype(np.float64) for k, p in net.parameters_and_names()})
    context.set_context(enable_graph_kernel=False)
    assert abs(losses[0] - losses[2]) < 1e-5 * abs(losses[2])
    assert abs(losses[1] - losses[2]) < 1e-5 * abs(losses[2])
    for key, start in before.items():
        want = after[2][key] - start  # the float64 step's update (moving statistics too)
        scale = max(np.abs(want).max(), 1e-3 * max(np.abs(start).max(), 1e-6))
        for got in after[:2]:
            error = np.abs((got[key] - start) - want).max() / scale
            assert error < 5e-4, (key, error)
        # Every weight and statistic took part in the step. (A beta can rightly stay: one
        # feeding a 1x1 convolution and a training BatchNorm has no gradient, the batch mean
        # taking its shift out.)
        if key.endswith(("weight", "moving_mean", "moving_variance")):
            assert np.abs(want).max() > 0, key


class Attention(nn.Cell):
    """ViT's multi-head self-attention: one qkv Dense, heads split by Reshape/Transpose and
    Unstack, scaled BatchMatMul scores, softmax, BatchMatMul with the values, projection."""

    def __init__(self, dim: int, heads: int, dtype: Any) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.25  # applied to q and to k
        self.qkv = nn.Dense(dim, dim * 3, dtype=dtype)
        self.proj = nn.Dense(dim, dim, dtype=dtype)
        self.unstack = ops.Unstack(axis=0)
        self.q_matmul_k = ops.BatchMatMul(transpose_b=True)
        self.attn_matmul_v = ops.BatchMatMul()

    def construct(self, x: Any) -> Any:
        b, n, c = x.shape
        qkv = ops.reshape(self.qkv(x), (b, n, 3, self.heads, self.head_dim))
        q, k, v = self.unstack(ops.transpose(qkv, (2, 0, 3, 1, 4)))
        attn = ops.softmax(self.q_matmul_k(q * self.scale, k * self.scale), axis=-1)
        out = ops.transpose(self.attn_matmul_v(attn, v), (0, 2, 1, 3))
        return self.proj(ops.reshape(out, (b, n, c)))


class EncoderBlock(nn.Cell):
    def __init__(self, dim: int, heads: int, dtype: Any) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm((dim,), epsilon=1e-6, dtype=dtype)
        self.attn = Attention(dim, heads, dtype)
        self.norm2 = nn.LayerNorm((dim,), epsilon=1e-6, dtype=dtype)
        self.mlp = nn.SequentialCell([nn.Dense(dim, 2 * dim, dtype=dtype), nn.GELU(),
                                      nn.Dense(2 * dim, dim, dtype=dtype)])

    def construct(self, x: Any) -> Any:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Cell):
    """ViT's layout: a strided-convolution patch embedding, a class token and position
    embedding (TruncatedNormal(0.02) through `initializer`), pre-norm encoder blocks, the
    class token's features through LayerNorm and the head."""

    def __init__(self, image: int = 32, patch: int = 8, dim: int = 16, depth: int = 2,
                 heads: int = 2, num_classes: int = 10, dtype: Any = np.float32) -> None:
        super().__init__()
        tokens = (image // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, patch, pad_mode="valid", has_bias=True,
                                     dtype=dtype)
        self.cls_token = gk.Parameter(init.initializer(init.TruncatedNormal(sigma=0.02),
                                                       (1, 1, dim), dtype), "cls_token")
        self.pos_embed = gk.Parameter(init.initializer(init.TruncatedNormal(sigma=0.02),
                                                       (1, tokens + 1, dim), dtype),
                                      "pos_embed")
        self.blocks = nn.CellList([EncoderBlock(dim, heads, dtype) for _ in range(depth)])
        self.norm = nn.LayerNorm((dim,), epsilon=1e-6, dtype=dtype)
        self.head = nn.Dense(dim, num_classes, dtype=dtype)
        for _, cell in self.cells_and_names():
            if isinstance(cell, nn.Dense):
                cell.weight.set_data(init.initializer(init.XavierUniform(), cell.weight.shape,
                                                      cell.weight.dtype))

    def construct(self, x: Any) -> Any:
        x = self.patch_embed(x)
        b, c = x.shape[:2]
        x = ops.transpose(ops.reshape(x, (b, c, -1)), (0, 2, 1))
        x = ops.concat((ops.broadcast_to(self.cls_token, (b, -1, -1)), x), axis=1)
        x = x + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


NETWORKS["vit"] = lambda dtype: ViT(dtype=dtype)
