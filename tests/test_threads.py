"""Products split over OpenMP's threads (backends/c/c_gemm.py `emit_gemm`): in chunks of whole
16-row (column) panels, PRODUCT_CHUNKS_PER_THREAD per thread, handed out as threads come free,
so a thread that is descheduled or slower leaves its second chunk to the others instead of
stalling the step; a batch of small products hands out whole products likewise. The results are
numpy's at 1, 2 and 3 threads (each in a process of its own: OpenMP reads OMP_NUM_THREADS once),
and one thread still runs one BLAS call per product."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cells import ON, Fn, needs_openmp
from thread_child import run_at_threads

import graphkernel
from graphkernel.backends.c import c_gemm, c_gemm_packed
from graphkernel.backends.c.c_gemm import gemm_call, parallel_batch, thread_shape
from graphkernel.ops import operations as P

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def relu(x):
    return P.ReLU()(x)  # a kernel after the product: the plan has a library to hold the entry


def _product(m: int, k: int, n: int, rng):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    exe = graphkernel.compile(Fn(lambda a, b: relu(P.MatMul()(a, b))), a, b, options=ON)
    (step,) = [s for s in exe.plan.steps if s.op == "MatMul"]
    return exe, gemm_call(exe.plan, step)


@needs_openmp
def test_a_split_product_hands_out_panel_chunks_as_threads_come_free(rng, monkeypatch):
    monkeypatch.setattr(c_gemm_packed, "PACKED_PRODUCT_MIN_MNK", 0)  # BLAS's split, not ours
    exe, call = _product(300, 256, 100, rng)
    assert not call.one_thread
    source = exe.executable.library.source
    assert "#pragma omp for schedule(dynamic, 1)\n" \
           "      for (int64_t gk_chunk = 0; gk_chunk < gk_chunks; ++gk_chunk) {" in source
    assert f"gk_parts > 1 ? gk_parts * {c_gemm.PRODUCT_CHUNKS_PER_THREAD} : 1;" in source
    assert "omp_get_thread_num()" not in source  # no block tied to a thread's number


def test_each_blas_call_of_a_split_product_is_one_chunk_of_whole_panels(rng):
    """thread_shape (what the BLAS library is chosen for) is one chunk: 300 rows on two threads
    are 4 chunks of 80 (5 panels), not 2 blocks of 160; one thread runs the whole product."""
    _, call = _product(300, 256, 100, rng)
    assert c_gemm.PRODUCT_CHUNKS_PER_THREAD == 2
    assert thread_shape(call, 2) == (80, 100, 256)
    assert thread_shape(call, 3) == (64, 100, 256)  # 6 chunks of 50, rounded up to 4 panels
    assert thread_shape(call, 1) == (300, 100, 256)
    _, wide = _product(24, 256, 1000, rng)  # columns are the longer side: they are split
    assert thread_shape(wide, 2) == (24, 256, 256)


@needs_openmp
def test_a_batch_of_small_products_hands_out_whole_products(rng):
    q = rng.standard_normal((8, 12, 128, 64)).astype(np.float32)
    k = rng.standard_normal((8, 12, 128, 64)).astype(np.float32)
    exe = graphkernel.compile(Fn(lambda q, k: relu(P.BatchMatMul(transpose_b=True)(q, k))),
                              q, k, options=ON)
    (step,) = [s for s in exe.plan.steps if s.op == "BatchMatMul"]
    call = gemm_call(exe.plan, step)
    assert parallel_batch(call)
    source = exe.executable.library.source
    assert "#pragma omp parallel for schedule(dynamic, 1)\n    for (int64_t gk_b" in source
    assert "#pragma omp parallel for schedule(static)\n    for (int64_t gk_b" not in source


# Run in a process with OMP_NUM_THREADS set: the entry's result for products split by rows and
# by columns (sides not a multiple of 16, more chunks than panels at 3 threads), a batch of
# heads, and threaded kernels (bias + tanh, softmax rows), against numpy in float64; prints the
# largest error of each as JSON.
_CHILD = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/tests")
import graphkernel
from graphkernel import Tensor
from graphkernel.ops import operations as P
from cells import ON, Fn
from graphkernel.backends.c.c_gemm import gemm_call

rng = np.random.default_rng(7)
out = {}
cases = {"rows": (333, 256, 100), "columns": (24, 256, 1001), "few rows": (40, 512, 30)}
for name, (m, k, n) in cases.items():
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    exe = graphkernel.compile(Fn(lambda a, b: P.ReLU()(P.MatMul()(a, b))), a, b, options=ON)
    (step,) = [s for s in exe.plan.steps if s.op == "MatMul"]
    assert exe.executable.runner.entry is not None
    got = exe(Tensor(a), Tensor(b)).asnumpy()
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)
    out[name] = [float(np.abs(got - want).max()), gemm_call(exe.plan, step).one_thread]
q = rng.standard_normal((8, 12, 128, 64)).astype(np.float32)
k = rng.standard_normal((8, 12, 128, 64)).astype(np.float32)
exe = graphkernel.compile(Fn(lambda q, k: P.ReLU()(P.BatchMatMul(transpose_b=True)(q, k))),
                          q, k, options=ON)
got = exe(Tensor(q), Tensor(k)).asnumpy()
want = np.maximum(q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64), 0)
out["heads"] = [float(np.abs(got - want).max()), True]
x = rng.standard_normal((1024, 768)).astype(np.float32)
b = rng.standard_normal(768).astype(np.float32)
exe = graphkernel.compile(Fn(lambda x, b: (P.Tanh()(x + b) * x, P.Softmax()(x + b))), x, b,
                          options=ON)
y, s = (t.asnumpy() for t in exe(Tensor(x), Tensor(b)))
x64, b64 = x.astype(np.float64), b.astype(np.float64)
e = np.exp(x64 + b64 - (x64 + b64).max(-1, keepdims=True))
out["kernels"] = [max(float(np.abs(y - np.tanh(x64 + b64) * x64).max()),
                      float(np.abs(s - e / e.sum(-1, keepdims=True)).max())), True]
print("RESULT " + json.dumps(out))
"""


@needs_openmp
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_split_products_match_numpy_at_each_thread_count(threads):
    result = run_at_threads(_CHILD, threads)
    # float32 sums of k products of unit normals, against float64: well inside 1e-3
    for name, (error, _) in result.items():
        assert error < 1e-3, (name, threads, error)
    # the products large enough to split are split (not held to one thread)
    assert not result["rows"][1] and not result["columns"][1]


def test_thread_steps_measures_a_main_suite_workload_at_each_thread_count():
    """bench/thread_steps.py takes the main suite's workloads (issue #30's rows: the MLP block,
    the encoder layer, BERT-tiny) by key: fused, one process per thread count, the whole call
    timed on every thread the process has."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "bench.thread_steps", "suite:layernorm",
                           "--threads", "1,2", "--calls", "1", "--no-steps", "--json"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["threads"] for r in results] == ["1", "2"]
    for r in results:
        assert r["model"] == "suite:layernorm" and r["call_cpu"] > 0 and r["call_wall"] > 0
        assert r["steps"] == []  # --no-steps reached the per-thread-count process
        assert r["call_sleeps"] >= 0  # the threads' futex sleeps a call (OpenMP's wait)


def test_thread_steps_wait_variants_are_passive_or_a_bounded_spin():
    """--ab-wait compares OpenMP's passive wait with libgomp's bounded spin: a spin count needs
    the wait policy unset (PASSIVE overrides GOMP_SPINCOUNT), and anything else is refused."""
    from bench.thread_steps import wait_variant
    assert wait_variant("passive") == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_variant("spin:20000") == {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "20000"}
    with pytest.raises(SystemExit, match="neither"):
        wait_variant("spin:lots")


def test_thread_steps_children_run_without_openblas_coretype(monkeypatch):
    """The probe's processes run as the bench's do (bench/cli.py): OPENBLAS_CORETYPE=Haswell,
    set on some machines, held numpy's OpenBLAS to AVX2 kernels on an AVX-512 host."""
    from bench.thread_steps import bench_environ
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    env = bench_environ()
    assert "OPENBLAS_CORETYPE" not in env and "OPENBLAS_L2_SIZE" not in env
    assert env["OMP_NUM_THREADS"] == "2"
