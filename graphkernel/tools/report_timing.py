"""Timing for the report: the whole call (median and interquartile range), one call split into
its kernels so that the parts add up to the call, and what a speedup at this size measures.

Nothing here asserts a time; the numbers are measured when a report is made, side by side.
"""
from __future__ import annotations

import html
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphkernel.frontend.compiled import CompiledCell as Executable
from graphkernel.ir.types import TensorType, concrete, symbols_of

# A call is dispatch-bound when its data could move in under this share of its time and it is
# no longer than DISPATCH_PER_LAUNCH per kernel launch (a Python step costs a few microseconds
# here, the compiled entry about one for the whole call): a slow call that is long for its data
# but also long per launch is doing arithmetic, not dispatching.
DISPATCH_BOUND_SHARE = 0.2
DISPATCH_PER_LAUNCH = 20e-6
_BANDWIDTH: list[float] = []  # measured once per process


@dataclass
class Spread:
    """Seconds per call: the median and the interquartile range of the samples."""

    median: float
    q1: float
    q3: float
    samples: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        if len(samples) < 2:
            return cls(samples[0], samples[0], samples[0], len(samples))
        q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
        return cls(median, q1, q3, len(samples))


@dataclass
class Breakdown:
    """One call run step by step, split into its kernels: the compiled entry's own call with
    each step timed in C (`in_entry`, Runner.profile), else each kernel dispatched from Python.

    Every number is a mean over the same calls: the middle half by call time (between its first
    and third quartile, so a stray slow call does not count), hence the kernels plus `between`
    (dispatch, input checks and timing around the kernels) add up to `call`, and no kernel can
    exceed the call it was measured in.

    `fastest`: each kernel's shortest time over all the calls, what its rates (GB/s, GFLOP/s,
    share of the roof) are computed from. The roofline's ceilings are best-of measurements, and
    on a shared machine a wall-clock time is the kernel's own plus whatever the scheduler adds:
    a thread of an OpenMP team taken off its core stalls the whole kernel at the team's
    barrier, which on a loaded 2-vCPU host made a 1 ms kernel's mean 5-15 ms. Interruptions
    only ever add time, so the fastest of many is the kernel's rate."""

    call: float
    per_kernel: list[float]
    between: float
    calls: int
    fastest: list[float]
    in_entry: bool = False


@dataclass
class Timing:
    """`whole`: the call as `run_arrays` runs it (through the graph's compiled entry when it has
    one); `breakdown`: the same kernels timed inside step-by-step calls."""

    whole: Spread
    breakdown: Breakdown
    through_entry: bool

    @property
    def per_call(self) -> float:
        return self.whole.median

    @property
    def per_kernel(self) -> list[float]:
        return self.breakdown.per_kernel

    @property
    def fastest_per_kernel(self) -> list[float]:
        return self.breakdown.fastest


DYNAMIC_SIZE = 128


def random_inputs(exe: Executable, rng: np.random.Generator) -> list[np.ndarray]:
    """Random arrays of the shapes and dtypes the executable was compiled for (a dynamic size,
    `float32[N,64]`, is timed at DYNAMIC_SIZE)."""
    arrays = []
    for inp in exe.graph.inputs:
        if inp.kind != "input":
            continue
        t = inp.tensor_type
        if not t.is_static:
            sizes = dict.fromkeys(symbols_of(t.shape), DYNAMIC_SIZE)
            t = TensorType(concrete(t.shape, sizes), t.dtype)
        if t.dtype == np.bool_:
            arrays.append(rng.random(t.shape) < 0.5)
        elif np.issubdtype(t.dtype, np.integer):
            arrays.append(rng.integers(-8, 9, size=t.shape).astype(t.dtype))
        else:
            arrays.append(rng.standard_normal(t.shape).astype(t.dtype))
    return arrays


def measure(exe: Executable, inputs: Sequence[np.ndarray], repeats: int = 50,
            budget_s: float = 0.5) -> Timing:
    """Time `exe` on `inputs`: `repeats` samples of the whole call, after a few warm-up calls,
    then up to `budget_s` seconds of step-by-step calls for the per-kernel split.

    A call takes microseconds, so each whole-call sample times a batch of calls (doubled until
    the batch lasts 0.2 ms) and divides: clock resolution and one-off hiccups barely move the
    median.
    """
    for _ in range(3):  # first calls page in the kernel library and numpy's code paths
        exe.run_arrays(*inputs)
    batch = 1
    while True:
        start = time.perf_counter()
        for _ in range(batch):
            exe.run_arrays(*inputs)
        if time.perf_counter() - start >= 2e-4 or batch >= 1 << 14:
            break
        batch *= 2
    samples = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        for _ in range(batch):
            exe.run_arrays(*inputs)
        samples.append((time.perf_counter() - start) / batch)
    return Timing(Spread.of(samples), breakdown(exe, inputs, max(5, repeats * 4), budget_s),
                  getattr(exe, "entry", None) is not None)


def breakdown(exe: Executable, inputs: Sequence[np.ndarray], calls: int,
              budget_s: float) -> Breakdown:
    """Per-kernel times measured inside whole step-by-step calls (see Breakdown)."""
    exe.profile_kernels(*inputs, repeats=1)  # warm the step-by-step path
    rows: list[tuple[float, list[float]]] = []
    deadline = time.perf_counter() + budget_s
    runner = exe.executable.runner
    while len(rows) < calls and (len(rows) < 5 or time.perf_counter() < deadline):
        start = time.perf_counter()
        kernels = exe.profile_kernels(*inputs, repeats=1)
        elapsed = time.perf_counter() - start
        # through the entry, the call is the entry's own (the profile's Python around it is
        # not part of any call)
        rows.append((runner.profiled_call_s if runner.profiled_in_entry else elapsed, kernels))
    spread = Spread.of([call for call, _ in rows])
    middle = [row for row in rows if spread.q1 <= row[0] <= spread.q3] or rows
    count = len(middle)
    per_kernel = [sum(ks[i] for _, ks in middle) / count for i in range(len(exe.kernels))]
    call = sum(c for c, _ in middle) / count
    fastest = [min(ks[i] for _, ks in rows) for i in range(len(exe.kernels))]
    return Breakdown(call, per_kernel, call - sum(per_kernel), count, fastest,
                     runner.profiled_in_entry)


def copy_bandwidth() -> float:
    """Bytes per second (read plus written) numpy copies on this machine: the best of a few
    16 MiB copies, measured once per process."""
    if not _BANDWIDTH:
        src = np.ones(4 << 20, np.float32)
        dst = np.empty_like(src)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - start)
        _BANDWIDTH.append(2 * src.nbytes / best)
    return _BANDWIDTH[0]


def speedup_range(fused: Spread, base: Spread) -> tuple[float, float, float]:
    """(median ratio, low, high): base over fused, the range from their interquartile ranges."""
    return base.median / fused.median, base.q1 / fused.q3, base.q3 / fused.q1


def dispatch_bound(bytes_moved: int, seconds: float, launches: int) -> tuple[bool, float]:
    """Whether a call of `seconds` launching `launches` kernels that move `bytes_moved` is mostly
    overhead (see DISPATCH_BOUND_SHARE), and the time its data takes at the copy bandwidth."""
    data_seconds = bytes_moved / copy_bandwidth()
    bound = data_seconds < DISPATCH_BOUND_SHARE * seconds and \
        seconds < DISPATCH_PER_LAUNCH * max(1, launches)
    return bound, data_seconds


# Consecutive stages shorter than this share of the compile are shown as one row.
TIMELINE_MIN_SHARE = 0.02


def compile_timeline(exe: Executable) -> list[tuple[str, float]]:
    """Where `exe`'s compile time went, in order: the compile's own phases (trace, compile
    cache, each pipeline stage, planning and C emission, the C compiler or the kernel cache,
    loading), runs of stages too short to see merged into one row, and what the phases do
    not cover (bookkeeping between them) last. The rows add up to `compile_seconds`."""
    total = exe.compile_seconds
    rows: list[tuple[str, float]] = []
    short: list[tuple[str, float]] = []

    def flush() -> None:
        if len(short) == 1:
            rows.append(short[0])
        elif short:
            rows.append((f"{len(short)} stages ({short[0][0].removeprefix('stage ')} .. "
                         f"{short[-1][0].removeprefix('stage ')})", sum(s for _, s in short)))
        short.clear()

    for name, seconds in exe.report.timeline:
        if name.startswith("stage ") and seconds < TIMELINE_MIN_SHARE * total:
            short.append((name, seconds))
            continue
        flush()
        rows.append((name, seconds))
    flush()
    rest = total - sum(s for _, s in rows)
    if rest > 0:
        rows.append(("other (checks, reports, between the phases)", rest))
    return rows


def compile_timeline_html(exe: Executable) -> str:
    """The compile timeline as a table: each phase's milliseconds and share, with a bar."""
    total = exe.compile_seconds
    if not exe.report.timeline or total <= 0:
        return ""
    body = []
    for name, seconds in compile_timeline(exe):
        share = seconds / total
        body.append(f"<tr><td>{html.escape(name)}</td><td class=\"num\">{seconds * 1e3:,.1f}</td>"
                    f"<td class=\"num\">{share:.0%}</td><td><span style=\"display:inline-block;"
                    f"background:#4a78b5;height:0.8em;width:{share * 20:.2f}em\"></span></td></tr>")
    return ("<h3>Where the compile time went</h3>"
            f"<p class=\"muted small\">{total * 1e3:,.0f}&nbsp;ms from the call to compile to a "
            f"runnable graph; kernel cache: {html.escape(exe.report.compile_cache or 'n/a')}"
            "</p><table class=\"timeline\"><tr><th>phase</th><th>ms</th><th>share</th><th></th>"
            "</tr>" + "".join(body) + "</table>")
