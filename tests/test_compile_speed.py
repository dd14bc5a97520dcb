"""Compile time of the passes (issue #30 item 5): parallel fusion weighs a group only against
the kernels it could join, the pass manager verifies the graphs it hands on without verifying
every stage in full, and the stages' graphs are not copied for nothing — with the same results
as before."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

import graphkernel
from bench.real_models import encoder_params, gk_encoder
from graphkernel import nn
from graphkernel.errors import VerifyError
from graphkernel.frontend import compile_cache, context
from graphkernel.graph_kernel import cluster, parallel_fusion, pipeline, schedule
from graphkernel.graph_kernel.parallel_fusion import ParallelFuser
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ir.graph import Constant, Graph
from graphkernel.ir.printer import print_graph
from graphkernel.ops import operations as P
from graphkernel.passes import manager, stage_names
from graphkernel.passes.manager import Stage, run_stages
from graphkernel.runtime.plan import ExecutionPlan

# The numpy backend: these tests look at the passes, not at the C they lead to.
ON = CompileOptions(enable_graph_kernel=True, backend="numpy")
HIDDEN, HEADS, INNER, BATCH, SEQ = 32, 2, 64, 2, 8


def _encoder(depth: int) -> Any:
    return gk_encoder(encoder_params(depth, HIDDEN, INNER), BATCH, SEQ, HIDDEN, HEADS)


def _inputs() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((BATCH, SEQ, HIDDEN)).astype(np.float32)


def _training_step(depth: int) -> Any:
    """The encoder stack, MSE against a target, Adam: a training step as bench.real_systems
    builds it (every parameter's update is independent of the others')."""
    net = _encoder(depth)

    class WithLoss(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.sum, self.square = net, P.ReduceSum(), P.Square()

        def construct(self, x: Any, target: Any) -> Any:
            return self.sum(self.square(self.net(x) - target)) * (0.5 / BATCH)

    loss = WithLoss()
    step = nn.TrainOneStepCell(loss, nn.Adam(loss.trainable_params(), 1e-3))
    step.set_train(True)
    return step


def _before_parallel_fusion(cell: Any, *arrays: np.ndarray) -> Graph:
    """The graph parallel fusion was given when `cell` compiled."""
    stages = graphkernel.compile(cell, *arrays, options=ON).report.stages
    names = list(stages)
    return stages[names[names.index(stage_names.PARALLEL_FUSION) - 1]]


class _EveryKernel(ParallelFuser):
    """Parallel fusion as it was: each group weighed against every kernel so far (its
    siblings' kernels first, then oldest first)."""

    def _candidates(self, unit: Any, near: list[Any]) -> list[Any]:
        return list(dict.fromkeys(near + self.kernels))


def _fused(fuser_class: type[ParallelFuser], graph: Graph) -> tuple[list[Any], list[Any], int]:
    """What parallel fusion made of `graph`: each parallel kernel's name, loop nests, groups
    and ops; the reasons it gave; how many times it weighed a group against a kernel."""
    options = ON.flags
    fuser = fuser_class(graph.clone(), options, ON.cost, stage_names.PARALLEL_FUSION)
    attempts = 0
    weigh = fuser._join_refusal

    def counted(unit: Any, kernel: Any) -> Any:
        nonlocal attempts
        attempts += 1
        return weigh(unit, kernel)

    fuser._join_refusal = counted  # type: ignore[method-assign]
    fused = fuser.run()
    kernels = [(n.name, n.notes[parallel_fusion.LOOP_NESTS], n.notes[parallel_fusion.PARALLEL],
                [m.name for m in n.subgraph.nodes])
               for n in fused.nodes
               if n.subgraph is not None and parallel_fusion.LOOP_NESTS in n.notes]
    reasons = [(r.producer, r.consumer, r.rule, r.detail) for r in fuser.reasons]
    return kernels, reasons, attempts


@pytest.mark.parametrize("depth", [1, 3])
def test_parallel_fusion_makes_the_kernels_it_made_weighing_every_kernel(depth: int) -> None:
    x = _inputs()
    graphs = {"encoder": _before_parallel_fusion(_encoder(depth), x),
              "training step": _before_parallel_fusion(_training_step(depth), x, x)}
    for what, graph in graphs.items():
        every_kernels, every_reasons, _ = _fused(_EveryKernel, graph)
        kernels, reasons, _ = _fused(ParallelFuser, graph)
        assert kernels == every_kernels, what
        assert reasons == every_reasons, what
        if what == "training step":  # the optimizer updates were merged
            assert any(text.count("Sqrt") >= 2 for _, _, _, ops in kernels
                       for text in [" ".join(ops)])


def test_parallel_fusion_weighs_a_group_only_against_kernels_it_could_join() -> None:
    x = _inputs()
    attempts = {}
    for depth in (2, 6):
        _, _, attempts[depth] = _fused(ParallelFuser, _before_parallel_fusion(
            _training_step(depth), x, x))
    # 3x the layers: 3x the groups, each weighed against about as many kernels as before
    # (weighed against every kernel so far, 3x the groups met 3x the kernels: 7.6x)
    assert attempts[6] <= 4 * attempts[2], attempts


def _compile_counting(monkeypatch: pytest.MonkeyPatch, cell: Any, *arrays: np.ndarray
                      ) -> tuple[Any, int, int]:
    """Compile (no compile cache): the result, how many graphs the pass manager verified, and
    how many graphs it copied."""
    monkeypatch.setenv(compile_cache.ENV, "0")
    verified, copied = 0, 0
    verify, clone = manager.verify, Graph.clone

    def counted_verify(graph: Graph, where: str = "") -> None:
        nonlocal verified
        verified += 1
        verify(graph, where)

    def counted_clone(graph: Graph) -> Graph:
        nonlocal copied
        copied += sys._getframe(1).f_code.co_filename == manager.__file__
        return clone(graph)

    monkeypatch.setattr(manager, "verify", counted_verify)
    monkeypatch.setattr(Graph, "clone", counted_clone)
    exe = graphkernel.compile(cell, *arrays, options=ON)
    return exe, verified, copied


def test_a_compile_verifies_in_full_only_the_graphs_it_hands_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    x = _inputs()
    exe, verified, copied = _compile_counting(monkeypatch, _encoder(2), x)
    # the initial graph and the graph that runs (before: each of the 12 stages' results)
    assert verified == 2, verified
    assert copied == 2, copied  # each list of stages copies its input once (before: 12)
    monkeypatch.setenv(manager.VERIFY_EACH_STAGE_ENV, "1")
    exe, verified, _ = _compile_counting(monkeypatch, _encoder(2), x)
    assert verified == len(exe.stages)


def test_each_stages_graph_is_rebuilt_as_it_was_dumped(tmp_path: Any) -> None:
    """The stages' graphs are not kept as copies: asked for, they are rebuilt by running the
    stages again, the same graphs save_graphs dumped as the compile ran."""
    x = _inputs()
    context.set_context(save_graphs=True, save_graphs_path=str(tmp_path))
    try:
        dumped = graphkernel.compile(_encoder(1), x, options=ON)
    finally:
        context.set_context(save_graphs=False)
    compiled = graphkernel.compile(_encoder(1), x, options=ON)
    assert list(compiled.report.stages) == list(dumped.report.stages)
    for name, graph in compiled.report.stages.items():
        doc = compiled.report.stage_docs[name]
        header = f"stage {name}" + (f": {doc}" if doc else "")
        assert print_graph(graph, header) == (tmp_path / f"{name}.ir").read_text(), name
    np.testing.assert_allclose(compiled.run_arrays(x)[0], dumped.run_arrays(x)[0], rtol=1e-6)


def _drop_a_used_node(graph: Graph) -> Graph:
    """A broken pass: removes a node another node reads."""
    read = {v.uid for n in graph.nodes for v in n.inputs}
    graph.nodes.remove(next(n for n in graph.nodes if n.uid in read))
    return graph


def test_a_pass_that_breaks_the_graph_is_caught_and_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compile_cache.ENV, "0")  # the stages run
    x = _inputs()
    simplify = pipeline.simplify_composites
    monkeypatch.setattr(pipeline, "simplify_composites",
                        lambda graph: _drop_a_used_node(simplify(graph)))
    with pytest.raises(VerifyError, match=f"after stage {stage_names.SIMPLIFY}: .* before it "
                                          "is defined"):
        graphkernel.compile(_encoder(1), x, options=ON)


def test_a_broken_graph_a_later_stage_trips_over_names_the_stage_that_broke_it() -> None:
    x = _inputs()
    graph = _before_parallel_fusion(_encoder(1), x)

    def trips(graph: Graph) -> Graph:  # a pass that expects a well-formed graph
        made = {v.uid for v in graph.inputs} | {n.uid for n in graph.nodes}
        for node in graph.nodes:
            for value in node.inputs:
                if not isinstance(value, Constant) and value.uid not in made:
                    raise KeyError(value.uid)
        return graph

    stages = [Stage("a_fine", lambda g: g), Stage("b_breaks", _drop_a_used_node),
              Stage("c_trips", trips), Stage("d_end", lambda g: g)]
    with pytest.raises(VerifyError, match="after stage b_breaks: .* before it is defined"):
        run_stages(graph, stages, None)
    # the stage that raised on a well-formed graph: its own error
    with pytest.raises(KeyError):
        run_stages(graph, [stages[0], Stage("c_trips", lambda g: trips(_drop_a_used_node(g)))],
                   None)


@pytest.mark.parametrize("what", ["encoder", "training step"])
def test_lowering_keeps_the_loop_nests_the_end_stage_planned(what: str) -> None:
    """Lowering gets the end stage's graph itself (no copy): it keeps the schedules planned
    there instead of planning each composite again, and they are the ones it would plan."""
    x = _inputs()
    cell = _encoder(2) if what == "encoder" else _training_step(2)
    final = graphkernel.compile(cell, *([x] if what == "encoder" else [x, x]),
                                options=ON).report.stages[stage_names.FINAL]
    composites = [n for n in final.nodes if n.subgraph is not None]
    kept = [_plan_text(n.schedule) for n in composites]
    again = [_plan_text(n.schedule) for n in pipeline.schedule_composites(final).nodes
             if n.subgraph is not None]
    assert composites and kept == again


def _plan_text(schedule: Any) -> Any:
    """A composite's schedule as comparable text (a parallel kernel's nests: each one's ops)."""
    if isinstance(schedule, parallel_fusion.ParallelSchedule):
        return [(repr(nest.schedule), nest.args, [n.name for n in nest.graph.nodes])
                for nest in schedule.nests]
    return repr(schedule)


def test_a_training_steps_written_weights_are_found_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled cell finds the Parameters a step writes with one walk of the plan's steps,
    not one per Parameter (BERT-base: 578 Parameters times ~2000 steps)."""
    walks = 0
    written = ExecutionPlan.written_weights

    def counted(plan: ExecutionPlan) -> tuple[int, ...]:
        nonlocal walks
        walks += 1
        return written.fget(plan)  # type: ignore[attr-defined]

    monkeypatch.setattr(ExecutionPlan, "written_weights", property(counted))
    x = _inputs()
    step = graphkernel.compile(_training_step(1), x, x, options=ON)
    assert len(step.written) == len(step.params) > 10  # Adam writes every weight and its state
    assert walks <= 2, walks


def _compiled_text(cell: Any, *arrays: np.ndarray) -> str:
    """Every stage's graph, the plan and the fusion reasons of a compile, as text."""
    compiled = graphkernel.compile(cell, *arrays, options=ON)
    return "\n".join(print_graph(g, n) for n, g in compiled.report.stages.items()) + \
        compiled.executable.plan.describe() + \
        repr([(r.producer, r.consumer, r.rule, r.detail) for r in compiled.reasons])


def _analyses(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Counts the group analyses clustering and parallel fusion run (not lowering's, which
    plans each kernel once): True for each that found a schedule, False for each refused."""
    runs: list[bool] = []
    fusing = [False]
    real = schedule.analyze

    def counted(nodes: Any, outputs: Any) -> Any:
        try:
            found = real(nodes, outputs)
        except schedule.NotSchedulable:
            if fusing[0]:
                runs.append(False)
            raise
        if fusing[0]:
            runs.append(True)
        return found

    def fusing_in(stage: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            fusing[0] = True
            try:
                return stage(*args, **kwargs)
            finally:
                fusing[0] = False
        return run

    monkeypatch.setattr(cluster, "analyze", counted)
    monkeypatch.setattr(parallel_fusion, "analyze", counted)
    monkeypatch.setattr(pipeline, "cluster", fusing_in(pipeline.cluster))
    monkeypatch.setattr(pipeline, "parallel_fuse", fusing_in(pipeline.parallel_fuse))
    return runs


def test_identical_layers_groups_are_analysed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer of a stack tries the same unions; a schedule found for one group's structure
    serves the others (cluster.AnalysisMemo). Before, the analyses that found a schedule grew
    with depth (3 layers 357, 6 layers 714; now 99 and 99)."""
    monkeypatch.setenv(compile_cache.ENV, "0")  # the stages run
    runs = _analyses(monkeypatch)
    x = _inputs()
    found = {}
    for depth in (3, 6):
        runs.clear()
        graphkernel.compile(_training_step(depth), x, x, options=ON)
        found[depth] = runs.count(True)
    assert found[6] == found[3], found


@pytest.mark.parametrize("depth", [1, 3])
def test_a_compile_with_the_analysis_memo_is_the_compile_without(
        monkeypatch: pytest.MonkeyPatch, depth: int) -> None:
    """The schedules the memo hands out lead to the very graphs, plan and reasons that
    analysing each group again does (an encoder and its training step)."""
    monkeypatch.setenv(compile_cache.ENV, "0")  # the stages run
    x = _inputs()
    cells = [lambda: (_encoder(depth), [x]), lambda: (_training_step(depth), [x, x])]
    with_memo = [_compiled_text(cell, *arrays) for cell, arrays in (c() for c in cells)]
    monkeypatch.setattr(cluster.AnalysisMemo, "analyze",
                        lambda self, nodes, outputs: schedule.analyze(nodes, outputs))
    without = [_compiled_text(cell, *arrays) for cell, arrays in (c() for c in cells)]
    assert with_memo == without
