"""The compile pipeline, declared as lists of named stages.

Frontend stages (numbered as in MindSpore, ending with 6_validate: the initial graph) do not
depend on graph-kernel settings, so the initial graph is the same with fusion on or off. Backend
stages (hwopt_*) end with hwopt_d_end, the graph that runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from graphkernel.graph_kernel import (  # noqa: F401  (register their expanders)
    grad_expanders,
    nn_expanders,
    optim_expanders,
)
from graphkernel.graph_kernel.bn_fold import fold_batch_norms
from graphkernel.graph_kernel.cluster import cluster
from graphkernel.graph_kernel.collectives import schedule_collectives
from graphkernel.graph_kernel.cost_model import DEFAULT_COST_MODEL, CostModel
from graphkernel.graph_kernel.expanders import expand_node, has_expansion
from graphkernel.graph_kernel.flags import GraphKernelFlags, short_stage_name
from graphkernel.graph_kernel.index_maps import sink_views
from graphkernel.graph_kernel.library_views import folded_names, mark_library_views
from graphkernel.graph_kernel.lower import LoweringTarget, lower
from graphkernel.graph_kernel.lower_layout import lower_to_views
from graphkernel.graph_kernel.parallel_fusion import (
    LOOP_NESTS,
    check_loop_nests,
    parallel_fuse,
    parallel_schedule,
)
from graphkernel.graph_kernel.reasons import FusionReason
from graphkernel.graph_kernel.schedule import NotSchedulable, analyze
from graphkernel.graph_kernel.simplify import simplify_composites
from graphkernel.ir.graph import Graph, Node, Value, output_types
from graphkernel.ir.opset import PatternKind
from graphkernel.passes import stage_names as names
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
    backend: str = "c"  # the backend that builds the kernels (backends/: "c" or "numpy")
    # That backend's own settings (backends/c/config.py `CConfig` for "c", runtime/plan.py
    # `PlanSettings` for "numpy"); None: its defaults. Typed by the backend, which this layer
    # does not know.
    backend_config: object | None = None


def _identity(graph: Graph) -> Graph:
    return graph


FRONTEND_STAGES: list[Stage] = [
    Stage(names.TRACE, _identity, "the graph recorded by tracing construct"),
    Stage(names.FOLD_CONSTANTS, fold_constants, "ops on constants only evaluated at compile time"),
    Stage(names.CSE, eliminate_common_subexpressions, "identical ops on identical inputs merged"),
    Stage(names.DEAD_CODE, eliminate_dead_nodes, "ops whose results are unused removed"),
    Stage(names.VALIDATE, _identity, "the initial graph, verified"),
]


class BackendState:
    """What backend stages learn along the way (the reasons fusion refused an edge)."""

    def __init__(self) -> None:
        self.reasons: list[FusionReason] = []  # vertical fusion's, then parallel fusion's
        self.rewrites: list[str] = []  # graph rewrites a user should know of (BatchNorm folds)


def _expand(graph: Graph, options: CompileOptions) -> Graph:
    flags = options.flags
    new_nodes: list[Node] = []
    inlined_items: dict[int, list[Value]] = {}  # an inlined multi-output op -> its outputs
    # Each replaced value's replacement, applied to a node's inputs when it is reached and to
    # the graph's results at the end: replacing every use at once (Graph.replace_uses) walked
    # the whole graph per expanded op, quadratic in depth (120 walks for 12 encoder layers).
    replaced: dict[int, Value] = {}
    for node in graph.nodes:
        node.inputs = [replaced.get(v.uid, v) for v in node.inputs]
        if node.op == "GetItem" and node.inputs[0].uid in inlined_items:
            replaced[node.uid] = inlined_items[node.inputs[0].uid][node.attrs["index"]]
            continue
        if node.subgraph is not None:
            _expand(node.subgraph, options)
            new_nodes.append(node)
            continue
        if not has_expansion(node) or \
                all(t.size == 0 for t in output_types(node)):  # empty: nothing to compute
            new_nodes.append(node)
            continue
        composite = expand_node(node)
        expanded = composite.subgraph
        assert expanded is not None  # an expansion is a composite node
        has_reduction = any(n.kind == PatternKind.REDUCE for n in expanded.nodes)
        if not flags.expands(node.op, has_reduction):  # flags; opt_level 1: elementwise only
            new_nodes.append(node)
            continue
        try:
            analyze(expanded.nodes, expanded.outputs)
        except NotSchedulable:
            # Not one loop nest (e.g. BiasAdd on NCHW needs a Reshape): inline its ops so
            # clustering can fuse the parts that can be fused; a multi-output op's GetItems
            # then read its outputs directly.
            inlined = _inline(composite)
            outs = expanded.outputs
            if len(outs) == 1:
                replaced[node.uid] = outs[0]
            else:
                inlined_items[node.uid] = list(outs)
            new_nodes.extend(inlined)
            continue
        replaced[node.uid] = composite
        new_nodes.append(composite)
    graph.nodes = new_nodes
    graph.remap_results(replaced)
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


def backend_stages(options: CompileOptions, state: BackendState,
                   target: LoweringTarget | None = None) -> list[Stage]:
    """hwopt_* stages: with fusion off only the end stage, whose graph equals the initial one;
    then, given the backend that runs it, lowering."""
    lowering = [] if target is None else [
        Stage(names.LOWER, lambda graph: lower(schedule_composites(graph, planned=True), target),
              f"each node's kernel kind on the {target.name} backend, and why")]
    end = Stage(names.END, lambda graph: schedule_collectives(schedule_composites(graph)),
                "the graph that runs: one kernel per node, each composite's loop nest planned")
    if not options.enable_graph_kernel or options.flags.opt_level == 0:
        return [end] + lowering
    def end_with_views(graph: Graph) -> Graph:
        graph = schedule_collectives(mark_library_views(schedule_composites(graph)))
        # A layout op a MatMul now reads or writes in place was not kept apart from it.
        joined = {frozenset((lib, op)) for lib, ops in folded_names(graph).items() for op in ops}
        state.reasons = [r for r in state.reasons
                         if frozenset((r.producer, r.consumer)) not in joined]
        return graph

    end = Stage(names.END, end_with_views,
                "the graph that runs: one kernel per node, each composite's loop nest planned, "
                "layout ops next to MatMuls read or written by them through strided views")
    flags = options.flags

    def expand(graph: Graph) -> Graph:
        if flags.expands("BatchNorm", False):  # inference BatchNorm into the conv's weights
            state.rewrites = fold_batch_norms(graph)
        # The BatchNorm fold and the expanders make ops of their own; those on constants only
        # (an imported model's BatchNorm statistics, reshaped per channel) fold now, as the
        # frontend folds the traced ones, instead of each becoming a kernel.
        return fold_constants(_expand(graph, options))

    def basic_fusion(graph: Graph) -> Graph:
        # Layout ops first move above the elementwise ops feeding them, to the inputs, where
        # kernels read them through index maps (graph_kernel/index_maps.py).
        graph = sink_views(lower_to_views(graph))  # Split, Unstack, Tile as views first
        result = cluster(graph, flags, False, names.BASIC_FUSION, options.cost)
        state.reasons = list(result.reasons)  # replaced by composite fusion's when it runs
        return result.graph

    def composite_fusion(graph: Graph) -> Graph:
        graph = sink_views(graph)  # now also over composites of elementwise ops (BiasAdd)
        result = cluster(graph, flags, True, names.COMPOSITE_FUSION, options.cost)
        state.reasons = list(result.reasons)
        return result.graph

    def parallel_fusion(graph: Graph) -> Graph:
        graph, reasons = parallel_fuse(graph, flags, options.cost, names.PARALLEL_FUSION)
        state.reasons = [r for r in state.reasons if not r.parallel] + reasons
        return graph

    stages = [
        Stage(names.EXPAND, expand,
              "composite ops (GeLU, Softmax, LayerNorm, ...) expanded into basic ops; inference "
              "BatchNorm after a convolution folded into its weights", 1),
        Stage(names.BASIC_FUSION, basic_fusion,
              "connected fusible basic ops grouped into composite kernels", 1),
        Stage(names.COMPOSITE_FUSION, composite_fusion,
              "composites grown over the basic ops and composites around them", 1),
        # MindSpore runs simplification from opt_level 2.
        Stage(names.SIMPLIFY, simplify_composites,
              "constant folding, common subexpressions and identities inside each kernel", 2),
        Stage(names.PARALLEL_FUSION, parallel_fusion,
              "independent groups and siblings of one input launched as one kernel where it "
              "pays (--enable_parallel_fusion)", 1),
    ]
    # enable_pass and disable_pass override a stage's opt_level by its name.
    assert tuple(s.name for s in stages) == names.SWITCHABLE  # the names flags.py checks
    runs = [s for s in stages if flags.stage_runs(s.name, s.opt_level)]
    if not flags.enable_parallel_fusion and not {names.PARALLEL_FUSION, short_stage_name(
            names.PARALLEL_FUSION)} & flags.enable_pass:
        runs = [s for s in runs if s.name != names.PARALLEL_FUSION]
    return runs + [end] + lowering


def schedule_composites(graph: Graph, planned: bool = False) -> Graph:
    """Plan each composite's loop nest once, for the code generator: the schedule is kept on
    the node (`Node.schedule`), or, when the group is not one loop nest, the reason (it then
    runs op by op). Legality checks during fusion ask `analyze` about candidate groups; this is
    the one schedule of each composite that runs. `planned`: keep the schedules nodes already
    hold (lowering gets the end stage's graph itself, planned; a copy holds none)."""
    for node in graph.nodes:
        if node.subgraph is None or planned and node.schedule is not None:
            continue
        try:
            if LOOP_NESTS in node.notes:  # a parallel kernel: one loop nest or several
                node.schedule = parallel_schedule(node)
            else:
                node.schedule = analyze(node.subgraph.nodes, node.subgraph.outputs)
        except NotSchedulable as exc:
            node.schedule = None
            node.notes["not_one_kernel"] = str(exc)
    return graph


def check_final_notes(graph: Graph) -> None:
    """Check the notes of a final graph read from a file that steer the code generator against
    the graph (VerifyError naming the node): each parallel kernel's `loop_nests`. Every other
    note is text for people, or only switches on an analysis that is redone from the graph
    (`layout_folded`)."""
    for node in graph.nodes:
        if node.subgraph is not None and LOOP_NESTS in node.notes:
            check_loop_nests(node)
