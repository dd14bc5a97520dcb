"""Helpers several test files share: a Cell whose construct is a plain function, the compile
options with fusion on and off, a chain of library products (`MatMulChain`), a pointwise net
with a weight (`Pointwise`, for dynamic batches), the mark of tests that need OpenMP, and the
absolute tolerances of float32 sums (`product_atol`, `sum_atol`), and a stack of identical
encoder-like layers (`Stack`, for kernel sharing and compile time at depth), and a net
compiled again with a code-generation setting changed (`compiled_with`)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import graphkernel
from graphkernel import Parameter, Tensor, nn
from graphkernel.backends.c import toolchain
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)
needs_openmp = pytest.mark.skipif(toolchain.detect() is None or not toolchain.detect().openmp,
                                  reason="needs a C compiler with OpenMP")


def compiled_with(net: Any, x: np.ndarray, setting: tuple[Any, str, Any], cache_folder: str,
                  monkeypatch: Any, options: CompileOptions = ON) -> Any:
    """`net` compiled for `x` with `setting` (module, name, value) in force, cold, in a kernel
    cache of its own: a plan record knows graphkernel's files, not a setting changed in memory,
    so the test's own cache would hand back the build made before."""
    module, name, value = setting
    monkeypatch.setattr(module, name, value)
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", f"{cache_folder}-{name}-{value}")
    return graphkernel.compile(net, Tensor(x), options=options)


def _rounding_atol(k: int, magnitude: Any, dtype: Any) -> float:
    """Two sums of the same k terms in `dtype` (float32 or wider), in any two orders, differ
    by at most twice the recursive-summation bound k * eps * sum|term| (the largest such sum
    in `magnitude`)."""
    eps = np.finfo(np.result_type(dtype, np.float32)).eps
    return float(2 * k * eps * np.max(magnitude, initial=0.0))


def product_atol(a: np.ndarray, b: np.ndarray) -> float:
    """How far two float32 evaluations of `a @ b` may differ: BLAS picks its kernel, and so
    its summation order, by CPU and thread count (OpenBLAS on an AMD EPYC differs from the
    Intel host in the last bit). An rtol alone fails where the terms cancel: a small element
    of a product of large terms carries the absolute error of its terms."""
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    return _rounding_atol(a.shape[-1], magnitude, np.result_type(a, b))


def sum_atol(x: np.ndarray, axis: Any) -> float:
    """As product_atol, for a sum of `x` over `axis` (generated kernels vectorise by the
    CPU's vector width, which sets their summation order)."""
    magnitude = np.abs(x.astype(np.float64)).sum(axis=axis)
    return _rounding_atol(x.size // max(magnitude.size, 1), magnitude, x.dtype)


class Fn(nn.Cell):
    """`construct(*xs)` is `fn(*xs)`: a test's function of primitives as a cell."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def construct(self, *xs: Any) -> Any:
        return self.fn(*xs)


class MatMulChain(nn.Cell):
    """Four library matmuls of one shape, and a view of the first returned with the last."""

    def __init__(self):
        super().__init__()
        self.mm, self.reshape, self.tanh = P.MatMul(), P.Reshape(), P.Tanh()

    def construct(self, x, w):
        m1 = self.mm(x, w)
        m2 = self.mm(self.tanh(m1), w)
        m3 = self.mm(self.tanh(m2), w)
        m4 = self.mm(self.tanh(m3), w)
        return self.reshape(m1, (-1,)), m4


def chain_reference(x, w):
    m1 = x @ w
    m4 = np.tanh(np.tanh(np.tanh(m1) @ w) @ w) @ w
    return m1.reshape(-1), m4


class Pointwise(nn.Cell):
    """tanh(x * 2 + w) * x over rows of 64 (vector math: a kernel that prefetches)."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(np.linspace(-1, 1, 64).astype(np.float32), name="w")

    def construct(self, x):
        return P.Tanh()(x * 2.0 + self.w) * x


def pointwise_ref(net, x):
    return np.tanh(x * 2 + net.w.asnumpy()) * x


def fused_and_unfused_outputs(make_net: Callable[[], Any], *arrays: np.ndarray
                              ) -> list[np.ndarray]:
    """A Net's outputs (numpy arrays) with graph-kernel fusion on, then off, in the current
    mode, after checking the two agree; returns the fused ones."""
    from graphkernel import Tensor, context
    outs = []
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        out = make_net()(*(Tensor(a) for a in arrays))
        outs.append([o.asnumpy() for o in out] if isinstance(out, tuple) else [out.asnumpy()])
    for fused, plain in zip(*outs):
        assert fused.dtype == plain.dtype and fused.shape == plain.shape
        np.testing.assert_allclose(fused, plain, rtol=2e-6, atol=1e-6)
    return outs[0]


class StackLayer(nn.Cell):
    """Dense + bias + GeLU, a residual add and a row softmax: two fused groups around a
    product, as in an encoder layer's feed-forward block."""

    def __init__(self, rng: np.random.Generator, width: int) -> None:
        super().__init__()
        self.w = Parameter(rng.standard_normal((width, width)).astype(np.float32)
                                       * 0.2, name="w")
        self.b = Parameter(rng.standard_normal(width).astype(np.float32), name="b")
        self.matmul, self.gelu, self.softmax = P.MatMul(), P.GeLU(), P.Softmax(axis=-1)

    def construct(self, x: Any) -> Any:
        return self.softmax(self.gelu(self.matmul(x, self.w) + self.b) + x)


class Stack(nn.Cell):
    def __init__(self, depth: int, width: int = 16) -> None:
        super().__init__()
        rng = np.random.default_rng(depth)
        self.layers = nn.CellList([StackLayer(rng, width) for _ in range(depth)])

    def construct(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return x
