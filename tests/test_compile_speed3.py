"""Compile time of a cold compile (issue #30 item 5, BERT-base's training step): Python's
cyclic garbage collector does not rescan the stages' live graphs every few hundred
allocations, and the caller's collector settings come back as they were."""
from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import graphkernel
from graphkernel.errors import GraphKernelError
from graphkernel.frontend import compile_cache
from graphkernel.graph_kernel import pipeline
from tests.test_compile_speed2 import ON, _inputs, _training_step


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of each collection that starts while the test runs."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.collect()
    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)


def test_a_cold_compile_rescans_no_old_generation(
        monkeypatch: pytest.MonkeyPatch, collections: list[int]) -> None:
    """A 2-layer encoder's training step, cold: the stages keep each graph they made alive, so
    at the default threshold (a collection each 700 net allocations) they were promoted and
    generations 1 and 2 rescanned as the heap grew (BERT-base: 48 such collections, ~20% of
    its Python CPU). The young generation is still collected; the thresholds come back."""
    monkeypatch.setenv(compile_cache.ENV, "0")  # the stages run
    step, x = _training_step(2), _inputs()
    thresholds = gc.get_threshold()
    exe = graphkernel.compile(step, x, x, options=ON)
    assert gc.get_threshold() == thresholds and gc.isenabled()
    passes = len(collections)
    assert [g for g in collections if g > 0] == []
    assert 0 < passes  # the collector ran: cycles made by the passes are still collected
    loss = float(np.asarray(exe.run_arrays(x, x)[0]))
    assert np.isfinite(loss)


def test_the_callers_collector_settings_come_back_when_a_pass_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compile_cache.ENV, "0")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise GraphKernelError("a pass failed")

    monkeypatch.setattr(pipeline, "simplify_composites", broken)
    step, x = _training_step(1), _inputs()
    before = gc.get_threshold()
    gc.set_threshold(500, 7, 9)
    try:
        with pytest.raises(GraphKernelError):
            graphkernel.compile(step, x, x, options=ON)
        assert gc.get_threshold() == (500, 7, 9) and gc.isenabled()
        gc.disable()  # a collector the caller turned off stays off
        with pytest.raises(GraphKernelError):
            graphkernel.compile(step, x, x, options=ON)
        assert not gc.isenabled() and gc.get_threshold() == (500, 7, 9)
    finally:
        gc.enable()
        gc.set_threshold(*before)
