"""Shapes and data movement: Shape, Reshape, Transpose, Slice, Gather, Pad, ...; most fold
when their inputs are known at load time."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.ir import types as T
from graphkernel.onnx.arrays import tensor_array
from graphkernel.onnx.ops.base import (
    FOLDERS,
    NodeContext,
    Value,
    checked_axes,
    concrete,
    converts,
    dtype_of,
    listed_axes,
    norm_axis,
    op,
    ops_list,
    pad_constant,
    rank,
    reshape,
    shape_of,
    static_shape,
    take_along,
    zeros_of_shape,
)


# -- shapes ----------------------------------------------------------------------------------
@converts("Shape")
def _shape(cx: NodeContext, x: Value) -> np.ndarray:
    shape = list(shape_of(x))
    n = len(shape)
    start, end = cx.attr("start", 0), cx.attr("end", n)
    start = min(max(start + n if start < 0 else start, 0), n)
    end = min(max(end + n if end < 0 else end, 0), n)
    part = shape[start:end]
    if all(isinstance(d, int) for d in part):
        return np.array(part, dtype=np.int64)
    return np.array(part, dtype=object)


FOLDERS["Shape"] = _shape


@converts("Size")
def _size(cx: NodeContext, x: Value) -> np.ndarray:
    size = math.prod(shape_of(x))
    if not isinstance(size, int):
        return np.array(size, dtype=object)
    return np.array(size, dtype=np.int64)


FOLDERS["Size"] = _size


@converts("Constant")
def _constant(cx: NodeContext) -> np.ndarray:
    attrs = cx.node.attribute
    if len(attrs) != 1:
        raise cx.refuse("a Constant needs exactly one value attribute")
    name = attrs[0].name
    value = cx.attrs[name]
    if name == "value":
        return tensor_array(value, cx.label)
    if name in ("value_float", "value_floats"):
        return np.array(value, dtype=np.float32)
    if name in ("value_int", "value_ints"):
        return np.array(value, dtype=np.int64)
    raise cx.refuse(f"a Constant given as {name} (strings and sparse tensors are not supported)")


FOLDERS["Constant"] = _constant


@converts("ConstantOfShape")
def _constant_of_shape(cx: NodeContext, shape: Value) -> Value:
    value = cx.attrs.get("value")
    fill = tensor_array(value, cx.label).reshape(-1) if value is not None else \
        np.zeros(1, np.float32)
    if fill.size != 1:
        raise cx.refuse("value must hold one element")
    known = cx.known(shape, "the shape").reshape(-1)
    if known.dtype == object and not all(isinstance(d, (int, np.integer)) for d in known):
        zeros = zeros_of_shape(cx, list(known), fill.dtype)
        if fill.dtype == np.bool_:
            return op("LogicalOr", zeros, fill) if fill[0] else zeros
        return op("Add", zeros, fill)
    dims = cx.ints(concrete(shape, "the shape"), "the shape")
    if any(d < 0 for d in dims):
        raise cx.refuse(f"negative shape {dims}")
    return np.full(dims, fill[0], dtype=fill.dtype)


FOLDERS["ConstantOfShape"] = _constant_of_shape  # a dynamic shape makes a traced tensor


@converts("Range")
def _range(cx: NodeContext, start: Value, limit: Value, delta: Value) -> np.ndarray:
    a, b, d = (cx.known(v, what) for v, what in ((start, "start"), (limit, "limit"),
                                                 (delta, "delta")))
    if d == 0:
        raise cx.refuse("delta 0")
    count = max(int(np.ceil((b - a) / d)), 0)
    return (a + d * np.arange(count)).astype(a.dtype)


def _symbolic_range(cx: NodeContext, start: Value, limit: Value, delta: Value) -> Value:
    """A Range up to a dynamic size (transformers' masks count the batch: `arange(batch)`):
    from 0 in steps of 1 it has that many elements, a traced tensor of that length (a dynamic
    dimension, as `Cell.set_inputs` makes), each element its position (RangeLike)."""
    a, b, d = (cx.known(v, what).reshape(-1) for v, what in ((start, "start"), (limit, "limit"),
                                                             (delta, "delta")))
    if a.dtype == object or d.dtype == object or a.size != 1 or b.size != 1 or d.size != 1 or \
            int(a[0]) != 0 or int(d[0]) != 1:
        raise cx.refuse(f"a Range from {a.tolist()} to {b.tolist()} in steps of {d.tolist()}: "
                        "a range up to a dynamic size (a dim_param) must start at 0 in steps "
                        "of 1")
    dtype = dtype_of(start)
    return op("RangeLike", zeros_of_shape(cx, [b[0]], dtype), axis=0, dtype=T.to_dtype(dtype))


FOLDERS["Range"] = _symbolic_range  # known bounds fold in _range; a dynamic limit is traced


@converts("Reshape")
def _reshape(cx: NodeContext, x: Value, shape: Value) -> Value:
    target = list(cx.known(shape, "the shape").reshape(-1))
    if not cx.attr("allowzero", 0):
        target = [shape_of(x)[i] if isinstance(d, (int, np.integer)) and d == 0 else d
                  for i, d in enumerate(target)]
    return reshape(cx, x, target)


def _fold_reshape(cx: NodeContext, x: np.ndarray, shape: np.ndarray) -> np.ndarray:
    return np.reshape(x, [int(d) for d in cx.ints(shape, "the shape")])


FOLDERS["Reshape"] = _fold_reshape


@converts("Flatten")
def _flatten(cx: NodeContext, x: Value) -> Value:
    n = rank(x)
    axis = cx.attr("axis", 1)
    axis = axis + n if axis < 0 else axis
    if not 0 <= axis <= n:
        raise cx.refuse(f"axis {cx.attr('axis')} for rank {n}")
    shape = shape_of(x)
    return reshape(cx, x, (math.prod(shape[:axis]), math.prod(shape[axis:])))


@converts("Transpose")
def _transpose(cx: NodeContext, x: Value) -> Value:
    perm = tuple(cx.attr("perm", list(range(rank(x)))[::-1]))
    if sorted(perm) != list(range(rank(x))):
        raise cx.refuse(f"perm={list(perm)} for rank {rank(x)}")
    return x if perm == tuple(range(rank(x))) else op("Transpose", x, perm=perm)




@converts("Squeeze")
def _squeeze(cx: NodeContext, x: Value, axes: Value = None) -> Value:
    listed = listed_axes(cx, axes, rank(x))
    if listed is None:
        listed = [i for i, d in enumerate(shape_of(x)) if d == 1]
    if any(shape_of(x)[a] != 1 for a in listed):
        raise cx.refuse(f"squeezing axes {listed} of shape {shape_of(x)} (not all of size 1)")
    if isinstance(x, np.ndarray):
        return np.squeeze(x, axis=tuple(listed))
    return op("Squeeze", x, axis=tuple(listed)) if listed else x


@converts("Unsqueeze")
def _unsqueeze(cx: NodeContext, x: Value, axes: Value = None) -> Value:
    listed = sorted(listed_axes(cx, axes, rank(x) + len(cx.ints(axes, "axes") if axes is not None
                                                  else cx.attr("axes", []))) or [])
    if isinstance(x, np.ndarray):
        return np.expand_dims(x, tuple(listed))
    for a in listed:
        x = op("ExpandDims", x, axis=a)
    return x


FOLDERS["Squeeze"] = _squeeze
FOLDERS["Unsqueeze"] = _unsqueeze


@converts("Concat")
def _concat(cx: NodeContext, *xs: Value) -> Value:
    axis = norm_axis(cx, cx.attr("axis"), rank(xs[0]))
    parts = [x for x in xs if shape_of(x)[axis] != 0] or list(xs[:1])
    if len(parts) == 1:
        return parts[0]
    return ops_list("Concat", parts, axis=axis)


def _fold_concat(cx: NodeContext, *xs: np.ndarray) -> np.ndarray:
    return np.concatenate(xs, axis=cx.attr("axis"))


FOLDERS["Concat"] = _fold_concat


@converts("Split")
def _split(cx: NodeContext, x: Value, split: Value = None) -> list[Value]:
    axis = norm_axis(cx, cx.attr("axis", 0), rank(x))
    length = shape_of(x)[axis]
    if not isinstance(length, int):
        raise cx.refuse("splitting a dynamic axis")
    if split is not None:
        sizes = cx.ints(split, "split")
    elif cx.attr("split") is not None:
        sizes = list(cx.attr("split"))
    else:
        count = cx.attr("num_outputs", len(cx.outputs))
        step = -(-length // count)
        sizes = [min(step, length - i * step) for i in range(count)]
    if sum(sizes) != length or min(sizes) < 0:
        raise cx.refuse(f"split sizes {sizes} for axis {axis} of size {length}")
    if len(set(sizes)) == 1 and len(sizes) > 1:
        return list(op("Split", x, axis=axis, output_num=len(sizes)))
    outs, start = [], 0
    for size in sizes:
        begin = [0] * rank(x)
        extent = list(shape_of(x))
        begin[axis], extent[axis] = start, size
        outs.append(_slice_static(cx, x, begin, extent))
        start += size
    return outs


def _slice_static(cx: NodeContext, x: Value, begin: list[int], size: list[Any]) -> Value:
    if list(size) == list(shape_of(x)):
        return x
    n = rank(x)
    end = [b + s if isinstance(s, int) else 0 for b, s in zip(begin, size)]
    mask = sum(1 << i for i, s in enumerate(size) if not isinstance(s, int))
    return op("StridedSlice", x, begin=tuple(begin), end=tuple(end), strides=(1,) * n,
              begin_mask=mask, end_mask=mask)


@converts("Slice")
def _slice(cx: NodeContext, x: Value, starts: Value, ends: Value, axes: Value = None,
           steps: Value = None) -> Value:
    n = rank(x)
    begin_list, end_list = cx.ints(starts, "starts"), cx.ints(ends, "ends")
    axis_list = checked_axes(cx, cx.ints(axes, "axes"), n) if axes is not None else \
        list(range(len(begin_list)))
    step_list = cx.ints(steps, "steps") if steps is not None else [1] * len(begin_list)
    if not len(begin_list) == len(end_list) == len(axis_list) == len(step_list):
        raise cx.refuse("starts, ends, axes and steps differ in length")
    index: list[slice] = [slice(None)] * n
    for b, e, a, s in zip(begin_list, end_list, axis_list, step_list):
        if s == 0:
            raise cx.refuse("a step of 0")
        length = shape_of(x)[a]
        if not isinstance(length, int):
            raise cx.refuse(f"slicing dynamic axis {a}")
        b = b + length if b < 0 else b
        e = e + length if e < 0 else e
        if s > 0:
            b, e = min(max(b, 0), length), min(max(e, 0), length)
            index[a] = slice(b, max(e, b), s)
        else:
            b, e = min(max(b, -1), length - 1), min(max(e, -1), length - 1)
            index[a] = slice(b, e if e >= 0 else None, s)
    if isinstance(x, np.ndarray):
        return x[tuple(index)]
    if all(sl == slice(None) for sl in index):
        return x
    begin, end, strides, begin_mask, end_mask = [], [], [], 0, 0
    for axis, sl in enumerate(index):
        begin.append(sl.start if sl.start is not None else 0)
        end.append(sl.stop if sl.stop is not None else 0)
        strides.append(sl.step or 1)
        if sl.start is None:
            begin_mask |= 1 << axis
        if sl.stop is None:
            end_mask |= 1 << axis
    out_shape = [len(range(*sl.indices(d))) if isinstance(d, int) else d
                 for sl, d in zip(index, shape_of(x))]
    if 0 in out_shape:  # nothing to read: the empty result is known
        if not all(isinstance(d, int) for d in out_shape):
            raise cx.refuse(f"a slice with no elements of dynamic shape {out_shape}")
        return np.zeros(out_shape, dtype=dtype_of(x))
    return op("StridedSlice", x, begin=tuple(begin), end=tuple(end), strides=tuple(strides),
              begin_mask=begin_mask, end_mask=end_mask)


FOLDERS["Slice"] = _slice


@converts("Gather")
def _gather(cx: NodeContext, x: Value, indices: Value) -> Value:
    axis = norm_axis(cx, cx.attr("axis", 0), rank(x))
    length = shape_of(x)[axis]
    if isinstance(indices, np.ndarray) and isinstance(length, int):
        indices = concrete(indices, "the indices")
        if indices.size and (indices.min() < -length or indices.max() >= length):
            raise cx.refuse(f"an index out of range for axis {axis} of size {length}")
        if isinstance(x, np.ndarray):
            return np.take(x, indices, axis=axis)
    # ONNX's indices may count from the end: the Gather declared so takes them as they are
    # (checked when it runs where they are not known here).
    return op("Gather", x, indices, axis=axis, negative_indices=True)


FOLDERS["Gather"] = _gather


@converts("GatherElements")
def _gather_elements(cx: NodeContext, x: Value, indices: Value) -> Value:
    return take_along(cx, x, indices, norm_axis(cx, cx.attr("axis", 0), rank(x)))


@converts("Expand")
def _expand(cx: NodeContext, x: Value, shape: Value) -> Value:
    target = [int(d) if isinstance(d, (int, np.integer)) else d
              for d in cx.known(shape, "the shape").reshape(-1)]
    have = list(shape_of(x))
    n = max(len(target), len(have))
    target = [1] * (n - len(target)) + target
    have = [1] * (n - len(have)) + have
    out = []
    for t, h in zip(target, have):
        if isinstance(t, int) and t == 1:
            out.append(h)
        elif isinstance(h, int) and h == 1:
            out.append(t)
        elif t is h or t == h:
            out.append(h)
        else:
            raise cx.refuse(f"shape {shape_of(x)} cannot expand to {target}")
    x = reshape(cx, x, have) if len(have) != rank(x) else x
    if not all(isinstance(d, int) for d in out):
        if tuple(out) == tuple(have):
            return x
        zeros = zeros_of_shape(cx, out, dtype_of(x))
        if dtype_of(x) == np.bool_:
            return op("LogicalOr", x, zeros)
        return op("Add", x, zeros)
    return x if tuple(out) == shape_of(x) else op("BroadcastTo", x, shape=tuple(out))


FOLDERS["Expand"] = _expand  # a known tensor expanded to a dynamic shape is traced


@converts("Tile")
def _tile(cx: NodeContext, x: Value, repeats: Value) -> Value:
    reps = cx.ints(repeats, "repeats")
    if len(reps) != rank(x) or min(reps, default=1) < 1:
        raise cx.refuse(f"repeats {reps} for rank {rank(x)}")
    return x if all(r == 1 for r in reps) else op("Tile", x, multiples=tuple(reps))


@converts("Dropout")
def _dropout(cx: NodeContext, x: Value, ratio: Value = None, training: Value = None) -> Any:
    if training is not None and bool(cx.known(training, "training_mode").reshape(-1)[0]):
        raise cx.refuse("training_mode=True (inference only)")
    if cx.wants(1):
        return x, np.ones(static_shape(cx, x), dtype=np.bool_)
    return x


@converts("Pad")
def _pad(cx: NodeContext, x: Value, pads: Value, value: Value = None, axes: Value = None
         ) -> Value:
    mode = cx.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise cx.refuse(f"mode={mode!r}")
    n = rank(x)
    listed = cx.ints(pads, "pads")
    axis_list = checked_axes(cx, cx.ints(axes, "axes"), n) if axes is not None else \
        list(range(n))
    if len(listed) != 2 * len(axis_list):
        raise cx.refuse(f"pads {listed} for axes {axis_list}")
    full = [0] * 2 * n
    for i, a in enumerate(axis_list):
        full[a], full[a + n] = listed[i], listed[i + len(axis_list)]
    if min(full) < 0:
        raise cx.refuse(f"negative pads {listed}")
    if mode != "constant":
        return _pad_from_input(cx, x, full, mode)
    fill = 0.0
    if value is not None:
        known = cx.known(value, "constant_value").reshape(-1)
        fill = known[0].item() if known.size else 0.0
    return pad_constant(x, full, fill)


def _pad_from_input(cx: NodeContext, x: Value, pads: list[int], mode: str) -> Value:
    """Pad `mode` reflect, edge or wrap: each padded axis is one Gather of the input along it,
    with the source of every output position worked out here (as numpy.pad places them)."""
    n = rank(x)
    for axis in range(n):
        before, after = pads[axis], pads[axis + n]
        if not before and not after:
            continue
        length = shape_of(x)[axis]
        if not isinstance(length, int):
            raise cx.refuse(f"mode={mode!r} padding of the dynamic axis {axis}")
        if length == 0:
            raise cx.refuse(f"mode={mode!r} padding of axis {axis}, which has no elements")
        position = np.arange(-before, length + after)
        if mode == "edge" or (mode == "reflect" and length == 1):
            source = np.clip(position, 0, length - 1)
        elif mode == "wrap":
            source = position % length
        else:  # reflect about the first and last elements, which are not repeated
            period = 2 * (length - 1)
            source = np.abs(position) % period
            source = np.where(source >= length, period - source, source)
        x = op("Gather", x, source.astype(np.int64), axis=axis)
    return x
