"""The C backend's untuned defaults from this machine's measured rates (issue 30, item 1).

`CConfig`'s thresholds decide when a kernel runs on threads, streams its stores, prefetches its
inputs and which vector width GCC prefers; of its block sizes, the column reduction's width
follows L1d (the others stay constants: no rate predicts them). As constants they were right
for the host they were chosen on; here they come from a small cost model (`derive`, a pure
function) over what this machine measures once (`measure`, bounded: 0.4-1.3 s with its compile
on a loaded 2-vCPU host):

- copy bandwidth (numpy copying an array past the last-level cache, read + write),
- the FMA rate of one core at 256 and at 512 bits (generated C, independent vector FMAs),
- the cost of one OpenMP fork/join (an empty parallel region; the median of many, since a
  kernel's region pays the typical wake-up on a loaded machine, not the luckiest),
- the cache sizes (sysfs).

The measurement is stored as a versioned JSON record in the kernel cache (`calibration/KEY.json`,
KEY = sha256 of the CPU model and the toolchain), checked when read like a tuning record
(backends/c/records.py): a record that is corrupt, of another version, CPU or toolchain, or
holds a number out of its plausible range is refused with its reason (a warning, and the
reason in `graphkernel doctor`) and measured again. Only range-checked numbers reach the cost
model, and only the cost model's clamped thresholds reach the generated C.

$GRAPHKERNEL_CALIBRATION=off (or 0, no, false) keeps CConfig's constants (the test suite runs
so: tests/conftest.py, for C that does not depend on the machine).
"""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import math
import os
import shutil
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.backends.c import cache, records, toolchain
from graphkernel.backends.c.c_loops import KernelSource
from graphkernel.backends.c.config import CConfig
from graphkernel.backends.c.conv_tile import (
    CONV_TILE,
    DEFAULT_VECTORS,
    VECTOR_REGISTERS,
    fit_pixels,
)
from graphkernel.errors import CacheError, GraphKernelError

RECORD_FORMAT = "graphkernel-calibration"
RECORD_VERSION = 1
FOLDER = "calibration"
ENV = "GRAPHKERNEL_CALIBRATION"
_OFF = ("off", "0", "no", "false")

# The cost model's constants.
# A loop goes on threads when splitting one thread's work over two saves PAYOFF times the
# fork/join: below that the measured noise of a loaded machine eats the gain.
PAYOFF = 2
THREADS = 2  # the least split that pays: what the threshold is about
BYTES_PER_ELEMENT = 8  # a bandwidth-bound element: a float32 read and one written
# 256-bit vectors are preferred only where 512-bit FMAs run measurably slower than 256-bit ones
# (below this share of their rate: a core that drops its clock for 512-bit work). Where both
# rates are equal (AMD's Zen 4 runs a 512-bit FMA as two 256-bit halves) 512-bit code still
# wins: half the instructions, and libmvec's 16-wide exp/tanh. On such an EPYC (2 vCPU),
# prefer-vector-width=256 made chain8 2.3x, bias+GeLU 1.4x and Softmax 1.4x slower in
# one-thread CPU time, alternating A/B in one run.
NARROW_BELOW = 0.9
# A convolution near the threshold runs at this share of the FMA peak: such convolutions are
# small (few channels, small images) and far from it. The digits CNN's three (batch 256, 8x8,
# 1-16-32 channels) ran at 21%, 30% and 62% of the 252 GFLOP/s measured on a Zen 5 EPYC; at
# the peak rate the model kept the first (2.4 M multiply-adds, 90 us on one thread) on one
# thread, and at two threads the call took 307 us against 249 with it on threads.
WINDOW_SHARE_OF_PEAK = 0.25
# Streaming stores above this share of the last-level cache: such an output does not stay in
# cache for the next kernel anyway, so its read-for-ownership is wasted.
STREAM_SHARE_OF_LLC = 0.5
# A column-reduction block's accumulators (a float per lane, and a double total per lane for a
# float sum) take this share of L1d per reduction: 512 lanes of 4 bytes on a 32 KiB L1d, so
# that a kernel's few reductions keep theirs in L1 beside the rows they read.
COLUMN_BLOCK_SHARE_OF_L1D = 1 / 16
# The block sizes no measured rate predicts keep their constants (c_loops.py), each for a
# reason: tuning (backends/c/tuning.py) measures them per kernel instead.
UNCALIBRATED_BLOCKS = {
    "prefetch_distance_bytes": "default, no rate predicts it: it is bandwidth x memory "
                               "latency, and the latency is not measured",
    "pointwise_chunk": "default, no rate predicts it: loop overhead against prefetch "
                       "granularity",
    "row_pipeline_rows": "default, no rate predicts it: rows per chunk whose loads overlap",
    "row_block": "default, it bounds a float sum's error: the same on every machine",
}

# What each derived threshold is clamped to: a wild but in-range measurement still leaves
# threads, streaming and prefetching within reach of real kernels.
CLAMPS = {"parallel_threshold": (1 << 10, 1 << 24),
          "stream_min_bytes": (1 << 20, 1 << 30),
          "prefetch_min_bytes": (64 << 10, 64 << 20),
          "window_parallel_min_macs": (1 << 14, 1 << 26),
          "column_block": (64, 4096)}

# The range each measured number must fall in to be used (a record's or a fresh measurement's).
RANGES: dict[str, tuple[float, float]] = {
    "copy_bytes_per_s": (1e8, 1e13),  # 0.1 GB/s .. 10 TB/s
    "fma_flops_256": (1e8, 1e13),
    "fma_flops_512": (1e8, 1e13),
    "fork_join_s": (1e-8, 1e-2),  # 10 ns .. 10 ms
    "l1d_bytes": (1 << 10, 1 << 32),
    "l2_bytes": (1 << 10, 1 << 32),
    "llc_bytes": (1 << 10, 1 << 32),
}
_INTS = {"l1d_bytes", "l2_bytes", "llc_bytes"}
_OPTIONAL = {"fma_flops_512", "l1d_bytes", "l2_bytes", "llc_bytes"}


@dataclass(frozen=True)
class Calibration:
    """What this machine measured (range-checked: `check`)."""

    copy_bytes_per_s: float  # read + write, past the caches
    fma_flops_256: float  # one core, 256-bit vectors, 2 flops per FMA lane
    fma_flops_512: float | None  # the same at 512 bits; None without AVX-512
    fork_join_s: float  # one empty OpenMP parallel region, median
    l1d_bytes: int | None  # per core; None when the OS does not say
    l2_bytes: int | None
    llc_bytes: int | None  # the last level's, shared

    def describe(self) -> str:
        wide = "" if self.fma_flops_512 is None else \
            f", {self.fma_flops_512 / 1e9:.1f} at 512 bits"
        caches = ", ".join(f"{name} {_size(b)}" for name, b in
                           (("L1d", self.l1d_bytes), ("L2", self.l2_bytes),
                            ("LLC", self.llc_bytes)) if b is not None) or "caches unknown"
        return (f"copy {self.copy_bytes_per_s / 1e9:.1f} GB/s, FMA "
                f"{self.fma_flops_256 / 1e9:.1f} GFLOP/s at 256 bits{wide}, fork/join "
                f"{self.fork_join_s * 1e6:.1f} us, {caches}")


def check(values: dict[str, Any]) -> str | None:
    """Why `values` (a record's "rates") are not a Calibration this graphkernel uses, or None."""
    names = [f.name for f in dataclasses.fields(Calibration)]
    if sorted(values) != sorted(names):
        return f"its rates are not exactly {', '.join(names)}"
    for name in names:
        value = values[name]
        if value is None and name in _OPTIONAL:
            continue
        kinds = (int,) if name in _INTS else (int, float)
        low, high = RANGES[name]
        if type(value) not in kinds or not (math.isfinite(value) and low <= value <= high):
            kind = "an int" if name in _INTS else "a number"
            return (f"{name} is {value!r:.40}; it is {kind} from {low:g} to {high:g}"
                    + (" or null" if name in _OPTIONAL else ""))
    return None


@dataclass(frozen=True)
class Defaults:
    """CConfig's defaults as resolved on this machine, and where each came from."""

    config: CConfig
    sources: dict[str, str]  # CConfig field -> "calibrated: ..." or "default, why"
    calibration: Calibration | None
    origin: str  # where the calibration came from, or why there is none

    def lines(self) -> list[str]:
        """One line per setting: its value and where it came from."""
        out = []
        for name, source in self.sources.items():
            value = getattr(self.config, name)
            shown = "the register file's rule" if value is None and name in CONV_TILE else \
                "never" if value is None and name != "vector_width" else \
                "the toolchain's" if value is None else \
                _size(value) if name.endswith("_bytes") else f"{value:,}"
            out.append(f"{name} = {shown} ({source})")
        return out


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def _power_of_two(x: float, name: str) -> int:
    """`x` rounded to the nearest power of two (measurement noise then rarely changes the
    generated C), clamped to CLAMPS[name]."""
    low, high = CLAMPS[name]
    return int(min(max(1 << max(0, round(math.log2(max(x, 1.0)))), low), high))


def derive(cal: Calibration) -> tuple[CConfig, dict[str, str]]:
    """CConfig's defaults from `cal` by the cost model, and where each came from in words.

    - parallel_threshold: elements of a bandwidth-bound loop (BYTES_PER_ELEMENT each) whose
      one-thread time t = n * 8 / copy_bw, split over THREADS, saves t (1 - 1/THREADS) >
      PAYOFF * fork/join.
    - window_parallel_min_macs: the same for a convolution's multiply-adds at
      WINDOW_SHARE_OF_PEAK of the best FMA rate (a MAC is 2 flops): at the peak itself the
      threshold kept small convolutions that pay on threads on one thread.
    - stream_min_bytes: STREAM_SHARE_OF_LLC of the last-level cache.
    - prefetch_min_bytes: the L2 size: a smaller input is in a core's cache already.
    - vector_width: 256 where 512-bit FMAs run below NARROW_BELOW of the 256-bit rate;
      otherwise the toolchain's (512 on AVX-512).
    - column_block: the lanes whose float accumulators take COLUMN_BLOCK_SHARE_OF_L1D of L1d.
    - the other block sizes keep their constants (UNCALIBRATED_BLOCKS says why).
    - conv_channel_vectors, conv_pixels: the register file's rule (conv_tile.py), left None.
    Thresholds are rounded to a power of two and clamped (CLAMPS)."""
    base = CConfig()
    fork = cal.fork_join_s
    gain = 1 - 1 / THREADS
    rates = f"copy {cal.copy_bytes_per_s / 1e9:.1f} GB/s, fork/join {fork * 1e6:.1f} us"
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    elements = PAYOFF * fork / gain * cal.copy_bytes_per_s / BYTES_PER_ELEMENT
    values["parallel_threshold"] = _power_of_two(elements, "parallel_threshold")
    sources["parallel_threshold"] = f"calibrated: {rates}"
    if cal.llc_bytes is not None:
        values["stream_min_bytes"] = _power_of_two(cal.llc_bytes * STREAM_SHARE_OF_LLC,
                                                   "stream_min_bytes")
        sources["stream_min_bytes"] = f"calibrated: last-level cache {_size(cal.llc_bytes)}"
    else:
        sources["stream_min_bytes"] = "default, the cache sizes are unknown"
    if cal.l2_bytes is not None:
        values["prefetch_min_bytes"] = _power_of_two(cal.l2_bytes, "prefetch_min_bytes")
        sources["prefetch_min_bytes"] = f"calibrated: L2 {_size(cal.l2_bytes)}"
    else:
        sources["prefetch_min_bytes"] = "default, the cache sizes are unknown"
    best_fma = max(cal.fma_flops_256, cal.fma_flops_512 or 0.0)
    macs = PAYOFF * fork / gain * best_fma * WINDOW_SHARE_OF_PEAK / 2
    values["window_parallel_min_macs"] = _power_of_two(macs, "window_parallel_min_macs")
    sources["window_parallel_min_macs"] = (f"calibrated: FMA {best_fma / 1e9:.1f} GFLOP/s "
                                           f"(a convolution at {WINDOW_SHARE_OF_PEAK:.0%} of "
                                           f"it), fork/join {fork * 1e6:.1f} us")
    if cal.fma_flops_512 is None:
        sources["vector_width"] = "default, no 512-bit FMA measured"
    else:
        ratio = cal.fma_flops_512 / cal.fma_flops_256
        narrow = ratio < NARROW_BELOW
        values["vector_width"] = 256 if narrow else None
        sources["vector_width"] = (f"calibrated: 512-bit FMA {ratio:.2f}x the 256-bit rate"
                                   + (f", under {NARROW_BELOW}x" if narrow else ""))
    if cal.l1d_bytes is not None:
        lanes = cal.l1d_bytes * COLUMN_BLOCK_SHARE_OF_L1D / 4
        values["column_block"] = _power_of_two(lanes, "column_block")
        sources["column_block"] = f"calibrated: L1d {_size(cal.l1d_bytes)}"
    else:
        sources["column_block"] = "default, the cache sizes are unknown"
    sources.update(UNCALIBRATED_BLOCKS)
    # A convolution's register tile: a rule on the register file (conv_tile.py), tuned per
    # kernel; nothing measured here changes it.
    for name in CONV_TILE:
        sources[name] = f"rule: {DEFAULT_VECTORS} channel vectors x {fit_pixels(DEFAULT_VECTORS)}" \
            f" pixels fit {VECTOR_REGISTERS} vector registers; tuned per convolution"
    config = dataclasses.replace(base, **values)
    ordered = {f.name: sources[f.name] for f in dataclasses.fields(CConfig)
               if f.name in sources}
    return config, ordered


def _constant_defaults(why: str) -> Defaults:
    config = CConfig()
    names = [f.name for f in dataclasses.fields(CConfig) if f.name != "plan"]
    return Defaults(config, {n: f"default, {why}" for n in names}, None, why)


# ---------------------------------------------------------------------------------------------
# Measuring

# Three kernels, each a unit of its own (the library may compile them apart): an empty parallel
# region (what a kernel on threads pays before its first element), and FMA loops at 256 and 512
# bits. CHAINS independent accumulators hide the FMA latency; each step is one FMA per lane (2
# flops). The FMA kernels take: steps (long), 16 floats in and out, the flops done (a double;
# 0 when the flags do not build that width).
_FORK_JOIN = r"""
void gk_cal_fork_join(void **args) {
  volatile int *sink = (volatile int *)args[0];
#pragma omp parallel
  { if (sink[0] < 0) sink[0] = 0; }
}
"""
# GCC's vector extension rather than <immintrin.h> (which adds 0.5 s to the compile); the
# kernels are built with -ffp-contract=off, so contraction is asked for per function (GCC's
# optimize attribute, clang's pragma) to make each step one fused multiply-add.
_FMA = r"""
#if GUARD
typedef float gk_vBITS __attribute__((vector_size(BITS / 8)));
__attribute__((optimize("fp-contract=fast")))
void gk_cal_fmaBITS(void **args) {
#ifdef __clang__
#pragma clang fp contract(fast)
#endif
  long steps = *(const long *)args[0];
  float *io = (float *)args[1];
  gk_vBITS acc[12], mul, add;
  for (int l = 0; l < LANES; ++l) { mul[l] = 0.999999f; add[l] = 1e-7f; }
  for (int c = 0; c < 12; ++c)
    for (int l = 0; l < LANES; ++l) acc[c][l] = io[c];
  for (long i = 0; i < steps; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < 12; ++c) acc[c] = acc[c] * mul + add;
  }
  for (int c = 0; c < 12; ++c) io[c] = acc[c][0] + acc[c][LANES - 1];
  *(double *)args[2] = 2.0 * LANES * 12 * (double)steps;
}
#else
void gk_cal_fmaBITS(void **args) { *(double *)args[2] = 0.0; }
#endif
"""


def fma_source(bits: int) -> str:
    """The C of `gk_cal_fma{bits}` (also what `graphkernel doctor` times)."""
    # 512-bit vectors only where the CPU has them (elsewhere GCC would split them in two)
    words = {"GUARD": "defined(__AVX512F__)" if bits == 512 else "1", "BITS": str(bits),
             "LANES": str(bits // 32)}
    text = _FMA
    for word, value in words.items():
        text = text.replace(word, value)
    return text


FMA_STEPS = 50_000  # about 0.1-0.3 ms a run on a current core


def _best(run: Callable[[], object], times: int, budget_s: float = 0.0) -> float:
    """The shortest of `times` runs of `run`, more while under `budget_s` seconds in all (at
    most 4 x `times`): on a loaded machine the best run is the closest to the hardware's."""
    best, start, count = float("inf"), time.perf_counter(), 0
    while count < times or (time.perf_counter() - start < budget_s and count < 4 * times):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
        count += 1
    return best


def _functions() -> dict[str, Any]:
    """The calibration kernels, built like any kernel (the same flags and OpenMP runtime)."""
    from graphkernel.backends.c.library import build_library
    kernels = [KernelSource("gk_cal_fork_join", _FORK_JOIN, [])]
    kernels += [KernelSource(f"gk_cal_fma{bits}", fma_source(bits), []) for bits in (256, 512)]
    return build_library(kernels).functions


def fma_rate(functions: dict[str, Any], bits: int) -> float | None:
    """Flops per second of one core at `bits`-bit vector FMAs (best of a few), or None when
    this machine's flags do not build them. `functions`: name -> a ctypes function taking
    one pointer (`gk_cal_fma256`, `gk_cal_fma512`)."""
    steps = ctypes.c_long(FMA_STEPS)
    io = np.ones(16, dtype=np.float32)
    flops = ctypes.c_double(0.0)
    argv = (ctypes.c_void_p * 3)(ctypes.addressof(steps), io.ctypes.data,
                                 ctypes.addressof(flops))
    kernel = functions[f"gk_cal_fma{bits}"]
    kernel(argv)
    if flops.value <= 0:
        return None
    return flops.value / _best(lambda: kernel(argv), 20)


def copy_rate(llc_bytes: int | None) -> float:
    """Bytes read plus written per second by a numpy copy between two arrays that together
    pass the last-level cache (32 MiB each, or the LLC's size, at most 256 MiB)."""
    nbytes = min(max(32 << 20, llc_bytes or 0), 256 << 20)
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # pages touched before timing
    return 2 * src.nbytes / _best(lambda: np.copyto(dst, src), 5, budget_s=0.2)


def fork_join_seconds(functions: dict[str, Any]) -> float:
    """The median time of an empty OpenMP parallel region, after a warm-up."""
    sink = np.zeros(1, np.int32)
    argv = (ctypes.c_void_p * 1)(sink.ctypes.data)
    fork = functions["gk_cal_fork_join"]
    for _ in range(20):
        fork(argv)
    times = []
    for _ in range(300):
        t = time.perf_counter()
        fork(argv)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int | None]:
    """L1 data, L2 and last-level cache sizes in bytes from sysfs (None where it does not
    say); values that do not parse are left out, not guessed."""
    found: dict[int, int] = {}
    l1d: int | None = None
    try:
        entries = sorted(e for e in os.listdir(root) if e.startswith("index"))
    except OSError:
        entries = []
    for entry in entries:
        def read(name: str, folder: str = os.path.join(root, entry)) -> str:
            with open(os.path.join(folder, name), encoding="ascii", errors="replace") as fh:
                return fh.read(64).strip()
        try:
            level, kind, size = int(read("level")), read("type"), read("size")
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not size[:-1].isdigit():
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1])
        if scale is None:
            continue
        nbytes = int(size[:-1]) * scale
        if level == 1:
            l1d = nbytes
        found[level] = max(found.get(level, 0), nbytes)
    llc = found[max(found)] if found and max(found) >= 2 else None
    return {"l1d_bytes": l1d, "l2_bytes": found.get(2), "llc_bytes": llc}


def measure() -> Calibration:
    """Measure this machine (bounded: one compiler run, or none when the calibration kernels
    are in the kernel cache already, and about half a second of timing)."""
    functions = _functions()
    caches = cache_sizes()
    fma256 = fma_rate(functions, 256)
    fma512 = fma_rate(functions, 512)
    if fma256 is None:  # built on every CPU: no work done is the kernel's fault
        raise CalibrationError("the calibration's 256-bit FMA kernel did no work")
    return Calibration(copy_rate(caches["llc_bytes"]), fma256, fma512,
                       fork_join_seconds(functions), **caches)


class CalibrationError(GraphKernelError):
    """The machine could not be calibrated (the defaults are CConfig's constants then)."""


# ---------------------------------------------------------------------------------------------
# The record

def toolchain_id() -> str:
    tc = toolchain.detect()
    if tc is None:
        return "no compiler"
    return f"{tc.compiler} {tc.version} {' '.join(tc.flags)} {tc.openmp_runtime}"


def record_key() -> str:
    text = "\0".join((toolchain.cpu_model(), toolchain_id()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def record_folder() -> str:
    return os.path.join(cache.open_folder(), FOLDER)


def record_path() -> str:
    return os.path.join(record_folder(), record_key() + ".json")


def read_record(path: str) -> tuple[Calibration | None, str | None]:
    """The calibration a stored record holds: (calibration, None); (None, None) when there is
    none; (None, why) when there is one this graphkernel does not use."""
    record, refused = records.read_record(path, RECORD_FORMAT, RECORD_VERSION, record_key(),
                                          toolchain.cpu_model(), "calibration record",
                                          "CPU or toolchain")
    if record is None:
        return None, refused
    rates = record.get("rates")
    if not isinstance(rates, dict):
        return None, "it holds no rates"
    problem = check(rates)
    if problem is not None:
        return None, problem
    return Calibration(**rates), None


def write_record(cal: Calibration, seconds: float) -> str:
    record = {"format": RECORD_FORMAT, "version": RECORD_VERSION, "key": record_key(),
              "cpu_model": toolchain.cpu_model(), "toolchain": toolchain_id(),
              "rates": dataclasses.asdict(cal), "measured_in_seconds": round(seconds, 3),
              "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return records.write_record(record_folder(), record_key(), record)


# ---------------------------------------------------------------------------------------------
# Resolving the defaults

_resolved: dict[tuple[str, str], Defaults] = {}


def calibration_off() -> str | None:
    """Why calibration is off ($GRAPHKERNEL_CALIBRATION), or None when it is on."""
    setting = os.environ.get(ENV, "").strip().lower()
    if setting in _OFF:
        return f"calibration off: ${ENV}={os.environ[ENV].strip()}"
    return None


def resolve() -> Defaults:
    """This machine's defaults: derived from its calibration record, from a measurement taken
    now (and stored) when there is none or the stored one is refused, or CConfig's constants
    when calibration is off or cannot run. Resolved once a process per record folder."""
    off = calibration_off()
    if off is not None:
        return _constant_defaults(off)
    if toolchain.detect() is None:
        return _constant_defaults("no C compiler to calibrate with")
    try:
        slot = (record_folder(), toolchain_id())
    except CacheError as err:  # compiling says so too; the defaults need no cache
        return _constant_defaults(f"the kernel cache is refused ({err.problem})")
    if slot not in _resolved:
        _resolved[slot] = _calibrated()
    return _resolved[slot]


def _calibrated() -> Defaults:
    path = record_path()
    cal, refused = read_record(path)
    if cal is not None:
        config, sources = derive(cal)
        return Defaults(config, sources, cal, f"record {path}")
    if refused is not None:
        warnings.warn(f"graphkernel: calibration record {path} not used: {refused}; measuring "
                      "this machine again", RuntimeWarning, stacklevel=3)
    start = time.perf_counter()
    try:
        cal = measure()
        problem = check(dataclasses.asdict(cal))
    except (GraphKernelError, OSError) as exc:
        problem = f"failed: {exc}"
    if problem is not None:  # an implausible measurement is not used either
        why = f"calibration {problem}"
        warnings.warn(f"graphkernel: {why}; CConfig's constants are the defaults",
                      RuntimeWarning, stacklevel=3)
        return _constant_defaults(why)
    assert cal is not None
    seconds = time.perf_counter() - start
    origin = f"measured now in {seconds:.2f} s" + \
        ("" if refused is None else f" (stored record refused: {refused})")
    try:
        origin += f", stored in {write_record(cal, seconds)}"
    except OSError as exc:
        origin += f", not stored: {exc.strerror}"
    config, sources = derive(cal)
    return Defaults(config, sources, cal, origin)


def seed(cache_folder: str) -> str | None:
    """Copy this machine's calibration record into another kernel cache folder (created
    private), so that a process using that folder reads it instead of measuring: a benchmark's
    cold compile is a cold kernel cache on a calibrated machine. Returns the copy's path, or
    None when calibration is off or has no record."""
    defaults = resolve()
    if defaults.calibration is None:
        return None
    path = record_path()
    if read_record(path) != (defaults.calibration, None):
        return None  # measured but not stored (a read-only cache)
    folder = os.path.join(cache.ensure_private_dir(cache_folder), FOLDER)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    target = os.path.join(folder, os.path.basename(path))
    shutil.copyfile(path, target)
    return target


def default_config() -> CConfig:
    """CConfig's defaults on this machine (`resolve`)."""
    return resolve().config
