"""The generated C of a fixed set of small graphs is stable: each kernel's source hashes to the
value recorded here. A change that alters generated C on purpose updates the hashes (the
failure prints the new ones); one that meant to move code only (issue 29's boundary) must leave
them. No products: the kernels beside BLAS depend on the machine's BLAS threads."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
from cells import Fn

import graphkernel
from graphkernel import ops as P
from graphkernel.graph_kernel.pipeline import CompileOptions

ON = CompileOptions(enable_graph_kernel=True)


def _chain(x, y):
    t = P.Maximum()(P.Exp()(P.Mul()(x, y)), P.Abs()(P.Sub()(x, y)))
    return P.Select()(P.IsNan()(t), y, P.FloorMod()(t, y))


def _softmax_norm(x):
    e = P.Exp()(P.Sub()(x, P.ReduceMax(keep_dims=True)(x, -1)))
    return P.RealDiv()(e, P.ReduceSum(keep_dims=True)(e, -1)), P.ReduceProd()(x, 0)


def _integers(a, b):
    return (P.ReduceMin()(P.Abs()(a), 1), P.ReduceMax()(P.FloorDiv()(a, b), 1),
            P.ReduceAny()(P.Greater()(a, b), 0))


def _graphs(rng: np.random.Generator) -> dict[str, tuple]:
    f32 = rng.standard_normal((8, 32)).astype(np.float32)
    i32 = rng.integers(-9, 9, (8, 32)).astype(np.int32)
    return {"chain": (_chain, f32, f32 + 1), "softmax": (_softmax_norm, f32),
            "integers": (_integers, i32, i32 | 1)}


GOLDEN = {
    "chain": ["56af3007ba9fc61b"],
    "softmax": ["6173f2ed989918e2"],
    "integers": ["190bed3c472402ad"],  # bool results stored as uint8_t (c_text.py)
}


def _hashes(rng: np.random.Generator) -> dict[str, list[str]]:
    out = {}
    for name, (fn, *inputs) in _graphs(rng).items():
        exe = graphkernel.compile(Fn(fn), *inputs, options=ON)
        sources = exe.executable.kernel_sources
        if not sources:
            pytest.skip("no C compiler: no generated C")
        out[name] = [hashlib.sha256(sources[k].encode()).hexdigest()[:16]
                     for k in sorted(sources)]
    return out


def test_generated_c_of_fixed_graphs_is_unchanged(rng):
    got = _hashes(rng)
    assert got == GOLDEN, f"generated C changed; if on purpose, GOLDEN = {got!r}"
