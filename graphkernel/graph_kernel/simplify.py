"""Arithmetic simplification inside fused kernels: each rule is one small function that may
replace a node by an existing value. Results stay equal up to rounding (IEEE identities only:
x*1 and x+(-0.0) are exact; x+0 is exact except for -0.0 + 0, which we do not rewrite)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graphkernel.ir.graph import Constant, Graph, Node, Value
from graphkernel.passes.general import (
    eliminate_common_subexpressions,
    eliminate_dead_nodes,
    fold_constants,
)

Rule = Callable[[Node], Value | None]


def _scalar(value: Value, target: float) -> bool:
    return isinstance(value, Constant) and value.is_scalar and value.value.item() == target and \
        not (target == 0 and np.signbit(value.value))


def mul_by_one(node: Node) -> Value | None:
    if node.op == "Mul":
        for a, b in ((0, 1), (1, 0)):
            if _scalar(node.inputs[b], 1) and node.inputs[a].type == node.type:
                return node.inputs[a]
    return None


def div_by_one(node: Node) -> Value | None:
    if node.op == "RealDiv" and _scalar(node.inputs[1], 1) and node.inputs[0].type == node.type:
        return node.inputs[0]
    return None


def add_negative_zero(node: Node) -> Value | None:
    # x + (-0.0) == x for every x, including -0.0; x + 0.0 turns -0.0 into +0.0, so it stays.
    if node.op in ("Add", "Sub"):
        other = node.inputs[1]
        if isinstance(other, Constant) and other.is_scalar and other.value.item() == 0 and \
                node.inputs[0].type == node.type:
            negative = bool(np.signbit(other.value))
            if (node.op == "Add" and negative) or (node.op == "Sub" and not negative) or \
                    not np.issubdtype(node.dtype, np.floating):
                return node.inputs[0]
    return None


def double_negation(node: Node) -> Value | None:
    inner = node.inputs[0] if node.inputs else None
    if node.op == "Neg" and isinstance(inner, Node) and inner.op == "Neg":
        return inner.inputs[0]
    if node.op == "LogicalNot" and isinstance(inner, Node) and inner.op == "LogicalNot":
        return inner.inputs[0]
    return None


def same_type_cast(node: Node) -> Value | None:
    if node.op == "Cast" and node.inputs[0].type == node.type:
        return node.inputs[0]
    return None


RULES: tuple[Rule, ...] = (mul_by_one, div_by_one, add_negative_zero, double_negation,
                           same_type_cast)


def simplify_graph(graph: Graph) -> Graph:
    """Apply the rules to a fixed point, then fold constants, merge duplicates, drop dead ops."""
    changed = True
    while changed:
        changed = False
        replace: dict[int, Value] = {}
        for node in graph.nodes:
            node.inputs = [replace.get(v.uid, v) for v in node.inputs]
            for rule in RULES:
                result = rule(node)
                if result is not None:
                    replace[node.uid] = result
                    changed = True
                    break
        graph.remap_results(replace)
        graph.nodes = [n for n in graph.nodes if n.uid not in replace]
    fold_constants(graph)
    eliminate_common_subexpressions(graph)
    eliminate_dead_nodes(graph)
    return graph


def simplify_composites(graph: Graph) -> Graph:
    """Simplify inside every fused or expanded composite (the user's top-level graph is kept as
    written, so the dumps still map to `construct`)."""
    for node in graph.nodes:
        if node.subgraph is not None:
            simplify_graph(node.subgraph)
    return graph
