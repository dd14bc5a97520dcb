"""graphkernel's row-vector product: one row, or a few (ROW_PRODUCT_MAX_ROWS), times a
transposed matrix (y = x W^T, W row-major n x k), the classifier at the end of a CNN at batch 1
to 8 (ResNet's 512/2048 x 1000, MobileNetV3's 576 x 1024 and 1024 x 1000).

BLAS took such a product as a one-row GEMM on one thread (too few multiply-adds to split,
runtime/builder.py `_blas_threads`), and above about a million multiply-adds OpenBLAS 0.3.31
took its general path, which copies all of W into packed panels on every call
(`sgemm_incopy`: 14% of ONNX MobileNetV3-small's call at batch 1). The weights come cold from
memory after the convolutions: the work is reading them once. Here each thread streams whole
rows of W, four at a time into four vector sums, over its share of 16-row chunks. Zen 5 EPYC,
2 vCPU, W cold (a 64 MiB copy between calls), one thread / two: 512 x 1000 107 / 67 us,
1024 x 1000 196 / 129 us (numpy's matmul on one thread: 149 and 304 us). Whole calls
alternated in one process: ONNX MobileNetV3-small b1 2.171 -> 1.756 ms, ResNet-50 b1 1.03x,
ResNet-18 b1 1.01x (docs/perf-notes.md, "Row-vector products").

Only the contiguous case (A's row in place, W's rows contiguous, no batch axis, float32, static
sizes); any other row product stays on BLAS. Sums are taken in another order than BLAS's, within
float32 rounding.
"""
from __future__ import annotations

from graphkernel.backends.c.c_gemm_packed import GemmCall  # what this file reads of c_gemm's

ROW_PRODUCT_LABEL = "graphkernel row-vector kernel"
# W of at least this many elements is shared out over OpenMP's threads (16-row chunks); below it
# one thread reads it (~10 us): within a call the team is awake, its fork a few microseconds.
ROW_PRODUCT_PARALLEL_MIN = 1 << 16
ROW_PRODUCT_ON = True  # False: every product stays on BLAS
ROWS_PER_CHUNK = 16
# A few rows (a classifier at batch 8) take each chunk of W's rows in turn, the chunk staying
# in L1/L2 while every row of A meets it: OpenBLAS packed all of W per call, ResNet-18 b8's
# 8 x 512 x 1000 took 0.35 ms within the call against OpenVINO's 0.09.
ROW_PRODUCT_MAX_ROWS = 8

ROW_PRODUCT = """GK_INDEX_OPTIONS
typedef float gk_rv16 __attribute__((vector_size(64)));
static inline float gk_rv_sum(gk_rv16 v) {
  float s = 0;
  for (int l = 0; l < 16; ++l) s += v[l];
  return s;
}
/* y[j] = sum_d x[d] * W[j * ldw + d] for j in [0, n): four rows of W at a time. */
static void gk_row_sgemv(int64_t n, int64_t k, const float *x, const float *W, int64_t ldw,
                         float *y) {
  const int64_t k16 = k / 16 * 16;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float *w0 = W + j * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
    gk_rv16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, xv, v;
    for (int64_t d = 0; d < k16; d += 16) {
      memcpy(&xv, x + d, sizeof xv);
      memcpy(&v, w0 + d, sizeof v); a0 += xv * v;
      memcpy(&v, w1 + d, sizeof v); a1 += xv * v;
      memcpy(&v, w2 + d, sizeof v); a2 += xv * v;
      memcpy(&v, w3 + d, sizeof v); a3 += xv * v;
    }
    float s0 = gk_rv_sum(a0), s1 = gk_rv_sum(a1), s2 = gk_rv_sum(a2), s3 = gk_rv_sum(a3);
    for (int64_t d = k16; d < k; ++d) {
      s0 += x[d] * w0[d]; s1 += x[d] * w1[d]; s2 += x[d] * w2[d]; s3 += x[d] * w3[d];
    }
    y[j] = s0; y[j + 1] = s1; y[j + 2] = s2; y[j + 3] = s3;
  }
  for (; j < n; ++j) {
    const float *w0 = W + j * ldw;
    gk_rv16 a0 = {0}, xv, v;
    for (int64_t d = 0; d < k16; d += 16) {
      memcpy(&xv, x + d, sizeof xv);
      memcpy(&v, w0 + d, sizeof v); a0 += xv * v;
    }
    float s0 = gk_rv_sum(a0);
    for (int64_t d = k16; d < k; ++d) s0 += x[d] * w0[d];
    y[j] = s0;
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
"""


def row_product(call: GemmCall) -> bool:
    """Whether a product runs on the row-vector kernel: float32, at most ROW_PRODUCT_MAX_ROWS
    static rows (no batch axis), A's rows contiguous and B transposed with contiguous rows
    (W = B^T row-major)."""
    return ROW_PRODUCT_ON and not call.double and not call.batch and \
        isinstance(call.m, int) and 1 <= call.m <= ROW_PRODUCT_MAX_ROWS and \
        not call.a.trans and call.b.trans and not call.c.trans


def row_parallel(call: GemmCall) -> bool:
    """Whether the product's rows of W are shared out over OpenMP's threads."""
    return ROW_PRODUCT_PARALLEL_MIN > 0 and call.n * call.k >= ROW_PRODUCT_PARALLEL_MIN and \
        call.n > ROWS_PER_CHUNK


def emit_row_product(call: GemmCall, x: str, w: str, y: str) -> list[str]:
    """C lines of one row-vector product inside the entry's `gk_run` (`row_product`): `x`, `w`,
    `y` the pointer expressions of A, B (W^T) and C; each chunk of W's rows meets every row of
    A in turn."""
    n, k, ldw, m = call.n, call.k, call.b.ld, call.m
    lda, ldc = call.a.ld, call.c.ld
    rows = f"for (int64_t gk_i = 0; gk_i < {m}; ++gk_i) "
    if not row_parallel(call):
        return ["  {", f"    {rows}gk_row_sgemv({n}, {k}, {x} + gk_i * {lda}, {w}, {ldw}, "
                f"{y} + gk_i * {ldc});", "  }"]
    chunks = -(-n // ROWS_PER_CHUNK)
    return ["  {",
            "    #pragma omp parallel for schedule(static)",
            f"    for (int64_t gk_c = 0; gk_c < {chunks}; ++gk_c) {{",
            f"      const int64_t gk_lo = gk_c * {ROWS_PER_CHUNK};",
            f"      const int64_t gk_rows = {n} - gk_lo < {ROWS_PER_CHUNK} ? {n} - gk_lo : "
            f"{ROWS_PER_CHUNK};",
            f"      {rows}gk_row_sgemv(gk_rows, {k}, {x} + gk_i * {lda}, {w} + gk_lo * {ldw}, "
            f"{ldw}, {y} + gk_i * {ldc} + gk_lo);",
            "    }",
            "  }"]
