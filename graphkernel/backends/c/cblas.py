"""numpy's OpenBLAS (runtime/blas.py `openblas`) as the C function addresses the compiled entry's
MatMul steps call (c_gemm.py), and handing them (with MKL's, where products were chosen for it:
blas_choice.py) to a loaded entry module."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphkernel.backends.c.blas_choice import mkl
from graphkernel.runtime.blas import openblas


@dataclass(frozen=True)
class CBlas:
    """numpy's own OpenBLAS as C function addresses: cblas_sgemm, cblas_dgemm and its
    get/set-threads functions."""

    sgemm: int
    dgemm: int
    get_threads: int
    set_threads: int
    int64: bool  # an ILP64 build (numpy's scipy_openblas64_): BLAS integers are int64_t

    @property
    def addresses(self) -> tuple[int, int, int, int]:
        """What the entry module's `set_blas` takes, in its order."""
        return (self.sgemm, self.dgemm, self.get_threads, self.set_threads)


def cblas() -> CBlas | None:
    """numpy's BLAS as C functions, or None when it is not an OpenBLAS on its own pthreads
    (MKL, BLIS, a build on other threads: the Python runner calls numpy there)."""
    found = openblas()
    if found is None:
        return None
    return CBlas(found.address("cblas_sgemm"), found.address("cblas_dgemm"), found.get_threads,
                 found.set_threads, int64=found.int64)


def hand_blas_to(entry_module: Any, calls_mkl: bool = True) -> None:
    """Give an entry module whose MatMul steps call BLAS (it has `set_blas`) the addresses.
    `calls_mkl` False: no product was chosen for MKL, so it is not looked for (the loader's
    search for it took ~40 ms of a warm start)."""
    if hasattr(entry_module, "set_blas"):
        blas = cblas()
        assert blas is not None  # the entry calls BLAS only where it was found
        # 0s without: products chosen for MKL then leave it to the Python runner
        found = mkl() if calls_mkl else None
        entry_module.set_blas(*blas.addresses, *((found.sgemm, found.dgemm) if found else (0, 0)))
