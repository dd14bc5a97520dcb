"""Compile time that does not grow with depth (issue #30 item 5): the compiled entry of a stack
of identical layers is the same C loop at any depth (its steps are a table of numbers,
backends/c/c_entry.py), and the compile report says where a compile's time went (trace, compile
cache, each stage, C emission, the C compiler or the kernel cache, loading)."""
from __future__ import annotations

import re
import sys
from typing import Any

import numpy as np
import pytest
from cells import Stack

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c import toolchain
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P
from graphkernel.tools.report_timing import compile_timeline, compile_timeline_html

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)
pytestmark = pytest.mark.skipif(toolchain.detect() is None, reason="needs a C compiler")


def _run_function(source: str) -> str:
    """The C of the entry's `gk_run` (its per-call code, without the tables it reads)."""
    match = re.search(r"^static PyObject \*gk_run\(.*?^}$", source, re.M | re.S)
    assert match is not None, "no compiled entry in the library"
    return match.group(0)


def test_a_deeper_stacks_entry_runs_the_same_code_on_a_longer_table() -> None:
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    runs = {}
    for depth in (1, 6):
        net = Stack(depth)
        compiled = graphkernel.compile(net, x, options=ON)
        assert compiled.entry is not None  # every step runs in the compiled entry
        runs[depth] = _run_function(compiled.executable.library.source)
        got = compiled(Tensor(x)).asnumpy()  # through the entry's `call`
        want = graphkernel.compile(net, x, options=OFF).run_arrays(x)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        # the Python runner's steps agree with the entry
        ex = compiled.executable
        steps = ex.runner.run(ex.check_inputs([x]), compiled._weights())[0]
        np.testing.assert_allclose(got, steps, rtol=1e-6, atol=1e-6)
    # 6 layers' steps are data: the code gcc compiles is the 1-layer entry's, line for line,
    # but for the count of values it holds
    shape = {d: re.sub(r"\b\d+\b", "N", text) for d, text in runs.items()}
    assert shape[6] == shape[1], (len(runs[1]), len(runs[6]))


def test_the_compile_report_says_where_the_time_went(cache_folder: str) -> None:
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    cold = graphkernel.compile(Stack(2), x, options=ON)
    names = [name for name, _ in cold.report.timeline]
    assert names[0].startswith("trace")
    # every stage the pipeline ran, in order, then the build: planning, the compiler, loading
    assert [n.removeprefix("stage ") for n in names if n.startswith("stage ")] == \
        list(cold.report.stages)
    assert any(n.startswith("build: C compiler") for n in names), names
    assert names.index("build: plan, kernels' C emitted") < \
        next(i for i, n in enumerate(names) if n.startswith("build: load"))
    assert all(s >= 0 for _, s in cold.report.timeline)
    rows = compile_timeline(cold)
    assert sum(s for _, s in rows) == pytest.approx(cold.compile_seconds, rel=1e-6)
    assert "Where the compile time went" in compile_timeline_html(cold)
    # the same graph again: the compile cache's final graph and the kernel cache's library,
    # no stage and no compiler
    warm = graphkernel.compile(Stack(2), x, options=ON)
    assert warm.report.compile_cache.startswith("hit"), warm.report.compile_cache
    names = [name for name, _ in warm.report.timeline]
    assert not any(n.startswith("stage ") or "C compiler" in n for n in names), names
    assert "build: library from the kernel cache (checked)" in names
    assert sum(s for _, s in compile_timeline(warm)) == \
        pytest.approx(warm.compile_seconds, rel=1e-6)


def _own_names(name: str) -> re.Pattern[str]:
    """How shared_kernels found a kernel's own names before (a regular expression per name):
    `name` starting an identifier and not continued by a letter or digit."""
    return re.compile(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9])")


def test_a_kernel_name_is_taken_out_where_the_regular_expression_found_it() -> None:
    """shared_kernels scans for a kernel's name with str.find (compiling a pattern per name
    cost 0.9 ms, twice per kernel): the same text as the pattern's substitution, on names at
    the start and end, after `_` or a letter, before `_`, a digit or a letter, overlapping."""
    from graphkernel.backends.c import shared_kernels
    sources = ["gk_F(a); gk_F_threads; xgk_F; _gk_F; gk_F1; gk_Fa; gk_F_; gk_F",
               "gk_Fgk_F gk_Fgk_F_ (gk_F)gk_F", "aaaa aaa aa a", "", "gk_Fused_Add_Mul"]
    rng = np.random.default_rng(0)
    sources += ["".join(rng.choice(list("ab_1 (")) for _ in range(60)) for _ in range(200)]
    for name in ["gk_F", "aa", "a", "a_", "ab", "b1"]:
        for source in sources:
            expected = _own_names(name).sub(shared_kernels._NAME_MARK, source)
            assert shared_kernels._take_out_name(name, source) == expected, (name, source)


def test_a_kernel_name_in_the_prelude_is_found_as_the_prelude_text_search_found_it() -> None:
    """shared_kernels reads the prelude's identifiers once instead of searching its text for
    each kernel's name: both say the same for every prefix of a prelude identifier (names that
    begin an identifier, are one, or are not there)."""
    from graphkernel.backends.c import shared_kernels
    from graphkernel.backends.c.c_text import PRELUDE
    names = {ident[:k] for ident in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", PRELUDE)
             for k in range(1, len(ident) + 1)} | {"gk_Fused_Add_Mul", "gk_"}
    for name in sorted(names):
        by_text = _own_names(name).search(PRELUDE) is not None
        assert shared_kernels._in_prelude(name) == by_text, name


def test_expanding_a_deep_stack_does_not_walk_the_graph_per_op(monkeypatch) -> None:
    """Expansion replaced each expanded op's uses with a walk over the whole graph (quadratic
    in depth); it now remaps inputs as it reaches them. Same results as unfused."""
    from graphkernel.ir.graph import Graph
    walks = []
    original = Graph.replace_uses

    def counted(self: Graph, old: Any, new: Any) -> None:
        walks.append(old)
        original(self, old, new)

    monkeypatch.setattr(Graph, "replace_uses", counted)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    net = Stack(6)
    compiled = graphkernel.compile(net, x, options=ON)
    expand_walks = [n for n in walks if n.op in ("GeLU", "Softmax")]  # the expanded ops
    assert expand_walks == [], len(expand_walks)
    want = graphkernel.compile(net, x, options=OFF).run_arrays(x)[0]
    np.testing.assert_allclose(compiled.run_arrays(x)[0], want, rtol=1e-4, atol=1e-5)


class HeadsLayer(nn.Cell):
    """A product + bias split into heads and merged back (the views sink_views moves above the
    bias add), then GeLU and a residual, as in an attention block."""

    def __init__(self, rng: np.random.Generator, width: int) -> None:
        super().__init__()
        self.w = graphkernel.Parameter(rng.standard_normal((width, width)).astype(np.float32)
                                       * 0.2, name="w")
        self.b = graphkernel.Parameter(rng.standard_normal(width).astype(np.float32), name="b")
        self.matmul, self.bias_add, self.gelu = P.MatMul(), P.BiasAdd(), P.GeLU()
        self.reshape, self.transpose = P.Reshape(), P.Transpose()

    def construct(self, x: Any) -> Any:
        rows, width = x.shape
        y = self.bias_add(self.matmul(x, self.w), self.b)
        heads = self.transpose(self.reshape(y, (rows, 2, width // 2)), (1, 0, 2))
        merged = self.reshape(self.transpose(heads * 0.5, (1, 0, 2)), (rows, width))
        return self.gelu(merged) + x


def test_moving_views_in_a_deep_stack_does_not_walk_the_graph_per_view(monkeypatch) -> None:
    """sink_views took the whole graph's users (and rescanned it) once per view it moved:
    quadratic in depth. The passes now take the users a fixed number of times at any depth.
    Same results as unfused."""
    from graphkernel.graph_kernel import index_maps
    from graphkernel.ir.graph import Graph
    walks: dict[str, int] = {}
    original = Graph.users

    def counted(self: Graph) -> Any:
        caller = sys._getframe(1).f_code
        if "graph_kernel" in caller.co_filename:  # the passes over the whole graph
            walks[caller.co_name] = walks.get(caller.co_name, 0) + 1
        return original(self)

    monkeypatch.setattr(Graph, "users", counted)
    moved = []
    sink = index_maps._sink
    monkeypatch.setattr(index_maps, "_sink", lambda *a: moved.append(1) or sink(*a))
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    counts = {}
    for depth in (1, 6):
        walks.clear()
        moved.clear()
        net = nn.SequentialCell([HeadsLayer(np.random.default_rng(i), 16)
                                 for i in range(depth)])
        compiled = graphkernel.compile(net, x, options=ON)
        counts[depth] = (dict(walks), len(moved))
        want = graphkernel.compile(net, x, options=OFF).run_arrays(x)[0]
        np.testing.assert_allclose(compiled.run_arrays(x)[0], want, rtol=1e-4, atol=1e-5)
    assert counts[6][1] >= 6 * 2, counts  # views were moved in every layer
    assert counts[6][0] == counts[1][0], counts
