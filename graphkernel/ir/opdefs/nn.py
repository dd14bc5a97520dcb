"""Neural-network primitives, MindSpore's signatures: Conv2D, MaxPool, AvgPool (NCHW), BatchNorm
and Dropout. Convolutions and pools are opaque: their numpy references (im2col + BLAS) run
without a compiler; with one they are generated C (backends/c/c_window.py). BatchNorm is a
composite whose inference form expands into a per-channel scale and shift that fuses."""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, ShapeError
from graphkernel.ir import types as T
from graphkernel.ir.opset import FLOATS, AttrKind, OpDef, PatternKind, Window, declare
from graphkernel.ir.types import TensorType, TupleType, ValueType

# -- window geometry --------------------------------------------------------------------------


def pair(value: Any, what: str, op: str) -> tuple[int, int]:
    """An int, a pair, or MindSpore's 4-tuple (1, 1, h, w) as (h, w)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        out = (int(value), int(value))
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        out = (int(value[0]), int(value[1]))
    elif isinstance(value, (tuple, list)) and len(value) == 4 and tuple(value[:2]) == (1, 1):
        out = (int(value[2]), int(value[3]))
    else:
        raise ShapeError(f"{op}: {what} must be an int, a pair or (1, 1, h, w), got {value!r}")
    if min(out) < 1:
        raise ShapeError(f"{op}: {what} must be positive, got {value!r}")
    return out


def window_padding(size: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int],
                   dilation: tuple[int, int], pad_mode: str, pad: Any, op: str
                   ) -> tuple[tuple[int, int], tuple[int, int]]:
    """((top, bottom), (left, right)) padding for a window op over an (H, W) input."""
    mode = str(pad_mode).lower()
    if mode == "valid":
        pads = (0, 0, 0, 0)
    elif mode == "pad":
        if isinstance(pad, (int, np.integer)):
            pads = (int(pad),) * 4
        elif isinstance(pad, (tuple, list)) and len(pad) == 4:
            pads = tuple(int(p) for p in pad)  # type: ignore[assignment]  # four ints (len checked)
        else:
            raise ShapeError(f"{op}: pad must be an int or (top, bottom, left, right), got "
                             f"{pad!r}")
        if min(pads) < 0:
            raise ShapeError(f"{op}: pad {pad!r} is negative")
    elif mode == "same":
        pads_list = []
        for n, k, s, d in zip(size, kernel, stride, dilation):
            out = -(-n // s)
            need = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
            pads_list += [need // 2, need - need // 2]
        pads = tuple(pads_list)  # type: ignore[assignment]  # four ints
    else:
        raise ShapeError(f"{op}: pad_mode must be 'valid', 'same' or 'pad', got {pad_mode!r}")
    if mode != "pad" and pad not in (0, (0, 0, 0, 0)):
        raise ShapeError(f"{op}: pad={pad!r} needs pad_mode='pad' (got {pad_mode!r})")
    return (pads[0], pads[1]), (pads[2], pads[3])


def window_output(size: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int],
                  dilation: tuple[int, int], pads: tuple[tuple[int, int], tuple[int, int]],
                  op: str, shape: tuple[int, ...]) -> tuple[int, int]:
    out = []
    for n, k, s, d, (lo, hi) in zip(size, kernel, stride, dilation, pads):
        span = (k - 1) * d + 1
        if n + lo + hi < span:
            raise ShapeError(f"{op}: window {kernel} (dilation {dilation}) is larger than the "
                             f"padded input {shape}")
        out.append((n + lo + hi - span) // s + 1)
    return out[0], out[1]


def windows(x: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int],
             dilation: tuple[int, int], out: tuple[int, int]) -> np.ndarray:
    """(N, C, OH, OW, KH, KW) view of every window of a padded NCHW array."""
    span = ((kernel[0] - 1) * dilation[0] + 1, (kernel[1] - 1) * dilation[1] + 1)
    view = np.lib.stride_tricks.sliding_window_view(x, span, axis=(2, 3))
    view = view[:, :, ::stride[0], ::stride[1], ::dilation[0], ::dilation[1]]
    return view[:, :, :out[0], :out[1]]


def wide(x: np.ndarray) -> np.ndarray:
    """float16 computes in float32 (as MindSpore's CPU kernels do), rounded once at the end."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


def _check_nchw(x: TensorType, op: str, data_format: str) -> None:
    if data_format != "NCHW":
        raise ShapeError(f"{op}: only data_format='NCHW' is supported, got {data_format!r}")
    if x.rank != 4:
        raise ShapeError(f"{op}: input must be NCHW (rank 4), got shape {x.shape}")


# -- Conv2D -----------------------------------------------------------------------------------

_CONV_ATTRS = (("out_channel", None), ("kernel_size", None), ("mode", 1), ("pad_mode", "valid"),
               ("pad", 0), ("stride", 1), ("dilation", 1), ("group", 1),
               ("data_format", "NCHW"))
# Sizes given as one int or per axis (MindSpore's 4-tuple pads).
_CONV_KINDS = (("out_channel", AttrKind.COUNT), ("kernel_size", AttrKind.INT_OR_INTS),
               ("pad", AttrKind.INT_OR_INTS), ("stride", AttrKind.INT_OR_INTS),
               ("dilation", AttrKind.INT_OR_INTS))


def conv_geometry(x: TensorType, w: TensorType, attrs: dict[str, Any]) -> dict[str, Any]:
    op = "Conv2D"
    _check_nchw(x, op, attrs["data_format"])
    if attrs["mode"] != 1:
        raise ShapeError(f"{op}: only mode=1 (cross-correlation) is supported")
    if x.dtype != w.dtype:
        raise DTypeError(f"{op}: input ({x.dtype.name}) and weight ({w.dtype.name}) must share "
                         "a dtype")
    group = attrs["group"]
    kernel = pair(attrs["kernel_size"], "kernel_size", op)
    stride = pair(attrs["stride"], "stride", op)
    dilation = pair(attrs["dilation"], "dilation", op)
    n, c, h, wd = x.shape
    o = attrs["out_channel"]
    if w.rank != 4 or w.shape[0] != o or w.shape[2:] != kernel:
        raise ShapeError(f"{op}: weight shape {w.shape} should be (out_channel={o}, "
                         f"in_channel/group, {kernel[0]}, {kernel[1]})")
    if not isinstance(group, int) or group < 1 or c % group or o % group or \
            w.shape[1] != c // group:
        raise ShapeError(f"{op}: group={group!r} must divide in_channel={c} and "
                         f"out_channel={o}, and the weight's axis 1 ({w.shape[1]}) must be "
                         f"in_channel/group")
    pads = window_padding((h, wd), kernel, stride, dilation, attrs["pad_mode"], attrs["pad"], op)
    out = window_output((h, wd), kernel, stride, dilation, pads, op, x.shape)
    return {"kernel": kernel, "stride": stride, "dilation": dilation, "pads": pads, "out": out,
            "group": group}


def _conv_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    x, w = types
    geo = conv_geometry(x, w, attrs)
    return TensorType((x.shape[0], attrs["out_channel"]) + geo["out"], x.dtype)


def conv_columns(win: np.ndarray, group: int) -> np.ndarray:
    """im2col: the (N, C, OH, OW, KH, KW) windows as one (N*OH*OW, C/g*KH*KW) matrix per
    group (a copy), so a convolution and its filter gradient are one BLAS product per group."""
    n, c, oh, ow, kh, kw = win.shape
    cols = win.reshape(n, group, c // group, oh, ow, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6)
    return cols.reshape(group, n * oh * ow, (c // group) * kh * kw)


def _conv_ref(x: np.ndarray, w: np.ndarray, **attrs: Any) -> np.ndarray:
    geo = conv_geometry(TensorType(x.shape, x.dtype), TensorType(w.shape, w.dtype), attrs)
    (t, b), (left, r) = geo["pads"]
    xp = np.pad(wide(x), ((0, 0), (0, 0), (t, b), (left, r)))
    win = windows(xp, geo["kernel"], geo["stride"], geo["dilation"], geo["out"])
    n, c = x.shape[:2]
    g, (oh, ow), (kh, kw) = geo["group"], geo["out"], geo["kernel"]
    o = w.shape[0]
    cols = conv_columns(win, g)
    filters = wide(w).reshape(g, o // g, (c // g) * kh * kw)
    with np.errstate(all="ignore"):
        out = np.matmul(cols, filters.transpose(0, 2, 1))  # (g, N*OH*OW, O/g)
    out = out.reshape(g, n, oh, ow, o // g).transpose(1, 0, 4, 2, 3).reshape(n, o, oh, ow)
    return np.ascontiguousarray(out.astype(x.dtype, copy=False))


# Gradient rules (OpDef.grad): the backprops are opaque primitives (ir/opdefs/nn_grad.py).
def _conv_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    return {name: attrs[name] for name, _ in _CONV_ATTRS}


def _conv_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    x, w = n.inputs
    conv = _conv_attrs(attrs)
    return [b("Conv2DBackpropInput", dy, w, input_size=x.shape, **conv),
            b("Conv2DBackpropFilter", dy, x, filter_size=w.shape, **conv)]


declare(OpDef(name="Conv2D", kind=PatternKind.OPAQUE, inputs=("x", "weight"),
              infer=_conv_infer, reference=_conv_ref, init_attrs=_CONV_ATTRS, accepts=FLOATS,
              attr_kinds=_CONV_KINDS, functional=("conv2d",), grad=_conv_grad,
              window=Window.CONVOLUTION))


# A convolution with an inference BatchNorm folded into its weights (graph_kernel/bn_fold.py):
# conv(x, weight * s) with s = scale / sqrt(variance + epsilon) per output channel, made from
# the parameters on every call (they may change between calls); the shift is the epilogue's.
# The compiler's own op, not callable from the frontend.

def _folded_conv_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    x, w, scale, variance = types
    out = _conv_infer((x, w), attrs)
    for name, p in (("scale", scale), ("variance", variance)):
        if p.shape != (attrs["out_channel"],) or p.dtype != x.dtype:
            raise ShapeError(f"Conv2DFoldedBN: {name} must be ({attrs['out_channel']},) of "
                             f"{x.dtype.name}, got {p.dtype.name}{list(p.shape)}")
    return out


def folded_weight(w: np.ndarray, scale: np.ndarray, variance: np.ndarray,
                  epsilon: float) -> np.ndarray:
    with np.errstate(all="ignore"):
        s = scale / np.sqrt(variance + np.asarray(epsilon, variance.dtype))
        return w * s.reshape(-1, 1, 1, 1)


def _folded_conv_ref(x: np.ndarray, w: np.ndarray, scale: np.ndarray, variance: np.ndarray,
                     epsilon: float = 1e-5, **attrs: Any) -> np.ndarray:
    return _conv_ref(x, folded_weight(w, scale, variance, epsilon), **attrs)


declare(OpDef(name="Conv2DFoldedBN", kind=PatternKind.OPAQUE,
              inputs=("x", "weight", "scale", "variance"), infer=_folded_conv_infer,
              reference=_folded_conv_ref, init_attrs=_CONV_ATTRS + (("epsilon", 1e-5),),
              attr_kinds=_CONV_KINDS, accepts=FLOATS, structural=True, window=Window.CONVOLUTION))


# -- MaxPool and AvgPool ----------------------------------------------------------------------

# pad_mode "pad" takes `pad` as Conv2D does (an int or (top, bottom, left, right)): ONNX's
# explicit pads. A MaxPool's padding never wins a maximum; an AvgPool's is not counted, unless
# count_include_pad (ONNX's and torch's attribute): then every window, which lies inside the
# padded image, divides by its full size.
_POOL_ATTRS = (("kernel_size", 1), ("strides", 1), ("pad_mode", "valid"),
               ("data_format", "NCHW"), ("pad", 0))
_POOL_KINDS = (("kernel_size", AttrKind.INT_OR_INTS), ("strides", AttrKind.INT_OR_INTS),
               ("pad", AttrKind.INT_OR_INTS))
_AVG_POOL_ATTRS = _POOL_ATTRS + (("count_include_pad", False),)
_AVG_POOL_KINDS = _POOL_KINDS + (("count_include_pad", AttrKind.BOOL),)
# Sizes given as one int or per axis (MindSpore's 4-tuple pads).
_CONV_KINDS = (("out_channel", AttrKind.COUNT), ("kernel_size", AttrKind.INT_OR_INTS),
               ("pad", AttrKind.INT_OR_INTS), ("stride", AttrKind.INT_OR_INTS),
               ("dilation", AttrKind.INT_OR_INTS))


def pool_geometry(x: TensorType, attrs: dict[str, Any], op: str) -> dict[str, Any]:
    _check_nchw(x, op, attrs["data_format"])
    kernel = pair(attrs["kernel_size"], "kernel_size", op)
    stride = pair(attrs["strides"], "strides", op)
    mode = str(attrs["pad_mode"]).lower()
    if mode not in ("valid", "same", "pad"):
        raise ShapeError(f"{op}: pad_mode must be 'valid', 'same' or 'pad', got "
                         f"{attrs['pad_mode']!r}")
    pads = window_padding(x.shape[2:], kernel, stride, (1, 1), mode, attrs.get("pad", 0), op)  # type: ignore[arg-type]  # static: dims are ints
    out = window_output(x.shape[2:], kernel, stride, (1, 1), pads, op, x.shape)  # type: ignore[arg-type]  # static: dims are ints
    return {"kernel": kernel, "stride": stride, "pads": pads, "out": out}


def _pool_infer(op: str) -> Any:
    def infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
        (x,) = types
        geo = pool_geometry(x, attrs, op)
        return TensorType(x.shape[:2] + geo["out"], x.dtype)
    return infer


def _max_pool_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    geo = pool_geometry(TensorType(x.shape, x.dtype), attrs, "MaxPool")
    (t, b), (left, r) = geo["pads"]
    fill = -np.inf if T.is_float(x.dtype) else np.iinfo(x.dtype).min
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (left, r)), constant_values=fill)
    win = windows(xp, geo["kernel"], geo["stride"], (1, 1), geo["out"])
    return np.ascontiguousarray(win.max(axis=(4, 5)))


def _avg_pool_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    geo = pool_geometry(TensorType(x.shape, x.dtype), attrs, "AvgPool")
    (t, b), (left, r) = geo["pads"]
    pads = ((0, 0), (0, 0), (t, b), (left, r))
    win = windows(np.pad(wide(x), pads), geo["kernel"], geo["stride"], (1, 1), geo["out"])
    # Padding is not counted (each window averages the input elements it covers), unless
    # count_include_pad: then every window divides by its size.
    ones = np.pad(np.ones((1, 1) + x.shape[2:], np.float32), pads,
                  constant_values=1.0 if attrs.get("count_include_pad") else 0.0)
    count = windows(ones, geo["kernel"], geo["stride"], (1, 1), geo["out"]).sum(axis=(4, 5))
    with np.errstate(all="ignore"):
        out = win.sum(axis=(4, 5)) / count
    return np.ascontiguousarray(out.astype(x.dtype, copy=False))


def _pool_grad(op: str, names: tuple[tuple[str, Any], ...]) -> Any:
    def grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
        pool = {name: attrs[name] for name, _ in names}
        return [b(op, n.inputs[0], n, dy, **pool)]
    return grad


declare(OpDef(name="MaxPool", kind=PatternKind.OPAQUE, inputs=("x",),
              infer=_pool_infer("MaxPool"), reference=_max_pool_ref, init_attrs=_POOL_ATTRS,
              attr_kinds=_POOL_KINDS, accepts=FLOATS, functional=("max_pool2d",),
              grad=_pool_grad("MaxPoolGrad", _POOL_ATTRS), window=Window.POOL))
declare(OpDef(name="AvgPool", kind=PatternKind.OPAQUE, inputs=("x",),
              infer=_pool_infer("AvgPool"), reference=_avg_pool_ref,
              init_attrs=_AVG_POOL_ATTRS, attr_kinds=_AVG_POOL_KINDS, accepts=FLOATS,
              functional=("avg_pool2d",), grad=_pool_grad("AvgPoolGrad", _AVG_POOL_ATTRS),
              window=Window.POOL))


# -- BatchNorm --------------------------------------------------------------------------------

def _batch_norm_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    x, *params = types
    if attrs["data_format"] != "NCHW":
        raise ShapeError(f"BatchNorm: only data_format='NCHW' is supported, got "
                         f"{attrs['data_format']!r}")
    if x.rank not in (2, 4):
        raise ShapeError(f"BatchNorm: input must be (N, C) or (N, C, H, W), got {x.shape}")
    c = x.shape[1]
    for name, p in zip(("scale", "bias", "mean", "variance"), params):
        if p.shape != (c,):
            raise ShapeError(f"BatchNorm: {name} has shape {p.shape}, expected ({c},) for input "
                             f"{x.shape}")
        if p.dtype != T.float32 and p.dtype != x.dtype:
            raise DTypeError(f"BatchNorm: {name} must be float32 or the input's dtype, got "
                             f"{p.dtype.name}")
    stat = TensorType((c,), params[2].dtype)
    return TupleType((x, stat, stat, stat, stat))


def batch_norm_axes(rank: int) -> tuple[int, ...]:
    return (0,) if rank == 2 else (0, 2, 3)


def _batch_norm_ref(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray,
                    variance: np.ndarray, is_training: bool = False, epsilon: float = 1e-5,
                    momentum: float = 0.1, data_format: str = "NCHW") -> tuple[np.ndarray, ...]:
    """Outputs as MindSpore's: y, then the batch mean and variance (training) or the given
    mean and variance (inference), twice (MindSpore's reserve spaces)."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    wide = x.astype(np.float64)
    if is_training:
        axes = batch_norm_axes(x.ndim)
        m = wide.mean(axis=axes)
        v = wide.var(axis=axes)
    else:
        m, v = mean.astype(np.float64), variance.astype(np.float64)
    with np.errstate(all="ignore"):
        inv = scale.astype(np.float64) / np.sqrt(v + epsilon)
        y = (wide - m.reshape(shape)) * inv.reshape(shape) + bias.astype(np.float64).reshape(shape)
    stat_dtype = mean.dtype
    m, v = m.astype(stat_dtype), v.astype(stat_dtype)
    return y.astype(x.dtype), m, v, m.copy(), v.copy()


def _batch_norm_grad(b: Any, n: Any, dout: tuple[Any, ...], attrs: dict[str, Any]
                     ) -> list[Any]:
    """BatchNormGrad (a gradient composite that fuses) for y; in training the batch mean and
    variance outputs, when something differentiated reads them, add d mean / dx = 1/M and
    d var / dx = 2 (x - mean) / M; in inference they are the mean and variance inputs, and y
    depends on those too."""
    x, scale, _, mean_in, var_in = n.inputs
    dy, *dstats = dout
    training, eps = attrs["is_training"], attrs["epsilon"]
    mean, var = (b.item(n, 1), b.item(n, 2)) if training else (mean_in, var_in)
    dy = dy if dy is not None else b.zeros(x.tensor_type)
    dx, dscale, dbias = b.items(b("BatchNormGrad", dy, x, scale, mean, var, var,
                                  is_training=training, epsilon=eps,
                                  data_format=attrs["data_format"]))
    dmean = _total(b, [d for d in (dstats[0], dstats[2]) if d is not None])
    dvar = _total(b, [d for d in (dstats[1], dstats[3]) if d is not None])
    rank = len(x.shape)
    axes = batch_norm_axes(rank)
    channel = (x.shape[1],) + (1,) * (rank - 2)

    def per_channel(v: Any) -> Any:
        return b("Reshape", b.cast(v, x.dtype), shape=channel)
    if training:
        inv_m = 1.0 / max(1, int(np.prod([x.shape[a] for a in axes])))
        if dmean is not None:
            dx = b("Add", dx, b("Mul", per_channel(dmean), inv_m))
        if dvar is not None:
            centred = b("Sub", x, per_channel(mean))
            dx = b("Add", dx, b("Mul", b("Mul", centred, per_channel(dvar)), 2 * inv_m))
        return [dx, dscale, dbias, None, None]
    # Inference: y = (x - mean) * scale * rstd + bias, rstd = (var + eps)^-1/2.
    rstd = b("Rsqrt", b("Add", per_channel(var_in), eps))
    dxhat = b("Mul", dy, per_channel(scale))
    g_mean = b("Neg", b("ReduceSum", b("Mul", dxhat, rstd), axis=axes))
    centred = b("Sub", x, per_channel(mean_in))
    cube = b("Mul", b("Mul", rstd, rstd), rstd)
    g_var = b("Mul", b("ReduceSum", b("Mul", b("Mul", dxhat, centred), cube), axis=axes), -0.5)
    g_mean = g_mean if dmean is None else b("Add", g_mean, b.cast(dmean, g_mean.dtype))
    g_var = g_var if dvar is None else b("Add", g_var, b.cast(dvar, g_var.dtype))
    return [dx, dscale, dbias, b.cast(g_mean, mean_in.dtype), b.cast(g_var, var_in.dtype)]


def _total(b: Any, terms: list[Any]) -> Any:
    total = terms[0] if terms else None
    for term in terms[1:]:
        total = b("Add", total, term)
    return total


declare(OpDef(name="BatchNorm", kind=PatternKind.OPAQUE,
              inputs=("x", "scale", "bias", "mean", "variance"), infer=_batch_norm_infer,
              reference=_batch_norm_ref, accepts=FLOATS, composite=True,
              init_attrs=(("is_training", False), ("epsilon", 1e-5), ("momentum", 0.1),
                          ("data_format", "NCHW")),
              functional=("batch_norm",), grad=_batch_norm_grad))


# -- Dropout ----------------------------------------------------------------------------------

_generators: dict[tuple[int, int], np.random.Generator] = {}
_generators_lock = threading.Lock()


def _generator(seed0: int, seed1: int) -> np.random.Generator:
    """One stream per (Seed0, Seed1), advancing with every call; (0, 0) is seeded from the OS."""
    with _generators_lock:
        key = (int(seed0), int(seed1))
        if key not in _generators:
            _generators[key] = np.random.default_rng(None if key == (0, 0) else list(key))
        return _generators[key]


def _dropout_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    keep = attrs["keep_prob"]
    if not isinstance(keep, (int, float)) or not 0 < keep <= 1:
        raise ShapeError(f"Dropout: keep_prob must be in (0, 1], got {keep!r}")
    return TupleType((x, x))


def _dropout_ref(x: np.ndarray, keep_prob: float = 0.5, Seed0: int = 0,  # noqa: N803
                 Seed1: int = 0) -> tuple[np.ndarray, np.ndarray]:  # noqa: N803 (MindSpore's)
    keep = _generator(Seed0, Seed1).random(x.shape) < keep_prob
    mask = keep.astype(x.dtype)
    with np.errstate(all="ignore"):
        out = (x * mask / np.asarray(keep_prob, x.dtype)).astype(x.dtype)
    return out, mask


def _dropout_grad(b: Any, n: Any, dout: tuple[Any, ...], attrs: dict[str, Any]) -> list[Any]:
    """The mask the forward drew (its second output), not a new draw."""
    dy = dout[0]
    if dy is None:
        return [None]
    return [b("DropoutGrad", dy, b.item(n, 1), keep_prob=attrs["keep_prob"])]


declare(OpDef(name="Dropout", kind=PatternKind.OPAQUE, inputs=("x",), infer=_dropout_infer,
              reference=_dropout_ref, accepts=FLOATS, stateful=True,
              init_attrs=(("keep_prob", 0.5), ("Seed0", 0), ("Seed1", 0)),
              functional=("dropout",), grad=_dropout_grad))
