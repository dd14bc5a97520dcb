"""A fused group's C, static or shape-generic (backends/c/shape_args.py says how sizes are
passed): a group over a dynamic iteration space is emitted as variants (on OpenMP threads, on
the calling thread, and, for a bandwidth-bound group, on threads with non-temporal stores) and
a dispatcher that picks one by this call's size, the choices the static emitter makes from the
sizes it knows."""
from __future__ import annotations

import math

from graphkernel.backends.c.c_emitter import KernelSource, emit_kernel
from graphkernel.backends.c.c_loops import DEFAULT_BLOCKING, LoopBlocking
from graphkernel.backends.c.shape_args import ONE_THREAD, THREADS, kernel_symbols, read_sizes
from graphkernel.graph_kernel.schedule import Schedule
from graphkernel.ir.graph import Graph
from graphkernel.ir.types import symbols_of


def emit_any_kernel(graph: Graph, name: str, sched: Schedule, threshold: int,
                    stream_min_bytes: int | None = None,
                    prefetch_min_bytes: int | None = None,
                    beside_blas: bool = False,
                    blocking: LoopBlocking = DEFAULT_BLOCKING) -> KernelSource:
    """`c_emitter.emit_kernel`, or for a dynamic iteration space: the variants and `name`
    choosing between them by this call's size."""
    if not symbols_of(sched.space):
        return emit_kernel(graph, name, sched, threshold, stream_min_bytes, prefetch_min_bytes,
                           beside_blas, blocking)
    threads = emit_kernel(graph, f"{name}_threads", sched, THREADS,
                          prefetch_min_bytes=prefetch_min_bytes, beside_blas=beside_blas,
                          blocking=blocking)
    one = emit_kernel(graph, f"{name}_one", sched, ONE_THREAD,
                      prefetch_min_bytes=prefetch_min_bytes, blocking=blocking)
    variants = [threads, one]
    stream = None if stream_min_bytes is None else \
        emit_kernel(graph, f"{name}_stream", sched, THREADS, stream_min_bytes,
                    beside_blas=beside_blas, blocking=blocking)
    sizes = "\n".join(read_sizes(kernel_symbols(sched.space), len(threads.buffers)))
    work = math.prod(sched.space)
    choose = f"  if ({work} >= {threshold}) {threads.name}(args); else {one.name}(args);"
    if stream is not None and stream.stream_bytes is not None:
        # Streaming stores pay only when the outputs will not be read back from the cache.
        variants.append(stream)
        choose = (f"  if ({stream.stream_bytes} >= {stream_min_bytes}) {stream.name}(args);\n"
                  f"  else{choose[1:]}")
    dispatch = [f"void {name}(void *const *args) {{", sizes, choose, "}"]
    # The variants are this file's own; only the dispatcher is looked up by name.
    header = "void {}(void *const *args) {{"
    source = "".join(v.source.replace(header.format(v.name), "static " + header.format(v.name) +
                                      "\n" + sizes, 1) for v in variants)
    return KernelSource(name, source + "\n".join(dispatch) + "\n", threads.buffers)
