"""Normalisations: BatchNormalization, InstanceNormalization, LayerNormalization, LRN."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.onnx.ops.base import (
    NodeContext,
    Value,
    const,
    converts,
    dtype_of,
    norm_axis,
    op,
    rank,
    reshape,
    shape_of,
)


# -- normalisation ---------------------------------------------------------------------------
def _channel(cx: NodeContext, p: Value, x: Value) -> Value:
    """A per-channel parameter shaped to broadcast over an (N, C, ...) input."""
    return reshape(cx, p, (shape_of(p)[0],) + (1,) * (rank(x) - 2))


@converts("BatchNormalization")
def _batch_norm(cx: NodeContext, x: Value, scale: Value, bias: Value, mean: Value,
                var: Value) -> Value:
    if cx.attr("training_mode", 0) or any(cx.wants(i) for i in (1, 2)):
        raise cx.refuse("training_mode=1 (inference only)")
    eps = cx.attr("epsilon", 1e-5)
    if rank(x) in (2, 4) and all(dtype_of(p) == dtype_of(x) for p in (scale, bias, mean, var)):
        y = op("BatchNorm", x, scale, bias, mean, var, is_training=False, epsilon=eps)
        return y[0] if isinstance(y, tuple) else y
    if rank(x) < 2:
        raise cx.refuse(f"an input of rank {rank(x)}")
    inv = op("Rsqrt", op("Add", _channel(cx, var, x), const(eps, var)))
    y = op("Mul", op("Sub", x, _channel(cx, mean, x)), op("Mul", inv, _channel(cx, scale, x)))
    return op("Add", y, _channel(cx, bias, x))


def _normalise(x: Value, axes: tuple[int, ...], eps: float) -> tuple[Value, Value, Value]:
    mean = op("ReduceMean", x, axis=axes, keep_dims=True)
    centred = op("Sub", x, mean)
    var = op("ReduceMean", op("Mul", centred, centred), axis=axes, keep_dims=True)
    inv = op("Rsqrt", op("Add", var, const(eps, var)))
    return op("Mul", centred, inv), mean, inv


@converts("InstanceNormalization")
def _instance_norm(cx: NodeContext, x: Value, scale: Value, bias: Value) -> Value:
    if rank(x) < 3:
        raise cx.refuse(f"an input of rank {rank(x)}")
    y, _, _ = _normalise(x, tuple(range(2, rank(x))), cx.attr("epsilon", 1e-5))
    return op("Add", op("Mul", y, _channel(cx, scale, x)), _channel(cx, bias, x))


@converts("LayerNormalization")
def _layer_norm(cx: NodeContext, x: Value, scale: Value, bias: Value = None) -> Any:
    axis = norm_axis(cx, cx.attr("axis", -1), rank(x))
    eps = cx.attr("epsilon", 1e-5)
    if cx.attr("stash_type", 1) != 1 and dtype_of(x) != np.float32:
        raise cx.refuse("stash_type other than float32")
    norm_shape = shape_of(x)[axis:]
    if not (cx.wants(1) or cx.wants(2)) and bias is not None and \
            shape_of(scale) == norm_shape and shape_of(bias) == norm_shape:
        return op("LayerNorm", x, scale, bias, begin_norm_axis=axis, begin_params_axis=axis,
                  epsilon=eps)
    y, mean, inv = _normalise(x, tuple(range(axis, rank(x))), eps)
    y = op("Mul", y, scale)
    if bias is not None:
        y = op("Add", y, bias)
    return y, mean, inv




@converts("LRN")
def _lrn(cx: NodeContext, x: Value) -> Value:
    """Local response normalisation across channels: the windowed sum of squares is a product
    with a band matrix of ones over the channel axis, moved last."""
    size = cx.attr("size")
    if not isinstance(size, int) or size < 1 or rank(x) < 3:
        raise cx.refuse(f"size={size!r} on an input of rank {rank(x)}")
    alpha, beta, bias = cx.attr("alpha", 1e-4), cx.attr("beta", 0.75), cx.attr("bias", 1.0)
    channels = shape_of(x)[1]
    if not isinstance(channels, int):
        raise cx.refuse("a dynamic channel count")
    lo = (size - 1) // 2
    c_from, c_to = np.arange(channels)[:, None], np.arange(channels)[None, :]
    band = ((c_from >= c_to - lo) & (c_from <= c_to + size - 1 - lo)).astype(dtype_of(x))
    n = rank(x)
    last = (0,) + tuple(range(2, n)) + (1,)
    back = tuple(int(p) for p in np.argsort(last))
    sums = op("Transpose", op("MatMul", op("Transpose", op("Mul", x, x), perm=last), band),
              perm=back)
    scale = op("Add", op("Mul", sums, const(alpha / size, x)), const(bias, x))
    return op("Mul", x, op("Pow", scale, const(-beta, x)))
