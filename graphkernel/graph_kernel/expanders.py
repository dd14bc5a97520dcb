"""Expanders: each composite op written as a small function of basic ops.

With fusion on, the expand stage replaces a composite op's node by a composite node holding its
expansion (so the dumps show it), and clustering may then merge it with its neighbours.

Every expansion is numerically stable where its textbook form overflows or cancels (the list,
with each stable form, is in docs/perf-notes.md "Numerics"); the op's numpy reference in
`ir/opdefs/composite.py` uses the same form. Expanders registered with `float16_in_float32`
compute float16 inputs in float32 and round once at the end, as MindSpore's LayerNorm and
Softmax expanders do: rounding after every basic op drifts by several float16 ulp, and a
float16 running sum overflows past 65504.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from graphkernel.ir import types as T
from graphkernel.ir.build import GraphBuilder
from graphkernel.ir.graph import Graph, Input, Node, Value, node_phases, note_phases
from graphkernel.ir.opdefs.reduction import inverse_count
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import TupleType

Expander = Callable[..., Value | tuple[Value, ...]]
_E = TypeVar("_E", bound=Expander)  # the decorated function keeps its own signature
EXPANDERS: dict[str, Expander] = {}
# Composites whose float16 inputs are computed in float32 and rounded once at the end.
FLOAT16_IN_FLOAT32: set[str] = set()


# Ops whose expansion covers only some of their nodes (the rest run as the op itself): which.
EXPANDS_WHEN: dict[str, Callable[[Node], bool]] = {}


def expander(op_name: str, float16_in_float32: bool = False,
             when: Callable[[Node], bool] | None = None) -> Callable[[_E], _E]:
    def register(fn: _E) -> _E:
        get_op(op_name)  # the op must be declared in the op table
        EXPANDERS[op_name] = fn
        if float16_in_float32:
            FLOAT16_IN_FLOAT32.add(op_name)
        if when is not None:
            EXPANDS_WHEN[op_name] = when
        return fn
    return register


def has_expansion(node: Node) -> bool:
    """Whether `node`'s op has an expander that covers this node."""
    if node.op not in EXPANDERS:
        return False
    when = EXPANDS_WHEN.get(node.op)
    return when is None or when(node)


class Builder(GraphBuilder):
    """Appends basic-op nodes to an expansion's graph, at the expanded node's line of
    `construct`; Python numbers become scalar constants of the dtype of the first tensor operand
    (weak typing)."""

    def __init__(self, graph: Graph, source: Node) -> None:
        super().__init__(graph, source.loc)
        self.source = source


def expand_node(node: Node) -> Node:
    """A composite node computing `node` from basic ops (same inputs, same outputs)."""
    sub = Graph(node.op)
    inner = [Input(v.tensor_type, f"x{i}") for i, v in enumerate(node.inputs)]
    sub.inputs = inner
    build = Builder(sub, node)
    phases = node_phases(node)  # the expansion computes the part of the step its op did
    note_phases(build.notes, phases)
    opdef = get_op(node.op)
    attrs = {**opdef.attr_defaults, **node.attrs}
    args: list[Value] = list(inner)
    wide = node.op in FLOAT16_IN_FLOAT32 and any(v.dtype == T.float16 for v in inner)
    if wide:
        args = [build("Cast", v, dtype=T.float32) if v.dtype == T.float16 else v for v in inner]
    result = EXPANDERS[node.op](build, *args, **attrs)
    outs = list(result) if isinstance(result, tuple) else [result]
    if wide:
        declared = node.type.items if isinstance(node.type, TupleType) else (node.type,)
        outs = [build("Cast", o, dtype=want.dtype) if o.dtype != want.dtype else o
                for o, want in zip(outs, declared)]
    sub.outputs = outs
    sub.returns_tuple = isinstance(result, tuple)
    type_ = outs[0].type if len(outs) == 1 else TupleType(tuple(o.tensor_type for o in outs))
    composite = Node("Composite", node.inputs, {}, type_, node.name, node.loc, sub)
    composite.notes["expanded_from"] = node.op
    note_phases(composite.notes, phases)
    return composite


def _reduced_size(x: Value, axis: Any) -> int:
    from graphkernel.ir.types import normalize_axes
    axes = normalize_axes(axis, len(x.shape))
    return math.prod([x.shape[a] for a in axes]) if axes else 1


def _inverse_count(n: int) -> float:
    """1/n for a mean; over no elements the mean is NaN, as numpy's (0 * inf)."""
    return 1.0 / n if n else math.inf


# ---------------------------------------------------------------------------------------------

def _sigmoid(b: Builder, t: Value) -> Value:
    """1/(1 + exp(-t)) from e = exp(-|t|) <= 1, which never overflows: 1/(1 + e) for t >= 0,
    e/(1 + e) below (where 1/(1 + exp(-t)) lost the tail below float's smallest value). One
    division of a selected numerator: a reciprocal, a product and a select cost more."""
    e = b("Exp", b("Neg", b("Abs", t)))
    return b("RealDiv", b("Select", b("GreaterEqual", t, 0.0), b.const(1.0, e), e),
             b("Add", e, 1.0))


def _times_sigmoid(b: Builder, x: Value, t: Value) -> Value:
    """x sigmoid(t) as one division: x/(1 + e) for t >= 0, x e/(1 + e) below, e = exp(-|t|).
    x is clamped to the dtype's finite range in x e, so x = -inf (e = 0 there) gives -0.0, not
    -inf * 0 = NaN; NaN passes. Against x times the sigmoid this saves a product, a select
    and a comparison per element (BiasAdd + GeLU's loop 0.469 -> 0.449 ns per element)."""
    e = b("Exp", b("Neg", b("Abs", t)))
    lowest = b.const(-float(np.finfo(x.dtype).max), x)
    finite = b("Select", b("Less", x, lowest), lowest, x)
    numerator = b("Select", b("GreaterEqual", t, 0.0), x, b("Mul", finite, e))
    return b("RealDiv", numerator, b("Add", e, 1.0))


def _times(b: Builder, x: Value, factor: Value) -> Value:
    """x * factor for a factor that tends to 0 as x -> -inf: -0.0 there, not -inf * 0 = NaN."""
    return b("Select", b("Equal", factor, 0.0), b.const(-0.0, x), b("Mul", x, factor))


@expander("GeLU", float16_in_float32=True)
def gelu(b: Builder, x: Value, approximate: str = "tanh") -> Value:
    if approximate == "tanh":
        # 0.5 x (1 + tanh(z)) = x sigmoid(2z): 1 + tanh(z) cancelled for negative x. Written as
        # 2z = x (k + 0.044715 k x^2), k = 2 sqrt(2/pi), z overflows to +-inf (sigmoid 1 or 0)
        # rather than to NaN, in one product fewer than k x (1 + 0.044715 x^2) (BiasAdd + GeLU's
        # loop 0.438 -> 0.426 ns per element).
        k = 2 * math.sqrt(2 / math.pi)
        two_z = b("Mul", x, b("Add", b("Mul", b("Mul", x, x), 0.044715 * k), k))
        return _times_sigmoid(b, x, two_z)
    # 1 + erf(t) = erfc(-t), accurate where erf(t) is near -1.
    return _times(b, b("Mul", x, 0.5), b("Erfc", b("Mul", x, -1 / math.sqrt(2))))


@expander("FastGeLU", float16_in_float32=True)
def fast_gelu(b: Builder, x: Value) -> Value:
    return _times_sigmoid(b, x, b("Mul", x, 1.702))


@expander("Sigmoid", float16_in_float32=True)
def sigmoid(b: Builder, x: Value) -> Value:
    return _sigmoid(b, x)


@expander("SiLU", float16_in_float32=True)
def silu(b: Builder, x: Value) -> Value:
    return _times_sigmoid(b, x, x)


@expander("ReLU")
def relu(b: Builder, x: Value) -> Value:
    return b("Maximum", x, 0)


@expander("ReLU6")
def relu6(b: Builder, x: Value) -> Value:
    return b("Minimum", b("Maximum", x, 0), 6)


@expander("HSwish", float16_in_float32=True)
def hswish(b: Builder, x: Value) -> Value:
    clipped = b("Minimum", b("Maximum", b("Add", x, 3.0), 0.0), 6.0)
    return b("RealDiv", b("Mul", x, clipped), 6.0)


@expander("Softplus", float16_in_float32=True)
def softplus(b: Builder, x: Value) -> Value:
    # log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): exp(x) overflowed (float32 softplus(89)
    # was inf) and 1 + exp(x) dropped exp(x) < 1e-8 (softplus(-20) was 0).
    return b("Add", b("Maximum", x, 0.0), b("Log1p", b("Exp", b("Neg", b("Abs", x)))))


@expander("Square")
def square(b: Builder, x: Value) -> Value:
    return b("Mul", x, x)


@expander("SquaredDifference")
def squared_difference(b: Builder, x: Value, y: Value) -> Value:
    diff = b("Sub", x, y)
    return b("Mul", diff, diff)


@expander("AddN")
def add_n(b: Builder, *xs: Value) -> Value:
    total = xs[0]
    for x in xs[1:]:
        total = b("Add", total, x)
    return total


@expander("BiasAdd")
def bias_add(b: Builder, x: Value, bias: Value, data_format: str = "NCHW") -> Value:
    if len(x.shape) > 2:
        bias = b("Reshape", bias, shape=(bias.shape[0],) + (1,) * (len(x.shape) - 2))
    return b("Add", x, bias)


@expander("ReduceMean", float16_in_float32=True)
def reduce_mean(b: Builder, x: Value, axis: Any = (), keep_dims: bool = False) -> Value:
    total = b("ReduceSum", x, axis=axis, keep_dims=keep_dims)
    return b("Mul", total, inverse_count(b, x, axis, keep_dims))


@expander("Softmax", float16_in_float32=True)
def softmax(b: Builder, x: Value, axis: Any = -1) -> Value:
    shifted = b("Sub", x, b("ReduceMax", x, axis=axis, keep_dims=True))
    exp = b("Exp", shifted)
    # One reciprocal per row and a multiply per element: a division per element costs more
    # than the loads (at most one extra rounding, ~1 ulp).
    return b("Mul", exp, b("Reciprocal", b("ReduceSum", exp, axis=axis, keep_dims=True)))


@expander("LogSoftmax", float16_in_float32=True)
def log_softmax(b: Builder, x: Value, axis: Any = -1) -> Value:
    shifted = b("Sub", x, b("ReduceMax", x, axis=axis, keep_dims=True))
    return b("Sub", shifted, b("Log", b("ReduceSum", b("Exp", shifted), axis=axis,
                                        keep_dims=True)))


@expander("LayerNorm", float16_in_float32=True)
def layer_norm(b: Builder, x: Value, gamma: Value, beta: Value, begin_norm_axis: int = -1,
               begin_params_axis: int = -1, epsilon: float = 1e-7) -> tuple[Value, ...]:
    rank = len(x.shape)
    axes = tuple(range(begin_norm_axis % rank, rank))
    inv_n = _inverse_count(_reduced_size(x, axes))

    def mean_of(v: Value) -> Value:
        return b("Mul", b("ReduceSum", v, axis=axes, keep_dims=True), inv_n)
    # Corrected two-pass: the first mean is rounded, so the centred values' own mean `shift`
    # (in exact arithmetic 0) is that rounding error; subtracting it keeps a row whose spread is
    # 1e-3 of its mean from shifting every output by 1000 ulp. var = mean(c^2) - shift^2.
    rough = mean_of(x)
    centred = b("Sub", x, rough)
    shift = mean_of(centred)
    spread = b("Sub", mean_of(b("Mul", centred, centred)), b("Mul", shift, shift))
    var = b("Maximum", spread, 0.0)  # >= 0 in exact arithmetic; keeps rsqrt from NaN
    scale = b("Rsqrt", b("Add", var, epsilon))
    y = b("Add", b("Mul", b("Mul", b("Sub", centred, shift), scale), gamma), beta)
    # A row holding inf or NaN: the rough mean is already the answer (numpy's), and the
    # correction (inf - inf) would turn an infinite mean into NaN.
    finite = b("Equal", b("Sub", rough, rough), 0.0)
    return y, b("Select", finite, b("Add", rough, shift), rough), var


@expander("EqualCount", float16_in_float32=True)
def equal_count(b: Builder, x: Value, y: Value) -> Value:
    # float16 counts in float32 (exact to 2^24) and rounds once, as the reference
    hits = b("Cast", b("Equal", x, y), dtype=x.dtype)
    total = b("ReduceSum", hits, axis=tuple(range(len(x.shape))), keep_dims=False)
    return b("Reshape", total, shape=(1,))


@expander("SquareSumAll", float16_in_float32=True)
def square_sum_all(b: Builder, x: Value, y: Value) -> tuple[Value, Value]:
    axes = tuple(range(len(x.shape)))
    return (b("ReduceSum", b("Mul", x, x), axis=axes, keep_dims=False),
            b("ReduceSum", b("Mul", y, y), axis=axes, keep_dims=False))


@expander("FloatStatus")
def float_status(b: Builder, x: Value) -> Value:
    bad = b("Cast", b("LogicalNot", b("IsFinite", x)), dtype=T.float32)
    worst = b("ReduceMax", bad, axis=tuple(range(len(x.shape))), keep_dims=False)
    return b("Reshape", worst, shape=(1,))
