"""graphkernel's float exp (`gkm_expf` in backends/c/c_text.py's PRELUDE: every fused float32 and
float16 Exp, and so Softmax, Sigmoid, Softplus, ...) against numpy's float64 exp: at most
1.04 ulp (the bound measured on all 2^32 floats, docs/perf-notes.md "Numerics"), and the
special values exactly: NaN, +-inf, overflow to inf, underflow to subnormals and to +0, -0.0."""
from __future__ import annotations

import numpy as np
import pytest
from cells import ON, Fn

import graphkernel
from graphkernel import ops

MAX_ULP = 1.04
# The largest float32 whose exp is finite, and the largest whose exp rounds to +0.
LAST_FINITE = np.float32(88.72283)
LAST_ZERO = np.float32(-103.972084)


def fused_exp(x: np.ndarray) -> np.ndarray:
    """exp(x) through a generated kernel (a lone Exp runs as numpy; times ones it fuses)."""
    ones = np.ones_like(x)
    exe = graphkernel.compile(Fn(lambda v, w: ops.exp(v) * w), x, ones, options=ON)
    assert exe.kernel_count == 1 and exe.kernels[0].source is not None, exe.summary()
    call = "gkm_exp(" if x.dtype == np.float64 else "gkm_expf("
    assert call in exe.kernels[0].source, exe.kernels[0].source
    (out,) = exe.run_arrays(x, ones)
    return out


def ulp_error(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|y - exp(x)| in units of the last place of the float32 nearest exp(x) (subnormals:
    2^-149), for results that are finite in float32."""
    exact = np.exp(x.astype(np.float64))
    nearest = exact.astype(np.float32)
    ulp = np.spacing(nearest).astype(np.float64)  # 2^-149 at and below the subnormals
    return np.abs(y.astype(np.float64) - exact) / ulp


def sweep() -> np.ndarray:
    """Every 509th float32 bit pattern (8.4 million values, all exponents and signs) and every
    pattern in windows around zero, the subnormal and zero thresholds and overflow."""
    patterns = np.arange(0, 1 << 32, 509, dtype=np.uint64).astype(np.uint32)
    windows = [np.float32(v) for v in (0.0, -87.33654, -87.0, LAST_ZERO, -104.0, LAST_FINITE,
                                       -0.34657359, 0.34657359, 1.0, -1.0)]
    dense = [np.arange(-(1 << 14), 1 << 14, dtype=np.int64) +
             np.int64(np.array(w, np.float32).view(np.uint32)) for w in windows]
    dense_bits = np.concatenate(dense).astype(np.uint32)
    return np.concatenate([patterns, dense_bits]).view(np.float32)


def test_exp_within_the_stated_ulp_over_a_dense_sweep():
    x = sweep()
    with np.errstate(over="ignore", invalid="ignore"):
        y = fused_exp(x)
        exact32 = np.exp(x.astype(np.float64)).astype(np.float32)
    nan = np.isnan(x)
    assert np.isnan(y[nan]).all()
    overflow = ~nan & np.isinf(exact32)
    assert (y[overflow] == np.inf).all(), x[overflow][y[overflow] != np.inf][:5]
    finite = ~nan & ~overflow
    err = ulp_error(x[finite], y[finite])
    worst = int(np.argmax(err))
    assert err[worst] <= MAX_ULP, (x[finite][worst], y[finite][worst], err[worst])
    # Correctly rounded almost everywhere: a sloppier exp (a degree-5 polynomial, one
    # rounding more) would be off by over half an ulp far more often.
    assert np.mean(err > 0.5) < 0.02, np.mean(err > 0.5)


def test_exp_special_values_exactly():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, LAST_FINITE,
                  np.nextafter(LAST_FINITE, np.float32(np.inf)), 89.0, 1e30,
                  np.finfo(np.float32).max, LAST_ZERO, np.nextafter(LAST_ZERO, np.float32(0)),
                  -104.0, -1e30, -np.finfo(np.float32).max, 1e-45, -1e-45, -87.5, -100.0],
                 np.float32)
    y = fused_exp(x)
    assert np.isnan(y[:2]).all()
    assert y[2] == np.inf and y[3] == 0 and not np.signbit(y[3])
    assert y[4] == 1 and y[5] == 1
    assert np.isfinite(y[6]) and y[6] > 3.4e38
    assert (y[7:11] == np.inf).all()
    assert y[11] == 0 and y[12] == np.float32(2 ** -149)  # the last value rounding to 0, then
    assert (y[13:16] == 0).all() and not np.signbit(y[13:16]).any()  # the first subnormal
    assert y[16] == 1 and y[17] == 1
    # Subnormal results round once, to the nearest subnormal.
    exact = np.exp(x[18:].astype(np.float64)).astype(np.float32)
    assert 0 < y[18] < np.finfo(np.float32).tiny and 0 < y[19]
    np.testing.assert_array_equal(y[18:], exact)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_float16_and_float64_exp_agree_with_numpy(dtype, rng):
    """float16 computes through gkm_expf and rounds once; float64 stays libm's exp."""
    x = (rng.standard_normal(4096) * 8).astype(dtype)
    x[:4] = [np.nan, np.inf, -np.inf, -0.0]
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(dtype)
        got = fused_exp(x)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=2 * np.finfo(dtype).eps, atol=0)
