"""Reductions. Code generators keep the reduced axes as keep_dims=True internally;
ReduceMean is a composite, expanded to ReduceSum * (1/n) when fusing."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from graphkernel.errors import ShapeError
from graphkernel.ir import types as T
from graphkernel.ir.opset import (
    FLOATS,
    NUMBERS,
    OpDef,
    PatternKind,
    Reduction,
    ReductionKind,
    declare,
)
from graphkernel.ir.types import TensorType, ValueType


def _reduce_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    axes = T.normalize_axes(attrs["axis"], x.rank)
    if attrs["keep_dims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return TensorType(shape, x.dtype)


def _reduce_nonempty_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    """ReduceMax/ReduceMin: reducing an empty axis has no answer, so it is a compile error."""
    (x,) = types
    axes = T.normalize_axes(attrs["axis"], x.rank)
    if any(x.shape[a] == 0 for a in axes):
        raise ShapeError(f"cannot take the max or min over an empty axis: axis "
                         f"{attrs['axis']!r} of shape {x.shape} has no elements")
    return _reduce_infer(types, attrs)


def _reduce_ref(f: Callable[..., Any], empty_ok: bool = True) -> Callable[..., Any]:
    def ref(x: np.ndarray, axis: Any = (), keep_dims: bool = False) -> np.ndarray:
        axes = T.normalize_axes(axis, x.ndim)
        with np.errstate(all="ignore"):
            if not empty_ok and any(x.shape[a] == 0 for a in axes):
                raise ShapeError(f"cannot reduce over an empty axis (shape {x.shape})")
            # float16 sums and products accumulate in float32, as the generated kernels do
            # (numpy's own float16 accumulation depends on the layout: an axis-0 product
            # overflowed to inf where the kernel's was finite).
            wide = {"dtype": np.float32} if x.dtype == T.float16 and f in (np.sum, np.prod) \
                else {}
            out = f(x, axis=axes, keepdims=bool(keep_dims), **wide)
        return np.asarray(out).astype(x.dtype, copy=False)
    return ref


def _mean(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    # np.mean warns on an empty axis; the mean over nothing is NaN, quietly.
    count = math.prod([x.shape[a] for a in axis])
    total = np.sum(x, axis=axis, keepdims=keepdims, dtype=np.float64)
    return total / count if count else np.full(np.shape(total), np.nan)


# Gradient rules (OpDef.grad): the output's gradient, given back the reduced axes (keep_dims
# shape) and broadcast over them.
def _kept(b: Any, n: Any, v: Any, attrs: dict[str, Any]) -> Any:
    x = n.inputs[0]
    axes = T.normalize_axes(attrs["axis"], len(x.shape))
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return v if v.shape == shape else b("Reshape", v, shape=shape)


def _sum_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    return [b.broadcast_to(_kept(b, n, dy, attrs), n.inputs[0].shape)]


def inverse_count(b: Any, x: Any, axis: Any, keep_dims: bool) -> Any:
    """1/n for a mean of `x` over `axis`: a number when n is known; when a dynamic size is
    among the reduced ones, a value each call computes (the reciprocal of a sum of ones over
    the reduced axes, shaped as that reduction with `keep_dims`: exact up to 2**24 elements
    in float32, as a float32 count is)."""
    axes = T.normalize_axes(axis, len(x.shape))
    count = math.prod([x.shape[a] for a in axes]) if axes else 1
    if not isinstance(count, T.SymSize):
        return 1.0 / count if count else math.inf  # over no elements: NaN, as numpy's
    ones = b.ones(TensorType(tuple(d if i in axes else 1 for i, d in enumerate(x.shape)),
                             x.dtype))
    return b("Reciprocal", b("ReduceSum", ones, axis=axes, keep_dims=keep_dims))


def _mean_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    x = n.inputs[0]
    scaled = b("Mul", _kept(b, n, dy, attrs), inverse_count(b, x, attrs["axis"], True))
    return [b.broadcast_to(scaled, x.shape)]


def _extremum_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    """Shared equally among the elements that reach the max (min), as MindSpore does."""
    x = n.inputs[0]
    hit = b.cast(b("Equal", x, _kept(b, n, n, attrs)), x.dtype)
    count = b("ReduceSum", hit, axis=attrs["axis"], keep_dims=True)
    return [b("Mul", hit, b("RealDiv", _kept(b, n, dy, attrs), count))]


def _prod_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    """dy * prod / x: exact for non-zero x (a zero in x gives NaN there, as 0/0)."""
    x = n.inputs[0]
    return [b("RealDiv", b("Mul", _kept(b, n, dy, attrs), _kept(b, n, n, attrs)), x)]


# Max and min propagate NaN like numpy.
_MAX = Reduction(ReductionKind.MAX, -math.inf, propagates_nan=True)
_MIN = Reduction(ReductionKind.MIN, math.inf, propagates_nan=True)
_REDUCE_ATTRS: dict[str, Any] = dict(init_attrs=(("keep_dims", False),),
                                     call_attrs=(("axis", ()),))
declare(OpDef(name="ReduceSum", kind=PatternKind.REDUCE, inputs=("x",), infer=_reduce_infer,
              reference=_reduce_ref(np.sum), reduction=Reduction(ReductionKind.SUM, 0),
              accepts=NUMBERS, grad=_sum_grad, kernel_alone=True, **_REDUCE_ATTRS))
declare(OpDef(name="ReduceProd", kind=PatternKind.REDUCE, inputs=("x",), infer=_reduce_infer,
              reference=_reduce_ref(np.prod), reduction=Reduction(ReductionKind.PRODUCT, 1),
              accepts=NUMBERS, grad=_prod_grad, **_REDUCE_ATTRS))
declare(OpDef(name="ReduceMax", kind=PatternKind.REDUCE, inputs=("x",),
              infer=_reduce_nonempty_infer,
              reference=_reduce_ref(np.max, empty_ok=False), reduction=_MAX,
              accepts=NUMBERS, grad=_extremum_grad, **_REDUCE_ATTRS))
declare(OpDef(name="ReduceMin", kind=PatternKind.REDUCE, inputs=("x",),
              infer=_reduce_nonempty_infer,
              reference=_reduce_ref(np.min, empty_ok=False), reduction=_MIN,
              accepts=NUMBERS, grad=_extremum_grad, **_REDUCE_ATTRS))
# ReduceMean is a composite: expanded to ReduceSum * (1/n) when fusing.
declare(OpDef(name="ReduceMean", kind=PatternKind.OPAQUE, inputs=("x",), infer=_reduce_infer,
              reference=_reduce_ref(_mean), accepts=FLOATS, composite=True, grad=_mean_grad,
              **_REDUCE_ATTRS))
