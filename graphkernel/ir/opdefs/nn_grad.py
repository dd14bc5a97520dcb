"""The opaque halves of the network ops' gradients, MindSpore's names and signatures: a
convolution's backprop to its input and to its filter (im2col + BLAS through numpy, the
forward's columns reused), the pools' backprops, and UnsortedSegmentSum (an embedding lookup's
gradient: rows scatter-added into the table's shape). The gradient rules that call them are
declared with their forward ops (ir/opdefs/nn.py, ir/opdefs/array.py); they are data movement
or BLAS, so they run as numpy kernels between fused kernels, and the elementwise work around
them (bias, BatchNorm, ReLU gradients) fuses as usual. With fusion on, the expand stage writes
the convolution's backprops as forward convolutions and products instead (generated window
kernels and BLAS, graph_kernel/grad_expanders.py); the references here stay the definition they
are checked against, and what runs where no such form is written (a grouped kernel's filter
gradient, a dynamic size) or fusion is off; a grouped filter gradient has a generated kernel
of its own (backends/c/c_filter_grad.py)."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, ShapeError
from graphkernel.ir.opdefs.array import INDEX_DTYPES, strided_slice_index
from graphkernel.ir.opdefs.grad import GRAD_OPS
from graphkernel.ir.opdefs.nn import (
    _AVG_POOL_ATTRS,
    _AVG_POOL_KINDS,
    _CONV_ATTRS,
    _CONV_KINDS,
    _POOL_ATTRS,
    _POOL_KINDS,
    conv_columns,
    conv_geometry,
    pool_geometry,
    wide,
    windows,
)
from graphkernel.ir.opset import (
    FLOATS,
    NUMBERS,
    AttrKind,
    OpDef,
    PatternKind,
    Window,
    declare,
    int_tuple_kinds,
)
from graphkernel.ir.types import TensorType, ValueType


def _shape_attr(value: Any, what: str, op: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(
            isinstance(d, (int, np.integer)) and d >= 0 for d in value):
        raise ShapeError(f"{op}: {what} must be a tuple of non-negative ints, got {value!r}")
    return tuple(int(d) for d in value)


def _scatter_windows(target: np.ndarray, pieces: Any, kernel: tuple[int, int],
                     stride: tuple[int, int], dilation: tuple[int, int],
                     out: tuple[int, int]) -> None:
    """col2im: add pieces(i, j), an (N, C, OH, OW) array, to the padded input positions that
    window offset (i, j) read."""
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            top, left = i * dilation[0], j * dilation[1]
            target[:, :, top:top + stride[0] * (out[0] - 1) + 1:stride[0],
                   left:left + stride[1] * (out[1] - 1) + 1:stride[1]] += pieces(i, j)


def _crop(xp: np.ndarray, pads: Any, shape: tuple[int, ...]) -> np.ndarray:
    (t, _), (left, _) = pads
    return xp[:, :, t:t + shape[2], left:left + shape[3]]


def _dout_by_group(dout: np.ndarray, group: int) -> np.ndarray:
    """(N, O, OH, OW) -> (g, N*OH*OW, O/g), the layout of the forward's product."""
    n, o, oh, ow = dout.shape
    return dout.reshape(n, group, o // group, oh, ow).transpose(1, 0, 3, 4, 2).reshape(
        group, n * oh * ow, o // group)


def _conv_backprop_input_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]
                               ) -> ValueType:
    dout, w = types
    shape = _shape_attr(attrs["input_size"], "input_size", "Conv2DBackpropInput")
    geo = conv_geometry(TensorType(shape, w.dtype), w, attrs)
    if dout.shape != (shape[0], w.shape[0]) + geo["out"] or dout.dtype != w.dtype:
        raise ShapeError(f"Conv2DBackpropInput: dout {dout.dtype.name}{list(dout.shape)} does "
                         f"not fit input_size {shape} and weight {w.shape}")
    return TensorType(shape, w.dtype)


def _conv_backprop_input_ref(dout: np.ndarray, w: np.ndarray, input_size: Any,
                             **attrs: Any) -> np.ndarray:
    shape = tuple(input_size)
    geo = conv_geometry(TensorType(shape, w.dtype), TensorType(w.shape, w.dtype), attrs)
    g, (kh, kw), (oh, ow) = geo["group"], geo["kernel"], geo["out"]
    n, c = shape[:2]
    o = w.shape[0]
    filters = wide(w).reshape(g, o // g, (c // g) * kh * kw)
    with np.errstate(all="ignore"):
        cols = np.matmul(_dout_by_group(wide(dout), g), filters)  # (g, N*OH*OW, C/g*KH*KW)
    cols = cols.reshape(g, n, oh, ow, c // g, kh, kw).transpose(1, 0, 4, 5, 6, 2, 3)
    cols = cols.reshape(n, c, kh, kw, oh, ow)
    (t, b), (left, r) = geo["pads"]
    xp = np.zeros((n, c, shape[2] + t + b, shape[3] + left + r), cols.dtype)
    _scatter_windows(xp, lambda i, j: cols[:, :, i, j], geo["kernel"], geo["stride"],
                     geo["dilation"], geo["out"])
    return np.ascontiguousarray(_crop(xp, geo["pads"], shape).astype(w.dtype, copy=False))


def _conv_backprop_filter_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]
                                ) -> ValueType:
    dout, x = types
    shape = _shape_attr(attrs["filter_size"], "filter_size", "Conv2DBackpropFilter")
    geo = conv_geometry(x, TensorType(shape, x.dtype), attrs)
    if dout.shape != (x.shape[0], shape[0]) + geo["out"] or dout.dtype != x.dtype:
        raise ShapeError(f"Conv2DBackpropFilter: dout {dout.dtype.name}{list(dout.shape)} "
                         f"does not fit input {x.shape} and filter_size {shape}")
    return TensorType(shape, x.dtype)


def _conv_backprop_filter_ref(dout: np.ndarray, x: np.ndarray, filter_size: Any,
                              **attrs: Any) -> np.ndarray:
    shape = tuple(filter_size)
    geo = conv_geometry(TensorType(x.shape, x.dtype), TensorType(shape, x.dtype), attrs)
    (t, b), (left, r) = geo["pads"]
    xp = np.pad(wide(x), ((0, 0), (0, 0), (t, b), (left, r)))
    cols = conv_columns(windows(xp, geo["kernel"], geo["stride"], geo["dilation"], geo["out"]),
                        geo["group"])
    with np.errstate(all="ignore"):
        dw = np.matmul(_dout_by_group(wide(dout), geo["group"]).transpose(0, 2, 1), cols)
    return np.ascontiguousarray(dw.reshape(shape).astype(x.dtype, copy=False))


# Composite: graph_kernel/grad_expanders.py expands the static ones into forward convolutions
# and products (`--disable_expand_ops` can name them); the rest run their references.
_BACKPROP: dict[str, Any] = dict(kind=PatternKind.OPAQUE, accepts=FLOATS, init_attrs=_CONV_ATTRS,
                                 composite=True)
declare(OpDef(name="Conv2DBackpropInput", inputs=("dout", "weight"),
              infer=_conv_backprop_input_infer, reference=_conv_backprop_input_ref,
              call_attrs=(("input_size", None),),
              attr_kinds=_CONV_KINDS + int_tuple_kinds("input_size"),
              **_BACKPROP))
declare(OpDef(name="Conv2DBackpropFilter", inputs=("dout", "x"),
              infer=_conv_backprop_filter_infer, reference=_conv_backprop_filter_ref,
              call_attrs=(("filter_size", None),),
              attr_kinds=_CONV_KINDS + int_tuple_kinds("filter_size"),
              window=Window.FILTER_GRAD, **_BACKPROP))


# -- pools ------------------------------------------------------------------------------------

def _pool_grad_infer(op: str) -> Any:
    def infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
        x, out, dout = types
        geo = pool_geometry(x, attrs, op)
        want = x.shape[:2] + geo["out"]
        if out.shape != want or dout.shape != want:
            raise ShapeError(f"{op}: output {out.shape} and its gradient {dout.shape} should "
                             f"be {want} for input {x.shape}")
        return x
    return infer


def _max_pool_grad_ref(x: np.ndarray, out: np.ndarray, dout: np.ndarray,
                       **attrs: Any) -> np.ndarray:
    """Each window's gradient goes to its first maximum (row-major), as MindSpore and
    PyTorch do; the maximum is recomputed from x, so it is the very element the forward took."""
    geo = pool_geometry(TensorType(x.shape, x.dtype), attrs, "MaxPoolGrad")
    (t, b), (left, r) = geo["pads"]
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (left, r)), constant_values=-np.inf)
    win = windows(xp, geo["kernel"], geo["stride"], (1, 1), geo["out"])
    top = win.max(axis=(4, 5))
    taken = np.zeros(top.shape, bool)
    grad = wide(dout)
    picks = {}
    for i in range(geo["kernel"][0]):
        for j in range(geo["kernel"][1]):
            hit = (win[..., i, j] == top) & ~taken
            taken |= hit
            picks[i, j] = np.where(hit, grad, 0)
    dxp = np.zeros(xp.shape, grad.dtype)
    _scatter_windows(dxp, lambda i, j: picks[i, j], geo["kernel"], geo["stride"], (1, 1),
                     geo["out"])
    return np.ascontiguousarray(_crop(dxp, geo["pads"], x.shape).astype(x.dtype, copy=False))


def _avg_pool_grad_ref(x: np.ndarray, out: np.ndarray, dout: np.ndarray,
                       **attrs: Any) -> np.ndarray:
    """Each window's gradient spread evenly over the input elements it covers (padding is
    not counted unless count_include_pad, as in the forward)."""
    geo = pool_geometry(TensorType(x.shape, x.dtype), attrs, "AvgPoolGrad")
    (t, b), (left, r) = geo["pads"]
    pads = ((0, 0), (0, 0), (t, b), (left, r))
    ones = np.pad(np.ones((1, 1) + x.shape[2:], np.float64), pads,
                  constant_values=1.0 if attrs.get("count_include_pad") else 0.0)
    count = windows(ones, geo["kernel"], geo["stride"], (1, 1), geo["out"]).sum(axis=(4, 5))
    share = wide(dout) / count.astype(wide(dout).dtype)
    dxp = np.zeros((x.shape[0], x.shape[1]) + ones.shape[2:], share.dtype)
    _scatter_windows(dxp, lambda i, j: share, geo["kernel"], geo["stride"], (1, 1), geo["out"])
    return np.ascontiguousarray(_crop(dxp, geo["pads"], x.shape).astype(x.dtype, copy=False))


for _name, _ref, _attrs, _kinds in (
        ("MaxPoolGrad", _max_pool_grad_ref, _POOL_ATTRS, _POOL_KINDS),
        ("AvgPoolGrad", _avg_pool_grad_ref, _AVG_POOL_ATTRS, _AVG_POOL_KINDS)):
    declare(OpDef(name=_name, kind=PatternKind.OPAQUE, inputs=("x", "origin_output", "dout"),
                  infer=_pool_grad_infer(_name), reference=_ref, init_attrs=_attrs,
                  attr_kinds=_kinds, accepts=FLOATS, window=Window.POOL_GRAD))
    GRAD_OPS.append(_name)


# -- UnsortedSegmentSum (Gather's gradient) and StridedSliceGrad ------------------------------

def _segment_sum_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    x, ids = types
    if ids.dtype not in INDEX_DTYPES:
        raise DTypeError(f"UnsortedSegmentSum: segment_ids must be int32 or int64, got "
                         f"{ids.dtype.name}")
    num = attrs["num_segments"]
    if not isinstance(num, (int, np.integer)) or num < 0:
        raise ShapeError(f"UnsortedSegmentSum: num_segments must be a non-negative int, got "
                         f"{num!r}")
    if x.shape[:ids.rank] != ids.shape:
        raise ShapeError(f"UnsortedSegmentSum: segment_ids {ids.shape} must be a prefix of "
                         f"the shape of x {x.shape}")
    return TensorType((int(num),) + x.shape[ids.rank:], x.dtype)


def _segment_sum_ref(x: np.ndarray, ids: np.ndarray, num_segments: int) -> np.ndarray:
    """Rows of x added into row ids[i] of the result; ids outside [0, num_segments) are
    dropped, as in MindSpore. Repeated ids accumulate (np.add.at, unbuffered)."""
    rows = x.reshape((ids.size,) + x.shape[ids.ndim:])
    flat = ids.ravel()
    keep = (flat >= 0) & (flat < num_segments)
    out = np.zeros((num_segments,) + x.shape[ids.ndim:], wide(x).dtype)
    np.add.at(out, flat[keep], rows[keep])
    return out.astype(x.dtype, copy=False)


declare(OpDef(name="UnsortedSegmentSum", kind=PatternKind.OPAQUE,
              inputs=("x", "segment_ids"), infer=_segment_sum_infer,
              reference=_segment_sum_ref, call_attrs=(("num_segments", None),),
              attr_kinds=(("num_segments", AttrKind.COUNT),),
              accepts=NUMBERS, functional=("unsorted_segment_sum",)))


_MASKS = (("begin_mask", 0), ("end_mask", 0), ("ellipsis_mask", 0), ("new_axis_mask", 0),
          ("shrink_axis_mask", 0))


def _strided_grad_index(attrs: dict[str, Any], shape: tuple[int, ...]) -> tuple[Any, ...]:
    masks = {name: attrs.get(name, 0) for name, _ in _MASKS}
    return strided_slice_index(shape, attrs["begin"], attrs["end"], attrs["strides"], **masks)


def _strided_grad_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (dy,) = types
    shape = _shape_attr(attrs["shapex"], "shapex", "StridedSliceGrad")
    view = np.broadcast_to(np.empty((), np.bool_), shape)[_strided_grad_index(attrs, shape)]
    if view.shape != dy.shape:
        raise ShapeError(f"StridedSliceGrad: dy {dy.shape} is not the shape {view.shape} the "
                         f"slice of {shape} gives")
    return TensorType(shape, dy.dtype)


def _strided_grad_ref(dy: np.ndarray, shapex: Any, begin: Any, end: Any, strides: Any,
                      **masks: int) -> np.ndarray:
    """dy written into zeros of the sliced tensor's shape where the slice read it."""
    out = np.zeros(tuple(shapex), dy.dtype)
    out[_strided_grad_index({"begin": begin, "end": end, "strides": strides, **masks},
                            out.shape)] = dy
    return out


declare(OpDef(name="StridedSliceGrad", kind=PatternKind.OPAQUE, inputs=("dy",),
              infer=_strided_grad_infer, reference=_strided_grad_ref, init_attrs=_MASKS,
              call_attrs=(("shapex", None), ("begin", None), ("end", None), ("strides", None)),
              attr_kinds=int_tuple_kinds("shapex", "begin", "end", "strides"), accepts=NUMBERS))
GRAD_OPS.append("StridedSliceGrad")
