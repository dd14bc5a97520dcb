"""The workloads written as graphkernel cells, the way a user writes them: primitives from
`graphkernel.ops.operations`, weights as `graphkernel.Parameter`s."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from bench import net_workloads
from bench.net_workloads import NET_KINDS
from bench.workloads import EPS, Workload
from graphkernel import Parameter
from graphkernel.nn import Cell
from graphkernel.ops import operations as P
from graphkernel.tools.lab import NetBasicFuse, NetCompositeFuse


class Chain8(Cell):
    """(tanh(exp(x*0.5+0.1)*0.3-0.7)+1)*x: eight elementwise ops."""

    def __init__(self) -> None:
        super().__init__()
        self.mul, self.add, self.sub = P.Mul(), P.Add(), P.Sub()
        self.exp, self.tanh = P.Exp(), P.Tanh()

    def construct(self, x: Any) -> Any:
        t = self.exp(self.add(self.mul(x, 0.5), 0.1))
        t = self.tanh(self.sub(self.mul(t, 0.3), 0.7))
        return self.mul(self.add(t, 1.0), x)


class BiasGeLU(Cell):
    def __init__(self) -> None:
        super().__init__()
        self.bias_add = P.BiasAdd()
        self.gelu = P.GeLU(approximate="tanh")

    def construct(self, x: Any, b: Any) -> Any:
        return self.gelu(self.bias_add(x, b))


class LayerNormLast(Cell):
    def __init__(self) -> None:
        super().__init__()
        self.layer_norm = P.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=EPS)

    def construct(self, x: Any, gamma: Any, beta: Any) -> Any:
        y, _, _ = self.layer_norm(x, gamma, beta)
        return y


class SoftmaxLast(Cell):
    def __init__(self) -> None:
        super().__init__()
        self.softmax = P.Softmax(axis=-1)

    def construct(self, x: Any) -> Any:
        return self.softmax(x)


class Linear(Cell):
    """x @ W^T + b with W of shape [out, in], like nn.Dense."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, name: str) -> None:
        super().__init__()
        self.weight = Parameter(weight, name + ".weight")
        self.bias = Parameter(bias, name + ".bias")
        self.matmul = P.MatMul(transpose_b=True)
        self.bias_add = P.BiasAdd()

    def construct(self, x: Any) -> Any:
        return self.bias_add(self.matmul(x, self.weight), self.bias)


class Norm(Cell):
    def __init__(self, gamma: np.ndarray, beta: np.ndarray, name: str) -> None:
        super().__init__()
        self.gamma = Parameter(gamma, name + ".gamma")
        self.beta = Parameter(beta, name + ".beta")
        self.layer_norm = P.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=EPS)

    def construct(self, x: Any) -> Any:
        y, _, _ = self.layer_norm(x, self.gamma, self.beta)
        return y


class MLPBlock(Cell):
    """LayerNorm(Dense2(GeLU(Dense1(x))) + x)."""

    def __init__(self, p: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.dense1 = Linear(p["w1"], p["b1"], "dense1")
        self.dense2 = Linear(p["w2"], p["b2"], "dense2")
        self.gelu = P.GeLU(approximate="tanh")
        self.add = P.Add()
        self.norm = Norm(p["gamma"], p["beta"], "norm")

    def construct(self, x: Any) -> Any:
        y = self.dense2(self.gelu(self.dense1(x)))
        return self.norm(self.add(y, x))


class EncoderLayer(Cell):
    """Post-LN transformer encoder layer: self-attention (Softmax), residual + LayerNorm,
    GeLU MLP, residual + LayerNorm. x: [batch, seq, hidden]."""

    def __init__(self, p: dict[str, np.ndarray], batch: int, seq: int, hidden: int,
                 heads: int) -> None:
        super().__init__()
        self.b, self.s, self.h, self.heads = batch, seq, hidden, heads
        self.hd = hidden // heads
        self.q = Linear(p["wq"], p["bq"], "q")
        self.k = Linear(p["wk"], p["bk"], "k")
        self.v = Linear(p["wv"], p["bv"], "v")
        self.o = Linear(p["wo"], p["bo"], "o")
        self.ff1 = Linear(p["w1"], p["b1"], "ff1")
        self.ff2 = Linear(p["w2"], p["b2"], "ff2")
        self.norm1 = Norm(p["g1"], p["be1"], "norm1")
        self.norm2 = Norm(p["g2"], p["be2"], "norm2")
        self.reshape, self.transpose = P.Reshape(), P.Transpose()
        self.scores = P.BatchMatMul(transpose_b=True)
        self.context = P.BatchMatMul()
        self.mul, self.add = P.Mul(), P.Add()
        self.softmax = P.Softmax(axis=-1)
        self.gelu = P.GeLU(approximate="tanh")
        self.scale = 1.0 / math.sqrt(self.hd)

    def split_heads(self, t: Any) -> Any:
        t = self.reshape(t, (self.b, self.s, self.heads, self.hd))
        return self.transpose(t, (0, 2, 1, 3))

    def construct(self, x: Any) -> Any:
        x2 = self.reshape(x, (self.b * self.s, self.h))
        q = self.split_heads(self.q(x2))
        k = self.split_heads(self.k(x2))
        v = self.split_heads(self.v(x2))
        probs = self.softmax(self.mul(self.scores(q, k), self.scale))
        ctx = self.transpose(self.context(probs, v), (0, 2, 1, 3))
        ctx = self.reshape(ctx, (self.b * self.s, self.h))
        h1 = self.norm1(self.add(x2, self.o(ctx)))
        f = self.ff2(self.gelu(self.ff1(h1)))
        out = self.norm2(self.add(h1, f))
        return self.reshape(out, (self.b, self.s, self.h))


def make_cell(w: Workload, params: dict[str, np.ndarray]) -> Cell:
    kind = w.kind
    if kind in NET_KINDS:
        return net_workloads.make_cell(kind, w.dims, params)  # type: ignore[no-any-return]
    if kind == "basic":
        return NetBasicFuse()
    if kind == "composite":
        return NetCompositeFuse()
    if kind == "chain":
        return Chain8()
    if kind == "bias_gelu":
        return BiasGeLU()
    if kind == "layernorm":
        return LayerNormLast()
    if kind == "softmax":
        return SoftmaxLast()
    if kind == "mlp":
        return MLPBlock(params)
    if kind == "encoder":
        d = w.dims
        return EncoderLayer(params, d["batch"], d["seq"], d["hidden"], d["heads"])
    raise KeyError(kind)
