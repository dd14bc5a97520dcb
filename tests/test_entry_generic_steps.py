"""Steps of shape-generic plans (`Cell.set_inputs` with None, an ONNX export's dim_param) other
than products, run by the compiled entry: a Gather of a dynamic count of indices
(backends/c/c_gather.py), a Gather at indices computed in the graph (checked by the step, a bad
one handed back to the Python runner, which raises), and a Split over a dynamic batch (Slices
its consumer kernels read in place, graph_kernel/lower_layout.py). Each runs for batch 3, 1
and 0, through the entry and the Python runner, against numpy."""
from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.errors import ShapeError
from graphkernel.frontend import context
from graphkernel.ops import operations as P


class Two(nn.Cell):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def construct(self, a, b):
        return P.ReLU()(self.fn(a, b))  # a kernel after the step: the entry holds the plan


def _compiled(net):
    return next(iter({id(v): v for v in net._compiled.values()}.values()))


def _both(net, a, b):
    """The entry's result (it must take the call) and the Python runner's."""
    exe = _compiled(net)
    runner = exe.executable.runner
    assert exe.entry is not None, exe.plan.describe()
    by_entry = runner.entry(a, b, *runner.entry_constants)
    assert by_entry is not NotImplemented
    by_steps = runner.run(exe.executable.check_inputs([a, b]), [])
    return by_entry, by_steps[0]


@pytest.mark.parametrize("computed", [False, True])
def test_a_gather_of_a_dynamic_count_of_indices_runs_in_the_entry(computed, rng):
    context.set_context(enable_graph_kernel=True)
    shift = 1 if computed else 0  # indices + 1: computed in the graph
    net = Two(lambda t, i: P.Gather()(t, P.Add()(i, 1) if computed else i, 0))
    net.set_inputs(Tensor(shape=[9, 4], dtype=graphkernel.float32),
                   Tensor(shape=[None, 5], dtype=graphkernel.int64))
    table = rng.standard_normal((9, 4)).astype(np.float32)
    for batch in (3, 1, 0):
        ids = rng.integers(0, 8, (batch, 5)).astype(np.int64)
        want = np.maximum(table[ids + shift], 0)
        np.testing.assert_array_equal(net(Tensor(table), Tensor(ids)).asnumpy(), want)
        by_entry, by_steps = _both(net, table, ids)
        assert "N" in str(_compiled(net).plan.steps[-1].out_types[0])
        np.testing.assert_array_equal(by_entry, want)
        np.testing.assert_array_equal(by_steps, want)


@pytest.mark.parametrize("computed", [False, True])
def test_an_index_out_of_range_at_a_dynamic_count_is_the_runners_error(computed, rng):
    context.set_context(enable_graph_kernel=True)
    net = Two(lambda t, i: P.Gather()(t, P.Add()(i, 1) if computed else i, 0))
    net.set_inputs(Tensor(shape=[9, 4], dtype=graphkernel.float32),
                   Tensor(shape=[None, 5], dtype=graphkernel.int64))
    table = rng.standard_normal((9, 4)).astype(np.float32)
    ids = rng.integers(0, 8, (3, 5)).astype(np.int64)
    net(Tensor(table), Tensor(ids))
    runner = _compiled(net).executable.runner
    assert runner.entry is not None
    ids[2, 4] = 9 - (1 if computed else 0)  # row 9 of 9
    assert runner.entry(table, ids, *runner.entry_constants) is NotImplemented
    with pytest.raises(ShapeError, match="index 9 is out of range"):
        net(Tensor(table), Tensor(ids))


def test_a_split_over_a_dynamic_batch_is_read_in_place_by_the_entrys_kernels(rng):
    context.set_context(enable_graph_kernel=True)

    def fn(x, y):
        q, k, v = P.Split(axis=-1, output_num=3)(x)
        return q * k + v * y

    net = Two(fn)
    net.set_inputs(Tensor(shape=[None, 4, 12], dtype=graphkernel.float32),
                   Tensor(shape=[4, 4], dtype=graphkernel.float32))
    y = rng.standard_normal((4, 4)).astype(np.float32)
    for batch in (3, 1, 0):
        x = rng.standard_normal((batch, 4, 12)).astype(np.float32)
        q, k, v = np.split(x, 3, axis=-1)
        want = np.maximum(q * k + v * y, 0)
        np.testing.assert_allclose(net(Tensor(x), Tensor(y)).asnumpy(), want, rtol=1e-6)
        by_entry, by_steps = _both(net, x, y)
        assert not [s for s in _compiled(net).plan.steps if s.op == "Split"]
        np.testing.assert_allclose(by_entry, want, rtol=1e-6)
        np.testing.assert_allclose(by_steps, want, rtol=1e-6)


def test_a_slice_cutting_a_dynamic_axis_is_a_clear_error():
    from graphkernel.ir import types as T
    from graphkernel.ir.opset import get_op
    from graphkernel.ir.types import TensorType

    x = TensorType((T.SymSize.dim("N"), 6), T.float32)
    infer = get_op("Slice").infer
    assert infer((x,), {"begin": (0, 2), "size": (-1, 3)}).shape == (T.SymSize.dim("N"), 3)
    with pytest.raises(ShapeError, match="dynamic size N"):
        infer((x,), {"begin": (1, 0), "size": (-1, 6)})
