"""graphkernel's packed-B product: a float32 GEMM whose B is packed once per call, shared by
every OpenMP thread, then split into row chunks that pack nothing again.

A product split over threads on BLAS (c_gemm.py `emit_gemm`) makes one BLAS call per chunk, and
each call packs its operands again: on BERT-base's weight products (1024 x 768 x 768/3072 and
1024 x 3072 x 768) four chunks of rows took 5-14% more CPU than one call on the AMD EPYC
(Zen 5) host, OpenBLAS 0.3.31's SkylakeX kernels. Here the call's threads pack B into panels of
32 columns (each panel k x 32, contiguous) into one buffer, then take row chunks as they come
free; a chunk reads A in place (broadcast scalars: either layout) and keeps a 12 x 32 tile of C
in 24 AVX-512 registers over a block of k. On one thread the product keeps BLAS's one call,
which packs once too (`emit_packed`).

The kernel needs AVX-512 (`__AVX512F__`, as -march=native compiles the entry) and OpenMP;
elsewhere, or when the pack buffer cannot be allocated, the product's BLAS lines run instead.
"""
from __future__ import annotations

from typing import Any, Protocol

from graphkernel.ir.types import Dim, SymSize


class GemmCall(Protocol):
    """What this file reads of c_gemm.py's GemmCall (which imports this file)."""

    @property
    def m(self) -> Dim: ...
    @property
    def n(self) -> int: ...
    @property
    def k(self) -> int: ...
    @property
    def batch(self) -> tuple[Dim, ...]: ...
    @property
    def double(self) -> bool: ...
    @property
    def one_thread(self) -> bool: ...
    @property
    def a(self) -> Any: ...  # c_gemm.Matrix: .trans, .ld
    @property
    def b(self) -> Any: ...
    @property
    def c(self) -> Any: ...

# Products with at least this many multiply-adds run on the packed-B kernel (float32, one GEMM,
# no batch axis): below it a product is a small fraction of a millisecond, where BLAS's call is
# as good and the pack buffer not worth growing. 0 turns the kernel off.
PACKED_PRODUCT_MIN_MNK = 1 << 22
# Row chunks per OpenMP thread, handed out as threads come free: a chunk packs nothing, so a
# late (descheduled) thread's share can be cut finer than BLAS's chunks (c_gemm.py
# PRODUCT_CHUNKS_PER_THREAD) at no cost.
PACKED_CHUNKS_PER_THREAD = 4
PACKED_PRODUCT_LABEL = "graphkernel packed-B kernel"
# Block of k a tile of C accumulates over before it is stored (B's block kc x 256 stays in L2).
PACKED_KC = 768
PACKED_NC = 256  # columns of B (8 panels) a row strip runs across while its A block is in L1

PACKED_PRODUCT = """#if defined(__AVX512F__) && defined(_OPENMP)
#include <immintrin.h>
int omp_get_max_threads(void);
#include <stdlib.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize ("O3", "fp-contract=fast")
#endif
/* C rows x 32 (masked to the columns there are) += / = A rows x kc times one packed panel of B
   (kc x 32, row d at bp + 32 d). A(r, d) = a[r * ra + d * da]. */
static inline __attribute__((always_inline)) void gk_pk_tile(
    const int rows, int64_t kc, const float *a, int64_t ra, int64_t da, const float *bp,
    float *c, int64_t ldc, int acc, __mmask16 m0, __mmask16 m1) {
  __m512 c0[12], c1[12];
  for (int r = 0; r < rows; ++r) { c0[r] = _mm512_setzero_ps(); c1[r] = _mm512_setzero_ps(); }
  for (int64_t d = 0; d < kc; ++d) {
    const __m512 b0 = _mm512_loadu_ps(bp + 32 * d), b1 = _mm512_loadu_ps(bp + 32 * d + 16);
    for (int r = 0; r < rows; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * ra + d * da]);
      c0[r] = _mm512_fmadd_ps(x, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(x, b1, c1[r]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    if (acc) {
      c0[r] = _mm512_add_ps(c0[r], _mm512_maskz_loadu_ps(m0, c + r * ldc));
      c1[r] = _mm512_add_ps(c1[r], _mm512_maskz_loadu_ps(m1, c + r * ldc + 16));
    }
    _mm512_mask_storeu_ps(c + r * ldc, m0, c0[r]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, m1, c1[r]);
  }
}

/* Rows lo..hi of C = A B, B packed (`gk_pk_pack`): 12-row strips, then 4- and 1-row ones. */
static void gk_pk_rows(int64_t lo, int64_t hi, int64_t n, int64_t k, const float *A, int64_t ra,
                       int64_t da, const float *Bp, float *C, int64_t ldc) {
  for (int64_t j0 = 0; j0 < n; j0 += GK_PK_NC) {
    const int64_t j1 = j0 + GK_PK_NC < n ? j0 + GK_PK_NC : n;
    for (int64_t k0 = 0; k0 < k; k0 += GK_PK_KC) {
      const int64_t kc = k - k0 < GK_PK_KC ? k - k0 : GK_PK_KC;
      const int acc = k0 > 0;
      for (int64_t j = j0; j < j1; j += 32) {
        const int64_t left = n - j;
        const __mmask16 m0 = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
        const __mmask16 m1 = left >= 32 ? 0xFFFF : left > 16 ?
          (__mmask16)((1u << (left - 16)) - 1) : 0;
        const float *bp = Bp + (j / 32) * k * 32 + k0 * 32;
        int64_t i = lo;
        for (; i + 12 <= hi; i += 12)
          gk_pk_tile(12, kc, A + i * ra + k0 * da, ra, da, bp, C + i * ldc + j, ldc, acc, m0, m1);
        for (; i + 4 <= hi; i += 4)
          gk_pk_tile(4, kc, A + i * ra + k0 * da, ra, da, bp, C + i * ldc + j, ldc, acc, m0, m1);
        for (; i < hi; ++i)
          gk_pk_tile(1, kc, A + i * ra + k0 * da, ra, da, bp, C + i * ldc + j, ldc, acc, m0, m1);
      }
    }
  }
}

/* r[i] = row i of a 16 x 16 block in; r[j] = its column j out. */
static inline __attribute__((always_inline)) void gk_pk_tr16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

/* Panels p0..p1 of B (k x n; B(d, j) = B[d * ldb + j], or B[j * ldb + d] when tb) into Bp:
   panel p holds columns 32 p..32 p + 31 as k rows of 32 floats, zeros past column n. */
static void gk_pk_pack(int64_t p0, int64_t p1, int64_t n, int64_t k, const float *B,
                       int64_t ldb, int tb, float *Bp) {
  for (int64_t p = p0; p < p1; ++p) {
    float *out = Bp + p * k * 32;
    const int64_t cols = n - 32 * p < 32 ? n - 32 * p : 32;
    if (!tb) {
      const __mmask16 m0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
      const __mmask16 m1 = cols >= 32 ? 0xFFFF : cols > 16 ?
        (__mmask16)((1u << (cols - 16)) - 1) : 0;
      for (int64_t d = 0; d < k; ++d) {
        const float *row = B + d * ldb + 32 * p;
        _mm512_storeu_ps(out + 32 * d, _mm512_maskz_loadu_ps(m0, row));
        _mm512_storeu_ps(out + 32 * d + 16, _mm512_maskz_loadu_ps(m1, row + 16));
      }
      continue;
    }
    /* B's columns are contiguous: 16 x 16 blocks transposed in registers (a float at a time,
       the pack of a 768 x 3072 weight took 2.2 ms, a tenth of its product) */
    int64_t d0 = 0;
    if (cols == 32)
      for (; d0 + 16 <= k; d0 += 16)
        for (int h = 0; h < 2; ++h) {
          __m512 r[16];
          for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(B + (32 * p + 16 * h + j) * ldb + d0);
          gk_pk_tr16(r);
          for (int t = 0; t < 16; ++t) _mm512_storeu_ps(out + 32 * (d0 + t) + 16 * h, r[t]);
        }
    for (int64_t d = d0; d < k; ++d)  /* the last panel's columns, k past the last block */
      for (int64_t j = 0; j < 32; ++j) out[32 * d + j] = j < cols ? B[(32 * p + j) * ldb + d] : 0;
  }
}

/* The calling thread's pack buffer, grown to `floats` (never shrunk; kept for the next call):
   NULL when it cannot be had (the product then runs on BLAS). */
static __thread float *gk_pk_buf = NULL;
static __thread size_t gk_pk_cap = 0;
static float *gk_pk_buffer(size_t floats) {
  if (floats > gk_pk_cap) {
    free(gk_pk_buf);
    const size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    gk_pk_buf = aligned_alloc(64, bytes);
    gk_pk_cap = gk_pk_buf != NULL ? floats : 0;
  }
  return gk_pk_buf;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
#endif
""".replace("GK_PK_KC", str(PACKED_KC)).replace("GK_PK_NC", str(PACKED_NC))


def packed_product(call: GemmCall) -> bool:
    """Whether a product runs on the packed-B kernel: float32, one GEMM (no batch axis), split
    over threads (not held to one: `GemmCall.one_thread`), at least PACKED_PRODUCT_MIN_MNK
    multiply-adds for the least value of a dynamic row count, and at least as many rows as
    columns: the products BLAS's split cuts by rows (c_gemm.py `_split_rows`), each chunk
    packing all of B again. A wider product is cut by columns there, each chunk packing only
    A again, and at two threads this kernel took 4-18% more CPU than that split (1024 x 3072
    x 768, 1024 x 1024 x 256)."""
    rows = call.m.coef if isinstance(call.m, SymSize) else call.m  # a dynamic one's least
    return PACKED_PRODUCT_MIN_MNK > 0 and not call.double and not call.batch and \
        not call.one_thread and rows * call.n * call.k >= PACKED_PRODUCT_MIN_MNK and \
        (isinstance(call.m, SymSize) or call.m >= call.n)


def emit_packed(call: GemmCall, a: str, b: str, c: str, m: str, blas: list[str]) -> list[str]:
    """C lines of one packed-B product (inside the entry's block that declares its operands):
    `a`, `b`, `c` the operands' pointer expressions, `m` the row count; `blas` the lines of the
    same product on BLAS, run where the kernel is not compiled (no AVX-512, no OpenMP), on one
    thread (one BLAS call packs once too, and OpenBLAS's kernel was 2-5% faster than this one
    there) or where the pack buffer cannot be had."""
    ra, da = ("1", str(call.a.ld)) if call.a.trans else (str(call.a.ld), "1")
    n, k, panels = call.n, call.k, (call.n + 31) // 32
    rows = (f"gk_pk_rows(gk_lo, gk_hi, {n}, {k}, {a}, {ra}, {da}, gk_Bp, {c}, "
            f"{call.c.ld});")
    pack = f"gk_pk_pack(gk_p, gk_p + 1, {n}, {k}, {b}, {call.b.ld}, {int(call.b.trans)}, gk_Bp);"
    return ["#if defined(__AVX512F__) && defined(_OPENMP)",
            "    float *gk_Bp = omp_get_max_threads() > 1 ? "
            f"gk_pk_buffer((size_t){panels * k * 32}) : NULL;",
            "    if (gk_Bp != NULL) {",
            f"      const int64_t gk_m = {m};",
            "      #pragma omp parallel",
            "      {",
            "        #pragma omp for schedule(static)",
            f"        for (int64_t gk_p = 0; gk_p < {panels}; ++gk_p) {pack}",
            "        const int64_t gk_parts = omp_get_num_threads();",
            f"        const int64_t gk_chunks = gk_parts * {PACKED_CHUNKS_PER_THREAD};",
            "        const int64_t gk_each = ((gk_m + gk_chunks - 1) / gk_chunks + 11) "
            "/ 12 * 12;  /* whole 12-row strips */",
            "        #pragma omp for schedule(dynamic, 1)",
            "        for (int64_t gk_chunk = 0; gk_chunk < gk_chunks; ++gk_chunk) {",
            "          const int64_t gk_lo = gk_chunk * gk_each < gk_m ? "
            "gk_chunk * gk_each : gk_m;",
            "          const int64_t gk_hi = gk_lo + gk_each < gk_m ? gk_lo + gk_each : gk_m;",
            f"          if (gk_hi > gk_lo) {rows}",
            "        }",
            "      }",
            "    } else {", *blas, "    }",
            "#else", *blas, "#endif"]
