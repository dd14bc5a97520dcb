"""The plan's Python runner: one callable per step over a list of slots.

It reads the execution plan (runtime/plan.py) and nothing else: slots are filled with the call's
arrays, the weights' arrays and the constants; each step runs, writing its results into slots;
slots die as the plan's release list says, so a dead value's pooled buffer serves the later
result the plan gave it to. When the plan has a compiled CPython entry (backends/c/c_entry.py),
the executable tries it first (`entry` on arrays, `entry_call` on Tensors): it returns
NotImplemented for any argument it does not take as is, and the step loop runs instead.

The runner alone finishes the prefault (`finish_prefault`): until the first call its `entry` and
`entry_call` are wrappers that finish it and then bind the module's own functions, so no caller
checks for it on each call.
"""
from __future__ import annotations

import ctypes
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import numpy as np

from graphkernel.ir.opdefs.array import check_indices
from graphkernel.ir.opdefs.matmul import matmul_into
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import SymSize, concrete, concrete_attrs, is_static
from graphkernel.runtime.blas import blas_threads, find_in_background
from graphkernel.runtime.memory import VECTOR_ALIGNMENT, BufferPool
from graphkernel.runtime.plan import (
    WORKSPACE_HEADER_BYTES,
    WORKSPACE_SOURCES,
    ExecutionPlan,
    SlotRole,
    Step,
    StepKind,
    entry_arguments,
)
from graphkernel.runtime.reference import run_reference_graph

StepFn = Callable[[list[Any]], None]


class LoadedKernels(Protocol):
    """What a backend hands the runner once its kernels are built and loaded."""

    functions: dict[str, Any]  # kernel name -> a callable taking one argv pointer
    entry: Any  # a compiled `run` of the whole plan, or None
    entry_module: Any  # its module (`run`, `call`, `seed`), or None


class KeepAwake(Protocol):
    """A backend's bracket keeping its threads awake between the kernels of one call (each
    kernel's parallel region otherwise wakes sleeping workers): `begin()` before the steps,
    True when it did; `end()` before the last kernel (its threads then sleep after it)."""

    def begin(self) -> bool: ...

    def end(self) -> None: ...


class Runner:
    """Runs one plan. `load` binds its generated kernels once the library is built."""

    def __init__(self, plan: ExecutionPlan, prefault: bool = True) -> None:
        self.plan = plan
        self.pool = BufferPool([(shape, dtype) for shape, dtype in plan.buffers])
        # This call's dynamic sizes (plan.symbols order): kernels read them by pointer.
        self.sizes = np.zeros(max(len(plan.symbols), 1), np.int64)
        self.size_of: dict[str, int] = {}
        # The compiled CPython entry, when the plan has one: `run` (arrays in and out, then the
        # plan's weights and constants) and its module's `call` (Tensors in and out, after a
        # tuple of the fixed arguments). Each is the module's own function once the first call
        # finished the prefault, a wrapper that finishes it before that.
        self.entry: Any = None
        self.profiled_in_entry = False  # whether the last `profile` timed the entry's calls
        self.profiled_call_s = 0.0  # then the median of those calls, whole (seconds)
        self.entry_call: Any = None
        self.entry_constants: tuple[np.ndarray, ...] = ()
        self.entry_module: Any = None  # the entry's module (`run`, `call`, `seed`)
        self._entries: tuple[Any, Any] | None = None  # its own `run` and `call`
        self._template: list[Any] = [None] * len(plan.slots)
        for slot in plan.constant_slots():
            self._template[slot.index] = slot.constant
        # Workspaces (plan.Workspace): zeroed, so nothing counts as computed, and freed with
        # the runner. A constant source never changes: its version word is this one, fixed.
        self._constant_version = np.zeros(1, np.int64)
        self._version_words: list[np.ndarray | None] = [None] * len(plan.weights)
        for slot in plan.workspace_slots():
            (nbytes,) = slot.type.shape
            assert isinstance(nbytes, int)  # a workspace's size is a constant of its kernel
            self._template[slot.index] = _aligned_zeros(nbytes)
        self.bind_versions(self._version_words)
        self._functions: dict[str, Any] = {}
        self.step_fns: list[StepFn] = []
        # Set by the backend once its kernels are loaded (None: threads left as they are)
        self.keep_awake: KeepAwake | None = None
        kernels = [i for i, step in enumerate(plan.steps) if step.kind is StepKind.KERNEL]
        self._last_kernel = kernels[-1] if kernels else 0
        self.prefaulting: threading.Thread | None = None
        self._prefault_lock = threading.Lock()
        if not any(step.kind is StepKind.KERNEL for step in plan.steps):
            self._bind()  # no library to wait for
        if prefault:
            # Started before the library is built, so that the page faults overlap the compile.
            self.prefaulting = self.pool.prefault()
        if any(step.blas_threads is not None for step in plan.steps):
            find_in_background()  # likewise: its first product does not wait for the lookup

    def load(self, library: LoadedKernels) -> None:
        self._functions = library.functions
        self.entry_module = library.entry_module
        if library.entry is not None:
            self._entries = (library.entry, library.entry_module.call)
            self.entry, self.entry_call = self._run_first, self._call_first
            if self.prefaulting is None:
                self._bind_entry()
        if self.entry is not None:
            # constants (0-d stays 0-d) and this runner's workspaces
            self.entry_constants = tuple(
                np.asarray(self._template[s], order="C")
                for s in entry_arguments(self.plan)[len(self.plan.inputs) +
                                                    len(self.plan.weights):])
        self._bind()

    def bind_versions(self, words: Sequence[np.ndarray | None]) -> None:
        """The version word (an int64 array of one element that changes whenever the
        weight's values do) of each weight, in `plan.weights` order, None where there is none.
        Kept workspaces read from a weight with a word are recomputed only when it (or the
        weight's array) changes; from a weight without one, on every call."""
        assert len(words) == len(self.plan.weights)
        self._version_words = list(words)  # kept alive: the workspaces hold their addresses
        position = {slot: k for k, slot in enumerate(self.plan.weights)}
        for slot in self.plan.workspace_slots():
            assert slot.workspace is not None and \
                len(slot.workspace.sources) <= WORKSPACE_SOURCES
            header = self._template[slot.index][:WORKSPACE_HEADER_BYTES].view(np.int64)
            header[:] = 0  # recomputed on the next call
            if not slot.workspace.kept:
                continue
            for i, source in enumerate(slot.workspace.sources):
                if self.plan.slots[source].role is SlotRole.CONSTANT:
                    word: np.ndarray | None = self._constant_version
                else:
                    word = self._version_words[position[source]]
                header[i] = 0 if word is None else word.ctypes.data

    def _bind(self) -> None:
        self.step_fns = [self._step_fn(step) for step in self.plan.steps]

    def _bind_entry(self) -> None:
        """From now on callers call the entry's own functions: no Python in between."""
        if self._entries is not None:
            self.entry, self.entry_call = self._entries

    def _run_first(self, *args: Any) -> Any:
        self.finish_prefault()
        return self.entry(*args)

    def _call_first(self, *args: Any) -> Any:
        self.finish_prefault()
        return self.entry_call(*args)

    # -- running --------------------------------------------------------------------------
    def finish_prefault(self) -> None:
        """Stop the prefault thread where it is (the pages it faulted in stay ready; the
        kernels fault in the rest as they write, on all their threads) and hand its arrays to
        the compiled entry's own pool when there is an entry: each array then lives in one pool
        only."""
        with self._prefault_lock:
            thread = self.prefaulting
            if thread is None:
                return
            self.pool.stop_prefault()
            thread.join()
            module = self.entry_module
            if module is not None:
                for b, (shape, dtype) in enumerate(self.plan.buffers):
                    for array in self.pool.arrays(b):
                        if array.shape == tuple(shape) and array.dtype == dtype and \
                                module.seed(b, array):
                            self.pool.forget(b, array)
            self.prefaulting = None
            self._bind_entry()

    def run(self, arrays: Sequence[np.ndarray], weights: Sequence[np.ndarray]
            ) -> list[np.ndarray]:
        """Run on checked, C-contiguous input arrays and the weights' own arrays."""
        if self.prefaulting is not None:
            self.finish_prefault()
        plan = self.plan
        if plan.symbols:
            self.bind_sizes(arrays)
        slots = list(self._template)
        for s, array in zip(plan.inputs, arrays):
            slots[s] = array
        for s, array in zip(plan.weights, weights):
            slots[s] = array
        awake = self.keep_awake
        if awake is not None and awake.begin():
            last = self._last_kernel
            try:
                self._steps(slots, 0, last)
            finally:
                awake.end()  # before the last kernel: its threads sleep after it
            self._steps(slots, last, len(self.step_fns))
        else:
            self._steps(slots, 0, len(self.step_fns))
        return [np.array(slots[s]) if copy else slots[s]
                for s, copy in zip(plan.outputs, plan.copy_out)]

    def _steps(self, slots: list[Any], start: int, stop: int) -> None:
        """Steps `start` to `stop` (exclusive) of one call."""
        for fn, dead in zip(self.step_fns[start:stop], self.plan.release[start:stop]):
            fn(slots)
            for s in dead:  # the value's last reader ran: its buffer may serve a later step
                slots[s] = None

    def profile(self, arrays: Sequence[np.ndarray], weights: Sequence[np.ndarray],
                repeats: int) -> list[float]:
        """Median seconds of each launching step within a call, over `repeats` calls. The
        threads are kept awake between kernels as `run` keeps them (`keep_awake`), so a
        kernel is timed as it runs in a call: timed with its team asleep, each parallel
        kernel paid a wake-up that a call does not, and the tuner (backends/c/tuning.py)
        chose one thread for the small convolutions of the digits CNN, 9% slower a call.

        With the compiled entry loaded, its own calls are timed step by step
        (`_profile_entry`): the products then run on the kernels a call runs (the packed-B
        and row-vector ones), where the steps below run them on numpy's BLAS."""
        timed = self._profile_entry(arrays, weights, repeats)
        self.profiled_in_entry = timed is not None
        if timed is not None:
            return timed
        plan = self.plan
        if plan.symbols:
            self.bind_sizes(arrays)
        marks = [step.launches_kernel for step in plan.steps]
        samples: list[list[float]] = [[] for _ in range(sum(marks))]
        last = self._last_kernel
        for _ in range(max(1, repeats)):
            slots = list(self._template)
            for s, array in zip(plan.inputs, arrays):
                slots[s] = array
            for s, array in zip(plan.weights, weights):
                slots[s] = array
            index = 0
            awake = self.keep_awake
            if awake is not None and not awake.begin():
                awake = None  # begin declined: nothing to end
            try:
                for i, (fn, is_kernel, dead) in enumerate(
                        zip(self.step_fns, marks, plan.release)):
                    if awake is not None and i == last:
                        awake.end()  # before the last kernel, as `run`
                        awake = None
                    start = time.perf_counter()
                    fn(slots)
                    elapsed = time.perf_counter() - start
                    for s in dead:
                        slots[s] = None
                    if is_kernel:
                        samples[index].append(elapsed)
                        index += 1
            finally:
                if awake is not None:
                    awake.end()
        return [statistics.median(s) for s in samples]

    def _profile_entry(self, arrays: Sequence[np.ndarray], weights: Sequence[np.ndarray],
                       repeats: int) -> list[float] | None:
        """Median seconds of each launching step over `repeats` calls of the compiled entry,
        which writes each step's seconds into a vector (c_entry_text.py `profile_into`:
        the plan's steps but its ASSIGNs, in order); None without an entry, or when it
        declines these arrays (the steps then run here)."""
        if self.entry is None or self._entries is None:
            return None
        entry = self._entries[0]
        module: Any = getattr(entry, "__self__", None)  # `run`'s own module: its C runs
        if module is None or not hasattr(module, "profile_into"):
            return None
        self.finish_prefault()
        plan = self.plan
        programmed = [step for step in plan.steps if step.kind is not StepKind.ASSIGN]
        launching = [k for k, step in enumerate(programmed) if step.launches_kernel]
        seconds = np.full(len(programmed), np.nan)
        samples: list[np.ndarray] = []
        calls: list[float] = []
        module.profile_into(seconds)
        try:
            for _ in range(max(1, repeats)):
                seconds[:] = np.nan
                start = time.perf_counter()
                out = entry(*arrays, *weights, *self.entry_constants)
                calls.append(time.perf_counter() - start)
                if out is NotImplemented:
                    return None
                samples.append(seconds[launching].copy())
        finally:
            module.profile_into(None)
        self.profiled_call_s = statistics.median(calls)
        if any(np.isnan(s).any() for s in samples):  # a step the program did not time
            raise AssertionError(f"{plan.name}: the entry timed fewer steps than the plan has")
        return [float(v) for v in np.median(np.array(samples), axis=0)]

    def bind_sizes(self, arrays: Sequence[np.ndarray]) -> None:
        """Read this call's dynamic sizes from its (checked) input arrays."""
        plan = self.plan
        for j, (name, number, axis) in enumerate(plan.symbols):
            dim = plan.slots[plan.inputs[number]].type.shape[axis]
            coef = dim.coef if isinstance(dim, SymSize) else 1  # 2*N: N is half the size
            self.sizes[j] = self.size_of[name] = arrays[number].shape[axis] // coef

    # -- steps ----------------------------------------------------------------------------
    def _step_fn(self, step: Step) -> StepFn:
        kind = step.kind
        if kind is StepKind.KERNEL:
            return self._kernel_fn(step)
        if kind is StepKind.INTERPRETED:
            return _interpreted_fn(step, self.size_of)
        if kind is StepKind.CONSTANT:
            (source,), (target,) = step.reads, step.writes

            def constant(slots: list[Any]) -> None:
                slots[target] = np.array(slots[source])
            return constant
        if kind is StepKind.ASSIGN:
            return _assign_fn(step)
        return self._library_fn(step)

    def _take(self, step: Step) -> Callable[[], list[np.ndarray]]:
        take = self.pool.take
        buffers = [self.plan.buffer_of[s] for s in step.writes]
        if all(is_static(self.plan.buffers[b][0]) for b in buffers):
            return lambda: [take(b) for b in buffers]
        shaped, sizes = self.pool.take_shaped, self.size_of
        shapes = [self.plan.buffers[b][0] for b in buffers]
        return lambda: [shaped(b, concrete(shape, sizes)) for b, shape in zip(buffers, shapes)]

    def _kernel_fn(self, step: Step) -> StepFn:
        assert step.kernel is not None
        fn = self._functions[step.kernel.name]
        # The kernel's dynamic sizes follow its buffers: pointers into self.sizes.
        index = {name: j for j, (name, _, _) in enumerate(self.plan.symbols)}
        size_ptrs = [self.sizes.ctypes.data + 8 * index[n] for n in step.sizes]
        argv_type = ctypes.c_void_p * (len(step.reads) + len(step.writes) + len(size_ptrs))
        if step.in_place:
            return self._in_place_kernel_fn(step, fn, argv_type, size_ptrs)
        reads, writes, take = step.reads, step.writes, self._take(step)
        dense = np.ascontiguousarray

        def kernel(slots: list[Any]) -> None:
            outs = take()
            # Kernels index dense C-order buffers; a view step may leave a strided array
            # (BroadcastTo's zero strides, Transpose): copied here, a no-op when dense.
            ins = [dense(slots[s]) for s in reads]
            fn(argv_type(*[a.ctypes.data for a in ins], *[o.ctypes.data for o in outs],
                         *size_ptrs))
            for s, out in zip(writes, outs):
                slots[s] = out
        return kernel

    def _in_place_kernel_fn(self, step: Step, fn: Any, argv_type: Any, size_ptrs: list[int]
                            ) -> StepFn:
        """A kernel writing some results into weights' own arrays (`Step.in_place`). A weight
        array the kernel cannot index (not C-contiguous, aligned and writeable: the frontend's
        Parameters always are) gets a fresh result, copied in after the kernel."""
        into = dict(step.in_place)
        reads, writes = step.reads, step.writes
        take = self.pool.take
        pooled = {s: self.plan.buffer_of[s] for s in writes if s not in into}
        dense = np.ascontiguousarray

        def kernel(slots: list[Any]) -> None:
            outs, copies = [], []
            for s in writes:
                if s in pooled:
                    outs.append(take(pooled[s]))
                    continue
                weight = slots[into[s]]
                flags = weight.flags
                if flags.c_contiguous and flags.aligned and flags.writeable:
                    outs.append(weight)
                else:
                    outs.append(np.empty(weight.shape, weight.dtype))
                    copies.append((weight, outs[-1]))
            ins = [dense(slots[s]) for s in reads]
            fn(argv_type(*[a.ctypes.data for a in ins], *[o.ctypes.data for o in outs],
                         *size_ptrs))
            for weight, out in copies:
                np.copyto(weight, out)
            for s, out in zip(writes, outs):
                slots[s] = out
        return kernel

    def _matmul_fn(self, step: Step) -> StepFn:
        """BLAS through numpy, operands read and the result written through the strided views
        of folded layout ops (graph_kernel/library_views.py)."""
        reads, (target,), take = step.reads, step.writes, self._take(step)
        swaps = (step.attrs["transpose_a"], step.attrs["transpose_b"])
        read_views = dict(step.attrs.get("read_views", {}))
        write_view = step.attrs.get("write_view")
        threads = step.blas_threads

        def operand(slots: list[Any], k: int) -> np.ndarray:
            x = slots[reads[k]]
            if k in read_views:
                x = _strided(x, *read_views[k])
            return np.swapaxes(x, -1, -2) if swaps[k] else x

        def matmul(slots: list[Any]) -> None:
            a, b = operand(slots, 0), operand(slots, 1)
            (out,) = take()
            result = out if write_view is None else _strided(out, 0, *write_view)
            # NaN/Inf in, NaN/Inf out, as in kernels
            with np.errstate(all="ignore"), blas_threads(threads):
                matmul_into(a, b, out=result)
            slots[target] = out
        return matmul

    def _gather_fn(self, step: Step) -> StepFn:
        """Gather into a pooled buffer: its indices checked as the reference does, then rows
        taken straight into the buffer (mode "clip", or "wrap" where negative indices count
        from the end: checked, so nothing is clipped or wrapped twice, and no staging)."""
        (params, indices), (target,), take = step.reads, step.writes, self._take(step)
        axis = step.attrs["axis"] % self.plan.slots[params].type.rank
        negative = bool(step.attrs.get("negative_indices", False))
        mode: Literal["wrap", "clip"] = "wrap" if negative else "clip"

        def gather(slots: list[Any]) -> None:
            table, ids = slots[params], slots[indices]
            check_indices(ids, table.shape[axis], "Gather", axis, negative)
            (out,) = take()
            np.take(table, ids, axis=axis, out=out, mode=mode)
            slots[target] = out
        return gather

    def _range_like_fn(self, step: Step) -> StepFn:
        """RangeLike into a pooled buffer: each element its position along the axis."""
        (target,), take = step.writes, self._take(step)
        rank = self.plan.slots[target].type.rank
        axis = step.attrs["axis"] % rank

        def range_like(slots: list[Any]) -> None:
            (out,) = take()
            line = np.arange(out.shape[axis], dtype=out.dtype)
            out[...] = line.reshape((-1,) + (1,) * (rank - axis - 1))
            slots[target] = out
        return range_like

    def _library_fn(self, step: Step) -> StepFn:
        opdef = get_op(step.op)
        reads, writes, attrs = step.reads, step.writes, dict(step.attrs)
        if step.pooled:
            (target,), take = writes, self._take(step)
            if opdef.gemm:
                return self._matmul_fn(step)
            if step.op == "Gather":
                return self._gather_fn(step)
            if step.op == "RangeLike":
                return self._range_like_fn(step)
            ufunc = opdef.reference.ufunc  # type: ignore[attr-defined]  # an elementwise op's reference is a ufunc wrapper

            def elementwise(slots: list[Any]) -> None:
                (out,) = take()
                with np.errstate(all="ignore"):
                    ufunc(*[slots[s] for s in reads], out=out)
                slots[target] = out
            return elementwise
        reference = opdef.reference
        types = step.out_types
        sizes = self.size_of
        # Shapes holding dynamic sizes take this call's values.
        dynamic = any(isinstance(v, tuple) and not is_static(v) for v in attrs.values())

        def library(slots: list[Any]) -> None:
            result = reference(*[slots[s] for s in reads],
                               **(concrete_attrs(attrs, sizes) if dynamic else attrs))
            results = result if len(writes) > 1 else (result,)
            for s, value, t in zip(writes, results, types):
                value = np.asarray(value)
                slots[s] = value if value.dtype == t.dtype else value.astype(t.dtype)
        return library


def _aligned_zeros(nbytes: int) -> np.ndarray:
    """`nbytes` zero bytes starting on a VECTOR_ALIGNMENT boundary."""
    raw = np.zeros(nbytes + VECTOR_ALIGNMENT, np.uint8)  # calloc: pages fault in when used
    start = -raw.ctypes.data % VECTOR_ALIGNMENT
    return raw[start:start + nbytes]


def _strided(array: np.ndarray, offset: int, shape: tuple[int, ...],
             strides: tuple[int, ...]) -> np.ndarray:
    """A view of `array`'s dense memory at `offset + sum(i_k * strides_k)` (elements)."""
    dense = np.ascontiguousarray(array)  # a no-op for the kernels' and BLAS's results
    size = dense.itemsize
    return np.ndarray(shape, dense.dtype, buffer=dense.reshape(-1), offset=offset * size,
                      strides=tuple(s * size for s in strides))


def _interpreted_fn(step: Step, sizes: dict[str, int]) -> StepFn:
    """A group run op by op on numpy; `sizes` is the call's value of each dynamic size (the
    runner fills it in before the steps run), which the group's own inputs may not hold alone
    (a BroadcastTo or Reshape to `[N, ...]` inside a group whose inputs are `[16*N, ...]`)."""
    graph, reads, writes = step.subgraph, step.reads, step.writes
    assert graph is not None

    def interpreted(slots: list[Any]) -> None:
        outs = run_reference_graph(graph, [slots[s] for s in reads], sizes)
        for s, out in zip(writes, outs):
            slots[s] = out
    return interpreted


def _assign_fn(step: Step) -> StepFn:
    source, target = step.reads

    def assign(slots: list[Any]) -> None:
        np.copyto(slots[target], slots[source])  # into the weight's own array, in place
    return assign
