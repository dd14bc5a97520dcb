"""C for a parallel kernel (graph_kernel/parallel_fusion.py) whose groups need several loop
nests: each nest is a static function of this file (c_emitter's loop nest, OpenMP above the
threshold by its own size), and the kernel, one C entry, calls them one after another with
their arguments picked from its own."""
from __future__ import annotations

from graphkernel.backends.c.c_emitter import Buffer, KernelSource, emit_kernel
from graphkernel.backends.c.c_loops import DEFAULT_BLOCKING, LoopBlocking
from graphkernel.graph_kernel.parallel_fusion import ParallelSchedule
from graphkernel.ir.graph import Graph


def emit_parallel_kernel(graph: Graph, name: str, sched: ParallelSchedule, threshold: int,
                         stream_min_bytes: int | None = None,
                         prefetch_min_bytes: int | None = None,
                         beside_blas: bool = False,
                         blocking: LoopBlocking = DEFAULT_BLOCKING) -> KernelSource:
    """One C function `name(args)`: args are the merged group's inputs, its non-scalar
    constants, then its outputs (as for any fused group)."""
    header = "void {}(void *const *args) {{"
    parts, calls = [], []
    for k, nest in enumerate(sched.nests):
        nest_name = f"{name}_nest{k}"
        source = emit_kernel(nest.graph, nest_name, nest.schedule, threshold, stream_min_bytes,
                             prefetch_min_bytes, beside_blas, blocking)
        parts.append(source.source.replace(header.format(nest_name),
                                           "static " + header.format(nest_name), 1))
        argv = ", ".join(f"args[{i}]" for i in nest.args)
        calls.append(f"  {{ void *const a[] = {{{argv}}}; {nest_name}(a); }}")
    constants = [c for c in graph.constants() if not c.is_scalar]
    sources = [*graph.inputs, *constants]
    buffers = [Buffer(v, tuple(v.shape), False, i) for i, v in enumerate(sources)] + \
        [Buffer(v, tuple(v.shape), True, i) for i, v in enumerate(graph.outputs)]
    entry = [f"/* {name}: {len(sched.nests)} loop nests, one after another */",
             header.format(name), *calls, "}"]
    return KernelSource(name, "".join(parts) + "\n".join(entry) + "\n", buffers)
