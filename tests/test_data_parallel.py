"""Data parallel: the AllReduce op and nn.DistributedGradReducer sum (or average) tensors over
the process group in one buffer per dtype; under `mpirun -n 2` over MPI itself."""
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
