"""Clustering: grow fused groups over producer -> consumer edges, one legality rule at a time.

The rules, checked in order for each edge (the first that refuses is the recorded reason):
  flag     - an op is excluded by graph_kernel_flags (or the opt level);
  pattern  - an op is opaque or injective: it runs as its own library kernel or view;
  limit    - the merged group would exceed composite_op_limit_size ops;
  cycle    - the merged group would depend on itself through an outside op;
  shape    - the merged group has no single iteration space (schedule.analyze);
  cost     - legal, but the cost model says it does not pay.
Groups are materialised as composite nodes named after their members (Fused_Mul_Add_Mul).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphkernel.graph_kernel.attention import score_products
from graphkernel.graph_kernel.cost_model import DEFAULT_COST_MODEL, CostModel
from graphkernel.graph_kernel.flags import GraphKernelFlags
from graphkernel.graph_kernel.index_maps import IndexMap
from graphkernel.graph_kernel.reasons import FuseRule, FusionReason
from graphkernel.graph_kernel.schedule import NotSchedulable, Schedule, analyze, fusible_op
from graphkernel.ir.graph import Constant, Graph, Input, Node, Value, note_phases, phases_of
from graphkernel.ir.opset import PatternKind, Window, get_op
from graphkernel.ir.types import TensorType, TupleType


@dataclass
class Group:
    units: list[Node]  # top-level nodes (composites or basic ops), plus attached GetItems
    gid: int

    def op_count(self) -> int:
        return sum(len(flat_ops(u)) for u in self.units if u.op != "GetItem")


@dataclass
class ClusterResult:
    graph: Graph
    reasons: list[FusionReason] = field(default_factory=list)


def flat_ops(node: Node) -> list[Node]:
    if node.subgraph is None:
        return [node]
    out: list[Node] = []
    for inner in node.subgraph.nodes:
        out.extend(flat_ops(inner))
    return out


def op_refusal(op: str, flags: GraphKernelFlags) -> tuple[FuseRule, str] | None:
    """Why a basic op may not join any group: (rule, detail), or None."""
    opdef = get_op(op)
    refused = flags.cluster_refusal(op, opdef.kind == PatternKind.REDUCE)
    if refused is not None and op != "GetItem":
        return FuseRule.FLAG, refused
    if op == "GetItem":
        return FuseRule.PATTERN, "GetItem selects an output of a multi-output op"
    if not fusible_op(op):
        if opdef.kind == PatternKind.OPAQUE:
            if opdef.window is Window.CONVOLUTION:  # lowering may make it a conv block
                return FuseRule.PATTERN, (f"{op} is opaque: it runs as a kernel of its own, "
                                          "or with the group after it as a conv block")
            return FuseRule.PATTERN, f"{op} is opaque: it runs as a kernel of its own"
        kind = opdef.kind.name.lower()
        return FuseRule.PATTERN, f"{op} is {kind}: it runs as a view or copy of its own"
    return None


def flatten(units: list[Node]) -> tuple[list[Node], dict[int, Value]]:
    """Copies of the basic ops of `units` with composites inlined.

    Returns the ops in order and a map from each unit's result (a single-output unit, or a
    GetItem of a multi-output one) to the flattened value that computes it.
    """
    nodes: list[Node] = []

    def inline_all(graph_nodes: list[Node], env: dict[int, Value],
                   tuples: dict[int, list[Value]]) -> None:
        for node in graph_nodes:
            if node.op == "GetItem" and node.inputs[0].uid in tuples:
                env[node.uid] = tuples[node.inputs[0].uid][node.attrs["index"]]
                continue
            results = inline(node, env)
            if isinstance(node.type, TupleType):
                tuples[node.uid] = results
            else:
                env[node.uid] = results[0]

    def inline(node: Node, env: dict[int, Value]) -> list[Value]:
        if node.subgraph is None:
            copy = Node(node.op, [env.get(v.uid, v) for v in node.inputs], node.attrs,
                        node.type, node.name, node.loc)
            nodes.append(copy)
            return [copy]
        inner_env = {inner.uid: env.get(outer.uid, outer)
                     for outer, inner in zip(node.inputs, node.subgraph.inputs)}
        inline_all(node.subgraph.nodes, inner_env, {})
        return [inner_env.get(o.uid, o) for o in node.subgraph.outputs]

    env: dict[int, Value] = {}
    inline_all(units, env, {})
    return nodes, env


_PLAIN = (int, float, bool, str, type(None))


def _attr_text(value: object) -> str | None:
    """An attribute value as text that tells apart any two values, or None for a kind this does
    not spell (the group is then analysed without the memo)."""
    kind = type(value)
    if kind in _PLAIN:
        return f"{kind.__name__}:{value!r}"
    if kind is tuple or kind is list:
        items = [_attr_text(v) for v in value]  # type: ignore[attr-defined]
        return None if None in items else f"{kind.__name__}[{','.join(items)}]"  # type: ignore[arg-type]
    if isinstance(value, np.dtype):
        return f"dtype:{value.str}"
    return None


@functools.lru_cache(maxsize=4096)
def _type_text(type_: TensorType | TupleType) -> str:
    """A value type as the memo's key spells it (types are immutable; a pass meets few)."""
    if isinstance(type_, TupleType):
        return "(" + ",".join(_type_text(t) for t in type_.items) + ")"
    assert isinstance(type_, TensorType)
    return f"{type_.dtype.str}{type_.shape!r}"


class AnalysisMemo:
    """schedule.analyze by the group's structure, within one pass. Every layer of a stack tries
    the same unions: a 12-layer encoder's training step analysed 1928 groups of 128 structures.
    The structure is what analyze reads: each op, its attributes and type, and its inputs by
    place (an op of the group by position; a value from outside by order of first use, its
    class and type; a constant also by its bytes), and the outputs by place. A schedule found
    for a structure is handed to a later group of that structure with every value put in by
    place, in the same order; a group that is not schedulable is analysed again, so that the
    reason names its own values."""

    def __init__(self) -> None:
        self._found: dict[str, tuple[Any, ...] | None] = {}
        self.hits = 0

    def analyze(self, nodes: list[Node], outputs: list[Value]) -> Schedule:
        spelt = self._spell(nodes, outputs)
        if spelt is None:
            return analyze(nodes, outputs)
        key, values = spelt
        template = self._found.get(key)
        if template is not None:
            self.hits += 1
            return _put_in(template, values)
        sched = analyze(nodes, outputs)  # NotSchedulable: nothing kept
        if key not in self._found:
            self._found[key] = _take_out(sched, {v.uid: i for i, v in enumerate(values)})
        return sched

    @staticmethod
    def _spell(nodes: list[Node], outputs: list[Value]) -> tuple[str, list[Value]] | None:
        place: dict[int, int] = {}
        values: list[Value] = []
        parts: list[str] = []
        for node in nodes:
            if node.subgraph is not None:
                return None
            reads = []
            for v in node.inputs:
                at = place.get(v.uid)
                if at is None:
                    at = place[v.uid] = len(values)
                    values.append(v)
                    if isinstance(v, Constant):
                        data = v.value.tobytes()
                        parts.append(f"constant {v.value.dtype.str}{v.value.shape}:" +
                                     (data.hex() if len(data) <= 64 else f"id{id(v)}"))
                    else:
                        parts.append(f"{type(v).__name__} {_type_text(v.type)}")
                reads.append(str(at))
            attrs = []
            for name, value in node.attrs.items():
                text = _attr_text(value)
                if text is None:
                    return None
                attrs.append(f"{name}={text}")
            place[node.uid] = len(values)
            values.append(node)
            parts.append(f"{node.op}({','.join(reads)}){{{';'.join(attrs)}}}:"
                         f"{_type_text(node.type)}")
        outs = [place.get(o.uid) for o in outputs]
        if None in outs:
            return None
        parts.append("out " + ",".join(map(str, outs)))
        return "\n".join(parts), values


def _take_out(sched: Schedule, place: dict[int, int]) -> tuple[Any, ...] | None:
    """`sched` with every value (a uid key, a node, a map's source) as its place; None when it
    holds a value that is not one of the group's."""
    try:
        return (sched.space, sched.reduce_axes,
                [(place[u], a) for u, a in sched.aligned.items()],
                [(place[u], p) for u, p in sched.outer_phase.items()],
                [[place[n.uid] for n in phase] for phase in sched.phases],
                [(place[u], place[m.source.uid], m.offset, m.strides)
                 for u, m in sched.maps.items()],
                [(place[u], axis, tuple((place[v.uid], at) for v, at in pieces))
                 for u, (axis, pieces) in sched.concats.items()],
                [(place[u], place[v.uid], shape) for u, (v, shape) in sched.tiles.items()])
    except KeyError:
        return None


def _put_in(template: tuple[Any, ...], values: list[Value]) -> Schedule:
    space, axes, aligned, outer, phases, maps, concats, tiles = template
    uid = [v.uid for v in values]
    return Schedule(
        space, axes, {uid[i]: a for i, a in aligned}, {uid[i]: p for i, p in outer},
        [[values[i] for i in phase] for phase in phases],
        {uid[i]: IndexMap(values[j], offset, strides) for i, j, offset, strides in maps},
        {uid[i]: (axis, tuple((values[j], at) for j, at in pieces))
         for i, axis, pieces in concats},
        {uid[i]: (values[j], shape) for i, j, shape in tiles})


class Clusterer:
    def __init__(self, graph: Graph, flags: GraphKernelFlags, allow_composites: bool,
                 stage: str, cost: CostModel = DEFAULT_COST_MODEL) -> None:
        self.graph = graph
        self.flags = flags
        self.allow_composites = allow_composites
        self.stage = stage
        self.cost = cost
        self.pos = {n.uid: i for i, n in enumerate(graph.nodes)}
        self.by_uid = {n.uid: n for n in graph.nodes}
        self.users = graph.users()
        self.output_uids = {v.uid for v in graph.results()}
        self.group_of: dict[int, Group] = {}
        self.reasons: dict[tuple[int, int], FusionReason] = {}
        self.analysis = AnalysisMemo()
        self.scores = score_products(graph)  # attention's scores products (attention.py)

    # -- which nodes may join groups ------------------------------------------------------
    def unit_refusal(self, node: Node) -> tuple[FuseRule, str] | None:
        if node.subgraph is None:
            return op_refusal(node.op, self.flags)
        if not self.allow_composites:
            return FuseRule.PATTERN, (f"composite {node.name} joins other ops in the composite-op "
                               "fusion stage")
        for inner in flat_ops(node):
            refusal = op_refusal(inner.op, self.flags)
            # --enable_cluster_ops_only lists basic ops; a composite joins as a whole (MindSpore).
            if refusal is not None and not (refusal[0] is FuseRule.FLAG and
                                            self.flags.enable_cluster_ops_only):
                return refusal[0], f"composite {node.name} contains {inner.op}: {refusal[1]}"
        return None

    def run(self) -> ClusterResult:
        for gid, node in enumerate(self.graph.nodes):
            if node.op == "GetItem" and node.inputs[0].uid in self.group_of:
                group = self.group_of[node.inputs[0].uid]
                group.units.append(node)
                self.group_of[node.uid] = group
                continue
            if node.op != "GetItem" and self.unit_refusal(node) is None:
                self.group_of[node.uid] = Group([node], gid)
        for node in self.graph.nodes:
            if node.op == "GetItem":
                continue
            for value in node.inputs:
                producer = self._producer(value)
                if producer is None:
                    continue
                self._try_merge(producer, node)
        return ClusterResult(self.materialise(), self._final_reasons())

    def _producer(self, value: Value) -> Node | None:
        node = self.by_uid.get(value.uid)
        if node is not None and node.op == "GetItem":
            node = self.by_uid.get(node.inputs[0].uid, node)
        return node

    def _refuse(self, producer: Node, consumer: Node, rule: FuseRule, detail: str) -> None:
        self.reasons[(producer.uid, consumer.uid)] = FusionReason(
            self.stage, producer.name, consumer.name, rule, detail)

    def _try_merge(self, producer: Node, consumer: Node) -> None:
        a, b = self.group_of.get(producer.uid), self.group_of.get(consumer.uid)
        if a is not None and a is b:
            return
        for node in (producer, consumer):
            refusal = None if node.uid in self.group_of else self.unit_refusal(node)
            if refusal is not None:
                self._refuse(producer, consumer, *refusal)
                return
        assert a is not None and b is not None
        if a.op_count() + b.op_count() > self.flags.composite_op_limit_size:
            self._refuse(producer, consumer, FuseRule.LIMIT,
                         f"together they would hold {a.op_count() + b.op_count()} ops "
                         f"(--composite_op_limit_size={self.flags.composite_op_limit_size})")
            return
        if self._creates_cycle(a, b):
            self._refuse(producer, consumer, FuseRule.CYCLE,
                         "another op outside both depends on the first and feeds the second")
            return
        kept = self._conv_epilogue_kept(a, b) or self._mask_kept(a, b)
        if kept is not None:
            self._refuse(producer, consumer, FuseRule.COST, kept)
            return
        units = sorted(a.units + b.units, key=lambda n: self.pos[n.uid])
        nodes, inputs, outputs, _ = self.describe(units)
        try:
            sched = self.analysis.analyze(nodes, outputs)
        except NotSchedulable as exc:
            self._refuse(producer, consumer, FuseRule.SHAPE, str(exc))
            return
        reason = self.cost.decline(nodes, inputs, sched)
        if reason is not None:
            self._refuse(producer, consumer, FuseRule.COST, reason)
            return
        a.units = units
        for unit in b.units:
            self.group_of[unit.uid] = a
        self.reasons.pop((producer.uid, consumer.uid), None)

    def _conv_epilogue_kept(self, a: Group, b: Group) -> str | None:
        """Why pointwise group `a`, the epilogue of the convolution it alone reads, stays
        apart from the reduction `b` after it; None where merging them pays.

        A squeeze-excite block's map (convolution, bias, activation) is read twice: by its
        global mean and by the channel scale. Merged with the mean, the bias and activation
        leave the convolution's block: the convolution writes its raw map, the reduction
        re-reads it and writes the activated map again, one more write and read of the map
        than the block writing the activated map that the mean then reads. Where `a`'s result
        has no reader besides `b`, merging saves that write, and the merge goes ahead."""
        if not _has_reduction(b) or _has_reduction(a):
            return None
        conv = self._only_read_convolution(a)
        if conv is None:
            return None
        members = {u.uid for u in a.units} | {u.uid for u in b.units}
        read_elsewhere = any(
            unit.uid in self.output_uids or
            any(w.uid not in members for w in self.users.get(unit.uid, []))
            for unit in a.units if unit.op != "GetItem")
        if not read_elsewhere:
            return None
        return (f"the pointwise group stays {conv.name}'s block epilogue: its result is "
                "written for other readers anyway, and the reduction reads it there instead "
                "of re-reading the convolution's result")

    def _mask_kept(self, a: Group, b: Group) -> str | None:
        """Why group `a` stays apart from group `b`, which reads attention's scores
        (attention.py `score_products`) that `a` does not: a mask computed from the inputs
        (GPT-2's causal select) merged into the softmax group makes it other than the
        `softmax(scores [* scale] [+ mask])` the attention step takes, and the scores and
        probabilities then go to memory as three steps. Apart, the mask is a kernel of its own
        that the attention step reads. None where `b` reads no scores or `a` reads them too."""
        if not self.scores:
            return None
        read_by_b = self._read_scores(b)
        if not read_by_b or self._read_scores(a):
            return None
        name = self.by_uid[min(read_by_b, key=lambda uid: self.pos[uid])].name
        return (f"the softmax group over {name}'s attention scores stays an attention step's "
                "(softmax of the scores, scaled, plus a mask read as it is): this group "
                "computes something else")

    def _read_scores(self, group: Group) -> set[int]:
        return {v.uid for unit in group.units for v in unit.inputs if v.uid in self.scores}

    def _only_read_convolution(self, a: Group) -> Node | None:
        """The convolution outside any group whose result only group `a` reads, if one."""
        members = {u.uid for u in a.units}
        for unit in a.units:
            for value in unit.inputs:
                node = self.by_uid.get(value.uid)
                if node is None or node.uid in self.group_of or node.subgraph is not None or \
                        get_op(node.op).window is not Window.CONVOLUTION:
                    continue
                if node.uid in self.output_uids:
                    continue
                if all(w.uid in members for w in self.users.get(node.uid, [])):
                    return node
        return None

    def describe(self, units: list[Node]) -> tuple[list[Node], list[Value], list[Value],
                                                   list[tuple[Node, Value]]]:
        """Flattened ops, external inputs, outputs, and (unit result, flat value) pairs."""
        nodes, value_map = flatten(units)
        member = {u.uid for u in units}
        flat_ids = {n.uid for n in nodes}
        inputs: list[Value] = []
        seen: set[int] = set()
        for node in nodes:
            for v in node.inputs:
                if v.uid not in flat_ids and v.uid not in seen and not (
                        isinstance(v, Constant) and v.is_scalar):
                    seen.add(v.uid)
                    inputs.append(v)
        exported: list[tuple[Node, Value]] = []
        for unit in units:
            if unit.uid not in value_map:
                continue
            used_outside = unit.uid in self.output_uids or any(
                u.uid not in member for u in self.users.get(unit.uid, []))
            if used_outside:
                exported.append((unit, value_map[unit.uid]))
        outputs: list[Value] = []
        for _, v in exported:
            if v not in outputs:
                outputs.append(v)
        return nodes, inputs, outputs, exported

    def _creates_cycle(self, a: Group, b: Group) -> bool:
        members = {u.uid for u in a.units} | {u.uid for u in b.units}
        for src, dst in ((a, b), (b, a)):
            targets = {u.uid for u in dst.units}
            limit = max(self.pos[u] for u in targets)
            stack = [w for u in src.units for w in self.users.get(u.uid, [])
                     if w.uid not in members]
            seen: set[int] = set()
            while stack:
                node = stack.pop()
                if node.uid in seen or self.pos[node.uid] > limit:
                    continue
                seen.add(node.uid)
                for w in self.users.get(node.uid, []):
                    if w.uid in targets:
                        return True
                    if w.uid not in members:
                        stack.append(w)
        return False

    # -- results ------------------------------------------------------------------------------
    def _final_reasons(self) -> list[FusionReason]:
        out = []
        for (p, c), reason in self.reasons.items():
            gp, gc = self.group_of.get(p), self.group_of.get(c)
            if gp is None or gp is not gc:
                out.append(reason)
        return out

    def materialise(self, prefix: str = "Fused",
                    made: dict[int, tuple[Node, list[Value], list[tuple[Node, Value]]]] | None
                    = None) -> Graph:
        """The graph with each group of two or more units replaced by one composite named
        `prefix` and its members' labels. `made`, when given, receives for each group (by its
        first unit's uid) the composite, its outputs and (unit, flat value) pairs exported."""
        groups: dict[int, Group] = {}
        for group in self.group_of.values():
            groups[id(group)] = group
        replacement: dict[int, Node] = {}  # first unit uid -> fused node
        remap: dict[int, Value] = {}
        fused_units: set[int] = set()
        taken_names = {n.name for n in self.graph.nodes}
        for group in groups.values():
            real = [u for u in group.units if u.op != "GetItem"]
            if len(real) < 2:
                continue
            nodes, inputs, outputs, exported = self.describe(group.units)
            sub_inputs = [Input(v.tensor_type, f"in{i}") for i, v in enumerate(inputs)]
            outer_to_inner = {v.uid: s for v, s in zip(inputs, sub_inputs)}
            for node in nodes:
                node.inputs = [outer_to_inner.get(v.uid, v) for v in node.inputs]
            name = fused_name([label for u in real for label in unit_labels(u)], taken_names,
                              prefix)
            taken_names.add(name)
            sub = Graph(name, sub_inputs, nodes, outputs)
            type_ = outputs[0].type if len(outputs) == 1 else TupleType(
                tuple(o.tensor_type for o in outputs))
            fused = Node("Composite", inputs, {}, type_, name, real[0].loc, sub)
            fused.notes["members"] = [u.name for u in real]
            fused.notes["fused_from"] = [label for u in real for label in unit_labels(u)]
            note_phases(fused.notes, phases_of(real))
            replacement[group.units[0].uid] = fused
            if made is not None:
                made[real[0].uid] = (fused, outputs, exported)
            fused_units.update(u.uid for u in group.units)
            for unit, flat in exported:
                index = outputs.index(flat)
                if len(outputs) == 1:
                    remap[unit.uid] = fused
                else:
                    getter = Node("GetItem", [fused], {"index": index}, flat.type, "GetItem",
                                  unit.loc)
                    remap[unit.uid] = getter
        if not replacement:
            return self.graph
        return _rebuild(self.graph, replacement, fused_units, remap)


def _rebuild(graph: Graph, replacement: dict[int, Node], fused_units: set[int],
             remap: dict[int, Value]) -> Graph:
    """New node list in a topological order of the quotient graph (Kahn's algorithm)."""
    items: list[Node] = []
    for node in graph.nodes:
        if node.uid in replacement:
            items.append(replacement[node.uid])
        elif node.uid not in fused_units:
            items.append(node)
    getters = [v for v in remap.values() if isinstance(v, Node) and v.op == "GetItem"]
    for node in items:
        node.inputs = [remap.get(v.uid, v) for v in node.inputs]
    items += getters
    producers = {n.uid: n for n in items}
    order = {n.uid: i for i, n in enumerate(items)}
    indegree = {n.uid: 0 for n in items}
    consumers: dict[int, list[Node]] = {}
    for node in items:
        for v in {v.uid for v in node.inputs}:
            if v in producers:
                indegree[node.uid] += 1
                consumers.setdefault(v, []).append(node)
    import heapq
    ready = [(order[n.uid], n.uid) for n in items if indegree[n.uid] == 0]
    heapq.heapify(ready)
    result: list[Node] = []
    while ready:
        _, uid = heapq.heappop(ready)
        node = producers[uid]
        result.append(node)
        for user in consumers.get(uid, []):
            indegree[user.uid] -= 1
            if indegree[user.uid] == 0:
                heapq.heappush(ready, (order[user.uid], user.uid))
    assert len(result) == len(items), "fusion created a cycle"
    graph.nodes = result
    graph.remap_results(remap)
    return graph


def _has_reduction(group: Group) -> bool:
    return any(get_op(op.op).kind == PatternKind.REDUCE
               for unit in group.units if unit.op != "GetItem" for op in flat_ops(unit))


def unit_labels(unit: Node) -> list[str]:
    """How a unit appears in a fused kernel's name: an expanded op by its own name (GeLU), a
    previous fused group by its labels, anything else by its basic ops (Mul, Add)."""
    if "expanded_from" in unit.notes:
        return [unit.notes["expanded_from"]]
    if "fused_from" in unit.notes:
        return list(unit.notes["fused_from"])
    return [n.op for n in flat_ops(unit)]


def fused_name(ops: list[str], taken: set[str], prefix: str = "Fused") -> str:
    if len(ops) <= 8:
        base = f"{prefix}_" + "_".join(ops)
    else:
        base = f"{prefix}_" + "_".join(ops[:4]) + f"_and_{len(ops) - 4}_more"
    name, n = base, 1
    while name in taken:
        name = f"{base}_{n}"
        n += 1
    return name


def cluster(graph: Graph, flags: GraphKernelFlags, allow_composites: bool, stage: str,
            cost: CostModel = DEFAULT_COST_MODEL) -> ClusterResult:
    return Clusterer(graph, flags, allow_composites, stage, cost).run()

