"""Buffers a fused kernel reads layout ops through (graph_kernel/index_maps.py): each mapped
view is a second name for its source's argument, with the map's offset and strides laid over
the kernel's iteration space."""
from __future__ import annotations

from typing import Any

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

