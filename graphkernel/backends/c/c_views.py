"""Buffers a fused kernel reads layout ops through (graph_kernel/index_maps.py): each mapped
view is a second name for its source's argument, with the map's offset and strides laid over
the kernel's iteration space."""
from __future__ import annotations

from typing import Any

from graphkernel.backends.c.c_loops import contiguous_strides
from graphkernel.graph_kernel.schedule import Schedule


def view_buffers(sched: Schedule, buffer_of: dict[int, Any], make: Any) -> list[Any]:
    """One buffer per mapped view, registered in `buffer_of` under the view's value; `make`
    builds a Buffer (c_emitter's class)."""
    rank = len(sched.space)
    views = []
    for uid, imap in sched.maps.items():
        source = buffer_of[imap.source.uid]
        aligned = sched.aligned[uid]
        strides = [0] * (rank - len(imap.strides)) + list(imap.strides)
        # An axis the view has as 1 broadcasts over the space: it reads the same element.
        strides = [0 if a == 1 else s for a, s in zip(aligned, strides)]
        buf = make(imap.source, aligned, False, source.index, offset=imap.offset,
                   space_strides=strides)
        buffer_of[uid] = buf
        views.append(buf)
    return views



def concat_buffers(sched: Schedule, buffer_of: dict[int, Any], make: Any
                   ) -> tuple[dict[int, list[tuple[Any, int]]], list[Any]]:
    """Per Concat the kernel reads in place: its pieces as (buffer, end along the axis), each a
    second name for the piece's argument shifted back by its start, so that the Concat's
    index along the axis addresses the piece directly; and all those buffers."""
    rank = len(sched.space)
    loads: dict[int, list[tuple[Any, int]]] = {}
    every: list[Any] = []
    for uid, (axis, pieces) in sched.concats.items():
        aligned = sched.aligned[uid]
        loads[uid] = []
        for value, start in pieces:
            shape = (1,) * (rank - len(value.shape)) + tuple(value.shape)
            dense = contiguous_strides(shape)
            # An axis the Concat has as 1 broadcasts (on its own axis: one piece of size 1).
            strides = [0 if a == 1 else s for a, s in zip(aligned, dense)]
            buf = make(value, aligned, False, buffer_of[value.uid].index,
                       offset=-start * dense[axis], space_strides=strides)
            loads[uid].append((buf, start + shape[axis]))
            every.append(buf)
    return loads, every


def tile_buffers(sched: Schedule, buffer_of: dict[int, Any], make: Any) -> list[Any]:
    """One buffer per Tile the kernel reads in place, registered under the Tile's value: its
    input's argument, the index along each repeated axis taken modulo the input's length."""
    tiles = []
    for uid, (value, shape) in sched.tiles.items():
        aligned = sched.aligned[uid]
        dense = contiguous_strides(shape)
        strides = [0 if d == 1 or a == 1 else s for d, a, s in zip(shape, aligned, dense)]
        modulo = {i: d for i, (d, a) in enumerate(zip(shape, aligned)) if 1 < d < a}
        buf = make(value, aligned, False, buffer_of[value.uid].index, space_strides=strides,
                   modulo=modulo)
        buffer_of[uid] = buf
        tiles.append(buf)
    return tiles
