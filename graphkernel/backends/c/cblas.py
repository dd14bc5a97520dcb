"""numpy's OpenBLAS (runtime/blas.py `openblas`) as the C function addresses the compiled entry's
MatMul steps call (c_gemm.py), and handing them to a loaded entry module."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from graphkernel.runtime.blas import openblas

# OpenBLAS versions whose cblas_?gemm_batch the entry calls (c_gemm.py BATCH_MIN_MNK depends on
# where the batch sends small products: checked on these).
BATCH_VERSIONS = ((0, 3, 31),)


@dataclass(frozen=True)
class CBlas:
    """numpy's own OpenBLAS as C function addresses: cblas_sgemm, cblas_dgemm, its get/set-threads
    functions, and its batch GEMMs where it has them."""

    sgemm: int
    dgemm: int
    get_threads: int
    set_threads: int
    int64: bool  # an ILP64 build (numpy's scipy_openblas64_): BLAS integers are int64_t
    sgemm_batch: int = 0  # cblas_sgemm_batch (BATCH_VERSIONS), 0 without
    dgemm_batch: int = 0

    @property
    def addresses(self) -> tuple[int, int, int, int, int, int]:
        """What the entry module's `set_blas` takes, in its order."""
        return (self.sgemm, self.dgemm, self.get_threads, self.set_threads, self.sgemm_batch,
                self.dgemm_batch)


def _version(text: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (text or "").split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def cblas() -> CBlas | None:
    """numpy's BLAS as C functions, or None when it is not an OpenBLAS on its own pthreads
    (MKL, BLIS, a build on other threads: the Python runner calls numpy there)."""
    found = openblas()
    if found is None:
        return None
    checked = _version(found.version) in BATCH_VERSIONS
    return CBlas(found.address("cblas_sgemm"), found.address("cblas_dgemm"), found.get_threads,
                 found.set_threads, int64=found.int64,
                 sgemm_batch=found.address("cblas_sgemm_batch") if checked else 0,
                 dgemm_batch=found.address("cblas_dgemm_batch") if checked else 0)


def hand_blas_to(entry_module: Any) -> None:
    """Give an entry module whose MatMul steps call BLAS (it has `set_blas`) the addresses."""
    if hasattr(entry_module, "set_blas"):
        blas = cblas()
        assert blas is not None  # the entry calls BLAS only where it was found
        entry_module.set_blas(*blas.addresses)
