"""What `graphkernel.compile` returns and a graph-mode Cell calls: the runtime's Executable
(plan + runner) with the cell's Parameters bound, Tensors in and out, and the compile report."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.dynamic import SizeRule, broken_rule
from graphkernel.frontend.guards import Guards
from graphkernel.frontend.location import user_location
from graphkernel.frontend.tensor import Parameter, Tensor
from graphkernel.ir.graph import Graph
from graphkernel.ir.types import TensorType
from graphkernel.passes.stage_names import FINAL
from graphkernel.runtime.executable import Executable, KernelInfo
from graphkernel.runtime.plan import ExecutionPlan


@dataclass
class CompileReport:
    """How a graph was compiled: the graph after every stage, why ops were kept apart, the
    files written, and how long it took."""

    # On a compile-cache hit the stages before the final one are computed when first read.
    stages: Mapping[str, Graph] = field(default_factory=dict)
    stage_docs: dict[str, str] = field(default_factory=dict)
    reasons: list[Any] = field(default_factory=list)
    rewrites: list[str] = field(default_factory=list)  # e.g. a BatchNorm folded into a conv
    dump_files: list[str] = field(default_factory=list)
    compile_seconds: float = 0.0
    recompiled_because: str | None = None  # the changed attribute (frontend/guards.py)
    # What the compile cache did (frontend/compile_cache.py): "hit: <entry>", "miss: <why>;
    # stored", "not used: <why>".
    compile_cache: str = ""
    # Where the compile's time went, in order: (phase, wall seconds). The phases add up to the
    # compile but for bookkeeping between them (see `compile_phases`).
    timeline: list[tuple[str, float]] = field(default_factory=list)


class CompiledCell:
    """A compiled graph. Calling it runs the graph on Tensors (or arrays) and returns Tensors;
    `.kernels` are the launches of one call, `.plan` the execution plan, `.report` the
    compile report."""

    def __init__(self, executable: Executable, params: Sequence[Parameter],
                 report: CompileReport, guards: Guards | None = None,
                 output_tree: Any = None) -> None:
        self.executable = executable
        # construct's nested tuples of outputs, as positions in the flat outputs (None: flat)
        self.output_tree = output_tree
        self.params = tuple(params)  # in the plan's weight order
        self.report = report
        # What it was built from besides its input types (none for a graph without a cell)
        self.guards = guards if guards is not None else Guards()
        runner = self._runner = executable.runner
        self._returns_tuple = executable.plan.returns_tuple
        # Data kept from a Parameter (a convolution's repacked weights) is current while its
        # version word holds; the Parameters this graph writes in place have moved after each
        # call (`written`: bumped by every path that runs it, a Cell's per-call one included).
        plan = executable.plan
        runner.bind_versions([p._version for p in self.params])
        written = set(plan.written_weights)  # a property that walks every step: once
        self.written = tuple(p for p, slot in zip(self.params, plan.weights) if slot in written)
        # What the compiled entry's `call` takes before the inputs: this cell's Parameters,
        # the graph's constants and the guards it checks (backends/c/c_entry.py).
        self._fixed: tuple[Any, ...] = ()
        module = runner.entry_module
        if module is not None:
            module.set_tensor_type(Tensor)
            self._fixed = (*self.params, *runner.entry_constants, self.guards.table)
        # Whether a Cell may call the entry straight (`fast_call`): not when the bare entry's
        # flat tuple must be nested first, nor when size rules are checked on each call.
        self._bare_calls = output_tree is None
        # The graph's user inputs' types (dynamic sizes as symbols).
        self.input_types: list[TensorType] = []
        # Rules on dynamic sizes (a Symbol's range, a Reshape's multiple: frontend/dynamic.py)
        # checked before each call, with the types that bind their symbols.
        self.size_rules: tuple[SizeRule, ...] = ()

    def check_sizes(self, types: list[TensorType], rules: Sequence[SizeRule]) -> None:
        """Check `rules` on every call: a call that breaks one is an InputError naming the
        input, the axis and the rule's origin. Cells then call through `__call__`, not the bare
        compiled entry (`fast_call`), which sees only the types."""
        self.input_types = list(types)
        self.size_rules = tuple(rules)
        self._bare_calls = False

    @property
    def fast_call(self) -> tuple[Any, tuple[Any, ...]] | None:
        """The compiled entry's `call` and its fixed arguments, for a Cell's per-call path:
        Tensors in, Tensors out, no Python in between. None when calls need this object."""
        call = self._runner.entry_call
        if call is None or not self._bare_calls:
            return None
        return call, self._fixed

    # -- running --------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        return self.call(args)

    def call(self, args: Sequence[Any], entry_declined: bool = False) -> Any:
        """One call on Tensors (or arrays): the one place a call meets the compiled entry.
        Its `call` is tried once; where it declines inputs that are all arrays it would have
        declined them as `run` too, so the Python runner runs them. `entry_declined`: the
        caller (a Cell's per-call path) already offered these inputs to the entry."""
        if self.output_tree is not None:
            return _nest(self.output_tree, self._call(args, entry_declined))
        return self._call(args, entry_declined)

    def _call(self, args: Sequence[Any], entry_declined: bool) -> Any:
        if self.size_rules and all(hasattr(a, "shape") for a in args):
            problem = broken_rule(self.name, self.input_types, args, self.size_rules)
            if problem is not None:
                raise InputError(problem, user_location())
        call = self._runner.entry_call
        if call is not None and not entry_declined:  # the per-call path: one C call
            out = call(self._fixed, *args)
            if out is not NotImplemented:
                for p in self.written:
                    p.bump_version()
                return out
        arrays = [a._array if isinstance(a, Tensor) else a for a in args]
        # Other inputs (numbers, lists) become arrays in the runtime's check: `run` may take
        # those, though `call` could not.
        offered = call is not None and all(isinstance(a, np.ndarray) for a in arrays)
        try:
            outs = [Tensor._wrap(a) for a in self.executable.run(
                _arrays(arrays), self._weights(), try_entry=not offered)]
        finally:  # a call that failed part way may have written some
            for p in self.written:
                p.bump_version()
        if self._returns_tuple or len(outs) != 1:
            return tuple(outs)
        return outs[0]

    def run_arrays(self, *args: Any) -> list[np.ndarray]:
        """Run on arrays (or Tensors); return the outputs as numpy arrays."""
        try:
            return self.executable.run(_arrays(args), self._weights())
        finally:
            for p in self.written:
                p.bump_version()

    def profile_kernels(self, *args: Any, repeats: int = 20) -> list[float]:
        """Median seconds each of `.kernels` takes within one call, over `repeats` calls."""
        try:
            return self.executable.profile(_arrays(args), self._weights(), repeats)
        finally:
            for p in self.written:
                p.bump_version()

    def _weights(self) -> list[np.ndarray]:
        # The live arrays (not asnumpy's read-only views): the plan may write them in place.
        return [p._array for p in self.params]  # type: ignore[misc]  # a Parameter has data

    # -- introspection --------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.executable.name

    @property
    def plan(self) -> ExecutionPlan:
        return self.executable.plan

    @property
    def kernels(self) -> list[KernelInfo]:
        return self.executable.kernels

    @property
    def kernel_count(self) -> int:
        return len(self.kernels)

    @property
    def graph(self) -> Graph:
        """The graph that runs (hwopt_d_end)."""
        return self.report.stages[FINAL]

    @property
    def stages(self) -> Mapping[str, Graph]:
        return self.report.stages

    @property
    def stage_docs(self) -> dict[str, str]:
        return self.report.stage_docs

    @property
    def reasons(self) -> list[Any]:
        return self.report.reasons

    @property
    def dump_files(self) -> list[str]:
        return self.report.dump_files

    @property
    def compile_seconds(self) -> float:
        return self.report.compile_seconds

    @property
    def warnings(self) -> list[str]:
        return self.executable.warnings

    @property
    def library_path(self) -> str | None:
        return self.executable.library_path

    @property
    def from_cache(self) -> bool:
        return self.executable.from_cache

    @property
    def entry(self) -> Any:
        """The compiled CPython entry running the whole graph, or None."""
        return self._runner.entry

    def summary(self, reasons: bool = True) -> str:
        """The kernels one call launches, the rewrites, and (with `reasons`, the default) why
        each pair of ops was kept apart; without, only how many pairs were."""
        kernels = self.kernels
        lines = [f"graph {self.name}: {len(kernels)} kernel(s) per call, compiled in "
                 f"{self.compile_seconds * 1000:.0f} ms"
                 + (" (kernels from cache)" if self.from_cache else "")]
        for i, k in enumerate(kernels):
            lines.append(f"  [{i}] {k.name:<40} {k.backend:<11} {k.output:<22} "
                         f"ops: {' '.join(k.op_names)}")
        if self.report.rewrites:
            lines.append("rewrites:")
            lines += [f"  {line}" for line in self.report.rewrites]
        if self.reasons and not reasons:
            lines.append(f"ops kept apart: {len(self.reasons)} pair(s), not listed here")
        elif self.reasons:
            lines.append("ops kept apart:")
            for reason in self.reasons:
                lines.append(f"  {reason}")
        if self.report.recompiled_because:
            lines.append(f"recompiled because {self.report.recompiled_because}")
        # the backend's decisions as it recorded them when it built this (backends/c:
        # c_entry_threads.py for `threads`)
        lines += [f"{topic}: {note}" for topic, note in self.executable.run_notes.items()]
        for warning in self.warnings:
            lines.append(f"warning: {warning}")
        lines.append("stages: " + ", ".join(self.stages))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<CompiledCell {self.name}: {len(self.kernels)} kernel(s)>"


def _arrays(args: Sequence[Any]) -> list[Any]:
    """Tensors as their arrays; anything else is left for the runtime's check, which names it."""
    return [arg.asnumpy() if isinstance(arg, Tensor) else arg for arg in args]


def _nest(tree: Any, flat: Sequence[Any]) -> Any:
    """The outputs in construct's nested tuples (`tree` holds their positions)."""
    if isinstance(tree, int):
        return flat[tree]
    return tuple(_nest(t, flat) for t in tree)
