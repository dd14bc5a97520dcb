"""Identical fused groups share one compiled kernel (backends/c/shared_kernels.py): a stack of
identical layers compiles its layer's kernels once, and groups whose code would differ (an
attribute, a constant, a shape) never share."""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from cells import Stack

import graphkernel
from graphkernel import nn
from graphkernel.backends.c import toolchain
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P

ON = CompileOptions(enable_graph_kernel=True)
pytestmark = pytest.mark.skipif(toolchain.detect() is None, reason="needs a C compiler")

# A kernel's own body starts on a line of its own; a shared one's forward is one line.
_BODY = re.compile(r"^void (gk_\w+)\(void \*const \*args\) \{$", re.M)
_FORWARD = re.compile(r"^void (gk_\w+)\(void \*const \*args\) \{ (gk_\w+)\(args\); \}$", re.M)


def _functions(compiled: Any) -> tuple[set[str], dict[str, str]]:
    """The kernel functions compiled with code of their own, and each forward's target."""
    source = compiled.executable.library.source
    return set(_BODY.findall(source)), dict(_FORWARD.findall(source))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


OFF = CompileOptions(enable_graph_kernel=False)


def test_a_deeper_stack_compiles_no_more_kernel_functions() -> None:
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    counts = {}
    for depth in (1, 4):
        net = Stack(depth)
        compiled = graphkernel.compile(net, x, options=ON)
        bodies, forwards = _functions(compiled)
        counts[depth] = len(bodies)
        # every planned kernel is one of the compiled bodies or a forward to one
        planned = {s.kernel.name for s in compiled.plan.kernel_steps() if s.kernel is not None}
        assert planned == bodies | set(forwards)
        assert set(forwards.values()) <= bodies
        unfused = graphkernel.compile(net, x, options=OFF)
        np.testing.assert_allclose(compiled.run_arrays(x)[0], unfused.run_arrays(x)[0],
                                   rtol=1e-4, atol=1e-5)
    assert counts[4] == counts[1] >= 1, counts


class Variants(nn.Cell):
    """Four groups of the same ops: `b` is `a` again (shared); `c` differs only in a constant,
    `d` in the softmax axis, `e` in its input's shape: none of those may share `a`'s code."""

    def __init__(self) -> None:
        super().__init__()
        self.exp, self.tanh = P.Exp(), P.Tanh()
        self.rows, self.cols = P.Softmax(axis=-1), P.Softmax(axis=0)
        self.matmul = P.MatMul()

    def construct(self, x: Any, y: Any, z: Any) -> Any:
        a = self.rows(self.tanh(x * 2.0) + 1.0)
        # products between the groups keep them apart (each its own kernel)
        b = self.rows(self.tanh(self.matmul(a, y) * 2.0) + 1.0)
        c = self.rows(self.tanh(self.matmul(b, y) * 3.0) + 1.0)
        d = self.cols(self.tanh(self.matmul(c, y) * 2.0) + 1.0)
        e = self.rows(self.tanh(self.matmul(z, d) * 2.0) + 1.0)
        return a, b, c, d, e


def test_groups_differing_in_an_attribute_a_constant_or_a_shape_are_not_shared() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 8)).astype(np.float32)
    y = rng.standard_normal((8, 8)).astype(np.float32)
    z = rng.standard_normal((4, 8)).astype(np.float32)
    compiled = graphkernel.compile(Variants(), x, y, z, options=ON)
    bodies, forwards = _functions(compiled)
    # exactly one group (b) reuses another's code; a, c, d, e each have their own
    assert len(forwards) == 1, (sorted(bodies), forwards)
    assert len(bodies) == 4, sorted(bodies)
    a = _softmax(np.tanh(x * 2.0) + 1.0)
    b = _softmax(np.tanh(a @ y * 2.0) + 1.0)
    c = _softmax(np.tanh(b @ y * 3.0) + 1.0)
    d = np.tanh(c @ y * 2.0) + 1.0
    d = np.exp(d - d.max(0, keepdims=True))
    d = d / d.sum(0, keepdims=True)
    e = _softmax(np.tanh(z @ d * 2.0) + 1.0)
    for got, want in zip(compiled.run_arrays(x, y, z), (a, b, c, d, e)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
