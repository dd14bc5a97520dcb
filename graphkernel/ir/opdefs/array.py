"""Array ops, MindSpore's signatures: joining and splitting (Concat, Split, Stack, Unstack),
slicing (Slice, StridedSlice with all five masks), indexing (Gather, OneHot), new tensors
(ZerosLike, OnesLike, RangeLike, Fill, Ones, Zeros) and the static Shape, Size and DType
(Argmax and Median are in ir/opdefs/arg_reduce.py). The data-moving ones run as
numpy kernels between fused kernels."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, ShapeError
from graphkernel.ir import types as T
from graphkernel.ir.opset import (
    ALL,
    AttrKind,
    OpDef,
    PatternKind,
    declare,
    declare_elementwise,
    int_tuple_kinds,
)
from graphkernel.ir.types import TensorType, TupleType, ValueType

INDEX_DTYPES = (T.int32, T.int64)


def _axis(axis: Any, rank: int, op: str) -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or \
            not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{op}: axis {axis!r} is out of range for rank {rank}")
    return int(axis) % max(rank, 1)


def _same_dtype(op: str, types: tuple[TensorType, ...]) -> np.dtype:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        names = ", ".join(sorted(d.name for d in dtypes))
        raise DTypeError(f"{op}: all tensors must share one dtype, got {names} (cast first)")
    return types[0].dtype


# Gradient rules (OpDef.grad). Joining and splitting are each other's gradients; a slice's
# gradient writes dy into zeros (StridedSliceGrad) and a Gather's scatter-adds the rows
# (UnsortedSegmentSum, ir/opdefs/nn_grad.py). An item nothing differentiated reads gets zeros.

def _items_or_zeros(b: Any, n: Any, dout: tuple[Any, ...]) -> list[Any]:
    return [d if d is not None else b.zeros(t) for d, t in zip(dout, n.type.items)]


def _concat_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    axis = attrs["axis"] % len(dy.shape)
    grads, start = [], 0
    for x in n.inputs:
        begin = tuple(start if i == axis else 0 for i in range(len(dy.shape)))
        grads.append(b("Slice", dy, begin=begin, size=x.shape))
        start += x.shape[axis]
    return grads


def _stack_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    return list(b.items(b("Unstack", dy, axis=attrs["axis"])))


def _split_grad(b: Any, n: Any, dout: tuple[Any, ...], attrs: dict[str, Any]) -> list[Any]:
    return [b("Concat", *_items_or_zeros(b, n, dout), axis=attrs["axis"])]


def _unstack_grad(b: Any, n: Any, dout: tuple[Any, ...], attrs: dict[str, Any]) -> list[Any]:
    return [b("Stack", *_items_or_zeros(b, n, dout), axis=attrs["axis"])]


def _slice_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    x = n.inputs[0]
    index = _slice_index(x.shape, attrs["begin"], attrs["size"])
    return [b("StridedSliceGrad", dy, shapex=x.shape, begin=tuple(i.start for i in index),
              end=tuple(i.stop for i in index), strides=(1,) * len(x.shape))]


def _strided_slice_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    masks = {name: attrs[name] for name, _ in _STRIDED_MASKS}
    return [b("StridedSliceGrad", dy, shapex=n.inputs[0].shape, begin=attrs["begin"],
              end=attrs["end"], strides=attrs["strides"], **masks)]


def _gather_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    """dy's rows added into the table's shape at the indices read (repeats accumulate). Off
    axis 0 the gathered axes move to the front and the table's axis back after."""
    params, indices = n.inputs
    axis, k = attrs["axis"] % len(params.shape), len(indices.shape)
    if attrs.get("negative_indices", False):  # the segment sum drops negative ids: wrap them
        indices = b("Select", b("Less", indices, 0), b("Add", indices, params.shape[axis]),
                    indices)
    if axis:
        perm = tuple(range(axis, axis + k)) + tuple(range(axis)) + \
            tuple(range(axis + k, len(dy.shape)))
        dy = b("Transpose", dy, perm=perm)
    rows = b("UnsortedSegmentSum", dy, indices, num_segments=params.shape[axis])
    if axis:
        back = tuple(range(1, axis + 1)) + (0,) + tuple(range(axis + 1, len(params.shape)))
        rows = b("Transpose", rows, perm=back)
    return [rows, None]


# -- Concat, Stack, Split, Unstack ------------------------------------------------------------

def _concat_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    if not types:
        raise ShapeError("Concat needs at least one tensor")
    dtype = _same_dtype("Concat", types)
    rank = types[0].rank
    if rank == 0:
        raise ShapeError("Concat cannot join 0-d tensors (use Stack)")
    axis = _axis(attrs["axis"], rank, "Concat")
    for t in types[1:]:
        if t.rank != rank or any(a != b for i, (a, b) in enumerate(zip(t.shape, types[0].shape))
                                 if i != axis):
            listed = ", ".join(str(x.shape) for x in types)
            raise ShapeError(f"Concat along axis {attrs['axis']}: shapes {listed} differ "
                             "off that axis")
    shape = list(types[0].shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return TensorType(tuple(shape), dtype)


declare(OpDef(name="Concat", kind=PatternKind.INJECTIVE, inputs=("xs",), infer=_concat_infer,
              reference=lambda *xs, axis=0: np.concatenate(xs, axis=axis),
              init_attrs=(("axis", 0),), variadic=True, functional=("concat", "cat"),
              grad=_concat_grad, kernel_alone=True))


def _stack_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    if not types:
        raise ShapeError("Stack needs at least one tensor")
    dtype = _same_dtype("Stack", types)
    if any(t.shape != types[0].shape for t in types):
        listed = ", ".join(str(x.shape) for x in types)
        raise ShapeError(f"Stack: all tensors must have one shape, got {listed}")
    axis = _axis(attrs["axis"], types[0].rank + 1, "Stack")
    shape = types[0].shape[:axis] + (len(types),) + types[0].shape[axis:]
    return TensorType(shape, dtype)


declare(OpDef(name="Stack", kind=PatternKind.INJECTIVE, inputs=("xs",), infer=_stack_infer,
              reference=lambda *xs, axis=0: np.stack(xs, axis=axis),
              init_attrs=(("axis", 0),), variadic=True, functional=("stack",),
              aliases=("Pack",), grad=_stack_grad))


def _split_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    axis = _axis(attrs["axis"], x.rank, "Split")
    n = attrs["output_num"]
    if not isinstance(n, (int, np.integer)) or n < 1 or x.shape[axis] % n:
        raise ShapeError(f"Split: axis {attrs['axis']} of shape {x.shape} (size "
                         f"{x.shape[axis]}) does not split into output_num={n!r} equal parts")
    shape = list(x.shape)
    shape[axis] //= n
    return TupleType((TensorType(tuple(shape), x.dtype),) * int(n))


def _split_ref(x: np.ndarray, axis: int = 0, output_num: int = 1) -> tuple[np.ndarray, ...]:
    return tuple(np.ascontiguousarray(p) for p in np.split(x, output_num, axis=axis))


declare(OpDef(name="Split", kind=PatternKind.INJECTIVE, inputs=("x",), infer=_split_infer,
              reference=_split_ref, init_attrs=(("axis", 0), ("output_num", 1)),
              functional=("split",), grad=_split_grad))


def _unstack_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    if x.rank == 0:
        raise ShapeError("Unstack needs a tensor of rank 1 or more")
    axis = _axis(attrs["axis"], x.rank, "Unstack")
    if attrs.get("num") not in (None, x.shape[axis]):
        raise ShapeError(f"Unstack: num={attrs['num']} but axis {axis} of {x.shape} has "
                         f"{x.shape[axis]} entries")
    if x.shape[axis] == 0:
        raise ShapeError(f"Unstack: axis {axis} of {x.shape} is empty")
    item = TensorType(x.shape[:axis] + x.shape[axis + 1:], x.dtype)
    return TupleType((item,) * x.shape[axis])


def _unstack_ref(x: np.ndarray, axis: int = 0, num: Any = None) -> tuple[np.ndarray, ...]:
    return tuple(np.ascontiguousarray(p) for p in np.moveaxis(x, axis, 0))


declare(OpDef(name="Unstack", kind=PatternKind.INJECTIVE, inputs=("x",), infer=_unstack_infer,
              reference=_unstack_ref, init_attrs=(("axis", 0), ("num", None)),
              attr_kinds=(("num", AttrKind.COUNT),), functional=("unstack", "unbind"),
              aliases=("Unpack",), grad=_unstack_grad))


# -- Slice and StridedSlice -------------------------------------------------------------------

def _ints(value: Any, what: str, op: str) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),)
    if isinstance(value, (tuple, list)) and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        return tuple(int(v) for v in value)
    raise ShapeError(f"{op}: {what} must be a tuple of ints known when compiling, got {value!r}")


def _slice_index(shape: tuple[int, ...], begin: Any, size: Any) -> tuple[slice, ...]:
    begin, size = _ints(begin, "begin", "Slice"), _ints(size, "size", "Slice")
    if len(begin) != len(shape) or len(size) != len(shape):
        raise ShapeError(f"Slice: begin {begin} and size {size} need one entry per axis of "
                         f"{shape}")
    index = []
    for axis, (b, s, d) in enumerate(zip(begin, size, shape)):
        if isinstance(d, T.SymSize):  # known per call: only the whole axis is a shape now
            if (b, s) != (0, -1):
                raise ShapeError(f"Slice: axis {axis} has the dynamic size {d} (shape {shape}): "
                                 f"begin {b} size {s} takes part of it; only the whole axis "
                                 "(begin 0, size -1) can be sliced before run time")
            index.append(slice(0, None))
            continue
        end = d if s == -1 else b + s
        if not 0 <= b <= d or s < -1 or end > d:
            raise ShapeError(f"Slice: begin {b} size {s} is out of bounds for axis {axis} of "
                             f"size {d} (shape {shape})")
        index.append(slice(b, end))
    return tuple(index)


def _static_view_shape(shape: tuple[int, ...], index: tuple[Any, ...]) -> tuple[int, ...]:
    """The shape numpy's basic indexing gives, without allocating (a zero-stride view)."""
    return tuple(np.broadcast_to(np.empty((), np.bool_), shape)[index].shape)


def _slice_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    index = _slice_index(x.shape, attrs["begin"], attrs["size"])
    # a dynamic axis is taken whole (_slice_index): it keeps its size
    stand_in = tuple(1 if isinstance(d, T.SymSize) else d for d in x.shape)
    shape = _static_view_shape(stand_in, index)
    return TensorType(tuple(d if isinstance(d, T.SymSize) else n
                            for d, n in zip(x.shape, shape)), x.dtype)


def _slice_ref(x: np.ndarray, begin: Any, size: Any) -> np.ndarray:
    return np.ascontiguousarray(x[_slice_index(x.shape, begin, size)])


declare(OpDef(name="Slice", kind=PatternKind.INJECTIVE, inputs=("x",), infer=_slice_infer,
              reference=_slice_ref, call_attrs=(("begin", None), ("size", None)),
              attr_kinds=int_tuple_kinds("begin", "size"), functional=("slice",), grad=_slice_grad))


def strided_slice_index(shape: tuple[int, ...], begin: Any, end: Any, strides: Any,
                        begin_mask: int = 0, end_mask: int = 0, ellipsis_mask: int = 0,
                        new_axis_mask: int = 0, shrink_axis_mask: int = 0) -> tuple[Any, ...]:
    """The numpy index StridedSlice's arguments describe (TensorFlow's and MindSpore's masks:
    bit i of a mask applies to entry i of begin/end/strides)."""
    begin, end = _ints(begin, "begin", "StridedSlice"), _ints(end, "end", "StridedSlice")
    strides = _ints(strides, "strides", "StridedSlice")
    if not len(begin) == len(end) == len(strides):
        raise ShapeError(f"StridedSlice: begin {begin}, end {end} and strides {strides} must "
                         "have one length")
    if bin(ellipsis_mask).count("1") > 1:
        raise ShapeError(f"StridedSlice: ellipsis_mask {ellipsis_mask} marks more than one "
                         "ellipsis")
    index: list[Any] = []
    for i, (b, e, s) in enumerate(zip(begin, end, strides)):
        bit = 1 << i
        if ellipsis_mask & bit:
            index.append(Ellipsis)
        elif new_axis_mask & bit:
            index.append(None)
        elif shrink_axis_mask & bit:
            index.append(b)
        else:
            if s == 0:
                raise ShapeError(f"StridedSlice: stride of entry {i} is 0")
            index.append(slice(None if begin_mask & bit else b, None if end_mask & bit else e, s))
    consumed = sum(1 for item in index if item is not None and item is not Ellipsis)
    if consumed > len(shape):
        raise ShapeError(f"StridedSlice: {consumed} indexed axes for a tensor of shape {shape}")
    for i, item in enumerate(index):
        if isinstance(item, int):
            axis = _axis_of_entry(index, i, len(shape))
            if not -shape[axis] <= item < shape[axis]:
                raise ShapeError(f"StridedSlice: index {item} is out of bounds for axis {axis} "
                                 f"of size {shape[axis]} (shape {shape})")
    return tuple(index)


def _axis_of_entry(index: list[Any], i: int, rank: int) -> int:
    """The tensor axis that entry i of an index (with at most one Ellipsis) reads."""
    if Ellipsis in index[:i]:
        after = [x for x in index[i + 1:] if x is not None]
        return rank - 1 - len(after)
    return sum(1 for x in index[:i] if x is not None)


_STRIDED_MASKS = (("begin_mask", 0), ("end_mask", 0), ("ellipsis_mask", 0),
                  ("new_axis_mask", 0), ("shrink_axis_mask", 0))


def _strided_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    masks = {name: attrs[name] for name, _ in _STRIDED_MASKS}
    index = strided_slice_index(x.shape, attrs["begin"], attrs["end"], attrs["strides"], **masks)
    return TensorType(_static_view_shape(x.shape, index), x.dtype)


def _strided_ref(x: np.ndarray, begin: Any, end: Any, strides: Any, **masks: int) -> np.ndarray:
    return np.ascontiguousarray(x[strided_slice_index(x.shape, begin, end, strides, **masks)])


declare(OpDef(name="StridedSlice", kind=PatternKind.INJECTIVE, inputs=("x",),
              infer=_strided_infer, reference=_strided_ref, init_attrs=_STRIDED_MASKS,
              call_attrs=(("begin", None), ("end", None), ("strides", None)),
              attr_kinds=int_tuple_kinds("begin", "end", "strides"),
              functional=("strided_slice",), grad=_strided_slice_grad))


# -- Gather and OneHot ------------------------------------------------------------------------

def _gather_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    params, indices = types
    if indices.dtype not in INDEX_DTYPES:
        raise DTypeError(f"Gather: indices must be int32 or int64, got {indices.dtype.name}")
    axis = _axis(attrs["axis"], params.rank, "Gather")
    if attrs.get("batch_dims", 0) != 0:
        raise ShapeError("Gather: batch_dims other than 0 is not supported")
    return TensorType(params.shape[:axis] + indices.shape + params.shape[axis + 1:],
                      params.dtype)


def check_indices(indices: np.ndarray, size: int, op: str, axis: int,
                  negative: bool = False) -> None:
    """Out-of-range indices are an error (numpy would wrap negative ones silently). With
    `negative`, -size..-1 are in range too: they count from the end, as in numpy and ONNX."""
    low = -size if negative else 0
    if indices.size and (indices.min() < low or indices.max() >= size):
        bad = indices[(indices < low) | (indices >= size)].ravel()[0]
        raise ShapeError(f"{op}: index {int(bad)} is out of range for axis {axis} of size {size}")


def _gather_ref(params: np.ndarray, indices: np.ndarray, axis: int = 0,
                batch_dims: int = 0, negative_indices: bool = False) -> np.ndarray:
    axis = axis % params.ndim
    check_indices(indices, params.shape[axis], "Gather", axis, negative_indices)
    return np.take(params, indices, axis=axis)


# MindSpore's Gather takes indices in [0, size) only (a negative one is an error here, as on
# its CPU backend); `negative_indices=True` declares a Gather that also takes -size..-1 from
# the end (ONNX's and numpy's), so an importer needs no wrapping step of its own.
declare(OpDef(name="Gather", kind=PatternKind.INJECTIVE, inputs=("params", "indices"),
              infer=_gather_infer, reference=_gather_ref,
              init_attrs=(("batch_dims", 0), ("negative_indices", False)),
              call_attrs=(("axis", 0),), functional=("gather",), aliases=("GatherV2",),
              grad=_gather_grad))


def _scalar_dtype(value: Any) -> np.dtype:
    if isinstance(value, np.generic | np.ndarray):
        return T.to_dtype(value.dtype)
    if isinstance(value, bool):
        return T.bool_
    if isinstance(value, int):
        return T.int64
    if isinstance(value, float):
        return T.float32
    raise DTypeError(f"OneHot on_value/off_value must be numbers, got {value!r}")


def _one_hot_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (indices,) = types
    if indices.dtype not in INDEX_DTYPES:
        raise DTypeError(f"OneHot: indices must be int32 or int64, got {indices.dtype.name}")
    depth = attrs["depth"]
    if not isinstance(depth, (int, np.integer)) or isinstance(depth, bool) or depth < 0:
        raise ShapeError(f"OneHot: depth must be a non-negative int, got {depth!r}")
    on, off = _scalar_dtype(attrs["on_value"]), _scalar_dtype(attrs["off_value"])
    if on != off:
        raise DTypeError(f"OneHot: on_value ({on.name}) and off_value ({off.name}) must share "
                         "a dtype")
    axis = _axis(attrs["axis"], indices.rank + 1, "OneHot")
    return TensorType(indices.shape[:axis] + (int(depth),) + indices.shape[axis:], on)


def _one_hot_ref(indices: np.ndarray, depth: int, on_value: Any, off_value: Any,
                 axis: int = -1) -> np.ndarray:
    dtype = _scalar_dtype(on_value)
    # Indices outside [0, depth) give a row of off_value, as in MindSpore and TensorFlow.
    hot = indices[..., None] == np.arange(depth)
    out = np.where(hot, np.asarray(on_value, dtype), np.asarray(off_value, dtype))
    return np.moveaxis(out, -1, axis % (indices.ndim + 1))


declare(OpDef(name="OneHot", kind=PatternKind.INJECTIVE, inputs=("indices",),
              infer=_one_hot_infer, reference=_one_hot_ref, init_attrs=(("axis", -1),),
              call_attrs=(("depth", None), ("on_value", 1.0), ("off_value", 0.0)),
              attr_kinds=(("depth", AttrKind.COUNT),), functional=("one_hot",)))


# -- New tensors ------------------------------------------------------------------------------

declare_elementwise("ZerosLike", 1, lambda x: np.zeros_like(x), accepts=ALL,
                    functional=("zeros_like",))
declare_elementwise("OnesLike", 1, lambda x: np.ones_like(x), accepts=ALL,
                    functional=("ones_like",))


def _range_like_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    x, = types
    _axis(attrs["axis"], x.rank, "RangeLike")
    return TensorType(x.shape, T.to_dtype(attrs["dtype"]))


def _range_like_ref(x: np.ndarray, axis: int = 0, dtype: Any = T.int64) -> np.ndarray:
    axis = _axis(axis, x.ndim, "RangeLike")
    line = np.arange(x.shape[axis], dtype=T.to_dtype(dtype))
    return np.ascontiguousarray(np.broadcast_to(
        line.reshape((-1,) + (1,) * (x.ndim - axis - 1)), x.shape))


# Each element's position along `axis` of x (0, 1, ..., n-1), in x's shape: the values of a
# range whose length is known only when the graph runs (an ONNX Range up to a dynamic size);
# x gives the shape, its values are not read. Its numpy reference runs between kernels.
declare(OpDef(name="RangeLike", kind=PatternKind.OPAQUE, inputs=("x",),
              infer=_range_like_infer, reference=_range_like_ref,
              init_attrs=(("axis", 0), ("dtype", T.int64)), accepts=ALL))


def _fill_shape(shape: Any) -> tuple[int, ...]:
    dims = _ints(shape, "shape", "Fill")
    if any(d < 0 for d in dims):
        raise ShapeError(f"Fill: shape {dims} has a negative dimension")
    return dims


def _fill_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    if attrs["type"] is None:
        raise DTypeError("Fill needs a dtype (e.g. mstype.float32) as its first argument")
    return TensorType(_fill_shape(attrs["shape"]), T.to_dtype(attrs["type"]))


def _fill_ref(type: Any, shape: Any, value: Any) -> np.ndarray:  # noqa: A002 (MindSpore's name)
    return np.full(_fill_shape(shape), value, dtype=T.to_dtype(type))


# No tensor inputs: called while tracing it gives a constant, which the graph bakes in.
declare(OpDef(name="Fill", kind=PatternKind.INJECTIVE, inputs=(), infer=_fill_infer,
              reference=_fill_ref, call_attrs=(("type", None), ("shape", None), ("value", 0)),
              attr_kinds=(("type", AttrKind.DTYPE), ("shape", AttrKind.INTS),
                          ("value", AttrKind.REAL)), functional=("fill",)))

def _filled_infer(op: str) -> Any:
    def infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
        dims = _ints(attrs["shape"], "shape", op)
        if any(d < 0 for d in dims):
            raise ShapeError(f"{op}: shape {dims} has a negative dimension")
        return TensorType(dims, T.to_dtype(attrs["type"]))
    return infer


# MindSpore's Ones()(shape, type) and Zeros()(shape, type): Fill with a fixed value, constants
# in the graph (the type defaults to float32, as ops.ones' does).
for _name, _value in (("Ones", 1), ("Zeros", 0)):
    declare(OpDef(name=_name, kind=PatternKind.INJECTIVE, inputs=(), infer=_filled_infer(_name),
                  reference=lambda shape, type, _v=_value: np.full(  # noqa: A002
                      _ints(shape, "shape", "Ones/Zeros"), _v, dtype=T.to_dtype(type)),
                  call_attrs=(("shape", None), ("type", T.float32)),
                  attr_kinds=(("shape", AttrKind.INT_OR_INTS),), functional=()))

# Static facts of a tensor's type: Python values while tracing (MindSpore's graph mode too).
declare(OpDef(name="Shape", kind=PatternKind.INJECTIVE, inputs=("x",),
              infer=lambda types, attrs: types[0], reference=lambda x: tuple(x.shape),
              static_value=lambda types, attrs: tuple(types[0].shape),
              functional=("shape",)))
declare(OpDef(name="Size", kind=PatternKind.INJECTIVE, inputs=("x",),
              infer=lambda types, attrs: types[0], reference=lambda x: int(x.size),
              static_value=lambda types, attrs: math.prod(types[0].shape),
              functional=("size", "numel")))
declare(OpDef(name="DType", kind=PatternKind.INJECTIVE, inputs=("x",),
              infer=lambda types, attrs: types[0], reference=lambda x: x.dtype,
              static_value=lambda types, attrs: types[0].dtype, functional=("dtype",),
              doc="the input's dtype (mstype.float32, ...), a Python value while tracing"))
