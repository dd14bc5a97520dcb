"""Expanders of the gradient composites (ir/opdefs/grad.py): MindSpore's GeLUGrad, SoftmaxGrad,
LayerNormGrad, ... written in basic ops, so a backward graph fuses as a forward one does.

Those that compute (not only select) compute float16 inputs in float32 and round once, as the
forward LayerNorm and Softmax do and as their numpy references do: rounding after each basic op
put float16 LayerNormGrad several ulp away from its unfused result."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from graphkernel.graph_kernel.expanders import Builder, expander, sigmoid
from graphkernel.graph_kernel.lower import FORM_NOTE
from graphkernel.ir import types as T
from graphkernel.ir.graph import Node, Value
from graphkernel.ir.opdefs.grad import bias_add_grad_axes, layer_norm_grad_axes
from graphkernel.ir.opdefs.nn import conv_geometry
from graphkernel.ir.types import TensorType

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
    """Two sums per channel, dbias = sum(dy) and dscale = sum(dy * xhat), then dx from them:
    the training form's mean of dy * scale and of dy * scale * xhat are those two sums times
    scale / n, so the fused kernel keeps two accumulators per channel, not four (its passes
    over 7x7 to 28x28 maps ran 25-45% faster for it). The sums are kept as (1, C, 1, ...), so
    that the pass computing dx reads them in the same kernel (summed as (C,) and reshaped,
    the cluster split them into three kernels); dscale and dbias are views of them. rstd and
    scale * rstd are used per element only, so they stay in that kernel too."""
    rank = len(x.shape)
    channel = (x.shape[1],) + (1,) * (rank - 2)
    axes = (0,) + tuple(range(2, rank))

    def per_channel(v: Value) -> Value:
        return v if rank == 2 else b("Reshape", v, shape=channel)
    rstd = b("Rsqrt", b("Add", per_channel(var), epsilon))
    xhat = b("Mul", b("Sub", x, per_channel(mean)), rstd)
    sum_dy = b("ReduceSum", dy, axis=axes, keep_dims=True)
    sum_dy_xhat = b("ReduceSum", b("Mul", dy, xhat), axis=axes, keep_dims=True)
    dbias, dscale = (b("Reshape", v, shape=(x.shape[1],)) for v in (sum_dy, sum_dy_xhat))
    k = b("Mul", per_channel(scale), rstd)
    if is_training:
        inv_n = 1.0 / math.prod(x.shape[a] for a in axes)
        # dx = scale rstd (dy - dbias / n - xhat dscale / n)
        inner = b("Sub", b("Sub", dy, b("Mul", sum_dy, inv_n)),
                  b("Mul", xhat, b("Mul", sum_dy_xhat, inv_n)))
        dx = b("Mul", inner, k)
    else:
        dx = b("Mul", dy, k)
    return dx, dscale, dbias


@expander("SigmoidCrossEntropyWithLogitsGrad", float16_in_float32=True)
def sigmoid_cross_entropy_grad(b: Builder, x: Value, y: Value, dout: Value) -> Value:
    return b("Mul", b("Sub", sigmoid(b, x), y), dout)


# -- convolution gradients as convolutions and products ---------------------------------------
# Conv2DBackpropInput and Conv2DBackpropFilter run their numpy references (im2col, BLAS, a
# scatter of windows) on the Python runner, about half of a ResNet-50 training step. Written as
# forward convolutions (and, for a 1x1 filter's gradient, a product), they run as the generated
# window kernels (backends/c/c_window.py) and BLAS. Where no such form is written (a grouped
# kernel's filter gradient, a dynamic size) the op stays, its reference (`when=`).

def _static(node: Node) -> bool:
    """Every size of the node's operands and result known (the forms below are built from
    them)."""
    return all(isinstance(d, int) for v in (*node.inputs, node) for d in v.shape)


def _ungrouped_static(node: Node) -> bool:
    return _static(node) and node.attrs.get("group", 1) == 1


def _conv_geo(x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: Any,
              attrs: dict[str, Any]) -> dict[str, Any]:
    return conv_geometry(TensorType(x_shape, dtype), TensorType(w_shape, dtype), attrs)


@dataclass(frozen=True)
class _PhaseAxis:
    """One axis of one stride phase of a backprop-input: input rows h = s*m + rho (m < M)
    are a stride-1 convolution of dout[begin:end] (padded by pads) with the kernel taps that
    reach them (`taps`, ascending; none: the rows get no gradient), flipped, at `dilation`."""

    taps: tuple[int, ...]
    step: int  # between taps: every tap i = taps[0] (mod step) in [0, kernel) is one
    dilation: int
    begin: int
    end: int
    pads: tuple[int, int]


def _phase_axis(size: int, out: int, kernel: int, stride: int, dilation: int, pad: int,
                rho: int) -> _PhaseAxis:
    """Padded row h + pad = s*q + r (q = m + c) receives dout[q - e_i] * w[i] from each tap i
    with i*d = r (mod s), e_i = (i*d - r) / s. Flipped (tap j' of J: i_{J-1-j'}), that is
    dout[m + c - e_last + j' * delta]: a convolution with top pad e_last - c over dout."""
    rows = -(-size // stride)
    r, c = (rho + pad) % stride, (rho + pad) // stride
    taps = tuple(i for i in range(kernel) if (i * dilation - r) % stride == 0)
    if not taps:
        return _PhaseAxis((), 1, 1, 0, 0, (0, 0))
    step = stride // math.gcd(stride, dilation)
    delta = step * dilation // stride
    top = (taps[-1] * dilation - r) // stride - c
    begin = max(0, -top)
    top = max(0, top)
    bottom = rows + delta * (len(taps) - 1) - top - (out - begin)
    end = out + min(0, bottom)
    if end <= begin:  # the taps reach only padding: no gradient
        return _PhaseAxis((), 1, 1, 0, 0, (0, 0))
    return _PhaseAxis(taps, step, delta, begin, end, (top, max(0, bottom)))


# A 1x1 input gradient (stride 1, no padding, ungrouped) on a map of at most this many pixels
# is a product, W^T (C, O) times each image's dout (O, pixels), one BLAS call per image; larger
# maps keep the forward window kernel. ResNet-50's 1x1 layers at batch 4, one thread, process
# CPU, window kernel / product, min of 3 alternating rounds (s8-trainstep dx1x1.py): 7x7 maps
# 1.65 (a 512->2048 layer: 8.0 against 4.9 ms) and 1.38; 14x14 0.94 and 1.06; 28x28 0.94 and
# 1.01; 56x56 0.82-1.01. Only the few-pixel maps, where the window kernel's pixel blocks
# cover the whole image (c_conv_units.FLAT_PIXELS) and reuse each weight vector least, go to BLAS.
DX_PRODUCT_MAX_PIXELS = 64


@expander("Conv2DBackpropInput", when=_static)
def conv_backprop_input(b: Builder, dout: Value, w: Value, input_size: Any,
                        **attrs: Any) -> Value:
    """dx as stride-1 forward convolutions of dout with the flipped, transposed weights, one
    per stride phase (s*s of them), the phases interleaved: no scatter, and each input element
    is one convolution's output, rounded once (float16 too). A 1x1 kernel of stride 1 without
    padding on a small map is a product instead (DX_PRODUCT_MAX_PIXELS)."""
    shape = tuple(input_size)
    geo = _conv_geo(shape, w.shape, w.dtype, attrs)
    n, c, h, wd = shape
    o, g = w.shape[0], geo["group"]
    (pt, pb), (pl, pr) = geo["pads"]
    (kh, kw), (sh, sw), (dh, dw) = geo["kernel"], geo["stride"], geo["dilation"]
    oh, ow = geo["out"]
    if (kh, kw, sh, sw, pt, pb, pl, pr, g) == (1, 1, 1, 1, 0, 0, 0, 0, 1) and \
            h * wd <= DX_PRODUCT_MAX_PIXELS:
        return _pointwise_input_product(b, dout, w, shape)
    mh, mw = -(-h // sh), -(-wd // sw)
    axes_h = _shared_geometry([_phase_axis(h, oh, kh, sh, dh, pt, rh) for rh in range(sh)],
                              oh, mh)
    axes_w = _shared_geometry([_phase_axis(wd, ow, kw, sw, dw, pl, rw) for rw in range(sw)],
                              ow, mw)
    rows = []
    for ah, (lead_h, trail_h) in axes_h:
        cols = []
        for aw, (lead_w, trail_w) in axes_w:
            if not ah.taps or not aw.taps:
                cols.append(b("BroadcastTo", b.const(0, dout), shape=(n, c, mh, mw)))
                continue
            cols.append(_phase_conv(b, dout, w, ah, aw, c, o, g,
                                    (lead_h, trail_h, lead_w, trail_w)))
        rows.append(cols[0] if sw == 1 else _stack(b, cols, 4))
    if sh == 1 and sw == 1:
        return rows[0]
    full = _stack(b, rows, 3) if sh > 1 else rows[0]  # (N, C, Mh, [sh,] Mw, [sw])
    full = b("Reshape", full, shape=(n, c, mh * sh, mw * sw))
    if (mh * sh, mw * sw) == (h, wd):
        return full
    return b("StridedSlice", full, begin=(0, 0, 0, 0), end=(n, c, h, wd), strides=(1, 1, 1, 1))


def _stack(b: Builder, parts: list[Value], axis: int) -> Value:
    """Stack as a Concat of the parts with a unit axis inserted: a Concat fuses with the
    Reshape after it or runs as a generated kernel, where a lone Stack stayed a numpy step
    and kept the training step off the compiled entry (backends/c/c_entry.py)."""
    shape = tuple(parts[0].shape)
    unit = shape[:axis] + (1,) + shape[axis:]
    return b("Concat", *(b("Reshape", p, shape=unit) for p in parts), axis=axis)


def _pointwise_input_product(b: Builder, dout: Value, w: Value, shape: tuple[int, ...]
                             ) -> Value:
    """dx of a 1x1 convolution of stride 1 without padding: per image W^T (C, O) times dout
    (O, pixels), one BLAS call each; float16 in float32, rounded once, as the reference."""
    n, c, h, wd = shape
    o, want = w.shape[0], w.dtype
    if want == T.float16:
        dout, w = b("Cast", dout, dtype=T.float32), b("Cast", w, dtype=T.float32)
    dx = b("BatchMatMul", b("Reshape", w, shape=(o, c)),
           b("Reshape", dout, shape=(n, o, h * wd)), transpose_a=True, transpose_b=False)
    assert isinstance(dx, Node)
    dx.notes[FORM_NOTE] = (f"a 1x1 input gradient on {h}x{wd} pixels (at most "
                           f"{DX_PRODUCT_MAX_PIXELS}) as a product: faster than the window "
                           "kernel there")
    dx = b("Reshape", dx, shape=shape)
    return b("Cast", dx, dtype=want) if want != dx.dtype else dx


def _shared_geometry(axes: list[_PhaseAxis], out: int, rows: int
                     ) -> list[tuple[_PhaseAxis, tuple[int, int]]]:
    """The phases of one axis as one geometry where they can be: each phase's taps padded
    with zero taps (before, after) to a common window of dout rows, so that every phase's
    convolution reads the same rows at the same pads and the phases share one compiled
    kernel (a 3x3 of stride 2 had four distinct kernels, 1x1, 1x2, 2x1 and 2x2, per layer:
    ~0.3-0.8 s of gcc each). Phase rho's output row m reads dout[m + begin - top + j*dilation]
    for tap j; the common window starts at the lowest such first row. Where the phases' first
    rows are not on one grid of the dilation (a dilation prime to the stride) they keep their
    own geometry (no zero taps)."""
    live = [a for a in axes if a.taps]
    firsts = {a.begin - a.pads[0] for a in live}
    dilations = {a.dilation for a in live}
    if len(live) < 2 or len(dilations) != 1:
        return [(a, (0, 0)) for a in axes]
    delta = dilations.pop()
    lo = min(firsts)
    if any((f - lo) % delta for f in firsts):
        return [(a, (0, 0)) for a in axes]
    taps = max((a.begin - a.pads[0] - lo) // delta + len(a.taps) for a in live)
    begin = max(0, lo)
    end = min(out, rows + lo + (taps - 1) * delta)
    top = begin - lo
    pads = (top, rows + (taps - 1) * delta - top - (end - begin))
    shared = []
    for a in axes:
        if not a.taps:
            shared.append((a, (0, 0)))
            continue
        lead = (a.begin - a.pads[0] - lo) // delta
        shared.append((_PhaseAxis(a.taps, a.step, delta, begin, end, pads),
                       (lead, taps - lead - len(a.taps))))
    return shared


def _phase_conv(b: Builder, dout: Value, w: Value, ah: _PhaseAxis, aw: _PhaseAxis, c: int,
                o: int, g: int, zero_taps: tuple[int, int, int, int] = (0, 0, 0, 0)) -> Value:
    """One stride phase's convolution: the taps of w that reach it, flipped (a negative stride,
    from the last tap down), as (C, O/g) filters per group, with `zero_taps` (before and
    after, rows then columns) of zeros around them (_shared_geometry)."""
    n, _, oh, ow = dout.shape
    jh, jw = len(ah.taps), len(aw.taps)
    # From the last tap down to the first (the first is below `step`: the end is open).
    flipped = b("StridedSlice", w, begin=(0, 0, ah.taps[-1], aw.taps[-1]),
                end=(o, c // g, 0, 0), strides=(1, 1, -ah.step, -aw.step), end_mask=0b1100)
    filters = b("Reshape", flipped, shape=(g, o // g, c // g, jh, jw))
    filters = b("Transpose", filters, perm=(0, 2, 1, 3, 4))
    filters = b("Reshape", filters, shape=(c, o // g, jh, jw))
    for axis, (before, after) in ((2, zero_taps[:2]), (3, zero_taps[2:])):
        if before or after:
            shape = list(filters.shape)
            parts = []
            for count, part in ((before, None), (0, filters), (after, None)):
                if part is not None:
                    parts.append(part)
                elif count:
                    shape[axis] = count
                    parts.append(b("BroadcastTo", b.const(0, filters), shape=tuple(shape)))
            filters = b("Concat", *parts, axis=axis)
    jh, jw = filters.shape[2], filters.shape[3]
    part = dout
    if (ah.begin, ah.end, aw.begin, aw.end) != (0, oh, 0, ow):
        part = b("StridedSlice", dout, begin=(0, 0, ah.begin, aw.begin),
                 end=(n, o, ah.end, aw.end), strides=(1, 1, 1, 1))
    return b("Conv2D", part, filters, out_channel=c, kernel_size=(jh, jw), mode=1,
             pad_mode="pad", pad=ah.pads + aw.pads, stride=1,
             dilation=(ah.dilation, aw.dilation), group=g, data_format="NCHW")


@expander("Conv2DBackpropFilter", when=_ungrouped_static)
def conv_backprop_filter(b: Builder, dout: Value, x: Value, filter_size: Any,
                         **attrs: Any) -> Value:
    """dw of an ungrouped convolution: for a 1x1 kernel without padding a product of dout
    with the (strided) input, per image summed over the batch or, where the (O, C) results
    outweigh the operands, one product over batch and pixels; else a forward convolution with
    batch and channels swapped (the input's channels as images, dout's as filters whose taps
    are its pixels, at dilation = the stride), computed in float32 for float16 and rounded
    once, as the reference."""
    shape = tuple(filter_size)
    geo = _conv_geo(x.shape, shape, x.dtype, attrs)
    n, c, h, wd = x.shape
    o, oh, ow = dout.shape[1], dout.shape[2], dout.shape[3]
    (pt, pb), (pl, pr) = geo["pads"]
    (kh, kw), (sh, sw), (dh, dw) = geo["kernel"], geo["stride"], geo["dilation"]
    want = x.dtype
    if want == T.float16:
        dout, x = b("Cast", dout, dtype=T.float32), b("Cast", x, dtype=T.float32)
    if (kh, kw) == (1, 1) and (pt, pb, pl, pr) == (0, 0, 0, 0):
        if (sh, sw) != (1, 1):
            x = b("StridedSlice", x, begin=(0, 0, 0, 0),
                  end=(n, c, sh * (oh - 1) + 1, sw * (ow - 1) + 1), strides=(1, 1, sh, sw))
        pixels = oh * ow
        if o * c <= pixels * (o + c):  # the per-image results are the smaller sum
            per_image = b("BatchMatMul", b("Reshape", dout, shape=(n, o, pixels)),
                          b("Reshape", x, shape=(n, c, pixels)), transpose_a=False,
                          transpose_b=True)
            dw = b("ReduceSum", per_image, axis=(0,), keep_dims=False)
        else:  # few pixels (a 7x7 map): both operands with the batch inside, one product
            rows = [b("Reshape", b("Transpose", b("Reshape", v, shape=(n, v.shape[1], pixels)),
                                   perm=(1, 0, 2)), shape=(v.shape[1], n * pixels))
                    for v in (dout, x)]
            dw = b("MatMul", rows[0], rows[1], transpose_a=False, transpose_b=True)
        dw = b("Reshape", dw, shape=shape)
    else:
        # Only the input rows and columns some window reads: past them the swapped
        # convolution would compute taps beyond the kernel (a 4x4 for a 3x3 of stride 2).
        reach_h = sh * (oh - 1) + dh * (kh - 1) + 1 - pt
        reach_w = sw * (ow - 1) + dw * (kw - 1) + 1 - pl
        if reach_h < h or reach_w < wd:
            x = b("StridedSlice", x, begin=(0, 0, 0, 0),
                  end=(n, c, min(h, reach_h), min(wd, reach_w)), strides=(1, 1, 1, 1))
        pads = (pt, max(0, reach_h - h), pl, max(0, reach_w - wd))
        swapped = b("Conv2D", b("Transpose", x, perm=(1, 0, 2, 3)),
                    b("Transpose", dout, perm=(1, 0, 2, 3)), out_channel=o,
                    kernel_size=(oh, ow), mode=1, pad_mode="pad", pad=pads,
                    stride=(dh, dw), dilation=(sh, sw), group=1, data_format="NCHW")
        dw = b("Transpose", swapped, perm=(1, 0, 2, 3))
    return b("Cast", dw, dtype=want) if dw.dtype != want else dw
