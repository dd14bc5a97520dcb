"""Two hosts over a real network stack (tests/netns.py: two network namespaces joined by a veth
pair, link-local addresses): data-parallel training over Open MPI's TCP transport, one rank per
namespace, ends with the weights of one process on the whole batches; a Dask scheduler in one
namespace with a worker in each runs the batch inference with the local results. Both runs'
traffic is seen on the veth's counters."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests import netns

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_digits_dp.py")
# Every process a test starts ends within this (each is also killed with the namespaces).
LIMIT_S = 120


@pytest.fixture(scope="module")
def hosts():
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    try:
        pair = netns.TwoHosts()
    except OSError as exc:  # a container without CAP_SYS_ADMIN, say
        pytest.skip(f"cannot make two network namespaces here: {exc}")
    try:
        yield pair
    finally:
        pair.close()


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}


def _veth_bytes(hosts) -> int:
    """Bytes namespace a's veth end has sent so far."""
    path = f"/sys/class/net/{hosts.interfaces[0]}/statistics/tx_bytes"
    done = subprocess.run(hosts.exec(0, ["cat", path]), capture_output=True, text=True,
                          check=True, timeout=20)
    return int(done.stdout)


def test_mpi_training_across_two_namespaces_matches_one_process(hosts, tmp_path):
    pytest.importorskip("mpi4py")
    pytest.importorskip("sklearn")
    steps, hidden = 6, 64
    run = [sys.executable, EXAMPLE, "--steps", str(steps), "--hidden", str(hidden), "--out"]
    sent = _veth_bytes(hosts)
    # Gradients in two buckets (the last layer's and first bias, 2.8 kB; the first weight, 16
    # kB), the first begun while the backward pass computes the second: Iallreduce over TCP.
    buckets = ["--bucket-mb", "0.005"]
    done = subprocess.run(hosts.mpirun_command(run + [str(tmp_path / "dp")] + buckets,
                                               env=["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"]),
                          env=_env(), capture_output=True, text=True, timeout=LIMIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    sent = _veth_bytes(hosts) - sent
    # One process on the whole batches: the example's own main, in this process.
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import train_digits_dp
    finally:
        sys.path.remove(os.path.dirname(EXAMPLE))
    train_digits_dp.main(run[2:] + [str(tmp_path / "one"), "--single"])
    rank0, rank1 = np.load(tmp_path / "dp.rank0.npz"), np.load(tmp_path / "dp.rank1.npz")
    one = np.load(tmp_path / "one.npz")
    assert set(rank0) == set(one) and len(one) == 4
    for name in one:
        np.testing.assert_array_equal(rank0[name], rank1[name])  # the very same weights
        np.testing.assert_allclose(rank0[name], one[name], rtol=1e-5, atol=1e-6)
    # The gradients crossed the veth: each step rank 0 sends at least half of them (a ring of
    # two ranks), float32, beside MPI's own wire-up.
    gradient_bytes = 4 * (64 * hidden + hidden + hidden * 10 + 10)
    assert sent >= steps * gradient_bytes // 2, sent


CLIENT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import dask.array as da
    import distributed
    from graphkernel.tools.dask_inference import ExportedGraph
    scheduler_file, path, data, out = sys.argv[1:5]
    with distributed.Client(scheduler_file=scheduler_file, timeout=60) as client:
        client.wait_for_workers(2, timeout=60)
        model = ExportedGraph.from_file(path).register(client)
        x = np.load(data)
        darray = da.from_array(x, chunks=(32, x.shape[1]))
        y = model.map_blocks(darray)
        futures = client.compute(y.to_delayed().ravel().tolist())
        blocks = client.gather(futures)
        hosts = sorted({client.who_has(f)[f.key][0].split("://")[1].rsplit(":", 1)[0]
                        for f in futures})
        np.save(out, np.concatenate(blocks))
        print(json.dumps(hosts))
""")


def test_dask_scheduler_and_workers_across_two_namespaces_match_one_process(hosts, tmp_path):
    pytest.importorskip("distributed")
    import graphkernel
    from graphkernel import Tensor, nn
    from graphkernel.frontend import context
    context.set_context(enable_graph_kernel=True)
    batch, features = 16, 10
    net = nn.SequentialCell([nn.Dense(features, 32), nn.GELU(), nn.LayerNorm((32,)),
                             nn.Dense(32, 4), nn.Softmax()])
    path = graphkernel.export(net, Tensor(np.zeros((batch, features), np.float32)),
                              file_name=str(tmp_path / "net"))
    x = np.random.default_rng(5).standard_normal((batch * 12, features)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = np.concatenate([net(Tensor(x[i:i + batch])).asnumpy()
                           for i in range(0, len(x), batch)])
    (tmp_path / "client.py").write_text(CLIENT)
    scheduler_file = str(tmp_path / "scheduler.json")
    started = []
    try:
        started.append(subprocess.Popen(hosts.exec(0, [
            sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", hosts.addresses[0],
            "--port", "0", "--no-dashboard", "--scheduler-file", scheduler_file]),
            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for host in (0, 1):
            started.append(subprocess.Popen(hosts.exec(host, [
                sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                scheduler_file, "--host", hosts.addresses[host], "--nthreads", "1",
                "--nworkers", "1", "--no-dashboard", "--no-nanny"]),
                env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        done = subprocess.run(hosts.exec(0, [
            sys.executable, str(tmp_path / "client.py"), scheduler_file, path,
            str(tmp_path / "x.npy"), str(tmp_path / "y.npy")]),
            env=_env(), capture_output=True, text=True, timeout=LIMIT_S)
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
    assert done.returncode == 0, done.stdout + done.stderr
    # Both namespaces' workers ran chunks: the results lay on both addresses.
    assert done.stdout.strip().splitlines()[-1] == '["169.254.77.1", "169.254.77.2"]'
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5, atol=1e-5)
