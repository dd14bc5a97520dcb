"""The pass manager: runs named stages in order, verifies what they hand on, dumps when asked.

Verification. The graph a list of stages ends with (the initial graph, the graph that runs) is
always verified in full. Each stage's own result is verified in full only when it is dumped
(`save_graphs`: a debugging session) or when `GRAPHKERNEL_VERIFY_EACH_STAGE=1`: type inference
over every node after each of a dozen stages was a fifth of a cold compile's Python. A pass
that breaks the graph is still caught and named: when the end graph fails verification, or a
stage raises, the stages run again from their input with the verifier after each, and the
error names the first stage whose result is not well formed. (A break that a later stage
removes, say a broken node that dead code elimination drops, is then not reported; the
graph that runs is well formed either way.)

Copies. Each stage works on the graph the previous one returned (one copy of the input is
made, so the input stays as it was). A stage's graph that a later stage changed is rebuilt
the first time someone asks for it (`StageResult.graph`: the report's stages, the lab), by
running the stages again from that input, copying after each.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from graphkernel.errors import VerifyError
from graphkernel.ir.graph import Graph
from graphkernel.ir.verifier import verify
from graphkernel.passes.dumper import Dumper

PassFn = Callable[[Graph], Graph]

# Set to 1 to verify every stage's result in full (how every compile ran before), to find the
# stage that breaks a graph as soon as it does.
VERIFY_EACH_STAGE_ENV = "GRAPHKERNEL_VERIFY_EACH_STAGE"


@dataclass(frozen=True)
class Stage:
    """One named step of the pipeline. Its name is the dump's file name."""

    name: str
    run: PassFn
    doc: str = ""
    # The lowest graph_kernel opt_level that runs it (0: always runs when its list runs).
    opt_level: int = 0


def verify_each_stage() -> bool:
    """Whether `GRAPHKERNEL_VERIFY_EACH_STAGE` asks for every stage's result verified."""
    return os.environ.get(VERIFY_EACH_STAGE_ENV, "0").strip().lower() in ("1", "true", "on",
                                                                          "yes")


class _Run:
    """One run of a list of stages: its untouched input, the graph it ended with, and the
    stages' own graphs once asked for (rebuilt by running the stages again)."""

    def __init__(self, source: Graph, stages: list[Stage], end: Graph) -> None:
        self.source, self.stages, self.end = source, stages, end
        self.graphs: list[Graph] | None = None

    def graph_after(self, index: int) -> Graph:
        if index == len(self.stages) - 1:
            return self.end
        if self.graphs is None:
            self.graphs = _replay(self.source, self.stages[:-1])
        return self.graphs[index]


class StageResult:
    """A stage that ran: its name, seconds and doc; `graph` is its result (the last stage's at
    once, the others rebuilt on first use)."""

    def __init__(self, name: str, seconds: float, doc: str, run: _Run, index: int) -> None:
        self.name, self.seconds, self.doc = name, seconds, doc
        self._run, self._index = run, index

    @property
    def graph(self) -> Graph:
        return self._run.graph_after(self._index)


class StageGraphs(Mapping[str, Graph]):
    """Stage name -> its graph, each built only when asked for (`StageResult.graph`)."""

    def __init__(self, results: list[StageResult]) -> None:
        self._results = {r.name: r for r in results}

    def __getitem__(self, name: str) -> Graph:
        return self._results[name].graph

    def __iter__(self) -> Iterator[str]:
        return iter(self._results)

    def __len__(self) -> int:
        return len(self._results)


def stage_dump_names(stages: list[Stage]) -> list[str]:
    """The files `Dumper.dump` writes for these stages."""
    return [stage.name + suffix for stage in stages for suffix in (".ir", ".dot")]


def run_stages(graph: Graph, stages: list[Stage], dumper: Dumper | None) -> list[StageResult]:
    """Run the stages in order on a copy of `graph` (left as it was): see the module's doc for
    what is verified when. Raises VerifyError naming the stage that broke the graph."""
    each = dumper is not None or verify_each_stage()
    work = graph.clone()
    timed: list[tuple[str, float, str]] = []
    try:
        for stage in stages:
            start = time.perf_counter()
            work = stage.run(work)
            if each:
                verify(work, f"after stage {stage.name}")
            timed.append((stage.name, time.perf_counter() - start, stage.doc))
            if dumper is not None:
                dumper.dump(stage.name, work, stage.doc)
        if stages and not each:
            start = time.perf_counter()
            verify(work, f"after stage {stages[-1].name}")
            name, seconds, doc = timed[-1]
            timed[-1] = (name, seconds + time.perf_counter() - start, doc)
    except Exception as exc:
        if not each:
            _name_the_breaking_stage(graph, stages, exc)
        raise
    run = _Run(graph, stages, work)
    return [StageResult(name, seconds, doc, run, i) for i, (name, seconds, doc)
            in enumerate(timed)]


def _replay(source: Graph, stages: list[Stage]) -> list[Graph]:
    """Each stage's result, running them again on a copy of `source`, each verified and kept
    (a copy goes on to the next stage)."""
    graphs: list[Graph] = []
    work = source.clone()
    for stage in stages:
        work = stage.run(work)
        verify(work, f"after stage {stage.name}")
        graphs.append(work)
        work = work.clone()
    return graphs


def _name_the_breaking_stage(source: Graph, stages: list[Stage], failure: Exception) -> None:
    """After a run without a verify per stage failed with `failure`: run the stages again from
    `source`, verifying each result, and raise the VerifyError of the first stage that broke
    the graph. Returns when each stage's result verifies (the failure is the stage's own)."""
    try:
        _replay(source, stages)
    except VerifyError as found:
        if found is not failure and str(found) != str(failure):
            raise found from failure
    except Exception:  # noqa: BLE001  (the failure itself, again: it is raised as it was)
        return
