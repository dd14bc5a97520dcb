"""Sizes as kernel arguments: what a shape-generic kernel (one whose iteration space holds
dynamic dimensions, `ir.types.SymSize`) needs beyond the static emitter.

A kernel's dynamic sizes come after its buffers in `args`, one `int64_t *` per symbol, in the
order `kernel_symbols` gives; the kernel reads each into a local named after the symbol, so a
size's text (`N`, `64*N`) is its C expression. Decisions the static emitter takes from the size
are taken at run time: `generic_kernel.emit_any_kernel` emits a generic group twice, one
variant on OpenMP threads and one on the calling thread, and a dispatcher that picks by this
call's size (an OpenMP `if` clause would still enter the runtime: ~0.8 us per call at 4x4).
Column-reduction blocks are whole blocks; non-temporal stores are not used (their size test is
static).
"""
from __future__ import annotations

from graphkernel.ir.types import Dim, SymSize
from graphkernel.runtime.plan import kernel_symbols  # noqa: F401  (the order sizes are read in)

# The threshold a variant is emitted with (backends/c/generic_kernel.py): every parallel loop
# threaded, or none.
THREADS, ONE_THREAD = 1, 0


def read_sizes(symbols: tuple[str, ...], first_arg: int) -> list[str]:
    """C lines binding each symbol from its argument."""
    return [f"  const int64_t {name} = *(const int64_t *)args[{first_arg + k}];"
            for k, name in enumerate(symbols)]


def runs_threaded(work: Dim, threshold: int) -> bool:
    """Whether a loop over `work` elements runs on OpenMP threads. A dynamic size is decided
    per call by `emit_any_kernel`'s dispatcher: each variant is emitted with the threshold
    that says which it is."""
    if isinstance(work, SymSize):
        return threshold == THREADS
    return work >= threshold


def is_dynamic(size: Dim) -> bool:
    """Whether a size is known only at run time."""
    return isinstance(size, SymSize)


def block_size(block: int, size: Dim) -> int:
    """Lanes per block of a loop of `size` (a dynamic loop takes whole blocks)."""
    return block if isinstance(size, SymSize) else min(block, size)
