"""A fused group's C, static or shape-generic (codegen/shape_args.py says how sizes are
passed): a group over a dynamic iteration space is emitted twice, on OpenMP threads and on the
calling thread, with a dispatcher that picks by this call's size."""
from __future__ import annotations

import math

from graphkernel.codegen.c_emitter import KernelSource, emit_kernel
from graphkernel.codegen.shape_args import ONE_THREAD, THREADS, kernel_symbols, read_sizes
from graphkernel.graph_kernel.schedule import Schedule
from graphkernel.ir.graph import Graph
from graphkernel.ir.types import symbols_of


def emit_any_kernel(graph: Graph, name: str, sched: Schedule, threshold: int,
                    stream_min_bytes: int | None = None) -> KernelSource:
    """`c_emitter.emit_kernel`, or for a dynamic iteration space: a threaded and a
    single-thread variant and `name` choosing between them by this call's size."""
    if not symbols_of(sched.space):
        return emit_kernel(graph, name, sched, threshold, stream_min_bytes)
    # No non-temporal stores (stream_min_bytes None): their size test is static.
    threads = emit_kernel(graph, f"{name}_threads", sched, THREADS)
    one = emit_kernel(graph, f"{name}_one", sched, ONE_THREAD)
    sizes = "\n".join(read_sizes(kernel_symbols(sched.space), len(threads.buffers)))
    work = math.prod(sched.space)
    dispatch = [f"void {name}(void *const *args) {{", sizes,
                f"  if ({work} >= {threshold}) {threads.name}(args); else {one.name}(args);",
                "}"]
    # The variants are this file's own; only the dispatcher is looked up by name.
    header = "void {}(void *const *args) {{"
    source = "".join(v.source.replace(header.format(v.name), "static " + header.format(v.name) +
                                      "\n" + sizes, 1) for v in (threads, one))
    return KernelSource(name, source + "\n".join(dispatch) + "\n", threads.buffers)
