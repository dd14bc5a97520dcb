"""What calibration.py measures: the rates (`Calibration`, each range-checked by `check`
before the cost model sees it) and the small kernels and loops that measure them (`measure`:
copy bandwidth, the FMA rate at 256 and 512 bits, an OpenMP fork/join with the team asleep and
awake, the cache sizes from sysfs)."""
from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.backends.c.c_entry_threads import libomp_folder
from graphkernel.backends.c.c_loops import KernelSource
from graphkernel.errors import GraphKernelError


def size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


# The range each measured number must fall in to be used (a record's or a fresh measurement's).
RANGES: dict[str, tuple[float, float]] = {
    "copy_bytes_per_s": (1e8, 1e13),  # 0.1 GB/s .. 10 TB/s
    "fma_flops_256": (1e8, 1e13),
    "fma_flops_512": (1e8, 1e13),
    "fork_join_s": (1e-8, 1e-2),  # 10 ns .. 10 ms
    "fork_join_awake_s": (1e-8, 1e-2),
    "l1d_bytes": (1 << 10, 1 << 32),
    "l2_bytes": (1 << 10, 1 << 32),
    "llc_bytes": (1 << 10, 1 << 32),
}
_INTS = {"l1d_bytes", "l2_bytes", "llc_bytes"}
_OPTIONAL = {"fma_flops_512", "l1d_bytes", "l2_bytes", "llc_bytes", "fork_join_awake_s"}


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
    # the same region with the team spinning, as between the kernels of a call
    # (c_entry_threads.py); None where the OpenMP runtime cannot keep it so (GNU libgomp)
    fork_join_awake_s: float | None = None

    def describe(self) -> str:
        wide = "" if self.fma_flops_512 is None else \
            f", {self.fma_flops_512 / 1e9:.1f} at 512 bits"
        caches = ", ".join(f"{name} {size_text(b)}" for name, b in
                           (("L1d", self.l1d_bytes), ("L2", self.l2_bytes),
                            ("LLC", self.llc_bytes)) if b is not None) or "caches unknown"
        awake = "" if self.fork_join_awake_s is None else \
            f" ({self.fork_join_awake_s * 1e6:.1f} with the team awake)"
        return (f"copy {self.copy_bytes_per_s / 1e9:.1f} GB/s, FMA "
                f"{self.fma_flops_256 / 1e9:.1f} GFLOP/s at 256 bits{wide}, fork/join "
                f"{self.fork_join_s * 1e6:.1f} us{awake}, {caches}")


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


def fork_join_awake_seconds(functions: dict[str, Any]) -> float | None:
    """`fork_join_seconds` with LLVM libomp's team spinning between regions (a blocktime of
    1 ms, as c_entry_threads.py keeps it within a call); None under another runtime."""
    folder = libomp_folder()  # where the entry can keep a team awake at all
    if folder is None:
        return None
    try:  # the runtime the calibration kernels loaded
        libomp = ctypes.CDLL(os.path.join(folder, "libomp.so"), mode=os.RTLD_NOLOAD)
        get, put = libomp.kmp_get_blocktime, libomp.kmp_set_blocktime
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, []
    put.restype, put.argtypes = None, [ctypes.c_int]
    before = get()
    put(1)
    try:
        return fork_join_seconds(functions)
    finally:
        put(before)


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
                       fork_join_seconds(functions), **caches,
                       fork_join_awake_s=fork_join_awake_seconds(functions))


class CalibrationError(GraphKernelError):
    """The machine could not be calibrated (the defaults are CConfig's constants then)."""
