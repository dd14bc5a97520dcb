"""Expanders of the gradient composites (ir/opdefs/grad.py): MindSpore's GeLUGrad, SoftmaxGrad,
LayerNormGrad, ... written in basic ops, so a backward graph fuses as a forward one does.

Those that compute (not only select) compute float16 inputs in float32 and round once, as the
forward LayerNorm and Softmax do and as their numpy references do: rounding after each basic op
put float16 LayerNormGrad several ulp away from its unfused result."""
from __future__ import annotations

import math
from typing import Any

from graphkernel.graph_kernel.expanders import Builder, expander, sigmoid
from graphkernel.ir.graph import Value
from graphkernel.ir.opdefs.grad import bias_add_grad_axes, layer_norm_grad_axes

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def _sum_to(b: Builder, g: Value, shape: tuple[int, ...]) -> Value:
    """`g` summed over the axes broadcasting stretched, back to `shape`."""
    if g.shape == shape:
        return g
    lead = len(g.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                      if d == 1 and g.shape[lead + i] != 1)
    out = b("ReduceSum", g, axis=axes, keep_dims=True) if axes else g
    return out if out.shape == shape else b("Reshape", out, shape=shape)


@expander("GeLUGrad", float16_in_float32=True)
def gelu_grad(b: Builder, dy: Value, x: Value, y: Value, approximate: str = "tanh") -> Value:
    if approximate == "tanh":
        # d/dx x s, s = sigmoid(2u) = 0.5 (1 + tanh(u)), u = c (x + 0.044715 x^3):
        # s + x s (1 - s) 2c (1 + 3 * 0.044715 x^2). s and 1 - s come from one exp(-|2u|)
        # (e r and r, r = 1 / (1 + e)): no tanh call (a libmvec call spills the loop's
        # vectors; exp is inlined) and no cancellation in 1 - tanh^2 or 1 + tanh for x < 0.
        x2 = b("Mul", x, x)
        two_u = b("Mul", b("Mul", x, b("Add", b("Mul", x2, 0.044715), 1.0)),
                  2 * _SQRT_2_OVER_PI)
        e = b("Exp", b("Neg", b("Abs", two_u)))
        r = b("Reciprocal", b("Add", e, 1.0))
        er = b("Mul", e, r)
        up = b("GreaterEqual", two_u, 0.0)
        s, rest = b("Select", up, r, er), b("Select", up, er, r)  # s, 1 - s
        du = b("Mul", b("Add", b("Mul", x2, 3 * 0.044715), 1.0), 2 * _SQRT_2_OVER_PI)
        slope = b("Add", s, b("Mul", b("Mul", x, b("Mul", s, rest)), du))
    else:
        # 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)
        cdf = b("Mul", b("Add", b("Erf", b("Mul", x, 1 / math.sqrt(2))), 1.0), 0.5)
        pdf = b("Mul", b("Exp", b("Mul", b("Mul", x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
        slope = b("Add", cdf, b("Mul", x, pdf))
    return b("Mul", dy, slope)


@expander("FastGeLUGrad", float16_in_float32=True)
def fast_gelu_grad(b: Builder, dy: Value, x: Value) -> Value:
    s = sigmoid(b, b("Mul", x, 1.702))
    # s + 1.702 x s (1 - s)
    return b("Mul", dy, b("Add", s, b("Mul", b("Mul", b("Mul", x, 1.702), s), b("Sub", 1.0, s))))


@expander("ReluGrad")
def relu_grad(b: Builder, dy: Value, y: Value) -> Value:
    return b("Select", b("Greater", y, b.const(0, y)), dy, b.const(0, dy))


@expander("SigmoidGrad", float16_in_float32=True)
def sigmoid_grad(b: Builder, y: Value, dy: Value) -> Value:
    return b("Mul", dy, b("Mul", y, b("Sub", 1.0, y)))


@expander("TanhGrad", float16_in_float32=True)
def tanh_grad(b: Builder, y: Value, dy: Value) -> Value:
    return b("Mul", dy, b("Sub", 1.0, b("Mul", y, y)))


@expander("SqrtGrad", float16_in_float32=True)
def sqrt_grad(b: Builder, y: Value, dy: Value) -> Value:
    return b("RealDiv", b("Mul", dy, 0.5), y)


@expander("RsqrtGrad", float16_in_float32=True)
def rsqrt_grad(b: Builder, y: Value, dy: Value) -> Value:
    return b("Mul", b("Mul", dy, -0.5), b("Mul", b("Mul", y, y), y))


@expander("SoftmaxGrad", float16_in_float32=True)
def softmax_grad(b: Builder, y: Value, dy: Value, axis: Any = -1) -> Value:
    total = b("ReduceSum", b("Mul", dy, y), axis=axis, keep_dims=True)
    return b("Mul", b("Sub", dy, total), y)


@expander("LogSoftmaxGrad", float16_in_float32=True)
def log_softmax_grad(b: Builder, y: Value, dy: Value, axis: Any = -1) -> Value:
    total = b("ReduceSum", dy, axis=axis, keep_dims=True)
    return b("Sub", dy, b("Mul", b("Exp", y), total))


@expander("LayerNormGrad", float16_in_float32=True)
def layer_norm_grad(b: Builder, x: Value, dy: Value, var: Value, mean: Value, gamma: Value,
                    begin_norm_axis: int = 1, begin_params_axis: int = 1,
                    epsilon: float = 1e-7) -> tuple[Value, ...]:
    norm, params = layer_norm_grad_axes(x.tensor_type, {"begin_norm_axis": begin_norm_axis,
                                                        "begin_params_axis": begin_params_axis})
    inv_n = 1.0 / math.prod(x.shape[a] for a in norm)
    rstd = b("Rsqrt", b("Add", var, epsilon))
    xhat = b("Mul", b("Sub", x, mean), rstd)
    dxhat = b("Mul", dy, gamma)
    mean_d = b("Mul", b("ReduceSum", dxhat, axis=norm, keep_dims=True), inv_n)
    mean_dx = b("Mul", b("ReduceSum", b("Mul", dxhat, xhat), axis=norm, keep_dims=True), inv_n)
    dx = b("Mul", b("Sub", b("Sub", dxhat, mean_d), b("Mul", xhat, mean_dx)), rstd)
    dgamma = b("ReduceSum", b("Mul", dy, xhat), axis=params)
    dbeta = b("ReduceSum", dy, axis=params)
    return dx, dgamma, dbeta


@expander("BiasAddGrad", float16_in_float32=True)
def bias_add_grad(b: Builder, dy: Value, data_format: str = "NCHW") -> Value:
    return b("ReduceSum", dy, axis=bias_add_grad_axes(len(dy.shape)))


def _extremum_grad(b: Builder, x1: Value, x2: Value, dy: Value, compare: str
                   ) -> tuple[Value, Value]:
    first = b(compare, x1, x2)
    zero = b.const(0, dy)
    return (_sum_to(b, b("Select", first, dy, zero), x1.shape),
            _sum_to(b, b("Select", first, zero, dy), x2.shape))


@expander("MaximumGrad")
def maximum_grad(b: Builder, x1: Value, x2: Value, dy: Value, grad_x: bool = True,
                 grad_y: bool = True) -> tuple[Value, Value]:
    return _extremum_grad(b, x1, x2, dy, "GreaterEqual")


@expander("MinimumGrad")
def minimum_grad(b: Builder, x1: Value, x2: Value, dy: Value, grad_x: bool = True,
                 grad_y: bool = True) -> tuple[Value, Value]:
    return _extremum_grad(b, x1, x2, dy, "LessEqual")


@expander("DropoutGrad", float16_in_float32=True)
def dropout_grad(b: Builder, dy: Value, mask: Value, keep_prob: float = 0.5) -> Value:
    return b("Mul", b("Mul", dy, mask), 1.0 / keep_prob)


@expander("BatchNormGrad", float16_in_float32=True)
def batch_norm_grad(b: Builder, dy: Value, x: Value, scale: Value, mean: Value, var: Value,
                    reserve: Value, is_training: bool = False, epsilon: float = 1e-5,
                    data_format: str = "NCHW") -> tuple[Value, ...]:
    rank = len(x.shape)
    channel = (x.shape[1],) + (1,) * (rank - 2)
    axes = (0,) + tuple(range(2, rank))

    def per_channel(v: Value) -> Value:
        return v if rank == 2 else b("Reshape", v, shape=channel)
    rstd = b("Rsqrt", b("Add", per_channel(var), epsilon))
    xhat = b("Mul", b("Sub", x, per_channel(mean)), rstd)
    dscale = b("ReduceSum", b("Mul", dy, xhat), axis=axes)
    dbias = b("ReduceSum", dy, axis=axes)
    dxhat = b("Mul", dy, per_channel(scale))
    if is_training:
        inv_n = 1.0 / math.prod(x.shape[a] for a in axes)
        mean_d = b("Mul", b("ReduceSum", dxhat, axis=axes, keep_dims=True), inv_n)
        mean_dx = b("Mul", b("ReduceSum", b("Mul", dxhat, xhat), axis=axes, keep_dims=True),
                    inv_n)
        dx = b("Mul", b("Sub", b("Sub", dxhat, mean_d), b("Mul", xhat, mean_dx)), rstd)
    else:
        dx = b("Mul", dxhat, rstd)
    return dx, dscale, dbias


@expander("SigmoidCrossEntropyWithLogitsGrad", float16_in_float32=True)
def sigmoid_cross_entropy_grad(b: Builder, x: Value, y: Value, dout: Value) -> Value:
    return b("Mul", b("Sub", sigmoid(b, x), y), dout)
