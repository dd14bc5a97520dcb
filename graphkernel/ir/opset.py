"""Every primitive, declared once: name, inputs, attributes, shape and dtype inference, fusion
pattern kind, numpy reference and C code template.

Adding an operator means adding one `declare(...)` here (and, for a composite op, one expander
function in `graph_kernel/expanders.py`). The frontend's primitive classes, the functional forms,
the IR verifier, the numpy runtime and the C code generator all read this table.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, ShapeError
from graphkernel.ir import types as T
from graphkernel.ir.types import TensorType, TupleType, ValueType


class PatternKind(IntEnum):
    """TVM-style op pattern kinds, ordered: a group's kind is the max of its members'."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCE = 3
    OPAQUE = 4


Infer = Callable[[tuple[TensorType, ...], dict[str, Any]], ValueType]


@dataclass(frozen=True)
class OpDef:
    """The single declaration of a primitive."""

    name: str
    kind: PatternKind
    inputs: tuple[str, ...]
    infer: Infer
    reference: Callable[..., Any]
    # Non-tensor arguments given at call time (after the tensors): they become node attributes.
    call_attrs: tuple[tuple[str, Any], ...] = ()
    # Attributes given to the primitive's constructor, MindSpore style.
    init_attrs: tuple[tuple[str, Any], ...] = ()
    # C expression template for elementwise ops: `{0}`, `{1}` are operands (already in the
    # operand compute type), `{f}` is "f" for float math and "" for double.
    c_template: str | None = None
    # For reductions: the identity and the combine step (`acc`, `v`).
    reduce_init: str | None = None
    reduce_combine: str | None = None
    variadic: bool = False
    aliases: tuple[str, ...] = ()
    doc: str = ""
    # Which dtypes its tensor inputs accept (None: all supported).
    accepts: tuple[np.dtype, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def attr_defaults(self) -> dict[str, Any]:
        return dict(self.init_attrs + self.call_attrs)

    @property
    def functional_name(self) -> str:
        return _snake(self.name)


OPS: dict[str, OpDef] = {}
ALIASES: dict[str, str] = {}


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and (not name[i - 1].isupper() or
                                    (i + 1 < len(name) and name[i + 1].islower())):
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def declare(op: OpDef) -> OpDef:
    if op.name in OPS:
        raise ValueError(f"op {op.name} declared twice")
    OPS[op.name] = op
    for alias in op.aliases:
        ALIASES[alias] = op.name
    return op


def get_op(name: str) -> OpDef:
    name = ALIASES.get(name, name)
    try:
        return OPS[name]
    except KeyError:
        raise DTypeError(f"unknown primitive {name!r}") from None


# ---------------------------------------------------------------------------------------------
# Inference helpers

def _check_dtypes(op: str, types: tuple[TensorType, ...], accepts: tuple[np.dtype, ...] | None
                  ) -> None:
    if accepts is None:
        return
    for i, t in enumerate(types):
        if t.dtype not in accepts:
            names = ", ".join(d.name for d in accepts)
            hint = " (cast it first with P.Cast)" if any(T.is_float(d) for d in accepts) else ""
            raise DTypeError(f"{op} input {i} has dtype {t.dtype.name}; {op} accepts {names}{hint}")


def _elementwise_infer(out_dtype: Callable[[np.dtype], np.dtype] | None = None) -> Infer:
    def infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
        shape = T.broadcast_shapes(*(t.shape for t in types))
        dtype = T.promote(*(t.dtype for t in types))
        return TensorType(shape, out_dtype(dtype) if out_dtype else dtype)
    return infer


def _to_bool(_: np.dtype) -> np.dtype:
    return T.bool_


FLOATS = T.FLOAT_DTYPES
NUMBERS = T.FLOAT_DTYPES + T.INT_DTYPES
ALL = T.SUPPORTED_DTYPES


def _elementwise(name: str, n: int, reference: Callable[..., Any], template: str,
                 accepts: tuple[np.dtype, ...] | None = NUMBERS, aliases: tuple[str, ...] = (),
                 out_dtype: Callable[[np.dtype], np.dtype] | None = None, doc: str = "") -> None:
    names = ("x", "y", "z")[:n]
    declare(OpDef(name=name, kind=PatternKind.ELEMWISE, inputs=names,
                  infer=_elementwise_infer(out_dtype), reference=reference, c_template=template,
                  accepts=accepts, aliases=aliases, doc=doc))


def _same(f: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a numpy ufunc so the result has the promoted dtype of its inputs (no upcasting)."""
    def ref(*args: np.ndarray, **_: Any) -> np.ndarray:
        dtype = np.result_type(*args)
        with np.errstate(all="ignore"):
            return np.asarray(f(*args)).astype(dtype, copy=False)
    ref.ufunc = f  # type: ignore[attr-defined]  # the runtime may call it with `out=`
    return ref


def _quiet(f: Callable[..., Any]) -> Callable[..., Any]:
    def ref(*args: np.ndarray, **_: Any) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(f(*args))
    return ref


# ---------------------------------------------------------------------------------------------
# Elementwise arithmetic

_elementwise("Add", 2, _same(np.add), "({0} + {1})", aliases=("TensorAdd",))
_elementwise("Sub", 2, _same(np.subtract), "({0} - {1})")
_elementwise("Mul", 2, _same(np.multiply), "({0} * {1})")
_elementwise("RealDiv", 2, _same(np.true_divide), "({0} / {1})", accepts=FLOATS,
             aliases=("Div",))
_elementwise("Neg", 1, _same(np.negative), "(-{0})")
# NaN-propagating max/min, like numpy (C's fmax drops NaN). Bitwise `|`, `&` rather than
# `||`, `&&` throughout: short-circuit operators are control flow, which stops vectorisation.
_elementwise("Maximum", 2, _same(np.maximum), "((({0} > {1}) | ({0} != {0})) ? {0} : {1})")
_elementwise("Minimum", 2, _same(np.minimum), "((({0} < {1}) | ({0} != {0})) ? {0} : {1})")
_elementwise("Pow", 2, _same(np.power), "pow{f}({0}, {1})", accepts=FLOATS)
_elementwise("Sqrt", 1, _same(np.sqrt), "sqrt{f}({0})", accepts=FLOATS)
_elementwise("Rsqrt", 1, _same(lambda x: 1 / np.sqrt(x)), "(1 / sqrt{f}({0}))", accepts=FLOATS)
_elementwise("Reciprocal", 1, _same(lambda x: 1 / x), "(1 / {0})", accepts=FLOATS)
_elementwise("Exp", 1, _same(np.exp), "exp{f}({0})", accepts=FLOATS)
_elementwise("Log", 1, _same(np.log), "log{f}({0})", accepts=FLOATS)
_elementwise("Tanh", 1, _same(np.tanh), "tanh{f}({0})", accepts=FLOATS)
_elementwise("Erf", 1, _same(lambda x: _erf(x)), "erf{f}({0})", accepts=FLOATS)
_elementwise("Abs", 1, _same(np.abs), "(({0} < 0) ? -{0} : {0})")
OPS["Abs"].extra["c_float_template"] = "fabs{f}({0})"  # keeps abs(-0.0) == +0.0
_elementwise("Floor", 1, _same(np.floor), "floor{f}({0})", accepts=FLOATS)
_elementwise("Round", 1, _same(np.rint), "rint{f}({0})", accepts=FLOATS)
# sign(+-0.0) is +0.0 as in numpy; NaN stays NaN ({0} != {0}).
_elementwise("Sign", 1, _same(np.sign),
             "(({0} > 0) ? 1 : (({0} < 0) ? -1 : (({0} != {0}) ? {0} : 0)))")
# Comparisons and logic give bool.
for _name, _ufunc, _sym in (("Equal", np.equal, "=="), ("NotEqual", np.not_equal, "!="),
                            ("Less", np.less, "<"), ("LessEqual", np.less_equal, "<="),
                            ("Greater", np.greater, ">"), ("GreaterEqual", np.greater_equal, ">=")):
    _elementwise(_name, 2, _quiet(_ufunc), "({0} " + _sym + " {1})", accepts=ALL,
                 out_dtype=_to_bool)
_elementwise("LogicalAnd", 2, _quiet(np.logical_and), "({0} & {1})", accepts=(T.bool_,))
_elementwise("LogicalOr", 2, _quiet(np.logical_or), "({0} | {1})", accepts=(T.bool_,))
_elementwise("LogicalNot", 1, _quiet(np.logical_not), "(!{0})", accepts=(T.bool_,))


def _erf(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; math.erf per element is exact enough for a reference.
    flat = np.asarray(x, dtype=np.float64).ravel()
    out = np.fromiter((math.erf(v) if v == v else v for v in flat), dtype=np.float64,
                      count=flat.size)
    return out.reshape(np.shape(x))


def _select_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    cond, x, y = types
    if cond.dtype != T.bool_:
        raise DTypeError(f"Select condition must be bool, got {cond.dtype.name}")
    return TensorType(T.broadcast_shapes(cond.shape, x.shape, y.shape), T.promote(x.dtype, y.dtype))


def _select_ref(cond: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(cond, x, y).astype(np.result_type(x, y), copy=False)


declare(OpDef(name="Select", kind=PatternKind.ELEMWISE, inputs=("cond", "x", "y"),
              infer=_select_infer, reference=_select_ref, c_template="({0} ? {1} : {2})"))


def _cast_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    return TensorType(types[0].shape, T.to_dtype(attrs["dtype"]))


def _cast_ref(x: np.ndarray, dtype: Any) -> np.ndarray:
    with np.errstate(all="ignore"):
        return x.astype(T.to_dtype(dtype))


declare(OpDef(name="Cast", kind=PatternKind.ELEMWISE, inputs=("x",), infer=_cast_infer,
              reference=_cast_ref, call_attrs=(("dtype", None),), c_template="{0}"))


# ---------------------------------------------------------------------------------------------
# Reductions: the C code generator keeps the reduced axes as keep_dims=True internally.

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


_REDUCE_ATTRS = dict(init_attrs=(("keep_dims", False),), call_attrs=(("axis", ()),))
declare(OpDef(name="ReduceSum", kind=PatternKind.REDUCE, inputs=("x",), infer=_reduce_infer,
              reference=_reduce_ref(np.sum), reduce_init="0", reduce_combine="{acc} + {v}",
              accepts=NUMBERS, **_REDUCE_ATTRS))  # type: ignore[arg-type]
declare(OpDef(name="ReduceProd", kind=PatternKind.REDUCE, inputs=("x",), infer=_reduce_infer,
              reference=_reduce_ref(np.prod), reduce_init="1", reduce_combine="{acc} * {v}",
              accepts=NUMBERS, **_REDUCE_ATTRS))  # type: ignore[arg-type]
declare(OpDef(name="ReduceMax", kind=PatternKind.REDUCE, inputs=("x",),
              infer=_reduce_nonempty_infer,
              reference=_reduce_ref(np.max, empty_ok=False), reduce_init="-INFINITY",
              reduce_combine="max", accepts=NUMBERS, **_REDUCE_ATTRS))  # type: ignore[arg-type]
declare(OpDef(name="ReduceMin", kind=PatternKind.REDUCE, inputs=("x",),
              infer=_reduce_nonempty_infer,
              reference=_reduce_ref(np.min, empty_ok=False), reduce_init="INFINITY",
              reduce_combine="min", accepts=NUMBERS, **_REDUCE_ATTRS))  # type: ignore[arg-type]
# ReduceMean is a composite: expanded to ReduceSum * (1/n) when fusing.
declare(OpDef(name="ReduceMean", kind=PatternKind.OPAQUE, inputs=("x",), infer=_reduce_infer,
              reference=_reduce_ref(_mean), accepts=FLOATS,
              **_REDUCE_ATTRS))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Shape ops (injective): run as numpy views between kernels.

def _reshape_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    shape = tuple(int(d) for d in attrs["shape"])
    if shape.count(-1) > 1:
        raise ShapeError(f"Reshape: at most one -1 in shape {shape}")
    if -1 in shape:
        known = math.prod([d for d in shape if d != -1])
        if known == 0 or x.size % known:
            raise ShapeError(f"Reshape: cannot reshape {x.shape} into {shape}")
        shape = tuple(x.size // known if d == -1 else d for d in shape)
    if any(d < 0 for d in shape) or math.prod(shape) != x.size:
        raise ShapeError(f"Reshape: cannot reshape {x.shape} ({x.size} elements) into {shape}")
    return TensorType(shape, x.dtype)


# Reshape, ExpandDims and Squeeze join fused kernels when they only add or drop leading unit
# dims (a no-op under right-aligned broadcasting: graph_kernel/schedule.py checks); otherwise
# they run as numpy views between kernels.
_VIEW = {"view": True}
declare(OpDef(name="Reshape", kind=PatternKind.INJECTIVE, inputs=("x",), infer=_reshape_infer,
              reference=lambda x, shape: np.reshape(x, shape), call_attrs=(("shape", None),),
              c_template="{0}", extra=dict(_VIEW)))


def _transpose_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"Transpose: perm {perm} is not a permutation of the {x.rank} axes "
                         f"of a tensor of shape {x.shape}")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


declare(OpDef(name="Transpose", kind=PatternKind.INJECTIVE, inputs=("x",),
              infer=_transpose_infer, reference=lambda x, perm: np.transpose(x, perm),
              call_attrs=(("perm", None),)))


def _expand_dims_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    axis = attrs["axis"]
    if not isinstance(axis, (int, np.integer)) or not -x.rank - 1 <= axis <= x.rank:
        raise ShapeError(f"ExpandDims: axis {axis!r} out of range for rank {x.rank}")
    axis = axis % (x.rank + 1)
    return TensorType(x.shape[:axis] + (1,) + x.shape[axis:], x.dtype)


declare(OpDef(name="ExpandDims", kind=PatternKind.INJECTIVE, inputs=("x",),
              infer=_expand_dims_infer, reference=lambda x, axis: np.expand_dims(x, axis),
              call_attrs=(("axis", None),), c_template="{0}", extra=dict(_VIEW)))


def _squeeze_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    axis = attrs["axis"]
    axes = tuple(i for i, d in enumerate(x.shape) if d == 1) if axis in ((), None) else \
        T.normalize_axes(axis, x.rank)
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeError(f"Squeeze: axis {a} of shape {x.shape} has size {x.shape[a]}, not 1")
    return TensorType(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)


def _squeeze_ref(x: np.ndarray, axis: Any = ()) -> np.ndarray:
    axes = tuple(i for i, d in enumerate(x.shape) if d == 1) if axis in ((), None) else \
        T.normalize_axes(axis, x.ndim)
    return np.squeeze(x, axis=axes)


declare(OpDef(name="Squeeze", kind=PatternKind.INJECTIVE, inputs=("x",), infer=_squeeze_infer,
              reference=_squeeze_ref, init_attrs=(("axis", ()),), c_template="{0}",
              extra=dict(_VIEW)))


def _broadcast_to_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    target = tuple(int(d) for d in attrs["shape"])
    target = tuple(x.shape[i - len(target) + x.rank] if d == -1 else d
                   for i, d in enumerate(target))
    if T.broadcast_shapes(x.shape, target) != target:
        raise ShapeError(f"BroadcastTo: shape {x.shape} cannot broadcast to {target}")
    return TensorType(target, x.dtype)


def _broadcast_to_ref(x: np.ndarray, shape: Any) -> np.ndarray:
    target = _broadcast_to_infer((TensorType(x.shape, x.dtype),), {"shape": shape})
    return np.broadcast_to(x, target.shape)  # type: ignore[union-attr]


declare(OpDef(name="BroadcastTo", kind=PatternKind.BROADCAST, inputs=("x",),
              infer=_broadcast_to_infer, reference=_broadcast_to_ref,
              init_attrs=(("shape", None),), c_template="{0}"))


def _tile_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    mult = tuple(int(m) for m in attrs["multiples"])
    if len(mult) < x.rank or any(m < 0 for m in mult):
        raise ShapeError(f"Tile: multiples {mult} must be non-negative and at least rank "
                         f"{x.rank} for shape {x.shape}")
    shape = (1,) * (len(mult) - x.rank) + x.shape
    return TensorType(tuple(d * m for d, m in zip(shape, mult)), x.dtype)


declare(OpDef(name="Tile", kind=PatternKind.INJECTIVE, inputs=("x",), infer=_tile_infer,
              reference=lambda x, multiples: np.tile(x, multiples),
              call_attrs=(("multiples", None),)))


# ---------------------------------------------------------------------------------------------
# Opaque library ops.

def _matmul_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    a, b = types
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"MatMul needs rank >= 2 inputs, got shapes {a.shape} and {b.shape}")
    if a.dtype != b.dtype or a.dtype not in NUMBERS:
        raise DTypeError(f"MatMul inputs must share a numeric dtype, got {a.dtype.name} and "
                         f"{b.dtype.name}")
    m, k = (a.shape[-1], a.shape[-2]) if attrs["transpose_a"] else a.shape[-2:]
    k2, n = (b.shape[-1], b.shape[-2]) if attrs["transpose_b"] else b.shape[-2:]
    if k != k2:
        raise ShapeError(f"MatMul: inner dimensions differ: {a.shape} "
                         f"(transpose_a={attrs['transpose_a']}) and {b.shape} "
                         f"(transpose_b={attrs['transpose_b']})")
    batch = T.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return TensorType(batch + (m, n), a.dtype)


def _matmul_ref(a: np.ndarray, b: np.ndarray, transpose_a: bool = False,
                transpose_b: bool = False) -> np.ndarray:
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    with np.errstate(all="ignore"):  # NaN/Inf in, NaN/Inf out, as in the kernels: no warning
        return np.matmul(a, b)


_MM_ATTRS = (("transpose_a", False), ("transpose_b", False))
declare(OpDef(name="MatMul", kind=PatternKind.OPAQUE, inputs=("a", "b"), infer=_matmul_infer,
              reference=_matmul_ref, init_attrs=_MM_ATTRS))
declare(OpDef(name="BatchMatMul", kind=PatternKind.OPAQUE, inputs=("a", "b"),
              infer=_matmul_infer, reference=_matmul_ref, init_attrs=_MM_ATTRS))


# ---------------------------------------------------------------------------------------------
# Composite ops: opaque library kernels (numpy) when fusion is off; expanded into basic ops by
# graph_kernel/expanders.py when it is on.

def _unary_float_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    return types[0]


def _composite(name: str, inputs: tuple[str, ...], reference: Callable[..., Any],
               infer: Infer = _unary_float_infer, accepts: tuple[np.dtype, ...] | None = FLOATS,
               init_attrs: tuple[tuple[str, Any], ...] = (), variadic: bool = False) -> None:
    declare(OpDef(name=name, kind=PatternKind.OPAQUE, inputs=inputs, infer=infer,
                  reference=reference, accepts=accepts, init_attrs=init_attrs,
                  variadic=variadic, extra={"composite": True}))


def _as(x: np.ndarray, f: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(f(x.astype(np.float64) if x.dtype == np.float16 else x)
                          ).astype(x.dtype, copy=False)


def _gelu_ref(x: np.ndarray, approximate: str = "tanh") -> np.ndarray:
    if approximate == "tanh":
        return _as(x, lambda v: 0.5 * v * (1 + np.tanh(0.7978845608028654 *
                                                         (v + 0.044715 * v ** 3))))
    return _as(x, lambda v: 0.5 * v * (1 + _erf(v / math.sqrt(2)).astype(v.dtype)))


def _gelu_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    if attrs["approximate"] not in ("tanh", "none"):
        raise DTypeError(f"GeLU approximate must be 'tanh' or 'none', got "
                         f"{attrs['approximate']!r}")
    return types[0]


_composite("GeLU", ("x",), _gelu_ref, infer=_gelu_infer, init_attrs=(("approximate", "tanh"),))
_composite("FastGeLU", ("x",), lambda x: _as(x, lambda v: v / (1 + np.exp(-1.702 * v))))
_composite("Sigmoid", ("x",), lambda x: _as(x, lambda v: 1 / (1 + np.exp(-v))))
_composite("SiLU", ("x",), lambda x: _as(x, lambda v: v / (1 + np.exp(-v))))
_composite("ReLU", ("x",), lambda x: np.maximum(x, np.zeros((), x.dtype)), accepts=NUMBERS)
_composite("ReLU6", ("x",), lambda x: np.minimum(np.maximum(x, np.zeros((), x.dtype)),
                                                  np.asarray(6, x.dtype)), accepts=NUMBERS)
_composite("HSwish", ("x",), lambda x: _as(x, lambda v: v * np.minimum(np.maximum(v + 3, 0), 6)
                                           / 6))
_composite("Softplus", ("x",), lambda x: _as(x, lambda v: np.log1p(np.exp(v))))
_composite("Square", ("x",), lambda x: np.multiply(x, x), accepts=NUMBERS)


def _binary_same_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    return TensorType(T.broadcast_shapes(types[0].shape, types[1].shape),
                      T.promote(types[0].dtype, types[1].dtype))


_composite("SquaredDifference", ("x", "y"), lambda x, y: _same(lambda a, b: (a - b) * (a - b))(
    x, y), infer=_binary_same_infer, accepts=NUMBERS)


def _bias_add_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    x, b = types
    if b.rank != 1 or x.rank < 2 or x.shape[1 if x.rank > 2 else -1] != b.shape[0]:
        raise ShapeError(f"BiasAdd: bias of shape {b.shape} does not match the channel axis of "
                         f"input {x.shape} (axis 1, or the last axis of a 2-d input)")
    return TensorType(x.shape, T.promote(x.dtype, b.dtype))


def _bias_add_ref(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return _same(np.add)(x, b.reshape(shape))


_composite("BiasAdd", ("x", "b"), _bias_add_ref, infer=_bias_add_infer)


def _addn_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    if not types:
        raise ShapeError("AddN needs at least one tensor")
    return TensorType(T.broadcast_shapes(*(t.shape for t in types)),
                      T.promote(*(t.dtype for t in types)))


def _addn_ref(*xs: np.ndarray) -> np.ndarray:
    out = xs[0]
    for x in xs[1:]:
        out = _same(np.add)(out, x)
    return np.asarray(out)


_composite("AddN", ("xs",), _addn_ref, infer=_addn_infer, accepts=NUMBERS, variadic=True)


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


_composite("Softmax", ("x",), _softmax_ref, infer=_axis_infer, init_attrs=(("axis", -1),))
_composite("LogSoftmax", ("x",), _log_softmax_ref, infer=_axis_infer, init_attrs=(("axis", -1),))


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
    norm = begin_norm_axis % x.ndim
    axes = tuple(range(norm, x.ndim))
    with np.errstate(all="ignore"):
        mean = x.mean(axis=axes, keepdims=True, dtype=np.float64).astype(x.dtype)
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True, dtype=np.float64).astype(x.dtype)
        y = (x - mean) / np.sqrt(var + np.asarray(epsilon, x.dtype)) * gamma + beta
    return y.astype(x.dtype, copy=False), mean, var


_composite("LayerNorm", ("x", "gamma", "beta"), _layer_norm_ref, infer=_layer_norm_infer,
           init_attrs=(("begin_norm_axis", -1), ("begin_params_axis", -1), ("epsilon", 1e-7)))


# ---------------------------------------------------------------------------------------------
# Structural ops of the IR (not callable from the frontend).

def _getitem_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    raise AssertionError("GetItem is inferred from its tuple input by the graph")


declare(OpDef(name="GetItem", kind=PatternKind.INJECTIVE, inputs=("tuple",),
              infer=_getitem_infer, reference=lambda t, index: t[index],
              call_attrs=(("index", 0),), extra={"structural": True}))


def is_composite_op(name: str) -> bool:
    return bool(OPS[name].extra.get("composite"))


def user_ops() -> list[OpDef]:
    """Ops a user may call (everything but the IR's structural ops)."""
    return [op for op in OPS.values() if not op.extra.get("structural")]
