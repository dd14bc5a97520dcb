"""Data parallel: the AllReduce op and nn.DistributedGradReducer sum (or average) tensors over
the process group in one buffer per dtype; TrainOneStepCell averages its gradients in one
AllReduce per step; under `mpirun -n 2` over MPI itself, two ranks on half batches end with the
weights of one process on the whole batches."""
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from graphkernel import Tensor, communication, context, nn
from graphkernel.errors import CommunicationError, ContextError
from graphkernel.ops import operations as P

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_digits_dp.py")


class TwinRanks:
    """A group standing for `size` ranks that all hold this process's tensors: the sum is the
    buffer times `size`. Counts the collective calls and their buffers."""

    def __init__(self, size: int = 2) -> None:
        self.size, self.rank, self.calls = size, 0, []

    def allreduce_sum(self, buffer: np.ndarray) -> None:
        self.calls.append((buffer.dtype, buffer.size))
        buffer *= self.size


@pytest.fixture
def twin():
    group = TwinRanks()
    communication.use_group(group)
    yield group
    communication.release()
    context.reset_auto_parallel_context()


class Reduce(nn.Cell):
    def __init__(self, count, mean=True):
        super().__init__()
        self.reducer = nn.DistributedGradReducer(list(range(count)), mean=mean)

    def construct(self, a, b, c):
        return self.reducer((a * 3.0, b, c))


@pytest.mark.parametrize("fusion", [True, False])
def test_reducer_is_one_all_reduce_one_buffer_per_dtype(twin, fusion, rng):
    context.set_context(enable_graph_kernel=fusion)
    a = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    c = rng.standard_normal((2, 2)).astype(np.float64)
    cell = Reduce(3)
    out = cell(Tensor(a), Tensor(b), Tensor(c))
    # Two ranks holding the same values average to those values.
    np.testing.assert_allclose(out[0].asnumpy(), a * 3.0, rtol=1e-6)
    np.testing.assert_array_equal(out[1].asnumpy(), b)
    np.testing.assert_array_equal(out[2].asnumpy(), c)
    assert twin.calls == [(np.dtype("float32"), 27), (np.dtype("float64"), 4)]
    twin.calls.clear()
    summed = Reduce(3, mean=False)(Tensor(a), Tensor(b), Tensor(c))
    np.testing.assert_array_equal(summed[1].asnumpy(), b * 2)
    from graphkernel.frontend.compile import compile
    graph = compile(cell, Tensor(a), Tensor(b), Tensor(c)).graph
    assert [n.op for n in graph.nodes].count("AllReduce") == 1


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell([nn.Dense(8, 16, seed=0), nn.ReLU(),
                                       nn.Dense(16, 3, seed=1)])

    def construct(self, x):
        return self.body(x)


def _train(parallel: bool, fusion: bool, steps: int = 4):
    context.set_context(enable_graph_kernel=fusion)
    if parallel:
        context.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
    net = MLP()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    rng = np.random.default_rng(3)
    for _ in range(steps):
        x = rng.standard_normal((12, 8)).astype(np.float32)
        y = rng.integers(0, 3, 12).astype(np.int32)
        step(Tensor(x), Tensor(y))
    context.reset_auto_parallel_context()
    return [p.asnumpy() for _, p in net.parameters_and_names()], step


@pytest.mark.parametrize("fusion", [True, False])
def test_gradients_are_averaged_in_one_buffer_per_step(twin, fusion):
    alone, _ = _train(parallel=False, fusion=fusion)
    assert twin.calls == []
    together, step = _train(parallel=True, fusion=fusion)
    # Two ranks with the same gradients average to those gradients: the same weights.
    for a, b in zip(alone, together):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    sizes = sum(p.size for p in step.weights)
    assert twin.calls == [(np.dtype("float32"), sizes)] * 4  # one call per step, all weights


def test_all_reduce_sums_and_scales(twin):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones(4, np.float16)
    out = P.AllReduce(scale=0.25)((Tensor(a), Tensor(b)))
    np.testing.assert_array_equal(out[0].asnumpy(), a * 0.5)
    np.testing.assert_array_equal(out[1].asnumpy(), b * 0.5)
    assert out[1].dtype == np.float16
    assert twin.calls == [(np.dtype("float32"), 6), (np.dtype("float32"), 4)]  # float16 widened


def test_clear_errors():
    communication.release()
    with pytest.raises(CommunicationError, match="init"):
        P.AllReduce()((Tensor(np.ones(3, np.float32)),))
    with pytest.raises(CommunicationError, match="init"):
        communication.get_rank()
    with pytest.raises(CommunicationError, match="MPI only"):
        communication.init("nccl")
    with pytest.raises(ContextError, match="data_parallel"):
        context.set_auto_parallel_context(parallel_mode="semi_auto_parallel")
    with pytest.raises(ContextError, match="gradients_mean"):
        context.set_auto_parallel_context(gradients_mean="yes")
    context.reset_auto_parallel_context()


def _has_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def mpirun(n: int = 2) -> list[str]:
    """`mpirun -n N` as this machine allows it (as root: --allow-run-as-root)."""
    found = shutil.which("mpirun")
    if found is None or not _has_mpi4py():
        if os.environ.get("CI"):
            pytest.fail("CI needs Open MPI (mpirun) and mpi4py: .ci/run installs them")
        pytest.skip("needs Open MPI's mpirun and mpi4py (apt-get install openmpi-bin "
                    "libopenmpi-dev; pip install -e '.[test]')")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [found, "-n", str(n), *root, "--oversubscribe", "-x", "OMP_NUM_THREADS"]


def test_mpirun_two_ranks_average_over_mpi(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(f"""
        import numpy as np
        from graphkernel import Tensor, communication, nn
        communication.init()
        rank, size = communication.get_rank(), communication.get_group_size()
        class Reduce(nn.Cell):
            def __init__(self):
                super().__init__()
                self.reducer = nn.DistributedGradReducer([0, 1], mean=True)
            def construct(self, a, b):
                return self.reducer((a * 2.0, b))
        a = np.full((3, 4), rank + 1, np.float32)
        b = np.arange(5, dtype=np.float64) * (rank + 1)
        out = Reduce()(Tensor(a), Tensor(b))
        np.savez({str(tmp_path)!r} + f"/rank{{rank}}.npz", a=out[0].asnumpy(),
                 b=out[1].asnumpy(), size=size)
    """))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(mpirun() + [sys.executable, str(script)], check=True, env=env, timeout=600,
                   capture_output=True)
    for rank in (0, 1):
        got = np.load(tmp_path / f"rank{rank}.npz")
        assert int(got["size"]) == 2
        np.testing.assert_array_equal(got["a"], np.full((3, 4), 3.0, np.float32))  # (2+4)/2
        np.testing.assert_array_equal(got["b"], np.arange(5) * 1.5)


def test_mpirun_two_ranks_match_one_process_on_whole_batches(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = [sys.executable, EXAMPLE, "--steps", "6", "--out"]
    subprocess.run(mpirun() + run + [str(tmp_path / "dp")],
                   check=True, env=env, timeout=600, capture_output=True)
    subprocess.run(run + [str(tmp_path / "one"), "--single"], check=True, env=env, timeout=600,
                   capture_output=True)
    rank0, rank1 = np.load(tmp_path / "dp.rank0.npz"), np.load(tmp_path / "dp.rank1.npz")
    one = np.load(tmp_path / "one.npz")
    assert set(rank0) == set(one) and len(one) == 4
    for name in one:
        np.testing.assert_array_equal(rank0[name], rank1[name])  # the very same weights
        np.testing.assert_allclose(rank0[name], one[name], rtol=1e-5, atol=1e-6)
