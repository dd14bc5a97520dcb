"""Reductions and scans: Reduce*, ArgMax/ArgMin, CumSum, Trilu."""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from graphkernel.ir import types as T
from graphkernel.onnx.ops.base import (
    CONVERTERS,
    Converter,
    NodeContext,
    Value,
    const,
    converts,
    dtype_of,
    listed_axes,
    norm_axis,
    op,
    rank,
    reversed_along,
    shape_of,
    static_shape,
    take_along,
)


# -- reductions ------------------------------------------------------------------------------
def _reduce(prim: str, pre: Callable[[Value], Value] | None = None,
            post: Callable[[Value], Value] | None = None) -> Converter:
    def convert(cx: NodeContext, x: Value, axes: Value = None) -> Value:
        listed = listed_axes(cx, axes, rank(x))
        if not listed and cx.attr("noop_with_empty_axes", 0):
            return x
        empty = _empty_reduction(cx, x, listed, prim)
        if empty is not None:
            return post(empty) if post else empty
        if prim in _EMPTY_IDENTITY and dtype_of(x) == np.bool_:  # any / all, through int32
            y = convert(cx, op("Cast", x, dtype=T.int32), axes)
            return y.astype(np.bool_) if isinstance(y, np.ndarray) else \
                op("Cast", y, dtype=T.bool_)
        y = pre(x) if pre else x
        y = op(prim, y, axis=tuple(listed or ()), keep_dims=bool(cx.attr("keepdims", 1)))
        return post(y) if post else y
    return convert


# What a reduction of no elements gives, as ONNX defines it: the reduction's identity.
_EMPTY_IDENTITY = {"ReduceMax": -np.inf, "ReduceMin": np.inf}


def _empty_reduction(cx: NodeContext, x: Value, listed: list[int] | None, prim: str
                     ) -> np.ndarray | None:
    """The result of a max or min over an axis of size 0 (a constant), else None."""
    axes = listed or list(range(rank(x)))
    if prim not in _EMPTY_IDENTITY or not any(shape_of(x)[a] == 0 for a in axes):
        return None
    dtype = dtype_of(x)
    identity = _EMPTY_IDENTITY[prim]
    if dtype == np.bool_:  # any of none is False, all of none is True
        identity = identity > 0
    elif not T.is_float(dtype):
        limits = np.iinfo(dtype)
        identity = limits.min if identity < 0 else limits.max
    keep = bool(cx.attr("keepdims", 1))
    shape = [1 if i in axes else d for i, d in enumerate(shape_of(x)) if keep or i not in axes]
    if not all(isinstance(d, int) for d in shape):
        raise cx.refuse("a max or min over an empty axis, with a dynamic size left")
    return np.full(shape, identity, dtype=dtype)


CONVERTERS["ReduceSum"] = _reduce("ReduceSum")
CONVERTERS["ReduceMean"] = _reduce("ReduceMean")
CONVERTERS["ReduceMax"] = _reduce("ReduceMax")
CONVERTERS["ReduceMin"] = _reduce("ReduceMin")
CONVERTERS["ReduceProd"] = _reduce("ReduceProd")
CONVERTERS["ReduceL1"] = _reduce("ReduceSum", lambda x: op("Abs", x))
CONVERTERS["ReduceL2"] = _reduce("ReduceSum", lambda x: op("Mul", x, x), lambda y: op("Sqrt", y))
CONVERTERS["ReduceSumSquare"] = _reduce("ReduceSum", lambda x: op("Mul", x, x))
CONVERTERS["ReduceLogSum"] = _reduce("ReduceSum", None, lambda y: op("Log", y))


@converts("ReduceLogSumExp")
def _reduce_log_sum_exp(cx: NodeContext, x: Value, axes: Value = None) -> Value:
    listed = listed_axes(cx, axes, rank(x))
    if not listed and cx.attr("noop_with_empty_axes", 0):
        return x
    axis = tuple(listed or ())
    empty = _empty_reduction(cx, x, listed, "ReduceMax")  # log(0) = -inf, as max's identity
    if empty is not None:
        return empty
    top = op("ReduceMax", x, axis=axis, keep_dims=True)
    total = op("ReduceSum", op("Exp", op("Sub", x, top)), axis=axis, keep_dims=True)
    y = op("Add", op("Log", total), top)
    if not cx.attr("keepdims", 1):
        y = op("Squeeze", y, axis=tuple(range(rank(x))) if not axis else axis)
    return y


def _arg(find_max: bool) -> Converter:
    def convert(cx: NodeContext, x: Value) -> Value:
        axis = norm_axis(cx, cx.attr("axis", 0), rank(x))
        last = cx.attr("select_last_index", 0)
        length = shape_of(x)[axis]
        if last:  # the first extreme of the reversed axis is the last one
            if not isinstance(length, int):
                raise cx.refuse("select_last_index=1 along a dynamic axis")
            x = reversed_along(x, axis)
        if find_max:
            index = op("Argmax", x, axis=axis, output_type=T.int64)
        else:
            index = op("ArgMinWithValue", x, axis=axis)[0]
            if dtype_of(index) != np.int64:
                index = op("Cast", index, dtype=T.int64)
        if last:
            index = op("Sub", const(length - 1, index), index)
        return op("ExpandDims", index, axis=axis) if cx.attr("keepdims", 1) else index
    return convert




CONVERTERS["ArgMax"] = _arg(True)
CONVERTERS["ArgMin"] = _arg(False)


@converts("CumSum")
def _cumsum(cx: NodeContext, x: Value, axis: Value) -> Value:
    n = rank(x)
    a = norm_axis(cx, cx.ints(axis, "axis")[0], n)
    length = shape_of(x)[a]
    if not isinstance(length, int):
        raise cx.refuse("a cumulative sum along a dynamic axis")
    # A sum along the axis as a product with a triangular matrix of ones (moved last).
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    keep = (i >= j) if cx.attr("reverse", 0) else (i <= j)
    if cx.attr("exclusive", 0):
        keep &= i != j
    perm = tuple(k for k in range(n) if k != a) + (a,)
    moved = op("Transpose", x, perm=perm) if perm != tuple(range(n)) else x
    summed = op("MatMul", moved if n > 1 else op("ExpandDims", moved, axis=0),
                keep.astype(dtype_of(x)))
    if n == 1:
        return op("Squeeze", summed, axis=(0,))
    back = tuple(int(p) for p in np.argsort(perm))
    return op("Transpose", summed, perm=back) if perm != tuple(range(n)) else summed


@converts("Trilu")
def _trilu(cx: NodeContext, x: Value, k: Value = None) -> Value:
    if rank(x) < 2:
        raise cx.refuse(f"an input of rank {rank(x)}")
    rows, cols = static_shape(cx, x)[-2:]
    shift = cx.ints(k, "k")[0] if k is not None else 0
    i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    keep = (j - i >= shift) if cx.attr("upper", 1) else (j - i <= shift)
    return op("Select", keep, x, const(0, x))


# The largest n x n comparison TopK builds (elements, over all rows): 64 MiB of bools.
_TOPK_MAX_COMPARISONS = 1 << 26


@converts("TopK")
def _top_k(cx: NodeContext, x: Value, k: Value) -> tuple[Value, Value]:
    """The k largest (or smallest) along an axis, and their indices, ties in index order as
    ONNX says; NaN counts as larger than any number. Each element's rank is the number of
    elements that come before it (an n x n comparison along the axis, moved last); the index
    at output position p is the one whose rank is p, and the values are gathered there."""
    n = rank(x)
    axis = norm_axis(cx, cx.attr("axis", -1), n)
    counts = cx.ints(k, "k")
    shape = static_shape(cx, x)
    length = shape[axis]
    if len(counts) != 1 or not 0 <= counts[0] <= length:
        raise cx.refuse(f"k={counts} for an axis of size {length}")
    count = counts[0]
    if math.prod(shape) * length > _TOPK_MAX_COMPARISONS:
        raise cx.refuse(f"an axis of {length} over {math.prod(shape) // max(length, 1)} rows: "
                        f"more than {_TOPK_MAX_COMPARISONS} comparisons")
    perm = tuple(a for a in range(n) if a != axis) + (axis,)
    back = tuple(int(p) for p in np.argsort(perm))
    moved = op("Transpose", x, perm=perm) if perm != tuple(range(n)) else x
    if isinstance(moved, np.ndarray):
        moved = np.ascontiguousarray(moved)
    mine = op("ExpandDims", moved, axis=-1)    # x_i along the second to last axis
    other = op("ExpandDims", moved, axis=-2)   # x_j along the last axis
    first, second = (other, mine) if cx.attr("largest", 1) else (mine, other)
    before = op("Greater", first, second)
    tie = op("Equal", other, mine)
    if T.is_float(dtype_of(x)):
        first_nan, second_nan = op("IsNan", first), op("IsNan", second)
        before = op("LogicalOr", before,
                    op("LogicalAnd", first_nan, op("LogicalNot", second_nan)))
        tie = op("LogicalOr", tie, op("LogicalAnd", first_nan, second_nan))
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    before = op("LogicalOr", before, op("LogicalAnd", tie, j < i))
    ranks = op("ReduceSum", op("Cast", before, dtype=T.int64), axis=(n,), keep_dims=False)
    at = op("Equal", op("ExpandDims", ranks, axis=-2),
            np.arange(count, dtype=np.int64)[:, None])   # (..., k, n): element i at position p
    positions = np.broadcast_to(np.arange(length, dtype=np.int64), (count, length))
    indices = op("ReduceSum", op("Select", at, positions, np.zeros_like(positions)),
                 axis=(n,), keep_dims=False)
    values = take_along(cx, moved, indices, n - 1)
    if perm != tuple(range(n)):
        values = op("Transpose", values, perm=back)
        indices = op("Transpose", indices, perm=back)
    return values, indices
