"""Expanders of the neural-network composites (ir/opdefs/nn.py): BatchNorm as a per-channel
scale and shift (inference) or batch statistics then that scale and shift (training); the loss
primitives (ir/opdefs/composite.py) in their stable forms."""
from __future__ import annotations

import math

import numpy as np

from graphkernel.graph_kernel.expanders import Builder, expander
from graphkernel.ir.graph import Value
from graphkernel.ir.opdefs.nn import batch_norm_axes


@expander("BatchNorm")
def batch_norm(b: Builder, x: Value, scale: Value, bias: Value, mean: Value, variance: Value,
               is_training: bool = False, epsilon: float = 1e-5, momentum: float = 0.1,
               data_format: str = "NCHW") -> tuple[Value, ...]:
    rank, channels = len(x.shape), x.shape[1]
    # float16 inputs compute in float32 and round once, as the numpy reference does.
    wide = b("Cast", x, dtype=np.dtype(np.float32)) if x.dtype == np.float16 else x

    def per_channel(v: Value) -> Value:  # (C,) -> (C, 1, 1) so it broadcasts over NCHW
        return b("Reshape", v, shape=(channels, 1, 1)) if rank == 4 else v

    if is_training:
        axes = batch_norm_axes(rank)
        inv_n = 1.0 / math.prod(x.shape[a] for a in axes) if x.shape[0] else math.inf
        batch_mean = b("Mul", b("ReduceSum", wide, axis=axes, keep_dims=True), inv_n)
        centred = b("Sub", wide, batch_mean)
        batch_var = b("Mul", b("ReduceSum", b("Mul", centred, centred), axis=axes,
                               keep_dims=True), inv_n)
        y = b("Add", b("Mul", b("Mul", centred, b("Rsqrt", b("Add", batch_var, epsilon))),
                       per_channel(scale)), per_channel(bias))
        stats = [b("Reshape", s, shape=(channels,)) for s in (batch_mean, batch_var)]
        stats = [b("Cast", s, dtype=mean.dtype) if s.dtype != mean.dtype else s for s in stats]
        out_mean, out_var = stats
    else:
        # y = x * s + t with s = scale / sqrt(var + eps), t = bias - mean * s, computed on the
        # parameters laid out as (C, 1, 1): the kernel that applies them to x reads them through
        # index maps and computes s and t once per channel (hoisted out of the H*W loop).
        scale, bias, mean4, variance4 = (per_channel(v) for v in (scale, bias, mean, variance))
        s = b("Mul", scale, b("Rsqrt", b("Add", variance4, epsilon)))
        t = b("Sub", bias, b("Mul", mean4, s))
        y = b("Add", b("Mul", wide, s), t)
        out_mean, out_var = mean, variance
    if y.dtype != x.dtype:
        y = b("Cast", y, dtype=x.dtype)
    return y, out_mean, out_var, out_mean, out_var


@expander("SigmoidCrossEntropyWithLogits", float16_in_float32=True)
def sigmoid_cross_entropy_with_logits(b: Builder, x: Value, y: Value) -> Value:
    # max(x, 0) - x y + log1p(exp(-|x|)): exp never overflows
    soft = b("Log1p", b("Exp", b("Neg", b("Abs", x))))
    return b("Add", b("Sub", b("Maximum", x, 0.0), b("Mul", x, y)), soft)


@expander("SoftmaxCrossEntropyWithLogits", float16_in_float32=True)
def softmax_cross_entropy_with_logits(b: Builder, x: Value, labels: Value
                                      ) -> tuple[Value, Value]:
    shifted = b("Sub", x, b("ReduceMax", x, axis=(1,), keep_dims=True))
    log_p = b("Sub", shifted, b("Log", b("ReduceSum", b("Exp", shifted), axis=(1,),
                                         keep_dims=True)))
    loss = b("Neg", b("ReduceSum", b("Mul", labels, log_p), axis=(1,), keep_dims=False))
    return loss, b("Sub", b("Exp", log_p), labels)
