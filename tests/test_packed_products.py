"""graphkernel's packed-B product (backends/c/c_gemm_packed.py): a float32 GEMM split over
threads packs B once into 32-column panels shared by every thread, then hands out row chunks.
The results are numpy's at 2 and 3 threads (each in a process of its own: OpenMP reads
OMP_NUM_THREADS once) in every operand layout, at sizes past every block and tile edge (rows
past the last 12- and 4-row strip, columns past the last panel and its first 16, k past the
k block and the 16 x 16 transposes), and over a dynamic batch of rows; one thread keeps BLAS's
one call; the choice is named."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from cells import ON, Fn, needs_openmp

import graphkernel
from graphkernel import Tensor
from graphkernel.backends.c import c_gemm_packed
from graphkernel.backends.c.c_gemm import gemm_call
from graphkernel.backends.c.c_gemm_packed import (
    PACKED_COPIED_A_LABEL,
    PACKED_PRODUCT_LABEL,
    copy_rows,
    copy_stride,
    packed_product,
    rows_per_l1_set,
)
from graphkernel.ops import operations as P

pytestmark = needs_openmp
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _compile(a: np.ndarray, b: np.ndarray, ta: bool = False, tb: bool = False) -> Any:
    op = P.MatMul(transpose_a=ta, transpose_b=tb)
    return graphkernel.compile(Fn(lambda a, b: P.ReLU()(op(a, b))), a, b, options=ON)


def _step(exe: Any) -> Any:
    (step,) = [s for s in exe.plan.steps if s.op == "MatMul"]
    return step


def test_a_large_float32_product_runs_on_the_packed_kernel(rng: Any) -> None:
    a = rng.standard_normal((300, 256)).astype(np.float32)
    b = rng.standard_normal((100, 256)).astype(np.float32)
    exe = _compile(a, b, tb=True)
    step = _step(exe)
    call = gemm_call(exe.plan, step)
    assert call is not None and packed_product(call) and not call.one_thread
    assert step.attrs.get("gemm_library") == PACKED_PRODUCT_LABEL
    assert f"blas='{PACKED_PRODUCT_LABEL}'" in exe.plan.describe()
    source = exe.executable.library.source
    # B (100 x 256, transposed) packed into 4 panels, once, split over the threads; then row
    # chunks handed out as threads come free; BLAS's call kept for one thread
    assert source.count("gk_pk_pack(gk_p, gk_p + 1, 100, 256, gk_B, 256, 1, gk_Bp);") == 1
    assert "gk_pk_buffer((size_t)32768)" in source
    # A's rows contiguous: the instance for that layout, its row stride the one argument
    assert "gk_pk_rows_r(gk_lo, gk_hi, 100, 256, gk_A, 256, gk_Bp, gk_C, 100);" in source
    # chunk c: strips c U / chunks to (c + 1) U / chunks (PACKED_EVEN_CHUNKS)
    assert "const int64_t gk_units = (gk_m + 11) / 12, gk_unit = 12, gk_side = gk_m;" in source
    assert "gk_lo = gk_unit * (gk_chunk * gk_units / gk_chunks);" in source
    assert "omp_get_max_threads() > 1 ?" in source
    assert source.count("gk_sgemm(101, 111, 112,") >= 1
    got = exe(Tensor(a), Tensor(b)).asnumpy()
    np.testing.assert_allclose(got, np.maximum(a @ b.T, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("what", ["float64", "small", "batch", "wide"])
def test_products_outside_the_rule_keep_blas(what: str, rng: Any) -> None:
    dtype = np.float64 if what == "float64" else np.float32
    shapes = {"float64": [(300, 256), (256, 100)], "small": [(64, 64), (64, 64)],
              "batch": [(4, 300, 256), (4, 256, 100)], "wide": [(100, 256), (256, 300)]}[what]
    a, b = (rng.standard_normal(s).astype(dtype) for s in shapes)
    op = P.BatchMatMul() if what == "batch" else P.MatMul()
    exe = graphkernel.compile(Fn(lambda a, b: P.ReLU()(op(a, b))), a, b, options=ON)
    (step,) = [s for s in exe.plan.steps if s.op in ("MatMul", "BatchMatMul")]
    assert step.attrs.get("gemm_library") != PACKED_PRODUCT_LABEL
    assert "gk_pk_rows_r(gk_lo" not in exe.executable.library.source
    # float32 sums of 256 terms of ~16 in magnitude, in BLAS's order per thread chunk: 1e-4
    np.testing.assert_allclose(exe(Tensor(a), Tensor(b)).asnumpy(), np.maximum(a @ b, 0),
                               rtol=1e-4, atol=1e-4)


def test_the_threshold_turns_the_kernel_off(rng: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c_gemm_packed, "PACKED_PRODUCT_MIN_MNK", 0)
    a = rng.standard_normal((300, 256)).astype(np.float32)
    b = rng.standard_normal((256, 100)).astype(np.float32)
    exe = _compile(a, b)
    assert _step(exe).attrs.get("gemm_library") != PACKED_PRODUCT_LABEL
    assert "gk_pk_rows_r(gk_lo" not in exe.executable.library.source


def test_rows_of_a_that_share_l1_sets_are_copied_apart(rng: Any) -> None:
    # rows of A 4 KiB apart all fall in one L1 set: copied 1040 floats apart, 240 rows at a
    # time; 768 floats apart (3 rows a set) they are read in place
    a = rng.standard_normal((600, 1024)).astype(np.float32)
    b = rng.standard_normal((1024, 200)).astype(np.float32)
    exe = _compile(a, b)
    assert _step(exe).attrs.get("gemm_library") == PACKED_COPIED_A_LABEL
    assert f"blas='{PACKED_COPIED_A_LABEL}'" in exe.plan.describe()
    source = exe.executable.library.source
    assert "gk_pk_rows_rc(gk_lo, gk_hi, 200, 1024, gk_A, 1024, 1040, 240, gk_Bp, gk_C, 200);" \
        in source
    np.testing.assert_allclose(exe(Tensor(a), Tensor(b)).asnumpy(), np.maximum(a @ b, 0),
                               rtol=1e-4, atol=1e-4)
    plain = _compile(a[:, :768].copy(), b[:768].copy())
    assert _step(plain).attrs.get("gemm_library") == PACKED_PRODUCT_LABEL
    assert "gk_pk_rows_rc(gk_lo" not in plain.executable.library.source
    # A transposed: each step of k reads one run of 12 floats, nothing to copy
    at = _compile(a.T.copy(), b, ta=True)
    assert _step(at).attrs.get("gemm_library") == PACKED_PRODUCT_LABEL


def test_the_copy_stride_puts_each_row_of_a_tile_in_a_set_of_its_own() -> None:
    assert [rows_per_l1_set(4 * k) for k in (768, 512, 1024, 3072, 1000)] == [3, 6, 12, 12, 1]
    assert copy_stride(3072) == 3088 and copy_stride(1024) == 1040 and copy_stride(100) == 112
    # rows copied at a time: 240, fewer (whole strips) where they would take over 4 MiB
    assert copy_rows(3072) == 240 and copy_rows(8192) == 120 and copy_rows(1 << 20) == 12
    for k in range(1, 5000, 7):
        stride = copy_stride(k)
        assert k <= stride < k + 16 * 8 and stride % 16 == 0, k
        assert rows_per_l1_set(4 * stride) == 1, k


# (m, k, n, transpose_a, transpose_b): rows past the last 12-row strip (and 4-row one), columns
# past the last whole panel (one past 16, one under), k past PACKED_KC's block and not a
# multiple of 16 (the transposed pack's edge), every layout; 30 rows: 3 strips, fewer than the
# chunks (some chunks empty)
CASES = [(1027, 800, 1000, False, True), (333, 256, 100, False, False),
         (250, 1000, 50, True, False), (297, 781, 209, True, True), (4000, 40, 40, False, True),
         (30, 4700, 30, True, False),
         # A's rows copied apart (4 KiB and 2 KiB apart): chunks past the 240 rows copied at a
         # time, with a short last block; k past the k block
         (2100, 1024, 70, False, True), (500, 512, 300, False, False)]

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
from graphkernel.backends.c.c_gemm_packed import copies_a, packed_product

rng = np.random.default_rng(11)
out = []
for m, k, n, ta, tb in json.loads(sys.argv[2]):
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    op = P.MatMul(transpose_a=ta, transpose_b=tb)
    exe = graphkernel.compile(Fn(lambda a, b: P.ReLU()(op(a, b))), a, b, options=ON)
    (step,) = [s for s in exe.plan.steps if s.op == "MatMul"]
    assert exe.executable.runner.entry is not None
    got = exe(Tensor(a), Tensor(b)).asnumpy()
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = np.maximum((a64.T if ta else a64) @ (b64.T if tb else b64), 0)
    call = gemm_call(exe.plan, step)
    out.append([float(np.abs(got - want).max() / np.abs(want).max()),
                packed_product(call), copies_a(call)])
# a dynamic row count: a batch of sequences times a matrix (rows 128 N), batches 3, 1 and 0
from graphkernel import nn
from graphkernel.frontend import context
context.set_context(enable_graph_kernel=True)

class Seq(nn.Cell):
    def construct(self, a, b):
        return P.ReLU()(P.MatMul()(a, b))

net = Seq()
net.set_inputs(Tensor(shape=[None, 128, 300], dtype=graphkernel.float32),
               Tensor(shape=[300, 200], dtype=graphkernel.float32))
b = rng.standard_normal((300, 200)).astype(np.float32)
for batch in (3, 1, 0):
    a = rng.standard_normal((batch, 128, 300)).astype(np.float32)
    got = net(Tensor(a), Tensor(b)).asnumpy()
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)
    exe = next(iter(net._compiled.values()))
    (step,) = [s for s in exe.plan.steps if s.op == "MatMul"]
    call = gemm_call(exe.plan, step)
    assert call is not None and call.symbols and exe.executable.runner.entry is not None
    assert got.shape == want.shape
    error = float(np.abs(got - want).max() / np.abs(want).max()) if batch else 0.0
    out.append([error, packed_product(call), copies_a(call)])
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("threads", [2, 3])
def test_packed_products_match_numpy_in_every_layout(threads: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", _CHILD, ROOT, json.dumps(CASES)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert len(result) == len(CASES) + 3  # and the dynamic rows' three batches
    for case, (error, packed, copied) in zip(CASES + [(None, 300, 200, False, False)] * 3,
                                             result):
        assert packed, case  # each case is one the kernel takes
        assert copied == (not case[3] and case[1] % 512 == 0), case  # rows 2 or 4 KiB apart
        assert error < 1e-5, (case, threads, error)
