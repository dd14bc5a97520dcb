"""Convolution and pooling."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

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
    op,
    pad_constant,
    rank,
    reshape,
    shape_of,
    static_shape,
)


# -- convolution and pooling -----------------------------------------------------------------
def _window_pads(cx: NodeContext, size: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dilations: Sequence[int]) -> list[int]:
    """ONNX pads (all begins, then all ends) from `pads` or `auto_pad`."""
    auto = cx.attr("auto_pad", "NOTSET")
    n = len(size)
    if auto in ("NOTSET", ""):
        pads = list(cx.attr("pads", [0] * 2 * n))
        if len(pads) != 2 * n or min(pads) < 0:
            raise cx.refuse(f"pads={pads}")
        return pads
    if auto == "VALID":
        return [0] * 2 * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise cx.refuse(f"auto_pad={auto!r}")
    begins, ends = [], []
    for length, k, s, d in zip(size, kernel, strides, dilations):
        if not isinstance(length, int):
            raise cx.refuse(f"auto_pad={auto} over a dynamic spatial size")
        total = max(0, (-(-length // s) - 1) * s + (k - 1) * d + 1 - length)
        small, large = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else large)
        ends.append(large if auto == "SAME_UPPER" else small)
    return begins + ends





def _spatial(cx: NodeContext, x: Value, what: str, supported: tuple[int, ...] = (1, 2)) -> int:
    n = rank(x) - 2
    if n not in supported:
        listed = ", ".join(str(s) for s in supported)
        raise cx.refuse(f"{what} over {n} spatial dimension(s) ({listed} are supported)")
    return n


@converts("Conv")
def _conv(cx: NodeContext, x: Value, w: Value, bias: Value = None) -> Value:
    n = _spatial(cx, x, "convolution")
    if rank(w) != n + 2:
        raise cx.refuse(f"weight of rank {rank(w)} for an input of rank {rank(x)}")
    kernel = list(cx.attr("kernel_shape", shape_of(w)[2:]))
    if kernel != list(shape_of(w)[2:]):
        raise cx.refuse(f"kernel_shape {kernel} differs from the weight's {shape_of(w)[2:]}")
    strides = list(cx.attr("strides", [1] * n))
    dilations = list(cx.attr("dilations", [1] * n))
    pads = _window_pads(cx, shape_of(x)[2:], kernel, strides, dilations)
    if n == 1:  # as a 2-D convolution over a height of 1
        x = op("ExpandDims", x, axis=2)
        w = op("ExpandDims", w, axis=2)
        kernel, strides, dilations = [1] + kernel, [1] + strides, [1] + dilations
        pads = [0, pads[0], 0, pads[1]]
    out_channels = shape_of(w)[0]
    pad = (pads[0], pads[2], pads[1], pads[3])
    y = op("Conv2D", x, w, out_channel=out_channels, kernel_size=tuple(kernel),
           pad_mode="pad" if any(pad) else "valid", pad=pad if any(pad) else 0,
           stride=tuple(strides), dilation=tuple(dilations), group=cx.attr("group", 1))
    if bias is not None and rank(bias) == 1 and dtype_of(bias) == dtype_of(y):
        # MindSpore's Conv2d bias: the form an inference BatchNorm after it folds into
        # (graph_kernel/bn_fold.py), as for a written network.
        y = op("BiasAdd", y, bias, data_format="NCHW")
    elif bias is not None:
        y = op("Add", y, reshape(cx, bias, (1, out_channels, 1, 1)))
    if n == 1:
        y = op("Squeeze", y, axis=(2,))
    return y


class _Window:
    """A pooling window over the n spatial axes of an (N, C, ...) input: sizes, strides,
    dilations, the declared pads (begins, then ends) and the end padding `ceil_mode` adds."""

    def __init__(self, n: int, kernel: list[int], strides: list[int], dilations: list[int],
                 pads: list[int], ceil_extra: list[int]) -> None:
        self.n, self.kernel, self.strides, self.dilations = n, kernel, strides, dilations
        self.pads, self.ceil_extra = pads, ceil_extra

    def all_pads(self) -> list[int]:
        """Declared and ceil_mode pads as pads of every axis of the input."""
        ends = [e + c for e, c in zip(self.pads[self.n:], self.ceil_extra)]
        return [0, 0] + self.pads[:self.n] + [0, 0] + ends


def _pool_geometry(cx: NodeContext, x: Value) -> _Window:
    n = _spatial(cx, x, "pooling", (1, 2, 3))
    kernel = list(cx.attr("kernel_shape", []))
    if len(kernel) != n or min(kernel, default=1) < 1:
        raise cx.refuse(f"kernel_shape={kernel} for {n} spatial dimension(s)")
    strides = list(cx.attr("strides", [1] * n))
    dilations = list(cx.attr("dilations", [1] * n))
    if len(strides) != n or len(dilations) != n or min(strides + dilations) < 1:
        raise cx.refuse(f"strides={strides}, dilations={dilations} for {n} spatial "
                        "dimension(s)")
    size = shape_of(x)[2:]
    if not all(isinstance(d, int) for d in size):
        raise cx.refuse(f"pooling over the dynamic spatial sizes {size}")
    pads = _window_pads(cx, size, kernel, strides, dilations)
    extra = [0] * n
    for i, (length, k, s, d) in enumerate(zip(size, kernel, strides, dilations)):
        span = (k - 1) * d + 1
        padded = length + pads[i] + pads[i + n]
        if padded < span:
            raise cx.refuse(f"a window of {span} over a padded size of {padded}")
        if cx.attr("ceil_mode", 0):
            floor_out = (padded - span) // s + 1
            ceil_out = -(-(padded - span) // s) + 1
            if ceil_out > floor_out and (ceil_out - 1) * s >= length + pads[i]:
                ceil_out -= 1  # the last window would start in the end padding
            extra[i] = max(0, (ceil_out - 1) * s + span - padded)
    return _Window(n, kernel, strides, dilations, pads, extra)


def _window_reduce(cx: NodeContext, prim: str, x: Value, w: _Window) -> Value:
    """Max or mean (`prim`: MaxPool or AvgPool) over every window of an already padded input.
    Both are separable, so a 3-D window is a 2-D pool of the last two axes, then a pool of the
    third from last; a dilated window is a reduction of its strided slices, axis by axis."""
    n, kernel, strides = w.n, w.kernel, w.strides
    if any(d != 1 for d in w.dilations):
        return _dilated_reduce(x, prim, w)
    if n == 1:
        y = op(prim, op("ExpandDims", x, axis=2), kernel_size=(1, kernel[0]),
               strides=(1, strides[0]), pad_mode="valid")
        return op("Squeeze", y, axis=(2,))
    if n == 2:
        return op(prim, x, kernel_size=tuple(kernel), strides=tuple(strides), pad_mode="valid")
    batch, channels, depth = shape_of(x)[:3]
    if not isinstance(channels, int) or not isinstance(depth, int):
        raise cx.refuse("3-D pooling with a dynamic channel count or depth")
    planes = reshape(cx, x, (batch, channels * depth) + shape_of(x)[3:])
    y = op(prim, planes, kernel_size=tuple(kernel[1:]), strides=tuple(strides[1:]),
           pad_mode="valid")
    rows, cols = shape_of(y)[2:]
    y = reshape(cx, y, (batch, channels, depth, rows * cols))
    y = op(prim, y, kernel_size=(kernel[0], 1), strides=(strides[0], 1), pad_mode="valid")
    return reshape(cx, y, (batch, channels, shape_of(y)[2], rows, cols))


def _dilated_reduce(x: Value, prim: str, w: _Window) -> Value:
    combine = "Maximum" if prim == "MaxPool" else "Add"
    for i, (k, s, d) in enumerate(zip(w.kernel, w.strides, w.dilations)):
        axis = i + 2
        out = (shape_of(x)[axis] - (k - 1) * d - 1) // s + 1
        n = rank(x)
        mask = sum(1 << a for a in range(n) if a != axis)
        parts = []
        for j in range(k):
            begin, end, step = [0] * n, [0] * n, [1] * n
            begin[axis], end[axis], step[axis] = j * d, j * d + (out - 1) * s + 1, s
            parts.append(op("StridedSlice", x, begin=tuple(begin), end=tuple(end),
                            strides=tuple(step), begin_mask=mask, end_mask=mask))
        x = parts[0]
        for part in parts[1:]:
            x = op(combine, x, part)
    if prim == "AvgPool":
        x = op("Mul", x, const(1.0 / math.prod(w.kernel), x))
    return x


@converts("MaxPool")
def _max_pool(cx: NodeContext, x: Value) -> Any:
    w = _pool_geometry(cx, x)
    pads = w.all_pads()
    if w.n == 2 and not cx.wants(1) and all(d == 1 for d in w.dilations):
        # graphkernel's MaxPool pads itself: one kernel, no -inf borders concatenated first
        top, left, bottom, right = pads[2], pads[3], pads[6], pads[7]
        return op("MaxPool", x, kernel_size=tuple(w.kernel), strides=tuple(w.strides),
                  pad_mode="pad", pad=(top, bottom, left, right))
    source = x
    if any(pads):
        x = pad_constant(x, pads, -np.inf if T.is_float(dtype_of(x)) else
                         np.iinfo(dtype_of(x)).min)
    if cx.wants(1):
        return _max_pool_with_indices(cx, source, x, w)
    return _window_reduce(cx, "MaxPool", x, w)


def _max_pool_with_indices(cx: NodeContext, source: Value, padded: Value, w: _Window
                           ) -> tuple[Value, Value]:
    """MaxPool and its Indices output: the flat position in the (unpadded) input of each
    window's first largest element. A running maximum over the window's offsets, each a
    strided slice of the padded input, keeps the index of the offset that first raised it;
    the index of every offset at every output position is a constant of the static shape."""
    shape = static_shape(cx, source, "its input (the Indices output)")
    storage_order = cx.attr("storage_order", 0)
    if storage_order not in (0, 1) or (storage_order and w.n != 2):
        raise cx.refuse(f"storage_order={storage_order} (0, or 1 for 2-D pooling)")
    n = w.n
    outs = [(shape_of(padded)[2 + i] - (k - 1) * d - 1) // s + 1
            for i, (k, s, d) in enumerate(zip(w.kernel, w.strides, w.dilations))]
    spatial = list(shape[2:])
    if storage_order:  # column-major within each image: the last two axes swap weights
        weights = [1, spatial[0]]
    else:
        weights = [math.prod(spatial[i + 1:]) for i in range(n)]
    base = (np.arange(shape[0])[:, None] * math.prod(shape[1:]) +
            np.arange(shape[1])[None, :] * math.prod(spatial)).reshape(shape[:2] + (1,) * n)
    best: Value = None
    index: Value = None
    for offset in np.ndindex(*w.kernel):
        begin, end, step = [0, 0], [shape[0], shape[1]], [1, 1]
        position = np.zeros([1, 1] + outs, np.int64)
        for i, j in enumerate(offset):
            start = j * w.dilations[i]
            begin.append(start)
            end.append(start + (outs[i] - 1) * w.strides[i] + 1)
            step.append(w.strides[i])
            along = np.arange(outs[i]) * w.strides[i] + start - w.pads[i]  # in the input
            position = position + (along * weights[i]).reshape(
                [1, 1] + [outs[i] if a == i else 1 for a in range(n)])
        value = op("StridedSlice", padded, begin=tuple(begin), end=tuple(end),
                   strides=tuple(step))
        where = base + position
        if best is None:
            best, index = value, np.broadcast_to(where, shape[:2] + tuple(outs)).copy()
            continue
        larger = op("Greater", value, best)
        index = op("Select", larger, where, index)
        best = op("Maximum", best, value)
    return best, index


@converts("AveragePool")
def _average_pool(cx: NodeContext, x: Value) -> Value:
    w = _pool_geometry(cx, x)
    pads = w.all_pads()
    if not any(pads):
        return _window_reduce(cx, "AvgPool", x, w)
    n = w.n
    # The mean over the window's elements inside the input (and inside the declared pads
    # with count_include_pad; never the end padding ceil_mode adds).
    counted = np.pad(np.ones(shape_of(x)[2:]), [(pads[i + 2], pads[i + n + 4]) for i in range(n)])
    if cx.attr("count_include_pad", 0):
        wanted = np.pad(np.ones(shape_of(x)[2:]),
                        [(w.pads[i], w.pads[i + n]) for i in range(n)], constant_values=1.0)
        wanted = np.pad(wanted, [(0, c) for c in w.ceil_extra])
    else:
        wanted = counted
    inside, divisor = _window_counts(counted, w), _window_counts(wanted, w)
    if n == 2 and all(d == 1 for d in w.dilations) and inside.min() > 0:
        # graphkernel's AvgPool pads itself: one kernel, no zero borders concatenated first
        # (they kept a plan off the compiled entry). It divides by the input elements each
        # window covers, or with count_include_pad by the window's size; other divisors
        # (count_include_pad beside ceil_mode's uncounted end padding) are a constant rescale.
        top, left, bottom, right = pads[2], pads[3], pads[6], pads[7]
        whole = bool(np.all(divisor == math.prod(w.kernel)))
        y = op("AvgPool", x, kernel_size=tuple(w.kernel), strides=tuple(w.strides),
               pad_mode="pad", pad=(top, bottom, left, right), count_include_pad=whole)
        if whole or np.array_equal(inside, divisor):
            return y
        return op("Mul", y, const((inside / divisor).reshape((1, 1) + inside.shape), y))
    y = _window_reduce(cx, "AvgPool", pad_constant(x, pads, 0.0), w)
    if np.all(divisor == math.prod(w.kernel)):
        return y
    scale = (math.prod(w.kernel) / divisor).reshape((1, 1) + divisor.shape)
    return op("Mul", y, const(scale, y))


def _window_counts(mask: np.ndarray, w: _Window) -> np.ndarray:
    """How many ones of `mask` (over the padded spatial axes) each output's window covers."""
    counts = mask
    for axis, (k, s, d) in enumerate(zip(w.kernel, w.strides, w.dilations)):
        out = (counts.shape[axis] - (k - 1) * d - 1) // s + 1
        counts = np.sum([counts.take(range(j * d, j * d + (out - 1) * s + 1, s), axis=axis)
                         for j in range(k)], axis=0)
    return counts


def _global_pool(prim: str) -> Converter:
    def convert(cx: NodeContext, x: Value) -> Value:
        return op(prim, x, axis=tuple(range(2, rank(x))), keep_dims=True)
    return convert


CONVERTERS["GlobalAveragePool"] = _global_pool("ReduceMean")
CONVERTERS["GlobalMaxPool"] = _global_pool("ReduceMax")
