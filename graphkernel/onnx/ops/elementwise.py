"""Elementwise ONNX operators: arithmetic, comparisons, logic, casts and activations."""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from graphkernel.ir import types as T
from graphkernel.onnx.ops.base import (
    CONVERTERS,
    FOLDERS,
    Converter,
    NodeContext,
    Value,
    const,
    converts,
    dtype_of,
    norm_axis,
    op,
    rank,
)


# -- elementwise -----------------------------------------------------------------------------
def _unary(prim: str) -> Converter:
    return lambda cx, x: op(prim, x)


for _onnx, _prim in [("Relu", "ReLU"), ("Sigmoid", "Sigmoid"), ("Tanh", "Tanh"), ("Exp", "Exp"),
                     ("Log", "Log"), ("Sqrt", "Sqrt"), ("Reciprocal", "Reciprocal"),
                     ("Neg", "Neg"), ("Abs", "Abs"), ("Floor", "Floor"), ("Erf", "Erf"),
                     ("Sin", "Sin"), ("Cos", "Cos"), ("Softsign", "Softsign"),
                     ("Softplus", "Softplus"), ("Not", "LogicalNot"), ("Sign", "Sign"),
                     ("IsNaN", "IsNan"), ("Round", "Round"), ("HardSwish", "HSwish")]:
    CONVERTERS[_onnx] = _unary(_prim)


@converts("Identity")
def _identity(cx: NodeContext, x: Value) -> Value:
    return x


@converts("Ceil")
def _ceil(cx: NodeContext, x: Value) -> Value:
    return op("Neg", op("Floor", op("Neg", x)))


def _binary(prim: str) -> Converter:
    return lambda cx, a, b: op(prim, a, b)


for _onnx, _prim in [("Add", "Add"), ("Sub", "Sub"), ("Mul", "Mul"), ("Equal", "Equal"),
                     ("Less", "Less"), ("Greater", "Greater"), ("LessOrEqual", "LessEqual"),
                     ("GreaterOrEqual", "GreaterEqual"), ("And", "LogicalAnd"),
                     ("Or", "LogicalOr"), ("Xor", "NotEqual")]:
    CONVERTERS[_onnx] = _binary(_prim)


@converts("Div")
def _div(cx: NodeContext, a: Value, b: Value) -> Value:
    if T.is_float(dtype_of(a)):
        return op("RealDiv", a, b)
    # Integer division truncates toward zero in ONNX; FloorDiv rounds down: one up where the
    # quotient is negative and not exact.
    q = op("FloorDiv", a, b)
    inexact = op("NotEqual", op("Mul", q, b), a)
    negative = op("NotEqual", op("Less", a, const(0, a)), op("Less", b, const(0, b)))
    return op("Select", op("LogicalAnd", inexact, negative), op("Add", q, const(1, q)), q)


@converts("Pow")
def _pow(cx: NodeContext, a: Value, b: Value) -> Value:
    if not T.is_float(dtype_of(a)):  # exact in float64 while the result fits its 53 bits
        wide = op("Pow", op("Cast", a, dtype=T.float64), op("Cast", b, dtype=T.float64))
        return op("Cast", wide, dtype=dtype_of(a))
    if dtype_of(b) != dtype_of(a):
        b = op("Cast", b, dtype=dtype_of(a))
    return op("Pow", a, b)


@converts("Mod")
def _mod(cx: NodeContext, a: Value, b: Value) -> Value:
    fmod = cx.attr("fmod", 0)
    if not fmod and T.is_float(dtype_of(a)):
        raise cx.refuse("fmod=0 on floats is not valid ONNX")
    return op("Mod" if fmod else "FloorMod", a, b)


def _fold_variadic(prim: str) -> Converter:
    def convert(cx: NodeContext, *xs: Value) -> Value:
        out = xs[0]
        for x in xs[1:]:
            out = op(prim, out, x)
        return out
    return convert


CONVERTERS["Max"] = _fold_variadic("Maximum")
CONVERTERS["Min"] = _fold_variadic("Minimum")
CONVERTERS["Sum"] = _fold_variadic("Add")


@converts("Mean")
def _mean(cx: NodeContext, *xs: Value) -> Value:
    total = _fold_variadic("Add")(cx, *xs)
    return op("RealDiv", total, const(len(xs), total))


@converts("Where")
def _where(cx: NodeContext, cond: Value, x: Value, y: Value) -> Value:
    return op("Select", cond, x, y)


def _fold_equal(cx: NodeContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Equal on shape values that hold dynamic sizes (an export's `Where(Equal(shape, -1), 1,
    shape)` before an Expand): a dynamic size is at least 1, so it differs from any number
    below 1 and equals only the same size; against a positive number it is undecidable."""
    def same(u: Any, v: Any) -> bool:
        if isinstance(u, T.SymSize) or isinstance(v, T.SymSize):
            if isinstance(u, T.SymSize) and isinstance(v, T.SymSize) and u == v:
                return True
            number = v if isinstance(u, T.SymSize) else u
            if isinstance(number, (int, np.integer)) and number < 1:
                return False
            raise cx.refuse(f"comparing the dynamic size {u if number is v else v} with "
                            f"{number}: known only when the model runs")
        return bool(u == v)
    left, right = np.broadcast_arrays(a, b)
    return np.array([same(u, v) for u, v in zip(left.reshape(-1), right.reshape(-1))],
                    dtype=np.bool_).reshape(left.shape)


FOLDERS["Equal"] = _fold_equal


def _fold_where(cx: NodeContext, cond: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Where choosing between shape values that hold dynamic sizes, on a known condition."""
    if cond.dtype != np.bool_:
        raise cx.refuse("a condition computed from a dynamic size (a dim_param)")
    return np.where(cond, x.astype(object), y.astype(object))


FOLDERS["Where"] = _fold_where


@converts("Cast")
def _cast(cx: NodeContext, x: Value) -> Value:
    to = cx.attr("to")
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(to)
    except Exception:  # an unknown type number
        raise cx.refuse(f"cast to element type {to!r}") from None
    if np.dtype(dtype) not in T.SUPPORTED_DTYPES:
        raise cx.refuse(f"cast to {np.dtype(dtype).name} (graphkernel runs "
                        f"{', '.join(d.name for d in T.SUPPORTED_DTYPES)})")
    return x if dtype_of(x) == dtype else op("Cast", x, dtype=np.dtype(dtype))


@converts("CastLike")
def _cast_like(cx: NodeContext, x: Value, target: Value) -> Value:
    return x if dtype_of(x) == dtype_of(target) else op("Cast", x, dtype=dtype_of(target))


def _fold_cast(cx: NodeContext, x: np.ndarray) -> np.ndarray:
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(cx.attr("to")))
    if not np.issubdtype(dtype, np.integer):
        raise cx.refuse("a dynamic size (dim_param) cast to a non-integer type")
    return x


FOLDERS["Cast"] = _fold_cast


# -- activations -----------------------------------------------------------------------------
@converts("LeakyRelu")
def _leaky_relu(cx: NodeContext, x: Value) -> Value:
    alpha = cx.attr("alpha", 0.01)
    return op("Select", op("Less", x, const(0, x)), op("Mul", x, const(alpha, x)), x)


@converts("PRelu")
def _prelu(cx: NodeContext, x: Value, slope: Value) -> Value:
    return op("Select", op("Less", x, const(0, x)), op("Mul", x, slope), x)


@converts("Elu")
def _elu(cx: NodeContext, x: Value) -> Value:
    alpha = cx.attr("alpha", 1.0)
    return op("Select", op("Less", x, const(0, x)), op("Mul", op("Expm1", x), const(alpha, x)),
              x)


@converts("Selu")
def _selu(cx: NodeContext, x: Value) -> Value:
    alpha = cx.attr("alpha", 1.67326319217681884765625)
    gamma = cx.attr("gamma", 1.05070102214813232421875)
    neg = op("Mul", op("Expm1", x), const(alpha, x))
    return op("Mul", op("Select", op("LessEqual", x, const(0, x)), neg, x), const(gamma, x))


@converts("Celu")
def _celu(cx: NodeContext, x: Value) -> Value:
    alpha = cx.attr("alpha", 1.0)
    neg = op("Mul", op("Expm1", op("RealDiv", x, const(alpha, x))), const(alpha, x))
    return op("Add", op("Maximum", x, const(0, x)), op("Minimum", neg, const(0, x)))


@converts("ThresholdedRelu")
def _thresholded_relu(cx: NodeContext, x: Value) -> Value:
    alpha = cx.attr("alpha", 1.0)
    return op("Select", op("Greater", x, const(alpha, x)), x, const(0, x))


@converts("HardSigmoid")
def _hard_sigmoid(cx: NodeContext, x: Value) -> Value:
    alpha, beta = cx.attr("alpha", 0.2), cx.attr("beta", 0.5)
    y = op("Add", op("Mul", x, const(alpha, x)), const(beta, x))
    return op("Maximum", op("Minimum", y, const(1, x)), const(0, x))


@converts("Gelu")
def _gelu(cx: NodeContext, x: Value) -> Value:
    approximate = cx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise cx.refuse(f"approximate={approximate!r}")
    return op("GeLU", x, approximate=approximate)


@converts("Clip")
def _clip(cx: NodeContext, x: Value, low: Value = None, high: Value = None) -> Value:
    if low is not None:
        x = op("Maximum", x, low)
    if high is not None:
        x = op("Minimum", x, high)
    return x


def _softmax(prim: str) -> Converter:
    def convert(cx: NodeContext, x: Value) -> Value:
        axis = norm_axis(cx, cx.attr("axis", -1), rank(x))
        return op(prim, x, axis=axis)
    return convert


CONVERTERS["Softmax"] = _softmax("Softmax")
CONVERTERS["LogSoftmax"] = _softmax("LogSoftmax")
