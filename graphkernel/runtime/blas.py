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
import threading
from collections.abc import Iterator
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
