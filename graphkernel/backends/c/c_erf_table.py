"""Float erf on AVX-512 under gcc: one polynomial a lane, its coefficients picked from a table
by a vector permute (c_text.PRELUDE puts ERF_TABLE_C where it defines `gkm_erff`).

The branch-free `gkm_erff` of c_text.py computes both of its branches in every lane (a
polynomial in x^2 below 0.875, 1 - exp(Q(|x| - 0.875)) above): 0.6 ns an element on one Zen 4
core, most of an erf GeLU's time (perf-notes, "The erf GeLU is bound by arithmetic"). Here
[0, 4) is cut into 32 intervals of width 1/8, and erf(a) = a g(a), g = erf(a) / a (smooth and
even, 2/sqrt(pi) at 0), is a degree-4 polynomial in t = a - (the interval's middle) on each: a
weighted least-squares fit on Chebyshev nodes for relative error (at most 2.9e-9 before
rounding), coefficients rounded to float. The constant term is split in two floats and the
result is a (c0 high) + a (c0 low + t P(t)) in one fused multiply-add, so c0's own rounding
costs no ulp (as in `gkm_erff`). 32 coefficients are two 512-bit registers, and a two-table
permute by the interval index picks each lane's: one polynomial's work where `gkm_erff` does
two and an exp. Against double erf over tests/test_c_math.py's sweep: at most 0.998 ulp, 0.73%
of results more than half an ulp off (`gkm_erff`: 1.059 and 0.9%). The erf GeLU's loop, one
thread, in cache: 0.50 ns an element against 0.74. A 16-interval degree-5 table ran as fast and
put 2.1% of results over half an ulp.

Generated scalar C cannot express the permute (a table read in an `omp simd` loop was not
vectorised at all: 4.8 ns an element). So `gkm_erff` is declared `omp declare simd` with 16
lanes and not defined under its own name; gcc's vectoriser then calls the 16-lane variant by
its vector-ABI name, `_ZGVeN16v_gkm_erff`, defined here with gcc's vector types and AVX-512
builtins (no <immintrin.h>: it adds 0.4 s to a compile). A loop's scalar iterations call
`gkm_erff`, defined here from the same operations in the same order, so a value's result is
the same bit for bit wherever it sits in an array (tests/test_c_math.py). Both are weak and
hidden: every translation unit of a library has them. Elsewhere (no AVX-512, clang) `gkm_erff`
is c_text.py's.
"""
from __future__ import annotations

# Rows: c0 high, c0 low, c1 .. c4; column k: the interval [k/8, (k+1)/8), t = a - (k/8 + 1/16).
ERF_COEFFICIENTS: tuple[tuple[str, ...], ...] = (
    # c0 (high part)
    ("0x1.207d48p+0", "0x1.1d83ecp+0", "0x1.17bb2ap+0", "0x1.0f725ap+0",
     "0x1.0515ecp+0", "0x1.f2491cp-1", "0x1.d84714p-1", "0x1.bd2794p-1",
     "0x1.a1d1fp-1", "0x1.8706c6p-1", "0x1.6d59d8p-1", "0x1.553186p-1",
     "0x1.3ecaa4p-1", "0x1.2a3f12p-1", "0x1.178db8p-1", "0x1.06a27ap-1",
     "0x1.eebaaap-2", "0x1.d33048p-2", "0x1.ba55dp-2", "0x1.a3dd54p-2",
     "0x1.8f7e6ap-2", "0x1.7cf7e2p-2", "0x1.6c1044p-2", "0x1.5c959ap-2",
     "0x1.4e5cc6p-2", "0x1.4140b8p-2", "0x1.352196p-2", "0x1.29e3fcp-2",
     "0x1.1f704p-2", "0x1.15b1e2p-2", "0x1.0c9714p-2", "0x1.04104p-2"),
    # c0 (low part)
    ("0x1.cb1becp-29", "0x1.ff61e8p-25", "-0x1.5435d6p-26", "-0x1.5effaep-26",
     "-0x1.b342ep-25", "0x1.aa0c1cp-26", "-0x1.65b54p-26", "-0x1.6946fep-26",
     "0x1.65c208p-26", "0x1.66c0dep-30", "-0x1.708f3ap-26", "0x1.af79b4p-28",
     "-0x1.80c45cp-26", "-0x1.d3e522p-27", "0x1.64c454p-31", "0x1.0c1c16p-28",
     "-0x1.1bda98p-29", "-0x1.416f8p-28", "-0x1.734946p-28", "-0x1.5a5d4cp-28",
     "-0x1.a5fb26p-29", "-0x1.cbdb9ep-27", "-0x1.04eba2p-27", "-0x1.b265dep-27",
     "-0x1.8b74b8p-27", "-0x1.4d081cp-27", "0x1.ba9b8ap-27", "-0x1.2252d6p-29",
     "-0x1.fdca6p-27", "0x1.3d09dep-27", "-0x1.f5cc68p-29", "0x1.27dd3ap-27"),
    # c1
    ("-0x1.804068p-5", "-0x1.1ad8ecp-3", "-0x1.c630fcp-3", "-0x1.2cd334p-2",
     "-0x1.679e46p-2", "-0x1.91ec1p-2", "-0x1.aba09ep-2", "-0x1.b5e32cp-2",
     "-0x1.b2cde6p-2", "-0x1.a50d4ap-2", "-0x1.8f80a2p-2", "-0x1.74e932p-2",
     "-0x1.57b05ap-2", "-0x1.39c6fep-2", "-0x1.1c9bc8p-2", "-0x1.0122e4p-2",
     "-0x1.cfd144p-3", "-0x1.a251ep-3", "-0x1.79cddep-3", "-0x1.56032ep-3",
     "-0x1.368804p-3", "-0x1.1ae238p-3", "-0x1.02968cp-3", "-0x1.da62fap-4",
     "-0x1.b49738p-4", "-0x1.9315acp-4", "-0x1.75443cp-4", "-0x1.5aa058p-4",
     "-0x1.42bbe2p-4", "-0x1.2d3a0ep-4", "-0x1.19cc84p-4", "-0x1.0830f6p-4"),
    # c2
    ("-0x1.7e738cp-2", "-0x1.6948a8p-2", "-0x1.413ffep-2", "-0x1.0a932ep-2",
     "-0x1.95786cp-3", "-0x1.0f453ep-3", "-0x1.1b302ep-4", "-0x1.96b63cp-7",
     "0x1.1c891p-5", "0x1.22107ep-4", "0x1.881c62p-4", "0x1.c45abp-4",
     "0x1.dd90c6p-4", "0x1.dbcb22p-4", "0x1.c7157ep-4", "0x1.a69724p-4",
     "0x1.8017a2p-4", "0x1.57dbc2p-4", "0x1.30c0bcp-4", "0x1.0c7a56p-4",
     "0x1.d7ba3ap-5", "0x1.9e4a26p-5", "0x1.6c6098p-5", "0x1.415556p-5",
     "0x1.1c56eap-5", "0x1.f91ddcp-6", "0x1.c26b6ep-6", "0x1.9335e8p-6",
     "0x1.6a4fap-6", "0x1.46bb42p-6", "0x1.27a61cp-6", "0x1.0c61ap-6"),
    # c3
    ("0x1.cb3d66p-6", "0x1.4bd698p-4", "0x1.009688p-3", "0x1.40c1fap-3",
     "0x1.61e4fp-3", "0x1.63f3c2p-3", "0x1.4ae1d2p-3", "0x1.1d7a22p-3",
     "0x1.c7c5bep-4", "0x1.4c4d24p-4", "0x1.ac334ep-5", "0x1.bb5c7p-6",
     "0x1.bec97ap-8", "-0x1.08b89ep-7", "-0x1.2642aep-6", "-0x1.82b6e6p-6",
     "-0x1.a9969cp-6", "-0x1.aabbcp-6", "-0x1.93fa3ap-6", "-0x1.702f78p-6",
     "-0x1.4720ecp-6", "-0x1.1dd9d6p-6", "-0x1.ee856p-7", "-0x1.a98078p-7",
     "-0x1.6d7b28p-7", "-0x1.3a2b5cp-7", "-0x1.0eb864p-7", "-0x1.d42c16p-8",
     "-0x1.966faap-8", "-0x1.6253c4p-8", "-0x1.36341cp-8", "-0x1.10b128p-8"),
    # c4
    ("0x1.c72004p-4", "0x1.956b2cp-4", "0x1.3a332p-4", "0x1.881824p-5",
     "0x1.133a22p-6", "-0x1.90037cp-7", "-0x1.24b3ep-5", "-0x1.a77ff4p-5",
     "-0x1.e7adfcp-5", "-0x1.eb4fcep-5", "-0x1.bfece2p-5", "-0x1.7678fcp-5",
     "-0x1.1fa16cp-5", "-0x1.924c5p-6", "-0x1.f20d22p-7", "-0x1.f667f8p-8",
     "-0x1.162d7ep-9", "0x1.9e6cbep-10", "0x1.eddeb6p-9", "0x1.3c0152p-8",
     "0x1.4e908cp-8", "0x1.423482p-8", "0x1.257674p-8", "0x1.0221fep-8",
     "0x1.bc5d34p-9", "0x1.799f56p-9", "0x1.3ed1eep-9", "0x1.0c976cp-9",
     "0x1.c4e55p-10", "0x1.7ed54ep-10", "0x1.44ce84p-10", "0x1.14bedcp-10"),
)
# The least float whose erf rounds to 1 (tests/test_c_math.py ERF_ONE): 1 from there on.
ERF_ONE = "0x1.f5a88ap+1f"


def _table() -> str:
    rows = ",\n  ".join("{" + ", ".join(f"{v}f" for v in row) + "}" for row in ERF_COEFFICIENTS)
    return ("static const float gk_erf_c[6][32] __attribute__((aligned(64))) = {\n  "
            + rows + "};\n")


ERF_TABLE_C = """\
#define GK_ERF_TABLE 1
typedef float gk_erf_v16 __attribute__((vector_size(64)));
typedef int32_t gk_erf_i16 __attribute__((vector_size(64)));
""" + _table() + """\
#pragma omp declare simd notinbranch simdlen(16)
float gkm_erff(float x) __attribute__((visibility("hidden")));
__attribute__((weak, visibility("hidden"), used)) float gk_erff_lane(float x)
    __asm__("gkm_erff");
float gk_erff_lane(float x) {
  const float a = fabsf(x);
  const float ac = a > 3.9375f ? 3.9375f : (a == a ? a : 0.0f);
  const int k = (int)(ac * 8.0f) & 31;
  const float t = __builtin_fmaf((float)k, -0.125f, ac) - 0.0625f;
  float p = gk_erf_c[5][k];
  for (int i = 4; i >= 1; --i) p = __builtin_fmaf(p, t, gk_erf_c[i][k]);
  float y = __builtin_fmaf(ac, gk_erf_c[0][k], ac * p);
  y = a >= """ + ERF_ONE + """ ? 1.0f : y;
  return x != x ? x : __builtin_copysignf(y, x);
}
__attribute__((weak, visibility("hidden"), used)) gk_erf_v16 gk_erff_lanes(gk_erf_v16 x)
    __asm__("_ZGVeN16v_gkm_erff");
gk_erf_v16 gk_erff_lanes(gk_erf_v16 x) {
  const gk_erf_v16 zero = {0};
  const gk_erf_i16 bits = (gk_erf_i16)x;
  const gk_erf_v16 a = (gk_erf_v16)(bits & 0x7fffffff);
  /* vminps: the second operand where a is NaN (the result is x there, at the end) */
  const gk_erf_v16 ac = __builtin_ia32_minps512_mask(a, zero + 3.9375f, zero, 0xffff, 4);
  const gk_erf_i16 k = __builtin_convertvector(ac * 8.0f, gk_erf_i16);  /* mod 32 in a shuffle */
  const gk_erf_v16 t = __builtin_ia32_vfmaddps512_mask(
      __builtin_convertvector(k, gk_erf_v16), zero - 0.125f, ac, 0xffff, 4) - 0.0625f;
  const gk_erf_v16 *c = (const gk_erf_v16 *)gk_erf_c;  /* row i: c[2 i], c[2 i + 1] */
  gk_erf_v16 p = __builtin_shuffle(c[10], c[11], k);
  for (int i = 4; i >= 1; --i)
    p = __builtin_ia32_vfmaddps512_mask(p, t, __builtin_shuffle(c[2 * i], c[2 * i + 1], k),
                                        0xffff, 4);
  gk_erf_v16 y = __builtin_ia32_vfmaddps512_mask(ac, __builtin_shuffle(c[0], c[1], k), ac * p,
                                                 0xffff, 4);
  y = __builtin_ia32_blendmps_512_mask(
      y, zero + 1.0f, __builtin_ia32_cmpps512_mask(a, zero + """ + ERF_ONE + """, 29, 0xffff, 4));
  y = (gk_erf_v16)((gk_erf_i16)y | (bits & INT32_MIN));
  return __builtin_ia32_blendmps_512_mask(y, x, __builtin_ia32_cmpps512_mask(x, x, 3, 0xffff, 4));
}
"""
