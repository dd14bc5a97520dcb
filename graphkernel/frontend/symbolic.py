"""The bookkeeping of symbolic values while `construct` is traced, in IR terms only.

A `SymbolicGraph` is one graph being recorded: unique names, each weight bound once as a graph
input, and values of enclosing graphs captured as extra inputs of a GraphKernel cell's graph.
The thread's stack of graphs being recorded says which one a primitive call goes into. Tensors
live a layer up (tensor.py wraps these values; tracing.py is the tensor-facing tracer), so this
module imports neither.
"""
from __future__ import annotations

import threading
from typing import Any, Protocol

from graphkernel.errors import GraphModeError, SourceLocation
from graphkernel.frontend.location import user_location
from graphkernel.ir.graph import Graph, Input, Node, Value
from graphkernel.ir.types import TensorType, ValueType

_state = threading.local()
# Graphs being recorded, in all threads: a Cell call takes its per-call fast path only at 0
# (frontend/cell.py), so a cell called inside a `construct` is always traced.
recording = 0
_recording_lock = threading.Lock()


class Weight(Protocol):
    """What a graph needs of a Parameter to bind it as an input read at call time."""

    name: str

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> Any: ...


def current_graph() -> SymbolicGraph | None:
    """The graph this thread is recording into, if `construct` is being traced."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


class SymbolicGraph:
    """Builds one graph; a GraphKernel cell traced inside it gets a child."""

    def __init__(self, name: str, parent: SymbolicGraph | None = None) -> None:
        self.graph = Graph(name)
        self.parent = parent
        self.weights: dict[int, Input] = {}
        # Parameters written by ops such as Assign while tracing: id -> their new value.
        self.assigned: dict[int, Value] = {}
        # For a child: outer values captured as extra inputs, by the outer value's uid.
        self.captures: dict[int, tuple[Value, Input]] = {}
        self.names: dict[str, int] = {}

    def __enter__(self) -> SymbolicGraph:
        global recording
        stack = getattr(_state, "stack", None)
        if stack is None:
            stack = _state.stack = []
        stack.append(self)
        with _recording_lock:
            recording += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        global recording
        _state.stack.pop()
        with _recording_lock:
            recording -= 1

    def unique(self, base: str) -> str:
        count = self.names.get(base, 0)
        self.names[base] = count + 1
        return base if count == 0 else f"{base}_{count}"

    def new_input(self, type_: TensorType, name: str) -> Input:
        inp = Input(type_, self.unique(name))
        self.graph.inputs.append(inp)
        return inp

    def weight(self, param: Weight) -> Value:
        """The graph input that reads `param` at call time (one per Parameter object)."""
        if self.parent is not None:
            # Inside a GraphKernel cell: the weight is an input of the outer graph, passed in.
            return self.capture(self.parent.weight(param), self.parent)
        if id(param) in self.assigned:  # written earlier in this construct: its new value
            return self.assigned[id(param)]
        return self.weight_input(param)

    def weight_input(self, param: Weight) -> Input:
        if id(param) not in self.weights:
            name = param.name or "weight"
            inp = Input(TensorType(param.shape, param.dtype), self.unique(name), "weight", param)
            self.weights[id(param)] = inp
            self.graph.inputs.append(inp)
        return self.weights[id(param)]

    def assign(self, param: Weight, value: Value) -> None:
        """After each call `param` holds `value` (Graph.assigns); later reads in this construct
        see `value`. A second write to the same Parameter replaces the first."""
        if self.parent is not None:
            raise GraphModeError(f"a GraphKernel cell cannot write Parameter {param.name!r}; "
                                 "write it in the Cell that calls the GraphKernel",
                                 user_location())
        inp = self.weight_input(param)
        self.graph.assigns = [(w, v) for w, v in self.graph.assigns if w is not inp]
        self.graph.assigns.append((inp, value))
        self.assigned[id(param)] = value

    def capture(self, value: Value, owner: SymbolicGraph | None) -> Value:
        """`value`, recorded by `owner`, as a value of this graph."""
        if owner is self:
            return value
        if self.parent is None or not self._is_ancestor(owner):
            raise GraphModeError("a tensor from another traced graph was used here; pass it to "
                                 "the cell as an argument", user_location())
        if value.uid not in self.captures:
            outer_here = self.parent.capture(value, owner)
            inp = Input(value.tensor_type, self.unique(value.name))
            self.graph.inputs.append(inp)
            self.captures[value.uid] = (outer_here, inp)
        return self.captures[value.uid][1]

    def _is_ancestor(self, other: SymbolicGraph | None) -> bool:
        node = self.parent
        while node is not None:
            if node is other:
                return True
            node = node.parent
        return False

    def add_node(self, op: str, inputs: list[Value], attrs: dict[str, Any], type_: ValueType,
                 loc: SourceLocation | None, subgraph: Graph | None = None,
                 name: str = "") -> Node:
        node = Node(op, inputs, attrs, type_, self.unique(name or op), loc, subgraph)
        self.graph.nodes.append(node)
        return node
