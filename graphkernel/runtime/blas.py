"""numpy's BLAS thread count, set around one product.

A plan's small MatMul steps run BLAS on one thread (`Step.blas_threads`, decided by
`PlanSettings.blas_parallel_min_mnk`, runtime/plan.py): between the generated kernels of a call,
BLAS's other threads have gone to sleep (or are spinning on a core the next kernel wants), and
waking them costs more than they save on a small product. numpy's wheel OpenBLAS is opened
where numpy loaded it (numpy.libs/, RTLD_NOLOAD: ~0.5 ms) and its own set-threads function
called; any other BLAS (MKL, BLIS, a distribution's OpenBLAS) is found by threadpoolctl (a
6-7 ms scan of every loaded library). The count is put back after the product, so code outside
graphkernel sees BLAS as it was.

`openblas` names numpy's OpenBLAS, whose functions a backend may call by address
(backends/c/cblas.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
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
    """Find numpy's BLAS before a plan's first product needs it: numpy's wheel OpenBLAS at once
    (`openblas`, ~0.5 ms); any other BLAS on a daemon thread, since threadpoolctl's scan of the
    loaded libraries takes 6-7 ms here, which the first call of a plan with products to pin
    would otherwise pay (a caller that needs them meanwhile waits on the lock)."""
    with _lock:
        if "openblas" in _state or "blas" in _state or "finding" in _state:
            return
    found = _numpys_wheel_openblas()
    with _lock:
        if found is not None:
            _state.setdefault("openblas", found)
            return
        _state["finding"] = True
    threading.Thread(target=_controllers, name="graphkernel-blas-lookup", daemon=True).start()


_GET_THREADS = ctypes.CFUNCTYPE(ctypes.c_int)
_SET_THREADS = ctypes.CFUNCTYPE(None, ctypes.c_int)


def _thread_functions(found: OpenBlas) -> tuple[Any, Any]:
    """numpy's OpenBLAS's get- and set-threads functions as callables (made once)."""
    functions = _state.get("threads")
    if functions is None:
        functions = _state["threads"] = (_GET_THREADS(found.get_threads),
                                         _SET_THREADS(found.set_threads))
    return functions


@contextlib.contextmanager
def blas_threads(count: int | None) -> Iterator[None]:
    """Run the body with BLAS on `count` threads (None: as it is)."""
    if count is None:
        yield
        return
    found = openblas()
    if found is not None:  # numpy's OpenBLAS by address: its own get/set functions
        get, put = _thread_functions(found)
        before = get()
        if before != count:
            put(count)
        try:
            yield
        finally:
            if before != count:
                put(before)
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
class OpenBlas:
    """numpy's own OpenBLAS, loaded in this process on its own pthreads: the library and how
    its build names its functions (a backend looks up the ones it calls: backends/c/cblas.py)."""

    dynlib: Any  # the ctypes.CDLL
    prefix: str  # numpy's wheels rename the symbols: a scipy_ prefix,
    suffix: str  # a 64_ suffix for 64-bit integers
    version: str | None  # as OpenBLAS reports it ("0.3.31"), None when unknown

    @property
    def int64(self) -> bool:
        """An ILP64 build (numpy's scipy_openblas64_): its integers are int64_t."""
        return self.suffix != ""

    def address(self, name: str) -> int:
        """The address of its function `name` (OpenBLAS's own spelling), 0 without it."""
        symbol = f"{self.prefix}{name}{self.suffix}"
        return _address(self.dynlib, symbol) if hasattr(self.dynlib, symbol) else 0

    @property
    def get_threads(self) -> int:
        return self.address("openblas_get_num_threads")

    @property
    def set_threads(self) -> int:
        return self.address("openblas_set_num_threads")


def _address(dynlib: Any, name: str) -> int:
    return ctypes.cast(getattr(dynlib, name), ctypes.c_void_p).value or 0


# numpy's wheels rename OpenBLAS's symbols: a scipy_ prefix, a 64_ suffix for 64-bit integers.
_NAMINGS = tuple(itertools.product(("", "scipy_"), ("", "64_", "_64")))


def _numpy_libs() -> str:
    """The folder numpy's wheel keeps its own libraries in (numpy.libs/, beside numpy/)."""
    import numpy

    return os.path.dirname(os.path.abspath(numpy.__file__)) + ".libs"


def _numpys(path: str | None) -> bool:
    """Whether a loaded library is the one numpy's wheel carries (numpy.libs/): scipy's wheel
    carries an OpenBLAS of its own, which threadpoolctl may list first once scipy is loaded."""
    return bool(path) and os.path.abspath(str(path)).startswith(_numpy_libs() + os.sep)


_PARALLEL_PTHREADS = 1  # openblas_get_parallel(): 0 sequential, 1 pthreads, 2 other threads


def _from_dynlib(dynlib: Any, version: str | None) -> OpenBlas | None:
    """One loaded OpenBLAS, or None when it lacks the functions graphkernel calls."""
    for prefix, suffix in _NAMINGS:
        names = [f"{prefix}cblas_sgemm{suffix}", f"{prefix}cblas_dgemm{suffix}",
                 f"{prefix}openblas_get_num_threads{suffix}",
                 f"{prefix}openblas_set_num_threads{suffix}"]
        if all(hasattr(dynlib, n) for n in names):
            return OpenBlas(dynlib, prefix, suffix, version)
    return None


def _numpys_wheel_openblas() -> OpenBlas | None:
    """numpy's wheel OpenBLAS (numpy.libs/), already loaded by numpy, opened without loading
    anything (RTLD_NOLOAD): no scan of every loaded library (threadpoolctl's takes 6-7 ms,
    which a warm compile would wait for). None when numpy has no such library, or it is not
    on pthreads."""
    for path in sorted(glob.glob(os.path.join(_numpy_libs(), "*openblas*.so*"))):
        try:
            dynlib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        except OSError:  # not loaded in this process
            continue
        for prefix, suffix in _NAMINGS:
            parallel = f"{prefix}openblas_get_parallel{suffix}"
            config = f"{prefix}openblas_get_config{suffix}"
            if hasattr(dynlib, parallel) and hasattr(dynlib, config):
                if getattr(dynlib, parallel)() != _PARALLEL_PTHREADS:
                    return None
                getattr(dynlib, config).restype = ctypes.c_char_p
                words = (getattr(dynlib, config)() or b"").decode(errors="replace").split()
                version = words[1] if len(words) > 1 and words[0] == "OpenBLAS" else None
                return _from_dynlib(dynlib, version)
    return None


def openblas() -> OpenBlas | None:
    """numpy's BLAS when it is an OpenBLAS on its own pthreads (found once; numpy's own
    wheel's before any other loaded), or None (MKL, BLIS, a build on other threads: the Python
    runner calls numpy there, and threadpoolctl sets its threads)."""
    if "openblas" in _state:
        return _state["openblas"]
    found = _numpys_wheel_openblas()
    if found is None:  # another build of numpy: ask threadpoolctl what is loaded
        for lib in sorted(_controllers(), key=lambda lib: not _numpys(lib.filepath)):
            if lib.internal_api == "openblas" and \
                    getattr(lib, "threading_layer", "") == "pthreads":
                found = _from_dynlib(lib.dynlib, lib.version)
                if found is not None:
                    break
    _state["openblas"] = found
    return found


def threads_now() -> int | None:
    """How many threads numpy's OpenBLAS runs a product on now, or None where it is not an
    OpenBLAS graphkernel calls by address (openblas())."""
    found = openblas()
    if found is None:
        return None
    return int(_thread_functions(found)[0]())
