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

Where B is a constant or a weight no step writes, its panels are kept between calls in a
workspace (`prepacked_bytes`, PREPACK_CONSTANT_B): packed on the first call and when the
weight's version moves. Such a product also runs here when it is wider than tall, split by
column panels (`gk_pk_cols`), and on one thread where k and n are large enough.

The kernel needs AVX-512 (`__AVX512F__`, as -march=native compiles the entry) and OpenMP;
elsewhere, or when the pack buffer cannot be allocated, the product's BLAS lines run instead.
"""
from __future__ import annotations

import math
from typing import Any, Protocol

from graphkernel.ir.types import Dim, SymSize
from graphkernel.runtime.plan import WORKSPACE_HEADER_BYTES


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
    @property
    def prepacked(self) -> int | None: ...

# Products with at least this many multiply-adds run on the packed-B kernel (float32, one GEMM,
# no batch axis): below it a product is a small fraction of a millisecond, where BLAS's call is
# as good and the pack buffer not worth growing. 0 turns the kernel off.
PACKED_PRODUCT_MIN_MNK = 1 << 22
# Row chunks per OpenMP thread, handed out as threads come free: a chunk packs nothing, so a
# late (descheduled) thread's share can be cut finer than BLAS's chunks (c_gemm.py
# PRODUCT_CHUNKS_PER_THREAD) at no cost.
PACKED_CHUNKS_PER_THREAD = 4
# Chunks even to a unit (a 12-row strip, a 32-column panel); False: each chunk rounded up to
# whole strips, the last one short (the old split).
PACKED_EVEN_CHUNKS = True
PACKED_PRODUCT_LABEL = "graphkernel packed-B kernel"
# A product whose B is a constant or a weight no step of the plan writes keeps B's panels in a
# workspace (runtime/plan.py Workspace, a slot named `<product>.prepacked_B`): packed on the
# first call, again only when the weight's version word or array changes (never for a
# constant). Memory: B's size again, its columns rounded up to 32. False: packed every call.
PREPACK_CONSTANT_B = True
# With B prepacked, a product with fewer rows than columns runs on the kernel too (split by
# rows over the threads: no chunk packs anything); without, such products keep BLAS's column
# split, each chunk of which packs only A.
PREPACKED_WIDE = True
# With B prepacked, one OpenMP thread runs the kernel too (rather than BLAS's one call, which
# packs B again each call) where k and n are at least this: BERT-base's products (768, 3072)
# and the MLP's (1024, 4096) took 4% less CPU so, GPT-2-small-b8's ONNX export (hidden 256)
# 7% more. None: BLAS's one call always.
PREPACKED_ONE_THREAD: int | None = 512
# Block of k a tile of C accumulates over before it is stored (B's block kc x 256 stays in L2).
PACKED_KC = 768
PACKED_NC = 256  # columns of B (8 panels) a row strip runs across while its A block is in L1
# A product with fewer rows than columns (static) splits over threads by column panels
# (gk_pk_cols): by rows, every chunk read all of B again (4 chunks a thread: MLP's 16 MiB
# weight streamed 8 times a call at two threads)
PACKED_WIDE_BY_COLUMNS = True
# A tile reads 12 rows of A at once. An x86 core's L1d is indexed by the address bits within a
# 4 KiB page (its way is a page: 32 KiB 8-way, 48 KiB 12-way), so rows a multiple of 4 KiB
# apart fall in one set and evict each other: BERT-base's down-projection (A 1024 x 3072, rows
# 12 KiB apart) took 24.2-25.3 ms on the Zen 4 host against 22.2 with A's rows 12352 bytes
# apart, as fast as its up-projection. Where more than A_ROWS_PER_SET_MAX of a tile's rows share
# a set, the product copies A_COPY_ROWS rows of A at a time into a thread's buffer, rows
# `copy_stride` floats apart (22.7 ms, the copy included); other strides run in place.
L1_WAY_BYTES = 4096
A_ROWS_PER_SET_MAX = 4
A_COPY_ROWS = 240  # 20 strips: 240 x 3088 floats, 2.9 MiB a thread at k 3072
A_COPY_BYTES = 4 << 20  # a thread's copy at most (but one strip): fewer rows at a time past it
# Split by column panels, all of A is read once per block of PACKED_NC columns, so rows that
# share L1 sets are copied apart whole (shared by the threads) before the panels are handed
# out, where A is read at least 4 times. Zen 4, 2 threads, in place -> copied: the MLP's
# 512 x 1024 x 4096 22.7 -> 21.7 ms and 512 x 4096 x 1024 26.9 -> 20.7, 384 x 2048 x 1024
# 9.0 -> 7.9, 64 x 4096 x 1024 3.7 -> 2.8; but 256 x 1024 x 512 1.7 -> 1.8, 128 x 1024 x 768
# 1.30 -> 1.38 (A read twice, three times).
COLS_COPY_A_MIN_N: int | None = 1024
COLS_COPY_A_BYTES = 64 << 20
PACKED_COPIED_A_LABEL = PACKED_PRODUCT_LABEL + ", rows of A copied apart"

PACKED_PRODUCT = """#if defined(__AVX512F__) && defined(_OPENMP)
#include <immintrin.h>
int omp_get_max_threads(void);
#include <stdlib.h>
GK_INDEX_OPTIONS
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

/* Rows i..i + rows of C, columns j0..j1 (panels), over one block of k. */
static inline __attribute__((always_inline)) void gk_pk_strip(
    const int rows, int64_t i, int64_t j0, int64_t j1, int64_t n, int64_t k, int64_t k0,
    int64_t kc, int acc, const float *A, int64_t ra, int64_t da, const float *Bp, float *C,
    int64_t ldc) {
  for (int64_t j = j0; j < j1; j += 32) {
    const int64_t left = n - j;
    const __mmask16 m0 = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
    const __mmask16 m1 = left >= 32 ? 0xFFFF : left > 16 ?
      (__mmask16)((1u << (left - 16)) - 1) : 0;
    gk_pk_tile(rows, kc, A + i * ra + k0 * da, ra, da, Bp + (j / 32) * k * 32 + k0 * 32,
               C + i * ldc + j, ldc, acc, m0, m1);
  }
}

/* Rows lo..hi of C = A B, B packed (`gk_pk_pack`): 12-row strips, then 4- and 1-row ones;
   each panel runs down the strips (the panel stays in L2, A's rows stream). */
static inline __attribute__((always_inline)) void gk_pk_rows_of(
    int64_t lo, int64_t hi, int64_t n, int64_t k, const float *A, int64_t ra, int64_t da,
    const float *Bp, float *C, int64_t ldc) {
  for (int64_t j0 = 0; j0 < n; j0 += GK_PK_NC) {
    const int64_t j1 = j0 + GK_PK_NC < n ? j0 + GK_PK_NC : n;
    for (int64_t k0 = 0; k0 < k; k0 += GK_PK_KC) {
      const int64_t kc = k - k0 < GK_PK_KC ? k - k0 : GK_PK_KC;
      const int acc = k0 > 0;
      for (int64_t j = j0; j < j1; j += 32) {
        int64_t i = lo;
        for (; i + 12 <= hi; i += 12)
          gk_pk_strip(12, i, j, j + 32, n, k, k0, kc, acc, A, ra, da, Bp, C, ldc);
        for (; i + 4 <= hi; i += 4)
          gk_pk_strip(4, i, j, j + 32, n, k, k0, kc, acc, A, ra, da, Bp, C, ldc);
        for (; i < hi; ++i)
          gk_pk_strip(1, i, j, j + 32, n, k, k0, kc, acc, A, ra, da, Bp, C, ldc);
      }
    }
  }
}

/* Columns jlo..jhi (whole panels but the last) of C = A B, every row, B packed: blocks of
   GK_PK_NC columns (in L2), each 12-row strip of A (in L1) run across a block's panels. For a
   product wider than tall, split over threads by columns: each thread reads only its own
   panels of B, and A (the smaller) again. */
static inline __attribute__((always_inline)) void gk_pk_cols_of(
    int64_t jlo, int64_t jhi, int64_t m, int64_t n, int64_t k, const float *A, int64_t ra,
    int64_t da, const float *Bp, float *C, int64_t ldc) {
  for (int64_t j0 = jlo; j0 < jhi; j0 += GK_PK_NC) {
    const int64_t j1 = j0 + GK_PK_NC < jhi ? j0 + GK_PK_NC : jhi;
    for (int64_t k0 = 0; k0 < k; k0 += GK_PK_KC) {
      const int64_t kc = k - k0 < GK_PK_KC ? k - k0 : GK_PK_KC;
      const int acc = k0 > 0;
      int64_t i = 0;
      for (; i + 12 <= m; i += 12)
        gk_pk_strip(12, i, j0, j1, n, k, k0, kc, acc, A, ra, da, Bp, C, ldc);
      for (; i + 4 <= m; i += 4)
        gk_pk_strip(4, i, j0, j1, n, k, k0, kc, acc, A, ra, da, Bp, C, ldc);
      for (; i < m; ++i)
        gk_pk_strip(1, i, j0, j1, n, k, k0, kc, acc, A, ra, da, Bp, C, ldc);
    }
  }
}

/* The entry's products call these, one instance per layout of A: rows contiguous (`_r`, da 1)
   or columns (`_c`, ra 1). With both of A's strides left to the call (one function for every
   product of the entry, which gcc does not specialise), the tile kept a pointer per row of A,
   more than the registers left beside 24 accumulators, and reloaded two from the stack every
   step of k; with one stride a constant 1, one pointer and the row offsets do. */
__attribute__((unused)) static void gk_pk_rows_r(
    int64_t lo, int64_t hi, int64_t n, int64_t k, const float *A, int64_t ra, const float *Bp,
    float *C, int64_t ldc) { gk_pk_rows_of(lo, hi, n, k, A, ra, 1, Bp, C, ldc); }
__attribute__((unused)) static void gk_pk_rows_c(
    int64_t lo, int64_t hi, int64_t n, int64_t k, const float *A, int64_t da, const float *Bp,
    float *C, int64_t ldc) { gk_pk_rows_of(lo, hi, n, k, A, 1, da, Bp, C, ldc); }
__attribute__((unused)) static void gk_pk_cols_r(
    int64_t jlo, int64_t jhi, int64_t m, int64_t n, int64_t k, const float *A, int64_t ra,
    const float *Bp, float *C, int64_t ldc) {
  gk_pk_cols_of(jlo, jhi, m, n, k, A, ra, 1, Bp, C, ldc);
}
__attribute__((unused)) static void gk_pk_cols_c(
    int64_t jlo, int64_t jhi, int64_t m, int64_t n, int64_t k, const float *A, int64_t da,
    const float *Bp, float *C, int64_t ldc) {
  gk_pk_cols_of(jlo, jhi, m, n, k, A, 1, da, Bp, C, ldc);
}

/* *buf grown to hold `floats` floats, 64-byte aligned (never shrunk: kept for the next
   call); NULL, and no capacity, when it cannot be had. Each buffer is a thread's own. */
static float *gk_pk_grow(float **buf, size_t *cap, size_t floats) {
  if (floats > *cap) {
    free(*buf);
    *buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    *cap = *buf != NULL ? floats : 0;
  }
  return *buf;
}

/* As gk_pk_rows_r, A's rows copied first, `at_once` at a time, `sa` floats apart into the
   calling thread's buffer (rows whose stride puts them in one L1 set: `copies_a`); in place
   when the buffer cannot be had. A buffer apart from gk_pk_buffer's: there the calling
   thread holds B's panels. */
static __thread float *gk_pk_abuf = NULL;
static __thread size_t gk_pk_acap = 0;

/* Row `in` (k floats) to `out`. */
static inline __attribute__((always_inline)) void gk_pk_copy_row(
    int64_t k, const float *in, float *out) {
  const __mmask16 tail = (__mmask16)((1u << (k % 16)) - 1);
  int64_t d = 0;
  for (; d + 16 <= k; d += 16) _mm512_storeu_ps(out + d, _mm512_loadu_ps(in + d));
  if (d < k) _mm512_mask_storeu_ps(out + d, tail, _mm512_maskz_loadu_ps(tail, in + d));
}

__attribute__((unused)) static void gk_pk_rows_rc(
    int64_t lo, int64_t hi, int64_t n, int64_t k, const float *A, int64_t ra, int64_t sa,
    int64_t at_once, const float *Bp, float *C, int64_t ldc) {
  if (gk_pk_grow(&gk_pk_abuf, &gk_pk_acap, (size_t)at_once * (size_t)sa) == NULL) {
    gk_pk_rows_of(lo, hi, n, k, A, ra, 1, Bp, C, ldc);
    return;
  }
  for (int64_t i0 = lo; i0 < hi; i0 += at_once) {
    const int64_t rows = hi - i0 < at_once ? hi - i0 : at_once;
    for (int64_t r = 0; r < rows; ++r) gk_pk_copy_row(k, A + (i0 + r) * ra, gk_pk_abuf + r * sa);
    gk_pk_rows_of(0, rows, n, k, gk_pk_abuf, sa, 1, Bp, C + i0 * ldc, ldc);
  }
}

/* The calling thread's buffer for all of A's rows, copied apart once for every thread of a
   product split by column panels (`copies_a`); NULL when it cannot be had (A read in place).
   The calling thread is in no product's gk_pk_rows_rc while it is held. */
__attribute__((unused)) static float *gk_pk_shared_a(size_t floats) {
  return gk_pk_grow(&gk_pk_abuf, &gk_pk_acap, floats);
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

/* The calling thread's pack buffer, grown to `floats`: NULL when it cannot be had (the
   product then runs on BLAS). */
static __thread float *gk_pk_buf = NULL;
static __thread size_t gk_pk_cap = 0;
static float *gk_pk_buffer(size_t floats) {
  return gk_pk_grow(&gk_pk_buf, &gk_pk_cap, floats);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
#endif
"""


def packed_source() -> str:
    """The kernel's C, with this module's block sizes (read when an entry is written)."""
    return PACKED_PRODUCT.replace("GK_PK_KC", str(PACKED_KC)).replace("GK_PK_NC", str(PACKED_NC))


def rows_per_l1_set(stride_bytes: int, rows: int = 12) -> int:
    """The most of `rows` rows `stride_bytes` apart that fall in one L1 set (L1_WAY_BYTES)."""
    sets = L1_WAY_BYTES // math.gcd(stride_bytes % L1_WAY_BYTES, L1_WAY_BYTES)
    return -(-rows // min(rows, sets))


def copy_stride(k: int) -> int:
    """The row stride (floats) A's rows are copied to: k rounded up to whole 64-byte lines, then
    further until a tile's rows fall in sets of their own."""
    stride = -(-k // 16) * 16
    while rows_per_l1_set(4 * stride) > 1:
        stride += 16
    return stride


def copy_rows(k: int) -> int:
    """Rows of A copied at a time (whole 12-row strips): A_COPY_ROWS, fewer where they would
    take more than A_COPY_BYTES."""
    fit = A_COPY_BYTES // (4 * copy_stride(k)) // 12 * 12
    return max(12, min(A_COPY_ROWS, fit))


def _by_columns(call: GemmCall) -> bool:
    """Whether the product is split over threads by column panels (gk_pk_cols)."""
    return PACKED_WIDE_BY_COLUMNS and not isinstance(call.m, SymSize) and call.m < call.n


def copies_a(call: GemmCall) -> bool:
    """Whether the packed product copies A's rows apart first: A's rows contiguous and a row
    stride that puts more than A_ROWS_PER_SET_MAX of a tile's 12 rows in one L1 set. Split
    by rows, each thread copies its rows a block at a time (`gk_pk_rows_rc`); split by column
    panels, all of A once, shared (`gk_pk_shared_a`), where n is at least
    COLS_COPY_A_MIN_N and the copy at most COLS_COPY_A_BYTES."""
    if call.a.trans or rows_per_l1_set(4 * call.a.ld) <= A_ROWS_PER_SET_MAX:
        return False
    if not _by_columns(call):
        return True
    return COLS_COPY_A_MIN_N is not None and call.n >= COLS_COPY_A_MIN_N and \
        _cols_copy_floats(call) * 4 <= COLS_COPY_A_BYTES


def _cols_copy_floats(call: GemmCall) -> int:
    return int(call.m) * copy_stride(call.k)  # static: by columns


def packed_product(call: GemmCall) -> bool:
    """Whether a product runs on the packed-B kernel: float32, one GEMM (no batch axis), split
    over threads (not held to one: `GemmCall.one_thread`), at least PACKED_PRODUCT_MIN_MNK
    multiply-adds for the least value of a dynamic row count, and, unless B is prepacked
    (`GemmCall.prepacked`, PREPACKED_WIDE), at least as many rows as columns: the products
    BLAS's split cuts by rows (c_gemm.py `_split_rows`), each chunk packing all of B again. A
    wider product is cut by columns there, each chunk packing only A again, and at two
    threads this kernel packing B per call took 4-18% more CPU than that split (1024 x 3072 x
    768, 1024 x 1024 x 256)."""
    return _packed_rule(call, call.prepacked is not None)


def _packed_rule(call: GemmCall, prepacked: bool) -> bool:
    rows = call.m.coef if isinstance(call.m, SymSize) else call.m  # a dynamic one's least
    return PACKED_PRODUCT_MIN_MNK > 0 and not call.double and not call.batch and \
        not call.one_thread and rows * call.n * call.k >= PACKED_PRODUCT_MIN_MNK and \
        (isinstance(call.m, SymSize) or call.m >= call.n or
         prepacked and PREPACKED_WIDE)


def prepacked_bytes(call: GemmCall) -> int:
    """Bytes of the workspace that keeps the product's B packed between calls (the plan
    builder asks, runtime/builder.py, for a product whose B is a constant or an unwritten
    weight): the header, then B's 32-column panels; 0 when the product would not run on the
    packed kernel (or PREPACK_CONSTANT_B is off)."""
    if not PREPACK_CONSTANT_B or not _packed_rule(call, True):
        return 0
    return WORKSPACE_HEADER_BYTES + (call.n + 31) // 32 * call.k * 32 * 4


def emit_packed(call: GemmCall, a: str, b: str, c: str, m: str, blas: list[str],
                workspace: str | None = None) -> list[str]:
    """C lines of one packed-B product (inside the entry's block that declares its operands):
    `a`, `b`, `c` the operands' pointer expressions, `m` the row count; `blas` the lines of the
    same product on BLAS, run where the kernel is not compiled (no AVX-512, no OpenMP), on one
    thread (one BLAS call packs once too, and OpenBLAS's kernel was 2-5% faster than this one
    there) or where the pack buffer cannot be had. `workspace`: the pointer to the product's
    prepacked-B workspace (`prepacked_bytes`; its header as runtime/plan.py lays it out), whose
    panels are packed only when stale; one thread then runs the kernel too
    (PREPACKED_ONE_THREAD)."""
    # A's one stride that is not 1, and the instance for its layout
    layout, stride = ("c", call.a.ld) if call.a.trans else ("r", call.a.ld)
    n, k, panels = call.n, call.k, (call.n + 31) // 32
    by_cols = _by_columns(call)
    shared = by_cols and copies_a(call)
    if by_cols:  # chunks of whole panels, every row (of A's copy where there is one)
        src, src_stride = ("gk_Ar", "gk_ra") if shared else (a, str(stride))
        rows = (f"gk_pk_cols_{layout}(32 * gk_lo, 32 * gk_hi < {n} ? 32 * gk_hi : {n}, gk_m, "
                f"{n}, {k}, {src}, {src_stride}, gk_Bp, {c}, {call.c.ld});")
    elif copies_a(call):
        rows = (f"gk_pk_rows_rc(gk_lo, gk_hi, {n}, {k}, {a}, {stride}, {copy_stride(k)}, "
                f"{copy_rows(k)}, gk_Bp, {c}, {call.c.ld});")
    else:
        rows = (f"gk_pk_rows_{layout}(gk_lo, gk_hi, {n}, {k}, {a}, {stride}, gk_Bp, {c}, "
                f"{call.c.ld});")
    pack = f"gk_pk_pack(gk_p, gk_p + 1, {n}, {k}, {b}, {call.b.ld}, {int(call.b.trans)}, gk_Bp);"
    if workspace is None:
        head = ["    float *gk_Bp = omp_get_max_threads() > 1 ? "
                f"gk_pk_buffer((size_t){panels * k * 32}) : NULL;",
                "    if (gk_Bp != NULL) {",
                "      const int gk_stale = 1;"]
        tail: list[str] = []
    else:
        # header words (int64): [0] the source's version word (NULL: not kept, repack), [3]
        # the version packed, [6] the source's address then, [9] nonzero once packed
        one = "1" if PREPACKED_ONE_THREAD is not None and \
            min(call.k, call.n) >= PREPACKED_ONE_THREAD else "omp_get_max_threads() > 1"
        head = [f"    int64_t *gk_h = (int64_t *){workspace};",
                f"    float *gk_Bp = {one} ? (float *)((char *){workspace} + "
                f"{WORKSPACE_HEADER_BYTES}) : NULL;",
                "    if (gk_Bp != NULL) {",
                "      const int64_t *gk_word = (const int64_t *)(intptr_t)gk_h[0];",
                "      const int64_t gk_seen = gk_word != NULL ? *gk_word : 0;",
                "      const int gk_stale = gk_word == NULL || gk_h[9] == 0 || "
                f"gk_h[3] != gk_seen || gk_h[6] != (int64_t)(intptr_t){b};"]
        tail = [f"      if (gk_stale) {{ gk_h[3] = gk_seen; gk_h[6] = (int64_t)(intptr_t){b}; "
                "gk_h[9] = 1; }"]
    copy_head: list[str] = []
    copy: list[str] = []
    if shared:
        sa = copy_stride(k)
        copy_head = [f"      float *gk_As = gk_pk_shared_a((size_t){_cols_copy_floats(call)});",
                     f"      const float *gk_Ar = gk_As != NULL ? gk_As : {a};",
                     f"      const int64_t gk_ra = gk_As != NULL ? {sa} : {stride};"]
        copy = ["        if (gk_As != NULL) {",
                "          #pragma omp for schedule(static)",
                "          for (int64_t gk_r = 0; gk_r < gk_m; ++gk_r) "
                f"gk_pk_copy_row({k}, {a} + gk_r * {stride}, gk_As + gk_r * {sa});",
                "        }"]
    return ["#if defined(__AVX512F__) && defined(_OPENMP)",
            *head,
            f"      const int64_t gk_m = {m};",
            *copy_head,
            "      #pragma omp parallel",
            "      {",
            "        if (gk_stale) {",
            "          #pragma omp for schedule(static)",
            f"          for (int64_t gk_p = 0; gk_p < {panels}; ++gk_p) {pack}",
            "        }",
            *copy,
            "        const int64_t gk_parts = omp_get_num_threads();",
            f"        const int64_t gk_chunks = gk_parts * {PACKED_CHUNKS_PER_THREAD};",
            *_chunk_bounds(by_cols, panels),
            f"          if (gk_hi > gk_lo) {rows}",
            "        }",
            "      }",
            *tail,
            "    } else {", *blas, "    }",
            "#else", *blas, "#endif"]


def _chunk_bounds(by_cols: bool, panels: int) -> list[str]:
    """The chunk loop's head: `gk_lo`, `gk_hi` of chunk `gk_chunk`, in panels of 32 columns
    (`by_cols`) or rows. Chunk c takes units (whole panels, or 12-row strips) c U / chunks to
    (c + 1) U / chunks, sizes one unit apart: rounding each chunk up to whole strips left the
    last one short, and with chunks handed out in turn the calling thread took 528 of 1024
    rows, its partner 496 (PACKED_EVEN_CHUNKS False: that split)."""
    if by_cols:
        units = [f"        const int64_t gk_units = {panels}, gk_unit = 1, gk_side = {panels};"]
    else:
        units = ["        const int64_t gk_units = (gk_m + 11) / 12, gk_unit = 12, "
                 "gk_side = gk_m;"]
    head = ["        #pragma omp for schedule(dynamic, 1)",
            "        for (int64_t gk_chunk = 0; gk_chunk < gk_chunks; ++gk_chunk) {"]
    if not PACKED_EVEN_CHUNKS:
        each = "(gk_units + gk_chunks - 1) / gk_chunks * gk_unit"
        return [*units, *head,
                f"          const int64_t gk_each = {each};",
                "          const int64_t gk_lo = gk_chunk * gk_each < gk_side ? "
                "gk_chunk * gk_each : gk_side;",
                "          const int64_t gk_hi = gk_lo + gk_each < gk_side ? gk_lo + gk_each : "
                "gk_side;"]
    return [*units, *head,
            "          const int64_t gk_lo = gk_unit * (gk_chunk * gk_units / gk_chunks);",
            "          const int64_t gk_end = gk_unit * ((gk_chunk + 1) * gk_units / gk_chunks);",
            "          const int64_t gk_hi = gk_end < gk_side ? gk_end : gk_side;"]
