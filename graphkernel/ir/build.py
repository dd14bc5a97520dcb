"""A small helper that appends op nodes to a graph: gradient rules (declared with each primitive
in `ir/opdefs/`) and the autodiff pass build backward nodes with it.

`b("Mul", x, 2.0)` appends a Mul node and returns it; Python numbers become scalar constants of
the dtype of the first tensor operand (weak typing), attributes not given take the op's
defaults, and the node's type is inferred by the op table as tracing would.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from graphkernel.errors import SourceLocation
from graphkernel.ir import types as T
from graphkernel.ir.graph import Constant, Graph, Node, Value
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import TensorType, TupleType


class GraphBuilder:
    """Appends nodes to `graph`; `namer` gives each a name (the tracer's unique names when the
    graph is being traced, else the op's name); `notes` are attached to every node built."""

    def __init__(self, graph: Graph, loc: SourceLocation | None = None,
                 namer: Callable[[str], str] | None = None) -> None:
        self.graph = graph
        self.loc = loc
        self.namer = namer or (lambda op: op)
        self.notes: dict[str, Any] = {}

    def const(self, value: float, like: Value | np.dtype) -> Constant:
        dtype = like if isinstance(like, np.dtype) else like.dtype
        return Constant(np.asarray(value, dtype=dtype), "const")

    def __call__(self, op: str, *operands: Value | float, **attrs: Any) -> Value:
        like = next(v for v in operands if isinstance(v, Value))
        values = [v if isinstance(v, Value) else self.const(v, like) for v in operands]
        opdef = get_op(op)
        full = {**opdef.attr_defaults, **attrs}
        type_ = opdef.infer(tuple(v.tensor_type for v in values), full)
        node = Node(op, values, attrs, type_, self.namer(op), self.loc)
        node.notes.update(self.notes)
        self.graph.nodes.append(node)
        return node

    def item(self, value: Value, index: int) -> Value:
        """Item `index` of a node with several outputs (a GetItem node)."""
        assert isinstance(value.type, TupleType)
        node = Node("GetItem", [value], {"index": index}, value.type.items[index],
                    self.namer("GetItem"), self.loc)
        node.notes.update(self.notes)
        self.graph.nodes.append(node)
        return node

    def items(self, value: Value) -> tuple[Value, ...]:
        assert isinstance(value.type, TupleType)
        return tuple(self.item(value, i) for i in range(len(value.type.items)))

    # -- shapes --------------------------------------------------------------------------
    def sum_to(self, value: Value, shape: tuple[int, ...]) -> Value:
        """Sum `value` over the axes broadcasting added or stretched, back to `shape` (the
        gradient of an operand that was broadcast)."""
        if value.shape == tuple(shape):
            return value
        rank, lead = len(value.shape), len(value.shape) - len(shape)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, d in enumerate(shape) if d == 1 and value.shape[lead + i] != 1)
        if axes:
            value = self("ReduceSum", value, axis=axes, keep_dims=True)
        if value.shape != tuple(shape):
            assert math.prod(value.shape) == math.prod(shape), (value.shape, shape, rank)
            value = self("Reshape", value, shape=tuple(shape))
        return value

    def broadcast_to(self, value: Value, shape: tuple[int, ...]) -> Value:
        if value.shape == tuple(shape):
            return value
        return self("BroadcastTo", value, shape=tuple(shape))

    def zeros(self, type_: TensorType) -> Value:
        """A zero tensor of `type_` (a broadcast scalar: no array is stored)."""
        return self.broadcast_to(self.const(0, type_.dtype), type_.shape)

    def ones(self, type_: TensorType) -> Value:
        return self.broadcast_to(self.const(1, type_.dtype), type_.shape)

    def cast(self, value: Value, dtype: np.dtype) -> Value:
        return value if value.dtype == dtype else self("Cast", value, dtype=T.to_dtype(dtype))
