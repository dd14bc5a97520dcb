"""A (sub)graph evaluated op by op with the numpy references of the op table: how a fused group
runs when it cannot be compiled, and the unfused meaning of every graph."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.ir.graph import Constant, Graph, Value
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import SymSize, TensorType, concrete_attrs


def _sizes(graph: Graph, arrays: list[np.ndarray]) -> dict[str, int]:
    """This call's value of each dynamic size that an input dimension holds alone (N, 2*N)."""
    sizes: dict[str, int] = {}
    for inp, array in zip(graph.inputs, arrays):
        for dim, have in zip(inp.shape, np.shape(array)):
            if isinstance(dim, SymSize) and len(dim.names) == 1:
                sizes.setdefault(dim.names[0], have // dim.coef)
    return sizes


def run_reference_graph(graph: Graph, arrays: list[np.ndarray],
                        sizes: dict[str, int] | None = None) -> list[np.ndarray]:
    """Evaluate `graph` on `arrays` (its inputs, in order); return its outputs. `sizes` gives
    the dynamic sizes' values where the caller knows them (a group of a larger graph); else
    they are read off the inputs."""
    env: dict[int, Any] = {inp.uid: a for inp, a in zip(graph.inputs, arrays)}

    def get(v: Value) -> Any:
        return v.value if isinstance(v, Constant) else env[v.uid]

    for node in graph.nodes:
        args = [get(v) for v in node.inputs]
        if node.subgraph is not None:
            outs = run_reference_graph(node.subgraph, args, sizes)
            env[node.uid] = outs[0] if len(node.subgraph.outputs) == 1 else tuple(outs)
        elif node.op == "GetItem":
            env[node.uid] = args[0][node.attrs["index"]]
        else:
            opdef = get_op(node.op)
            attrs = {**opdef.attr_defaults, **node.attrs}
            if not isinstance(node.type, TensorType) or not node.type.is_static:
                sizes = _sizes(graph, arrays) if not sizes else sizes
                attrs = concrete_attrs(attrs, sizes)
            result = opdef.reference(*args, **attrs)
            if isinstance(node.type, TensorType):
                result = np.asarray(result)
                if result.dtype != node.dtype:
                    result = result.astype(node.dtype)
            env[node.uid] = result
    return [np.asarray(get(v)) for v in graph.outputs]
