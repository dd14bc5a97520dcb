"""Choices the C emitter makes, checked on the source it writes (no compiler needed)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from graphkernel.backends.c import c_emitter
from graphkernel.backends.c.c_emitter import emit_kernel
from graphkernel.backends.c.config import DEFAULT_C_CONFIG
from graphkernel.graph_kernel.expanders import expand_node
from graphkernel.graph_kernel.schedule import analyze
from graphkernel.ir.graph import Input, Node
from graphkernel.ir.types import TensorType

EXP_CALL = re.compile(r"\b(?:gkm_)?expf?\s*\(")


def softmax_source(shape: tuple[int, ...], dtype: type) -> str:
    """The C kernel of an expanded Softmax over the last axis."""
    x = Input(TensorType(shape, np.dtype(dtype)), "x")
    composite = expand_node(Node("Softmax", [x], {"axis": -1}, x.type))
    sub = composite.subgraph
    assert sub is not None
    sched = analyze(sub.nodes, sub.outputs)
    return emit_kernel(sub, "gk_Softmax", sched, DEFAULT_C_CONFIG.parallel_threshold,
                       DEFAULT_C_CONFIG.stream_min_bytes).source


def exp_calls(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if EXP_CALL.search(line)]


@pytest.mark.parametrize("shape, dtype", [((8, 64), np.float32), ((4, 1000), np.float64),
                                          ((2, 3, 50), np.float16), ((512, 4096), np.float32)])
def test_softmax_computes_exp_once_per_element(shape: tuple[int, ...], dtype: type) -> None:
    # exp(x - max) is needed by the row sum and again by the epilogue. The last reduction pass
    # keeps it in the output buffer, so the epilogue loads it: one exp call in the kernel, in
    # the loop that accumulates the sum, and none where the output is written.
    source = softmax_source(shape, dtype)
    calls = exp_calls(source)
    assert len(calls) == 1, f"exp called at {len(calls)} places:\n{source}"
    call = calls[0]
    body = source.splitlines()
    at = next(i for i, line in enumerate(body) if line.strip() == call)
    loop_end = next(i for i in range(at, len(body)) if body[i].strip() == "}")
    assert any(re.search(r"acc\d+ = acc\d+ \+", line) for line in body[at:loop_end]), source
    assert re.search(r"const \w+ stash\d+ = ", source), source


def test_without_the_stash_the_epilogue_would_call_exp_again(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    # The check above can fail: with the choice switched off, the same kernel calls exp twice
    # per element (once in the sum's pass, once in the epilogue).
    monkeypatch.setattr(c_emitter._Emitter, "_choose_stash", lambda self, outputs: None)
    source = softmax_source((8, 64), np.float32)
    assert len(exp_calls(source)) == 2
    assert "stash" not in source


def column_grad_source(shape: tuple[int, int]) -> str:
    """dz = dy * tanh(x) and its column sum (a bias gradient beside its activation's): one
    group, a column reduction with a full-size result."""
    from graphkernel.ir.graph import Graph
    t = TensorType(shape, np.dtype(np.float32))
    x, dy = Input(t, "x"), Input(t, "dy")
    th = Node("Tanh", [x], {}, t)
    dz = Node("Mul", [dy, th], {}, t)
    db = Node("ReduceSum", [dz], {"axis": (np.int64(0),), "keep_dims": np.bool_(False)},
              TensorType(shape[1:], t.dtype))
    sub = Graph("g", [x, dy], [th, dz, db], [dz, db])
    sched = analyze(sub.nodes, sub.outputs)
    return emit_kernel(sub, "gk_ColumnGrad", sched, DEFAULT_C_CONFIG.parallel_threshold,
                       DEFAULT_C_CONFIG.stream_min_bytes).source


@pytest.mark.parametrize("shape", [(8, 64), (512, 4096), (100, 3)])
def test_column_reduction_stores_its_full_size_result_in_the_summing_pass(
        shape: tuple[int, int]) -> None:
    # dz needs no reduction: the pass that sums it stores it too, so tanh runs once per
    # element and no epilogue pass reads x and dy again.
    source = column_grad_source(shape)
    tanh = [line.strip() for line in source.splitlines() if "tanhf(" in line]
    assert len(tanh) == 1, source
    lines = source.splitlines()
    store = next(i for i, line in enumerate(lines) if line.strip().startswith("out0["))
    accumulate = next(i for i, line in enumerate(lines) if re.search(r"acc\d+\[j\] = acc", line))
    assert abs(store - accumulate) == 1, source  # in the same lanes loop


def test_column_reduction_without_the_early_store_recomputes(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    # The check above can fail: every node counted as reading a reduction, the epilogue pass
    # computes tanh again.
    from graphkernel.backends.c.c_reduce import ReductionEmitter
    monkeypatch.setattr(ReductionEmitter, "_reduction_dependent",
                        lambda self: {n.uid for n in self.graph.nodes})
    source = column_grad_source((8, 64))
    assert len([line for line in source.splitlines() if "tanhf(" in line]) == 2
