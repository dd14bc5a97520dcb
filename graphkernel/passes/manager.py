"""The pass manager: runs named stages in order, verifies after each, dumps when asked."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from graphkernel.ir.graph import Graph
from graphkernel.ir.verifier import verify
from graphkernel.passes.dumper import Dumper

PassFn = Callable[[Graph], Graph]


@dataclass(frozen=True)
class Stage:
    """One named step of the pipeline. Its name is the dump's file name."""

    name: str
    run: PassFn
    doc: str = ""
    # The lowest graph_kernel opt_level that runs it (0: always runs when its list runs).
    opt_level: int = 0


@dataclass
class StageResult:
    name: str
    graph: Graph
    seconds: float
    doc: str = ""


def stage_dump_names(stages: list[Stage]) -> list[str]:
    """The files `Dumper.dump` writes for these stages."""
    return [stage.name + suffix for stage in stages for suffix in (".ir", ".dot")]


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
