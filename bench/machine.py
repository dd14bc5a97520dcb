"""The machine: what it is, its copy bandwidth, and whether its two cores really run at once."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Any

import numpy as np

from bench.native import copy_variants, native_error

ENV_PREFIXES = ("OMP_", "OPENBLAS_", "MKL_", "GOMP_", "KMP_", "GRAPHKERNEL_", "XLA_", "JAX_",
                "TORCHINDUCTOR_", "MS_", "NUMEXPR_", "ORT_", "PYTHONHASHSEED")


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" where there is none)."""
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "transparent_hugepages": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
    }
    cpuinfo = _read("/proc/cpuinfo") or ""
    if cpuinfo:
        info["cpu_model"] = cpu_model()
    flags = next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines()
                  if ln.startswith("flags")), [])
    info["simd"] = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f") if f in flags]
    if shutil.which("lscpu"):
        try:
            out = subprocess.run(["lscpu", "-J"], capture_output=True, text=True, timeout=10)
            fields = {e["field"].rstrip(":"): e["data"] for e in json.loads(out.stdout)["lscpu"]}
            for key in ("Vendor ID", "Model name", "Hypervisor vendor", "L1d cache", "L2 cache",
                        "L3 cache", "Thread(s) per core", "Core(s) per socket"):
                if key in fields:
                    info.setdefault("lscpu", {})[key] = fields[key]
        except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
            pass
    meminfo = _read("/proc/meminfo") or ""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal"):
            info["mem_total_gib"] = round(int(line.split()[1]) / 2**20, 1)
    cc = os.environ.get("CC") or shutil.which("gcc")
    if cc:
        try:
            out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10)
            info["c_compiler"] = out.stdout.splitlines()[0] if out.stdout else cc
        except (OSError, subprocess.TimeoutExpired):
            pass
    return info


def l3_bytes() -> int:
    """The last-level cache size (for deciding how many input sets to rotate)."""
    for index in range(4, -1, -1):
        size = _read(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size")
        if size:
            unit = size[-1].upper()
            n = int(size[:-1]) if unit in "KMG" else int(size)
            return n * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(unit, 1)
    return 32 << 20


def environment() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def blas_info() -> list[dict[str, Any]] | str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    keep = ("user_api", "internal_api", "prefix", "version", "num_threads", "architecture",
            "threading_layer", "filepath")
    return [{k: v for k, v in entry.items() if k in keep} for entry in threadpool_info()]


# ---------------------------------------------------------------------------------------------
# Do the two cores run in parallel?

def _spin(barrier: Any, queue: Any, iterations: int) -> None:
    a = np.linspace(0.0, 1.0, 16384, dtype=np.float32)
    b = np.empty_like(a)
    barrier.wait()
    t0 = time.perf_counter()
    for _ in range(iterations):
        np.exp(a, out=b)
    queue.put(time.perf_counter() - t0)


def parallel_check(iterations: int = 8000) -> dict[str, Any]:
    """The same compute loop (cache-resident, no memory traffic) in one process, then in two at
    once. ratio ~1: the two cores run in parallel; ~2: they are time-shared."""
    ctx = mp.get_context("spawn")

    def run(k: int) -> list[float]:
        barrier, queue = ctx.Barrier(k), ctx.Queue()
        procs = [ctx.Process(target=_spin, args=(barrier, queue, iterations)) for _ in range(k)]
        for p in procs:
            p.start()
        times = [queue.get(timeout=120) for _ in procs]
        for p in procs:
            p.join()
        return times

    singles, pairs = [], []
    for _ in range(2):
        singles += run(1)
        pairs += run(2)
    one = float(np.median(singles))
    two = float(np.mean(pairs))
    return {"one_process_s": round(one, 4), "two_processes_s": [round(t, 4) for t in pairs],
            "ratio": round(two / one, 3),
            "verdict": "parallel" if two / one < 1.25 else
            ("partly time-shared" if two / one < 1.7 else "time-shared")}


# ---------------------------------------------------------------------------------------------
# Copy bandwidth

def copy_bandwidth(nbytes: int, reps: int = 7) -> dict[str, Any]:
    """Bytes read + written per second copying `nbytes` (float32), each variant, interleaved.
    Fresh allocation included as numpy's `copy()` (the page faults a fresh output pays)."""
    n = nbytes // 4
    src = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    dst = np.zeros_like(src)
    variants = dict(copy_variants())
    variants["numpy copy() into a fresh array"] = lambda d, s: s.copy()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():  # warm-up
        fn(dst, src)
    for r in range(reps):
        names = list(variants)
        names = names[r % len(names):] + names[:r % len(names)]
        for name in names:
            t0 = time.perf_counter()
            variants[name](dst, src)
            times[name].append(time.perf_counter() - t0)
    result: dict[str, Any] = {"bytes_copied": nbytes, "variants": {}}
    for name, ts in times.items():
        med = float(np.median(ts))
        result["variants"][name] = {"median_s": med, "gbps": 2 * nbytes / med / 1e9}
    best = max((v for k, v in result["variants"].items() if "fresh" not in k),
               key=lambda v: v["gbps"])
    best_name = next(k for k, v in result["variants"].items() if v is best)
    result["best"] = best_name
    result["gbps"] = best["gbps"]
    if native_error():
        result["note"] = native_error()
    del src, dst
    return result


# ---------------------------------------------------------------------------------------------
# FMA peak

def fma_peak() -> dict[str, Any]:
    """The machine's float32 FMA rate on one core, as `graphkernel doctor` measures it, times
    the cores every system here runs on (all of them); or why it is unknown."""
    from graphkernel.backends.c import toolchain
    from graphkernel.tools import machine_rates
    rate = machine_rates.fma_rate(toolchain.detect())
    if isinstance(rate, str):
        return {"error": rate}
    cores = os.cpu_count() or 1
    return {"gflops_core": rate.value, "cores": cores, "gflops": rate.value * cores,
            "how": rate.how}
