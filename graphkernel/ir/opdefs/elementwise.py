"""Elementwise primitives: arithmetic, transcendentals, comparisons, logic, Select, Cast."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.errors import DTypeError
from graphkernel.ir import types as T
from graphkernel.ir.opset import (
    ALL,
    FLOATS,
    AttrKind,
    OpDef,
    PatternKind,
    declare,
    declare_elementwise,
    quiet_ref,
    same_dtype_ref,
    to_bool,
)
from graphkernel.ir.types import TensorType, ValueType

# Short names keep the table one op per line: `same` gives the promoted input dtype.
_ew, same = declare_elementwise, same_dtype_ref
F = FLOATS
# Flag sets spread into `_ew(...)`; typed as keyword arguments of any type for the checker.
VECTOR_MATH: dict[str, Any] = {"vector_math": True}
EXPENSIVE: dict[str, Any] = {"expensive": True}


# Gradient rules (see OpDef.grad): `b` builds backward nodes, `n` is the forward node (its
# inputs; the node itself is its output, kept for the backward), `dy` its output's gradient.
# Broadcast operands get their gradient summed back to their shape (b.sum_to).
def _binary_grad(rule: Any) -> Any:
    def grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
        x, y = n.inputs
        dx, dz = rule(b, x, y, n, dy)
        return [None if dx is None else b.sum_to(dx, x.shape),
                None if dz is None else b.sum_to(dz, y.shape)]
    return grad


def _unary_grad(rule: Any) -> Any:
    def grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
        return [rule(b, n.inputs[0], n, dy)]
    return grad


def _no_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    """Piecewise constant (Floor, Round, Sign): the gradient is zero wherever it exists."""
    return [None] * len(n.inputs)


def _div_grad(b: Any, x: Any, y: Any, out: Any, dy: Any) -> tuple[Any, Any]:
    dx = b("RealDiv", dy, y)
    return dx, b("Neg", b("Mul", dx, out))  # -dy * x / y^2 = -(dy / y) * out


def _pow_grad(b: Any, x: Any, y: Any, out: Any, dy: Any) -> tuple[Any, Any]:
    dx = b("Mul", b("Mul", dy, y), b("Pow", x, b("Sub", y, 1.0)))
    return dx, b("Mul", b("Mul", dy, out), b("Log", x))


def _erf_grad(b: Any, x: Any, out: Any, dy: Any) -> Any:
    gauss = b("Exp", b("Neg", b("Mul", x, x)))
    return b("Mul", dy, b("Mul", gauss, 2 / math.sqrt(math.pi)))


_ADD = _binary_grad(lambda b, x, y, o, dy: (dy, dy))
_SUB = _binary_grad(lambda b, x, y, o, dy: (dy, b("Neg", dy)))
_MUL = _binary_grad(lambda b, x, y, o, dy: (b("Mul", dy, y), b("Mul", dy, x)))
_DIV = _binary_grad(_div_grad)
_POW = _binary_grad(_pow_grad)


def _extremum_grad(op: str) -> Any:
    def grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
        return list(b.items(b(op, n.inputs[0], n.inputs[1], dy)))
    return grad


_NEG = _unary_grad(lambda b, x, o, dy: b("Neg", dy))
_SQRT = _unary_grad(lambda b, x, o, dy: b("SqrtGrad", o, dy))
_RSQRT = _unary_grad(lambda b, x, o, dy: b("RsqrtGrad", o, dy))
_RECIPROCAL = _unary_grad(lambda b, x, o, dy: b("Neg", b("Mul", b("Mul", dy, o), o)))
_EXP = _unary_grad(lambda b, x, o, dy: b("Mul", dy, o))
_LOG = _unary_grad(lambda b, x, o, dy: b("RealDiv", dy, x))
_TANH = _unary_grad(lambda b, x, o, dy: b("TanhGrad", o, dy))
_ERF = _unary_grad(_erf_grad)
_ABS = _unary_grad(lambda b, x, o, dy: b("Mul", dy, b("Sign", x)))

_ew("Add", 2, same(np.add), aliases=("TensorAdd",), grad=_ADD)
_ew("Sub", 2, same(np.subtract), grad=_SUB)
_ew("Mul", 2, same(np.multiply), grad=_MUL)
_ew("RealDiv", 2, same(np.true_divide), accepts=F, aliases=("Div",), grad=_DIV,
    **EXPENSIVE)
_ew("Neg", 1, same(np.negative), grad=_NEG)
# NaN-propagating max/min, like numpy.
_ew("Maximum", 2, same(np.maximum), grad=_extremum_grad("MaximumGrad"))
_ew("Minimum", 2, same(np.minimum), grad=_extremum_grad("MinimumGrad"))
_ew("Pow", 2, same(np.power), accepts=F, grad=_POW, **VECTOR_MATH)
_ew("Sqrt", 1, same(np.sqrt), accepts=F, grad=_SQRT, **EXPENSIVE)
_ew("Rsqrt", 1, same(lambda x: 1 / np.sqrt(x)), accepts=F, grad=_RSQRT, **EXPENSIVE)
_ew("Reciprocal", 1, same(lambda x: 1 / x), accepts=F, grad=_RECIPROCAL, **EXPENSIVE)
_ew("Exp", 1, same(np.exp), accepts=F, grad=_EXP, **VECTOR_MATH)
_ew("Log", 1, same(np.log), accepts=F, grad=_LOG, **VECTOR_MATH)
_ew("Tanh", 1, same(np.tanh), accepts=F, grad=_TANH, **VECTOR_MATH)
_ew("Erf", 1, same(lambda x: erf_reference(x)), accepts=F, grad=_ERF, **VECTOR_MATH)
# abs(-0.0) is +0.0; integers wrap (abs(INT32_MIN) is INT32_MIN), as in numpy.
_ew("Abs", 1, same(np.abs), grad=_ABS)
_ew("Floor", 1, same(np.floor), accepts=F, grad=_no_grad)
_ew("Round", 1, same(np.rint), accepts=F, grad=_no_grad)
# sign(+-0.0) is +0.0 as in numpy; NaN stays NaN.
_ew("Sign", 1, same(np.sign), grad=_no_grad)
# Comparisons and logic give bool.
for _name, _ufunc in (("Equal", np.equal), ("NotEqual", np.not_equal), ("Less", np.less),
                      ("LessEqual", np.less_equal), ("Greater", np.greater),
                      ("GreaterEqual", np.greater_equal)):
    _ew(_name, 2, quiet_ref(_ufunc), accepts=ALL, out_dtype=to_bool)
_ew("LogicalAnd", 2, quiet_ref(np.logical_and), accepts=(T.bool_,))
_ew("LogicalOr", 2, quiet_ref(np.logical_or), accepts=(T.bool_,))
_ew("LogicalNot", 1, quiet_ref(np.logical_not), accepts=(T.bool_,))


def erf_reference(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; math.erf per element is exact enough for a reference.
    return _per_element(math.erf, x)


def erfc_reference(x: np.ndarray) -> np.ndarray:
    return _per_element(math.erfc, x)


def _per_element(f: Any, x: np.ndarray) -> np.ndarray:
    flat = np.asarray(x, dtype=np.float64).ravel()
    out = np.fromiter((f(v) if v == v else v for v in flat), dtype=np.float64, count=flat.size)
    return out.reshape(np.shape(x))


def _select_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    cond, x, y = types
    if cond.dtype != T.bool_:
        raise DTypeError(f"Select condition must be bool, got {cond.dtype.name}")
    return TensorType(T.broadcast_shapes(cond.shape, x.shape, y.shape), T.promote(x.dtype, y.dtype))


def _select_ref(cond: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(cond, x, y).astype(np.result_type(x, y), copy=False)


def _select_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    cond, x, y = n.inputs
    zero = b.const(0, dy)
    return [None, b.sum_to(b("Select", cond, dy, zero), x.shape),
            b.sum_to(b("Select", cond, zero, dy), y.shape)]


declare(OpDef(name="Select", kind=PatternKind.ELEMWISE, inputs=("cond", "x", "y"),
              infer=_select_infer, reference=_select_ref, grad=_select_grad))


def _cast_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    return TensorType(types[0].shape, T.to_dtype(attrs["dtype"]))


def _cast_ref(x: np.ndarray, dtype: Any) -> np.ndarray:
    with np.errstate(all="ignore"):
        return x.astype(T.to_dtype(dtype))


declare(OpDef(name="Cast", kind=PatternKind.ELEMWISE, inputs=("x",), infer=_cast_infer,
              reference=_cast_ref, call_attrs=(("dtype", None),),
              attr_kinds=(("dtype", AttrKind.DTYPE),),
              grad=lambda b, n, dy, attrs: [b.cast(dy, n.inputs[0].dtype)]))
