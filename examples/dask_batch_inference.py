"""Batch inference of an exported graph over a chunked Dask array, and Dask's cost per chunk.

    .venv/bin/python examples/dask_batch_inference.py                 # a LocalCluster here
    .venv/bin/python examples/dask_batch_inference.py --scheduler tcp://host:8786

Needs the examples extra (Dask): `.venv/bin/pip install -e '.[examples]'`.

Exports a small MLP (batch 256), runs it over a Dask array of `--rows` rows in chunks of
`--chunk` rows, checks the result against the local run, then prints the time per chunk on the
cluster against the same chunks run in this process: the difference is Dask's overhead per chunk
(scheduling, moving the chunk and its result, one task's bookkeeping).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

import numpy as np

import graphkernel
from graphkernel import Tensor, context, nn
from graphkernel.tools.dask_inference import ExportedGraph, run_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scheduler", help="a dask scheduler address (default: a LocalCluster)")
    parser.add_argument("--workers", type=int, default=1, help="LocalCluster worker processes")
    parser.add_argument("--rows", type=int, default=256 * 64)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import dask.array as da
    from distributed import Client, LocalCluster

    context.set_context(enable_graph_kernel=True)
    net = nn.SequentialCell([nn.Dense(64, 128), nn.GELU(), nn.LayerNorm((128,)),
                             nn.Dense(128, 10), nn.Softmax()])
    folder = tempfile.mkdtemp()
    path = graphkernel.export(net, Tensor(np.zeros((256, 64), np.float32)),
                              file_name=os.path.join(folder, "mlp"))
    x = np.random.default_rng(0).standard_normal((args.rows, 64)).astype(np.float32)

    if args.scheduler:
        client = Client(args.scheduler)
    else:
        client = Client(LocalCluster(n_workers=args.workers, threads_per_worker=1,
                                     dashboard_address=None, silence_logs=40))
    model = ExportedGraph.from_file(path).register(client)
    darray = da.from_array(x, chunks=(args.chunk, 64)).persist()  # chunks on the workers
    chunks = darray.numblocks[0]
    result = model.map_blocks(darray).compute()  # first run: each worker compiles once

    local_cell = nn.GraphCell(graphkernel.load(path))
    local = np.concatenate([run_rows(local_cell, threading.Lock(), [x[i:i + args.chunk]], 0,
                                     False) for i in range(0, len(x), args.chunk)])
    print(f"results equal the local run: {np.array_equal(result, local)}")

    dask_times, local_times = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        model.map_blocks(darray).sum().compute()  # the sum keeps the results on the workers
        dask_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        for i in range(0, len(x), args.chunk):
            run_rows(local_cell, threading.Lock(), [x[i:i + args.chunk]], 0, False).sum()
        local_times.append(time.perf_counter() - start)
    workers = len(client.scheduler_info()["workers"])
    d, loc = statistics.median(dask_times), statistics.median(local_times)
    print(f"{chunks} chunks of {args.chunk} rows on {workers} worker(s): dask "
          f"{d / chunks * 1e3:.2f} ms per chunk, in-process {loc / chunks * 1e3:.2f} ms per "
          f"chunk; overhead {(d * workers - loc) / chunks * 1e3:.2f} ms per chunk "
          f"(median of {args.repeats})")
    client.close()


if __name__ == "__main__":
    main()
