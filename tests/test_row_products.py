"""A row, or a few, times a transposed matrix (a classifier at batch 1 to 8) on graphkernel's
row-vector kernel (backends/c/c_gemm_row.py): the compiled entry runs `gk_row_sgemv` instead of
a BLAS GEMM, on one thread for a small W and over OpenMP's threads for a large one, with numpy's
results, the Python runner's and fusion off's; products of more rows, a batch axis or B not
transposed stay on BLAS."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cells import OFF, ON, Fn, needs_openmp

import graphkernel
from graphkernel import Tensor
from graphkernel.backends.c.c_gemm import gemm_call
from graphkernel.backends.c.c_gemm_row import (
    ROW_PRODUCT_LABEL,
    ROW_PRODUCT_MAX_ROWS,
    ROW_PRODUCT_PARALLEL_MIN,
    row_parallel,
    row_product,
)
from graphkernel.ops import operations as P

pytestmark = needs_openmp


def classifier(x: Any, w: Any, b: Any) -> Any:
    return P.ReLU()(P.BiasAdd()(P.MatMul(transpose_b=True)(x, w), b))


def products(exe: Any) -> list[Any]:
    return [s for s in exe.plan.steps if s.op in ("MatMul", "BatchMatMul")]


def by_runner(exe: Any, *arrays: np.ndarray) -> np.ndarray:
    ex = exe.executable
    return ex.runner.run(ex.check_inputs(list(arrays)), exe._weights())[0]


@pytest.mark.parametrize("rows", [1, 3, ROW_PRODUCT_MAX_ROWS])
@pytest.mark.parametrize("k,n", [(37, 5), (512, 1000), (576, 1024), (1000, 77), (16, 4097)])
def test_a_row_times_a_transposed_matrix_runs_on_the_row_kernel(k: int, n: int, rows: int,
                                                                 rng: Any) -> None:
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    exe = graphkernel.compile(Fn(classifier), x, w, b, options=ON)
    (step,) = products(exe)
    assert exe.executable.runner.entry is not None
    call = gemm_call(exe.plan, step)
    assert call is not None and row_product(call)
    assert step.attrs.get("gemm_library") == ROW_PRODUCT_LABEL
    assert f"blas='{ROW_PRODUCT_LABEL}'" in exe.plan.describe()
    source = exe.executable.library.source
    assert f"gk_row_sgemv(gk_rows, {k}," in source if n * k >= ROW_PRODUCT_PARALLEL_MIN else \
        f"gk_row_sgemv({n}, {k}," in source
    assert row_parallel(call) == (n * k >= ROW_PRODUCT_PARALLEL_MIN and n > 16)
    assert "gk_sgemm(101" not in source  # no BLAS call left
    want = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + b, 0)
    for _ in range(2):  # a second call reads the same W again
        got = exe(Tensor(x), Tensor(w), Tensor(b)).asnumpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    np.testing.assert_allclose(by_runner(exe, x, w, b), got, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    off = graphkernel.compile(Fn(classifier), x, w, b, options=OFF)
    np.testing.assert_allclose(off(Tensor(x), Tensor(w), Tensor(b)).asnumpy(), got,
                               rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_a_row_of_a_wider_input_reads_its_own_offset(rng: Any) -> None:
    # The row is a slice of a larger tensor: the product reads A at its offset in place.
    def second_row(x: Any, w: Any) -> Any:
        return P.ReLU()(P.MatMul(transpose_b=True)(P.StridedSlice()(x, (1, 0), (2, 64),
                                                                     (1, 1)), w))
    x = rng.standard_normal((3, 64)).astype(np.float32)
    w = rng.standard_normal((2000, 64)).astype(np.float32)
    exe = graphkernel.compile(Fn(second_row), x, w, options=ON)
    (step,) = products(exe)
    call = gemm_call(exe.plan, step)
    assert call is not None and row_product(call) and call.a.offset == 64
    got = exe(Tensor(x), Tensor(w)).asnumpy()
    np.testing.assert_allclose(got, np.maximum(x[1:2] @ w.T, 0), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("case", ["more rows", "B not transposed", "a batch axis", "float64"])
def test_other_products_stay_on_blas(case: str, rng: Any) -> None:
    rows = ROW_PRODUCT_MAX_ROWS + 1 if case == "more rows" else 1
    dtype = np.float64 if case == "float64" else np.float32
    x = rng.standard_normal((rows, 256)).astype(dtype)
    if case == "B not transposed":
        w = rng.standard_normal((256, 512)).astype(dtype)
        fn = Fn(lambda x, w: P.ReLU()(P.MatMul()(x, w)))
        want = np.maximum(x @ w, 0)
    elif case == "a batch axis":
        x = rng.standard_normal((3, 1, 256)).astype(dtype)
        w = rng.standard_normal((3, 512, 256)).astype(dtype)
        fn = Fn(lambda x, w: P.ReLU()(P.BatchMatMul(transpose_b=True)(x, w)))
        want = np.maximum(x @ np.swapaxes(w, -1, -2), 0)
    else:
        w = rng.standard_normal((512, 256)).astype(dtype)
        fn = Fn(lambda x, w: P.ReLU()(P.MatMul(transpose_b=True)(x, w)))
        want = np.maximum(x @ w.T, 0)
    exe = graphkernel.compile(fn, x, w, options=ON)
    (step,) = products(exe)
    call = gemm_call(exe.plan, step)
    assert call is not None and not row_product(call)
    assert step.attrs.get("gemm_library") != ROW_PRODUCT_LABEL
    source = exe.executable.library.source
    assert source.count("gk_row_sgemv(") == source.count("static void gk_row_sgemv(")
    np.testing.assert_allclose(exe(Tensor(x), Tensor(w)).asnumpy(), want, rtol=1e-4, atol=1e-3)

