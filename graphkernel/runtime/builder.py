"""From the lowered graph (hwopt_e_lower) to the execution plan (runtime/plan.py), in one pass:
every node becomes the step its lowering names; kernels are backend-neutral specs
(`KernelSpec`) that the backend builds (backends/)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from graphkernel.graph_kernel.library_views import LibraryViews, library_views
from graphkernel.graph_kernel.lower import KernelKind, Lowering
from graphkernel.graph_kernel.parallel_fusion import ParallelSchedule
from graphkernel.graph_kernel.schedule import Schedule
from graphkernel.ir.graph import Constant, Graph, Node, Value, node_phases, output_types, phases_of
from graphkernel.ir.opset import PatternKind, Window, get_op
from graphkernel.ir.types import TensorType
from graphkernel.runtime import blas
from graphkernel.runtime.flops import gemm_mnk, graph_flops, node_flops
from graphkernel.runtime.plan import (
    DEFAULT_PLAN_SETTINGS,
    ExecutionPlan,
    KernelSpec,
    PlanSettings,
    Slot,
    SlotRole,
    Step,
    StepKind,
    Workspace,
    bytes_of,
    kernel_identifier,
    kernel_symbols,
    plan_memory,
    symbol_bindings,
)

# The kinds a backend builds a kernel for.
_KERNELS = frozenset({KernelKind.LOOP_NEST, KernelKind.PARALLEL, KernelKind.SINGLE_OP,
                      KernelKind.CONV_BLOCK, KernelKind.WINDOW, KernelKind.ARGMAX,
                      KernelKind.ATTENTION})


def _flat_op_names(graph: Graph) -> tuple[str, ...]:
    names: list[str] = []
    for node in graph.nodes:
        if node.subgraph is not None:
            names += _flat_op_names(node.subgraph)
        elif node.op != "GetItem":
            names.append(node.op)
    return tuple(names)


class _PlanBuilder:
    """Numbers the graph's values into slots and turns each node into a step."""

    def __init__(self, graph: Graph) -> None:
        self.slots: list[Slot] = []
        self.slot_of: dict[int, int] = {}  # value uid (or (uid, item)) -> slot
        self.steps: list[Step] = []
        for inp in graph.inputs:
            role = SlotRole.INPUT if inp.kind == "input" else SlotRole.WEIGHT
            self.slot_of[inp.uid] = self._new(inp.name, inp.tensor_type, role)

    def _new(self, name: str, type_: TensorType, role: SlotRole,
             constant: np.ndarray | None = None) -> int:
        self.slots.append(Slot(len(self.slots), name, type_, role, constant))
        return len(self.slots) - 1

    def read(self, value: Value) -> int:
        if value.uid not in self.slot_of:
            assert isinstance(value, Constant), f"{value.name} used before it is defined"
            self.slot_of[value.uid] = self._new(value.name, value.tensor_type,
                                                SlotRole.CONSTANT, value.value)
        return self.slot_of[value.uid]

    def write(self, node: Value) -> tuple[int, ...]:
        types = output_types(node)
        slots = tuple(self._new(node.name if len(types) == 1 else f"{node.name}.{i}", t,
                                SlotRole.VALUE) for i, t in enumerate(types))
        if len(types) == 1:
            self.slot_of[node.uid] = slots[0]
        for i, s in enumerate(slots):
            self.slot_of[(node.uid, i)] = s  # type: ignore[index]  # slots keyed by uid, and (uid, index) for items
        return slots

    def getitem(self, node: Node) -> None:
        """A GetItem is no step: its slot is the item's slot."""
        source = node.inputs[0]
        self.slot_of[node.uid] = self.slot_of[(source.uid, node.attrs["index"])]  # type: ignore[index]  # slots keyed by (uid, index) for items


def _blas_threads(node: Node, settings: PlanSettings) -> int | None:
    if not get_op(node.op).gemm or settings.blas_parallel_min_mnk is None:
        return None
    mnk = gemm_mnk(node)
    return 1 if mnk is not None and mnk < settings.blas_parallel_min_mnk else None


def _blas_may_spin() -> bool:
    """Whether numpy's BLAS runs products on more than one thread now (unknown: assumed so;
    OPENBLAS_NUM_THREADS=1 or threadpoolctl's limit at compile time: no)."""
    threads = blas.threads_now()
    return threads is None or threads > 1


def _wakes_blas(step: Step) -> bool:
    """Whether a step may run a BLAS product on BLAS's own threads: a MatMul or BatchMatMul not
    held to one thread, when the Python runner runs it (numpy). The C backend's entry runs every
    product on its own kernels' threads, one BLAS thread each (backends/c/), but which runner
    a plan gets is known only after planning: the kernels after such a product are planned for
    either."""
    return step.kind is StepKind.LIBRARY and step.op in ("MatMul", "BatchMatMul") and \
        step.blas_threads is None


def _library_step(node: Node, reads: tuple[int, ...], writes: tuple[int, ...],
                  settings: PlanSettings, views: LibraryViews | None = None) -> Step:
    opdef = get_op(node.op)
    attrs = {**opdef.attr_defaults, **node.attrs}
    types = output_types(node)
    op_names: tuple[str, ...] = (node.op,)
    flops, phases = node_flops(node), node_phases(node)  # folded layout ops compute nothing
    if views is not None:  # graph_kernel/library_views.py: layout ops read or written in place
        attrs["read_views"] = {i: (v.offset, v.shape, v.strides)
                               for i, v in views.operands.items()}
        before = tuple(n.op for v in views.operands.values() for n in _flat(v.folded))
        op_names = before + op_names
        if views.result is not None:
            attrs["write_view"] = (views.result.shape, views.result.strides)
            types = (views.result.buffer.tensor_type,)
            op_names += tuple(n.op for n in _flat(views.result.folded))
    moved = bytes_of(tuple(v.tensor_type for v in node.inputs)) + bytes_of(types)
    shape_op = opdef.kind in (PatternKind.INJECTIVE, PatternKind.BROADCAST)
    # numpy writes into a pooled buffer: BLAS, ufuncs whose inputs share the result's dtype,
    # a Gather (np.take into the buffer; the compiled entry copies the rows itself), and a
    # RangeLike (positions written into the buffer, by the entry too).
    same_dtype = len(types) == 1 and all(v.dtype == types[0].dtype for v in node.inputs)
    pooled = same_dtype and (opdef.gemm or
                             isinstance(getattr(opdef.reference, "ufunc", None), np.ufunc)) or \
        (node.op == "Gather" and views is None and types[0].dtype == node.inputs[0].dtype) or \
        (node.op == "RangeLike" and views is None)
    return Step(StepKind.VIEW if shape_op else StepKind.LIBRARY, node.name, op_names, reads,
                writes, types, op=node.op, attrs=attrs, pooled=pooled, aliases=not pooled,
                bytes_moved=moved, blas_threads=_blas_threads(node, settings), flops=flops,
                phases=phases)


def _flat(nodes: tuple[Node, ...]) -> list[Node]:
    return [n for node in nodes
            for n in (node.subgraph.nodes if node.subgraph is not None else [node])]


def _unique(cname: str, used: set[str]) -> str:
    while cname in used:
        cname += "_"
    used.add(cname)
    return cname


def _bytes_moved(node: Node) -> int:
    return bytes_of(tuple(v.tensor_type for v in node.inputs
                          if not (isinstance(v, Constant) and v.is_scalar))) + \
        bytes_of(output_types(node))


def plan_graph(graph: Graph, name: str, settings: PlanSettings = DEFAULT_PLAN_SETTINGS,
               workspace_bytes: Callable[[KernelSpec], int] | None = None,
               product_workspace: Callable[[Sequence[Slot], Step], int] | None = None
               ) -> tuple[ExecutionPlan, list[str]]:
    """The plan of `graph`, lowered (graph_kernel/lower.py): each node becomes the step its
    `Node.lowering` names; kernels are backend-neutral specs a backend builds. Returns the plan
    and warnings for the user (groups that run op by op). `workspace_bytes`: the backend's
    size of the data a convolution kernel keeps between calls (its repacked weights; 0: none),
    each given a WORKSPACE slot; `product_workspace`: likewise for a matrix product whose B is a
    constant or a weight the plan does not write (B packed once, kept between calls)."""
    assert graph.lowered_for is not None, "plan_graph takes a lowered graph"
    b = _PlanBuilder(graph)
    notes: list[str] = []
    used_names: set[str] = set()
    views = library_views(graph)  # marked by the last backend stage when fusion is on
    groups: _Groups = {}  # kernels that may write a weight in place, by step position
    # A multi-threaded BLAS product planned so far: its idle workers spin beside the kernels
    # after it (PlanSettings.serial_beside_blas). BLAS held to one thread has no such workers.
    watch = settings.serial_beside_blas and any(
        n.lowering.kind in _KERNELS for n in graph.nodes)
    beside_blas, seen = False, 0
    for node in graph.nodes:
        if watch and any(_wakes_blas(s) for s in b.steps[seen:]):
            beside_blas, watch = _blas_may_spin(), False
        seen = len(b.steps)
        lowering: Lowering = node.lowering
        kind = lowering.kind
        if kind is KernelKind.ITEM:
            b.getitem(node)
            continue
        if kind in (KernelKind.IN_LIBRARY_VIEW, KernelKind.IN_CONV_BLOCK,
                    KernelKind.IN_ATTENTION):
            continue  # computed by another node's step
        if kind is KernelKind.ALIAS:
            # Its result is its value; the write itself is the ASSIGN of Graph.assigns below.
            b.slot_of[node.uid] = b.read(node.inputs[1])
            continue
        if kind is KernelKind.CONV_BLOCK:  # a convolution, its fused epilogue (and pool)
            block = lowering.block
            assert block is not None and block.epilogue.subgraph is not None
            reads = tuple(b.read(v) for v in block.reads)
            writes = b.write(node)
            conv = block.conv
            spec = KernelSpec(_unique(kernel_identifier(conv.name + "_block"), used_names),
                              kind, node, block=block)
            ops = (conv.op,) + _flat_op_names(block.epilogue.subgraph) + \
                ((block.pool.op,) if block.pool is not None else ())
            moved = bytes_of(tuple(v.tensor_type for v in block.reads)) + \
                bytes_of(output_types(node))
            b.steps.append(Step(StepKind.KERNEL, conv.name + "_block", ops, reads, writes,
                                output_types(node), kernel=spec, pooled=True,
                                sizes=kernel_symbols(tuple(conv.inputs[0].shape)),
                                bytes_moved=moved, lowering=lowering,
                                flops=graph_flops(block.members),
                                phases=phases_of(block.members)))
            continue
        if kind is KernelKind.ATTENTION:  # scores, softmax and context: one kernel
            attention = lowering.attention
            assert attention is not None and attention.softmax.subgraph is not None
            reads = tuple(b.read(v) for v in attention.reads)
            writes = b.write(attention.out.value)
            spec = KernelSpec(_unique(kernel_identifier(node.name + "_attention"), used_names),
                              kind, node)
            # with the layout ops it reads and writes in place (library views), as a product's
            folded_in = [n.op for view in (views.get(attention.scores.uid),
                                           views.get(node.uid)) if view is not None
                         for v in view.operands.values() for n in _flat(v.folded)]
            mine = views.get(node.uid)
            folded_out = [n.op for n in _flat(mine.result.folded)] \
                if mine is not None and mine.result is not None else []
            added = [op for g in attention.folded if g.subgraph is not None
                     for op in _flat_op_names(g.subgraph)]  # q, k, v's head splits + bias
            ops = (*folded_in, *added, attention.scores.op,
                   *_flat_op_names(attention.softmax.subgraph), node.op, *folded_out)
            moved = bytes_of(tuple(v.tensor_type for v in attention.reads)) + \
                bytes_of((attention.out.value.tensor_type,))
            b.steps.append(Step(StepKind.KERNEL, node.name + "_attention", ops, reads, writes,
                                (attention.out.value.tensor_type,), kernel=spec, pooled=True,
                                bytes_moved=moved, lowering=lowering,
                                flops=graph_flops(attention.members),
                                phases=phases_of(attention.members)))
            continue
        if kind is KernelKind.LIBRARY_VIEW:
            mine = views[node.uid]
            reads = tuple(b.read(mine.operands[i].buffer if i in mine.operands else v)
                          for i, v in enumerate(node.inputs))
            writes = b.write(mine.result.buffer if mine.result is not None else node)
            b.steps.append(replace(_library_step(node, reads, writes, settings, mine),
                                   lowering=lowering))
            continue
        reads = tuple(b.read(v) for v in node.inputs)
        writes = b.write(node)
        if kind in (KernelKind.WINDOW, KernelKind.ARGMAX):  # a kernel of its own
            spec = KernelSpec(_unique(kernel_identifier(node.name), used_names), kind, node)
            sizes = kernel_symbols(tuple(node.inputs[0].shape)) \
                if kind is KernelKind.WINDOW else ()
            b.steps.append(Step(StepKind.KERNEL, node.name, (node.op,), reads, writes,
                                output_types(node), kernel=spec, pooled=True, sizes=sizes,
                                bytes_moved=_bytes_moved(node), lowering=lowering,
                                flops=node_flops(node), phases=node_phases(node)))
            continue
        if kind is KernelKind.LIBRARY:
            b.steps.append(replace(_library_step(node, reads, writes, settings),
                                   lowering=lowering))
            continue
        if kind is KernelKind.SINGLE_OP:  # one op, one loop nest (graph_kernel/single_op.py)
            assert lowering.group is not None
            sub, sched = lowering.group
        else:
            sub, sched = node.subgraph, node.schedule
        assert sub is not None
        types = output_types(node)
        op_names = (node.op,) if node.subgraph is None else _flat_op_names(sub)
        common = dict(name=node.name, op_names=op_names, writes=writes,
                      out_types=types, bytes_moved=_bytes_moved(node), lowering=lowering,
                      flops=graph_flops(sub.nodes), phases=node_phases(node))
        if kind is KernelKind.INTERPRETED:
            if lowering.warn:
                notes.append(f"{node.name} runs op by op on numpy: {lowering.reason}")
            b.steps.append(Step(StepKind.INTERPRETED, reads=reads, subgraph=sub, aliases=True,
                                note=lowering.reason, **common))  # type: ignore[arg-type]  # `common` holds Step's other fields
            continue
        spec = KernelSpec(_unique(kernel_identifier(node.name), used_names), kind, node,
                          sub, sched, beside_blas=beside_blas)
        # parallel fusion merges static groups only
        sizes = () if isinstance(sched, ParallelSchedule) else kernel_symbols(sched.space)
        # argv: the node's inputs, then the group's own non-scalar constants, then the results.
        extra = tuple(b.read(c) for c in sub.constants() if not c.is_scalar)
        b.steps.append(Step(StepKind.KERNEL, reads=reads + extra, kernel=spec, pooled=True,
                            sizes=sizes, **common))  # type: ignore[arg-type]  # `common` holds Step's other fields
        groups[len(b.steps) - 1] = (node, sub, sched)  # names may repeat (a loaded file)
    outputs = tuple(b.read(v) for v in graph.outputs)
    for i, value in enumerate(graph.outputs):
        if isinstance(value, Constant):  # a fresh copy per call: results are the caller's
            fresh = b._new(value.name, value.tensor_type, SlotRole.VALUE)
            b.steps.append(Step(StepKind.CONSTANT, value.name, (), (outputs[i],), (fresh,),
                                (value.tensor_type,), aliases=False))
            outputs = outputs[:i] + (fresh,) + outputs[i + 1:]
    weight_slots = {inp.uid: b.slot_of[inp.uid] for inp in graph.inputs if inp.kind == "weight"}
    assigned = [(b.read(v), weight_slots[w.uid]) for w, v in graph.assigns]
    written = _write_weights_in_place(b.steps, groups, assigned, outputs)
    for weight, value in graph.assigns:
        target, source_slot = weight_slots[weight.uid], b.read(value)
        if source_slot in written:  # the kernel that computes it writes the weight's array
            continue
        b.steps.append(Step(StepKind.ASSIGN, f"assign {weight.name}", (), (source_slot, target), (),
                            (), overwrites=(target,), bytes_moved=2 * weight.tensor_type.nbytes))
    if workspace_bytes is not None:
        _add_workspaces(b, workspace_bytes, {target for _, target in assigned})
    if product_workspace is not None:
        _add_product_workspaces(b, product_workspace, {target for _, target in assigned})
    slots = tuple(b.slots)
    inputs = tuple(b.slot_of[i.uid] for i in graph.inputs if i.kind == "input")
    weights = tuple(weight_slots.values())
    keep = set(inputs) | set(weights) | set(outputs) | {b.read(v) for _, v in graph.assigns}
    release, buffer_of, buffers = plan_memory(slots, b.steps, keep)
    copy_out = _copies(slots, b.steps, outputs)
    plan = ExecutionPlan(name, slots, inputs, weights, outputs, graph.returns_tuple,
                         tuple(b.steps), tuple(release), tuple(buffers), buffer_of, copy_out,
                         symbol_bindings(slots, inputs))
    return plan, notes


def _add_workspaces(b: _PlanBuilder, workspace_bytes: Callable[[KernelSpec], int],
                    written: set[int]) -> None:
    """A WORKSPACE slot for each convolution kernel the backend keeps data for, read after
    the kernel's other reads and overwritten by it. Its contents are kept between calls when
    every source (the convolution's inputs after the image) is a constant or a weight that no
    step of this plan writes: a weight the plan assigns changes within the call (a training
    step), so its kernel recomputes them each call."""
    for i, step in enumerate(b.steps):
        spec = step.kernel
        if spec is None or spec.kind not in (KernelKind.WINDOW, KernelKind.CONV_BLOCK):
            continue
        conv = spec.block.conv if spec.block is not None else spec.node
        if get_op(conv.op).window is not Window.CONVOLUTION:
            continue
        nbytes = workspace_bytes(spec)
        if nbytes <= 0:
            continue
        sources = step.reads[1:len(conv.inputs)]
        kept = all(b.slots[s].role is SlotRole.CONSTANT or
                   b.slots[s].role is SlotRole.WEIGHT and s not in written for s in sources)
        slot = b._new(f"{step.name}.workspace", TensorType((nbytes,), np.dtype(np.uint8)),
                      SlotRole.WORKSPACE)
        b.slots[slot] = replace(b.slots[slot], workspace=Workspace(sources, kept))
        b.steps[i] = replace(step, reads=step.reads + (slot,),
                             overwrites=step.overwrites + (slot,),
                             kernel=replace(spec, workspace=True))


def _add_product_workspaces(b: _PlanBuilder,
                            product_workspace: Callable[[Sequence[Slot], Step], int],
                            written: set[int]) -> None:
    """A WORKSPACE slot `<product>.prepacked_B` for each matrix product the backend keeps B
    packed for, read after its two operands: only where B is a constant or a weight no step
    writes, so its contents are always kept (recomputed when the weight's version moves)."""
    for i, step in enumerate(b.steps):
        if step.kind is not StepKind.LIBRARY or step.op != "MatMul" or len(step.reads) != 2:
            continue
        source = b.slots[step.reads[1]]
        if not (source.role is SlotRole.CONSTANT or
                source.role is SlotRole.WEIGHT and source.index not in written):
            continue
        nbytes = product_workspace(b.slots, step)
        if nbytes <= 0:
            continue
        slot = b._new(f"{step.name}.prepacked_B", TensorType((nbytes,), np.dtype(np.uint8)),
                      SlotRole.WORKSPACE)
        b.slots[slot] = replace(b.slots[slot], workspace=Workspace((source.index,), True))
        b.steps[i] = replace(step, reads=step.reads + (slot,),
                             overwrites=step.overwrites + (slot,))


# step name -> (node, its group, its schedule)
_Groups = dict[int, tuple[Node, Graph, Schedule | ParallelSchedule]]


def _write_weights_in_place(steps: list[Step], groups: _Groups,
                            assigned: list[tuple[int, int]], outputs: tuple[int, ...]
                            ) -> set[int]:
    """Assigned values (an optimizer's new weight and moments) that the kernel computing them
    writes straight into the weight's own array, replacing its pooled result and the ASSIGN
    copy after the call (an MLP training step's Adam: six copies of 16 MiB, 14 ms of 97).

    Legal when the kernel reads the weight, if at all, only where it writes that element and
    before it does (`_reads_before_writes`), reads no view of it, and no later step reads the
    weight or a view of it (they would see the new value). The
    weight's slot is the memory: `assigned` holds (the value's slot, the weight's slot). Sets
    those kernel steps' `in_place`; returns the values' slots written so."""
    counts: dict[int, int] = {}
    for source, _ in assigned:
        counts[source] = counts.get(source, 0) + 1
    writer = {s: i for i, step in enumerate(steps) for s in step.writes}
    # each group's users (by id of its graph), listed once: one kernel writes many values
    users_of: dict[int, dict[int, list[Node]]] = {}
    done: set[int] = set()
    for source, target in assigned:
        i = writer.get(source)
        if i is None or i not in groups or counts[source] > 1 or \
                source in outputs or steps[i].sizes:  # dynamic: results shaped per call
            continue
        node, sub, sched = groups[i]
        views = _views_of(steps, target)
        # read after the kernel: by a later step, as a result, or by another weight's copy
        later = {r for step in steps[i + 1:] for r in step.reads} | set(outputs) | \
            {s for s, _ in assigned}
        if later & (views | {target}) or set(steps[i].reads) & views:
            continue
        k = steps[i].writes.index(source)
        weight_at = [p for p, v in enumerate(node.inputs) if steps[i].reads[p] == target]
        if not _reads_before_writes(sub, sched, k, weight_at, users_of):
            continue
        step = steps[i]
        steps[i] = replace(step, in_place=step.in_place + ((source, target),),
                           overwrites=step.overwrites + (target,))
        done.add(source)
    return done


def _views_of(steps: list[Step], slot: int) -> set[int]:
    """Slots whose arrays may share `slot`'s memory (results of steps that may return views)."""
    views: set[int] = set()
    for step in steps:
        if step.aliases and set(step.reads) & (views | {slot}):
            views |= set(step.writes)
    return views


def _reads_before_writes(sub: Graph, sched: Schedule | ParallelSchedule, k: int,
                         positions: list[int], users_of: dict[int, dict[int, list[Node]]]
                         ) -> bool:
    """Whether every read of the group's inputs at `positions` comes before the k-th result's
    store of the same element, the only one it reads: in one pointwise loop nest, the result
    and those inputs at the same element of the iteration space (no broadcast, no index map);
    in a column reduction (backends/c/c_reduce.py: blocks of kept columns, each summed, then its
    per-column results stored last), a per-column result and inputs indexed by the kept axes
    alone (a bias's Adam after its BiasAddGrad), or a full-size result and inputs that only
    the first pass reads, where it stores that result (a weight's Adam beside other groups'
    bias gradients: nothing computed from the weight reads or feeds a reduction). A parallel
    kernel of several loop nests is neither: another nest may read the input after the
    store. `users_of` keeps `sub.users()` by `id(sub)` for the group's other results."""
    if isinstance(sched, ParallelSchedule):
        return False
    space = tuple(sched.space)
    out = sub.outputs[k]
    if sched.is_reduction:
        live = [a for a, d in enumerate(space) if d != 1]
        if not live or live[-1] in sched.reduce_axes:
            return False  # a row reduction's passes: not analysed here
        if sched.is_outer(out):
            space = tuple(1 if a in sched.reduce_axes else d for a, d in enumerate(space))
        elif any(_meets_reduction(sub, sub.inputs[p]) for p in positions):
            return False
    if not isinstance(out, Node) or get_op(out.op).kind is not PatternKind.ELEMWISE or \
            tuple(sched.aligned.get(out.uid, ())) != space:
        return False
    mapped = set(sched.maps) | set(sched.concats) | set(sched.tiles)
    users = users_of.get(id(sub))
    if users is None:
        users = users_of[id(sub)] = sub.users()
    for p in positions:
        param = sub.inputs[p]
        if tuple(sched.aligned.get(param.uid, ())) != space or param.uid in mapped:
            return False
        if any(u.uid in mapped or get_op(u.op).kind is not PatternKind.ELEMWISE
               for u in users.get(param.uid, [])):
            return False
    return True


def _meets_reduction(sub: Graph, value: Value) -> bool:
    """Whether a node computed from `value` is a reduction or reads one (so a later pass or
    the epilogue computes it)."""
    reduced: set[int] = set()
    mine = {value.uid}
    for node in sub.nodes:
        read = {v.uid for v in node.inputs}
        if get_op(node.op).kind == PatternKind.REDUCE or read & reduced:
            reduced.add(node.uid)
        if read & mine:
            mine.add(node.uid)
    return bool(mine & reduced)


def _copies(slots: tuple[Slot, ...], steps: list[Step], outputs: tuple[int, ...]
            ) -> tuple[bool, ...]:
    """Which results are copied before they are returned: one that is an input, a weight or a
    constant, one returned twice, or one that may be a view of another value, unless that value
    is this call's own pooled result that nothing else returns (a network's last Reshape): a
    pooled array is taken again only when the pool holds its only reference, so the caller's
    view keeps its memory."""
    writer = {s: step for step in steps for s in step.writes}

    def root(s: int) -> int | None:
        """The value a chain of views starts from (None: a view of several values)."""
        while (step := writer.get(s)) is not None and step.aliases:
            if len(step.reads) != 1:
                return None
            s = step.reads[0]
        return s

    roots = [root(s) for s in outputs]
    copies = []
    for i, s in enumerate(outputs):
        step = writer.get(s)
        if slots[s].role is not SlotRole.VALUE or s in outputs[:i] or step is None:
            copies.append(True)
            continue
        r = roots[i]
        source = writer.get(r) if r is not None else None
        own = (r is not None and source is not None and source.pooled and
               slots[r].role is SlotRole.VALUE and r not in outputs and roots.count(r) == 1 and
               all(v != r for v, _ in source.in_place))
        copies.append(step.aliases and not own)
    return tuple(copies)
