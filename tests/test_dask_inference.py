"""Batch inference of an exported graph on dask.distributed: a LocalCluster of two worker
processes gives the local results, each worker loads the file once."""
import os

import numpy as np
import pytest

if not os.environ.get("CI"):  # CI (.ci/run) installs the test extra: there a missing one fails
    pytest.importorskip("distributed", reason="pip install -e '.[test]' (dask, pandas)")
import dask.array as da  # noqa: E402
import dask.dataframe as dd  # noqa: E402
import distributed  # noqa: E402
import pandas as pd  # noqa: E402

import graphkernel  # noqa: E402
from graphkernel import Tensor, nn  # noqa: E402
from graphkernel.errors import InputError  # noqa: E402
from graphkernel.frontend import context  # noqa: E402
from graphkernel.tools.dask_inference import (  # noqa: E402
    ExportedGraph,
    compiles_in_this_process,
    loads_in_this_process,
)

BATCH, FEATURES, CLASSES = 16, 10, 4


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None, silence_logs=40) as cluster, \
            distributed.Client(cluster) as c:
        yield c


@pytest.fixture
def exported(tmp_path):
    context.set_context(enable_graph_kernel=True)
    net = nn.SequentialCell([nn.Dense(FEATURES, 32), nn.GELU(), nn.LayerNorm((32,)),
                             nn.Dense(32, CLASSES), nn.Softmax()])
    x = np.zeros((BATCH, FEATURES), np.float32)
    path = graphkernel.export(net, Tensor(x), file_name=str(tmp_path / "net"))
    return path, net


@pytest.fixture
def exported_generic(tmp_path):
    """The same network exported shape-generic: its batch dimension declared dynamic."""
    context.set_context(enable_graph_kernel=True)
    net = nn.SequentialCell([nn.Dense(FEATURES, 32), nn.GELU(), nn.LayerNorm((32,)),
                             nn.Dense(32, CLASSES), nn.Softmax()])
    net.set_inputs(Tensor(shape=[None, FEATURES], dtype=graphkernel.float32))
    x = np.zeros((BATCH, FEATURES), np.float32)
    return graphkernel.export(net, Tensor(x), file_name=str(tmp_path / "generic")), net


def local(net, x):
    """The local run, batch by batch."""
    return np.concatenate([net(Tensor(x[i:i + BATCH])).asnumpy()
                           for i in range(0, len(x), BATCH)])


def assert_matches_local(got, want):
    """Dask's workers run BLAS on one thread (distributed's nanny sets OPENBLAS_NUM_THREADS=1),
    this process on its own count: OpenBLAS may pick another kernel for the Dense products and
    round their sums (10 and 32 float32 terms) otherwise, a last-bit difference (101 of 332
    elements on an AMD EPYC host). The softmax outputs are at most 1: 1e-5 holds the worst
    case of those sums' rounding with room, and any wrong row is off by far more."""
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dask_array_on_two_worker_processes_matches_the_local_run(client, exported, rng):
    path, net = exported
    x = rng.standard_normal((BATCH * 12, FEATURES)).astype(np.float32)
    model = ExportedGraph.from_file(path).register(client)
    darray = da.from_array(x, chunks=(BATCH * 2, FEATURES))  # 6 chunks over 2 workers
    y = model.map_blocks(darray)
    assert y.shape == (len(x), CLASSES) and y.dtype == np.float32
    assert_matches_local(y.compute(), local(net, x))
    # Both workers ran chunks; each loaded the graph once and kept it.
    counts = client.run(loads_in_this_process)
    assert len(counts) == 2 and all(n == 1 for n in counts.values())
    assert_matches_local(model.map_blocks(darray * 2).compute(), local(net, x * 2))
    assert all(n == 1 for n in client.run(loads_in_this_process).values())


def test_dask_dataframe_columns_as_input(client, exported, rng):
    path, net = exported
    x = rng.standard_normal((BATCH * 5 + 3, FEATURES)).astype(np.float32)
    names = [f"f{i}" for i in range(FEATURES)]
    frame = dd.from_pandas(pd.DataFrame(x, columns=names), npartitions=3)
    model = ExportedGraph.from_file(path).register(client)
    out = model.map_partitions(frame, names, pad=True).compute()
    assert list(out.columns) == [f"out{i}" for i in range(CLASSES)]
    padded = np.concatenate([x, np.zeros((BATCH - len(x) % BATCH, FEATURES), np.float32)])
    assert_matches_local(out.to_numpy(), local(net, padded)[:len(x)])


def test_ragged_chunks_are_refused_without_pad(client, exported, rng):
    path, _ = exported
    x = rng.standard_normal((BATCH * 2 + 5, FEATURES)).astype(np.float32)
    model = ExportedGraph.from_file(path).register(client)
    with pytest.raises(InputError, match="not a multiple of the exported batch of 16"):
        model.map_blocks(da.from_array(x, chunks=(BATCH * 2, FEATURES))).compute()
    with pytest.raises(InputError, match="takes 1 input"):
        model.map_blocks(da.from_array(x), da.from_array(x))


def test_empty_chunks_and_partitions_give_empty_results(client, exported, rng):
    path, net = exported
    x = rng.standard_normal((BATCH * 4, FEATURES)).astype(np.float32)
    model = ExportedGraph.from_file(path).register(client)
    # A 0-row chunk between full ones, and an array of no rows at all.
    darray = da.from_array(x, chunks=((BATCH * 2, 0, BATCH * 2), (FEATURES,)))
    assert_matches_local(model.map_blocks(darray).compute(), local(net, x))
    nothing = model.map_blocks(da.from_array(x[:0], chunks=(BATCH, FEATURES))).compute()
    assert nothing.shape == (0, CLASSES) and nothing.dtype == np.float32
    # A filter leaves the middle partitions empty (and with pad=True, the last one ragged).
    names = [f"f{i}" for i in range(FEATURES)]
    x[BATCH:BATCH * 3, 0] = 100.0
    frame = dd.from_pandas(pd.DataFrame(x, columns=names), npartitions=4)
    kept = frame[frame.f0 < 50]
    assert [len(p) for p in kept.partitions] == [BATCH, 0, 0, BATCH]
    out = model.map_partitions(kept, names).compute()
    rows = x[x[:, 0] < 50]
    np.testing.assert_array_equal(out.index, np.flatnonzero(x[:, 0] < 50))
    assert_matches_local(out.to_numpy(), local(net, rows))
    none_left = model.map_partitions(frame[frame.f0 > 1000], names).compute()
    assert none_left.shape == (0, CLASSES)


def test_a_string_column_is_refused_by_name(client, exported, rng):
    path, _ = exported
    names = [f"f{i}" for i in range(FEATURES)]
    table = pd.DataFrame(rng.standard_normal((BATCH, FEATURES)).astype(np.float32),
                         columns=names)
    table["f3"] = "a"
    model = ExportedGraph.from_file(path).register(client)
    with pytest.raises(InputError, match="column 'f3' holds .* not numbers"):
        model.map_partitions(dd.from_pandas(table, npartitions=2), names)
    with pytest.raises(InputError, match=r"\['nope'\] are not in the dataframe"):
        model.map_partitions(dd.from_pandas(table, npartitions=2), names[:-1] + ["nope"])
    # A partition whose data is not what the dataframe's meta promised is caught on the worker.
    lying = dd.from_pandas(table, npartitions=2).map_partitions(
        lambda part: part, meta=table.iloc[:0].astype({"f3": np.float32}))
    with pytest.raises(InputError, match="column 'f3' holds"):
        model.map_partitions(lying, names).compute()
    with pytest.raises(InputError, match="input .* is not numbers"):
        model.map_blocks(da.from_array(np.full((BATCH, FEATURES), "x"))).compute()


def test_a_shape_generic_export_runs_ragged_chunks_without_pad(client, exported_generic, rng):
    path, net = exported_generic
    model = ExportedGraph.from_file(path).register(client)
    assert model.batch is None
    x = rng.standard_normal((10, FEATURES)).astype(np.float32)
    y = model.map_blocks(da.from_array(x, chunks=(4, FEATURES)))  # chunks of 4, 4 and 2 rows
    assert y.chunks[0] == (4, 4, 2)
    assert_matches_local(y.compute(), net(Tensor(x)).asnumpy())  # one process, all 10 rows
    # Six chunks of five sizes over two workers: some worker ran several sizes, and each
    # compiled the graph once (or never, if it ran no chunk of it).
    x = rng.standard_normal((20, FEATURES)).astype(np.float32)
    ragged = da.from_array(x, chunks=((4, 4, 2, 3, 1, 6), (FEATURES,)))
    assert_matches_local(model.map_blocks(ragged).compute(), net(Tensor(x)).asnumpy())
    counts = client.run(compiles_in_this_process, model.checksum)
    assert len(counts) == 2 and all(n <= 1 for n in counts.values()) and \
        sum(counts.values()) >= 1, counts


def test_a_shape_generic_export_runs_an_empty_partition_without_pad(client, exported_generic,
                                                                   rng):
    path, net = exported_generic
    model = ExportedGraph.from_file(path).register(client)
    names = [f"f{i}" for i in range(FEATURES)]
    x = rng.standard_normal((23, FEATURES)).astype(np.float32)
    x[8:16, 0] = 100.0  # the filter below empties the second partition
    frame = dd.from_pandas(pd.DataFrame(x, columns=names), npartitions=3)
    kept = frame[frame.f0 < 50]
    assert [len(p) for p in kept.partitions] == [8, 0, 7]
    out = model.map_partitions(kept, names).compute()
    rows = x[x[:, 0] < 50]
    np.testing.assert_array_equal(out.index, np.flatnonzero(x[:, 0] < 50))
    assert_matches_local(out.to_numpy(), net(Tensor(rows)).asnumpy())
    counts = client.run(compiles_in_this_process, model.checksum)
    assert all(n <= 1 for n in counts.values()) and sum(counts.values()) >= 1, counts
