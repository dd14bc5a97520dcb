"""The compile cache (frontend/compile_cache.py): a warm start in a new process skips the passes
and gives exactly the cold compile's executable; every change that changes the result misses;
a bad entry falls back to a fresh compile that says why."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import graphkernel
from graphkernel import nn
from graphkernel.backends.c import cache, toolchain
from graphkernel.backends.c.config import CConfig
from graphkernel.frontend import archive, compile_cache, context
from graphkernel.graph_kernel.flags import parse_flags
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ir.printer import print_graph
from graphkernel.ops import operations as P
from graphkernel.runtime.plan import PlanSettings

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
    "C backend settings", "plan settings",
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
                                 cost=replace(FUSED.cost, parallel_max_groups=2))
    elif change == "C backend settings":
        options = CompileOptions(enable_graph_kernel=True,
                                 backend_config=CConfig(parallel_threshold=1))
    elif change == "plan settings":
        options = CompileOptions(enable_graph_kernel=True,
                                 backend_config=CConfig(plan=PlanSettings(prefault_buffers=False)))
    elif change == "graphkernel version":
        monkeypatch.setattr(cache, "__version__", "0.0.0-other")
        monkeypatch.setattr(cache, "_stamp", [])
    elif change == "graphkernel sources":  # an edited module: another modification time
        monkeypatch.setattr(cache, "_stamp", ["another tree"])
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
    assert set(data) == {"enable_graph_kernel", "flags", "cost", "backend", "backend_config"}
    assert "enable_parallel_fusion" in data["flags"] and "parallel_max_bytes" in data["cost"]
    assert "parallel_threshold" in data["backend_config"] and \
        "blas_parallel_min_mnk" in data["backend_config"]["plan"]
    # None is the backend's defaults: the same key
    explicit = CompileOptions(enable_graph_kernel=True, backend_config=CConfig())
    assert compile_cache.options_text(explicit) == text
    flags = parse_flags("--disable_expand_ops=GeLU,Softmax")
    same = parse_flags("--disable_expand_ops=Softmax,GeLU")
    assert compile_cache.options_text(CompileOptions(True, flags)) == \
        compile_cache.options_text(CompileOptions(True, same))


# ---------------------------------------------------------------------------------------------
# Bad entries, dumps, the switch

@needs_cc
@pytest.mark.parametrize("damage", ["truncated", "altered", "empty", "not a zip"])
def test_a_bad_entry_falls_back_to_a_fresh_compile_with_the_reason(
        cache_folder: str, damage: str, rng: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "_warned", set())
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
    again, said = _compile_warned(Block(), x)
    _assert_replaced(again, said, path, "")  # said once, naming the file; a good entry replaces it
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


# ---------------------------------------------------------------------------------------------
# Entries from anyone: sums that match say an entry is whole, not that it is true

def forge(path: str, change: Callable[[dict[str, Any], dict[str, bytes]], None]) -> None:
    """Rewrite the entry at `path` with `change` made to its manifest and entries and every
    sum matching again, as anything that can write the file can."""
    entries = archive.read_entries(path, path, compile_cache.KIND)
    manifest = json.loads(entries.pop(archive.MANIFEST))
    del entries[archive.CHECKSUM], manifest["entries"]
    # The graph's own entry seen as part of the manifest, as the reader joins them
    read = entries[compile_cache.GRAPH_ENTRY]
    code = json.loads(read)
    manifest.update(code)
    change(manifest, entries)
    if entries.get(compile_cache.GRAPH_ENTRY) == read:  # not replaced by `change` itself
        entries[compile_cache.GRAPH_ENTRY] = json.dumps(
            {k: manifest.pop(k) for k in code}).encode()
    archive.write(path, manifest, entries, prefix=".forged.")


def _compile_warned(cell: nn.Cell, *arrays: np.ndarray) -> tuple[Any, list[str]]:
    """The compile, and the compile cache's warnings it gave."""
    with pytest.warns() as record:
        exe = graphkernel.compile(cell, *arrays, options=FUSED)
    return exe, [str(w.message) for w in record if "compile cache entry" in str(w.message)]


def _assert_replaced(exe: Any, said: list[str], path: str, why: str) -> None:
    """A miss said once, naming the file, and a good entry written in its place."""
    note = exe.report.compile_cache
    assert note.startswith("miss: the entry was unreadable and is removed (") and why in note
    assert note.endswith("; stored")
    assert len(said) == 1 and path in said[0] and why in said[0]


@needs_cc
def test_an_entry_copied_under_another_key_is_a_miss_said_once(
        cache_folder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "_warned", set())
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    _note(Scaled(2.0), x)
    [doubled] = _entries(cache_folder)
    _note(Scaled(3.0), x)
    [tripled] = [n for n in _entries(cache_folder) if n != doubled]
    graphs = os.path.join(cache_folder, compile_cache.FOLDER)
    shutil.copyfile(os.path.join(graphs, doubled), os.path.join(graphs, tripled))
    exe, said = _compile_warned(Scaled(3.0), x)
    _assert_replaced(exe, said, os.path.join(graphs, tripled), "a swapped or copied entry")
    expected = graphkernel.compile(Scaled(3.0), x, options=CompileOptions(False)).run_arrays(x)
    np.testing.assert_allclose(exe.run_arrays(x)[0], expected[0], rtol=1e-6)
    assert _note(Scaled(3.0), x).startswith("hit: ")


@needs_cc
def test_a_forged_type_is_a_miss_not_a_heap_overflow(cache_folder: str) -> None:
    """The GeLU after the first product declared 1 row of 4: it was a hit, whose buffers were
    sized by the forged type and written past (50 calls: glibc aborted, "corrupted size vs.
    prev_size")."""
    code = _CHILD.format(tests=os.path.join(ROOT, "tests"))
    assert child_note(code).startswith("miss: no entry")
    [name] = _entries(cache_folder)

    def shrink(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
        node, types = manifest["graph"]["nodes"][1], manifest["types"]
        assert node["op"] == "Composite" and types[node["type"]]["shape"] == [4, 16]
        types.append({**types[node["type"]], "shape": [1, 16]})
        node["type"] = len(types) - 1  # this node's type alone, in the type table

    forge(os.path.join(cache_folder, compile_cache.FOLDER, name), shrink)
    note = child_note(code)
    assert note.startswith("miss: the entry was unreadable and is removed (the graph does not "
                           "check: ") and "has type float32[1,16]" in note, note
    assert child_note(code).startswith("hit: ")


def _reshaped(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    entries["arrays/const0.npy"] = archive.npy(np.zeros(3, np.float32))
    manifest["constants"][0]["type"]["shape"] = [3]


def _not_an_array(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    entries["arrays/const0.npy"] = b"\x93NUMPY not an array"


def _unhashable_name(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    manifest["constants"][0]["array"] = ["const0"]


@needs_cc
@pytest.mark.parametrize("damage, why", [
    (_reshaped, "do not broadcast"),  # ran, then raised numpy's ValueError on every call
    (_not_an_array, "array const0 is unreadable"),  # a miss, but said to nobody
    (_unhashable_name, "array ['const0'] is missing"),  # the same
])
def test_a_bad_array_is_a_miss_said_once_and_replaced(
        cache_folder: str, monkeypatch: pytest.MonkeyPatch,
        damage: Callable[[dict[str, Any], dict[str, bytes]], None], why: str) -> None:
    monkeypatch.setattr(cache, "_warned", set())
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    _note(Scaled(), x)
    [name] = _entries(cache_folder)
    path = os.path.join(cache_folder, compile_cache.FOLDER, name)
    forge(path, damage)
    exe, said = _compile_warned(Scaled(), x)
    _assert_replaced(exe, said, path, why)
    expected = graphkernel.compile(Scaled(), x, options=CompileOptions(False)).run_arrays(x)
    np.testing.assert_allclose(exe.run_arrays(x)[0], expected[0], rtol=1e-6)
    assert _note(Scaled(), x).startswith("hit: ")


class ThreeSpaces(nn.Cell):
    """A parallel kernel of three loop nests (its LOOP_NESTS note: [[0], [1], [2]])."""

    def construct(self, x: Any, y: Any, z: Any) -> Any:
        return (P.Tanh()(x * 2.0), P.Add()(y, 1.0), P.ReduceSum()(P.Exp()(z), 1))


def _three_spaces_entry(cache_folder: str) -> tuple[tuple[np.ndarray, ...], Any, str]:
    """ThreeSpaces compiled cold (a parallel kernel of three loop nests, a 3-tuple): its
    inputs, the compiled graph, and the path of the compile-cache entry it wrote."""
    rng = np.random.default_rng(3)
    arrays = (rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal(7),
              rng.standard_normal((3, 8)).astype(np.float32))
    cold = graphkernel.compile(ThreeSpaces(), *arrays, options=FUSED)
    [name] = _entries(cache_folder)
    return arrays, cold, os.path.join(cache_folder, compile_cache.FOLDER, name)


@needs_cc
@pytest.mark.parametrize("nests", [[[0], [1], [7]], [[0], [1]], [[0], [1, 2], [2]], "0,1,2"])
def test_forged_loop_nests_are_a_miss(cache_folder: str, monkeypatch: pytest.MonkeyPatch,
                                      nests: Any) -> None:
    """Out of range: an IndexError on every compile; an output no nest writes: returned
    unwritten."""
    monkeypatch.setattr(cache, "_warned", set())
    arrays, cold, path = _three_spaces_entry(cache_folder)

    def renumber(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
        [node] = [n for n in manifest["graph"]["nodes"] if "loop_nests" in n["notes"]]
        assert node["notes"]["loop_nests"] == {"list": [{"list": [i]} for i in range(3)]}
        node["notes"]["loop_nests"] = nests if isinstance(nests, str) else \
            {"list": [{"list": n} for n in nests]}

    forge(path, renumber)
    exe, said = _compile_warned(ThreeSpaces(), *arrays)
    _assert_replaced(exe, said, path, "note loop_nests")
    for got, want in zip(exe.run_arrays(*arrays), cold.run_arrays(*arrays)):
        np.testing.assert_array_equal(got, want)


@needs_cc
def test_a_forged_item_number_is_a_miss(cache_folder: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Item -1 of a 3-tuple has the type of item 2, but the runtime's slots are numbered from
    0: a raw KeyError on every compile."""
    monkeypatch.setattr(cache, "_warned", set())
    arrays, cold, path = _three_spaces_entry(cache_folder)

    def last_from_the_end(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
        [item] = [n for n in manifest["graph"]["nodes"]
                  if n["op"] == "GetItem" and n["attrs"]["index"] == 2]
        item["attrs"]["index"] = -1

    forge(path, last_from_the_end)
    exe, said = _compile_warned(ThreeSpaces(), *arrays)
    _assert_replaced(exe, said, path, "index must be an integer from 0, got -1")
    for got, want in zip(exe.run_arrays(*arrays), cold.run_arrays(*arrays)):
        np.testing.assert_array_equal(got, want)


def test_a_warm_hit_reads_and_builds_with_the_collector_paused_then_restores_it(
        cache_folder: str, rng: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's cyclic collector scanned the whole heap over and over while a hit's final graph
    was read (15-20% of a warm first call): it is held off for the read and the build, and
    left as it was after a hit, a miss, a failed build and when the caller turned it off."""
    import gc

    from graphkernel.backends.c import backend

    seen: list[tuple[str, bool]] = []
    load, build = compile_cache.load, backend.CBackend.build_executable

    def watched_load(*args: Any, **kwargs: Any) -> Any:
        seen.append(("read", gc.isenabled()))
        return load(*args, **kwargs)

    def watched_build(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(("build", gc.isenabled()))
        return build(self, *args, **kwargs)

    monkeypatch.setattr(compile_cache, "load", watched_load)
    monkeypatch.setattr(backend.CBackend, "build_executable", watched_build)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    assert gc.isenabled()
    graphkernel.compile(Block(), x, options=FUSED)  # a miss: the passes run collected
    assert seen == [("read", False), ("build", True)] and gc.isenabled()
    seen.clear()
    warm = graphkernel.compile(Block(), x, options=FUSED)
    assert warm.report.compile_cache.startswith("hit: ")
    assert seen == [("read", False), ("build", False)] and gc.isenabled()

    def failing_build(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("build failed")

    monkeypatch.setattr(backend.CBackend, "build_executable", failing_build)
    with pytest.raises(RuntimeError, match="build failed"):
        graphkernel.compile(Block(), x, options=FUSED)
    assert gc.isenabled()
    monkeypatch.setattr(backend.CBackend, "build_executable", watched_build)
    gc.disable()
    try:
        graphkernel.compile(Block(), x, options=FUSED)
        assert not gc.isenabled(), "the caller's choice was undone"
    finally:
        gc.enable()
