"""The tuner's last word: the whole call with the kernels it tuned, against the same plan with
those kernels' defaults, each a built library run through its compiled entry as a user's call
runs it (backends/c/tuning.py chose each kernel's winner by the kernel's own clock).

A kernel's time inside a call is not all that its choice changes. MobileNetV2 at batch 8 on the
Zen 5 host: tuning runs chose register tiles for its 24-channel convolutions (1.3-1.6x each by
their own clocks) and one thread for several depthwise ones (1.1-1.3x), and the executables
built from those choices ran 0.82x to 1.05x the untuned call's speed from one tuning run to the
next; the whole calls timed through the Python runner's steps had said 1.04x for one of the
slow ones. So the tuned library is kept only where its calls beat the defaults' (MARGIN);
otherwise the defaults' library runs and the tuned kernels' records are rewritten to their
defaults (a later compile reads them and does not tune to the same loss), the reason in each
kernel's note."""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphkernel.backends.c.c_loops import KernelSource
from graphkernel.backends.c.config import CConfig
from graphkernel.backends.c.library import BuiltLibrary, build_library
from graphkernel.backends.c.tuning import (
    Choice,
    Knobs,
    progress_bar,
    random_arrays,
    write_record,
)
from graphkernel.runtime.plan import ExecutionPlan, KernelSpec
from graphkernel.runtime.runner import Runner

PASSES = 5  # whole-call timings of each library, alternating
# Kept when faster in all passes but at most one and by this share of the median call: a
# loaded machine's one slow pass is not a loss, its noise not a gain.
MARGIN = 0.01
# The knobs that say which threads run a kernel: their effect reaches the kernels after it.
THREAD_KNOBS = ("parallel_threshold", "window_parallel_min_macs")
CALLS = 3  # calls per timing


def confirm_tuned(plan: ExecutionPlan, config: CConfig, specs: Sequence[KernelSpec],
                  choices: dict[str, Choice], kernels: list[KernelSource],
                  library: BuiltLibrary, emit: Callable[[KernelSpec, CConfig], KernelSource],
                  entry_source: Callable[[str], str] | None, progress: bool = True
                  ) -> tuple[BuiltLibrary, dict[str, Choice], list[KernelSource]]:
    """The library, choices and kernels to run: those tuned in this compile where whole calls
    with them are faster; else with the tuned kernels that choose threads at their defaults
    (a thread choice reaches the kernels after it) where that is faster; else the same plan
    with every tuned kernel at its defaults. `progress`: a progress bar on a terminal, as the
    tuning's own (tuning.progress_bar)."""
    default = Knobs.of(config)
    tuned = {s.name for s in specs if s.name in choices and choices[s.name].knobs != default
             and choices[s.name].how.startswith("tuned here")}
    if not tuned or library.entry is None:
        return library, choices, kernels
    calm = {n for n in tuned if all(getattr(choices[n].knobs, k) == getattr(default, k)
                                    for k in THREAD_KNOBS)}
    second = bool(calm) and calm != tuned
    # Shown as the tuning is (TIME_BUDGET_S does not bound it: at most 2 builds and 2 races):
    # each library build and each pass of a race a step.
    steps = 1 + PASSES + (1 + PASSES if second else 0)
    with progress_bar(steps, f"tuning {plan.name}: whole calls, tuned against defaults",
                      progress) as advance:
        plain = [emit(spec, config) if spec.name in tuned else k
                 for spec, k in zip(specs, kernels)]
        plain_library = build_library(plain, entry_source)
        advance()
        trials: list[tuple[set[str], list[KernelSource], BuiltLibrary | None]] = \
            [(tuned, kernels, library)]
        if second:
            trials.append((calm, [k if s.name not in tuned or s.name in calm else p
                                  for s, k, p in zip(specs, kernels, plain)], None))
        shown = []
        for names, candidate, ready in trials:
            built = ready or build_library(candidate, entry_source)
            if ready is None:
                advance()
            speed = whole_call_speed(plan, built, plain_library, advance)
            shown.append(("every tuned kernel" if names is tuned else
                          "the tuned kernels but those choosing threads") + ": " +
                         ("not timed (no compiled entry)" if speed is None else speed[1]))
            if speed is not None and speed[0]:
                return built, _noted(choices, tuned, names, default, "; ".join(shown)), \
                    candidate
    return plain_library, _noted(choices, tuned, set(), default, "; ".join(shown)), plain


def _noted(choices: dict[str, Choice], tuned: set[str], kept: set[str], default: Knobs,
           shown: str) -> dict[str, Choice]:
    """`choices` with the whole calls' verdict in each tuned kernel's note; those not `kept`
    back at their defaults, their records rewritten so."""
    out = dict(choices)
    for name in tuned:
        choice = choices[name]
        if name in kept:
            out[name] = dataclasses.replace(choice, how=f"{choice.how}; kept, {shown}")
            continue
        if choice.record_key is not None:
            write_record(choice.record_key, default, {}, default)
        out[name] = Choice(default, f"defaults ({choice.how.removeprefix('tuned here: ')} "
                           f"not kept, {shown})", record_key=choice.record_key)
    return out


def whole_call_speed(plan: ExecutionPlan, tuned: BuiltLibrary, plain: BuiltLibrary,
                     advance: Callable[[], None] = lambda: None) -> tuple[bool, str] | None:
    """(whether `tuned`'s calls beat `plain`'s (MARGIN), how they compared) for the
    same random inputs through each library's compiled entry; None without entries.
    `advance` is called after each pass."""
    arrays, weights = random_arrays(plan, np.random.default_rng(0))
    calls: dict[str, Callable[[], Any]] = {}
    for name, library in (("tuned", tuned), ("plain", plain)):
        runner = Runner(plan, prefault=False)
        runner.load(library)  # its entry, which keeps its threads awake itself (c_entry_threads)
        # Workspaces (repacked weights) kept between calls, as a user's unchanged weights are.
        runner.bind_versions([np.ones(1, np.int64) for _ in plan.weights])
        if runner.entry is None:
            return None
        calls[name] = _call(runner, arrays, weights)
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for p in range(PASSES):
        for name in (list(calls) if p % 2 == 0 else list(calls)[::-1]):
            call = calls[name]
            call()
            start = time.perf_counter()
            for _ in range(CALLS):
                call()
            seconds[name].append(time.perf_counter() - start)
        advance()
    wins = sum(a < b for a, b in zip(seconds["tuned"], seconds["plain"]))
    t, u = statistics.median(seconds["tuned"]), statistics.median(seconds["plain"])
    faster = wins >= PASSES - 1 and t > 0 and u / t >= 1 + MARGIN
    speed = f"{u / t:.2f}x" if t > 0 and u > 0 else "-"
    return faster, f"whole calls {speed} the defaults' speed, faster in {wins} of {PASSES} passes"


def _call(runner: Runner, arrays: list[np.ndarray], weights: list[np.ndarray]
          ) -> Callable[[], Any]:
    entry, constants = runner.entry, runner.entry_constants
    assert entry is not None
    return lambda: entry(*arrays, *weights, *constants)
