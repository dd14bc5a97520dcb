"""Tracing: running `construct` on symbolic tensors records each primitive call as an IR node."""
from __future__ import annotations

import linecache
import os
import sys
import threading
from typing import Any

import numpy as np

from graphkernel.errors import GraphModeError, SourceLocation
from graphkernel.frontend.tensor import Parameter, Tensor
from graphkernel.ir.graph import Constant, Graph, Input, Node, Value
from graphkernel.ir.types import TensorType, ValueType

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Frames in these folders are the compiler itself; any other frame (a user's script, or cells
# that ship with graphkernel such as nn/layers.py and tools/lab.py) is where a node came from.
_INTERNAL_DIRS = tuple(os.path.join(_PACKAGE_DIR, d) + os.sep for d in (
    "frontend", "ir", "passes", "graph_kernel", "codegen", "runtime", "ops"))
_state = threading.local()


def current_tracer() -> Tracer | None:
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


def user_location() -> SourceLocation | None:
    """The innermost stack frame outside graphkernel: the user's line in `construct`."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_INTERNAL_DIRS):
            text = linecache.getline(filename, frame.f_lineno)
            return SourceLocation(filename, frame.f_lineno, frame.f_code.co_name, text)
        frame = frame.f_back  # type: ignore[assignment]
    return None


def function_location(fn: Any) -> SourceLocation | None:
    """The `def` line of a user's function (e.g. construct), for errors about what it returned."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    text = linecache.getline(code.co_filename, code.co_firstlineno)
    return SourceLocation(code.co_filename, code.co_firstlineno, code.co_name, text)


class Tracer:
    """Builds one graph; a GraphKernel cell traced inside it gets a child tracer."""

    def __init__(self, name: str, parent: Tracer | None = None) -> None:
        self.graph = Graph(name)
        self.parent = parent
        self.weights: dict[int, Input] = {}
        # For a child tracer: outer values captured as extra inputs, by the outer value's uid.
        self.captures: dict[int, tuple[Value, Input]] = {}
        self.names: dict[str, int] = {}

    def __enter__(self) -> Tracer:
        stack = getattr(_state, "stack", None)
        if stack is None:
            stack = _state.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _state.stack.pop()

    def unique(self, base: str) -> str:
        count = self.names.get(base, 0)
        self.names[base] = count + 1
        return base if count == 0 else f"{base}_{count}"

    def add_input(self, type_: TensorType, name: str) -> Tensor:
        inp = Input(type_, self.unique(name))
        self.graph.inputs.append(inp)
        return Tensor._symbolic(inp, self)

    def value_of(self, tensor: Tensor) -> Value:
        """The IR value of a tensor operand in this tracer's graph."""
        if tensor._value is not None:
            if tensor._tracer is self:
                return tensor._value
            return self._capture(tensor)
        if isinstance(tensor, Parameter):
            return self._weight(tensor)
        array = tensor.asnumpy()
        return Constant(np.array(array), self.unique("const"))

    def _weight(self, param: Parameter) -> Value:
        if self.parent is not None:
            # Inside a GraphKernel cell: the weight is an input of the outer graph, passed in.
            outer = self.parent._weight(param)
            return self._capture(Tensor._symbolic(outer, self.parent))
        if id(param) not in self.weights:
            name = param.name or "weight"
            inp = Input(TensorType(param.shape, param.dtype), self.unique(name), "weight", param)
            self.weights[id(param)] = inp
            self.graph.inputs.append(inp)
        return self.weights[id(param)]

    def _capture(self, tensor: Tensor) -> Value:
        assert tensor._value is not None
        if self.parent is None or not self._is_ancestor(tensor._tracer):
            raise GraphModeError("a tensor from another traced graph was used here; pass it to "
                                 "the cell as an argument", user_location())
        outer = tensor._value
        if outer.uid not in self.captures:
            outer_here = self.parent.value_of(tensor)
            inp = Input(outer.tensor_type, self.unique(outer.name))
            self.graph.inputs.append(inp)
            self.captures[outer.uid] = (outer_here, inp)
        return self.captures[outer.uid][1]

    def _is_ancestor(self, other: Tracer | None) -> bool:
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
