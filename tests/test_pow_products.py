"""Pow to the constant 2 or 3 in a generated kernel is products, not libmvec's powf
(backends/c/ops.py `power_by_products`): GPT-2's tanh GELU cubes its input, and the vector
powf cost a quarter of the block. Results stay within 2 ulp of the exact power, and the
special values (signed zeros, infinities, NaN, overflow, underflow) are numpy's."""
from __future__ import annotations

import numpy as np
import pytest
from cells import ON, Fn

import graphkernel
from graphkernel import ops

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-30, -1e-30, 1e30, -1e30,
                    1e-45, 3e38, -2.5], np.float32)


def fused_pow(x: np.ndarray, exponent: float) -> tuple[np.ndarray, str]:
    """x ** exponent through one generated kernel (times ones, so it fuses), and its C."""
    ones = np.ones_like(x)
    exe = graphkernel.compile(Fn(lambda v, w: ops.pow(v, exponent) * w), x, ones, options=ON)
    assert exe.kernel_count == 1 and exe.kernels[0].source is not None, exe.summary()
    (out,) = exe.run_arrays(x, ones)
    return out, exe.kernels[0].source


@pytest.mark.parametrize("exponent", [2.0, 3.0])
def test_a_square_or_cube_is_products_within_two_ulp(exponent, rng):
    x = np.concatenate([rng.standard_normal(4096).astype(np.float32) * 30, SPECIAL])
    got, source = fused_pow(x, exponent)
    assert "powf(" not in source, source
    exact = x.astype(np.float64) ** exponent
    with np.errstate(over="ignore"):  # 3e38 ** 2 is inf, as pow gives
        expected = np.power(x, np.float32(exponent))
    finite = np.isfinite(expected) & (np.abs(exact) >= np.finfo(np.float32).tiny)
    ulp = np.spacing(np.abs(expected[finite])).astype(np.float64)
    bound = 0.5 if exponent == 2 else 2.0  # x * x rounds once: pow's own result
    assert np.max(np.abs(got[finite] - exact[finite]) / ulp) <= bound
    rest = ~finite
    np.testing.assert_allclose(got[rest], expected[rest], rtol=0, atol=1e-44)
    assert np.array_equal(np.signbit(got[rest]), np.signbit(expected[rest]))  # -0.0, -inf


def test_another_exponent_keeps_pow(rng):
    x = np.abs(rng.standard_normal(64).astype(np.float32)) + 0.5
    got, source = fused_pow(x, 4.0)
    assert "powf(" in source
    np.testing.assert_allclose(got, x ** np.float32(4.0), rtol=2e-7)
