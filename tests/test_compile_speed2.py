"""Compile time of a training step (issue #30 item 5, BERT-base's cold compile): the
optimizer's state, the plan's in-place writes, a kernel's structural key and the compile
cache's graph encoding each do their work once — with the same results as before."""
from __future__ import annotations

import sys
import threading
import tracemalloc
from typing import Any

import numpy as np
import pytest

import graphkernel
from bench.real_models import encoder_params, gk_encoder
from graphkernel import Parameter, nn
from graphkernel.frontend import compile_cache
from graphkernel.graph_kernel.flags import GraphKernelFlags
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ir import serialize
from graphkernel.ir.graph import Graph
from graphkernel.ops import operations as P
from graphkernel.runtime import builder

ON = CompileOptions(enable_graph_kernel=True, backend="numpy")
# The C backend (its kernels write weights in place), each weight's Adam update its own kernel
# as in BERT-base (whose groups are too large for parallel fusion to join): a kernel of several
# loop nests writes nothing in place.
ONE_NEST = CompileOptions(enable_graph_kernel=True,
                          flags=GraphKernelFlags(enable_parallel_fusion=False))
HIDDEN, HEADS, INNER, BATCH, SEQ = 32, 2, 64, 2, 8


def _training_step(depth: int) -> Any:
    net = gk_encoder(encoder_params(depth, HIDDEN, INNER), BATCH, SEQ, HIDDEN, HEADS)

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


def _inputs() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((BATCH, SEQ, HIDDEN)).astype(np.float32)


@pytest.mark.parametrize("optimizer", [nn.Adam, nn.Momentum])
def test_optimizer_state_is_written_once(optimizer: Any) -> None:
    """Each state tensor is filled once, in the Parameter's own array: a filled array copied
    again wrote every byte twice (BERT-base's Adam: 2 x 880 MB, 1.5 s of a cold compile).
    Peak memory while the state is made: the states alone (before: a filled temporary more)."""
    weight = Parameter(np.ones((1024, 1024), np.float32), "w")
    nbytes = weight.asnumpy().nbytes
    # tracemalloc counts every thread's allocations: an earlier test's plan may still be
    # faulting in its buffers on a prefault thread (runtime/memory.py), which CI saw as a
    # peak of twice the state.
    for thread in threading.enumerate():
        if thread.name == "graphkernel-prefault":
            thread.join()
    tracemalloc.start()
    try:
        if optimizer is nn.Momentum:
            opt = optimizer([weight], 1e-3, 0.9)
            states = [opt.moments[0]]
        else:
            opt = optimizer([weight], 1e-3)
            states = [opt.moment1[0], opt.moment2[0]]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < (len(states) + 0.5) * nbytes, (peak, nbytes)
    arrays = [s._array for s in states]
    for array in arrays:  # owned, writable, dense zeros: kernels update them in place
        assert array.flags.owndata and array.flags.writeable and array.flags.c_contiguous
        assert array.shape == (1024, 1024) and array.dtype == np.float32 and not array.any()
    if len(arrays) == 2:
        assert not np.shares_memory(arrays[0], arrays[1])


def test_in_place_writes_list_each_groups_users_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner asks whether each assigned value (a weight and its two moments) may be
    written in place; the group's users were listed once per value (BERT-base: 576 walks),
    now once per group. The plan writes in place the same values as before: same results."""
    monkeypatch.setenv(compile_cache.ENV, "0")
    walks = 0
    users = Graph.users

    def counted(graph: Graph) -> Any:
        nonlocal walks
        walks += sys._getframe(1).f_code.co_filename == builder.__file__
        return users(graph)

    x = _inputs()
    reference = graphkernel.compile(_training_step(1), x, x, options=ONE_NEST)
    monkeypatch.setattr(Graph, "users", counted)
    step = graphkernel.compile(_training_step(1), x, x, options=ONE_NEST)
    in_place = [s.in_place for s in step.executable.plan.steps if s.in_place]
    assert in_place == [s.in_place for s in reference.executable.plan.steps if s.in_place]
    assert sum(len(p) for p in in_place) > 10  # Adam's updates do write in place
    groups = len(in_place)
    assert walks <= groups, (walks, groups)  # before: one per value written in place
    for _ in range(3):  # both from the same weights: the same losses as they train
        np.testing.assert_allclose(np.asarray(step(x, x)), np.asarray(reference(x, x)),
                                   rtol=1e-5)


def test_encoding_a_graph_reads_each_dtypes_name_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile cache encodes every value's type; numpy computes `dtype.name` in Python
    each time (26,000 per BERT-base training compile): the supported dtypes' names come from
    a table, never from numpy. The encoding is unchanged."""
    x = _inputs()
    monkeypatch.setenv(compile_cache.ENV, "0")
    graph = graphkernel.compile(_training_step(1), x, x, options=ON).report.stages["6_validate"]
    data = serialize.graph_to_data(graph)
    asked = 0

    class CountingDtype:  # a float32 that counts how often its name is read
        def __init__(self) -> None:
            self.dtype = np.dtype(np.float32)

        def __hash__(self) -> int:
            return hash(self.dtype)

        def __eq__(self, other: object) -> bool:
            return self.dtype == other

        @property
        def name(self) -> str:
            nonlocal asked
            asked += 1
            return self.dtype.name

    from graphkernel.ir.types import TensorType
    counting = CountingDtype()
    for _ in range(50):
        encoded = serialize.encode_type(TensorType((2, 3), counting))  # type: ignore[arg-type]
        assert encoded == {"shape": [2, 3], "dtype": "float32"}
    assert asked == 0, asked
    assert serialize.graph_to_data(graph) == data
