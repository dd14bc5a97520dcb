"""One op as one generated kernel: how an op runs when it is not fused with others.

With fusion off (or for an op fusion left alone) MindSpore still runs each op as one kernel of
its own. Here an op whose numpy form is slow gets the same: a composite op (GeLU, Softmax,
LayerNorm, ...) runs its expansion as one loop nest instead of numpy op by op, and an
elementwise op without a numpy ufunc (Erf, Rsqrt, Select, comparisons, ...) runs its C
template. Ops numpy runs at full speed (ufuncs, reductions, MatMul, views) stay numpy calls.
The unfused baseline in reports and the bench then differs from the fused graph by fusion
alone, not by Python-level references.
"""
from __future__ import annotations

import numpy as np

from graphkernel.graph_kernel.expanders import EXPANDERS, expand_node
from graphkernel.graph_kernel.schedule import NotSchedulable, Schedule, analyze, fusible_op
from graphkernel.ir.graph import Graph, Input, Node, output_types
from graphkernel.ir.opset import PatternKind, get_op


def runs_as_kernel(node: Node) -> bool:
    """Whether `node` (a basic op outside any fused group) is better as a generated kernel."""
    opdef = get_op(node.op)
    if all(t.size == 0 for t in output_types(node)):
        return False  # nothing to compute
    if opdef.composite:
        return node.op in EXPANDERS
    fast_numpy = isinstance(getattr(opdef.reference, "ufunc", None), np.ufunc)
    return opdef.kind == PatternKind.ELEMWISE and fusible_op(node.op) and not fast_numpy


def single_op_group(node: Node) -> tuple[Graph, Schedule] | None:
    """The one-op group that computes `node` and its schedule, or None when it is not one loop
    nest (it then runs as its numpy reference)."""
    if get_op(node.op).composite:
        sub = expand_node(node).subgraph
        assert sub is not None
    else:
        inputs = [Input(v.tensor_type, f"in{i}") for i, v in enumerate(node.inputs)]
        inner = Node(node.op, list(inputs), node.attrs, node.type, node.name, node.loc)
        sub = Graph(node.name, inputs, [inner], [inner])
    try:
        return sub, analyze(sub.nodes, sub.outputs)
    except NotSchedulable:
        return None
