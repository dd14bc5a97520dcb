"""Parallel (horizontal) fusion, MindSpore's `enable_parallel_fusion`: after composite fusion,
groups of one graph with no path between them (independent branches, siblings that read one
input, the optimizer updates of a training step's parameters) are launched as one kernel.

The merged kernel is a composite whose subgraph holds every group's ops side by side. Groups
that share one iteration space are interleaved in one loop nest (an input they share is read
once); the others keep loop nests of their own, run one after another in one C function
(`Node.notes["loop_nests"]` lists each nest's outputs; `parallel_schedule` plans them). The
plan shows one step with several outputs.

Legality is this module's (`_unit_refusal` for a group alone, `_join_refusal` for a group
joining a kernel: pattern, flag, shape, limit, cycle); whether it pays is the cost model's
(`cost_model.parallel_decline`). A refusal between siblings (or one the cost model made) is a
`FusionReason` with `parallel=True`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from graphkernel.errors import VerifyError
from graphkernel.graph_kernel.cluster import Clusterer, Group
from graphkernel.graph_kernel.cost_model import CostModel, parallel_decline
from graphkernel.graph_kernel.flags import GraphKernelFlags
from graphkernel.graph_kernel.reasons import FuseRule, FusionReason
from graphkernel.graph_kernel.schedule import NotSchedulable, Schedule, analyze
from graphkernel.ir.graph import Constant, Graph, Node, Value, output_types
from graphkernel.ir.opset import PatternKind, Window, get_op

# Node.notes keys of a parallel kernel: the output numbers each loop nest writes, and in words
# how its groups run (shown in the dumps).
LOOP_NESTS = "loop_nests"
PARALLEL = "parallel"


@dataclass
class Nest:
    """One loop nest of a parallel kernel: its ops as a graph of its own, its schedule, and for
    each of its kernel arguments (inputs, non-scalar constants, outputs) the merged kernel's
    argument number."""

    graph: Graph
    schedule: Schedule
    args: tuple[int, ...]


@dataclass
class ParallelSchedule:
    """`Node.schedule` of a parallel kernel whose groups need several loop nests."""

    nests: list[Nest]


def parallel_schedule(node: Node) -> Schedule | ParallelSchedule:
    """The schedule of a parallel kernel: one Schedule when all its groups share one loop nest,
    else one per nest. Raises NotSchedulable (never expected: each nest was analysed when the
    groups were merged), VerifyError when its `loop_nests` note does not fit it."""
    sub = node.subgraph
    assert sub is not None
    nests = check_loop_nests(node)
    if len(nests) == 1:
        return analyze(sub.nodes, sub.outputs)
    constants = [c for c in sub.constants() if not c.is_scalar]
    arg_of = {v.uid: i for i, v in enumerate([*sub.inputs, *constants])}
    first_out = len(sub.inputs) + len(constants)
    planned = []
    for k, numbers in enumerate(nests):
        outputs = [sub.outputs[i] for i in numbers]
        nodes = _closure(sub.nodes, outputs)
        read = {v.uid for n in nodes for v in n.inputs}
        inputs = [v for v in sub.inputs if v.uid in read]
        graph = Graph(f"{sub.name}_{k}", inputs, nodes, outputs)
        nest_constants = [c for c in graph.constants() if not c.is_scalar]
        args = tuple(arg_of[v.uid] for v in [*inputs, *nest_constants]) + \
            tuple(first_out + i for i in numbers)
        planned.append(Nest(graph, analyze(nodes, outputs), args))
    return ParallelSchedule(planned)


def check_loop_nests(node: Node) -> list[list[int]]:
    """The `loop_nests` note of parallel kernel `node`, checked against its subgraph: the
    numbers of its outputs split into non-empty nests, each number once. The note decides which
    kernel argument each nest writes, so an unchecked one (a forged GKIR file) would write into
    an input or past a buffer, or leave a result unwritten. Raises VerifyError naming the
    problem."""
    assert node.subgraph is not None
    nests = node.notes.get(LOOP_NESTS)
    count = len(node.subgraph.outputs)
    if not isinstance(nests, list) or not nests or not all(
            isinstance(nest, list) and nest and
            all(type(i) is int for i in nest) for nest in nests):
        raise VerifyError(f"{node.name}: note {LOOP_NESTS} is {nests!r:.80}, not lists of "
                          "output numbers")
    numbers = sorted(i for nest in nests for i in nest)
    if numbers != list(range(count)):
        raise VerifyError(f"{node.name}: note {LOOP_NESTS} {nests!r:.80} does not name each of "
                          f"its {count} outputs (0 to {count - 1}) exactly once")
    return nests


def _closure(nodes: list[Node], outputs: list[Value]) -> list[Node]:
    """The nodes `outputs` need, in order."""
    by_uid = {n.uid: n for n in nodes}
    needed: set[int] = set()
    stack = [v.uid for v in outputs]
    while stack:
        uid = stack.pop()
        if uid in needed or uid not in by_uid:
            continue
        needed.add(uid)
        stack.extend(v.uid for v in by_uid[uid].inputs)
    return [n for n in nodes if n.uid in needed]


# -- planning the merge ---------------------------------------------------------------------
@dataclass
class _Unit:
    """A group that may join a parallel kernel: a composite or a lone fusible op."""

    node: Node
    pos: int
    units: list[Node]  # the node and the GetItems of its outputs
    nodes: list[Node]  # its basic ops, flattened
    outputs: list[Value]
    sched: Schedule
    reads: dict[int, int]  # uid of each non-scalar value it reads -> bytes

    @property
    def bytes(self) -> int:
        return sum(self.reads.values()) + sum(t.nbytes for t in output_types(self.node))


@dataclass(eq=False)
class _Nest:
    members: list[_Unit]
    nodes: list[Node]
    outputs: list[Value]
    sched: Schedule

    @property
    def reads(self) -> dict[int, int]:
        return {k: v for m in self.members for k, v in m.reads.items()}

    @property
    def bytes(self) -> int:
        return sum(self.reads.values()) + sum(
            t.nbytes for m in self.members for t in output_types(m.node))


@dataclass(eq=False)  # a kernel is itself: hashed and compared by identity
class _Kernel:
    nests: list[_Nest] = field(default_factory=list)
    index: int = 0  # creation order: kernels are tried oldest first
    head: int = 0  # the position of its first member (members share one reachability set)
    # Kept up to date on each join (`ParallelFuser._note_join`), so that most kernels a unit
    # cannot join are passed over without weighing: the members' positions as a bitset, the
    # iteration spaces of its nests, how many nests move more than parallel_max_bytes.
    bits: int = 0
    # iteration space -> the fewest ops in one of its nests of that space
    spaces: dict[tuple[int, ...], int] = field(default_factory=dict)
    large: int = 0

    @property
    def members(self) -> list[_Unit]:
        return [m for nest in self.nests for m in nest.members]


class ParallelFuser:
    def __init__(self, graph: Graph, flags: GraphKernelFlags, cost: CostModel,
                 stage: str) -> None:
        self.graph, self.flags, self.cost, self.stage = graph, flags, cost, stage
        self.clusterer = Clusterer(graph, flags, True, stage, cost)
        self.pos = {n.uid: i for i, n in enumerate(graph.nodes)}
        self.reasons: list[FusionReason] = []
        # desc[i]: the nodes reachable from node i, a bitset by position; a merged kernel's
        # members share one (the quotient graph's reachability, kept up to date on each merge).
        users = graph.users()
        self.desc = [0] * len(graph.nodes)
        for i in range(len(graph.nodes) - 1, -1, -1):
            bits = 0
            for user in users.get(graph.nodes[i].uid, []):
                j = self.pos[user.uid]
                bits |= (1 << j) | self.desc[j]
            self.desc[i] = bits
        self.graph_desc = list(self.desc)  # the graph's own, for naming a path's ends
        self.readers = users
        self.getitems: dict[int, list[Node]] = {}
        self.kernels: list[_Kernel] = []  # every kernel made so far, oldest first
        # Open kernels (not full) by the iteration spaces of their nests and by their count of
        # nests over parallel_max_bytes (0 or 1; 2 or more take no separate nest): `_candidates`.
        self._by_space: dict[tuple[int, ...], dict[_Kernel, None]] = {}
        self._by_large: tuple[dict[_Kernel, None], dict[_Kernel, None]] = ({}, {})
        for node in graph.nodes:
            if node.op == "GetItem":
                self.getitems.setdefault(node.inputs[0].uid, []).append(node)

    # -- legality ----------------------------------------------------------------------------
    def _unit_refusal(self, node: Node) -> tuple[FuseRule, str] | _Unit:
        """Why `node` cannot join a parallel kernel, or what it brings when it can."""
        refusal = self.clusterer.unit_refusal(node)
        if refusal is not None:
            return refusal
        if node.subgraph is None and (get_op(node.op).view or
                                      get_op(node.op).kind in (PatternKind.INJECTIVE,
                                                               PatternKind.BROADCAST)):
            return FuseRule.PATTERN, f"{node.op} alone runs as a view of its input: no launch"
        for v in node.inputs:  # a convolution's epilogue may join its kernel (lowering)
            if isinstance(v, Node) and v.subgraph is None and node.subgraph is not None and \
                    get_op(v.op).window is Window.CONVOLUTION and \
                    len(self.readers.get(v.uid, [])) == 1:
                return FuseRule.PATTERN, (f"{node.name} alone reads {v.name}: it runs in the "
                                          "convolution's kernel")
        units = [node, *self.getitems.get(node.uid, [])]
        nodes, inputs, outputs, _ = self.clusterer.describe(units)
        values = [*inputs, *outputs]
        if not all(v.tensor_type.is_static for v in values):
            return FuseRule.SHAPE, f"{node.name} has dynamic sizes"
        if not outputs or all(v.tensor_type.size == 0 for v in outputs):
            return FuseRule.SHAPE, f"{node.name} computes nothing"
        try:
            sched = self.clusterer.analysis.analyze(nodes, outputs)
        except NotSchedulable as exc:
            return FuseRule.SHAPE, f"{node.name} is not one loop nest: {exc}"
        reads = {v.uid: v.tensor_type.nbytes for v in inputs
                 if not (isinstance(v, Constant) and v.is_scalar)}
        return _Unit(node, self.pos[node.uid], units, nodes, outputs, sched, reads)

    def _path(self, unit: _Unit, kernel: _Kernel) -> str | None:
        """A path between `unit` and a member of `kernel` (either way), in words, or None."""
        if not self._related(unit, kernel):
            return None
        if self.desc[unit.pos] & kernel.bits:
            src, dst = unit.node, next(m for m in kernel.members
                                       if self.desc[unit.pos] >> m.pos & 1).node
        else:
            src, dst = self._reaching(kernel, unit), unit.node
        return (f"{src.name} reaches {dst.name} through other kernels: in one launch the "
                "kernel would wait for its own result")

    def _related(self, unit: _Unit, kernel: _Kernel) -> bool:
        """Whether there is a path between `unit` and a member of `kernel` (either way): a few
        bit operations, as the members share one reachability set."""
        return bool(self.desc[unit.pos] & kernel.bits or self.desc[kernel.head] >> unit.pos & 1)

    def _candidates(self, unit: _Unit, near: list[_Kernel]) -> list[_Kernel]:
        """The kernels `_join_refusal` could let `unit` join, in the order they are tried (its
        siblings' kernels first, then oldest first): open ones (not full) with no path to or
        from it and either a nest of its iteration space with room for its ops
        (composite_op_limit_size) to interleave with, or room for one more loop nest
        (parallel_decline refuses a second nest over parallel_max_bytes). Every other kernel
        refuses it, for the limit, a path or the cost, so the analysis and cost checks it would
        run are skipped: a unit is weighed only against kernels it could join, not against every
        kernel so far (a training step's independent optimizer updates met every one)."""
        room = self.flags.composite_op_limit_size - len(unit.nodes)
        same_space = {k: None for k in self._by_space.get(unit.sched.space, {})
                      if k.spaces[unit.sched.space] <= room}
        large = unit.bytes > self.cost.parallel_max_bytes
        found = {**same_space, **self._by_large[0], **({} if large else self._by_large[1])}
        ordered = [k for k in near if k in found] + \
            sorted((k for k in found if k not in near), key=lambda k: k.index)
        return [k for k in ordered if not self._related(unit, k)]

    def _note_join(self, kernel: _Kernel, full: bool) -> None:
        """Bring `kernel`'s bitset, spaces, count of large nests and the indexes of open kernels
        by space and by count of large nests up to date after a join (a full one leaves them)."""
        kernel.bits = sum(1 << m.pos for m in kernel.members)
        kernel.head = kernel.members[0].pos
        kernel.spaces = {}
        for nest in kernel.nests:
            ops = kernel.spaces.get(nest.sched.space, len(nest.nodes))
            kernel.spaces[nest.sched.space] = min(ops, len(nest.nodes))
        kernel.large = sum(nest.bytes > self.cost.parallel_max_bytes for nest in kernel.nests)
        for space in kernel.spaces:
            self._by_space.setdefault(space, {}).pop(kernel, None)
            if not full:
                self._by_space[space][kernel] = None
        for count, kernels in enumerate(self._by_large):
            kernels.pop(kernel, None)
            if kernel.large == count and not full:
                kernels[kernel] = None

    def _reaching(self, kernel: _Kernel, unit: _Unit) -> Node:
        """A member with a path to `unit` in the original graph (else through merges)."""
        direct = [m for m in kernel.members if self.graph_desc[m.pos] >> unit.pos & 1]
        return (direct or kernel.members)[0].node

    def _join_refusal(self, unit: _Unit, kernel: _Kernel) -> tuple[FuseRule, str] | None:
        """Why `unit` may not join `kernel` (legality, then cost); None: it joins (the kernel
        is updated)."""
        if len(kernel.members) >= self.cost.parallel_max_groups:
            return FuseRule.LIMIT, (f"the kernel holds {len(kernel.members)} groups already "
                                    f"(parallel_max_groups={self.cost.parallel_max_groups})")
        path = self._path(unit, kernel)
        if path is not None:
            return FuseRule.CYCLE, path
        interleave_refusal = None
        for nest in kernel.nests:
            if nest.sched.space != unit.sched.space:
                continue
            nodes, outputs = nest.nodes + unit.nodes, nest.outputs + unit.outputs
            if len(nodes) > self.flags.composite_op_limit_size:
                continue  # one nest holds at most as many ops as a fused group
            try:
                sched = self.clusterer.analysis.analyze(nodes, outputs)
            except NotSchedulable:
                continue
            reads = nest.reads
            inputs = _inputs_of(nodes)
            declined = self.cost.decline(nodes, inputs, sched)
            if declined is None:
                shared = sum(b for uid, b in unit.reads.items() if uid in reads)
                declined = parallel_decline(self.cost, [nest.bytes + unit.bytes], True, shared)
            if declined is not None:
                interleave_refusal = declined
                continue
            nest.members.append(unit)
            nest.nodes, nest.outputs, nest.sched = nodes, outputs, sched
            return None
        sizes = [n.bytes for n in kernel.nests] + [unit.bytes]
        declined = parallel_decline(self.cost, sizes, False, 0)
        if declined is not None:
            return FuseRule.COST, interleave_refusal or declined
        kernel.nests.append(_Nest([unit], list(unit.nodes), list(unit.outputs), unit.sched))
        return None

    # -- the pass ----------------------------------------------------------------------------
    def run(self) -> Graph:
        kernels = self.kernels
        # Kernels that may take another group (not full), oldest first; a full kernel refuses
        # every newcomer for the limit, so only the oldest full one is ever worth naming.
        open_kernels: list[_Kernel] = []
        first_full: _Kernel | None = None
        kernel_of: dict[int, _Kernel] = {}  # member uid -> its kernel
        readers: dict[int, list[Node]] = {}  # value uid -> top-level nodes reading it
        for node in self.graph.nodes:
            for v in node.inputs:
                if not (isinstance(v, Constant) and v.is_scalar) and node.op != "GetItem":
                    readers.setdefault(v.uid, []).append(node)
        noted_library: set[int] = set()
        limit = self.cost.parallel_max_groups
        for node in self.graph.nodes:
            if node.op == "GetItem":
                continue
            unit = self._unit_refusal(node)
            if not isinstance(unit, _Unit):
                continue
            siblings = [n for v in node.inputs for n in readers.get(v.uid, [])
                        if n is not node and n.op != "GetItem"]
            self._note_library_siblings(node, siblings, noted_library)
            near = list(dict.fromkeys(kernel_of[n.uid] for n in siblings if n.uid in kernel_of))
            # The first kernel, siblings' kernels first, then oldest first, that takes the
            # unit: only those that could are weighed (`_join_refusal`).
            joined = None
            for kernel in self._candidates(unit, near):
                if self._join_refusal(unit, kernel) is None:
                    joined = kernel
                    break
            if joined is None:
                # Worth telling: a sibling left apart, or a refusal by the cost model or limit.
                told = near[0] if near else self._first_costly(unit, open_kernels, first_full)
                joined = _Kernel([_Nest([unit], list(unit.nodes), list(unit.outputs),
                                        unit.sched)], index=len(kernels))
                kernels.append(joined)
                open_kernels.append(joined)
                if told is not None:
                    refusal = self._join_refusal(unit, told)
                    assert refusal is not None  # it was refused above (or is full)
                    other = next((m.node for m in told.members if m.node in siblings),
                                 told.members[0].node)
                    self._refuse(other, node, *refusal)
            else:
                self._merge_reachability(joined, unit)
            self._note_join(joined, len(joined.members) >= limit)
            if len(joined.members) >= limit:
                open_kernels.remove(joined)
                if first_full is None or joined.index < first_full.index:
                    first_full = joined
            kernel_of[node.uid] = joined
        return self._materialise([k for k in kernels if len(k.members) > 1])

    def _first_costly(self, unit: _Unit, open_kernels: list[_Kernel],
                      first_full: _Kernel | None) -> _Kernel | None:
        """The oldest kernel that refused `unit` for the limit or the cost, not a path: the
        oldest full kernel, or the oldest open one with no path to or from `unit` (it was
        refused, so for the cost)."""
        for kernel in open_kernels:
            if first_full is not None and first_full.index < kernel.index:
                break
            if not self._related(unit, kernel):
                return kernel
        return first_full

    def _note_library_siblings(self, node: Node, siblings: list[Node], noted: set[int]) -> None:
        """A library call (MatMul, Conv2D) reading the same input: never part of one launch."""
        for other in siblings:
            if other.uid in noted or other.subgraph is not None:
                continue
            opdef = get_op(other.op)
            if opdef.kind == PatternKind.OPAQUE and not opdef.writes:  # an Assign: a copy
                noted.add(other.uid)
                self._refuse(other, node, FuseRule.PATTERN,
                             f"{other.op} is opaque: it runs as a library kernel")

    def _refuse(self, first: Node, second: Node, rule: FuseRule, detail: str) -> None:
        if self.pos[first.uid] > self.pos[second.uid]:
            first, second = second, first
        self.reasons.append(FusionReason(self.stage, first.name, second.name, rule, detail,
                                         parallel=True))

    def _merge_reachability(self, kernel: _Kernel, unit: _Unit) -> None:
        members = sum(1 << m.pos for m in kernel.members)
        reach = 0
        for m in kernel.members:
            reach |= self.desc[m.pos]
        for i, bits in enumerate(self.desc):
            if bits & members or members >> i & 1:
                self.desc[i] = bits | reach

    def _materialise(self, kernels: list[_Kernel]) -> Graph:
        if not kernels:
            return self.graph
        cl = self.clusterer
        for gid, kernel in enumerate(kernels):
            units = sorted((u for m in kernel.members for u in m.units),
                           key=lambda n: self.pos[n.uid])
            group = Group(units, gid)
            for u in units:
                cl.group_of[u.uid] = group
        made: dict[int, tuple[Node, list[Value], list[tuple[Node, Value]]]] = {}
        graph = cl.materialise(prefix="Parallel", made=made)
        for kernel in kernels:
            first = min(kernel.members, key=lambda m: m.pos)
            fused, outputs, exported = made[first.node.uid]
            numbers: list[list[int]] = []
            for nest in kernel.nests:
                uids = {u.uid for m in nest.members for u in m.units}
                numbers.append(sorted({outputs.index(v) for u, v in exported if u.uid in uids}))
            fused.notes[LOOP_NESTS] = numbers
            fused.notes[PARALLEL] = _describe(kernel)
        return graph


def _describe(kernel: _Kernel) -> str:
    if len(kernel.nests) == 1:
        return f"{len(kernel.members)} groups interleaved in one loop nest"
    nests = ["+".join(m.node.name for m in nest.members) for nest in kernel.nests]
    return f"{len(nests)} loop nests one after another: {', '.join(nests)}"


def _inputs_of(nodes: list[Node]) -> list[Value]:
    inside = {n.uid for n in nodes}
    seen: dict[int, Value] = {}
    for n in nodes:
        for v in n.inputs:
            if v.uid not in inside and not (isinstance(v, Constant) and v.is_scalar):
                seen.setdefault(v.uid, v)
    return list(seen.values())


def parallel_fuse(graph: Graph, flags: GraphKernelFlags, cost: CostModel, stage: str
                  ) -> tuple[Graph, list[FusionReason]]:
    """Independent groups of `graph` merged into parallel kernels where it pays; the reasons
    for the pairs left apart."""
    fuser = ParallelFuser(graph, flags, cost, stage)
    return fuser.run(), fuser.reasons
