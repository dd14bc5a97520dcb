"""Convolution and pooling."""
from __future__ import annotations

import math
from collections.abc import Sequence

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





def _spatial(cx: NodeContext, x: Value, what: str) -> int:
    n = rank(x) - 2
    if n not in (1, 2):
        raise cx.refuse(f"{what} over {n} spatial dimension(s) (1 and 2 are supported)")
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
    if n == 1:
        y = op("Squeeze", y, axis=(2,))
    if bias is not None:
        y = op("Add", y, reshape(cx, bias, (1, out_channels) + (1,) * n))
    return y


def _pool_geometry(cx: NodeContext, x: Value, count_pads: bool
                   ) -> tuple[int, list[int], list[int], list[int]]:
    n = _spatial(cx, x, "pooling")
    kernel = list(cx.attr("kernel_shape", []))
    if len(kernel) != n:
        raise cx.refuse(f"kernel_shape={kernel} for {n} spatial dimension(s)")
    strides = list(cx.attr("strides", [1] * n))
    dilations = list(cx.attr("dilations", [1] * n))
    if any(d != 1 for d in dilations):
        raise cx.refuse(f"dilations={dilations} (pooling with dilation 1 only)")
    size = shape_of(x)[2:]
    if not all(isinstance(d, int) for d in size):
        raise cx.refuse(f"pooling over the dynamic spatial sizes {size}")
    pads = _window_pads(cx, size, kernel, strides, dilations)
    if cx.attr("ceil_mode", 0):
        for i, (length, k, s) in enumerate(zip(size, kernel, strides)):
            padded = length + pads[i] + pads[i + n]
            floor_out = (padded - k) // s + 1
            ceil_out = -(-(padded - k) // s) + 1
            if ceil_out > floor_out and (ceil_out - 1) * s >= length + pads[i]:
                ceil_out -= 1  # the last window would start in the end padding
            if ceil_out > floor_out:
                if count_pads:
                    raise cx.refuse("ceil_mode=1 where it adds a partial window (average pool)")
                pads[i + n] += (ceil_out - 1) * s + k - padded
    return n, kernel, strides, pads


def _pool2d(prim: str, x: Value, n: int, kernel: list[int], strides: list[int]) -> Value:
    if n == 1:
        x = op("ExpandDims", x, axis=2)
        kernel, strides = [1] + kernel, [1] + strides
    y = op(prim, x, kernel_size=tuple(kernel), strides=tuple(strides), pad_mode="valid")
    return op("Squeeze", y, axis=(2,)) if n == 1 else y


def _full_pads(spatial: list[int]) -> list[int]:
    """Spatial pads (begins, then ends) as pads of every axis of an (N, C, ...) input."""
    n = len(spatial) // 2
    return [0, 0] + spatial[:n] + [0, 0] + spatial[n:]


@converts("MaxPool")
def _max_pool(cx: NodeContext, x: Value) -> Value:
    if cx.wants(1):
        raise cx.refuse("the Indices output is not supported")
    n, kernel, strides, pads = _pool_geometry(cx, x, count_pads=False)
    if any(pads):
        x = pad_constant(x, _full_pads(pads), -np.inf if T.is_float(dtype_of(x)) else
                         np.iinfo(dtype_of(x)).min)
    return _pool2d("MaxPool", x, n, kernel, strides)


@converts("AveragePool")
def _average_pool(cx: NodeContext, x: Value) -> Value:
    n, kernel, strides, pads = _pool_geometry(cx, x, count_pads=True)
    if not any(pads):
        return _pool2d("AvgPool", x, n, kernel, strides)
    y = _pool2d("AvgPool", pad_constant(x, _full_pads(pads), 0.0), n, kernel, strides)
    if cx.attr("count_include_pad", 0):
        return y
    # The mean over the window's elements inside the input: rescale by the static count.
    size = shape_of(x)[2:]
    ones = np.pad(np.ones(size), [(pads[i], pads[i + n]) for i in range(n)])
    counts = ones
    for axis, (k, s) in enumerate(zip(kernel, strides)):
        windows = np.lib.stride_tricks.sliding_window_view(counts, k, axis=axis)
        counts = windows.sum(axis=-1).take(range(0, windows.shape[axis], s), axis=axis)
    scale = (math.prod(kernel) / counts).reshape((1, 1) + counts.shape)
    return op("Mul", y, const(scale, y))


def _global_pool(prim: str) -> Converter:
    def convert(cx: NodeContext, x: Value) -> Value:
        return op(prim, x, axis=tuple(range(2, rank(x))), keep_dims=True)
    return convert


CONVERTERS["GlobalAveragePool"] = _global_pool("ReduceMean")
CONVERTERS["GlobalMaxPool"] = _global_pool("ReduceMax")
