"""Compile time of the passes (issue #30 item 5): parallel fusion weighs a group only against
the kernels it could join, the pass manager verifies the graphs it hands on without verifying
every stage in full, and the stages' graphs are not copied for nothing — with the same results
as before."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import graphkernel
from bench.real_models import encoder_params, gk_encoder
from graphkernel import nn
from graphkernel.graph_kernel import parallel_fusion
from graphkernel.graph_kernel.parallel_fusion import ParallelFuser
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ir.graph import Graph
from graphkernel.ops import operations as P
from graphkernel.passes import stage_names

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
