"""What a generated loop nest is made of: kernel arguments (buffers), loop dimensions with each
buffer's stride, the block sizes its loops walk in (`LoopBlocking`), and the finished kernel
source."""
from __future__ import annotations

from dataclasses import dataclass, field

from graphkernel.ir.graph import Value

# The block sizes of generated loop nests, as constants: the defaults of CConfig's knobs of the
# same names (backends/c/config.py), which tuning changes per kernel (backends/c/tuning.py).
# A pointwise loop calling vector math walks its innermost loop in chunks of POINTWISE_CHUNK
# elements, each first prefetching the lines PREFETCH_DISTANCE_BYTES ahead of it in every large
# input it reads contiguously. The hardware prefetcher alone did not keep such a loop fed: in a
# C harness on two threads, bias + GeLU over 4096x4096 floats ran 7.4 ms, 4.4 ms prefetching
# 4 KiB ahead (the loop's speed on data in cache), 4.4-4.8 ms at 8 and 16 KiB; on 4 MiB already
# in cache it was unchanged (docs/perf-notes.md, "Software prefetch").
PREFETCH_DISTANCE_BYTES = 4096
POINTWISE_CHUNK = 64
# Rows per chunk of a pipelined row reduction (backends/c/c_reduce.py `_pipelines`; 0: no
# pipelining): each chunk's first row has its first pass on its own, the others have it
# overlapped with the row before.
ROW_PIPELINE_ROWS = 32
# Elements of a row one float block sum covers (64 additions per lane with 16 lanes); longer
# rows combine their block sums pairwise in double (c_reduce.py). It bounds the sum's error.
ROW_BLOCK = 1024
# Lanes of the innermost kept axis one column-reduction block handles: accumulators for a block
# stay in L1 (512 floats = 2 KiB per reduction).
COLUMN_BLOCK = 512


@dataclass(frozen=True)
class LoopBlocking:
    """The block sizes one kernel's loops walk in (CConfig's knobs of the same names)."""

    prefetch_distance_bytes: int = PREFETCH_DISTANCE_BYTES
    pointwise_chunk: int = POINTWISE_CHUNK
    row_pipeline_rows: int = ROW_PIPELINE_ROWS
    row_block: int = ROW_BLOCK
    column_block: int = COLUMN_BLOCK


DEFAULT_BLOCKING = LoopBlocking()


@dataclass
class Buffer:
    """A kernel argument: an input, a non-scalar constant or an output."""

    value: Value
    aligned: tuple[int, ...]
    is_output: bool
    index: int
    strides: list[int] = field(default_factory=list)  # per loop dim, in elements
    offset: int = 0  # a view read through an index map (c_views.py): its first element's
    space_strides: list[int] | None = None  # offset and strides per iteration-space axis
    modulo: dict[int, int] | None = None  # a Tile: space axis -> length its index wraps at

    @property
    def name(self) -> str:
        return f"out{self.index}" if self.is_output else f"in{self.index}"


@dataclass
class LoopDim:
    size: int
    reduced: bool
    strides: dict[int, int]  # buffer id -> stride
    axis: int = -1  # the iteration-space axis it walks, where it walks one (a Concat's axis)


@dataclass
class KernelSource:
    name: str
    source: str
    buffers: list[Buffer]  # in argument order: inputs, constants, outputs
    # A kernel over a dynamic space that streams its outputs: the C expression of the bytes
    # streamed, which the shape-generic dispatcher compares with the threshold per call.
    stream_bytes: str | None = None


def contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    strides, acc = [], 1
    for dim in reversed(shape):
        strides.append(acc if dim != 1 else 0)
        acc *= dim
    return list(reversed(strides))
