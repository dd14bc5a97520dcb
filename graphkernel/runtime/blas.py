"""numpy's BLAS thread count, set around one product.

A plan's small MatMul steps run BLAS on one thread (`Step.blas_threads`, decided by the cost
model's `blas_parallel_min_mnk`): between the generated kernels of a call, BLAS's other threads
have gone to sleep (or are spinning on a core the next kernel wants), and waking them costs more
than they save on a small product. threadpoolctl finds the BLAS numpy loaded (OpenBLAS, MKL,
BLIS) and calls its own set-threads function; the count is put back after the product, so code
outside graphkernel sees BLAS as it was.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
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


def describe() -> list[str]:
    """One line per BLAS library numpy uses: its name, version, threads (for `doctor`)."""
    return [f"{lib.internal_api} {lib.version}: {lib.num_threads} thread(s), {lib.filepath}"
            for lib in _controllers()]


@dataclass(frozen=True)
class CBlas:
    """numpy's own OpenBLAS as C function addresses, for the compiled entry's MatMul steps
    (runtime/c_gemm.py): cblas_sgemm, cblas_dgemm, and its get/set-threads functions."""

    sgemm: int
    dgemm: int
    get_threads: int
    set_threads: int
    int64: bool  # an ILP64 build (numpy's scipy_openblas64_): BLAS integers are int64_t

    @property
    def addresses(self) -> tuple[int, int, int, int]:
        return self.sgemm, self.dgemm, self.get_threads, self.set_threads


def cblas() -> CBlas | None:
    """numpy's BLAS as C functions (found once), or None when it is not an OpenBLAS on its own
    pthreads (MKL, BLIS, an OpenMP build: the Python runner calls numpy there)."""
    if "cblas" in _state:
        return _state["cblas"]  # type: ignore[no-any-return]
    found = None
    for lib in _controllers():
        if lib.internal_api != "openblas" or getattr(lib, "threading_layer", "") != "pthreads":
            continue
        dynlib = lib.dynlib
        # numpy's wheels rename the symbols (scipy_ prefix, 64_ suffix for 64-bit integers)
        for prefix, suffix in itertools.product(("", "scipy_"), ("", "64_", "_64")):
            names = [f"{prefix}cblas_sgemm{suffix}", f"{prefix}cblas_dgemm{suffix}",
                     f"{prefix}openblas_get_num_threads{suffix}",
                     f"{prefix}openblas_set_num_threads{suffix}"]
            if all(hasattr(dynlib, n) for n in names):
                found = CBlas(*(ctypes.cast(getattr(dynlib, n), ctypes.c_void_p).value or 0
                                for n in names), int64=suffix != "")
                break
        if found is not None:
            break
    _state["cblas"] = found
    return found
