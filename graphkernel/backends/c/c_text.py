"""The C text every translation unit shares (PRELUDE: headers, streaming stores, libmvec
declarations) and the spelling of names, comments and constants in C."""
from __future__ import annotations

import math

import numpy as np

from graphkernel.backends.c.c_erf_table import ERF_TABLE_C
from graphkernel.ir import types as T
from graphkernel.runtime.plan import kernel_identifier

# The C type that stores each dtype, and the type arithmetic runs in (float16 computes in float,
# rounding after every op as numpy does).
# Bools are stored as bytes (numpy's 0 and 1) and computed as C bools: gcc does not vectorise
# loads of _Bool ("no vectype"), so a loop reading a bool mask ran one element at a time
# (GPT-2's masked softmax: 3.8 ms, 0.5 ms with byte loads).
C_STORAGE = {T.float16: "_Float16", T.float32: "float", T.float64: "double",
             T.int32: "int32_t", T.int64: "int64_t", T.bool_: "uint8_t"}
C_COMPUTE = {T.float16: "float", T.float32: "float", T.float64: "double",
             T.int32: "int32_t", T.int64: "int64_t", T.bool_: "bool"}

PRELUDE = """\
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>
/* Non-temporal stores through compiler builtins: <immintrin.h> alone adds 0.4 s to a compile. */
#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
#define GK_STREAMS 1
#if defined(__AVX__)
#define GK_STREAM_BYTES 32
#else
#define GK_STREAM_BYTES 16
#endif
typedef long long gk_vec __attribute__((vector_size(GK_STREAM_BYTES)));
static inline void gk_stream_vec(char *d, const char *s) {
  gk_vec v;
  memcpy(&v, s, GK_STREAM_BYTES);
#if defined(__clang__)
  __builtin_nontemporal_store(v, (gk_vec *)d);
#elif defined(__AVX__)
  __builtin_ia32_movntdq256((gk_vec *)d, v);
#else
  __builtin_ia32_movntdq((gk_vec *)d, v);
#endif
}
#endif
/* Copies a finished block to its output with non-temporal stores: they skip the read for
   ownership an ordinary store makes (a third of a bandwidth-bound kernel's traffic) and do not
   evict the inputs from cache. Only for outputs too large to be read back from cache anyway. */
static inline void gk_stream(void *restrict dst, const void *restrict src, size_t n) {
  char *d = (char *)dst;
  const char *s = (const char *)src;
#if defined(GK_STREAMS)
  /* Whole cache lines only: a line written partly with streaming stores and partly with
     ordinary ones costs a read-modify-write in memory. */
  size_t head = (64 - ((uintptr_t)d & 63)) & 63;
  if (head > n) head = n;
  memcpy(d, s, head);
  d += head; s += head; n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64)
    for (int k = 0; k < 64; k += GK_STREAM_BYTES)
      gk_stream_vec(d + k, s + k);
#endif
  memcpy(d, s, n);
}
/* One 64-byte line, whole, to a line-aligned address: with a non-temporal store where `stream`
   (the output is aligned), else ordinary stores. A pointwise kernel computes the line in
   registers (gcc keeps `s`, a local array filled by an unrolled simd loop, in them) and stores
   it so, with no block in L1 in between (backends/c/c_emitter.py). */
typedef long long gk_line_vec __attribute__((vector_size(64)));
static inline void gk_stream_line(void *restrict d, const void *restrict s, bool stream) {
#if defined(GK_STREAMS)
  if (stream) {
#if defined(__AVX512F__) && !defined(__clang__)
    gk_line_vec v;
    memcpy(&v, s, 64);
    __builtin_ia32_movntdq512((gk_line_vec *)d, v);
#else
    for (int k = 0; k < 64; k += GK_STREAM_BYTES)
      gk_stream_vec((char *)d + k, (const char *)s + k);
#endif
    return;
  }
#endif
  (void)stream;
  memcpy(d, s, 64);
}
/* Elements of `size` bytes before the first 64-byte boundary at or after p, at most n (all n
   when p is not element aligned: no element then starts a line). */
static inline int64_t gk_line_head(const void *p, int64_t n, int64_t size) {
  const uintptr_t a = (uintptr_t)p;
  const int64_t h = a % (uintptr_t)size ? n : (int64_t)(((0 - a) & 63) / (uintptr_t)size);
  return h < n ? h : n;
}
/* Non-temporal stores are weakly ordered: each thread fences before the region ends. */
static inline void gk_stream_fence(void) {
#if defined(GK_STREAMS)
  __builtin_ia32_sfence();
#endif
}
/* Whether a kernel planned right after a multi-threaded BLAS product keeps its OpenMP threads
   (its parallel regions carry `if(parallel: gk_parallel_beside_blas())`, backends/c/c_emitter.py).
   BLAS's idle workers spin on the other cores for a while after a product; on two cores the
   kernel's second thread then shares a core with one, and two threads ran no faster than one
   (docs/perf-notes.md, "Beside BLAS"). With more cores the others still add up. Within a call
   of the compiled entry (c_entry.py) no BLAS worker runs: its products run on OpenMP's threads
   with BLAS held to one, so `gk_blas_held` (set by the entry for the call, on the calling
   thread) keeps the threads; only the Python runner's steps run products on BLAS's pool.
   One variable for the library's translation units (library.py cuts it into several, each with
   this prelude: a static one per unit was never set where the kernels read it), weak so each
   unit may define it, hidden so that libraries loaded together keep their own. */
__thread int gk_blas_held __attribute__((weak, visibility("hidden"))) = 0;
#if defined(_OPENMP)
int omp_get_max_threads(void);
static inline int gk_parallel_beside_blas(void) {
  return gk_blas_held || omp_get_max_threads() > 2;
}
#endif
/* Pairwise summation of block sums (backends/c/c_reduce.py): a binary counter whose level k holds
   the sum of 2^k blocks, so every block passes through at most log2(blocks) additions, in
   double. A row reduction pushes each block's vectorised float sum and takes the total. */
typedef struct { double level[64]; int64_t count; } gk_pairwise;
static inline void gk_pairwise_push(gk_pairwise *p, double s) {
  int k = 0;
  for (; (p->count >> k) & 1; ++k) s = p->level[k] + s;
  p->level[k] = s;
  p->count++;
}
static inline double gk_pairwise_total(const gk_pairwise *p) {
  double s = 0;
  for (int k = 0; k < 64; ++k)
    if ((p->count >> k) & 1) s = p->level[k] + s;
  return s;
}
/* exp for float compute (the Exp op's C template, ir/opdefs/elementwise.py), inlined into the
   loop so gcc vectorises it with the loop's other work (a libmvec call clobbers every vector
   register: the loop around it spills). x = n ln2 + r, |r| <= ln2/2: n rounded through the
   1.5 * 2^23 shift, r by Cody-Waite with a two-part ln2 (the first product exact), exp(r) =
   1 + r + r^2 q(r) with q a degree-4 minimax fit (relative error 4e-9 on [-ln2/2, ln2/2]), times
   2^n as two exact powers of two, so results below 2^-126 round once to their subnormal.
   Checked against double exp on all 2^32 floats: at most 1.04 ulp (libmvec's: 1 ulp stated);
   NaN -> NaN, +inf and x > 88.7228 -> +inf, -inf and x < -103.98 -> +0, -0.0 -> 1
   (tests/test_exp.py, docs/perf-notes.md "Numerics"). */
#pragma omp declare simd notinbranch
static inline float gkm_expf(float x) {
  const float shift = 0x1.8p23f;
  const float xc = x < -104.0f ? -104.0f : x;  /* exp < 2^-150: n stays >= -150; NaN passes */
  const float k = __builtin_fmaf(xc, 0x1.715476p+0f, shift);
  uint32_t kb;
  memcpy(&kb, &k, 4);
  int32_t n = (int32_t)(kb - 0x4B400000u);  /* round(x / ln2), from k's low bits */
  n = n < 129 ? n : 129;  /* x > 89.4, +inf: r > 0 then, q and p too, and p 2^129 is inf */
  const float nf = (float)n;
  float r = __builtin_fmaf(nf, -0x1.62e43p-1f, xc);
  r = __builtin_fmaf(nf, 0x1.05c61p-29f, r);
  float q = __builtin_fmaf(r, 0x1.6bd8eap-10f, 0x1.1239fep-7f);
  q = __builtin_fmaf(q, r, 0x1.555682p-5f);
  q = __builtin_fmaf(q, r, 0x1.555492p-3f);
  q = __builtin_fmaf(q, r, 0x1.fffffep-2f);
  const float p = __builtin_fmaf(q, r * r, r) + 1.0f;
  const int32_t n1 = n >> 1, n2 = n - n1;  /* each in [-75, 65]: a normal power of two */
  /* Below -104, exp(x) < 2^-150 rounds to +0: the second factor is +0 there. Scaling down to
     +0 through 2^-75 would be a multiply with a tiny result, which Intel cores finish in
     microcode (~100 cycles): a masked Softmax (-1e4 where masked) ran 7x slower for it. A
     select on the integer keeps the common path as it was (a float select on the result
     doubled a GeLU kernel's time). NaN compares false and passes. */
  const uint32_t b1 = (uint32_t)(n1 + 127) << 23,
                 b2 = x < -104.0f ? 0u : (uint32_t)(n2 + 127) << 23;
  float s1, s2;
  memcpy(&s1, &b1, 4);
  memcpy(&s2, &b2, 4);
  return (p * s1) * s2;
}
/* Double compute keeps libmvec's exp (declared below where it is present). */
#define gkm_exp exp
/* c ? t : f on the bits. A float select whose arms are computations (a division, exp) is
   compiled as a branch under -ftrapping-math (gcc may not speculate an operation that can
   trap) and then the loop does not vectorise: gkm_erff ran 8.6 ns per element so, against
   0.75 for libmvec's erff. An integer select of two computed values is a blend. */
static inline float gk_select_bits(bool c, float t, float f) {
  uint32_t tb, fb;
  memcpy(&tb, &t, 4);
  memcpy(&fb, &f, 4);
  const uint32_t m = 0u - (uint32_t)c;
  const uint32_t r = (tb & m) | (fb & ~m);
  float out;
  memcpy(&out, &r, 4);
  return out;
}
/* The larger of a and v, NaN winning (numpy's maximum), as an integer select: the scalar
   iterations a vectorised loop leaves at a row's end then take no branch. As a float select
   gcc branched there, and on a ReLU's output (half zeros) the branches missed: torchvision's
   stem pool (pads 1, rows of 55 and 56 outputs) took 1.4x its time. */
static inline float gk_max_nan(float a, float v) {
  return gk_select_bits((v > a) | (v != v), v, a);
}
static inline double gk_max_nan_d(double a, double v) {
  uint64_t ab, vb;
  memcpy(&ab, &a, 8);
  memcpy(&vb, &v, 8);
  const uint64_t m = 0u - (uint64_t)((v > a) | (v != v));
  const uint64_t r = (vb & m) | (ab & ~m);
  double out;
  memcpy(&out, &r, 8);
  return out;
}
/* exp for arguments known to lie in [-80, 80] (NaN passes): gkm_expf without its clamps
   and its two-step scaling, as erf and tanh below need it (their arguments are bounded by
   their own clamps). Same reduction and polynomial, so the same accuracy. */
static inline float gk_expf_bounded(float v) {
  const float shift = 0x1.8p23f;
  const float k = __builtin_fmaf(v, 0x1.715476p+0f, shift);
  uint32_t kb;
  memcpy(&kb, &k, 4);
  const float nf = k - shift;  /* round(v / ln2), exact */
  float r = __builtin_fmaf(nf, -0x1.62e43p-1f, v);
  r = __builtin_fmaf(nf, 0x1.05c61p-29f, r);
  float q = __builtin_fmaf(r, 0x1.6bd8eap-10f, 0x1.1239fep-7f);
  q = __builtin_fmaf(q, r, 0x1.555682p-5f);
  q = __builtin_fmaf(q, r, 0x1.555492p-3f);
  q = __builtin_fmaf(q, r, 0x1.fffffep-2f);
  const float p = __builtin_fmaf(q, r * r, r) + 1.0f;
  const uint32_t sb = (kb - 0x4B400000u + 127u) << 23;  /* 2^n, normal for |n| <= 116 */
  float scale;
  memcpy(&scale, &sb, 4);
  return p * scale;
}
/* erf and tanh for float compute (the Erf and Tanh ops, ops.py), inlined for the reason gkm_expf
   is (libmvec's vector erff was measured at 0.92 ms per 1M floats in BERT's erf GeLU, five
   times a memory-bound pointwise op); branch-free, so the loop vectorises.
   erf: |x| < 0.875: x (c0 + x^2 P(x^2)), c0 = 2/sqrt(pi) split in two floats (one rounding of
   it alone cost an ulp on most inputs), P degree 4; |x| >= 0.875: 1 - exp(Q(|x| - 0.875)), Q a
   degree-8 fit of log(erfc) on [0.875, 4] weighted by erfc's share of an ulp of erf; |x| is
   clamped to 4, where erfc < 2^-25 and the result rounds to 1.
   tanh: e / (e + 2), e = expm1(2|x|) computed as exp is but without its + 1 (so small |x|
   keeps its relative accuracy: one branch for all x), |x| clamped to 9.5.
   Coefficients are weighted least-squares fits on Chebyshev nodes (near-minimax), rounded to
   float. Checked against double erf and tanh (tests/test_c_math.py): erf at most 1.06 ulp,
   tanh 2.52 (three roundings after expm1; libmvec's tanhf: 1.38); NaN -> NaN, +-inf -> +-1,
   -0.0 -> -0.0, subnormals to within an ulp. Per element, one thread, in cache (a C loop):
   erf 0.59-0.62 ns against libmvec erff's 0.64-0.74, tanh 0.35 against tanhf's 0.45. */
"""
# Float erf: on AVX-512 under gcc, the table form of c_erf_table.py (one polynomial a lane);
# elsewhere the two-branch form below. The table form's functions are compiled wherever they
# stand (~15 ms a unit), so a unit whose code calls no erf gets the two-branch form, unused
# (`prelude_for`).
_ERF_TABLE_OPEN = ("#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)\n"
                   + ERF_TABLE_C + "#else\n")
PRELUDE += _ERF_TABLE_OPEN
PRELUDE += """\
#pragma omp declare simd notinbranch
static inline float gkm_erff(float x) {
  const float a = fabsf(x);
  const float x2 = x * x;
  float p = -0x1.47cd28p-11f;
  p = __builtin_fmaf(p, x2, 0x1.4a7454p-8f);
  p = __builtin_fmaf(p, x2, -0x1.b71350p-6f);
  p = __builtin_fmaf(p, x2, 0x1.ce23acp-4f);
  p = __builtin_fmaf(p, x2, -0x1.812720p-2f);
  p = __builtin_fmaf(p, x2, -0x1.f7ac92p-25f);
  const float small = __builtin_fmaf(x, 0x1.20dd76p+0f, x * p);
  const float ac = a > 4.0f ? 4.0f : a;
  const float u = ac - 0.875f;
  float q = -0x1.99def4p-21f;
  q = __builtin_fmaf(q, u, -0x1.0f53c6p-16f);
  q = __builtin_fmaf(q, u, 0x1.32c980p-12f);
  q = __builtin_fmaf(q, u, -0x1.21fe62p-9f);
  q = __builtin_fmaf(q, u, 0x1.740898p-7f);
  q = __builtin_fmaf(q, u, -0x1.803b9ap-5f);
  q = __builtin_fmaf(q, u, -0x1.a7305cp-1f);
  q = __builtin_fmaf(q, u, -0x1.371170p+1f);
  q = __builtin_fmaf(q, u, -0x1.88672ep+0f);
  const float large = 1.0f - gk_expf_bounded(q);
  /* erf is odd: the sign is x's (x p alone is +0 for x = -0: p < 0 there). */
  return __builtin_copysignf(gk_select_bits(a < 0.875f, small, large), x);
}
#endif
#pragma omp declare simd notinbranch
static inline float gkm_tanhf(float x) {
  const float a = fabsf(x);
  const float ac = a > 9.5f ? 9.5f : a;
  /* tanh rounds to 1 from 9.0109; at 9.5, 2 / (exp(19) + 1) < 2^-26. */
  const float v = 2.0f * ac;
  const float shift = 0x1.8p23f;
  const float k = __builtin_fmaf(v, 0x1.715476p+0f, shift);
  uint32_t kb;
  memcpy(&kb, &k, 4);
  const float nf = k - shift;  /* round(v / ln2), exact */
  float r = __builtin_fmaf(nf, -0x1.62e43p-1f, v);
  r = __builtin_fmaf(nf, 0x1.05c61p-29f, r);
  /* expm1(r) = r + r^2 q(r), q a degree-4 fit for expm1's relative error (exp's degree-3 q
     is fitted for 1 + ..., which hides its error near 0). */
  float q = __builtin_fmaf(r, 0x1.6ce6e2p-10f, 0x1.12290ap-7f);
  q = __builtin_fmaf(q, r, 0x1.55553ep-5f);
  q = __builtin_fmaf(q, r, 0x1.5554b0p-3f);
  q = __builtin_fmaf(q, r, 0x1p-1f);
  const float pm1 = __builtin_fmaf(q, r * r, r);
  const uint32_t sb = (kb - 0x4B400000u + 127u) << 23;
  float scale;
  memcpy(&scale, &sb, 4);
  /* expm1(v) = 2^n (expm1(r) + 1) - 1; 2^n - 1 is exact for n in [0, 28]. */
  const float e = __builtin_fmaf(pm1, scale, scale - 1.0f);
  /* tanh is odd: the sign is x's (and -0 stays -0). */
  return __builtin_copysignf(e / (e + 2.0f), x);
}
/* Double compute keeps libm's (libmvec's) erf and tanh. */
#define gkm_erf erf
#define gkm_tanh tanh
/* Vector variants from glibc's libmvec: without these declarations gcc calls the scalar libm
   functions one element at a time. */
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float powf(float, float);
#pragma omp declare simd notinbranch
double exp(double);
#pragma omp declare simd notinbranch
double log(double);
#pragma omp declare simd notinbranch
double tanh(double);
#pragma omp declare simd notinbranch
double erf(double);
#pragma omp declare simd notinbranch
double pow(double, double);
"""
# The math ops of ir/opdefs/math_ops.py (glibc 2.35+ has vector erfc, expm1 and log1p, as erf).
PRELUDE += "".join(f"#pragma omp declare simd notinbranch\n{t} {name}{s}({t});\n"
                   for name in ("sin", "cos", "erfc", "expm1", "log1p")
                   for t, s in (("float", "f"), ("double", "")))


def prelude_for(code: str) -> str:
    """PRELUDE for a translation unit holding `code`: the table erf only where `code` calls
    gkm_erff."""
    return PRELUDE if "gkm_erff(" in code else PRELUDE.replace(_ERF_TABLE_OPEN, "#if 1\n", 1)


# The translation units build with -fwrapv (toolchain.py), so that integer ops wrap as numpy's
# do. Kernels whose data are floats and whose only integer arithmetic is indexing (products,
# convolutions, attention) drop it in their own pragma: their indices never overflow, and with
# wrapping defined gcc may not treat an index such as `a[r * ra + d * da]` as an induction
# variable that does not wrap, so the address arithmetic of an inner loop grows. The packed
# product in a C harness (Zen 4, two threads, best of 30, caches cold): 1024 x 1024 x 256
# 2.54-2.63 ms without, 2.76-2.84 with; ONNX BERT b8 (hidden 256) 8.5% less a call
# (perf-notes, "Indexing without -fwrapv"). True: such kernels keep -fwrapv too.
INDEX_WRAPS = False


def index_kernel_options(*options: str) -> list[str]:
    """The C lines that open a kernel that only indexes (INDEX_WRAPS) under gcc: push the
    unit's options, then gcc's `options` and no-wrapv (the kernel pops them after itself)."""
    chosen = (*options, *(() if INDEX_WRAPS else ("no-wrapv",)))
    return ["#if defined(__GNUC__) && !defined(__clang__)", "#pragma GCC push_options",
            "#pragma GCC optimize (" + ", ".join(f'"{o}"' for o in chosen) + ")", "#endif"]


def c_identifier(text: str) -> str:
    """A safe C identifier from any text (user names never reach C otherwise)."""
    return kernel_identifier(text)


def c_comment(text: str) -> str:
    """Text safe inside a C block comment."""
    return text.replace("*/", "* /").replace("/*", "/ *").replace("\n", " ")


def literal(value: np.ndarray) -> str:
    """A C literal of a 0-d constant, in its compute type."""
    dt = value.dtype
    v = value.item()
    if T.is_float(dt):
        suffix = "" if dt == T.float64 else "f"
        if math.isnan(v):
            return "NAN" if dt != T.float64 else "((double)NAN)"
        if math.isinf(v):
            text = "INFINITY" if dt != T.float64 else "((double)INFINITY)"
            return text if v > 0 else f"(-{text})"
        return f"({float(v)!r}{suffix})"
    if dt == T.bool_:
        return "((bool)1)" if v else "((bool)0)"
    ctype = C_COMPUTE[dt]
    if dt == T.int64 and v == -(2 ** 63):
        return "INT64_MIN"
    if dt == T.int32 and v == -(2 ** 31):
        return "INT32_MIN"
    return f"(({ctype}){int(v)}{'LL' if dt == T.int64 else ''})"
