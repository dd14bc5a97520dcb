"""The C backend's own settings: when a generated kernel runs on threads, writes with streaming
stores, prefetches its inputs (and how far ahead), when a convolution's images share the
threads, and the block sizes of the loops (row pipelining, row and column blocks). They steer
the C text the emitters write, so the compile-cache key and a GKIR export record them
(`CompileOptions.backend_config`); fusion's costs stay in graph_kernel/cost_model.py, and how a
plan runs whichever backend built it (BLAS threads, prefault) in runtime/plan.py's
`PlanSettings`, held here as `plan`.

The values below are the constants, chosen on one host: a compile without settings of its own
takes the defaults backends/c/calibration.py derives from this machine's measured rates (copy
bandwidth, FMA rate, OpenMP fork/join, cache sizes), and these only where calibration is off
($GRAPHKERNEL_CALIBRATION=off, as in the test suite) or cannot run."""
from __future__ import annotations

from dataclasses import dataclass, field

from graphkernel.backends.c import c_loops
from graphkernel.backends.c.c_loops import LoopBlocking
from graphkernel.backends.c.conv_tile import (
    TAP_CHUNK_BYTES,
    check_conv_tile,
    check_store_epilogue,
    check_tap_chunk_bytes,
)
from graphkernel.errors import ContextError
from graphkernel.runtime.plan import PlanSettings


@dataclass(frozen=True)
class CConfig:
    def __post_init__(self) -> None:
        # Both reach the C text: only the widths GCC takes, and block sizes within bounds.
        problem = check_vector_width(self.vector_width) or \
            check_blocking({name: getattr(self, name) for name in BLOCKING_RANGES})
        if problem is not None:
            raise ContextError(f"CConfig: {problem}")
        problem = check_conv_tile(self.conv_channel_vectors, self.conv_pixels) or \
            check_store_epilogue(self.conv_store_epilogue) or \
            check_tap_chunk_bytes(self.conv_tap_chunk_bytes)
        if problem is not None:
            raise ContextError(f"CConfig: {problem}")

    # Elements of iteration space above which a kernel's outer loop runs on threads:
    # below it the fork/join costs more than the work (measured on the 2-core VMs).
    parallel_threshold: int = 1 << 17
    # Bytes of output above which a kernel writes with non-temporal stores (None: never). Such
    # outputs are not read back from cache by the next kernel anyway; the stores skip the read
    # for ownership (1.4x on a bandwidth-bound kernel here). Smaller outputs stay in cache.
    stream_min_bytes: int | None = 16 << 20
    # Bytes of an input above which a pointwise kernel calling vector math (exp, tanh, ...)
    # prefetches it ahead of its loads (backends/c/c_emitter.py; None: never). Smaller inputs are
    # in cache already.
    prefetch_min_bytes: int | None = 1 << 20
    # Multiply-adds (a pool: window reads) of a convolution or pool above which its images run
    # on threads (backends/c/c_window.py): ~20 us of one thread's work, well above a fork.
    window_parallel_min_macs: int = 1 << 20
    # The vector width GCC prefers when it vectorises the kernel's loops, in bits (None: the
    # toolchain's, 512 on AVX-512): some AMD cores split a 512-bit operation into two 256-bit
    # halves, where 256-bit code can run as fast at a lower clock cost. Set per kernel by tuning
    # (backends/c/tuning.py); one of VECTOR_WIDTHS.
    vector_width: int | None = None
    # The block sizes of the loops (backends/c/c_loops.py says what each is and why its
    # default): how far ahead a prefetching pointwise loop prefetches, in bytes, and the chunk
    # of elements it prefetches for at once; rows per chunk of a pipelined row reduction (0:
    # not pipelined); elements per float block sum of a row; lanes per column-reduction block.
    # Set per kernel by tuning; each within BLOCKING_RANGES.
    prefetch_distance_bytes: int = c_loops.PREFETCH_DISTANCE_BYTES
    pointwise_chunk: int = c_loops.POINTWISE_CHUNK
    row_pipeline_rows: int = c_loops.ROW_PIPELINE_ROWS
    row_block: int = c_loops.ROW_BLOCK
    column_block: int = c_loops.COLUMN_BLOCK
    # A convolution's register tile in 512-bit code: channel vectors x pixels of accumulators
    # per unit of work (backends/c/conv_tile.py; None: the register file's rule, 2 x 14). Set
    # per kernel by tuning; checked here, as they reach the C text.
    conv_channel_vectors: int | None = None
    conv_pixels: int | None = None
    # Where a conv block's epilogue runs on blocked output (backends/c/c_conv_block.py): None
    # the rule (`store_epilogue_rule`: in the units' stores for few taps), 0 a second pass over
    # each unit's output, 1 in the stores. Set per kernel by tuning.
    conv_store_epilogue: int | None = None
    # A 1x1 convolution's unit walks its pixels over chunks of taps whose weights take at most
    # this many bytes (c_conv_units.tap_chunk; 0: never chunked). Calibrated from L1d.
    conv_tap_chunk_bytes: int = TAP_CHUNK_BYTES
    # Settings of the plan the kernels run in (BLAS threads, kernels beside BLAS, prefault).
    plan: PlanSettings = field(default_factory=PlanSettings)

    @property
    def blocking(self) -> LoopBlocking:
        return LoopBlocking(self.prefetch_distance_bytes, self.pointwise_chunk,
                            self.row_pipeline_rows, self.row_block, self.column_block)


def check_vector_width(width: object) -> str | None:
    """Why `width` is not a vector width a kernel may take, or None."""
    if width is None or (type(width) is int and width in VECTOR_WIDTHS):
        return None
    return f"vector_width is {width!r:.40}; it is None or one of {VECTOR_WIDTHS}"


VECTOR_WIDTHS = (128, 256, 512)
# The values each block size may take (inclusive): a block of a few elements would make a
# loop of overheads, a huge one a stack array (column blocks, rows) past any thread's stack.
BLOCKING_RANGES: dict[str, tuple[int, int]] = {
    "prefetch_distance_bytes": (64, 1 << 16),
    "pointwise_chunk": (8, 1 << 12),
    "row_pipeline_rows": (0, 1 << 12),  # 0: not pipelined
    "row_block": (64, 1 << 16),
    "column_block": (16, 1 << 12),
}


def check_blocking(values: dict[str, object]) -> str | None:
    """Why one of `values` (block sizes by CConfig field name) is not one a kernel may take,
    or None."""
    for name, value in values.items():
        low, high = BLOCKING_RANGES[name]
        if type(value) is not int or not low <= value <= high:
            return f"{name} is {value!r:.40}; it is an int from {low} to {high}"
    return None


DEFAULT_C_CONFIG = CConfig()
