"""Running a compiled graph: a list of steps over value slots, each step one kernel launch."""
from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.ir.graph import Constant, Graph, Node, Value
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import TensorType
from graphkernel.runtime.memory import BufferPool, Key


@dataclass
class KernelInfo:
    """One kernel one call launches."""

    name: str
    op_names: list[str]
    source: str | None
    backend: str  # "native" (generated C), "library" (numpy), "interpreted" (numpy, op by op)
    output: str
    bytes_moved: int = 0
    note: str = ""

    def __repr__(self) -> str:
        return f"<Kernel {self.name} [{self.backend}] {'+'.join(self.op_names)}>"


def run_reference_graph(graph: Graph, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Evaluate a (sub)graph op by op with the numpy references."""
    env: dict[int, Any] = {inp.uid: a for inp, a in zip(graph.inputs, arrays)}

    def get(v: Value) -> Any:
        return v.value if isinstance(v, Constant) else env[v.uid]

    for node in graph.nodes:
        args = [get(v) for v in node.inputs]
        if node.subgraph is not None:
            outs = run_reference_graph(node.subgraph, args)
            env[node.uid] = outs[0] if len(outs) == 1 and not isinstance(
                node.type, tuple) and len(node.subgraph.outputs) == 1 else tuple(outs)
        elif node.op == "GetItem":
            env[node.uid] = args[0][node.attrs["index"]]
        else:
            opdef = get_op(node.op)
            result = opdef.reference(*args, **{**opdef.attr_defaults, **node.attrs})
            if isinstance(node.type, TensorType):
                result = np.asarray(result)
                if result.dtype != node.dtype:
                    result = result.astype(node.dtype)
            env[node.uid] = result
    return [np.asarray(get(v)) for v in graph.outputs]


Step = Callable[[list[Any]], None]


@dataclass
class Executable:
    """A compiled graph. Calling it runs the graph; `.kernels` are the launches of one call."""

    name: str
    graph: Graph
    stages: dict[str, Graph]
    kernels: list[KernelInfo]
    steps: list[Step]
    slot_count: int
    input_slots: list[int]
    input_names: list[str]
    weight_slots: list[tuple[int, Any]]
    output_slots: list[int]
    returns_tuple: bool
    reasons: list[Any] = field(default_factory=list)
    # Per step, the slots to clear after it (runtime/memory.py release_plan); built with steps.
    release: list[tuple[int, ...]] = field(default_factory=list)
    buffer_pool: BufferPool | None = None  # the steps' output buffers
    prefaulting: Any = None  # the thread readying the first call's buffers, until it is joined
    compile_seconds: float = 0.0
    library_path: str | None = None
    from_cache: bool = False
    dump_files: list[str] = field(default_factory=list)
    stage_docs: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # The graph's compiled CPython entry (codegen/entry.py) and the constant arrays it takes
    # after the inputs and weights; None when some kernel is not generated C.
    entry: Any = None
    entry_constants: tuple[np.ndarray, ...] = ()

    # -- running ------------------------------------------------------------------------------
    def check_inputs(self, args: tuple[Any, ...]) -> list[np.ndarray]:
        if len(args) != len(self.input_slots):
            names = ", ".join(self.input_names)
            raise InputError(f"{self.name} takes {len(self.input_slots)} input(s) ({names}), got "
                             f"{len(args)}")
        arrays = []
        for arg, slot_name, inp in zip(args, self.input_names, self.graph.inputs):
            array = _as_array(arg, slot_name, self.name)
            expected = inp.tensor_type
            if tuple(array.shape) != expected.shape or array.dtype != expected.dtype:
                raise InputError(
                    f"{self.name} input {slot_name!r} is {array.dtype.name}{list(array.shape)} but "
                    f"this executable was compiled for {expected.dtype.name}"
                    f"{list(expected.shape)}; call the cell again to compile for the new "
                    "signature")
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)  # Fortran order, strided views
            arrays.append(array)
        return arrays

    def run_arrays(self, *args: Any) -> list[np.ndarray]:
        """Run on arrays (or Tensors); return the outputs as numpy arrays."""
        if self.entry is not None:
            weights = [p._array for _, p in self.weight_slots]
            out = self.entry(*args, *weights, *self.entry_constants)
            if out is not NotImplemented:
                return list(out) if type(out) is tuple else [out]
        arrays = self.check_inputs(args)
        if self.prefaulting is not None:  # its buffers are nearly ready: wait, not duplicate
            self.prefaulting.join()
            self.prefaulting = None
        slots: list[Any] = [None] * self.slot_count
        for slot, array in zip(self.input_slots, arrays):
            slots[slot] = array
        for slot, param in self.weight_slots:
            slots[slot] = param.asnumpy()
        for step, dead in zip(self.steps, self.release):
            step(slots)
            for s in dead:  # the value's last reader ran: its buffer may serve a later step
                slots[s] = None
        outs: list[np.ndarray] = []
        given = {id(a) for a in arrays} | {id(slots[s]) for s, _ in self.weight_slots}
        for s in self.output_slots:
            out = slots[s]
            # A result never aliases an input, a weight or another result.
            if id(out) in given or any(out is o for o in outs) or not out.flags.owndata:
                out = np.array(out)
            outs.append(out)
        return outs

    def profile_kernels(self, *args: Any, repeats: int = 20) -> list[float]:
        """Median seconds each of `.kernels` takes within one call, over `repeats` calls.

        Times the steps one by one for reports; run_arrays stays free of timing. Steps that
        launch no kernel (GetItem, constant outputs) are left out of every kernel's time.
        """
        arrays = self.check_inputs(args)
        marks = [getattr(step, "launches_kernel", False) for step in self.steps]
        if sum(marks) != len(self.kernels):
            raise RuntimeError(f"{self.name}: {sum(marks)} kernel steps for "
                               f"{len(self.kernels)} kernels")
        samples: list[list[float]] = [[] for _ in self.kernels]
        for _ in range(max(1, repeats)):
            slots: list[Any] = [None] * self.slot_count
            for slot, array in zip(self.input_slots, arrays):
                slots[slot] = array
            for slot, param in self.weight_slots:
                slots[slot] = param.asnumpy()
            index = 0
            for step, is_kernel, dead in zip(self.steps, marks, self.release):
                start = time.perf_counter()
                step(slots)
                elapsed = time.perf_counter() - start
                for s in dead:
                    slots[s] = None
                if is_kernel:
                    samples[index].append(elapsed)
                    index += 1
        return [statistics.median(s) for s in samples]

    def __call__(self, *args: Any) -> Any:
        from graphkernel.frontend.tensor import Tensor
        arrays = [a._array if type(a) is Tensor else a for a in args]
        if self.entry is not None:  # the fast path, spelled out: this is the per-call cost
            out = self.entry(*arrays, *[p._array for _, p in self.weight_slots],
                             *self.entry_constants)
            if out is not NotImplemented:
                if type(out) is tuple:
                    return tuple(Tensor._wrap(o) for o in out)
                return Tensor._wrap(out)
        outs = [Tensor._wrap(a) for a in self.run_arrays(*arrays)]
        if self.returns_tuple or len(outs) != 1:
            return tuple(outs)
        return outs[0]

    # -- introspection ---------------------------------------------------------------------------
    @property
    def kernel_count(self) -> int:
        return len(self.kernels)

    def summary(self) -> str:
        lines = [f"graph {self.name}: {len(self.kernels)} kernel(s) per call, compiled in "
                 f"{self.compile_seconds * 1000:.0f} ms"
                 + (" (kernels from cache)" if self.from_cache else "")]
        for i, k in enumerate(self.kernels):
            lines.append(f"  [{i}] {k.name:<40} {k.backend:<11} {k.output:<22} "
                         f"ops: {' '.join(k.op_names)}")
        if self.reasons:
            lines.append("ops kept apart:")
            for reason in self.reasons:
                lines.append(f"  {reason}")
        for warning in self.warnings:
            lines.append(f"warning: {warning}")
        lines.append("stages: " + ", ".join(self.stages))
        return "\n".join(lines)


def _as_array(arg: Any, name: str, graph: str) -> np.ndarray:
    from graphkernel.frontend.tensor import Tensor
    if isinstance(arg, Tensor):
        return arg.asnumpy()
    if isinstance(arg, np.ndarray):
        return arg
    raise InputError(f"{graph} input {name!r} must be a Tensor or a numpy array, got "
                     f"{type(arg).__name__}")


# -------------------------------------------------------------------------------------------
# Step builders

def mark_step(step: Any, in_slots: list[int | Constant] | list[int], out_slot: int,
              takes: list[Key] | None = None, aliases: bool = True) -> None:
    """What a step reads, writes, takes from the pool and whether its result may be a view of
    its inputs: the release plan and the first call's buffers come from these
    (runtime/memory.py)."""
    step.reads = tuple(s for s in in_slots if isinstance(s, int))
    step.writes = out_slot
    step.takes = takes or []
    step.aliases = aliases


def native_step(fn: Any, in_slots: list[int | Constant], out_slot: int,
                out_types: list[TensorType], const_arrays: list[np.ndarray], multi: bool,
                pool: BufferPool) -> Step:
    """Call one generated kernel: argv = inputs, constant arrays, outputs from the pool."""
    count = len(in_slots) + len(const_arrays) + len(out_types)
    argv_type = ctypes.c_void_p * count
    const_ptrs = [a.ctypes.data for a in const_arrays]
    fixed = {i: s.value.ctypes.data for i, s in enumerate(in_slots) if isinstance(s, Constant)}
    keep_alive = [s for s in in_slots if isinstance(s, Constant)]
    shapes = [(t.shape, t.dtype) for t in out_types]
    take = pool.take

    def step(slots: list[Any]) -> None:
        outs = [take(shape, dtype) for shape, dtype in shapes]
        # Kernels index dense C-order buffers; a library step may leave a view (BroadcastTo's
        # zero strides, Transpose), which is copied here (a no-op for contiguous arrays).
        dense = [None if i in fixed else np.ascontiguousarray(slots[s])  # type: ignore[index]
                 for i, s in enumerate(in_slots)]
        ptrs = [fixed[i] if a is None else a.ctypes.data for i, a in enumerate(dense)]
        fn(argv_type(*ptrs, *const_ptrs, *[o.ctypes.data for o in outs]))
        slots[out_slot] = tuple(outs) if multi else outs[0]
    step.keep_alive = (keep_alive, const_arrays)  # type: ignore[attr-defined]
    step.launches_kernel = True  # type: ignore[attr-defined]  # for profile_kernels
    mark_step(step, in_slots, out_slot, shapes, False)
    return step


def library_step(node: Node, in_slots: list[int | Constant], out_slot: int,
                 pool: BufferPool) -> Step:
    opdef = get_op(node.op)
    attrs = {**opdef.attr_defaults, **node.attrs}
    ref = opdef.reference
    dtype = node.dtype if isinstance(node.type, TensorType) else None
    if isinstance(node.type, TensorType) and all(v.dtype == node.dtype for v in node.inputs):
        if node.op in ("MatMul", "BatchMatMul"):
            return _matmul_step(node, in_slots, out_slot, pool, attrs)
        if isinstance(getattr(ref, "ufunc", None), np.ufunc):
            return _ufunc_step(ref.ufunc, node, in_slots, out_slot, pool)  # type: ignore

    def step(slots: list[Any]) -> None:
        args = [s.value if isinstance(s, Constant) else slots[s] for s in in_slots]
        result = ref(*args, **attrs)
        if dtype is not None:
            result = np.asarray(result)
            if result.dtype != dtype:
                result = result.astype(dtype)
        slots[out_slot] = result
    step.launches_kernel = True  # type: ignore[attr-defined]  # for profile_kernels
    mark_step(step, in_slots, out_slot)
    return step


def _ufunc_step(ufunc: np.ufunc, node: Node, in_slots: list[int | Constant], out_slot: int,
                pool: BufferPool) -> Step:
    """An elementwise numpy ufunc whose inputs all have the result's dtype, writing into a
    pooled buffer: the same loop numpy runs, without a fresh array per call."""
    shape, dtype = node.tensor_type.shape, node.dtype

    def step(slots: list[Any]) -> None:
        args = [s.value if isinstance(s, Constant) else slots[s] for s in in_slots]
        out = pool.take(shape, dtype)
        with np.errstate(all="ignore"):
            ufunc(*args, out=out)
        slots[out_slot] = out
    step.launches_kernel = True  # type: ignore[attr-defined]  # for profile_kernels
    mark_step(step, in_slots, out_slot, [(shape, dtype)], False)
    return step


def _matmul_step(node: Node, in_slots: list[int | Constant], out_slot: int, pool: BufferPool,
                 attrs: dict[str, Any]) -> Step:
    """numpy's matmul (BLAS), writing into a pooled buffer instead of a fresh array."""
    shape, dtype = node.tensor_type.shape, node.dtype
    swap_a, swap_b = attrs["transpose_a"], attrs["transpose_b"]

    def step(slots: list[Any]) -> None:
        a, b = (s.value if isinstance(s, Constant) else slots[s] for s in in_slots)
        if swap_a:
            a = np.swapaxes(a, -1, -2)
        if swap_b:
            b = np.swapaxes(b, -1, -2)
        out = pool.take(shape, dtype)
        with np.errstate(all="ignore"):  # NaN/Inf in, NaN/Inf out, as in the kernels
            np.matmul(a, b, out=out)
        slots[out_slot] = out
    step.launches_kernel = True  # type: ignore[attr-defined]  # for profile_kernels
    mark_step(step, in_slots, out_slot, [(shape, dtype)], False)
    return step


def interpreted_step(graph: Graph, in_slots: list[int | Constant], out_slot: int,
                     multi: bool) -> Step:
    def step(slots: list[Any]) -> None:
        args = [s.value if isinstance(s, Constant) else slots[s] for s in in_slots]
        outs = run_reference_graph(graph, args)
        slots[out_slot] = tuple(outs) if multi else outs[0]
    step.launches_kernel = True  # type: ignore[attr-defined]  # for profile_kernels
    mark_step(step, in_slots, out_slot)
    return step


def getitem_step(src: int, index: int, out_slot: int) -> Step:
    def step(slots: list[Any]) -> None:
        slots[out_slot] = slots[src][index]
    mark_step(step, [src], out_slot)
    return step

