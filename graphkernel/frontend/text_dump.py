"""`--dump_as_text`: what the graph-kernel stages did, as text in a `graph_kernel_dump` folder,
the folder MindSpore writes for this flag: under save_graphs_path when save_graphs is on (next
to the other dumps), else in the current directory as MindSpore does."""
from __future__ import annotations

import os

from graphkernel.frontend.compiled import CompiledCell
from graphkernel.graph_kernel.flags import GraphKernelFlags, flags_text
from graphkernel.ir.printer import print_graph
from graphkernel.passes.dumper import Dumper

GRAPH_KERNEL_DUMP = "graph_kernel_dump"


def write_graph_kernel_dump(exe: CompiledCell, flags: GraphKernelFlags, folder: str | None) -> str:
    """Write `graph_kernel_dump/<graph>.txt` (kernels, why ops were kept apart, every stage's
    graph); return its path. Like every dump, it never replaces a file graphkernel did not
    write (see Dumper)."""
    base = folder if folder is not None else os.getcwd()
    dumper = Dumper(os.path.join(base, GRAPH_KERNEL_DUMP))
    parts = [f"# graph_kernel_dump of graph {exe.name}",
             f"# graph_kernel_flags: {flags_text(flags) or '(defaults)'}", "", exe.summary(), ""]
    for name, graph in exe.stages.items():
        doc = exe.stage_docs.get(name, "")
        parts.append(print_graph(graph, f"stage {name}" + (f": {doc}" if doc else "")))
    return dumper.write_text(f"{exe.name}.txt", "\n".join(parts))
