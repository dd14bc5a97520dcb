"""The IR layer: types, the op table, graphs, the verifier, the text printer and DOT export.

It imports nothing from the layers above it (frontend, passes, graph_kernel, runtime, backends,
tools).
"""
from graphkernel.ir import opdefs  # noqa: E402, F401, I001  (fills the op table)
from graphkernel.ir.graph import Constant, Graph, Input, Node, Value
from graphkernel.ir.opset import OPS, OpDef, PatternKind, get_op
from graphkernel.ir.types import TensorType, TupleType

__all__ = ["Constant", "Graph", "Input", "Node", "Value", "OPS", "OpDef", "PatternKind",
           "get_op", "TensorType", "TupleType"]
