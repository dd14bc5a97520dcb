"""Composite ops: opaque library kernels (their numpy references) when fusion is off; expanded
into basic ops by graph_kernel/expanders.py (nn_expanders.py for the losses) when it is on."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, GradientError, InputError, ShapeError
from graphkernel.ir import types as T
from graphkernel.ir.opdefs.elementwise import erfc_reference
from graphkernel.ir.opset import (
    FLOATS,
    NUMBERS,
    Infer,
    OpDef,
    PatternKind,
    declare,
    same_dtype_ref,
)
from graphkernel.ir.types import TensorType, TupleType, ValueType


def _unary_float_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    return types[0]


def _composite(name: str, inputs: tuple[str, ...], reference: Callable[..., Any],
               infer: Infer = _unary_float_infer, accepts: tuple[np.dtype, ...] | None = FLOATS,
               init_attrs: tuple[tuple[str, Any], ...] = (), variadic: bool = False,
               grad: Callable[..., Any] | None = None) -> None:
    declare(OpDef(name=name, kind=PatternKind.OPAQUE, inputs=inputs, infer=infer,
                  reference=reference, accepts=accepts, init_attrs=init_attrs,
                  variadic=variadic, composite=True, grad=grad))


# Gradient rules (OpDef.grad). A composite's gradient reads only the composite's inputs and
# output, never its inner values: what it needs inside (GeLU's tanh, Softmax's sum) is
# recomputed in the gradient composite (ir/opdefs/grad.py), which fuses like the forward one.
def _unary(rule: Callable[..., Any]) -> Callable[..., Any]:
    def grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
        return [rule(b, n.inputs[0], n, dy, attrs)]
    return grad


def _silu_grad(b: Any, x: Any, out: Any, dy: Any, attrs: dict[str, Any]) -> Any:
    s = b("Sigmoid", x)  # d(x s) = s + x s (1 - s) = s (1 + x (1 - s))
    return b("Mul", dy, b("Mul", s, b("Add", b("Mul", x, b("Sub", 1.0, s)), 1.0)))


def _relu6_grad(b: Any, x: Any, out: Any, dy: Any, attrs: dict[str, Any]) -> Any:
    inside = b("LogicalAnd", b("Greater", x, b.const(0, x)), b("Less", x, b.const(6, x)))
    return b("Select", inside, dy, b.const(0, dy))


def _hswish_grad(b: Any, x: Any, out: Any, dy: Any, attrs: dict[str, Any]) -> Any:
    # x * relu6(x + 3) / 6: 0 below -3, 1 above 3, (2x + 3) / 6 between
    slope = b("Add", b("Mul", x, 1 / 3), 0.5)
    slope = b("Select", b("Less", x, b.const(-3, x)), b.const(0, x), slope)
    slope = b("Select", b("Greater", x, b.const(3, x)), b.const(1, x), slope)
    return b("Mul", dy, slope)



def _as(x: np.ndarray, f: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """f computed wider for float16 and rounded once, as the expanders compute float16."""
    with np.errstate(all="ignore"):
        return np.asarray(f(x.astype(np.float64) if x.dtype == np.float16 else x)
                          ).astype(x.dtype, copy=False)


# The references use the same stable forms as the expanders (graph_kernel/expanders.py): no
# overflow to inf or NaN, no cancellation, at any finite input of any float dtype.

def _sigmoid(v: np.ndarray) -> np.ndarray:
    """1/(1 + exp(-v)) from e = exp(-|v|) <= 1: 1/(1 + e) for v >= 0, e/(1 + e) below."""
    e = np.exp(-np.abs(v))
    return np.where(v >= 0, np.asarray(1, v.dtype), e) / (1 + e)


def _x_sigmoid(v: np.ndarray, t: np.ndarray) -> np.ndarray:
    """v sigmoid(t) as the expanders compute it: v/(1 + e) for t >= 0, v e/(1 + e) below, with
    v clamped to the finite range in v e, so v = -inf (e = 0) gives -0.0, not NaN."""
    e = np.exp(-np.abs(t))
    finite = np.maximum(v, np.asarray(-np.finfo(v.dtype).max, v.dtype))
    return np.where(t >= 0, v, finite * e) / (1 + e)


def _times_sigmoid(v: np.ndarray, k: float) -> np.ndarray:
    """v * sigmoid(k v), which tends to -0.0 as v -> -inf."""
    return _x_sigmoid(v, k * v)


def _gelu_ref(x: np.ndarray, approximate: str = "tanh") -> np.ndarray:
    if approximate == "tanh":
        # 0.5 v (1 + tanh(z)) = v sigmoid(2z): no 1 + tanh(z) cancelling for negative v, and
        # 2z = v (k + 0.044715 k v^2), k = 2 sqrt(2/pi), overflows to +-inf (never NaN) for
        # huge |v|.
        def tanh_form(v: np.ndarray) -> np.ndarray:
            k = 1.5957691216057308
            return _x_sigmoid(v, v * (v * v * (0.044715 * k) + k))
        return _as(x, tanh_form)

    def erf_form(v: np.ndarray) -> np.ndarray:  # 1 + erf(t) = erfc(-t)
        c = erfc_reference(-v / math.sqrt(2)).astype(v.dtype)
        return np.where(c == 0, np.asarray(-0.0, v.dtype), 0.5 * v * c)
    return _as(x, erf_form)


def _gelu_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    if attrs["approximate"] not in ("tanh", "none"):
        raise DTypeError(f"GeLU approximate must be 'tanh' or 'none', got "
                         f"{attrs['approximate']!r}")
    return types[0]


_composite("GeLU", ("x",), _gelu_ref, infer=_gelu_infer, init_attrs=(("approximate", "tanh"),),
           grad=_unary(lambda b, x, o, dy, a: b("GeLUGrad", dy, x, o,
                                                 approximate=a["approximate"])))
_composite("FastGeLU", ("x",), lambda x: _as(x, lambda v: _times_sigmoid(v, 1.702)),
           grad=_unary(lambda b, x, o, dy, a: b("FastGeLUGrad", dy, x)))
_composite("Sigmoid", ("x",), lambda x: _as(x, _sigmoid),
           grad=_unary(lambda b, x, o, dy, a: b("SigmoidGrad", o, dy)))
_composite("SiLU", ("x",), lambda x: _as(x, lambda v: _times_sigmoid(v, 1.0)),
           grad=_unary(_silu_grad))
_composite("ReLU", ("x",), lambda x: np.maximum(x, np.zeros((), x.dtype)), accepts=NUMBERS,
           grad=_unary(lambda b, x, o, dy, a: b("ReluGrad", dy, o)))
_composite("ReLU6", ("x",), lambda x: np.minimum(np.maximum(x, np.zeros((), x.dtype)),
                                                  np.asarray(6, x.dtype)), accepts=NUMBERS,
           grad=_unary(_relu6_grad))
_composite("HSwish", ("x",), lambda x: _as(x, lambda v: v * np.minimum(np.maximum(v + 3, 0), 6)
                                           / 6), grad=_unary(_hswish_grad))
_composite("Softplus", ("x",),
           lambda x: _as(x, lambda v: np.maximum(v, 0) + np.log1p(np.exp(-np.abs(v)))),
           grad=_unary(lambda b, x, o, dy, a: b("Mul", dy, b("Sigmoid", x))))
_composite("Square", ("x",), lambda x: np.multiply(x, x), accepts=NUMBERS,
           grad=_unary(lambda b, x, o, dy, a: b("Mul", b("Mul", dy, x), 2.0)))


def _binary_same_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    return TensorType(T.broadcast_shapes(types[0].shape, types[1].shape),
                      T.promote(types[0].dtype, types[1].dtype))


def _squared_difference_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    x, y = n.inputs
    d = b("Mul", b("Mul", b("Sub", x, y), dy), 2.0)
    return [b.sum_to(d, x.shape), b.sum_to(b("Neg", d), y.shape)]


_composite("SquaredDifference", ("x", "y"),
           lambda x, y: same_dtype_ref(lambda a, b: (a - b) * (a - b))(x, y),
           infer=_binary_same_infer, accepts=NUMBERS, grad=_squared_difference_grad)


def check_bias_data_format(op: str, data_format: str) -> None:
    """MindSpore's BiasAdd formats that put the channels on axis 1 (the last axis of a 2-d
    input): NCHW and NCDHW. NHWC is refused rather than added along the wrong axis."""
    if data_format not in ("NCHW", "NCDHW"):
        raise InputError(f"{op}: data_format {data_format!r} is not supported; graphkernel adds "
                         "the bias along axis 1 (data_format 'NCHW' or 'NCDHW'): transpose an "
                         "NHWC input first")


def _bias_add_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    x, b = types
    check_bias_data_format("BiasAdd", attrs["data_format"])
    if b.rank != 1 or x.rank < 2 or x.shape[1 if x.rank > 2 else -1] != b.shape[0]:
        raise ShapeError(f"BiasAdd: bias of shape {b.shape} does not match the channel axis of "
                         f"input {x.shape} (axis 1, or the last axis of a 2-d input)")
    return TensorType(x.shape, T.promote(x.dtype, b.dtype))


def _bias_add_ref(x: np.ndarray, b: np.ndarray, data_format: str = "NCHW") -> np.ndarray:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return same_dtype_ref(np.add)(x, b.reshape(shape))


_composite("BiasAdd", ("x", "b"), _bias_add_ref, infer=_bias_add_infer,
           init_attrs=(("data_format", "NCHW"),),
           grad=lambda b, n, dy, a: [dy, b("BiasAddGrad", dy, data_format=a["data_format"])])


def _addn_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    if not types:
        raise ShapeError("AddN needs at least one tensor")
    return TensorType(T.broadcast_shapes(*(t.shape for t in types)),
                      T.promote(*(t.dtype for t in types)))


def _addn_ref(*xs: np.ndarray) -> np.ndarray:
    out = xs[0]
    for x in xs[1:]:
        out = same_dtype_ref(np.add)(out, x)
    return np.asarray(out)


_composite("AddN", ("xs",), _addn_ref, infer=_addn_infer, accepts=NUMBERS, variadic=True,
           grad=lambda b, n, dy, a: [b.sum_to(dy, x.shape) for x in n.inputs])


def _softmax_ref(x: np.ndarray, axis: Any = -1) -> np.ndarray:
    if x.size == 0:  # numpy's max of an empty axis raises; there is nothing to compute
        return x.copy()

    def f(v: np.ndarray) -> np.ndarray:
        axes = T.normalize_axes(axis, v.ndim)
        e = np.exp(v - v.max(axis=axes, keepdims=True))
        return e / e.sum(axis=axes, keepdims=True)
    return _as(x, f)


def _log_softmax_ref(x: np.ndarray, axis: Any = -1) -> np.ndarray:
    if x.size == 0:  # numpy's max of an empty axis raises; there is nothing to compute
        return x.copy()

    def f(v: np.ndarray) -> np.ndarray:
        axes = T.normalize_axes(axis, v.ndim)
        s = v - v.max(axis=axes, keepdims=True)
        return s - np.log(np.exp(s).sum(axis=axes, keepdims=True))
    return _as(x, f)


def _axis_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    T.normalize_axes(attrs["axis"], types[0].rank)
    return types[0]


_composite("Softmax", ("x",), _softmax_ref, infer=_axis_infer, init_attrs=(("axis", -1),),
           grad=_unary(lambda b, x, o, dy, a: b("SoftmaxGrad", o, dy, axis=a["axis"])))
_composite("LogSoftmax", ("x",), _log_softmax_ref, infer=_axis_infer, init_attrs=(("axis", -1),),
           grad=_unary(lambda b, x, o, dy, a: b("LogSoftmaxGrad", o, dy, axis=a["axis"])))


def _layer_norm_axes(x: TensorType, attrs: dict[str, Any]) -> tuple[int, int]:
    norm, params = attrs["begin_norm_axis"], attrs["begin_params_axis"]
    for name, a in (("begin_norm_axis", norm), ("begin_params_axis", params)):
        if not -x.rank <= a < x.rank:
            raise ShapeError(f"LayerNorm: {name}={a} out of range for input of shape {x.shape}")
    return norm % x.rank, params % x.rank


def _layer_norm_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    x, gamma, beta = types
    norm, params = _layer_norm_axes(x, attrs)
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p.shape != x.shape[params:]:
            raise ShapeError(f"LayerNorm: {name} has shape {p.shape}, expected {x.shape[params:]}"
                             f" (input {x.shape}, begin_params_axis={attrs['begin_params_axis']})")
    stat = TensorType(x.shape[:norm] + (1,) * (x.rank - norm), x.dtype)
    return TupleType((x, stat, stat))


def _layer_norm_ref(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, begin_norm_axis: int = -1,
                    begin_params_axis: int = -1, epsilon: float = 1e-7) -> tuple[np.ndarray, ...]:
    # Computed in float64 and rounded once, like MindSpore's expander (float16 in float32,
    # rounded at the end): rounding the mean first would shift every output of a row whose
    # spread is small next to its mean.
    norm = begin_norm_axis % x.ndim
    axes = tuple(range(norm, x.ndim))
    v = x.astype(np.float64)
    with np.errstate(all="ignore"):
        mean = v.mean(axis=axes, keepdims=True)
        var = ((v - mean) ** 2).mean(axis=axes, keepdims=True)
        y = (v - mean) / np.sqrt(var + epsilon) * gamma + beta
    return tuple(a.astype(x.dtype) for a in (y, mean, var))


def _layer_norm_grad(b: Any, n: Any, dout: tuple[Any, ...], attrs: dict[str, Any]) -> list[Any]:
    """LayerNormGrad for y's gradient; the mean's and variance's own gradients (when a user
    differentiates through them) add their terms: d mean/dx = 1/n, d var/dx = 2 (x - mean)/n."""
    x, gamma, _ = n.inputs
    dy, dmean, dvar = dout
    norm = attrs["begin_norm_axis"] % len(x.shape)
    inv_n = 1.0 / math.prod(x.shape[norm:]) if math.prod(x.shape[norm:]) else math.inf
    dx = dgamma = dbeta = None
    if dy is not None or dmean is not None or dvar is not None:
        mean, var = b.item(n, 1), b.item(n, 2)
    if dy is not None:
        dx, dgamma, dbeta = b.items(b("LayerNormGrad", x, dy, var, mean, gamma,
                                      begin_norm_axis=attrs["begin_norm_axis"],
                                      begin_params_axis=attrs["begin_params_axis"],
                                      epsilon=attrs["epsilon"]))
    terms = [] if dx is None else [dx]
    if dmean is not None:
        terms.append(b.broadcast_to(b("Mul", dmean, inv_n), x.shape))
    if dvar is not None:
        centred = b("Sub", x, mean)
        terms.append(b("Mul", centred, b("Mul", dvar, 2 * inv_n)))
    total = terms[0] if terms else None
    for term in terms[1:]:
        total = b("Add", total, term)
    return [total, dgamma, dbeta]


_composite("LayerNorm", ("x", "gamma", "beta"), _layer_norm_ref, infer=_layer_norm_infer,
           init_attrs=(("begin_norm_axis", -1), ("begin_params_axis", -1), ("epsilon", 1e-7)),
           grad=_layer_norm_grad)


# -- MindSpore's counting and checking primitives (EqualCount, SquareSumAll, FloatStatus) ------

def _same_shape_and_dtype(op: str, types: tuple[TensorType, ...]) -> TensorType:
    first = types[0]
    if any(t.shape != first.shape or t.dtype != first.dtype for t in types):
        raise ShapeError(f"{op}: inputs must share one shape and dtype, got "
                         f"{', '.join(f'{t.dtype.name}{list(t.shape)}' for t in types)}")
    return first


def _equal_count_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    return TensorType((1,), _same_shape_and_dtype("EqualCount", types).dtype)


_composite("EqualCount", ("x", "y"),
           lambda x, y: np.asarray([np.count_nonzero(x == y)]).astype(x.dtype),
           infer=_equal_count_infer, accepts=NUMBERS)


def _square_sum_all_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    x = _same_shape_and_dtype("SquareSumAll", types)
    return TupleType((TensorType((), x.dtype),) * 2)


def _square_sum_all_ref(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return tuple(np.asarray(np.sum(np.square(v.astype(np.float64)))).astype(v.dtype)
                 for v in (x, y))  # type: ignore[return-value]  # two arrays


_composite("SquareSumAll", ("x", "y"), _square_sum_all_ref, infer=_square_sum_all_infer)


def _float_status_ref(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray([0.0 if np.all(np.isfinite(x)) else 1.0], np.float32)


# 1.0 when the input holds an inf or a NaN (an overflowed step), else 0.0: MindSpore's CPU
# form, which needs no NPUAllocFloatStatus buffer.
_composite("FloatStatus", ("x",), _float_status_ref,
           infer=lambda types, attrs: TensorType((1,), T.float32))


# -- Losses as MindSpore's primitives -----------------------------------------------------------

def _sigmoid_ce_ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # max(x, 0) - x y + log(1 + exp(-|x|)): no overflow for any finite x
    def f(v: np.ndarray) -> np.ndarray:
        return np.maximum(v, 0) - v * y + np.log1p(np.exp(-np.abs(v)))
    return _as(x, f)


def _sigmoid_ce_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    x, y = n.inputs  # MindSpore's bprop: no gradient reaches the labels (zeros)
    return [b("SigmoidCrossEntropyWithLogitsGrad", x, y, dy), b("ZerosLike", y)]


_composite("SigmoidCrossEntropyWithLogits", ("logits", "label"), _sigmoid_ce_ref,
           infer=lambda types, attrs: _same_shape_and_dtype("SigmoidCrossEntropyWithLogits",
                                                            types),
           grad=_sigmoid_ce_grad)


def _softmax_ce_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    x = _same_shape_and_dtype("SoftmaxCrossEntropyWithLogits", types)
    if x.rank != 2:
        raise ShapeError(f"SoftmaxCrossEntropyWithLogits takes (batch, classes) logits, got "
                         f"shape {x.shape}")
    return TupleType((TensorType(x.shape[:1], x.dtype), x))


def _softmax_ce_ref(x: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v, t = x.astype(np.float64), labels.astype(np.float64)
    with np.errstate(all="ignore"):
        shifted = v - v.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return ((-(t * log_p).sum(axis=1)).astype(x.dtype),
                (np.exp(log_p) - t).astype(x.dtype))


def _softmax_ce_grad(b: Any, n: Any, dout: tuple[Any, ...], attrs: dict[str, Any]
                     ) -> list[Any]:
    dloss, dbackprop = dout
    if dbackprop is not None:
        raise GradientError("SoftmaxCrossEntropyWithLogits: its second output (the loss's "
                            "gradient, softmax - labels) has no gradient of its own, as in "
                            "MindSpore; differentiate the loss (the first output)")
    if dloss is None:
        return [None, None]
    # MindSpore's bprop: the saved backprop scaled by each row's incoming gradient; zeros for
    # the labels.
    backprop = b.item(n, 1)
    dx = b("Mul", backprop, b("Reshape", dloss, shape=(dloss.tensor_type.shape[0], 1)))
    return [dx, b("ZerosLike", n.inputs[1])]


_composite("SoftmaxCrossEntropyWithLogits", ("logits", "labels"), _softmax_ce_ref,
           infer=_softmax_ce_infer, grad=_softmax_ce_grad)
