"""General graph passes: dead code elimination, common subexpressions, constant folding."""
from __future__ import annotations

import numpy as np

from graphkernel.ir.graph import Constant, Graph, Node, Value
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import TupleType


def eliminate_dead_nodes(graph: Graph) -> Graph:
    """Drop nodes whose results nobody uses."""
    live: set[int] = {v.uid for v in graph.results()}
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if node.uid in live:
            kept.append(node)
            live.update(v.uid for v in node.inputs)
    graph.nodes = list(reversed(kept))
    for node in graph.nodes:
        if node.subgraph is not None:
            eliminate_dead_nodes(node.subgraph)
    return graph


def _attr_key(value: object) -> object:
    if isinstance(value, np.dtype):
        return ("dtype", value.name)
    return value


def _operand_key(value: Value) -> object:
    if isinstance(value, Constant) and value.is_scalar:
        # By bits, not by value: 0.0 == -0.0, yet x * 0.0 and x * -0.0 differ in sign.
        return ("const", value.dtype.name, value.value.tobytes())
    return value.uid


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """Merge nodes that compute the same op on the same operands with the same attributes."""
    seen: dict[object, Node] = {}
    replace: dict[int, Value] = {}
    kept: list[Node] = []
    for node in graph.nodes:
        node.inputs = [replace.get(v.uid, v) for v in node.inputs]
        if node.subgraph is not None:
            eliminate_common_subexpressions(node.subgraph)
            kept.append(node)
            continue
        if node.op != "GetItem" and get_op(node.op).stateful:  # two Dropouts draw two masks
            kept.append(node)
            continue
        key = (node.op, tuple(_operand_key(v) for v in node.inputs),
               tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items())))
        try:
            hash(key)
        except TypeError:
            kept.append(node)
            continue
        if key in seen and seen[key].type == node.type:
            replace[node.uid] = seen[key]
            continue
        seen[key] = node
        kept.append(node)
    graph.nodes = kept
    graph.remap_results(replace)
    return graph


# Folding an op on constants only is exact when it is the numpy reference that runs anyway;
# keep folded constants small so graphs do not embed large arrays.
_FOLD_LIMIT = 1 << 16


def fold_constants(graph: Graph) -> Graph:
    """Evaluate nodes whose inputs are all constants (small results only)."""
    replace: dict[int, Value] = {}
    kept: list[Node] = []
    for node in graph.nodes:
        node.inputs = [replace.get(v.uid, v) for v in node.inputs]
        if node.subgraph is not None:
            fold_constants(node.subgraph)
        foldable = (node.subgraph is None and node.op != "GetItem" and node.inputs
                    and not get_op(node.op).stateful
                    and not isinstance(node.type, TupleType)
                    and all(isinstance(v, Constant) for v in node.inputs)
                    and node.tensor_type.is_static  # a size known only at run time
                    and node.tensor_type.size <= _FOLD_LIMIT)
        if not foldable:
            kept.append(node)
            continue
        opdef = get_op(node.op)
        arrays = [v.value for v in node.inputs]  # type: ignore[attr-defined]  # all Constants (checked above)
        result = np.asarray(opdef.reference(*arrays, **{**opdef.attr_defaults, **node.attrs}),
                            dtype=node.dtype)
        replace[node.uid] = Constant(result, f"{node.name}_folded")
    graph.nodes = kept
    graph.remap_results(replace)
    return graph
