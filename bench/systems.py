"""What a system looks like to the harness, and the systems that need nothing but numpy:
graphkernel (fusion on, fusion off), numpy eager and numexpr.

A system `prepare`s a workload (compiles it, converts the inputs to its own tensors) and hands
back runners: one per way of calling it ("fresh": a new output per call, as a user gets it;
"preallocated": the result written into an output allocated once, where the system offers
that). A runner runs one call on input set i for the correctness check, and times k calls.
"""
from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.workloads import ELEMENTWISE_KINDS, TRAIN_KINDS, Workload, numpy_fn

FRESH, PREALLOCATED = "fresh", "preallocated"


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class Runner:
    """One way of calling one prepared workload."""

    def __init__(self, system: str, mode: str, call: Callable[[int], Any],
                 to_numpy: Callable[[Any], np.ndarray] = np.asarray, n_sets: int = 1) -> None:
        self.system, self.mode = system, mode
        self._call, self._to_numpy, self.n_sets = call, to_numpy, n_sets

    def run_once(self, i: int = 0) -> np.ndarray:
        return self._to_numpy(self._call(i % self.n_sets))

    def time(self, k: int, start: int) -> float:
        """Seconds for k calls, rotating through the input sets from `start`."""
        call, n = self._call, self.n_sets
        indices = [(start + j) % n for j in range(k)]
        t0 = time.perf_counter()
        for i in indices:
            call(i)
        return time.perf_counter() - t0

    def close(self) -> None:
        pass


@dataclass
class Prepared:
    runners: list[Runner]
    info: dict[str, Any] = field(default_factory=dict)


class System:
    key = ""
    label = ""
    kind = "peer"  # "graphkernel", "baseline" (numpy), "peer"
    dists: tuple[str, ...] = ()

    def probe(self) -> str | None:
        """None when usable here, else why not (shown as a note)."""
        return None

    def preload(self) -> None:
        """Import what a user imports before compiling (kept out of compile-time probes)."""

    def versions(self) -> dict[str, str | None]:
        return {d: version_of(d) for d in self.dists}

    def threads(self) -> dict[str, Any]:
        return {}

    def supports(self, w: Workload) -> str | None:
        return None

    def prepare(self, w: Workload, sets: list[dict[str, np.ndarray]],
                params: dict[str, np.ndarray], seeds: list[int]) -> Prepared:
        raise NotImplementedError

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# graphkernel

class GraphKernel(System):
    kind = "graphkernel"
    dists = ("graphkernel",)

    def __init__(self, fused: bool, generic: bool = False) -> None:
        self.fused, self.generic = fused, generic
        self.key = "gk_generic" if generic else "gk_fused" if fused else "gk_unfused"
        self.label = "graphkernel shape-generic" if generic else \
            "graphkernel fused" if fused else "graphkernel unfused"

    def supports(self, w: Workload) -> str | None:
        if self.generic and w.kind in GENERIC_SKIPS:
            return GENERIC_SKIPS[w.kind]
        if self.generic and w.kind in TRAIN_KINDS:
            return "the training step is measured with static shapes only"
        return None

    def preload(self) -> None:
        import bench.gk_cells  # noqa: F401  (imports graphkernel, its nn and ops)
        import graphkernel.graph_kernel.pipeline  # noqa: F401

    def prepare(self, w: Workload, sets: list[dict[str, np.ndarray]],
                params: dict[str, np.ndarray], seeds: list[int]) -> Prepared:
        import graphkernel
        from bench.gk_cells import make_cell
        from graphkernel.graph_kernel.pipeline import CompileOptions

        if w.kind in TRAIN_KINDS:
            from bench.training import prepare_graphkernel
            call, to_numpy, info = prepare_graphkernel(self.key, self.fused, w, sets, params)
            return Prepared([Runner(self.key, FRESH, call, to_numpy, len(sets))], info)
        cell = make_cell(w, params)
        arrays = [list(s.values()) for s in sets]
        t0 = time.perf_counter()
        types = generic_types(w, arrays[0]) if self.generic else None
        exe = graphkernel.compile(cell, *arrays[0], types=types,
                                  options=CompileOptions(enable_graph_kernel=self.fused))
        compile_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        exe.run_arrays(*arrays[0])
        first_call = time.perf_counter() - t0
        # Timed the way users call: fused, `net(Tensor(x))` in graph mode with fusion on (no
        # other system changes the context); unfused and shape-generic, the compiled graph
        # called on Tensors, as `graphkernel.compile` returns it (the rounds interleave systems,
        # so the context cannot hold both settings).
        target: Any = exe
        if self.fused and types is None:
            graphkernel.context.set_context(mode=graphkernel.context.GRAPH_MODE,
                                            device_target="CPU", enable_graph_kernel=True)
            target = cell
        tensor = graphkernel.Tensor

        def fresh(i: int) -> Any:
            return target(*map(tensor, arrays[i]))

        def to_numpy(out: Any) -> np.ndarray:
            return (out[0] if isinstance(out, tuple) else out).asnumpy()

        runners = [Runner(self.key, FRESH, fresh, to_numpy, n_sets=len(sets))]
        kernels = [{"name": k.name, "backend": k.backend, "ops": list(k.op_names)}
                   for k in exe.kernels]
        backends: dict[str, int] = {}
        for k in exe.kernels:
            backends[k.backend] = backends.get(k.backend, 0) + 1
        info = {"compile_s": compile_wall, "first_call_s": first_call,
                "compile_seconds_reported": exe.compile_seconds, "from_cache": exe.from_cache,
                "compile_cache": exe.report.compile_cache.split(":")[0],  # hit, miss, ...
                "kernel_count": len(exe.kernels), "backends": backends,
                "warnings": list(exe.warnings),
                "timed_call": "net(Tensor(x))" if target is cell else "compiled(Tensor(x))"}
        if types is not None:
            info["input_types"] = [str(t) for t in types]
        if len(kernels) <= 40:
            info["kernels"] = kernels
        return Prepared(runners, info)


# ---------------------------------------------------------------------------------------------
# numpy eager

class NumpyEager(System):
    key, label, kind = "numpy", "numpy eager", "baseline"
    dists = ("numpy",)

    def supports(self, w: Workload) -> str | None:
        if w.kind in TRAIN_KINDS:
            return "numpy has no automatic differentiation"
        return None

    def prepare(self, w: Workload, sets: list[dict[str, np.ndarray]],
                params: dict[str, np.ndarray], seeds: list[int]) -> Prepared:
        fn = numpy_fn(w, params)
        arrays = [list(s.values()) for s in sets]
        out = np.empty(w.output_shape(), np.float32)
        out.fill(0)  # touch the pages once, as a reused buffer would be

        def fresh(i: int) -> Any:
            return fn(*arrays[i])

        def into(i: int) -> Any:
            return fn(*arrays[i], out=out)

        n = len(sets)
        return Prepared([Runner(self.key, FRESH, fresh, n_sets=n),
                         Runner(self.key, PREALLOCATED, into, n_sets=n)],
                        {"preallocated": "out= on the last ufunc"})


# ---------------------------------------------------------------------------------------------
# numexpr (elementwise only)

_NUMEXPR = {
    "basic": "((x * c2) + c1) * c3",
    "composite": "((x * c2) + c1) * c3",
    "chain": "(tanh(exp(x * c05 + c01) * c03 - c07) + c1) * x",
    "bias_gelu": "c05 * (x + b) * (c1 + tanh(k * ((x + b) + c044715 * (x + b) * (x + b) "
                 "* (x + b))))",
}


class NumExpr(System):
    key, label = "numexpr", "numexpr"
    dists = ("numexpr",)

    def probe(self) -> str | None:
        try:
            import numexpr
        except ImportError as exc:
            return f"numexpr not installed ({exc})"
        numexpr.set_num_threads(2)
        return None

    def threads(self) -> dict[str, Any]:
        import numexpr
        return {"numexpr_threads": numexpr.get_num_threads()}

    def supports(self, w: Workload) -> str | None:
        if w.kind not in ELEMENTWISE_KINDS:
            return "numexpr evaluates elementwise expressions only (no matmul, no row reductions)"
        return None

    def prepare(self, w: Workload, sets: list[dict[str, np.ndarray]],
                params: dict[str, np.ndarray], seeds: list[int]) -> Prepared:
        import numexpr

        import bench.workloads as W
        expr = _NUMEXPR[w.kind]
        f32 = np.float32  # Python float literals would turn the result into float64
        consts = {"c1": f32(1.0), "c2": f32(2.0), "c3": f32(3.0), "c05": f32(0.5),
                  "c01": f32(0.1), "c03": f32(0.3), "c07": f32(0.7), "c044715": f32(0.044715),
                  "k": f32(W.SQRT_2_OVER_PI)}
        envs = [{**consts, **s} for s in sets]
        out = np.empty(w.output_shape(), np.float32)
        out.fill(0)
        evaluate = numexpr.evaluate

        def fresh(i: int) -> Any:
            return evaluate(expr, local_dict=envs[i])

        def into(i: int) -> Any:
            return evaluate(expr, local_dict=envs[i], out=out)

        n = len(sets)
        return Prepared([Runner(self.key, FRESH, fresh, n_sets=n),
                         Runner(self.key, PREALLOCATED, into, n_sets=n)],
                        {"expression": expr, "preallocated": "evaluate(..., out=)"})


# The shape-generic system compiles the same cells with dynamic input dimensions (one library
# for every size): the single-input workloads with every axis dynamic (Softmax's row length
# too), the CNN with a dynamic batch (its channels meet the convolution's weights), the others
# with every axis but the last, which meets a weight or a bias.
GENERIC_SKIPS = {"encoder": "its attention reshapes by the sequence length (a static size)",
                 "bert": "its attention reshapes by the batch and sequence sizes (static sizes)"}
ALL_AXES = ("basic", "composite", "chain", "softmax")
BATCH_ONLY = ("cnn",)


def generic_types(w: Workload, arrays: list[np.ndarray]) -> list[Any]:
    from graphkernel.frontend.dynamic import symbol_name
    from graphkernel.ir.types import SymSize, TensorType, to_dtype
    types, count = [], 0
    for i, a in enumerate(arrays):
        dims: list[Any] = list(a.shape)
        if i == 0:
            axes = range(a.ndim) if w.kind in ALL_AXES else range(1) \
                if w.kind in BATCH_ONLY else range(a.ndim - 1)
            for axis in axes:
                dims[axis] = SymSize.dim(symbol_name(count))
                count += 1
        types.append(TensorType(tuple(dims), to_dtype(a.dtype)))
    return types
