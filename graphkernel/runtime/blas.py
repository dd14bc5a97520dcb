"""numpy's BLAS thread count, set around one product.

A plan's small MatMul steps run BLAS on one thread (`Step.blas_threads`, decided by the cost
model's `blas_parallel_min_mnk`): between the generated kernels of a call, BLAS's other threads
have gone to sleep (or are spinning on a core the next kernel wants), and waking them costs more
than they save on a small product. threadpoolctl finds the BLAS numpy loaded (OpenBLAS, MKL,
BLIS) and calls its own set-threads function; the count is put back after the product, so code
outside graphkernel sees BLAS as it was.

`cblas` hands numpy's OpenBLAS to the compiled entry as C function addresses, with its threads
callback where it has one (runtime/c_gemm.py PRELUDE: a product's jobs on the library's OpenMP
threads, set around that product only).
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_lock = threading.Lock()
_state: dict[str, Any] = {}


def _controllers() -> list[Any]:
    """The BLAS libraries loaded in this process (found once, after numpy loaded its own)."""
    found = _state.get("blas")
    if found is not None:  # every small product asks: no lock once found
        return found
    with _lock:
        if "blas" not in _state:
            from threadpoolctl import ThreadpoolController

            _state["blas"] = list(ThreadpoolController().select(user_api="blas").lib_controllers)
        return _state["blas"]


def find_in_background() -> None:
    """Look the BLAS libraries up on a daemon thread: threadpoolctl's scan of the loaded
    libraries takes 6-7 ms here, which the first call of a plan with products to pin would
    otherwise pay; started while the plan compiles (a caller that needs them meanwhile waits
    on the lock)."""
    with _lock:
        if "blas" in _state or "finding" in _state:
            return
        _state["finding"] = True
    threading.Thread(target=_controllers, name="graphkernel-blas-lookup", daemon=True).start()


@contextlib.contextmanager
def blas_threads(count: int | None) -> Iterator[None]:
    """Run the body with BLAS on `count` threads (None: as it is)."""
    if count is None:
        yield
        return
    changed = []
    for lib in _controllers():
        before = lib.num_threads
        if before != count:
            lib.set_num_threads(count)
            changed.append((lib, before))
    try:
        yield
    finally:
        for lib, before in changed:
            lib.set_num_threads(before)


_SET_JOBS = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@contextlib.contextmanager
def blas_jobs(callback: int) -> Iterator[None]:
    """Run the body with numpy's OpenBLAS handing its jobs to `callback` (a library's
    gk_blas_jobs, runtime/c_gemm.py), the previous callback put back after it; as it is when
    `callback` is 0 or this OpenBLAS has no threads callback."""
    found = cblas() if callback else None
    if found is None or not found.set_jobs:
        yield
        return
    setter = _state.get("set_jobs")
    if setter is None:
        setter = _state["set_jobs"] = _SET_JOBS(found.set_jobs)
    before = ctypes.c_void_p.from_address(found.jobs_now).value
    setter(callback)
    try:
        yield
    finally:
        setter(before)


def describe() -> list[str]:
    """One line per BLAS library numpy uses: its name, version, threads (for `doctor`)."""
    lines = [f"{lib.internal_api} {lib.version}: {lib.num_threads} thread(s), {lib.filepath}"
             for lib in _controllers()]
    found = cblas()
    if found is not None:
        lines.append("compiled entries run its multi-threaded products' jobs on their own "
                     "OpenMP threads (threads callback)" if found.set_jobs else
                     "compiled entries run its products on its own threads (no threads "
                     f"callback before OpenBLAS {'.'.join(map(str, CALLBACK_SINCE))})")
    return lines


@dataclass(frozen=True)
class CBlas:
    """numpy's own OpenBLAS as C function addresses, for the compiled entry's MatMul steps
    (runtime/c_gemm.py): cblas_sgemm, cblas_dgemm, its get/set-threads functions, and its
    threads-callback setter with the variable it sets (0 and 0 when this OpenBLAS has none)."""

    sgemm: int
    dgemm: int
    get_threads: int
    set_threads: int
    int64: bool  # an ILP64 build (numpy's scipy_openblas64_): BLAS integers are int64_t
    set_jobs: int = 0  # openblas_set_threads_callback_function
    jobs_now: int = 0  # &openblas_threads_callback_

    @property
    def addresses(self) -> tuple[int, int, int, int, int, int]:
        return (self.sgemm, self.dgemm, self.get_threads, self.set_threads, self.set_jobs,
                self.jobs_now)


# The threads callback (OpenBLAS PR 4577) with the six-argument job signature c_gemm.py's
# gk_blas_jobs implements: from 0.3.27, under this name.
CALLBACK_SINCE = (0, 3, 27)


def _version(text: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (text or "").split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _address(dynlib: Any, name: str) -> int:
    return ctypes.cast(getattr(dynlib, name), ctypes.c_void_p).value or 0


def _callback(dynlib: Any, version: str | None, prefix: str, suffix: str) -> tuple[int, int]:
    """(setter, variable) addresses of OpenBLAS's threads callback, or (0, 0)."""
    if _version(version) < CALLBACK_SINCE:
        return 0, 0
    setter = f"{prefix}openblas_set_threads_callback_function{suffix}"
    if not hasattr(dynlib, setter):
        return 0, 0
    for variable in (f"{prefix}openblas_threads_callback_{suffix}", "openblas_threads_callback_"):
        try:
            held = ctypes.c_void_p.in_dll(dynlib, variable)
        except ValueError:
            continue
        return _address(dynlib, setter), ctypes.addressof(held)
    return 0, 0


def _numpys(path: str | None) -> bool:
    """Whether a loaded library is the one numpy's wheel carries (numpy.libs/): scipy's wheel
    carries an OpenBLAS of its own, which threadpoolctl may list first once scipy is loaded."""
    import numpy

    folder = os.path.dirname(os.path.abspath(numpy.__file__)) + ".libs"
    return bool(path) and os.path.abspath(str(path)).startswith(folder + os.sep)


def cblas() -> CBlas | None:
    """numpy's BLAS as C functions (found once; numpy's own wheel's OpenBLAS before any other
    loaded), or None when it is not an OpenBLAS on its own pthreads (MKL, BLIS, an OpenMP
    build: the Python runner calls numpy there)."""
    if "cblas" in _state:
        return _state["cblas"]  # type: ignore[no-any-return]
    found = None
    for lib in sorted(_controllers(), key=lambda lib: not _numpys(lib.filepath)):
        if lib.internal_api != "openblas" or getattr(lib, "threading_layer", "") != "pthreads":
            continue
        dynlib = lib.dynlib
        # numpy's wheels rename the symbols (scipy_ prefix, 64_ suffix for 64-bit integers)
        for prefix, suffix in itertools.product(("", "scipy_"), ("", "64_", "_64")):
            names = [f"{prefix}cblas_sgemm{suffix}", f"{prefix}cblas_dgemm{suffix}",
                     f"{prefix}openblas_get_num_threads{suffix}",
                     f"{prefix}openblas_set_num_threads{suffix}"]
            if all(hasattr(dynlib, n) for n in names):
                set_jobs, jobs_now = _callback(dynlib, lib.version, prefix, suffix)
                found = CBlas(*(_address(dynlib, n) for n in names), int64=suffix != "",
                              set_jobs=set_jobs, jobs_now=jobs_now)
                break
        if found is not None:
            break
    _state["cblas"] = found
    return found
