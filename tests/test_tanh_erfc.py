"""The float tanh and erfc the generated kernels call (graphkernel's gkm_tanhf, backends/c/
c_text.py; glibc's libmvec erfcf), against numpy's/math's float64, and the two GeLU forms
(docs/perf-notes.md "Numerics"):

- tanh: at most 2.55 ulp (2.52 measured; libmvec's tanhf, used before, 1.38 on all 2^32
  floats), never above 1 in magnitude, special values exactly;
- erfc (GeLU's erf form): at most 1.62 ulp measured on all 2^32 floats, special values exactly;
- GeLU, both forms, relative error against the float64 formula over a dense sweep, tails
  included, NaN, +-inf and -0.0.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from cells import ON, Fn

import graphkernel
from graphkernel import ops
from graphkernel.ops import operations as P

TANH_MAX_ULP = 2.55
ERFC_MAX_ULP = 1.62
# The smallest float32 whose tanh rounds to 1.
TANH_ONE = np.float32(float.fromhex("0x1.205968p+3"))  # 9.010914


def fused(fn, x: np.ndarray, call: str) -> np.ndarray:
    """fn(x) through one generated kernel (a lone op runs as numpy; times ones it fuses) whose
    C calls `call`."""
    ones = np.ones_like(x)
    exe = graphkernel.compile(Fn(lambda v, w: fn(v) * w), x, ones, options=ON)
    assert exe.kernel_count == 1 and exe.kernels[0].source is not None, exe.summary()
    assert call in exe.kernels[0].source, exe.kernels[0].source
    (out,) = exe.run_arrays(x, ones)
    return out


def ulp_error(y: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|y - exact| in units of the last place of the float32 nearest `exact` (subnormals:
    2^-149)."""
    nearest = exact.astype(np.float32)
    return np.abs(y.astype(np.float64) - exact) / np.spacing(np.abs(nearest)).astype(np.float64)


def sweep(windows: list[float]) -> np.ndarray:
    """Every 509th float32 bit pattern (8.4 million values, all exponents and signs) and every
    pattern in windows of 2^14 on either side of each of `windows`."""
    patterns = np.arange(0, 1 << 32, 509, dtype=np.uint64).astype(np.uint32)
    dense = [np.arange(-(1 << 14), 1 << 14, dtype=np.int64) +
             np.int64(np.array(w, np.float32).view(np.uint32)) for w in windows]
    return np.concatenate([patterns, np.concatenate(dense).astype(np.uint32)]).view(np.float32)


def erfc64(x: np.ndarray) -> np.ndarray:
    flat = x.astype(np.float64).ravel()
    return np.fromiter((math.erfc(v) if v == v else v for v in flat), np.float64,
                       count=flat.size).reshape(x.shape)


# ---- tanh ---------------------------------------------------------------------------------------

def test_tanh_within_the_stated_ulp_over_a_dense_sweep():
    x = sweep([0.0, 1e-4, 0.5, 1.0, 4.0, 7.0, 7.9, float(TANH_ONE), 9.0, -float(TANH_ONE)])
    y = fused(ops.tanh, x, "tanhf(")
    nan = np.isnan(x)
    assert np.isnan(y[nan]).all()
    assert (np.abs(y[~nan]) <= 1).all()
    err = ulp_error(y[~nan], np.tanh(x[~nan].astype(np.float64)))
    worst = int(np.argmax(err))
    assert err[worst] <= TANH_MAX_ULP, (x[~nan][worst], y[~nan][worst], err[worst])
    # Mostly correctly rounded: 7.7% off by more than half an ulp (libmvec's tanhf: 1.4%).
    assert np.mean(err > 0.5) < 0.1, np.mean(err > 0.5)


def test_tanh_special_values_exactly():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 20.0, -20.0, 1e30,
                  -np.finfo(np.float32).max, 1e-45, -1e-45, 1e-39, -3e-30], np.float32)
    y = fused(ops.tanh, x, "tanhf(")
    assert np.isnan(y[0])
    assert y[1] == 1 and y[2] == -1
    assert y[3] == 0 and not np.signbit(y[3]) and y[4] == 0 and np.signbit(y[4])
    assert y[5] == 1 and y[6] == -1 and y[7] == 1 and y[8] == -1
    np.testing.assert_array_equal(y[9:], x[9:])  # tanh(x) = x below 2^-12 in float


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_float16_and_float64_tanh_agree_with_numpy(dtype, rng):
    """float16 computes in float (tanhf) and rounds; float64 calls libmvec's tanh."""
    x = (rng.standard_normal(4096) * 4).astype(dtype)
    x[:4] = [np.nan, np.inf, -np.inf, -0.0]
    want = np.tanh(x.astype(np.float64)).astype(dtype)
    got = fused(ops.tanh, x, "tanh(" if dtype == np.float64 else "tanhf(")
    assert got.dtype == dtype and np.signbit(got[3])
    np.testing.assert_allclose(got, want, rtol=2 * np.finfo(dtype).eps, atol=0)


# ---- erfc (GeLU's erf form) ---------------------------------------------------------------------

def test_erfc_within_the_stated_ulp_over_a_dense_sweep():
    x = sweep([0.0, 0.5, 1.0, -1.0, 4.0, 9.0, 10.0, 10.0546])
    x = x[np.abs(x) < 20]  # the rest is 0 or 2 (special values below); math.erfc is slow
    y = fused(ops.erfc, x, "erfcf(")
    nan = np.isnan(x)
    assert np.isnan(y[nan]).all()
    err = ulp_error(y[~nan], erfc64(x[~nan]))
    worst = int(np.argmax(err))
    assert err[worst] <= ERFC_MAX_ULP, (x[~nan][worst], y[~nan][worst], err[worst])


def test_erfc_special_values_exactly():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 11.0, 1e30, -11.0, -1e30, 1e-40],
                 np.float32)
    y = fused(ops.erfc, x, "erfcf(")
    assert np.isnan(y[0])
    assert y[1] == 0 and not np.signbit(y[1]) and y[2] == 2
    assert (y[3:5] == 1).all() and (y[5:7] == 0).all() and (y[7:9] == 2).all() and y[9] == 1


# ---- GeLU, both forms ---------------------------------------------------------------------------

def _gelu64(x: np.ndarray, approximate: str) -> np.ndarray:
    v = x.astype(np.float64)
    if approximate == "none":
        return 0.5 * v * erfc64(-v / math.sqrt(2))
    # 0.5 v (1 + tanh(z)) = v sigmoid(2z), whose float64 value does not cancel for v < 0.
    two_z = 2 * math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)
    e = np.exp(-np.abs(two_z))
    return v * np.where(two_z >= 0, 1, e) / (1 + e)


# Relative error bounds over the sweep below (measured: body 1.3e-6 tanh, 1.1e-6 erf; whole
# range 1.2e-5 both; 2.5e-7 for |x| < 1): within |x| <= 4 (the body), and in the
# negative tail, where rounding t = -x/sqrt(2) (erf) or 2z = x (k + 0.044715 k x^2) (tanh) in
# float32 moves the result by about t^2 or |z| float32 ulps; results below float's normal range
# are compared in absolute terms.
GELU_BOUNDS = {"tanh": (2e-6, 2e-5), "none": (2e-6, 2e-5)}


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_relative_error_over_a_dense_sweep(approximate):
    bits = np.arange(0, 1 << 32, 997, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = np.concatenate([x[np.abs(x) < 16], np.linspace(-16, 16, 200_001, dtype=np.float32)])
    y = fused(lambda v: P.GeLU(approximate=approximate)(v), x, "erfcf(" if approximate ==
              "none" else "gkm_expf(")
    want = _gelu64(x, approximate)
    tiny = float(np.finfo(np.float32).tiny)
    scale = np.maximum(np.abs(want), tiny)
    rel = np.abs(y.astype(np.float64) - want) / scale
    body, tail = GELU_BOUNDS[approximate]
    inner = np.abs(x) <= 4
    assert rel[inner].max() <= body, (x[inner][np.argmax(rel[inner])], rel[inner].max())
    assert rel.max() <= tail, (x[np.argmax(rel)], rel.max())


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_special_values(approximate):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, -40.0, 3e38, -3e38],
                 np.float32)
    y = fused(lambda v: P.GeLU(approximate=approximate)(v), x, "erfcf(" if approximate ==
              "none" else "gkm_expf(")
    assert np.isnan(y[0])
    assert y[1] == np.inf
    assert y[2] == 0 and np.signbit(y[2])  # -inf * Phi(-inf): -0.0, not NaN
    assert y[3] == 0 and not np.signbit(y[3]) and y[4] == 0 and np.signbit(y[4])
    assert y[5] == np.float32(1e30) and y[8] == np.float32(3e38)
    assert (y[[6, 7, 9]] == 0).all() and np.signbit(y[[6, 7, 9]]).all()
