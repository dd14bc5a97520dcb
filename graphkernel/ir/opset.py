"""The op table's machinery: what a primitive's declaration holds, the registry, and the helpers
declarations share. The declarations themselves live in `graphkernel/ir/opdefs/`, one module per
family (elementwise, reductions, shape ops, matmul, composites, structural ops).

Adding an operator means adding one `declare(OpDef(...))` there (and, for a composite op, one
expander function in `graph_kernel/expanders.py`). The frontend's primitive classes, the
functional forms, the IR verifier, the numpy runtime, the cost model and the C code generator all
read this table.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, InputError
from graphkernel.ir import types as T
from graphkernel.ir.types import TensorType, ValueType


class PatternKind(IntEnum):
    """TVM-style op pattern kinds, ordered: a group's kind is the max of its members'."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCE = 3
    OPAQUE = 4


class Window(Enum):
    """A sliding-window op over NCHW images (`OpDef.window`)."""

    CONVOLUTION = "convolution"
    POOL = "pool"
    POOL_GRAD = "pool gradient"  # MaxPoolGrad, AvgPoolGrad: x (and dout) in, dx out
    FILTER_GRAD = "filter gradient"  # Conv2DBackpropFilter: dout and x in, dw out


class AttrKind(Enum):
    """What an attribute's value must be (`OpDef.attr_kind`), in words for messages."""

    BOOL = "True or False"
    INT = "an integer"
    COUNT = "an integer from 0"  # a size, a count, an item number
    REAL = "a finite number"
    DTYPE = "a dtype"
    TEXT = "a word"
    TEXTS = "a tuple of strings"  # free text (OpDef.text_attrs: Print's texts)
    INTS = "a tuple of integers"
    INT_OR_INTS = "an integer or a tuple of integers"
    AXES = "an axis, a tuple of axes, or None (every axis)"
    # A target shape the compiler wrote for a shape-generic graph (a broadcast to [N, 4]): its
    # dynamic sizes are the graph's symbols, checked against the input types by shape inference
    SHAPE = "a tuple of integers and dynamic sizes"


# Integers reach generated C as literals: int64's range.
_INT_LIMIT = 1 << 63


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and \
        -_INT_LIMIT <= int(value) < _INT_LIMIT


def _is_kind(value: Any, kind: AttrKind) -> bool:
    if kind is AttrKind.BOOL:
        return isinstance(value, (bool, np.bool_))
    if kind is AttrKind.INT:
        return _is_int(value)
    if kind is AttrKind.COUNT:
        return _is_int(value) and value >= 0
    if kind is AttrKind.REAL:
        return (_is_int(value) or isinstance(value, (float, np.floating))) and \
            math.isfinite(value)
    if kind is AttrKind.DTYPE:
        return isinstance(value, np.dtype)
    if kind is AttrKind.TEXT:
        return isinstance(value, str)
    if kind is AttrKind.TEXTS:
        return isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value)
    if kind is AttrKind.AXES and value is None:  # `ReduceSum()(x, None)`, `ops.mean(x)`
        return True
    if kind is AttrKind.SHAPE:
        return isinstance(value, (tuple, list)) and \
            all(_is_int(v) or isinstance(v, T.SymSize) for v in value)
    ints = isinstance(value, (tuple, list)) and all(_is_int(v) for v in value)
    return ints or (kind in (AttrKind.INT_OR_INTS, AttrKind.AXES) and _is_int(value))


def _kind_of_default(default: Any) -> AttrKind | None:
    """An attribute's kind as its default value says (None: the default does not say)."""
    for kind in (AttrKind.BOOL, AttrKind.INT, AttrKind.REAL, AttrKind.DTYPE, AttrKind.TEXT):
        if _is_kind(default, kind):
            return kind
    return AttrKind.AXES if default == () else None  # a reduction's or Squeeze's axes


def int_tuple_kinds(*names: str) -> tuple[tuple[str, AttrKind], ...]:
    """`OpDef.attr_kinds` for attributes that are each a tuple of integers."""
    return tuple((name, AttrKind.INTS) for name in names)


class ReductionKind(Enum):
    """What a reduce op folds its axis with."""

    SUM = "sum"
    PRODUCT = "product"
    MAX = "max"
    MIN = "min"
    ALL = "all"  # logical and
    ANY = "any"  # logical or


@dataclass(frozen=True)
class Reduction:
    """How a reduce op folds its axis: its kind and identity (a backend spells both)."""

    kind: ReductionKind
    # The fold's starting value; +-inf stands for the dtype's limits when it has no infinity.
    identity: float
    propagates_nan: bool = False  # float max/min: a NaN anywhere makes the result NaN


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
    reduction: Reduction | None = None
    # It calls a vector math function (exp, log, tanh, ...): a kernel with it is
    # compute-bound (no streaming stores).
    vector_math: bool = False
    # Costs far more than a load (vector math, division, square roots): the cost model limits
    # recomputing it, and a reduction's epilogue reloads it rather than computing it again.
    expensive: bool = False
    # Only relabels the shape (Reshape, ExpandDims, Squeeze): fuses when no data moves.
    view: bool = False
    # Its reverse-mode rule: grad(b, node, dout, attrs) -> one gradient per tensor input (None
    # where none flows), built with `b`, an ir.build.GraphBuilder, from the forward node (its
    # inputs and output) and `dout`, the gradient of its output (a tuple, None for unused items,
    # when it has several). None: no rule, so differentiating through it is an error.
    grad: Callable[..., Sequence[Any]] | None = None
    # Input positions it writes in place (Assign, ApplyMomentum): each must be a Parameter, and
    # its outputs are their new values, in that order (the graph records them in `assigns`).
    writes: tuple[int, ...] = ()
    # Which outputs are those new values, in `writes` order, when they are not the first ones
    # (LambApplyOptimizerAssign returns the update first, then the written v and m).
    write_outputs: tuple[int, ...] = ()
    # Calling it returns its first output alone, as MindSpore's primitive does (ApplyMomentum
    # returns the updated variable; the accumulation's new value is written, not returned).
    returns_first_only: bool = False
    # A matrix product: a BLAS GEMM (numpy's, or called from a compiled entry), never fused;
    # layout ops around it may be read or written through strided views.
    gemm: bool = False
    # A convolution or a pool over NCHW images: a window kernel of its own, or (a convolution)
    # with the pointwise group after it as one block.
    window: Window | None = None
    # Runs as its numpy reference unfused; expanded into basic ops when fusing.
    composite: bool = False
    # Alone (outside any fused group) it still moves or sums every element (a transposed
    # copy, a concatenation, a sum), so it runs as a generated loop nest of its own rather
    # than a numpy step, which would keep the whole plan off the compiled entry
    # (graph_kernel/single_op.py). Views, products and windows are not.
    kernel_alone: bool = False
    # An op of the IR itself (GetItem), not callable from the frontend.
    structural: bool = False
    variadic: bool = False
    aliases: tuple[str, ...] = ()
    doc: str = ""
    # Which dtypes its tensor inputs accept (None: all supported).
    accepts: tuple[np.dtype, ...] | None = None
    # Draws random numbers (Dropout): never merged with a twin by CSE, never constant-folded.
    stateful: bool = False
    # Acts beyond its result (Print writes to stdout): the graph keeps the node in
    # `Graph.effects`, so dead-code elimination keeps it though nothing reads its result.
    effect: bool = False
    # Attributes holding free text (Print's texts): written out, never into generated code, so
    # a file may carry any string there (other string attributes are identifiers).
    text_attrs: tuple[str, ...] = ()
    # Known from the input types alone (Shape, Size): calling it gives this Python value while
    # tracing, as in MindSpore's graph mode, and never a node.
    static_value: Callable[[tuple[TensorType, ...], dict[str, Any]], Any] | None = None
    # MindSpore 2.x's functional names (`ops.gelu`); empty: from MINDSPORE_FUNCTIONAL, else the
    # snake-case of the name.
    functional: tuple[str, ...] = ()
    # Attributes that are a tuple of integers (a shape, a permutation, multiples). Every
    # attribute declared with the default None must be given; one declared with a bool default
    # must be a bool (see check_attrs).
    int_tuple_attrs: tuple[str, ...] = ()
    # The kind of each attribute whose default does not tell it (a default of None), or whose
    # values are wider than the default's kind (a kernel size of one int or a pair). The others
    # are the default's kind: a bool, an int, a float (any finite number), a word, a dtype, ()
    # (an integer or a tuple of them). See `attr_kind` and `check_attr_kinds`.
    attr_kinds: tuple[tuple[str, AttrKind], ...] = ()

    def __post_init__(self) -> None:
        if self.vector_math and not self.expensive:
            object.__setattr__(self, "expensive", True)  # vector math is never cheap
        for name, _ in self.init_attrs + self.call_attrs:
            if self.attr_kind(name) is None:
                raise ValueError(f"op {self.name}: attribute {name} needs its kind declared "
                                 "(attr_kinds)")
        if (self.kind == PatternKind.REDUCE) != (self.reduction is not None) and \
                not self.composite:
            raise ValueError(f"op {self.name}: a reduce op declares its Reduction, no other op")

    @property
    def written_outputs(self) -> tuple[int, ...]:
        """The output positions holding each written input's new value, in `writes` order."""
        return self.write_outputs or tuple(range(len(self.writes)))

    @property
    def attr_defaults(self) -> dict[str, Any]:
        return dict(self.init_attrs + self.call_attrs)

    @property
    def functional_names(self) -> tuple[str, ...]:
        """`graphkernel.ops.<name>` for each: MindSpore 2.x's names first."""
        names = self.functional or MINDSPORE_FUNCTIONAL.get(self.name, ())
        return names or (_snake(self.name),)

    @property
    def functional_name(self) -> str:
        return self.functional_names[0]

    def attr_kind(self, name: str) -> AttrKind | None:
        """The kind of attribute `name` (None: the op has no such attribute)."""
        declared = dict(self.attr_kinds)
        if name in declared:
            return declared[name]
        if name in self.int_tuple_attrs:
            return AttrKind.INTS
        defaults = self.attr_defaults
        return _kind_of_default(defaults[name]) if name in defaults else None

    def check_attr_kinds(self, attrs: dict[str, Any]) -> None:
        """Every attribute is one the op declares, of its kind: for a graph read from a file,
        whose attributes reach shape inference, the runtime and generated C (a forged
        `epsilon="x"`, or an attribute only the builder sets). None is the value of an
        optional constructor attribute (Unstack's num) only. Raises InputError naming it."""
        defaults = self.attr_defaults
        call_names = {name for name, _ in self.call_attrs}
        for name, value in attrs.items():
            kind = self.attr_kind(name)
            if kind is None:
                raise InputError(f"{self.name} has no attribute {name!r}")
            if value is None and defaults[name] is None and name not in call_names:
                continue
            if not _is_kind(value, kind):
                raise InputError(f"{self.name}: attribute {name} must be {kind.value}, got "
                                 f"{value!r:.60}")

    def check_attrs(self, attrs: dict[str, Any]) -> None:
        """Refuse attribute values of the wrong kind before shape inference reads them: a
        missing required one (`P.Cast()(x)`), a non-bool flag (`keep_dims="yes"`), a shape that
        is not integers (`P.Reshape()(x, None)`)."""
        call_names = {name for name, _ in self.call_attrs}
        for name, default in self.init_attrs + self.call_attrs:
            if name not in attrs:
                continue
            value = attrs[name]
            # A call argument declared with the default None must be given (an attribute given
            # to the constructor may be optional: Unstack's num).
            if value is None and default is None and name in call_names:
                raise InputError(f"{self.name} needs its {name!r} argument (got None)")
            if isinstance(default, bool) and not isinstance(value, (bool, np.bool_)):
                raise InputError(f"{self.name}: {name} must be True or False, got {value!r}")
            if name in self.int_tuple_attrs and not (
                    isinstance(value, (tuple, list)) and
                    all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                        for v in value)):
                dynamic = [str(v) for v in value if isinstance(v, T.SymSize)] \
                    if isinstance(value, (tuple, list)) else []
                hint = (f" ({', '.join(dynamic)}: a dynamic size has no value while tracing; "
                        "give -1 for it)") if dynamic else ""
                raise InputError(f"{self.name}: {name} must be a tuple of integers, got "
                                 f"{value!r}{hint}")


# MindSpore 2.x's functional names of the ops declared before `OpDef.functional` existed (new
# declarations name theirs in place); `reduce_sum` and friends stay, tests and users call them.
# Where MindSpore's signature differs from "tensors, call arguments, attributes as keywords"
# (ops.gelu defaults to approximate='none', ops.softmax takes axis positionally), the frontend's
# ops/functional.py defines the function by hand under the same name.
MINDSPORE_FUNCTIONAL: dict[str, tuple[str, ...]] = {
    "Add": ("add",), "Sub": ("sub",), "Mul": ("mul",), "RealDiv": ("div", "real_div"),
    "Neg": ("neg",),
    "Maximum": ("maximum",), "Minimum": ("minimum",), "Pow": ("pow",), "Sqrt": ("sqrt",),
    "Rsqrt": ("rsqrt",), "Reciprocal": ("reciprocal",), "Exp": ("exp",), "Log": ("log",),
    "Tanh": ("tanh",), "Erf": ("erf",), "Abs": ("abs",), "Floor": ("floor",),
    "Round": ("round",), "Sign": ("sign",), "Equal": ("equal",), "NotEqual": ("not_equal", "ne"),
    "Less": ("less", "lt"), "LessEqual": ("less_equal", "le"), "Greater": ("greater", "gt"),
    "GreaterEqual": ("greater_equal", "ge"), "LogicalAnd": ("logical_and",),
    "LogicalOr": ("logical_or",), "LogicalNot": ("logical_not",), "Select": ("select",),
    "Cast": ("cast",), "ReduceSum": ("reduce_sum",), "ReduceProd": ("reduce_prod",),
    "ReduceMax": ("reduce_max",), "ReduceMin": ("reduce_min",), "ReduceMean": ("reduce_mean",),
    "Reshape": ("reshape",), "Transpose": ("transpose",), "ExpandDims": ("expand_dims",),
    "Squeeze": ("squeeze",), "BroadcastTo": ("broadcast_to",), "Tile": ("tile",),
    "MatMul": ("matmul",), "BatchMatMul": ("bmm", "batch_matmul"), "GeLU": ("gelu",),
    "FastGeLU": ("fast_gelu",), "Sigmoid": ("sigmoid",), "SiLU": ("silu",), "ReLU": ("relu",),
    "ReLU6": ("relu6",), "HSwish": ("hardswish",), "Softplus": ("softplus",),
    "Square": ("square",), "SquaredDifference": ("squared_difference",),
    "BiasAdd": ("bias_add",), "AddN": ("addn",), "Softmax": ("softmax",),
    "LogSoftmax": ("log_softmax",), "LayerNorm": ("layer_norm",),
}


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


def is_composite_op(name: str) -> bool:
    return OPS[name].composite


def user_ops() -> list[OpDef]:
    """Ops a user may call (everything but the IR's structural ops)."""
    return [op for op in OPS.values() if not op.structural]


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


def elementwise_infer(out_dtype: Callable[[np.dtype], np.dtype] | None = None) -> Infer:
    def infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
        shape = T.broadcast_shapes(*(t.shape for t in types))
        dtype = T.promote(*(t.dtype for t in types))
        return TensorType(shape, out_dtype(dtype) if out_dtype else dtype)
    return infer


def to_bool(_: np.dtype) -> np.dtype:
    return T.bool_


FLOATS = T.FLOAT_DTYPES
NUMBERS = T.FLOAT_DTYPES + T.INT_DTYPES
ALL = T.SUPPORTED_DTYPES


def declare_elementwise(name: str, n: int, reference: Callable[..., Any],
                 accepts: tuple[np.dtype, ...] | None = NUMBERS, aliases: tuple[str, ...] = (),
                 out_dtype: Callable[[np.dtype], np.dtype] | None = None, doc: str = "",
                 **typed: Any) -> None:
    """Declare an elementwise op; `typed`: further OpDef fields (vector_math, expensive, ...)."""
    names = ("x", "y", "z")[:n]
    declare(OpDef(name=name, kind=PatternKind.ELEMWISE, inputs=names,
                  infer=elementwise_infer(out_dtype), reference=reference,
                  accepts=accepts, aliases=aliases, doc=doc, **typed))


def same_dtype_ref(f: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a numpy ufunc so the result has the promoted dtype of its inputs (no upcasting)."""
    def ref(*args: np.ndarray, **_: Any) -> np.ndarray:
        dtype = np.result_type(*args)
        with np.errstate(all="ignore"):
            return np.asarray(f(*args)).astype(dtype, copy=False)
    ref.ufunc = f  # type: ignore[attr-defined]  # the runtime may call it with `out=`
    return ref


def quiet_ref(f: Callable[..., Any]) -> Callable[..., Any]:
    def ref(*args: np.ndarray, **_: Any) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(f(*args))
    return ref
