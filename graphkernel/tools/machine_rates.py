"""What this machine does per second, measured small and bounded for `graphkernel doctor`:
copy bandwidth (numpy, a 32 MiB array), FMA rate (the calibration's generated C kernels of
independent vector fused multiply-adds on one core, at 256 and 512 bits, when a compiler is
present) and GEMM rate (numpy's BLAS,
float32 512x512); and how BLAS and OpenMP threads are set, with advice. Each figure is the best
of a few short runs: on a loaded machine the best is closest to what the hardware can do."""
from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphkernel.backends.c import calibration
from graphkernel.backends.c.toolchain import Toolchain

# Each measurement stops after this many seconds of repeats (the three stay under 2 s with the
# FMA kernel's compile on a loaded 2-core machine).
BUDGET_S = 0.1


@dataclass(frozen=True)
class Rate:
    what: str
    value: float
    unit: str
    how: str

    def line(self) -> str:
        return f"{self.what:<9}: {self.value:,.1f} {self.unit} ({self.how})"


def _best_seconds(run: Callable[[], object], budget: float = BUDGET_S, least: int = 3) -> float:
    """The shortest of repeated runs of `run`: at least `least`, for about `budget` seconds."""
    best, start, count = float("inf"), time.perf_counter(), 0
    while count < least or time.perf_counter() - start < budget:
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
        count += 1
        if count >= 50:
            break
    return best


def copy_bandwidth() -> Rate:
    """Bytes read plus bytes written per second by a 32 MiB array copy (past the caches)."""
    src = np.ones(8 << 20, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # pages touched before timing
    seconds = _best_seconds(lambda: np.copyto(dst, src))
    return Rate("copy", 2 * src.nbytes / seconds / 1e9, "GB/s", "numpy copy of 32 MiB, read + "
                "write")


def gemm_rate() -> Rate:
    """numpy's float32 matrix product at 512x512x512, on the threads BLAS is set to use."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 512), dtype=np.float32)
    b = rng.standard_normal((512, 512), dtype=np.float32)
    out = np.empty((512, 512), dtype=np.float32)
    np.matmul(a, b, out=out)
    seconds = _best_seconds(lambda: np.matmul(a, b, out=out))
    return Rate("gemm", 2 * 512 ** 3 / seconds / 1e9, "GFLOP/s", "numpy float32 512^3, BLAS "
                "threads as set")


def fma_rate(tc: Toolchain | None) -> Rate | str:
    """Fused multiply-adds per second on one core from generated C (the calibration's kernels,
    backends/c/calibration.py, built in a temporary folder: the doctor leaves the kernel cache
    alone), at the widest vectors that run faster; or why not."""
    if tc is None:
        return "no C compiler: the FMA rate is measured by a generated kernel"
    rates: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="graphkernel-doctor-") as tmp:
        src, lib = os.path.join(tmp, "fma.c"), os.path.join(tmp, "fma.so")
        with open(src, "w", encoding="ascii") as fh:
            fh.write(calibration.fma_source(256) + calibration.fma_source(512))
        flags = [f for f in tc.flags if f != "-fopenmp"]
        try:
            done = subprocess.run([tc.compiler, *flags, src, "-o", lib], capture_output=True,
                                  text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the FMA kernel did not compile ({exc})"
        if done.returncode != 0:
            return f"the FMA kernel did not compile ({done.stderr.strip()[-300:]})"
        library = ctypes.CDLL(lib)
    functions = {}
    for bits in (256, 512):
        function = getattr(library, f"gk_cal_fma{bits}")
        function.argtypes, function.restype = [ctypes.c_void_p], None
        functions[f"gk_cal_fma{bits}"] = function
    for bits in (256, 512):
        rate = calibration.fma_rate(functions, bits)
        if rate is not None:
            rates[bits] = rate
    if not rates:
        return "this CPU's flags build no FMA instructions"
    bits = max(rates, key=lambda b: rates[b])
    other = "".join(f"; {b}-bit: {r / 1e9:,.1f}" for b, r in rates.items() if b != bits)
    return Rate("fma", rates[bits] / 1e9, "GFLOP/s",
                f"generated C, one core, {bits}-bit vectors, float32{other}")


# A multi-threaded BLAS whose idle workers spin takes the cores the kernels and other processes
# need: on a loaded 2-core machine bert_tiny.py swung 19-117 ms a call with OpenBLAS threads
# spinning, 7-9 ms with OPENBLAS_NUM_THREADS=1. The compiled entry's products run on OpenMP's
# threads, one BLAS thread each (backends/c/c_gemm.py), so OpenBLAS's pool serves numpy's own
# products and plans the Python runner runs: an unfused 2-layer BERT-base took 460 ms of CPU a
# call with its workers, 332 ms with OPENBLAS_NUM_THREADS=1 (docs/perf-notes.md "One thread pool").
# LLVM's libomp spins its idle threads for KMP_BLOCKTIME ms (0 under OMP_WAIT_POLICY=PASSIVE).
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY",
                "KMP_BLOCKTIME")


def thread_lines(blas_lines: list[str]) -> tuple[list[str], str]:
    """The thread settings as lines (environment, the BLAS libraries as threadpoolctl sees them:
    `blas_lines`, the cores and load), and one recommendation."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    env = ", ".join(f"{name}={os.environ.get(name, 'unset')}" for name in _THREAD_VARS)
    lines = [f"threads  : {env}",
             f"cores    : {cores} usable, load average {load:.1f} over the last minute"]
    lines += [f"blas     : {text}" for text in blas_lines] or \
        ["blas     : threadpoolctl not installed or no BLAS found: threads unknown"]
    blas_threads = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
    one_thread = blas_threads is not None and blas_threads.strip() == "1"
    busy = load >= cores or cores <= 2
    if busy and not one_thread:
        advice = (f"advice   : {'a loaded' if load >= cores else 'a small'} machine "
                  f"({cores} cores, load {load:.1f}): set OPENBLAS_NUM_THREADS=1 (and "
                  "OMP_WAIT_POLICY=PASSIVE, graphkernel's default). Compiled graphs run their "
                  "products on graphkernel's OpenMP threads either way; this keeps numpy's own "
                  "products and unfused plans from leaving OpenBLAS workers spinning (an "
                  "unfused 2-layer BERT-base: 460 -> 332 ms of CPU a call)")
    elif os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "ACTIVE" or \
            os.environ.get("KMP_BLOCKTIME", "0").strip() not in ("", "0"):
        advice = ("advice   : OMP_WAIT_POLICY=ACTIVE or a KMP_BLOCKTIME above 0 makes idle "
                  "OpenMP threads spin between kernels: unset them (graphkernel waits "
                  "passively) unless this machine runs nothing else")
    else:
        advice = "advice   : thread settings suit this machine (BLAS threads as set)"
    return lines, advice
