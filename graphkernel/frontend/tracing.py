"""Tracing: running `construct` on symbolic tensors records each primitive call as an IR node.

`Tracer` is the tensor-facing side of a graph being recorded (symbolic.py keeps the values):
graph inputs come out as symbolic Tensors, and a Tensor a `construct` returns goes back in as
its IR value.
"""
from __future__ import annotations

from graphkernel.frontend.location import function_location, user_location
from graphkernel.frontend.symbolic import SymbolicGraph, current_graph
from graphkernel.frontend.tensor import Tensor, value_in
from graphkernel.ir.graph import Value
from graphkernel.ir.types import TensorType

# Re-exported for the frontend modules that trace (cell.py, compile.py).
__all__ = ["Tracer", "current_tracer", "function_location", "user_location"]


class Tracer(SymbolicGraph):
    """Builds one graph from a `construct`; a GraphKernel cell traced inside it gets a child."""

    def add_input(self, type_: TensorType, name: str) -> Tensor:
        return Tensor._symbolic(self.new_input(type_, name), self)

    def value_of(self, tensor: Tensor) -> Value:
        """The IR value of a tensor operand in this tracer's graph."""
        return value_in(self, tensor)


def current_tracer() -> Tracer | None:
    """The tracer recording this thread's `construct`, if one is being traced."""
    graph = current_graph()
    assert graph is None or isinstance(graph, Tracer), graph
    return graph
