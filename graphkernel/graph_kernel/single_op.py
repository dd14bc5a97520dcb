"""One op as one generated kernel: how an op runs when it is not fused with others.

With fusion off (or for an op fusion left alone) MindSpore still runs each op as one kernel of
its own, and so does graphkernel: a composite op (GeLU, Softmax, LayerNorm, ...) runs its
expansion as one loop nest instead of numpy op by op, and an elementwise or broadcasting op
(ufuncs included) runs its C template. A ufunc would be as fast per element, but only a plan
of generated kernels gets the compiled entry (backends/c/c_entry.py): a small unfused graph then
costs one C call, not a Python step per op. A lone Transpose, Concat or ReduceSum runs as its
loop nest too (`OpDef.kernel_alone`, declared on the op); MatMul and views stay numpy calls.
The unfused baseline in reports and the bench then differs from the fused graph by fusion
alone, not by Python-level references or a Python runner.
"""
from __future__ import annotations

from graphkernel.graph_kernel.expanders import expand_node, has_expansion
from graphkernel.graph_kernel.schedule import NotSchedulable, Schedule, analyze, fusible_op
from graphkernel.ir.graph import Graph, Input, Node, output_types
from graphkernel.ir.opset import PatternKind, get_op

# Ops declared `kernel_alone` (Transpose, Concat, ReduceSum) copy or compute anyway as numpy
# steps, but as such steps keep the whole plan off the compiled entry: then the Python runner
# runs every product on BLAS's own threads beside the kernels' own pool, two pools on the
# cores (docs/perf-notes.md, "One thread pool"). A training step's filter gradients and the
# network's mean pool left such ops alone: ResNet-50's step at two threads took 2.2-2.6 s of
# CPU a call on the Python runner, 0.8 s on the entry.


def runs_as_kernel(node: Node) -> bool:
    """Whether `node` (a basic op outside any fused group) is better as a generated kernel."""
    opdef = get_op(node.op)
    if all(t.size == 0 for t in output_types(node)):
        return False  # nothing to compute
    if opdef.composite:
        return has_expansion(node)  # an expander may cover only some of an op's nodes
    # Elementwise and broadcasting ops, ufuncs included: a ufunc call is as fast per element,
    # but a plan of generated kernels only gets the compiled entry (backends/c/c_entry.py), so a
    # small unfused graph pays one C call instead of a Python step per op.
    if opdef.kernel_alone:
        return fusible_op(node.op)
    return opdef.kind <= PatternKind.BROADCAST and fusible_op(node.op)


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
