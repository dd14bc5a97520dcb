"""From the final graph (hwopt_d_end) to an Executable: generate and compile the kernels of the
fused groups, and bind every node to a step."""
from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from graphkernel.codegen import toolchain
from graphkernel.codegen.c_emitter import KernelSource, emit_kernel
from graphkernel.codegen.c_text import c_identifier
from graphkernel.codegen.entry import EntryCall, EntryPlan, EntryValue
from graphkernel.codegen.library import build_library
from graphkernel.graph_kernel.cost_model import DEFAULT_COST_MODEL, CostModel
from graphkernel.graph_kernel.schedule import NotSchedulable, analyze
from graphkernel.ir.graph import Constant, Graph, Node, Value
from graphkernel.ir.types import TensorType, TupleType
from graphkernel.passes.manager import Dumper
from graphkernel.runtime.executable import (
    Executable,
    KernelInfo,
    Step,
    getitem_step,
    interpreted_step,
    library_step,
    mark_step,
    native_step,
)
from graphkernel.runtime.memory import (
    BufferPool,
    first_call_buffers,
    release_plan,
)

_warned_no_compiler = False


def _flat_op_names(graph: Graph) -> list[str]:
    names: list[str] = []
    for node in graph.nodes:
        if node.subgraph is not None:
            names += _flat_op_names(node.subgraph)
        elif node.op != "GetItem":
            names.append(node.op)
    return names


def _bytes(values: list[Value], out_type: Any) -> int:
    total = sum(v.tensor_type.nbytes for v in values if isinstance(v.type, TensorType) and
                not (isinstance(v, Constant) and v.is_scalar))
    outs = out_type.items if isinstance(out_type, TupleType) else (out_type,)
    return total + sum(t.nbytes for t in outs)


def build_executable(graph: Graph, name: str, kernel_dir: str | None,
                     cost: CostModel = DEFAULT_COST_MODEL) -> Executable:
    """Bind each node of `graph` to a step; composites become generated C kernels."""
    global _warned_no_compiler
    slot_of: dict[int, int] = {}

    def slot(value: Value) -> int:
        if value.uid not in slot_of:
            slot_of[value.uid] = len(slot_of)
        return slot_of[value.uid]

    input_slots = [slot(i) for i in graph.inputs if i.kind == "input"]
    input_names = [i.name for i in graph.inputs if i.kind == "input"]
    weight_slots = [(slot(i), i.binding) for i in graph.inputs if i.kind == "weight"]
    # A graph's user inputs come first in graph.inputs order, weights after; keep inputs aligned.
    graph_inputs = [i for i in graph.inputs if i.kind == "input"]

    tc = toolchain.detect()
    if tc is None and not _warned_no_compiler:
        warnings.warn("graphkernel: no C compiler found (set CC or install gcc); fused kernels "
                      "run op by op on numpy, correct but slow. `graphkernel doctor` says more.",
                      RuntimeWarning, stacklevel=3)
        _warned_no_compiler = True

    sources: list[KernelSource] = []
    pending: list[tuple[int, Node, KernelSource, list[Value], list[np.ndarray]]] = []
    steps: list[Step] = []
    kernels: list[KernelInfo] = []
    used_names: set[str] = set()
    exe_warnings: list[str] = []

    pool = BufferPool()  # output buffers shared by every step of this executable

    def operand(v: Value) -> int | Constant:
        return v if isinstance(v, Constant) else slot(v)  # type: ignore[return-value]

    for node in graph.nodes:
        out_slot = slot(node)
        if node.op == "GetItem":
            steps.append(getitem_step(slot(node.inputs[0]), node.attrs["index"], out_slot))
            continue
        output_text = str(node.type)
        moved = _bytes(node.inputs, node.type)
        if node.subgraph is None:
            steps.append(library_step(node, [operand(v) for v in node.inputs], out_slot, pool))
            kernels.append(KernelInfo(node.name, [node.op], None, "library", output_text, moved))
            continue
        sub = node.subgraph
        op_names = _flat_op_names(sub)
        multi = isinstance(node.type, TupleType)
        reason = None
        if tc is None:
            reason = "no C compiler"
        else:
            try:
                sched = analyze(sub.nodes, sub.outputs)
            except NotSchedulable as exc:
                reason = str(exc)
        if reason is not None:
            steps.append(interpreted_step(sub, [operand(v) for v in node.inputs], out_slot, multi))
            kernels.append(KernelInfo(node.name, op_names, None, "interpreted", output_text,
                                      moved, note=reason))
            if tc is not None:
                exe_warnings.append(f"{node.name} runs op by op on numpy: {reason}")
            continue
        cname = c_identifier(node.name)
        while cname in used_names:
            cname += "_"
        used_names.add(cname)
        src = emit_kernel(sub, cname, sched, cost.parallel_threshold, cost.stream_min_bytes)
        consts = [c.value for c in sub.constants() if not c.is_scalar]
        consts = [np.ascontiguousarray(c) for c in consts]
        sources.append(src)
        pending.append((len(steps), node, src, node.inputs, consts))
        steps.append(_placeholder([operand(v) for v in node.inputs], out_slot, node))
        kernels.append(KernelInfo(node.name, op_names, src.source, "native", output_text, moved))

    library_path, from_cache = None, False
    entry_plan, entry_tail = _entry_plan(graph, pending, len(pending) == len(kernels))
    entry = None
    output_slots = [slot(v) for v in graph.outputs]
    constant_steps = _constant_outputs(graph, slot)
    keep = set(input_slots) | {s for s, _ in weight_slots} | set(output_slots)
    planned = constant_steps + steps  # native kernels still placeholders that know their memory
    reads, writes = [s.reads for s in planned], [s.writes for s in planned]  # type: ignore
    release = release_plan(reads, writes, keep)
    prefaulting = None
    if entry_plan is None and cost.prefault_buffers:  # the C entry keeps buffers of its own
        # Started before the library is loaded, so that the faults overlap the rest of compile.
        prefaulting = pool.prefault(first_call_buffers(
            [s.takes for s in planned], reads, writes,  # type: ignore[attr-defined]
            [s.aliases for s in planned], release))  # type: ignore[attr-defined]
    if sources:
        built = build_library(sources, entry_plan)
        entry = built.entry
        library_path, from_cache = built.path, built.from_cache
        if kernel_dir is not None:
            _write_kernel_sources(kernel_dir, name, built.source)
        for index, node, src, inputs, consts in pending:
            out_types = [o.tensor_type for o in node.subgraph.outputs]  # type: ignore[union-attr]
            steps[index] = native_step(built.functions[src.name], [operand(v) for v in inputs],
                                       slot(node), out_types, consts,
                                       isinstance(node.type, TupleType), pool)
    assert len(graph_inputs) == len(input_slots)
    all_steps = constant_steps + steps
    return Executable(
        name=name, graph=graph, stages={}, kernels=kernels, release=release, buffer_pool=pool,
        prefaulting=prefaulting,
        steps=all_steps, slot_count=len(slot_of),
        input_slots=input_slots, input_names=input_names, weight_slots=weight_slots,
        output_slots=output_slots, returns_tuple=graph.returns_tuple,
        library_path=library_path, from_cache=from_cache, warnings=exe_warnings,
        entry=entry, entry_constants=entry_tail,
    )


def _placeholder(in_slots: list[Any], out_slot: int, node: Node) -> Step:
    """Stands for a native kernel's step until its library is loaded; knows its memory."""
    def step(slots: list[Any]) -> None:
        raise AssertionError("the kernel's library was never loaded")
    takes = [(o.tensor_type.shape, o.dtype) for o in node.subgraph.outputs]  # type: ignore
    mark_step(step, in_slots, out_slot, takes, aliases=False)
    return step


def _entry_plan(graph: Graph, pending: list[Any], all_native: bool
                ) -> tuple[EntryPlan | None, tuple[np.ndarray, ...]]:
    """The plan of the graph's CPython entry: only when every kernel is generated C and every
    output comes from a kernel (the common fused case)."""
    if not pending or not all_native:
        return None, ()
    args: list[EntryValue] = []
    ids: dict[Any, int] = {}
    for inp in graph.inputs:  # user inputs, then weights, in call order
        ids[inp.uid] = len(args)
        args.append(EntryValue(inp.dtype.num, inp.shape))
    tail: list[np.ndarray] = []
    for _, _node, _, inputs, consts in pending:
        for value in inputs:
            if isinstance(value, Constant) and value.uid not in ids:
                ids[value.uid] = len(args)
                args.append(EntryValue(value.dtype.num, value.shape))
                tail.append(np.ascontiguousarray(value.value))
        for const in consts:
            if id(const) not in ids:
                ids[id(const)] = len(args)
                args.append(EntryValue(const.dtype.num, tuple(const.shape)))
                tail.append(const)
    plan = EntryPlan(args, returns_tuple=graph.returns_tuple)
    next_id = len(args)
    getitems = {n.uid: n for n in graph.nodes if n.op == "GetItem"}
    for _, node, src, inputs, consts in pending:
        outs = node.subgraph.outputs
        out_ids = []
        for i, out in enumerate(outs):
            plan.values[next_id] = EntryValue(out.dtype.num, out.shape)
            ids[(node.uid, i)] = next_id
            if len(outs) == 1:
                ids[node.uid] = next_id
            out_ids.append(next_id)
            next_id += 1
        for getter in getitems.values():
            if getter.inputs[0] is node:
                ids[getter.uid] = ids[(node.uid, getter.attrs["index"])]
        operands = [ids[v.uid] for v in inputs] + [ids[id(c)] for c in consts]
        plan.calls.append(EntryCall(src.name, operands, out_ids))
    for value in graph.outputs:
        if value.uid not in ids or ids[value.uid] < len(args):
            return None, ()  # an output that is an input or a constant: the Python path
        plan.results.append(ids[value.uid])
    if len(set(plan.results)) != len(plan.results):
        return None, ()  # the same buffer returned twice must not alias: the Python path
    return plan, tuple(tail)


def _constant_outputs(graph: Graph, slot: Any) -> list[Step]:
    steps: list[Step] = []
    for v in graph.outputs:
        if isinstance(v, Constant):
            s = slot(v)
            value = v.value

            def step(slots: list[Any], s: int = s, value: np.ndarray = value) -> None:
                slots[s] = np.array(value)
            mark_step(step, [], s)
            steps.append(step)
    return steps


def kernel_source_name(graph_name: str) -> str:
    """Where a graph's kernel source goes in the dump folder (relative path)."""
    return os.path.join("kernel_meta", f"{c_identifier(graph_name)}.c")


def _write_kernel_sources(folder: str, graph_name: str, source: str) -> None:
    # Through the Dumper: it never replaces a file it did not write.
    Dumper(folder).write_text(kernel_source_name(graph_name), source)

