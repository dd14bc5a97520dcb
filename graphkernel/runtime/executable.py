"""A compiled graph, ready to run on arrays: its execution plan, the runner that follows it and
the library its kernels live in. Tensors, Parameters and the compile report are the frontend's
(frontend/compiled.py); this layer sees numpy arrays only."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from graphkernel.errors import InputError, ResourceError
from graphkernel.ir.types import shape_fits
from graphkernel.runtime import memory
from graphkernel.runtime.plan import ExecutionPlan
from graphkernel.runtime.runner import LoadedKernels, Runner


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
    flops: int | None = 0  # floating-point operations (runtime/flops.py; None: unknown)
    phases: tuple[str, ...] = ()  # the parts of a training step it computes (ir/graph.py)

    def __repr__(self) -> str:
        return f"<Kernel {self.name} [{self.backend}] {'+'.join(self.op_names)}>"


class BuiltKernels(LoadedKernels, Protocol):
    """A backend's built kernels: where they live and their whole source."""

    path: str
    from_cache: bool

    @property
    def source(self) -> str: ...


@dataclass
class Executable:
    """Plan + runner (+ the library). `run(arrays, weights)` runs one call."""

    plan: ExecutionPlan
    runner: Runner
    library: BuiltKernels | None = None
    warnings: list[str] = field(default_factory=list)
    # kernel name -> its source in the backend's language, for reports (none: the backend's
    # kernels have no source text); a backend may write it when first read
    kernel_sources: Mapping[str, str] = field(default_factory=dict)
    # What the backend decided, when it built this, about how a call runs as a whole, by topic
    # ("threads": the kernels' idle threads between kernels), for reports (summary() prints each)
    run_notes: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def kernels(self) -> list[KernelInfo]:
        out = []
        for step in self.plan.kernel_steps():
            output = ", ".join(str(t) for t in step.out_types)
            if len(step.out_types) != 1:
                output = f"({output})"
            out.append(KernelInfo(step.name, list(step.op_names),
                                  self.kernel_sources.get(step.kernel.name)
                                  if step.kernel is not None else None,
                                  step.backend, output, step.bytes_moved, step.note,
                                  step.flops, step.phases))
        return out

    @property
    def library_path(self) -> str | None:
        return self.library.path if self.library is not None else None

    @property
    def from_cache(self) -> bool:
        return self.library is not None and self.library.from_cache

    def check_inputs(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """The call's arrays as the kernels need them: the declared shape and dtype (native
        byte order), C-contiguous; anything else is a clear InputError."""
        plan = self.plan
        names = plan.input_names
        if len(arrays) != len(plan.inputs):
            raise InputError(f"{plan.name} takes {len(plan.inputs)} input(s) "
                             f"({', '.join(names)}), got {len(arrays)}")
        out = []
        sizes: dict[str, int] = {}  # dynamic sizes bound by earlier inputs
        for array, name, slot in zip(arrays, names, plan.inputs):
            if not isinstance(array, np.ndarray):
                raise InputError(f"{plan.name} input {name!r} must be a Tensor or a numpy "
                                 f"array, got {type(array).__name__}")
            expected = plan.slots[slot].type
            if not array.dtype.isnative and array.dtype.newbyteorder("=") == expected.dtype:
                array = array.astype(expected.dtype)  # byte-swapped: the kernels read native
            if array.dtype == np.bool_ and array.size and array.view(np.uint8).max() > 1:
                array = array.view(np.uint8) != 0  # bytes other than 0/1: numpy's truth value
            if not shape_fits(array.shape, expected.shape, sizes) or array.dtype != expected.dtype:
                raise InputError(
                    f"{plan.name} input {name!r} is {array.dtype.name}{list(array.shape)} but "
                    f"this executable was compiled for {expected.dtype.name}"
                    f"{list(expected.shape)}; call the cell again to compile for the new "
                    "signature")
            if not array.flags.c_contiguous:
                array = self._dense_copy(array, name)  # Fortran order, strided views
            out.append(array)
        return out

    def _dense_copy(self, array: np.ndarray, name: str) -> np.ndarray:
        """A C-contiguous copy of an input. A view may hold far fewer bytes than its shape
        (np.broadcast_to's zero strides): its copy is refused before allocating when it
        cannot fit, as a compile refuses a static input that large."""
        need = array.size * array.itemsize
        have = memory.physical_memory()
        problem = (f"{self.plan.name} input {name!r} is a {array.dtype.name}"
                   f"{list(array.shape)} view (strides {list(array.strides)}) that the "
                   f"kernels need as a dense array of {memory.format_bytes(need)}")
        if have and need > have:
            raise ResourceError(f"{problem}, more than this machine's memory "
                                f"({memory.format_bytes(have)}); pass fewer rows")
        try:
            return np.ascontiguousarray(array)
        except MemoryError:
            raise ResourceError(f"{problem}, and that much memory could not be allocated; "
                                "pass fewer rows") from None

    def run(self, arrays: Sequence[Any], weights: Sequence[np.ndarray],
            try_entry: bool = True) -> list[np.ndarray]:
        """One call: the compiled entry when it takes these arrays as they are, else the
        Python runner on checked arrays. `try_entry` False: the caller offered the entry these
        arrays already (frontend/compiled.py), and it declined them."""
        runner = self.runner
        if try_entry and runner.entry is not None:
            out = runner.entry(*arrays, *weights, *runner.entry_constants)
            if out is not NotImplemented:
                return list(out) if type(out) is tuple else [out]
        return runner.run(self._unaliased(self.check_inputs(arrays), weights), weights)

    def profile(self, arrays: Sequence[Any], weights: Sequence[np.ndarray],
                repeats: int = 20) -> list[float]:
        """Median seconds each kernel takes within one call (steps timed one by one)."""
        return self.runner.profile(self._unaliased(self.check_inputs(arrays), weights), weights,
                                   repeats)

    def _unaliased(self, arrays: list[np.ndarray], weights: Sequence[np.ndarray]
                   ) -> list[np.ndarray]:
        """The inputs, each that may share memory with a weight the call writes copied: the
        plan reads inputs as values, so a write into the weight (an optimizer's update, in
        place within a kernel or after the call) must not change an input a later step reads
        (`Tensor(w.asnumpy())` is the weight's own array). Memory bounds only: cheap. The
        compiled entry refuses such inputs and hands them here (backends/c/c_entry.py)."""
        plan = self.plan
        written = plan.written_weights
        if not written:
            return arrays
        position = {slot: i for i, slot in enumerate(plan.weights)}
        targets = [weights[position[w]] for w in written]
        return [np.array(a) if any(np.may_share_memory(a, w) for w in targets) else a
                for a in arrays]
