"""Maximum and Minimum against a number (a scalar constant, not NaN) take the C backend's
one-comparison templates (backends/c/ops.py `number_templates`): ReLU, ReLU6 and clips. They
must give numpy's results bit for bit, NaN, infinities, ties and signed zeros included, in
either operand order, through the pointwise emitter and a convolution block's epilogue; an
operand that is a tensor or a NaN constant keeps the general form."""
import numpy as np
import pytest
from cells import ON, Fn

import graphkernel
from graphkernel import nn, ops

SPECIAL = [np.nan, -0.0, 0.0, -1.5, 2.0, 6.0, 7.0, np.inf, -np.inf, -np.nan, 1e-30, -6.0]


def same_bits_as(got: np.ndarray, want: np.ndarray) -> None:
    """Equal values, NaN where NaN, and the same sign on every non-NaN (signed zeros). Not for
    float16: numpy's half routines return the first operand on a tie (maximum(-0.0, 0.0) is
    -0.0), its float32 and float64 ones the second; the C backend, before these templates and
    with them, follows the float32 rule (it computes float16 in float)."""
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    if want.dtype in (np.float32, np.float64):
        number = ~np.isnan(want)
        np.testing.assert_array_equal(np.signbit(got[number]), np.signbit(want[number]))


def operands(dtype, rng):
    if np.issubdtype(dtype, np.floating):
        x = np.array(SPECIAL * 3, dtype)
        return np.concatenate([x, rng.standard_normal(29).astype(dtype) * 4])
    return rng.integers(-9, 10, 64).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
@pytest.mark.parametrize("number", [0.0, -0.0, 6.0, -2.0, np.inf, -np.inf])
def test_max_and_min_with_a_number_match_numpy_bit_for_bit(dtype, number, rng):
    if not np.issubdtype(dtype, np.floating):
        if not np.isfinite(number):
            pytest.skip("an integer tensor has no infinity")
        number = int(number)
    x = operands(dtype, rng)
    c = dtype(number)

    def four(a):
        return (ops.maximum(a, number), ops.maximum(number, a),
                ops.minimum(a, number), ops.minimum(number, a))
    exe = graphkernel.compile(Fn(four), x, options=ON)
    got = exe.run_arrays(x)
    want = [np.maximum(x, c), np.maximum(c, x), np.minimum(x, c), np.minimum(c, x)]
    for g, w in zip(got, want):
        same_bits_as(g, w)
    source = "".join(k.source or "" for k in exe.kernels)
    assert "!=" not in source, "a number operand should take the one-comparison form"


def test_a_tensor_or_nan_operand_keeps_the_general_form(rng):
    x = operands(np.float32, rng)
    y = rng.permutation(x)
    exe = graphkernel.compile(Fn(lambda a, b: (ops.maximum(a, b), ops.minimum(a, np.nan))),
                              x, y, options=ON)
    got = exe.run_arrays(x, y)
    same_bits_as(got[0], np.maximum(x, y))
    same_bits_as(got[1], np.minimum(x, np.float32(np.nan)))
    source = "".join(k.source or "" for k in exe.kernels)
    assert source.count("!=") >= 2  # both keep NaN through their first operand's test


class ConvReLU6(nn.Cell):
    """A 1x1 and a 3x3 convolution, each with ReLU6 after it: the first one's block applies
    its epilogue to a blocked output the second reads."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(16, 32, 1, has_bias=True)
        self.b = nn.Conv2d(32, 16, 3, pad_mode="same", has_bias=True)
        self.relu6 = nn.ReLU6()

    def construct(self, x):
        return self.relu6(self.b(self.relu6(self.a(x))))


def test_conv_block_relu6_keeps_nan_and_clips_like_numpy(rng):
    x = rng.standard_normal((2, 16, 12, 12)).astype(np.float32) * 3
    x[0, :, 3, 4] = np.nan
    x[1, :, 5, 5] = np.inf
    net = ConvReLU6()
    fused = graphkernel.compile(net, x, options=ON)
    assert any(k.backend == "native" and "Maximum" in k.op_names and k.op_names[0].startswith(
        "Conv2D") for k in fused.kernels), [k.op_names for k in fused.kernels]
    got = fused.run_arrays(x)[0]
    unfused = graphkernel.compile(net, x, options=graphkernel.graph_kernel.pipeline.CompileOptions(
        enable_graph_kernel=False)).run_arrays(x)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(unfused))
    assert np.isnan(got).any() and np.all((got[~np.isnan(got)] >= 0) & (got[~np.isnan(got)] <= 6))
    number = ~np.isnan(unfused)
    np.testing.assert_allclose(got[number], unfused[number], rtol=1e-5, atol=1e-4)
