"""The execution plan: a plain, typed description of one compiled graph's run.

Built once from the final graph (hwopt_d_end) by `runtime/builder.py`; after that nothing looks
at the graph again. The Python runner (`runtime/runner.py`) and the CPython entry emitter
(`backends/c/c_entry.py`) both read this plan and nothing else:

- values live in numbered **slots**: the call's inputs, the weights, constants (filled once),
  and the values steps produce;
- **steps** run in order; each reads and writes slots, and says what it is (a generated kernel,
  a library call, a view, a constant, an assignment into a weight);
- **memory** is decided here, once: each value a step writes into pooled memory gets a
  *buffer* id, and two values share one only when the first is dead (its last reader ran, and no
  live view or result still refers to it) before the second is written. `release[i]` lists the
  slots that die after step i. Both runners follow these ids and this release list;
- **in-place writes and aliasing** are fields, not habits: `Step.overwrites` names the read
  slots whose memory a step writes into (an ASSIGN writes into a weight's array), `Step.aliases`
  says its results may be views of what it reads, and `copy_out` says which results are copied
  so that a caller never holds memory that is also an input, a weight or another result;
- **workspace** a kernel keeps between calls (a convolution's repacked weights) is a slot too
  (`SlotRole.WORKSPACE`, its `Workspace` saying what it is computed from), owned by the runner
  and freed with it; the kernel reads it after its other reads and names it in `overwrites`.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from graphkernel.graph_kernel.lower import ConvBlock, KernelKind, Lowering
from graphkernel.ir.graph import Graph, Node
from graphkernel.ir.types import Dim, SymSize, TensorType, symbols_of


class StepKind(Enum):
    KERNEL = "kernel"  # one kernel the backend builds from its KernelSpec
    LIBRARY = "library"  # an op run by numpy (BLAS for MatMul, a ufunc, a reference)
    VIEW = "view"  # a shape op run by numpy: its result may share its input's memory
    INTERPRETED = "interpreted"  # a fused group run op by op on numpy (no compiler, no loop nest)
    CONSTANT = "constant"  # a constant result, copied fresh for every call
    ASSIGN = "assign"  # a value written into a weight's own array (Graph.assigns)


# Kinds that launch work a user would call a kernel (and reports time one by one).
LAUNCHES = frozenset({StepKind.KERNEL, StepKind.LIBRARY, StepKind.VIEW, StepKind.INTERPRETED})


class SlotRole(Enum):
    INPUT = "input"  # a call argument
    WEIGHT = "weight"  # a Parameter's array, passed by the frontend after the inputs
    CONSTANT = "constant"  # filled once, read-only
    VALUE = "value"  # written by a step
    WORKSPACE = "workspace"  # bytes one kernel keeps between calls (Workspace), runner-owned


# A workspace starts with a header of int64 words the runner and the kernel share:
# [0, 3) the version words (int64 *) of its sources, NULL where none is bound; [3, 6) the
# versions its contents were computed at; [6, 9) the sources' data pointers then; [9] nonzero
# once computed. The kernel's data follows at WORKSPACE_HEADER_BYTES (a vector's alignment).
WORKSPACE_HEADER_BYTES = 128
WORKSPACE_SOURCES = 3  # at most: a folded convolution's weight, BatchNorm scale and variance


@dataclass(frozen=True)
class Workspace:
    """What a WORKSPACE slot holds: a kernel's data computed from `sources` (slots: a
    convolution's weight, scale and variance, repacked). `kept`: the contents outlive a call,
    recomputed only when a source changes (each source a weight no step of this plan writes, or
    a constant); otherwise every call recomputes them. A kept source's change is seen through
    its version word (the frontend's Parameter bumps it on every write; `Runner.bind_versions`)
    and its data pointer; a weight with no version word bound is recomputed every call."""

    sources: tuple[int, ...]
    kept: bool


def kernel_identifier(text: str) -> str:
    """A kernel's name from any text: letters, digits and underscores only, with a prefix that
    keeps user names (a cell called `main` or `expf`) off library symbols."""
    return "gk_" + re.sub(r"[^A-Za-z0-9_]", "_", text)[:80]


def kernel_symbols(space: tuple[Dim, ...]) -> tuple[str, ...]:
    """The dynamic sizes a kernel over `space` reads, in argument order."""
    return tuple(symbols_of(space))


@dataclass(frozen=True)
class PlanSettings:
    """How a plan runs, whichever backend builds its kernels: library products' BLAS threads,
    kernels beside a threaded product, and buffers readied before the first call. Both backends
    run products on numpy's BLAS and buffers through the runner, so these are not one backend's
    (backends/c/config.py `CConfig.plan`; the numpy backend takes a PlanSettings as its config)."""

    # A matrix product with fewer multiply-adds per GEMM (m*n*k) than this runs BLAS on one
    # thread: waking BLAS's other threads between the kernels of a call costs more than they
    # save on a small product (a training step of a 32x64x256 MLP: 56 ms with numpy's default
    # OpenBLAS threads on a loaded 2-core machine, 1.4 ms on one). None: BLAS decides always.
    blas_parallel_min_mnk: int | None = 1 << 22
    # A kernel planned after a multi-threaded BLAS product of its call runs its parallel
    # regions on one thread where the machine has two cores (`KernelSpec.beside_blas`): BLAS's
    # idle workers spin on the other core meanwhile, and two threads ran no faster than one
    # (the MLP, encoder and BERT-tiny blocks 2-3% faster so).
    serial_beside_blas: bool = True
    # Allocate and touch the buffers of a graph's first call on a background thread while the
    # compile finishes: fresh pages cost ~2.5 us each to fault in on these VMs.
    prefault_buffers: bool = True


DEFAULT_PLAN_SETTINGS = PlanSettings()


@dataclass(frozen=True)
class KernelSpec:
    """A kernel as lowering chose it (graph_kernel/lower.py), for a backend to build: its
    name (unique in the plan), its kind, and what it computes. No backend's code is in it."""

    name: str
    kind: KernelKind
    node: Node  # the node whose results it writes (a conv block's last node)
    group: Graph | None = None  # LOOP_NEST, PARALLEL, SINGLE_OP: the group it computes
    schedule: Any = None  # the group's Schedule or ParallelSchedule
    block: ConvBlock | None = None  # CONV_BLOCK: its members
    # Its argv has a workspace (a WORKSPACE slot) after the reads its node makes.
    workspace: bool = False
    # It runs while a multi-threaded BLAS product's idle workers may spin (PlanSettings
    # .serial_beside_blas): a backend may keep it off threads.
    beside_blas: bool = False


@dataclass(frozen=True)
class Slot:
    index: int
    name: str
    type: TensorType
    role: SlotRole
    constant: np.ndarray | None = None  # CONSTANT slots: the array
    workspace: Workspace | None = None  # WORKSPACE slots: what it holds


@dataclass(frozen=True)
class Step:
    """One launch (or one bookkeeping action) of a call, reading and writing slots."""

    kind: StepKind
    name: str  # the node's name: kernels are known by it in reports
    op_names: tuple[str, ...]  # the basic ops it computes (provenance of a fused group)
    reads: tuple[int, ...]  # slots, in the callee's argument order
    writes: tuple[int, ...]  # one slot per result
    out_types: tuple[TensorType, ...]
    op: str = ""  # LIBRARY/VIEW: the op whose numpy reference (or ufunc, or BLAS) runs
    attrs: Mapping[str, Any] = field(default_factory=dict)
    kernel: KernelSpec | None = None  # KERNEL: argv = reads, then writes, then `sizes`
    sizes: tuple[str, ...] = ()  # KERNEL: its dynamic sizes, one int64_t * each (shape_args)
    subgraph: Graph | None = None  # INTERPRETED: the group run op by op
    pooled: bool = False  # its results are written into pooled buffers (see Slot buffers)
    aliases: bool = False  # a result may be a view of something it reads
    overwrites: tuple[int, ...] = ()  # read slots whose memory it writes into, in place
    # KERNEL: (result slot, weight slot) pairs whose result is written straight into the
    # weight's own array (an assigned value the kernel computes element by element; no ASSIGN)
    in_place: tuple[tuple[int, int], ...] = ()
    bytes_moved: int = 0  # bytes read and written, for reports
    # For reports, from the op table (runtime/flops.py): its floating-point operations (None:
    # unknown), and the parts of a training step it computes (ir/graph.py PHASES)
    flops: int | None = 0
    phases: tuple[str, ...] = ()
    note: str = ""  # why a group is INTERPRETED
    blas_threads: int | None = None  # MatMul: BLAS threads for this product (None: BLAS's own)
    lowering: Lowering | None = None  # the node's kernel kind and why (graph_kernel/lower.py)

    @property
    def launches_kernel(self) -> bool:
        return self.kind in LAUNCHES

    @property
    def backend(self) -> str:
        """What reports call it: native (generated C), library (numpy), interpreted."""
        if self.kind is StepKind.KERNEL:
            return "native"
        return "interpreted" if self.kind is StepKind.INTERPRETED else "library"


@dataclass(frozen=True)
class ExecutionPlan:
    name: str
    slots: tuple[Slot, ...]
    inputs: tuple[int, ...]  # user inputs, in call order
    weights: tuple[int, ...]  # weights, in the order the frontend passes their arrays
    outputs: tuple[int, ...]
    returns_tuple: bool
    steps: tuple[Step, ...]
    release: tuple[tuple[int, ...], ...]  # per step: slots dead after it
    buffers: tuple[tuple[tuple[int, ...], np.dtype], ...]  # buffer id -> (shape, dtype)
    buffer_of: Mapping[int, int]  # slot -> buffer id, for pooled results
    copy_out: tuple[bool, ...]  # per output: copied before it is returned
    # Dynamic sizes (ir.types.SymSize) as (name, input number, axis): where each is read from
    # in a call. Buffer shapes may hold them; kernels take them after their buffers.
    symbols: tuple[tuple[str, int, int], ...] = ()
    # Kernel name -> how the backend chose its schedule (a tuning record, measured, the
    # defaults and why), filled in by the backend once it has chosen
    schedule_notes: dict[str, str] = field(default_factory=dict)

    @property
    def input_names(self) -> list[str]:
        return [self.slots[s].name for s in self.inputs]

    def constant_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.role is SlotRole.CONSTANT]

    def workspace_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.role is SlotRole.WORKSPACE]

    def kernel_steps(self) -> list[Step]:
        return [s for s in self.steps if s.launches_kernel]

    @property
    def written_weights(self) -> tuple[int, ...]:
        """Slots of the weights a call writes into (ASSIGN steps, kernels' `in_place`)."""
        written = {step.reads[1] for step in self.steps if step.kind is StepKind.ASSIGN}
        written |= {w for step in self.steps for _, w in step.in_place}
        return tuple(w for w in self.weights if w in written)

    def describe(self) -> str:
        """The plan as text: steps with their slots, buffers and releases."""
        def name(slot: int) -> str:
            s = self.slots[slot]
            buffer = self.buffer_of.get(slot)
            return f"${slot}:{s.name}" + (f"@b{buffer}" if buffer is not None else "")
        sizes = ", ".join(f"{n} = input {i} axis {a}" for n, i, a in self.symbols)
        lines = [f"plan {self.name}" + (f" (dynamic sizes: {sizes})" if sizes else "") +
                 f": inputs {[name(s) for s in self.inputs]}, weights "
                 f"{[name(s) for s in self.weights]}"]
        for i, (step, dead) in enumerate(zip(self.steps, self.release)):
            flags = (" aliases" if step.aliases else "") + \
                (f" blas_threads={step.blas_threads}" if step.blas_threads else "") + \
                (f" blas={step.attrs['gemm_library']!r}" if "gemm_library" in step.attrs
                 else "") + \
                (f" overwrites {[name(s) for s in step.overwrites]}" if step.overwrites else "") + \
                "".join(f" ({name(v)} written into {name(w)})" for v, w in step.in_place)
            lines.append(f"  [{i}] {step.kind.value:<11} {step.name}: "
                         f"{', '.join(name(s) for s in step.reads)} -> "
                         f"{', '.join(name(s) for s in step.writes)}{flags}"
                         + (f"; free {[name(s) for s in dead]}" if dead else "")
                         + (f"  # {step.lowering}" if step.lowering is not None else ""))
            if step.kernel is not None and step.kernel.name in self.schedule_notes:
                lines.append(f"      schedule: {self.schedule_notes[step.kernel.name]}")
        lines.append(f"  return {[name(s) for s in self.outputs]}"
                     + (f", copied: {list(self.copy_out)}" if any(self.copy_out) else ""))
        return "\n".join(lines)


def entry_arguments(plan: ExecutionPlan) -> list[int]:
    """Slots a compiled entry of the whole plan takes, in order: inputs, weights, then the
    constants and workspaces the steps read (in order of first use)."""
    args = list(plan.inputs) + list(plan.weights)
    for step in plan.steps:
        for s in step.reads:
            if plan.slots[s].role in (SlotRole.CONSTANT, SlotRole.WORKSPACE) and s not in args:
                args.append(s)
    return args


def bytes_of(types: tuple[TensorType, ...]) -> int:
    """Bytes of these values (0 when one has a dynamic size: unknown until it runs)."""
    if not all(t.is_static for t in types):
        return 0
    return sum(math.prod(t.shape) * t.dtype.itemsize for t in types)


def symbol_bindings(slots: tuple[Slot, ...], inputs: tuple[int, ...]
                    ) -> tuple[tuple[str, int, int], ...]:
    """Each dynamic size of the inputs' types, with the first input and axis that holds it."""
    out: list[tuple[str, int, int]] = []
    for number, slot in enumerate(inputs):
        for axis, dim in enumerate(slots[slot].type.shape):
            if isinstance(dim, SymSize) and dim.names[0] not in [n for n, _, _ in out]:
                out.append((dim.names[0], number, axis))
    return tuple(out)


def plan_memory(slots: tuple[Slot, ...], steps: list[Step], keep: set[int]
                ) -> tuple[list[tuple[int, ...]], dict[int, int],
                           list[tuple[tuple[int, ...], np.dtype]]]:
    """The release list, and a buffer id for every pooled result.

    A value's buffers are its own (a pooled result) or, for a step that may return views, those
    of what it read. A buffer is free again once every slot holding it has died; a later pooled
    result of the same shape and dtype then takes it. `keep`: slots alive for the whole call
    (inputs, weights, results, assigned values)."""
    last: dict[int, int] = {}
    for index, step in enumerate(steps):
        for s in step.writes:
            last.setdefault(s, index)  # a value nobody reads dies where it is made
        for s in step.reads:
            last[s] = index
    release: list[list[int]] = [[] for _ in steps]
    for s, index in last.items():
        if s not in keep and slots[s].role is SlotRole.VALUE:
            release[index].append(s)
    buffer_of: dict[int, int] = {}
    buffers: list[tuple[tuple[int, ...], np.dtype]] = []
    free: dict[tuple[tuple[int, ...], np.dtype], list[int]] = {}
    holds: dict[int, set[int]] = {}  # slot -> buffers it keeps alive
    holders: dict[int, int] = {}  # buffer -> live slots holding it
    for step, dead in zip(steps, release):
        in_place = {v for v, _ in step.in_place}  # the weight's memory: no buffer
        for s, t in zip(step.writes, step.out_types):
            if step.pooled and s not in in_place:
                key = (t.shape, t.dtype)
                if free.get(key):
                    buffer = free[key].pop(0)
                else:
                    buffer = len(buffers)
                    buffers.append(key)
                buffer_of[s] = buffer
                mine = {buffer}
            elif step.aliases:
                mine = set().union(*(holds.get(r, set()) for r in step.reads))
            else:
                mine = set()
            holds[s] = mine
            for b in mine:
                holders[b] = holders.get(b, 0) + 1
        for s in dead:
            for b in holds.pop(s, set()):
                holders[b] -= 1
                if holders[b] == 0:
                    free.setdefault(buffers[b], []).append(b)
    return [tuple(sorted(r)) for r in release], buffer_of, buffers
