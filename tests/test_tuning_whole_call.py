"""The tuner keeps the kernels it tuned only where whole calls through the compiled entry are
faster with them (backends/c/tuning_whole_call.py): every tuned kernel, else those that choose
no threads, else none, the dropped ones back at their defaults in the executable, its notes and
their records."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from test_tuning import _inputs, _options, needs_cc

import graphkernel
from graphkernel import nn
from graphkernel.backends.c import tuning, tuning_whole_call
from graphkernel.backends.c.tuning import Knobs
from graphkernel.ops import operations as P


class TwoKernels(nn.Cell):
    """Two generated kernels around a product."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Dense(96, 96)

    def construct(self, x, b):
        return P.GeLU()(self.dense(P.Tanh()(x + b) * 2.0))


def thread_variant(knobs: Knobs, default: Knobs) -> bool:
    return any(getattr(knobs, k) != getattr(default, k) for k in tuning_whole_call.THREAD_KNOBS)


@pytest.fixture
def records(tmp_path, monkeypatch):
    """A tuning-record folder of this test's own, and a short tuning budget."""
    folder = str(tmp_path / "tuning")
    monkeypatch.setattr(tuning, "record_folder", lambda: folder)
    monkeypatch.setattr(tuning, "TIME_BUDGET_S", 2.0)
    return folder


@pytest.fixture
def chosen(monkeypatch):
    """Every kernel's winner forced: for the Tanh kernel a variant that changes a thread knob,
    for the other one that changes streaming stores or prefetching (the clock is not what
    these tests test)."""
    def calm(knobs: Knobs, default: Knobs) -> bool:
        return knobs.stream_min_bytes != default.stream_min_bytes or \
            knobs.prefetch_min_bytes != default.prefetch_min_bytes

    def wins(self, i):
        knobs, default = self.variants[i][0], self.variants[0][0]
        return thread_variant(knobs, default) if "Tanh" in self.spec.name else \
            calm(knobs, default) and not thread_variant(knobs, default)
    monkeypatch.setattr(tuning._Tunable, "wins", wins)


def scripted(monkeypatch, verdicts):
    """whole_call_speed answering `verdicts` in turn; returns the list of libraries asked."""
    asked = []

    def speed(plan, tuned, plain, advance=lambda: None):
        asked.append(tuned)
        faster = verdicts[len(asked) - 1]
        return faster, "scripted " + ("faster" if faster else "slower")
    monkeypatch.setattr(tuning_whole_call, "whole_call_speed", speed)
    return asked


CELL = TwoKernels()  # one set of weights for every compile here


def compiled(level):
    x = _inputs(CELL)
    return graphkernel.compile(CELL, *x, options=_options(level)), x


def notes_by_kind(exe):
    notes = exe.executable.plan.schedule_notes
    kept = {k for k, v in notes.items() if "; kept, " in v}
    dropped = {k for k, v in notes.items() if v.startswith("defaults (") and "not kept" in v}
    return kept, dropped


@needs_cc
def test_thread_choices_are_dropped_when_only_the_others_gain(records, chosen, monkeypatch):
    asked = scripted(monkeypatch, [False, True])
    plain, x = compiled(0)
    exe, _ = compiled(1)
    kept, dropped = notes_by_kind(exe)
    assert len(asked) == 2, "the thread-free set is tried after the whole set loses"
    assert kept and dropped, exe.executable.plan.schedule_notes
    plain_c = {k.name: k.source for k in plain.kernels}
    for k in exe.kernels:
        name = "gk_" + k.name if "gk_" + k.name in dropped | kept else k.name
        if name in dropped:
            assert k.source == plain_c[k.name], "a dropped kernel runs its defaults' C"
        if name in kept:
            assert k.source != plain_c[k.name]
            assert "scripted slower; the tuned kernels but those choosing threads: " \
                   "scripted faster" in exe.executable.plan.schedule_notes[name]
    np.testing.assert_allclose(exe.run_arrays(*x)[0], plain.run_arrays(*x)[0], rtol=1e-4,
                               atol=1e-5)


@needs_cc
def test_tuned_kernels_that_slow_the_call_go_back_to_their_defaults(records, chosen,
                                                                   monkeypatch):
    scripted(monkeypatch, [False, False])
    plain, x = compiled(0)
    exe, _ = compiled(1)
    kept, dropped = notes_by_kind(exe)
    assert dropped and not kept, exe.executable.plan.schedule_notes
    assert [k.source for k in exe.kernels] == [k.source for k in plain.kernels]
    # Their records now hold the defaults: the next compile reads them and measures nothing
    stored = [f for f in os.listdir(records) if f.endswith(".json")]
    assert stored
    for name in stored:
        knobs, refused = tuning.read_record(os.path.join(records, name), name[:-5])
        assert refused is None and knobs is not None
        with open(os.path.join(records, name)) as f:
            assert json.load(f)["defaults"] == dataclasses.asdict(knobs)

    def no_measuring(*args, **kwargs):
        raise AssertionError("a stored record is measured again")
    monkeypatch.setattr(tuning, "_measure", no_measuring)
    again, _ = compiled(1)
    assert [k.source for k in again.kernels] == [k.source for k in plain.kernels]


@needs_cc
def test_whole_calls_are_timed_through_the_compiled_entry(records, chosen, monkeypatch):
    bars = []

    class shown:  # tuning.progress_bar's part: a bar of `total` steps, `advance` each
        def __init__(self, total, what, show):
            self.bar = {"total": total, "what": what, "show": show, "done": 0}
            bars.append(self.bar)

        def __enter__(self):
            return lambda: self.bar.update(done=self.bar["done"] + 1)

        def __exit__(self, *exc):
            pass
    monkeypatch.setattr(tuning_whole_call, "progress_bar", shown)
    exe, x = compiled(1)
    # the check shows its progress as the tuning does: a build, then each pass of a race
    # (a second race, a build and its passes, only where the first lost)
    (bar,) = bars
    assert "whole calls" in bar["what"] and bar["show"]
    races = 2 if bar["done"] > 1 + tuning_whole_call.PASSES else 1
    assert bar["done"] == 1 + tuning_whole_call.PASSES + (races - 1) * (
        1 + tuning_whole_call.PASSES) <= bar["total"]
    notes = exe.executable.plan.schedule_notes
    timed = [v for v in notes.values() if "whole calls" in v]
    assert timed, notes
    assert all("passes" in v and "the defaults' speed" in v for v in timed)
    plain, _ = compiled(0)
    np.testing.assert_allclose(exe.run_arrays(*x)[0], plain.run_arrays(*x)[0], rtol=1e-4,
                               atol=1e-5)
