"""A (sub)graph evaluated op by op with the numpy references of the op table: how a fused group
runs when it cannot be compiled, and the unfused meaning of every graph."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.ir.graph import Constant, Graph, Value
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import TensorType


def run_reference_graph(graph: Graph, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Evaluate `graph` on `arrays` (its inputs, in order); return its outputs."""
    env: dict[int, Any] = {inp.uid: a for inp, a in zip(graph.inputs, arrays)}

    def get(v: Value) -> Any:
        return v.value if isinstance(v, Constant) else env[v.uid]

    for node in graph.nodes:
        args = [get(v) for v in node.inputs]
        if node.subgraph is not None:
            outs = run_reference_graph(node.subgraph, args)
            env[node.uid] = outs[0] if len(node.subgraph.outputs) == 1 else tuple(outs)
        elif node.op == "GetItem":
            env[node.uid] = args[0][node.attrs["index"]]
        else:
            opdef = get_op(node.op)
            result = opdef.reference(*args, **{**opdef.attr_defaults, **node.attrs})
            if isinstance(node.type, TensorType):
                result = np.asarray(result)
                if result.dtype != node.dtype:
                    result = result.astype(node.dtype)
            env[node.uid] = result
    return [np.asarray(get(v)) for v in graph.outputs]
