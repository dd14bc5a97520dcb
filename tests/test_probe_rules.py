"""The rules by which a static plan's entry chooses between running its calls on threads and on
the calling thread alone (backends/c/c_entry_threads.py), fed given call times through the
entry's `threads_replay` (the same C the calls run, with no call made): when a probe of the
other mode runs, how long it lasts, and when it switches. A probe that cannot win ends at once,
so that on a quiet host a probe alone costs one call at a single thread's speed, not three."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from cells import ON

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c.c_entry_threads import (
    FIRST_PROBE,
    HOPELESS_FIRST_ALONE,
    PROBE_CALLS,
    PROBE_MARGIN,
    RECHECK,
    SLOW_FACTOR,
    SLOW_STREAK,
)

ON_THREADS = 0.020  # seconds a call on threads, in every case below


class TwoDense(nn.Cell):
    """A static plan of two kernels: the entry times its calls."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = nn.Dense(16, width)
        self.b = nn.Dense(width, 8)

    def construct(self, x):
        return self.b(nn.ReLU()(self.a(x)))


_WIDTHS = itertools.count(17)


@pytest.fixture
def entry(rng):
    """A fresh entry module, its probe state as a process's first call finds it: a graph of
    its own (the same graph compiled again shares its library, and the state with it)."""
    x = rng.standard_normal((4, 16)).astype(np.float32)
    exe = graphkernel.compile(TwoDense(next(_WIDTHS)), Tensor(x), options=ON)
    module = exe.executable.library.entry_module
    if module is None or not hasattr(module, "threads_replay"):
        pytest.skip("no compiled entry for this plan")
    return module


def test_the_first_probe_comes_after_first_probe_calls(entry):
    modes = entry.threads_replay([(ON_THREADS, ON_THREADS)] * (FIRST_PROBE + 1))
    assert modes[:FIRST_PROBE] == [0] * FIRST_PROBE
    assert modes[FIRST_PROBE] == 1


def test_a_hopeless_probe_alone_ends_after_its_first_call(entry):
    # a quiet host: alone a single thread's speed, far over HOPELESS_FIRST_ALONE x on threads
    alone = 1.8 * ON_THREADS
    assert alone > HOPELESS_FIRST_ALONE * ON_THREADS
    second = FIRST_PROBE + 1 + 2 * FIRST_PROBE  # the interval doubles after a probe that lost
    modes = entry.threads_replay([(ON_THREADS, alone)] * (second + 1))
    assert modes[FIRST_PROBE:FIRST_PROBE + 2] == [1, 0]  # one call alone, then threads again
    # the second probe is skipped: the call alone was slower than the margin allows
    assert [i for i, m in enumerate(modes) if m] == [FIRST_PROBE]
    stats = entry.threads_stats()
    assert stats["probes"] == 1 and stats["probes_skipped"] == 1 and stats["switches"] == 0
    assert stats["alone_now"] == 0 and stats["alone_best_s"] == pytest.approx(alone)


def test_a_slow_streak_probes_only_where_going_alone_could_win(entry):
    # After one probe found a call alone 1.8x a call on threads: calls on threads slowed 1.6x
    # (over SLOW_FACTOR, but alone would still be slower than PROBE_MARGIN x them) probe no
    # more; slowed 2.2x (alone now under the margin) SLOW_STREAK in a row, they probe at once.
    alone = 1.8 * ON_THREADS
    modes = entry.threads_replay([(ON_THREADS, alone)] * (FIRST_PROBE + 1))
    assert modes[FIRST_PROBE] == 1
    slowed = 1.6 * ON_THREADS
    assert slowed > SLOW_FACTOR * ON_THREADS and alone >= PROBE_MARGIN * slowed
    assert entry.threads_replay([(slowed, alone)] * (3 * SLOW_STREAK)) == [0] * (3 * SLOW_STREAK)
    loaded = 2.2 * ON_THREADS
    assert alone < PROBE_MARGIN * loaded
    modes = entry.threads_replay([(loaded, alone)] * (SLOW_STREAK + 1))
    assert modes == [0] * SLOW_STREAK + [1]


def test_a_probe_ends_at_its_first_counted_call_that_is_not_under_the_margin(entry):
    # alone a little slower: the first call (not counted: it may warm the caches) is not
    # hopeless, the second is counted and not under PROBE_MARGIN x the calls on threads
    alone = 1.2 * ON_THREADS
    assert alone <= HOPELESS_FIRST_ALONE * ON_THREADS and alone >= PROBE_MARGIN * ON_THREADS
    modes = entry.threads_replay([(ON_THREADS, alone)] * (FIRST_PROBE + 4))
    assert modes[FIRST_PROBE:] == [1, 1, 0, 0]
    assert entry.threads_stats()["switches"] == 0


def test_with_the_cores_taken_the_probe_runs_whole_switches_and_probes_back(entry):
    # alone twice as fast (other processes hold the cores): the probe's PROBE_CALLS calls
    # alone, then alone on; RECHECK calls later a probe back on threads, which loses at its
    # first counted call (the threads still slow) and ends there
    alone = 0.5 * ON_THREADS
    n = FIRST_PROBE + PROBE_CALLS + RECHECK + 3
    modes = entry.threads_replay([(ON_THREADS, alone)] * n)
    probe_end = FIRST_PROBE + PROBE_CALLS
    assert modes[FIRST_PROBE:probe_end] == [1] * PROBE_CALLS
    assert modes[probe_end:probe_end + RECHECK] == [1] * RECHECK
    assert modes[probe_end + RECHECK:] == [0, 0, 1]
    stats = entry.threads_stats()
    assert stats["switches"] == 1 and stats["probes"] == 2 and stats["alone_now"] == 1


def test_replay_refuses_what_is_not_pairs_of_seconds(entry):
    with pytest.raises(TypeError):
        entry.threads_replay([(ON_THREADS,)])
    with pytest.raises(TypeError):
        entry.threads_replay(3)
