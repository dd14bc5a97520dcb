"""The compile cache (frontend/compile_cache.py): a warm start in a new process skips the passes
and gives exactly the cold compile's executable; every change that changes the result misses;
a bad entry falls back to a fresh compile that says why."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import graphkernel
from graphkernel import nn
from graphkernel.codegen import toolchain
from graphkernel.frontend import compile_cache, context
from graphkernel.graph_kernel.flags import parse_flags
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ir.printer import print_graph
from graphkernel.ops import operations as P

needs_cc = pytest.mark.skipif(toolchain.detect() is None, reason="needs a C compiler")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUSED = CompileOptions(enable_graph_kernel=True)


class Block(nn.Cell):
    """Dense-GeLU-Dense, residual, LayerNorm: products, fused groups and reductions."""

    def __init__(self, hidden: int = 8, inner: int = 16, seed: int = 0) -> None:
        super().__init__()
        self.up = nn.Dense(hidden, inner, activation="gelu")
        self.down = nn.Dense(inner, hidden)
        self.norm = nn.LayerNorm((hidden,))
        rng = np.random.default_rng(seed)
        for p in self.get_parameters():
            p.set_data(graphkernel.Tensor(rng.standard_normal(p.shape).astype(np.float32)))

    def construct(self, x: Any) -> Any:
        return self.norm(x + self.down(self.up(x)))


class Scaled(nn.Cell):
    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        self.scale = scale

    def construct(self, x: Any) -> Any:
        return P.Softmax()(P.Exp()(x * self.scale) + 1.0)


def _entries(folder: str) -> list[str]:
    graphs = os.path.join(folder, compile_cache.FOLDER)
    return sorted(os.listdir(graphs)) if os.path.isdir(graphs) else []


def _stages_text(exe: Any) -> dict[str, str]:
    return {name: print_graph(graph) for name, graph in exe.stages.items()}


# ---------------------------------------------------------------------------------------------
# A warm start in a new process

_CHILD = textwrap.dedent("""
    import hashlib, json, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    import graphkernel
    from graphkernel.graph_kernel.pipeline import CompileOptions
    from test_compile_cache import Block
    x = np.random.default_rng(7).standard_normal((4, 8)).astype(np.float32)
    exe = graphkernel.compile(Block(), x, options=CompileOptions(enable_graph_kernel=True))
    out = exe.run_arrays(x)[0]
    print(json.dumps({{
        "cache": exe.report.compile_cache, "from_cache": exe.from_cache,
        "plan": exe.plan.describe(), "kernels": [k.name for k in exe.kernels],
        "source": exe.executable.library.source, "steps": len(exe.plan.steps),
        "entry": exe.entry is not None, "reasons": [str(r) for r in exe.reasons],
        "stages": list(exe.stages), "out": out.tobytes().hex(), "summary": exe.summary(),
    }}))
""")


@needs_cc
def test_a_warm_start_in_a_new_process_hits_and_gives_the_cold_compiles_executable(
        cache_folder: str) -> None:
    code = _CHILD.format(tests=os.path.join(ROOT, "tests"))

    def child() -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    cold, warm = child(), child()
    assert cold["cache"].startswith("miss: no entry") and cold["cache"].endswith("stored")
    assert warm["cache"].startswith("hit: ")
    assert warm["from_cache"]
    assert len(_entries(cache_folder)) == 1
    for field in ("plan", "kernels", "source", "steps", "entry", "reasons", "stages", "out"):
        assert warm[field] == cold[field], field
    # The summary differs only in the compile time it reports.
    assert warm["summary"].splitlines()[1:] == cold["summary"].splitlines()[1:]
    x = np.random.default_rng(7).standard_normal((4, 8)).astype(np.float32)
    here = graphkernel.compile(Block(), x, options=FUSED).run_arrays(x)[0]
    assert here.tobytes().hex() == cold["out"]


@needs_cc
def test_a_hit_equals_a_fresh_compile_stage_by_stage(cache_folder: str, rng: Any) -> None:
    x = rng.standard_normal((4, 8)).astype(np.float32)
    cold = graphkernel.compile(Block(), x, options=FUSED)
    warm = graphkernel.compile(Block(), x, options=FUSED)
    assert warm.report.compile_cache.startswith("hit: ")
    assert warm.plan.describe() == cold.plan.describe()
    assert warm.kernel_count == cold.kernel_count
    assert len(warm.plan.steps) == len(cold.plan.steps)
    assert [str(r) for r in warm.reasons] == [str(r) for r in cold.reasons]
    assert warm.report.rewrites == cold.report.rewrites
    assert warm.stage_docs == cold.stage_docs
    # Stages before the final one are computed again when asked for: the same graphs.
    assert _stages_text(warm) == _stages_text(cold)
    for _ in range(3):
        x = rng.standard_normal((4, 8)).astype(np.float32)
        assert np.array_equal(warm.run_arrays(x)[0], cold.run_arrays(x)[0])


@needs_cc
def test_a_hit_runs_on_its_own_cells_weights(cache_folder: str, rng: Any) -> None:
    x = rng.standard_normal((4, 8)).astype(np.float32)
    first, second = Block(seed=1), Block(seed=2)
    graphkernel.compile(first, x, options=FUSED)
    warm = graphkernel.compile(second, x, options=FUSED)
    assert warm.report.compile_cache.startswith("hit: ")
    assert warm.params == tuple(second.get_parameters())
    context.set_context(mode=context.PYNATIVE_MODE)
    expected = second(graphkernel.Tensor(x)).asnumpy()
    np.testing.assert_allclose(warm.run_arrays(x)[0], expected, rtol=1e-4, atol=1e-5)


def test_the_cache_is_not_used_for_symbolic_dimensions(cache_folder: str) -> None:
    cell = Scaled()
    cell.set_inputs(graphkernel.Tensor(shape=[None, 4], dtype=graphkernel.float32))
    exe = graphkernel.compile(cell, np.ones((3, 4), np.float32), options=FUSED)
    assert exe.report.compile_cache.startswith("not used: symbolic dimensions")


# ---------------------------------------------------------------------------------------------
# What invalidates an entry

def _note(cell: nn.Cell, x: np.ndarray, options: CompileOptions = FUSED) -> str:
    return graphkernel.compile(cell, x, options=options).report.compile_cache


@needs_cc
@pytest.mark.parametrize("change", [
    "graph", "constant", "shape", "dtype", "fusion off", "flags", "cost model",
    "graphkernel version", "graphkernel sources", "numpy version", "cpu",
])
def test_each_change_that_changes_the_result_misses(cache_folder: str, change: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    assert _note(Scaled(), x).startswith("miss: no entry")
    assert _note(Scaled(), x).startswith("hit: ")
    cell, options = Scaled(), FUSED
    if change == "graph":
        class Other(Scaled):
            def construct(self, x: Any) -> Any:
                return P.Softmax()(P.Exp()(x * self.scale) - 1.0)
        cell = Other()
        cell.__class__.__name__ = "Scaled"  # the same name: only the graph differs
    elif change == "constant":
        cell = Scaled(3.0)
    elif change == "shape":
        x = np.ones((4, 4), np.float32)
    elif change == "dtype":
        x = x.astype(np.float64)
    elif change == "fusion off":
        options = CompileOptions(enable_graph_kernel=False)
    elif change == "flags":
        options = CompileOptions(enable_graph_kernel=True,
                                 flags=parse_flags("--enable_parallel_fusion=false"))
    elif change == "cost model":
        from dataclasses import replace
        options = CompileOptions(enable_graph_kernel=True,
                                 cost=replace(FUSED.cost, parallel_threshold=1))
    elif change == "graphkernel version":
        monkeypatch.setattr(compile_cache, "__version__", "0.0.0-other")
        monkeypatch.setattr(compile_cache, "_stamp", [])
    elif change == "graphkernel sources":  # an edited module: another modification time
        monkeypatch.setattr(compile_cache, "_stamp", ["another tree"])
    elif change == "numpy version":
        monkeypatch.setattr(compile_cache.np, "__version__", "0.0.0-other")
    elif change == "cpu":
        monkeypatch.setattr(toolchain, "cpu_signature", lambda: "flags : another cpu")
    assert _note(cell, x, options).startswith("miss: no entry"), change
    assert _note(cell, x, options).startswith("hit: "), change


@needs_cc
def test_the_key_holds_every_option_field() -> None:
    text = compile_cache.options_text(FUSED)
    data = json.loads(text)
    assert set(data) == {"enable_graph_kernel", "flags", "cost"}
    assert "enable_parallel_fusion" in data["flags"] and "parallel_threshold" in data["cost"]
    flags = parse_flags("--disable_expand_ops=GeLU,Softmax")
    same = parse_flags("--disable_expand_ops=Softmax,GeLU")
    assert compile_cache.options_text(CompileOptions(True, flags)) == \
        compile_cache.options_text(CompileOptions(True, same))


# ---------------------------------------------------------------------------------------------
# Bad entries, dumps, the switch

@needs_cc
@pytest.mark.parametrize("damage", ["truncated", "altered", "empty", "not a zip"])
def test_a_bad_entry_falls_back_to_a_fresh_compile_with_the_reason(
        cache_folder: str, damage: str, rng: Any) -> None:
    x = rng.standard_normal((4, 8)).astype(np.float32)
    cold = graphkernel.compile(Block(), x, options=FUSED)
    [name] = _entries(cache_folder)
    path = os.path.join(cache_folder, compile_cache.FOLDER, name)
    data = open(path, "rb").read()
    if damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "altered":
        at = data.index(b'"op"') + 7  # a byte of an op's name inside the manifest
        data = data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]
    elif damage == "empty":
        data = b""
    else:
        data = b"#!/bin/sh\necho not a cache entry\n"
    with open(path, "wb") as fh:
        fh.write(data)
    again = graphkernel.compile(Block(), x, options=FUSED)
    note = again.report.compile_cache
    assert note.startswith("miss: the entry was unreadable and is removed (")
    assert note.endswith("; stored")  # a good entry replaces it
    assert again.plan.describe() == cold.plan.describe()
    assert np.array_equal(again.run_arrays(x)[0], cold.run_arrays(x)[0])
    assert graphkernel.compile(Block(), x, options=FUSED).report.compile_cache.startswith("hit")


@needs_cc
def test_save_graphs_compiles_every_stage_and_dumps_the_same(cache_folder: str,
                                                             tmp_path: Any) -> None:
    x = np.ones((3, 4), np.float32)
    assert _note(Scaled(), x).startswith("miss")
    dumps = []
    for i in range(2):
        folder = tmp_path / f"dump{i}"
        context.set_context(save_graphs=True, save_graphs_path=str(folder))
        exe = graphkernel.compile(Scaled(), x, options=FUSED)
        assert exe.report.compile_cache.startswith("not used: save_graphs")
        dumps.append({name: (folder / name).read_text() for name in
                      sorted(os.listdir(folder)) if name.endswith(".ir")})
    assert dumps[0] == dumps[1] and len(dumps[0]) == len(exe.stages)


@needs_cc
def test_the_environment_switch_turns_it_off(cache_folder: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compile_cache.ENV, "0")
    x = np.ones((3, 4), np.float32)
    assert _note(Scaled(), x).startswith("off")
    assert _note(Scaled(), x).startswith("off")
    assert _entries(cache_folder) == []


@needs_cc
def test_entries_are_written_whole_and_trimmed(cache_folder: str) -> None:
    for scale in (1.0, 2.0, 3.0):
        _note(Scaled(scale), np.ones((3, 4), np.float32))
    graphs = os.path.join(cache_folder, compile_cache.FOLDER)
    assert len(_entries(cache_folder)) == 3  # no temporary files left beside them
    compile_cache._trim(graphs, limit=1)
    assert len(_entries(cache_folder)) == 1


@needs_cc
def test_a_hit_of_a_training_step_writes_the_same_weights(cache_folder: str, rng: Any) -> None:
    """Weights written in place (Graph.assigns) are bound to the right Parameters on a hit."""
    x = rng.standard_normal((4, 8)).astype(np.float32)
    y = rng.standard_normal((4, 8)).astype(np.float32)

    def step() -> nn.Cell:
        net = Block(seed=3)
        return nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()),
                                   nn.Adam(net.trainable_params(), 1e-2))

    cold_step, warm_step = step(), step()
    cold = graphkernel.compile(cold_step, x, y, options=FUSED)
    warm = graphkernel.compile(warm_step, x, y, options=FUSED)
    assert warm.report.compile_cache.startswith("hit: ")
    assert warm.plan.describe() == cold.plan.describe()
    assert len(warm.graph.assigns) == len(cold.graph.assigns) > 0
    for _ in range(2):
        assert np.array_equal(warm.run_arrays(x, y)[0], cold.run_arrays(x, y)[0])
    cold_params = [p.asnumpy() for p in cold_step.get_parameters()]
    warm_params = [p.asnumpy() for p in warm_step.get_parameters()]
    assert len(cold_params) == len(warm_params)
    for a, b in zip(cold_params, warm_params):
        assert np.array_equal(a, b)
    assert not np.array_equal(cold_params[0], Block(seed=3).up.weight.asnumpy())  # it trained


class ConvBN(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, has_bias=True)
        self.bn = nn.BatchNorm2d(4, eps=1e-3)

    def construct(self, x: Any) -> Any:
        return P.ReLU()(self.bn(self.conv(x)))


@needs_cc
def test_a_hit_keeps_the_rewrites_and_the_convolution_blocks(cache_folder: str,
                                                             rng: Any) -> None:
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    cell = ConvBN()
    context.set_context(mode=context.GRAPH_MODE)
    cold = graphkernel.compile(cell, x, options=FUSED)
    warm = graphkernel.compile(cell, x, options=FUSED)
    assert warm.report.compile_cache.startswith("hit: ")
    assert cold.report.rewrites and warm.report.rewrites == cold.report.rewrites
    assert print_graph(warm.graph) == print_graph(cold.graph)  # with the builder's notes
    assert warm.plan.describe() == cold.plan.describe()
    assert np.array_equal(warm.run_arrays(x)[0], cold.run_arrays(x)[0])


@needs_cc
def test_processes_compiling_at_once_share_one_whole_entry(cache_folder: str) -> None:
    code = _CHILD.format(tests=os.path.join(ROOT, "tests"))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(3)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({r["out"] for r in results}) == 1 and len({r["plan"] for r in results}) == 1
    assert len(_entries(cache_folder)) == 1  # one entry, no temporary file left beside it
    assert child_note(code).startswith("hit: ")


def child_note(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])["cache"]  # type: ignore[no-any-return]


@needs_cc
def test_a_folder_that_cannot_take_the_entry_still_compiles(cache_folder: str) -> None:
    x = np.ones((3, 4), np.float32)
    os.makedirs(cache_folder, mode=0o700)
    with open(os.path.join(cache_folder, compile_cache.FOLDER), "w") as fh:
        fh.write("a file where the entries' folder belongs")  # even root cannot write there
    exe = graphkernel.compile(Scaled(), x, options=FUSED)
    assert exe.report.compile_cache.startswith("miss: no entry; not stored: ")
    expected = graphkernel.compile(Scaled(), x, options=CompileOptions(False)).run_arrays(x)
    np.testing.assert_allclose(exe.run_arrays(x)[0], expected[0], rtol=1e-6)
