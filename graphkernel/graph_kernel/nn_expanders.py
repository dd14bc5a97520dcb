"""Expanders of the neural-network composites (ir/opdefs/nn.py): BatchNorm as a per-channel
scale and shift (inference) or batch statistics then that scale and shift (training)."""
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
