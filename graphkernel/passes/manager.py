"""The pass manager: runs named stages in order, verifies after each, dumps when asked."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from graphkernel.ir.dot import to_dot
from graphkernel.ir.graph import Graph
from graphkernel.ir.printer import print_graph
from graphkernel.ir.verifier import verify

PassFn = Callable[[Graph], Graph]


@dataclass(frozen=True)
class Stage:
    """One named step of the pipeline. Its name is the dump's file name."""

    name: str
    run: PassFn
    doc: str = ""


@dataclass
class StageResult:
    name: str
    graph: Graph
    seconds: float
    doc: str = ""


@dataclass
class Dumper:
    """Writes `<stage>.ir` and `<stage>.dot` into a folder, remembering what it wrote."""

    folder: str
    written: list[str] = field(default_factory=list)

    def dump(self, stage: str, graph: Graph, doc: str = "") -> None:
        os.makedirs(self.folder, exist_ok=True)
        header = f"stage {stage}" + (f": {doc}" if doc else "")
        for suffix, text in ((".ir", print_graph(graph, header)),
                             (".dot", to_dot(graph, f"{graph.name} - {stage}"))):
            path = os.path.join(self.folder, stage + suffix)
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
            self.written.append(path)


def run_stages(graph: Graph, stages: list[Stage], dumper: Dumper | None) -> list[StageResult]:
    """Run each stage on a copy of the previous graph, so every stage's graph stays readable."""
    results: list[StageResult] = []
    for stage in stages:
        start = time.perf_counter()
        graph = stage.run(graph.clone())
        verify(graph, f"after stage {stage.name}")
        results.append(StageResult(stage.name, graph, time.perf_counter() - start, stage.doc))
        if dumper is not None:
            dumper.dump(stage.name, graph, stage.doc)
    return results
