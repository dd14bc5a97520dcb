"""A warm build writes no C (backends/c/backend.py): the library is found by a plan key from
everything that decides the C, through a plan record that is data from anyone. Anything that
changes the C misses; a record that names another graph's library is refused, saying why."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import graphkernel
from graphkernel import nn
from graphkernel.backends.c import backend, plan_records, toolchain
from graphkernel.backends.c.config import CConfig
from graphkernel.frontend import compile_cache
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P

needs_cc = pytest.mark.skipif(toolchain.detect() is None, reason="needs a C compiler")
FUSED = CompileOptions(enable_graph_kernel=True)


class Scaled(nn.Cell):
    """exp(x * scale) + 1, then a softmax along `axis`: a fused group and a reduction."""

    def __init__(self, scale: float = 2.0, axis: int = -1) -> None:
        super().__init__()
        self.scale = scale
        self.axis = axis

    def construct(self, x: Any) -> Any:
        return P.Softmax(self.axis)(P.Exp()(x * self.scale) + 1.0)


def expected(x: np.ndarray, scale: float = 2.0, axis: int = -1) -> np.ndarray:
    y = np.exp(x * np.asarray(scale, x.dtype)) + 1
    e = np.exp(y - y.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.fixture
def emitted(monkeypatch: pytest.MonkeyPatch, cache_folder: str) -> Iterator[list[str]]:
    """The names of the kernels whose C is written, in order (a fresh kernel cache; the
    compile cache off, so that only the plan record decides whether C is written)."""
    monkeypatch.setenv(compile_cache.ENV, "0")
    names: list[str] = []
    emit = backend.CBackend._emit

    def counting(self: Any, spec: Any, config: Any) -> Any:
        names.append(spec.name)
        return emit(self, spec, config)

    monkeypatch.setattr(backend.CBackend, "_emit", counting)
    yield names


def _records(folder: str) -> list[str]:
    plans = os.path.join(folder, plan_records.PLAN_FOLDER)
    return sorted(os.listdir(plans)) if os.path.isdir(plans) else []


def _compile(net: Any, x: np.ndarray, options: CompileOptions = FUSED) -> Any:
    return graphkernel.compile(net, x, options=options)


@needs_cc
def test_a_warm_build_writes_no_c_and_gives_the_cold_builds_executable(
        emitted: list[str], cache_folder: str, rng: Any) -> None:
    x = rng.standard_normal((4, 8)).astype(np.float32)
    cold = _compile(Scaled(), x)
    assert emitted and not cold.from_cache
    written = len(emitted)
    warm = _compile(Scaled(), x)
    assert len(emitted) == written, f"a warm build wrote C for {emitted[written:]}"
    assert warm.from_cache and warm.library_path == cold.library_path
    assert warm.plan.describe() == cold.plan.describe()
    np.testing.assert_allclose(warm(x).asnumpy(), expected(x), rtol=1e-5, atol=1e-6)
    assert np.array_equal(warm(x).asnumpy(), cold(x).asnumpy())
    # The C is still there for whoever asks (reports, exports): written then, the same text.
    assert warm.executable.library.source == cold.executable.library.source
    assert [k.source for k in warm.kernels] == [k.source for k in cold.kernels]
    assert len(emitted) > written


@needs_cc
@pytest.mark.parametrize("change", ["config", "attribute", "constant", "dtype"])
def test_anything_that_changes_the_c_misses(emitted: list[str], cache_folder: str, rng: Any,
                                            change: str) -> None:
    x = rng.standard_normal((4, 8)).astype(np.float32)
    base = _compile(Scaled(), x)
    scale, axis, options = 2.0, -1, FUSED
    if change == "config":  # every kernel on threads: the C has parallel loops
        options = CompileOptions(enable_graph_kernel=True,
                                 backend_config=CConfig(parallel_threshold=1))
    elif change == "attribute":
        axis = 0
    elif change == "constant":
        scale = 3.0
    else:
        x = x.astype(np.float64)
    written = len(emitted)
    other = _compile(Scaled(scale, axis), x, options)
    assert len(emitted) > written, f"{change}: found a library without writing its C"
    assert other.library_path != base.library_path
    assert other.executable.library.source != base.executable.library.source
    np.testing.assert_allclose(other(x).asnumpy(), expected(x, scale, axis), rtol=1e-5,
                               atol=1e-6)
    written = len(emitted)
    again = _compile(Scaled(scale, axis), x, options)  # its own record now: warm
    assert len(emitted) == written and again.library_path == other.library_path


def _forge_swapped_library(mine: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    # Its own key and mark, another graph's library: what copying one file's fields gives.
    return {**mine, "library_key": other["library_key"], "module": other["module"]}


def _forge_copied_record(mine: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    return dict(other)  # another graph's whole record under this graph's name


def _forge_escaping_key(mine: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    return {**mine, "library_key": "../" + other["library_key"][3:]}


@needs_cc
@pytest.mark.parametrize("forge, why", [
    (_forge_swapped_library, "not built for this graph"),
    (_forge_copied_record, "a swapped or copied record"),
    (_forge_escaping_key, "not a cache key"),
])
def test_a_record_naming_another_graphs_library_is_refused_saying_why(
        emitted: list[str], cache_folder: str, rng: Any, forge: Any, why: str) -> None:
    x = rng.standard_normal((4, 8)).astype(np.float32)
    # Two graphs whose kernels have the same names and arguments, one constant apart.
    first = _compile(Scaled(2.0), x)
    (first_record,) = _records(cache_folder)
    second = _compile(Scaled(3.0), x)
    (second_record,) = set(_records(cache_folder)) - {first_record}
    assert [k.name for k in first.kernels] == [k.name for k in second.kernels]
    plans = os.path.join(cache_folder, plan_records.PLAN_FOLDER)
    with open(os.path.join(plans, first_record), encoding="utf-8") as fh:
        other = json.load(fh)
    with open(os.path.join(plans, second_record), encoding="utf-8") as fh:
        mine = json.load(fh)
    with open(os.path.join(plans, second_record), "w", encoding="utf-8") as fh:
        json.dump(forge(mine, other), fh)
    written = len(emitted)
    with pytest.warns(RuntimeWarning, match=why):
        again = _compile(Scaled(3.0), x)
    assert len(emitted) > written  # built from its own C
    assert again.library_path == second.library_path != first.library_path
    assert any(why in w for w in again.warnings), again.warnings
    np.testing.assert_allclose(again(x).asnumpy(), expected(x, 3.0), rtol=1e-5, atol=1e-6)
    with open(os.path.join(plans, second_record), encoding="utf-8") as fh:
        assert json.load(fh) == mine  # written again by the fresh build


@needs_cc
def test_a_library_swapped_for_another_graphs_is_refused_and_rebuilt(
        emitted: list[str], cache_folder: str, rng: Any, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """Another graph's library copied over this graph's, its checksum rewritten to match: the
    record and the checksum agree, the mark does not."""
    import hashlib

    from graphkernel.backends.c import library

    x = rng.standard_normal((4, 8)).astype(np.float32)
    first = _compile(Scaled(2.0), x)
    second = _compile(Scaled(3.0), x)
    with open(first.library_path, "rb") as fh:
        data = fh.read()
    with open(second.library_path, "wb") as fh:
        fh.write(data)
    with open(second.library_path + ".sha256", "w", encoding="ascii") as fh:
        fh.write(hashlib.sha256(data).hexdigest() + "\n")
    monkeypatch.setattr(library, "_loaded", {})  # as a new process finds it: nothing loaded
    written = len(emitted)
    with pytest.warns(RuntimeWarning, match="not built for this graph"):
        again = _compile(Scaled(3.0), x)
    assert len(emitted) > written and not again.from_cache
    assert again.library_path == second.library_path
    np.testing.assert_allclose(again(x).asnumpy(), expected(x, 3.0), rtol=1e-5, atol=1e-6)
    with open(second.library_path, "rb") as fh:
        assert fh.read() != data  # rebuilt from this graph's C


@needs_cc
def test_a_warm_onnx_import_writes_no_c_until_its_source_is_asked_for(
        emitted: list[str], cache_folder: str, rng: Any) -> None:
    """An imported model's LoadedGraph keeps its kernels' C only as what writes it: a warm
    import (the plan record found) writes none, and the source read later is the cold one's."""
    pytest.importorskip("onnx")
    from onnx import numpy_helper
    from onnx_models import mlp

    from graphkernel.frontend import context

    made = mlp(np.random.default_rng(3))
    context.set_context(enable_graph_kernel=True)
    cold = graphkernel.load(made)
    assert emitted, "the cold import wrote no C"
    cold_source = cold.kernel_source
    written = len(emitted)
    warm = graphkernel.load(made)
    assert len(emitted) == written, f"a warm ONNX import wrote C for {emitted[written:]}"
    x = rng.standard_normal((5, 6)).astype(np.float32)
    w1, b1, w2 = (numpy_helper.to_array(i) for i in made.graph.initializer)
    want = np.maximum(x @ w1 + b1, 0) @ w2
    np.testing.assert_allclose(nn.GraphCell(warm)(graphkernel.Tensor(x)).asnumpy(), want,
                               rtol=1e-4, atol=1e-5)
    assert len(emitted) == written, "running the warm import wrote C"
    assert cold_source and warm.kernel_source == cold_source


def _onednn_prefix(root: Any, version: tuple[int, int, int]) -> str:
    """A folder laid out as the `onednn` and `onednn-devel` wheels lay out an environment."""
    os.makedirs(os.path.join(root, "lib"))
    os.makedirs(os.path.join(root, "include", "oneapi", "dnnl"))
    with open(os.path.join(root, "lib", "libdnnl.so.3"), "wb"):
        pass
    with open(os.path.join(root, "include", "oneapi", "dnnl", "dnnl.h"), "w") as fh:
        fh.write("/* headers */\n")
    with open(os.path.join(root, "include", "oneapi", "dnnl", "dnnl_version.h"), "w") as fh:
        for part, number in zip(("MAJOR", "MINOR", "PATCH"), version):
            fh.write(f"#define DNNL_VERSION_{part} {number}\n")
    return os.path.join(root, "lib", "libdnnl.so.3")


def test_the_wheels_onednn_is_named_without_asking_the_loader(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which oneDNN a convolution's stored timing belongs to is asked on every compile of a
    convolutional model, warm ones too: ctypes.util.find_library runs ldconfig and the C
    compiler (40-50 ms, most of the digits CNN's warm start), so the loader is asked only when
    the environment's own lib/ holds no oneDNN with headers (and then cheaply:
    loader_search.py, tests/test_loader_search.py)."""
    from graphkernel.backends.c import onednn
    asked: list[str] = []
    elsewhere = _onednn_prefix(tmp_path / "system", (3, 1, 0))

    def find_library(name: str) -> str:
        asked.append(name)
        return elsewhere

    monkeypatch.setattr(onednn.loader_search, "find_library", find_library)
    monkeypatch.setattr(onednn, "_state", {})
    _onednn_prefix(tmp_path / "env", (3, 13, 2))
    monkeypatch.setattr(onednn.sys, "prefix", str(tmp_path / "env"))
    assert onednn.installed_label() == "onednn 3.13.2"
    assert asked == []
    # No oneDNN in the environment: the loader's is found, and named.
    monkeypatch.setattr(onednn, "_state", {})
    monkeypatch.setattr(onednn.sys, "prefix", str(tmp_path / "empty"))
    assert onednn.installed_label() == "onednn 3.1.0"
    assert asked == ["dnnl"]


class Classifier(nn.Cell):
    """relu(x W^T + b): one product on the row-vector kernel (backends/c/c_gemm_row.py)."""

    def construct(self, x: Any, w: Any, b: Any) -> Any:
        return P.ReLU()(P.BiasAdd()(P.MatMul(transpose_b=True)(x, w), b))


@needs_cc
@pytest.mark.parametrize("rows", [1, 8])
def test_a_plan_record_naming_the_row_kernel_is_taken(emitted: list[str], rng: Any,
                                                      rows: int) -> None:
    """A record that names the row-vector kernel as a product's library is one the warm build
    takes (it was once refused as "not one label per product step", so every warm build of a
    CNN's classifier wrote its C)."""
    from graphkernel.backends.c.c_gemm_row import ROW_PRODUCT_LABEL
    x = rng.standard_normal((rows, 512)).astype(np.float32)
    w = rng.standard_normal((1000, 512)).astype(np.float32)
    b = rng.standard_normal(1000).astype(np.float32)
    cold = graphkernel.compile(Classifier(), x, w, b, options=FUSED)
    written = len(emitted)
    assert written
    warm = graphkernel.compile(Classifier(), x, w, b, options=FUSED)
    assert len(emitted) == written, f"a warm build wrote C for {emitted[written:]}"
    assert [s.attrs.get("gemm_library") for s in warm.plan.steps if s.op == "MatMul"] == \
        [ROW_PRODUCT_LABEL]
    assert warm.executable.library.path == cold.executable.library.path
    np.testing.assert_array_equal(warm.run_arrays(x, w, b)[0], cold.run_arrays(x, w, b)[0])
