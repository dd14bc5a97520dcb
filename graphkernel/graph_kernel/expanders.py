"""Expanders: each composite op written as a small function of basic ops.

With fusion on, the expand stage replaces a composite op's node by a composite node holding its
expansion (so the dumps show it), and clustering may then merge it with its neighbours.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from graphkernel.ir.graph import Constant, Graph, Input, Node, Value
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import TupleType

Expander = Callable[..., Value | tuple[Value, ...]]
EXPANDERS: dict[str, Expander] = {}


def expander(op_name: str) -> Callable[[Expander], Expander]:
    def register(fn: Expander) -> Expander:
        get_op(op_name)  # the op must be declared in the op table
        EXPANDERS[op_name] = fn
        return fn
    return register


class Builder:
    """Appends basic-op nodes to a graph; Python numbers become scalar constants of the dtype of
    the first tensor operand (weak typing)."""

    def __init__(self, graph: Graph, source: Node) -> None:
        self.graph = graph
        self.source = source

    def const(self, value: float, like: Value) -> Constant:
        return Constant(np.asarray(value, dtype=like.dtype), "const")

    def __call__(self, op: str, *operands: Value | float, **attrs: Any) -> Value:
        like = next(v for v in operands if isinstance(v, Value))
        values = [v if isinstance(v, Value) else self.const(v, like) for v in operands]
        opdef = get_op(op)
        full = {**opdef.attr_defaults, **attrs}
        type_ = opdef.infer(tuple(v.tensor_type for v in values), full)
        node = Node(op, values, attrs, type_, op, self.source.loc)
        self.graph.nodes.append(node)
        return node


def expand_node(node: Node) -> Node:
    """A composite node computing `node` from basic ops (same inputs, same outputs)."""
    sub = Graph(node.op)
    inner = [Input(v.tensor_type, f"x{i}") for i, v in enumerate(node.inputs)]
    sub.inputs = inner
    build = Builder(sub, node)
    opdef = get_op(node.op)
    attrs = {**opdef.attr_defaults, **node.attrs}
    result = EXPANDERS[node.op](build, *inner, **attrs)
    outs = list(result) if isinstance(result, tuple) else [result]
    sub.outputs = outs
    sub.returns_tuple = isinstance(result, tuple)
    type_ = outs[0].type if len(outs) == 1 else TupleType(tuple(o.tensor_type for o in outs))
    composite = Node("Composite", node.inputs, {}, type_, node.name, node.loc, sub)
    composite.notes["expanded_from"] = node.op
    return composite


def _reduced_size(x: Value, axis: Any) -> int:
    from graphkernel.ir.types import normalize_axes
    axes = normalize_axes(axis, len(x.shape))
    return math.prod([x.shape[a] for a in axes]) if axes else 1


def _inverse_count(n: int) -> float:
    """1/n for a mean; over no elements the mean is NaN, as numpy's (0 * inf)."""
    return 1.0 / n if n else math.inf


# ---------------------------------------------------------------------------------------------

@expander("GeLU")
def gelu(b: Builder, x: Value, approximate: str = "tanh") -> Value:
    if approximate == "tanh":
        cube = b("Mul", b("Mul", x, x), x)
        inner = b("Mul", b("Add", x, b("Mul", cube, 0.044715)), math.sqrt(2 / math.pi))
        return b("Mul", b("Mul", x, 0.5), b("Add", b("Tanh", inner), 1.0))
    return b("Mul", b("Mul", x, 0.5), b("Add", b("Erf", b("Mul", x, 1 / math.sqrt(2))), 1.0))


@expander("FastGeLU")
def fast_gelu(b: Builder, x: Value) -> Value:
    return b("RealDiv", x, b("Add", b("Exp", b("Mul", x, -1.702)), 1.0))


@expander("Sigmoid")
def sigmoid(b: Builder, x: Value) -> Value:
    return b("RealDiv", b.const(1.0, x), b("Add", b("Exp", b("Neg", x)), 1.0))


@expander("SiLU")
def silu(b: Builder, x: Value) -> Value:
    return b("RealDiv", x, b("Add", b("Exp", b("Neg", x)), 1.0))


@expander("ReLU")
def relu(b: Builder, x: Value) -> Value:
    return b("Maximum", x, 0)


@expander("ReLU6")
def relu6(b: Builder, x: Value) -> Value:
    return b("Minimum", b("Maximum", x, 0), 6)


@expander("HSwish")
def hswish(b: Builder, x: Value) -> Value:
    clipped = b("Minimum", b("Maximum", b("Add", x, 3.0), 0.0), 6.0)
    return b("RealDiv", b("Mul", x, clipped), 6.0)


@expander("Softplus")
def softplus(b: Builder, x: Value) -> Value:
    return b("Log", b("Add", b("Exp", x), 1.0))


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
def bias_add(b: Builder, x: Value, bias: Value) -> Value:
    if len(x.shape) > 2:
        bias = b("Reshape", bias, shape=(bias.shape[0],) + (1,) * (len(x.shape) - 2))
    return b("Add", x, bias)


@expander("ReduceMean")
def reduce_mean(b: Builder, x: Value, axis: Any = (), keep_dims: bool = False) -> Value:
    total = b("ReduceSum", x, axis=axis, keep_dims=keep_dims)
    return b("Mul", total, _inverse_count(_reduced_size(x, axis)))


@expander("Softmax")
def softmax(b: Builder, x: Value, axis: Any = -1) -> Value:
    shifted = b("Sub", x, b("ReduceMax", x, axis=axis, keep_dims=True))
    exp = b("Exp", shifted)
    # One reciprocal per row and a multiply per element: a division per element costs more
    # than the loads (at most one extra rounding, ~1 ulp).
    return b("Mul", exp, b("Reciprocal", b("ReduceSum", exp, axis=axis, keep_dims=True)))


@expander("LogSoftmax")
def log_softmax(b: Builder, x: Value, axis: Any = -1) -> Value:
    shifted = b("Sub", x, b("ReduceMax", x, axis=axis, keep_dims=True))
    return b("Sub", shifted, b("Log", b("ReduceSum", b("Exp", shifted), axis=axis,
                                        keep_dims=True)))


@expander("LayerNorm")
def layer_norm(b: Builder, x: Value, gamma: Value, beta: Value, begin_norm_axis: int = -1,
               begin_params_axis: int = -1, epsilon: float = 1e-7) -> tuple[Value, ...]:
    rank = len(x.shape)
    axes = tuple(range(begin_norm_axis % rank, rank))
    inv_n = _inverse_count(_reduced_size(x, axes))
    mean = b("Mul", b("ReduceSum", x, axis=axes, keep_dims=True), inv_n)
    centred = b("Sub", x, mean)
    var = b("Mul", b("ReduceSum", b("Mul", centred, centred), axis=axes, keep_dims=True), inv_n)
    scale = b("Rsqrt", b("Add", var, epsilon))
    y = b("Add", b("Mul", b("Mul", centred, scale), gamma), beta)
    return y, mean, var

