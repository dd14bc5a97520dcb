"""More math, MindSpore's names: trigonometry and special functions, classification (IsNan,
IsInf, IsFinite), integer-style division (FloorDiv, FloorMod, Mod), Softsign, Identity,
StopGradient, and the logical reductions ReduceAll/ReduceAny. Every elementwise one fuses."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.ir import types as T
from graphkernel.ir.opdefs.reduction import _reduce_infer, _reduce_ref
from graphkernel.ir.opset import (
    ALL,
    FLOATS,
    OpDef,
    PatternKind,
    Reduction,
    ReductionKind,
    declare,
    declare_elementwise,
    quiet_ref,
    same_dtype_ref,
    to_bool,
)

_ew, same = declare_elementwise, same_dtype_ref
F = FLOATS
VECTOR_MATH: dict[str, Any] = {"vector_math": True}  # spread into `_ew(...)` calls


def _erfc_reference(x: np.ndarray) -> np.ndarray:
    # numpy has no erfc; math.erfc per element is exact (1 - erf(x) loses digits for x > 1).
    flat = np.asarray(x, dtype=np.float64).ravel()
    out = np.fromiter((math.erfc(v) if v == v else v for v in flat), dtype=np.float64,
                      count=flat.size)
    return out.reshape(np.shape(x))


# Gradient rules (OpDef.grad): elementwise, so the backward fuses like the forward.
def _unary(rule: Any) -> Any:
    def grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
        return [rule(b, n.inputs[0], n, dy)]
    return grad


def _softsign_grad(b: Any, x: Any, out: Any, dy: Any) -> Any:
    t = b("Add", b("Abs", x), 1.0)
    return b("RealDiv", dy, b("Mul", t, t))  # d/dx x / (1 + |x|) = 1 / (1 + |x|)^2


def _erfc_grad(b: Any, x: Any, out: Any, dy: Any) -> Any:
    gauss = b("Exp", b("Neg", b("Mul", x, x)))
    return b("Mul", dy, b("Mul", gauss, -2 / math.sqrt(math.pi)))


_SIN = _unary(lambda b, x, o, dy: b("Mul", dy, b("Cos", x)))
_COS = _unary(lambda b, x, o, dy: b("Neg", b("Mul", dy, b("Sin", x))))
_EXPM1 = _unary(lambda b, x, o, dy: b("Mul", dy, b("Add", o, 1.0)))
_LOG1P = _unary(lambda b, x, o, dy: b("RealDiv", dy, b("Add", x, 1.0)))
_IDENTITY = _unary(lambda b, x, o, dy: dy)

_ew("Sin", 1, same(np.sin), accepts=F, functional=("sin",), grad=_SIN, **VECTOR_MATH)
_ew("Cos", 1, same(np.cos), accepts=F, functional=("cos",), grad=_COS, **VECTOR_MATH)
_ew("Erfc", 1, same(_erfc_reference), accepts=F, functional=("erfc",),
    grad=_unary(_erfc_grad), **VECTOR_MATH)
_ew("Expm1", 1, same(np.expm1), accepts=F, functional=("expm1",), grad=_EXPM1,
    **VECTOR_MATH)
_ew("Log1p", 1, same(np.log1p), accepts=F, functional=("log1p",), grad=_LOG1P,
    **VECTOR_MATH)
# Softsign x / (1 + |x|): one elementwise op in MindSpore, one here.
_ew("Softsign", 1, same(lambda x: x / (1 + np.abs(x))),
    accepts=F, functional=("softsign",), expensive=True,
    grad=_unary(_softsign_grad))
_ew("Identity", 1, same(lambda x: np.array(x, copy=True)), accepts=ALL,
    functional=("identity",), grad=_IDENTITY)
# StopGradient: the value unchanged, but no gradient flows back through it (MindSpore's
# ops.stop_gradient): its rule gives None, so autodiff leaves its input's adjoint alone.
_ew("StopGradient", 1, same(lambda x: np.array(x, copy=True)), accepts=ALL,
    functional=("stop_gradient",), grad=lambda b, n, dy, attrs: [None])

# Classification: bool results. Integers and bools are always finite, never NaN or Inf.
_ew("IsNan", 1, quiet_ref(np.isnan), accepts=ALL, out_dtype=to_bool, functional=("isnan",))
_ew("IsInf", 1, quiet_ref(np.isinf), accepts=ALL,
    out_dtype=to_bool, functional=("isinf",))
_ew("IsFinite", 1, quiet_ref(np.isfinite), accepts=ALL, out_dtype=to_bool, functional=("isfinite",))

# Integer division as numpy does it: a zero divisor gives 0 (INT_MIN // -1 wraps to INT_MIN);
# floats follow numpy's npy_divmod bit for bit.
def _int_safe(f: Any) -> Any:
    """numpy's integer floor_divide/remainder/fmod with a 0 divisor give 0 (with a warning)."""
    def ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        dtype = np.result_type(x, y)
        with np.errstate(all="ignore"):
            return np.asarray(f(x, y)).astype(dtype, copy=False)
    return ref


_ew("FloorDiv", 2, _int_safe(np.floor_divide), functional=("floor_div", "floor_divide"))
_ew("FloorMod", 2, _int_safe(np.remainder), functional=("floor_mod", "remainder"))
# MindSpore's Mod truncates: the result takes the dividend's sign.
_ew("Mod", 2, _int_safe(np.fmod), functional=("fmod",))

# Logical reductions over bool tensors.
_LOGICAL: dict[str, Any] = dict(init_attrs=(("keep_dims", False),), call_attrs=(("axis", ()),),
                                accepts=(T.bool_,))
declare(OpDef(name="ReduceAll", kind=PatternKind.REDUCE, inputs=("x",), infer=_reduce_infer,
              reference=_reduce_ref(np.all), reduction=Reduction(ReductionKind.ALL, 1),
              functional=("reduce_all", "all"), **_LOGICAL))
declare(OpDef(name="ReduceAny", kind=PatternKind.REDUCE, inputs=("x",), infer=_reduce_infer,
              reference=_reduce_ref(np.any), reduction=Reduction(ReductionKind.ANY, 0),
              functional=("reduce_any", "any"), **_LOGICAL))

