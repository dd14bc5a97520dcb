"""Tensor indexing and slicing inside construct (`x[0]`, `x[:, 1:3]`, `x[..., None]`,
negative indices, steps), lowered as MindSpore's graph mode does: one StridedSlice with its
masks (Tensor.__getitem__; a Tensor of integer indices gathers along axis 0 there)."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.errors import ShapeError, UnsupportedError


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def strided_slice_args(key: Any, rank: int) -> tuple[dict[str, Any], list[Any]]:
    """StridedSlice's masks and its (begin, end, strides) for a basic index `key`."""
    items = key if isinstance(key, tuple) else (key,)
    masks = {"begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0,
             "shrink_axis_mask": 0}
    begin, end, strides = [], [], []
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise ShapeError("an index can hold at most one ellipsis (...)")
    for i, item in enumerate(items):
        bit = 1 << i
        if item is Ellipsis:
            masks["ellipsis_mask"] |= bit
            begin.append(0)
            end.append(0)
            strides.append(1)
        elif item is None:
            masks["new_axis_mask"] |= bit
            begin.append(0)
            end.append(0)
            strides.append(1)
        elif _is_int(item):
            masks["shrink_axis_mask"] |= bit
            begin.append(int(item))
            end.append(int(item) + 1)
            strides.append(1)
        elif isinstance(item, slice):
            for part in (item.start, item.stop, item.step):
                if part is not None and not _is_int(part):
                    raise UnsupportedError(f"slice bounds must be Python ints known when "
                                           f"compiling, got {part!r}")
            step = 1 if item.step is None else int(item.step)
            if step == 0:
                raise ShapeError("slice step cannot be zero")
            if item.start is None:
                masks["begin_mask"] |= bit
            if item.stop is None:
                masks["end_mask"] |= bit
            begin.append(0 if item.start is None else int(item.start))
            end.append(0 if item.stop is None else int(item.stop))
            strides.append(step)
        else:
            raise UnsupportedError(f"a tensor index must be ints, slices, None and ..., or one "
                                   f"Tensor of int indices; got {type(item).__name__} "
                                   f"({item!r:.40})")
    return masks, [tuple(begin), tuple(end), tuple(strides)]
