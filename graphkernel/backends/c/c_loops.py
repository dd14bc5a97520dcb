"""What a generated loop nest is made of: kernel arguments (buffers), loop dimensions with each
buffer's stride, and the finished kernel source."""
from __future__ import annotations

from dataclasses import dataclass, field

from graphkernel.ir.graph import Value


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
