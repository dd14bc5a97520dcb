"""Copy kernels for the machine's limit: numpy's copy, and when a C compiler is here, libc's
memcpy and a copy with non-temporal (streaming) stores, on one or two threads.

The copy is the floor a bandwidth-bound kernel cannot beat by much: it reads and writes each
byte once and computes nothing.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_SOURCE = r"""
#include <stddef.h>
#include <string.h>
#include <immintrin.h>

void bench_memcpy(float *dst, const float *src, size_t n, int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; t++) {
    size_t lo = n * t / threads, hi = n * (t + 1) / threads;
    memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
  }
}

void bench_stream(float *dst, const float *src, size_t n, int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; t++) {
    size_t lo = n * t / threads, hi = n * (t + 1) / threads, i = lo;
#ifdef __AVX__
    while (i < hi && ((size_t)(dst + i) & 31)) { dst[i] = src[i]; i++; }
    for (; i + 8 <= hi; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#else
    while (i < hi && ((size_t)(dst + i) & 15)) { dst[i] = src[i]; i++; }
    for (; i + 4 <= hi; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
#endif
    for (; i < hi; i++) dst[i] = src[i];
  }
  _mm_sfence();
}
"""

CopyFn = Callable[[np.ndarray, np.ndarray], None]
_lib: ctypes.CDLL | None = None
_lib_error: str | None = None
_pool: ThreadPoolExecutor | None = None


def _load() -> ctypes.CDLL | None:
    global _lib, _lib_error
    if _lib is not None or _lib_error is not None:
        return _lib
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        _lib_error = "no C compiler: only numpy copies measured"
        return None
    tmp = tempfile.mkdtemp(prefix="gk-bench-copy-")
    src, lib = os.path.join(tmp, "copy.c"), os.path.join(tmp, "libcopy.so")
    with open(src, "w") as fh:
        fh.write(_SOURCE)
    cmd = [cc, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", src, "-o", lib]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _lib_error = f"copy kernels did not compile: {exc}"
        return None
    if proc.returncode != 0:
        _lib_error = f"copy kernels did not compile: {proc.stderr.strip()[:300]}"
        return None
    handle = ctypes.CDLL(lib)
    for name in ("bench_memcpy", "bench_stream"):
        fn = getattr(handle, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        fn.restype = None
    _lib = handle
    return _lib


def native_error() -> str | None:
    _load()
    return _lib_error


def _numpy_threads(dst: np.ndarray, src: np.ndarray) -> None:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(1, thread_name_prefix="bench-copy")
    d, s = dst.reshape(-1), src.reshape(-1)
    half = d.size // 2
    fut = _pool.submit(np.copyto, d[:half], s[:half])
    np.copyto(d[half:], s[half:])
    fut.result()


def copy_variants() -> dict[str, CopyFn]:
    """name -> copy(dst, src) for float32 C-contiguous arrays of the same size."""
    variants: dict[str, CopyFn] = {
        "numpy copyto, 1 thread": lambda d, s: np.copyto(d, s),
        "numpy copyto, 2 threads": _numpy_threads,
    }
    lib = _load()
    if lib is not None:
        for name, label in (("bench_memcpy", "memcpy"), ("bench_stream", "streaming stores")):
            fn = getattr(lib, name)
            for threads in (1, 2):
                def call(d: np.ndarray, s: np.ndarray, fn: ctypes._CFuncPtr = fn,
                         threads: int = threads) -> None:
                    fn(d.ctypes.data, s.ctypes.data, d.size, threads)
                variants[f"C {label}, {threads} thread{'s' if threads > 1 else ''}"] = call
    return variants
