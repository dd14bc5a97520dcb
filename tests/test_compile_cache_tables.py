"""The compile cache's entry format 3 (frontend/compile_cache.py): each distinct source location
and type stored once in tables that nodes index, every index and table entry checked; the plan
key taken from the bytes of the graph entry read, not the graph written out again; a warm stack
and training step in a new process giving the cold process's results."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from test_compile_cache import (
    FUSED,
    ROOT,
    Block,
    _assert_replaced,
    _compile_warned,
    _entries,
    forge,
    needs_cc,
)

import graphkernel
from graphkernel import nn
from graphkernel.backends.c import cache
from graphkernel.frontend import archive, compile_cache


class Stack(nn.Cell):
    """Identical blocks made by the same lines: each location and type repeats per block."""

    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.SequentialCell([Block(seed=s) for s in range(depth)])

    def construct(self, x: Any) -> Any:
        return self.blocks(x)


def _manifest(cache_folder: str) -> tuple[str, dict[str, Any]]:
    """The entry's path and its manifest joined with its graph's entry."""
    [name] = _entries(cache_folder)
    path = os.path.join(cache_folder, compile_cache.FOLDER, name)
    entries = archive.read_entries(path, path, compile_cache.KIND)
    return path, {**json.loads(entries[archive.MANIFEST]),
                  **json.loads(entries[compile_cache.GRAPH_ENTRY])}


def _nodes(graph: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for node in graph["nodes"]:
        out.append(node)
        if node["subgraph"] is not None:
            out += _nodes(node["subgraph"])
    return out


@needs_cc
def test_an_entry_holds_each_location_and_type_once(cache_folder: str, rng: Any) -> None:
    x = rng.standard_normal((4, 8)).astype(np.float32)
    graphkernel.compile(Stack(), x, options=FUSED)
    _, manifest = _manifest(cache_folder)
    assert manifest["version"] == compile_cache.VERSION == 3
    nodes = _nodes(manifest["graph"])
    locations, types = manifest["locations"], manifest["types"]
    # Three blocks made by the same lines: each line once in the table, nodes point at it.
    assert len(locations) == len({tuple(loc) for loc in locations}) < len(nodes) // 2
    assert all(type(n["loc"]) is int and 0 <= n["loc"] < len(locations) for n in nodes)
    assert len(types) == len({json.dumps(t, sort_keys=True) for t in types}) < len(nodes) // 2
    assert all(type(n["type"]) is int for n in nodes)
    warm = graphkernel.compile(Stack(), x, options=FUSED)
    assert warm.report.compile_cache.startswith("hit: ")
    # One location object per distinct line, shared by the nodes made there.
    locs = [n.loc for n in warm.graph.nodes if n.loc is not None]
    assert len({id(loc) for loc in locs}) == len(set(locs))


def _bad_location_index(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    manifest["graph"]["nodes"][0]["loc"] = len(manifest["locations"])


def _location_written_out(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    manifest["graph"]["nodes"][0]["loc"] = ["f.py", 1, "construct", "x"]


def _bad_location(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    manifest["locations"][0] = ["f.py", "one", "construct", "x"]


def _no_location_table(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    del manifest["locations"]


def _bad_type_index(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    manifest["graph"]["nodes"][0]["type"] = -1


def _type_written_out(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    manifest["graph"]["inputs"][0]["type"] = {"shape": [4, 8], "dtype": "float32"}


def _bool_type_index(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    manifest["graph"]["nodes"][0]["type"] = True


def _forged_table_type(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    # The table's entry every node of that type points at: a wrong shape checks nowhere.
    index = manifest["graph"]["nodes"][0]["type"]
    manifest["types"][index] = {"shape": [1, 3], "dtype": "float32"}


def _bad_table_type(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    manifest["types"][0] = {"shape": [4], "dtype": "no_such_dtype"}


def _old_version(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    manifest["version"] = 2


def _no_graph_entry(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    del entries[compile_cache.GRAPH_ENTRY]


def _graph_entry_not_json(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    entries[compile_cache.GRAPH_ENTRY] = b'{"graph": '
    del manifest["graph"], manifest["constants"], manifest["types"]


def _graph_entry_holding_more(manifest: dict[str, Any], entries: dict[str, bytes]) -> None:
    code = {k: manifest.pop(k) for k in ("graph", "constants", "types")}
    entries[compile_cache.GRAPH_ENTRY] = json.dumps({**code, "effects": []}).encode()


@needs_cc
@pytest.mark.parametrize("damage, why", [
    (_bad_location_index, "is no index into the location table"),
    (_location_written_out, "is no index into the location table"),
    (_bad_location, "location 0: bad source location"),
    (_no_location_table, "missing field 'locations'"),
    (_bad_type_index, "type -1 is no index into the type table"),
    (_type_written_out, "field 'type' has the wrong kind (dict)"),
    (_bool_type_index, "field 'type' has the wrong kind (bool)"),
    (_forged_table_type, "the graph does not check"),
    (_bad_table_type, "type 0: unknown dtype 'no_such_dtype'"),
    (_old_version, "is not a graphkernel compile cache entry of version 3"),
    (_no_graph_entry, "no graph.json entry"),
    (_graph_entry_not_json, "graph.json is not valid JSON"),
    (_graph_entry_holding_more, "graph.json does not hold a graph, its constants and types"),
])
def test_a_forged_table_or_an_old_entry_is_a_miss_said_once(
        cache_folder: str, monkeypatch: pytest.MonkeyPatch, damage: Any, why: str,
        rng: Any) -> None:
    monkeypatch.setattr(cache, "_warned", set())
    x = rng.standard_normal((4, 8)).astype(np.float32)
    cold = graphkernel.compile(Block(), x, options=FUSED)
    path, _ = _manifest(cache_folder)
    forge(path, damage)
    again, said = _compile_warned(Block(), x)
    _assert_replaced(again, said, path, why)
    assert np.array_equal(again.run_arrays(x)[0], cold.run_arrays(x)[0])
    assert graphkernel.compile(Block(), x, options=FUSED).report.compile_cache.startswith("hit")


@needs_cc
def test_a_hit_takes_the_plan_key_from_the_data_it_read(
        cache_folder: str, rng: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm build wrote the final graph out again for its plan key (the traced graph is
    written once, for the compile cache's key); now the key hashes the data the entry was
    read from, and the warm build still finds the cold build's library without writing C."""
    from graphkernel.backends.c import backend
    x = rng.standard_normal((4, 8)).astype(np.float32)
    cold = graphkernel.compile(Stack(), x, options=FUSED)
    written: list[str] = []
    emitted: list[str] = []
    real_write, real_emit = compile_cache.graph_to_data, backend.CBackend._emit

    def counted_write(graph: Any, *args: Any, **kwargs: Any) -> Any:
        written.append(graph.name)
        return real_write(graph, *args, **kwargs)

    def counted_emit(self: Any, spec: Any, config: Any) -> Any:
        emitted.append(spec.name)
        return real_emit(self, spec, config)

    monkeypatch.setattr(compile_cache, "graph_to_data", counted_write)
    monkeypatch.setattr(backend, "graph_to_data", counted_write)
    monkeypatch.setattr(backend.CBackend, "_emit", counted_emit)
    warm = graphkernel.compile(Stack(), x, options=FUSED)
    assert warm.report.compile_cache.startswith("hit: ")
    assert len(written) == 1, written  # the traced graph, for the entry's key
    assert emitted == []  # the plan record was found: no C written
    assert warm.executable.library.path == cold.executable.library.path
    for _ in range(3):
        x = rng.standard_normal((4, 8)).astype(np.float32)
        assert np.array_equal(warm.run_arrays(x)[0], cold.run_arrays(x)[0])


_STACK_CHILD = textwrap.dedent("""
    import hashlib, json, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    import graphkernel
    from graphkernel import nn
    from graphkernel.graph_kernel.pipeline import CompileOptions
    from test_compile_cache_tables import Stack
    fused = CompileOptions(enable_graph_kernel=True)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    y = rng.standard_normal((4, 8)).astype(np.float32)
    stack = graphkernel.compile(Stack(), x, options=fused)
    net = Stack()
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()),
                               nn.Adam(net.trainable_params(), 1e-2))
    train = graphkernel.compile(step, x, y, options=fused)
    outs = [stack.run_arrays(x)[0]] + [train.run_arrays(x, y)[0] for _ in range(2)]
    print(json.dumps({{
        "cache": [stack.report.compile_cache, train.report.compile_cache],
        "library": [stack.executable.library.path, train.executable.library.path],
        "out": [o.tobytes().hex() for o in outs],
        "weights": [p.asnumpy().tobytes().hex() for p in step.get_parameters()],
    }}))
""")


@needs_cc
def test_a_warm_stack_and_training_step_in_a_new_process_give_the_cold_results(
        cache_folder: str) -> None:
    code = _STACK_CHILD.format(tests=os.path.join(ROOT, "tests"))

    def child() -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=ROOT, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    cold, warm = child(), child()
    assert all(c.startswith("miss: no entry") for c in cold["cache"]), cold["cache"]
    assert all(c.startswith("hit: ") for c in warm["cache"]), warm["cache"]
    assert warm["library"] == cold["library"]
    assert warm["out"] == cold["out"]  # the stack, then two training steps' losses
    assert warm["weights"] == cold["weights"]  # and the weights they wrote
