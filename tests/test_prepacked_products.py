"""Products whose B is a constant or a weight no step writes keep B packed between calls
(backends/c/c_gemm_packed.py `prepacked_bytes`, runtime/builder.py `_add_product_workspaces`):
the plan names a `<product>.prepacked_B` workspace; the panels are packed on the first call
and read as they are after, until the weight's version moves (`Parameter.set_data`, item
writes). The results are float64 numpy's at 1, 2 and 3 threads (each in a process of its own:
OpenMP reads OMP_NUM_THREADS once) in every operand layout, at sizes past every tile edge,
split by rows (tall) and by column panels (wide), over a dynamic batch of rows, on the second
call, and after the weight changes."""
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
from graphkernel import Parameter, Tensor, nn
from graphkernel.backends.c import c_gemm_packed
from graphkernel.backends.c.c_gemm import gemm_call
from graphkernel.backends.c.c_gemm_packed import (
    PACKED_COPIED_A_LABEL,
    PACKED_PRODUCT_LABEL,
    packed_product,
)
from graphkernel.ops import operations as P
from graphkernel.runtime.plan import SlotRole

pytestmark = needs_openmp
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Lin(nn.Cell):
    def __init__(self, w: np.ndarray, ta: bool = False, tb: bool = False) -> None:
        super().__init__()
        self.w = Parameter(Tensor(w), name="w")
        self.mm = P.MatMul(transpose_a=ta, transpose_b=tb)

    def construct(self, x: Any) -> Any:
        return P.ReLU()(self.mm(x, self.w))


def _product(exe: Any) -> Any:
    (step,) = [s for s in exe.plan.steps if s.op == "MatMul"]
    return step


def test_the_plan_names_the_prepacked_weight(rng: Any) -> None:
    w = rng.standard_normal((256, 300)).astype(np.float32)
    x = rng.standard_normal((200, 256)).astype(np.float32)
    exe = graphkernel.compile(Lin(w), x, options=ON)
    step = _product(exe)
    slot = exe.plan.slots[step.reads[2]]
    assert slot.role is SlotRole.WORKSPACE and slot.name == f"{step.name}.prepacked_B"
    assert slot.workspace is not None and slot.workspace.kept
    assert slot.workspace.sources == (step.reads[1],)
    assert exe.plan.slots[step.reads[1]].role is SlotRole.WEIGHT
    # the header, then B's 10 panels of 32 columns by 256 rows
    assert slot.type.shape == (128 + 10 * 256 * 32 * 4,)
    call = gemm_call(exe.plan, step)
    assert call is not None and call.prepacked == slot.index and packed_product(call)
    assert step.attrs.get("gemm_library") == PACKED_PRODUCT_LABEL
    text = exe.plan.describe()
    assert f"{step.name}.prepacked_B" in text and f"blas='{PACKED_PRODUCT_LABEL}'" in text
    source = exe.executable.library.source
    assert "gk_h[9] = 1;" in source  # packed when stale only
    assert "gk_pk_cols_r(32 * gk_lo" in source  # 200 rows < 300 columns: split by column panels
    assert "gk_pk_buffer((size_t)" not in source  # no per-call pack buffer


def test_a_wide_product_copies_rows_of_a_that_share_l1_sets_once_for_all_threads(
        rng: Any) -> None:
    # 70 rows of A 4 KiB apart, 1100 columns: split by column panels, all of A read once a
    # block of 256 columns (5 times a call), so it is copied 1040 floats apart once, first
    w = rng.standard_normal((1024, 1100)).astype(np.float32)
    x = rng.standard_normal((70, 1024)).astype(np.float32)
    exe = graphkernel.compile(Lin(w), x, options=ON)
    assert _product(exe).attrs.get("gemm_library") == PACKED_COPIED_A_LABEL
    source = exe.executable.library.source
    assert "float *gk_As = gk_pk_shared_a((size_t)72800);" in source  # 70 x 1040
    assert "gk_pk_copy_row(1024, gk_A + gk_r * 1024, gk_As + gk_r * 1040);" in source
    assert "gk_pk_cols_r(32 * gk_lo, 32 * gk_hi < 1100 ? 32 * gk_hi : 1100, gk_m, 1100, " \
        "1024, gk_Ar, gk_ra, gk_Bp, gk_C, 1100);" in source
    want = np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0)
    np.testing.assert_allclose(exe(Tensor(x)).asnumpy(), want, rtol=1e-4, atol=1e-4)
    # 600 columns: A read 3 times a call, not worth its copy (COLS_COPY_A_MIN_N)
    narrow = graphkernel.compile(Lin(w[:, :600].copy()), x, options=ON)
    assert _product(narrow).attrs.get("gemm_library") == PACKED_PRODUCT_LABEL
    assert "gk_pk_shared_a((size_t)" not in narrow.executable.library.source


def test_a_product_of_inputs_or_of_a_written_weight_is_not_prepacked(rng: Any) -> None:
    # sizes no other test file compiles this product at: the session's kernel cache keeps
    # plan records, whose key does not see the module settings other tests patch
    a = rng.standard_normal((310, 256)).astype(np.float32)
    b = rng.standard_normal((256, 110)).astype(np.float32)
    exe = graphkernel.compile(Fn(lambda a, b: P.ReLU()(P.MatMul()(a, b))), a, b, options=ON)
    step = _product(exe)
    assert len(step.reads) == 2 and not exe.plan.workspace_slots()
    assert "prepacked_B" not in exe.plan.describe()


def test_prepacking_off_packs_per_call(rng: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c_gemm_packed, "PREPACK_CONSTANT_B", False)
    w = rng.standard_normal((256, 100)).astype(np.float32)
    x = rng.standard_normal((300, 256)).astype(np.float32)
    exe = graphkernel.compile(Lin(w), x, options=ON)
    assert len(_product(exe).reads) == 2 and not exe.plan.workspace_slots()
    assert "gk_pk_buffer((size_t)" in exe.executable.library.source


# (m, k, n, transpose_a, transpose_b): tall ones split by rows, wide ones by column panels;
# rows past the last 12- and 4-row strip, columns past the last whole panel (one past 16,
# one under), k past the 768 block and not a multiple of 16 (the transposed pack's edge)
CASES = [(1027, 800, 1000, False, True), (333, 256, 100, False, False),
         (250, 1000, 50, True, False), (297, 781, 209, True, True), (4000, 40, 40, False, True),
         (61, 300, 1001, False, False), (130, 777, 700, False, True), (25, 1030, 2050, True, False),
         # wide, A's rows 4 KiB apart: copied apart once, shared (n 1100), read in place (n 600)
         (70, 1024, 1100, False, False), (100, 1024, 600, False, True)]

_CHILD = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/tests")
import graphkernel
from graphkernel import Tensor
from graphkernel.ops import operations as P
from cells import ON
from test_prepacked_products import Lin
from graphkernel.backends.c.c_gemm import gemm_call
from graphkernel.backends.c.c_gemm_packed import copies_a

rng = np.random.default_rng(12)
out = []

def error(got, x, w, ta, tb):
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = np.maximum((x64.T if ta else x64) @ (w64.T if tb else w64), 0)
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))

for m, k, n, ta, tb in json.loads(sys.argv[2]):
    x = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    w = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    net = Lin(w, ta, tb)
    exe = graphkernel.compile(net, x, options=ON)
    (step,) = [s for s in exe.plan.steps if s.op == "MatMul"]
    assert exe.executable.runner.entry is not None
    call = gemm_call(exe.plan, step)
    assert call.prepacked is not None
    first = exe(Tensor(x)).asnumpy()
    second = exe(Tensor(x)).asnumpy()
    # written behind the version word's back: the kept panels (the old weight) are read
    net.w._array[...] = 0
    stale = exe(Tensor(x)).asnumpy()
    w2 = rng.standard_normal(w.shape).astype(np.float32)
    net.w[...] = Tensor(w2)  # bumps the version: packed again
    third = exe(Tensor(x)).asnumpy()
    out.append([error(first, x, w, ta, tb), error(second, x, w, ta, tb),
                error(stale, x, w, ta, tb), error(third, x, w2, ta, tb),
                float(np.abs(stale).max()), copies_a(call)])

# a dynamic row count: a batch of sequences times a weight (rows 128 N), batches 3, 1, 0, 5
from graphkernel import nn
from graphkernel.frontend import context
context.set_context(enable_graph_kernel=True)
w = rng.standard_normal((300, 200)).astype(np.float32)
net = Lin(w)
net.set_inputs(Tensor(shape=[None, 128, 300], dtype=graphkernel.float32))
for batch in (3, 1, 0, 5):
    x = rng.standard_normal((batch, 128, 300)).astype(np.float32)
    got = net(Tensor(x)).asnumpy()
    exe = next(iter(net._compiled.values()))
    (step,) = [s for s in exe.plan.steps if s.op == "MatMul"]
    call = gemm_call(exe.plan, step)
    assert call.symbols and call.prepacked is not None and exe.executable.runner.entry
    e = error(got, x, w, False, False) if batch else 0.0
    out.append([e, e, e, e, 0.0, copies_a(call)])
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_prepacked_products_match_numpy(threads: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", _CHILD, ROOT, json.dumps(CASES)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert len(result) == len(CASES) + 4
    for case, (first, second, stale, third, zeroed, copied) in zip(CASES, result):
        assert first < 1e-5 and second < 1e-5 and third < 1e-5, (case, threads)
        m, k, n = case[:3]
        # rows 2 or 4 KiB apart; split by columns, copied only where n is at least 1024
        assert copied == (not case[3] and k % 512 == 0 and (m >= n or n >= 1024)), case
        one_thread = c_gemm_packed.PREPACKED_ONE_THREAD
        if threads > 1 or one_thread is not None and min(k, n) >= one_thread:
            assert stale < 1e-5, (case, threads, "the kept panels were not read")
        else:  # one thread runs BLAS's one call on the weight as it is now (zeros)
            assert zeroed == 0, (case, threads)
    for first, *_ in result[len(CASES):]:
        assert first < 1e-5
