"""The compile pipeline, declared as lists of named stages.

Frontend stages (numbered as in MindSpore, ending with 6_validate: the initial graph) do not
depend on graph-kernel settings, so the initial graph is the same with fusion on or off. Backend
stages (hwopt_*) end with hwopt_d_end, the graph that runs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from graphkernel.graph_kernel.cluster import cluster
from graphkernel.graph_kernel.cost_model import DEFAULT_COST_MODEL, CostModel
from graphkernel.graph_kernel.expanders import EXPANDERS, expand_node
from graphkernel.graph_kernel.flags import GraphKernelFlags
from graphkernel.graph_kernel.reasons import FusionReason
from graphkernel.graph_kernel.schedule import NotSchedulable, analyze
from graphkernel.graph_kernel.simplify import simplify_composites
from graphkernel.ir.graph import Graph, Node, output_types
from graphkernel.ir.opset import PatternKind
from graphkernel.passes.general import (
    eliminate_common_subexpressions,
    eliminate_dead_nodes,
    fold_constants,
)
from graphkernel.passes.manager import Stage


@dataclass
class CompileOptions:
    enable_graph_kernel: bool = False
    flags: GraphKernelFlags = field(default_factory=GraphKernelFlags)
    cost: CostModel = DEFAULT_COST_MODEL


def _identity(graph: Graph) -> Graph:
    return graph


FRONTEND_STAGES: list[Stage] = [
    Stage("0_trace", _identity, "the graph recorded by tracing construct"),
    Stage("1_fold_constants", fold_constants, "ops on constants only evaluated at compile time"),
    Stage("2_cse", eliminate_common_subexpressions, "identical ops on identical inputs merged"),
    Stage("3_dead_code", eliminate_dead_nodes, "ops whose results are unused removed"),
    Stage("6_validate", _identity, "the initial graph, verified"),
]


class BackendState:
    """What backend stages learn along the way (the reasons fusion refused an edge)."""

    def __init__(self) -> None:
        self.reasons: list[FusionReason] = []


def _expand(graph: Graph, options: CompileOptions) -> Graph:
    flags = options.flags
    new_nodes: list[Node] = []
    for node in graph.nodes:
        if node.subgraph is not None:
            _expand(node.subgraph, options)
            new_nodes.append(node)
            continue
        if node.op not in EXPANDERS or \
                all(t.size == 0 for t in output_types(node)):  # empty: nothing to compute
            new_nodes.append(node)
            continue
        composite = expand_node(node)
        has_reduction = any(n.kind == PatternKind.REDUCE for n in composite.subgraph.nodes)  # type: ignore
        if not flags.expands(node.op, has_reduction):  # flags; opt_level 1: elementwise only
            new_nodes.append(node)
            continue
        try:
            analyze(composite.subgraph.nodes, composite.subgraph.outputs)  # type: ignore
        except NotSchedulable as exc:
            # Not one loop nest (e.g. BiasAdd on NCHW needs a Reshape): inline its ops so
            # clustering can fuse the parts that can be fused.
            if len(composite.subgraph.outputs) == 1:  # type: ignore[union-attr]
                inlined = _inline(composite)
                graph.replace_uses(node, composite.subgraph.outputs[0])  # type: ignore
                new_nodes.extend(inlined)
                continue
            composite.notes["not_one_kernel"] = str(exc)
        graph.replace_uses(node, composite)
        new_nodes.append(composite)
    graph.nodes = new_nodes
    return graph


def _inline(composite: Node) -> list[Node]:
    sub = composite.subgraph
    assert sub is not None
    mapping = {inner.uid: outer for inner, outer in zip(sub.inputs, composite.inputs)}
    for node in sub.nodes:
        node.inputs = [mapping.get(v.uid, v) for v in node.inputs]
    # An expansion may return one of its inputs unchanged (AddN of one tensor).
    sub.outputs = [mapping.get(v.uid, v) for v in sub.outputs]
    return list(sub.nodes)


def backend_stages(options: CompileOptions, state: BackendState) -> list[Stage]:
    """hwopt_* stages: with fusion off only the end stage, whose graph equals the initial one."""
    end = Stage("hwopt_d_end", _identity, "the graph that runs: one kernel per node")
    if not options.enable_graph_kernel or options.flags.opt_level == 0:
        return [end]
    flags = options.flags

    def basic_fusion(graph: Graph) -> Graph:
        result = cluster(graph, flags, False, "hwopt_2_basic_op_fusion", options.cost)
        state.reasons = list(result.reasons)  # replaced by composite fusion's when it runs
        return result.graph

    def composite_fusion(graph: Graph) -> Graph:
        result = cluster(graph, flags, True, "hwopt_3_composite_op_fusion", options.cost)
        state.reasons = list(result.reasons)
        return result.graph

    stages = [
        Stage("hwopt_1_graph_kernel_expand", lambda g: _expand(g, options),
              "composite ops (GeLU, Softmax, LayerNorm, ...) expanded into basic ops"),
        Stage("hwopt_2_basic_op_fusion", basic_fusion,
              "connected fusible basic ops grouped into composite kernels"),
        Stage("hwopt_3_composite_op_fusion", composite_fusion,
              "composites grown over the basic ops and composites around them"),
        Stage("hwopt_4_graph_kernel_simplify", simplify_composites,
              "constant folding, common subexpressions and identities inside each kernel"),
    ]
    # The opt_level each stage needs (MindSpore: simplification is level 2); enable_pass and
    # disable_pass override it by stage name.
    levels = {"hwopt_4_graph_kernel_simplify": 2}
    known = [s.name for s in stages]
    return [s for s in stages if flags.stage_runs(s.name, levels.get(s.name, 1), known)] + [end]


def check_flags(flags: GraphKernelFlags) -> None:
    """Raise FlagError now for stage names the backend would refuse at compile time."""
    on = dataclasses.replace(flags, opt_level=max(flags.opt_level, 1))
    backend_stages(CompileOptions(enable_graph_kernel=True, flags=on), BackendState())
