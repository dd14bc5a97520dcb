"""Data parallel: the AllReduce op and nn.DistributedGradReducer sum (or average) tensors over
the process group in one buffer per dtype; TrainOneStepCell averages its gradients in one
AllReduce per step; under `mpirun -n 2` over MPI itself, two ranks on half batches end with the
weights of one process on the whole batches."""
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

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

    def allgather(self, buffer: np.ndarray) -> np.ndarray:
        return np.stack([buffer] * self.size)

    def start_allreduce_sum(self, buffer: np.ndarray) -> "TwinRanks.Pending":
        """The sum begun now, done at `wait()` (where the order of calls is recorded)."""
        self.calls.append(("start", buffer.dtype, buffer.size))
        return TwinRanks.Pending(self, buffer)

    class Pending:
        def __init__(self, group: "TwinRanks", buffer: np.ndarray) -> None:
            self.group, self.buffer = group, buffer

        def wait(self) -> None:
            self.group.calls.append(("wait", self.buffer.dtype, self.buffer.size))
            self.buffer *= self.group.size


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


def _buckets_train(bucket_mb, fusion, steps=3):
    context.set_context(enable_graph_kernel=fusion)
    context.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True,
                                      grad_bucket_mb=bucket_mb)
    net = nn.SequentialCell([nn.Dense(8, 16, seed=0), nn.ReLU(), nn.Dense(16, 16, seed=1),
                             nn.ReLU(), nn.Dense(16, 3, seed=2)])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    rng = np.random.default_rng(3)
    x = Tensor(rng.standard_normal((12, 8)).astype(np.float32))
    y = Tensor(rng.integers(0, 3, 12).astype(np.int32))
    for _ in range(steps):
        step(x, y)
    context.reset_auto_parallel_context()
    from graphkernel.frontend.compile import compile
    plan = compile(step, x, y).plan
    return [p.asnumpy() for _, p in net.parameters_and_names()], plan


@pytest.mark.parametrize("fusion", [True, False])
def test_gradient_buckets_overlap_the_backward_pass_with_the_same_results(twin, fusion):
    whole, _ = _buckets_train(None, fusion)
    whole_calls = list(twin.calls)
    twin.calls.clear()
    # 0.0003 MB = 300 bytes, last gradient first: 3 + 16*3 + 16 floats (268 bytes), 16*16
    # (larger than a bucket: alone), 16, and 8*16 floats.
    bucketed, plan = _buckets_train(0.0003, fusion)
    for a, b in zip(whole, bucketed):
        np.testing.assert_array_equal(b, a)  # each element the same sum: the same weights
    f32 = np.dtype("float32")
    assert whole_calls == [(f32, 8 * 16 + 16 + 16 * 16 + 16 + 16 * 3 + 3)] * 3
    buckets = [(f32, 3 + 16 * 3 + 16), (f32, 16 * 16), (f32, 16), (f32, 8 * 16)]
    assert twin.calls == ([("start", *b) for b in buckets] + [("wait", *b) for b in buckets]) * 3
    # In the plan, the last layers' sums begin before the backward pass's last product (the
    # first layer's weight gradient), and all are waited for before any update.
    steps = [s.op or s.name for s in plan.steps]
    starts = [i for i, op in enumerate(steps) if op == "AllReduceStart"]
    (wait,) = [i for i, op in enumerate(steps) if op == "AllReduceWait"]
    products = [i for i, s in enumerate(plan.steps) if s.op == "MatMul"]
    assert len(starts) == 4 and starts[0] < starts[1] < products[-1] < starts[-1] < wait
    updates = [i for i, s in enumerate(plan.steps) if "ApplyMomentum" in s.name]
    assert updates and min(updates) > wait


def test_gradient_bucket_size_is_checked():
    context.set_auto_parallel_context(grad_bucket_mb=25)
    assert context.get_auto_parallel_context("grad_bucket_mb") == 25
    for bad in (0, -1.0, float("nan"), "25", True):
        with pytest.raises(ContextError, match="grad_bucket_mb must be None or a positive"):
            context.set_auto_parallel_context(grad_bucket_mb=bad)
    context.reset_auto_parallel_context()
    assert context.get_auto_parallel_context("grad_bucket_mb") is None


def test_all_reduce_sums_and_scales(twin):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones(4, np.float16)
    out = P.AllReduce(scale=0.25)((Tensor(a), Tensor(b)))
    np.testing.assert_array_equal(out[0].asnumpy(), a * 0.5)
    np.testing.assert_array_equal(out[1].asnumpy(), b * 0.5)
    assert out[1].dtype == np.float16
    assert twin.calls == [(np.dtype("float32"), 6), (np.dtype("float32"), 4)]  # float16 widened


def test_clear_errors(monkeypatch):
    communication.release()
    with pytest.raises(CommunicationError, match="init"):
        P.AllReduce()((Tensor(np.ones(3, np.float32)),))
    with pytest.raises(CommunicationError, match="init"):
        communication.get_rank()
    with pytest.raises(CommunicationError, match="MPI only"):
        communication.init("nccl")
    for timeout in (0, -1.0, float("nan"), "600", True):
        with pytest.raises(CommunicationError, match=r"timeout=.*positive number"):
            communication.init(timeout=timeout)
    monkeypatch.setenv("GRAPHKERNEL_COMM_TIMEOUT", "ten minutes")
    with pytest.raises(CommunicationError, match="GRAPHKERNEL_COMM_TIMEOUT='ten minutes'"):
        communication.init()
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


@pytest.mark.slow  # a training run in one process, then on two ranks
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


# A data-parallel job whose rank fails must end, on every rank, with that rank's error: not
# wait forever in the others' AllReduce (issue 31). Each job runs under a time limit of the
# test's own, so the test ends (failing) even where the job would not.
FAILING_RANKS = textwrap.dedent("""
    import sys, time
    import numpy as np
    from graphkernel import Tensor, communication, context, nn
    communication.init()
    rank = communication.get_rank()
    context.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
    fault = sys.argv[1]
    if fault == "sizes":  # a reducer of its own, without TrainOneStepCell's check
        nn.DistributedGradReducer([0])((Tensor(np.ones(4 + rank, np.float32)),))
    hidden = 17 if fault == "shape" and rank == 1 else 16
    dtype = np.float64 if fault == "dtype" and rank == 1 else np.float32
    net = nn.SequentialCell([nn.Dense(8, hidden, dtype=dtype, seed=0), nn.ReLU(),
                             nn.Dense(hidden, 3, dtype=dtype, seed=1)])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    rng = np.random.default_rng(3)
    for i in range(4):
        if rank == 1 and i == 2 and fault in ("raise", "stall", "exit"):
            print(f"failing at {time.time()!r}", flush=True)
            if fault == "stall":
                time.sleep(600)
            if fault == "exit":
                sys.exit("rank 1 leaves at step 2")
            raise RuntimeError("rank 1 breaks at step 2")
        step(Tensor(rng.standard_normal((6, 8)).astype(dtype)),
             Tensor(rng.integers(0, 3, 6).astype(np.int32)))
    print("finished", flush=True)
""")


def run_failing_ranks(tmp_path, fault: str, limit: float = 120.0, timeout: str = ""
                      ) -> tuple[int, dict[int, str]]:
    """Run FAILING_RANKS under `mpirun -n 2`; its exit status and what each rank printed.
    `timeout`: the ranks' $GRAPHKERNEL_COMM_TIMEOUT."""
    script = tmp_path / "failing_ranks.py"
    script.write_text(FAILING_RANKS)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRAPHKERNEL_COMM_TIMEOUT": timeout}
    job = subprocess.Popen(mpirun() + ["-x", "GRAPHKERNEL_COMM_TIMEOUT", "--tag-output",
                                       sys.executable, str(script), fault],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        out, _ = job.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        job.terminate()  # mpirun passes SIGTERM on to its ranks
        try:
            job.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, 9)
            job.communicate()
        pytest.fail(f"the MPI job ({fault}) did not end within {limit:g} s")
    # --tag-output marks each piece of output with its rank: "[job,rank]<stderr>:text".
    printed: dict[int, str] = {0: "", 1: ""}
    pieces = re.split(r"\[\d+,(\d+)\]<std(?:out|err)>:", out.decode(errors="replace"))
    for rank, text in zip(pieces[1::2], pieces[2::2]):
        printed[int(rank)] += text
    return job.returncode, printed


def test_mpirun_rank_raising_ends_the_job_on_every_rank(tmp_path):
    status, printed = run_failing_ranks(tmp_path, "raise")
    ended = time.time()
    raised = float(re.search(r"failing at ([0-9.]+)", printed[1]).group(1))
    assert ended - raised < 10.0, f"the job took {ended - raised:.1f} s to end"
    assert status != 0 and "finished" not in printed[0] + printed[1]
    # The failing rank prints its traceback and says it ends the job; the other rank reports
    # which rank failed, with what.
    assert "RuntimeError: rank 1 breaks at step 2" in printed[1]
    assert "rank 1 of 2 failed" in printed[1]
    assert "CommunicationError: rank 1 of 2 failed with RuntimeError: rank 1 breaks at step 2" \
        in printed[0]


@pytest.mark.parametrize("fault, rank1", [
    ("shape", "'0.weight' of shape (17, 8) and dtype float32"),
    ("dtype", "'0.weight' of shape (16, 8) and dtype float64")])
def test_mpirun_ranks_with_different_parameters_fail_on_every_rank(tmp_path, fault, rank1):
    status, printed = run_failing_ranks(tmp_path, fault)
    assert status != 0
    for rank in (0, 1):
        # Each rank names the first differing parameter and both ranks' values.
        report = re.search(r"CommunicationError: the ranks disagree on TrainOneStepCell's "
                           r"parameters: parameter #(\d+) \((.*?)\): rank 0 has (.*?), rank 1 "
                           r"has (.*?) \(seen by rank (\d)", printed[rank])
        assert report is not None, printed[rank]
        # Which rank saw it first is a race: a rank may print the other's report, relayed.
        assert report.group(4) == rank1 and int(report.group(5)) in (0, 1)
        assert report.group(3) == rank1.replace("17", "16").replace("float64", "float32")


def test_mpirun_collective_waiting_past_its_timeout_ends_the_job(tmp_path):
    # Rank 1 stops answering (sleeps) at step 2: rank 0's AllReduce gives up after 3 s.
    status, printed = run_failing_ranks(tmp_path, "stall", timeout="3")
    ended = time.time()
    stalled = float(re.search(r"failing at ([0-9.]+)", printed[1]).group(1))
    assert ended - stalled < 3.0 + 10.0, f"the job took {ended - stalled:.1f} s to end"
    assert status != 0 and "finished" not in printed[0] + printed[1]
    waited = (r"CommunicationError: AllReduce of \d+ float32 value\(s\) on rank 0 of 2: the "
              r"other ranks did not all join within 3 s")
    assert re.search(waited, printed[0]), printed[0]
    assert re.search("rank 0 of 2 failed with " + waited, printed[1]), printed[1]


def test_mpirun_rank_exiting_early_ends_the_job(tmp_path):
    # sys.exit on rank 1 at step 2 is no uncaught exception (no excepthook), but rank 1 leaves
    # the group at exit: rank 0, left waiting in its AllReduce, ends the job.
    status, printed = run_failing_ranks(tmp_path, "exit")
    ended = time.time()
    left = float(re.search(r"failing at ([0-9.]+)", printed[1]).group(1))
    assert ended - left < communication.STRANDED_S + 10.0, \
        f"the job took {ended - left:.1f} s to end"
    assert status != 0 and "finished" not in printed[0] + printed[1]
    assert "rank 1 leaves at step 2" in printed[1]
    # Rank 0 learns it waiting in the AllReduce ("left the group") or, when it reaches the
    # AllReduce after the notice came (a loaded machine), on entering it ("have left").
    assert re.search(r"CommunicationError: AllReduce of \d+ float32 value\(s\) on rank 0 of 2: "
                     r"rank\(s\) \[1\] (have )?left the group", printed[0]), printed[0]


def test_mpirun_ranks_reducing_different_sizes_end_the_job(tmp_path):
    # Rank 0 reduces 4 floats, rank 1 5: MPI fails the AllReduce (MPI_ERR_TRUNCATE) on a rank,
    # which reports it as a CommunicationError and ends the job.
    status, printed = run_failing_ranks(tmp_path, "sizes")
    assert status != 0 and "finished" not in printed[0] + printed[1]
    assert re.search(r"CommunicationError: AllReduce of [45] float32 value\(s\) on rank [01] of "
                     r"2 failed in MPI: MPI_ERR_TRUNCATE", printed[0] + printed[1]), printed
