"""Compiler bugs found by the differential tests (tests/test_differential.py), one test each."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import graphkernel
from graphkernel import nn
from graphkernel.errors import ShapeError
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P


class _Fn(nn.Cell):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def construct(self, *xs: Any) -> Any:
        return self.fn(*xs)


def _run(fn: Any, *arrays: np.ndarray, fusion: bool) -> list[np.ndarray]:
    exe = graphkernel.compile(_Fn(fn), *arrays, options=CompileOptions(enable_graph_kernel=fusion))
    return exe.run_arrays(*arrays)


@pytest.mark.parametrize("fusion", [False, True])
def test_reduce_mean_of_0d_tensor(fusion: bool) -> None:
    # schedule.analyze accepted a reduction of a 0-d tensor (no axis to reduce) and the emitter
    # never computed it: KeyError in codegen.
    x = np.array(1.5, np.float16)
    (out,) = _run(lambda x: P.ReduceMean(keep_dims=True)(x, ()), x, fusion=fusion)
    assert out.shape == () and out == np.float16(1.5)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_max_of_an_empty_axis_is_a_compile_error(op: str) -> None:
    # numpy raises at run time; the C kernel returned -inf/+inf. Now a clear compile-time error.
    x = np.zeros((0, 3), np.float32)
    with pytest.raises(ShapeError, match=r"empty axis.*\(0, 3\)") as info:
        _run(lambda x: getattr(P, op)()(x, 0), x, fusion=True)
    assert info.value.location is not None and info.value.location.filename == __file__


@pytest.mark.parametrize("fusion", [False, True])
def test_mean_over_no_elements_is_nan(fusion: bool) -> None:
    # The ReduceMean expander multiplied by 1/max(n, 1): 0 instead of numpy's NaN.
    x = np.zeros((0, 2), np.float32)
    (out,) = _run(lambda x: P.ReduceMean()(x, 0), x, fusion=fusion)
    assert out.shape == (2,) and np.isnan(out).all()


@pytest.mark.parametrize("fusion", [False, True])
def test_softmax_of_an_empty_tensor(fusion: bool) -> None:
    # The numpy reference raised (max of an empty axis); the expander hit the same error.
    x = np.zeros((0, 3), np.float32)
    outs = _run(lambda x: (P.Softmax(axis=0)(x), P.LogSoftmax(axis=0)(x)), x, fusion=fusion)
    assert [o.shape for o in outs] == [(0, 3), (0, 3)]


@pytest.mark.parametrize("fusion", [False, True])
def test_addn_of_one_tensor(fusion: bool) -> None:
    # Its expansion returns its input; inlining it left the graph returning the expansion's
    # own input placeholder (VerifyError: "return uses x0 before it is defined").
    x = np.array([1.5, -2.0], np.float16)
    (out,) = _run(lambda x: P.AddN()([x]), x, fusion=fusion)
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("fusion", [False, True])
def test_kernel_after_a_view_producing_library_op(fusion: bool) -> None:
    # BroadcastTo and Transpose run as numpy views (zero or permuted strides); the generated
    # kernel after them read the view's memory as if it were dense.
    x = np.array(-1.5, np.float16)
    m = np.arange(6, dtype=np.float32).reshape(2, 3)

    def fn(x: Any, m: Any) -> Any:
        b = P.BroadcastTo((4,))(x)
        t = P.Transpose()(m, (1, 0))
        return P.Select()(P.Less()(b, 0.0), b, 0.0), P.Neg()(t) * 2.0

    got = _run(fn, x, m, fusion=fusion)
    np.testing.assert_array_equal(got[0], np.full(4, -1.5, np.float16))
    np.testing.assert_array_equal(got[1], -m.T * 2)


@pytest.mark.parametrize("fusion", [False, True])
def test_cse_keeps_ops_on_zero_and_negative_zero_apart(fusion: bool) -> None:
    # CSE keyed scalar constants by value, and 0.0 == -0.0: x * -0.0 became x * 0.0.
    x = np.array([1.0, -2.0], np.float32)
    a, b = _run(lambda x: (P.Reciprocal()(x * 0.0), P.Reciprocal()(x * -0.0)), x, fusion=fusion)
    np.testing.assert_array_equal(a, [np.inf, -np.inf])
    np.testing.assert_array_equal(b, [-np.inf, np.inf])


@pytest.mark.parametrize("fusion", [False, True])
def test_cast_float64_to_float16_rounds_once(fusion: bool) -> None:
    # The kernel converted double -> float -> _Float16: 1 + 2**-11 + 2**-40 became the float
    # 1 + 2**-11 (a float16 tie), then rounded to even (1.0) instead of up like numpy.
    x = np.array([1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 3.0], np.float64)
    (out,) = _run(lambda x: P.Cast()(x * 1.0, np.float16), x, fusion=fusion)
    np.testing.assert_array_equal(out, x.astype(np.float16))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_multiply_add_rounds_each_op_like_numpy(dtype: type) -> None:
    # gcc's default -ffp-contract=fast turned x * y + z into one fma: a fused kernel's results
    # then differed from numpy (and from fusion off) in the last bit of a quarter of elements.
    rng = np.random.default_rng(0)
    x, y, z = (rng.standard_normal(4096).astype(dtype) for _ in range(3))
    for fusion in (False, True):
        a, b = _run(lambda x, y, z: (x * y + z, z - x * y), x, y, z, fusion=fusion)
        np.testing.assert_array_equal(a, x * y + z)
        np.testing.assert_array_equal(b, z - x * y)


@pytest.mark.parametrize("fusion", [False, True])
def test_float16_product_accumulates_in_float32(fusion: bool) -> None:
    # numpy's float16 product over axis 0 rounded (and overflowed) at every step while the
    # kernel accumulates in float: fusion off gave inf where fusion on gave 0.036.
    x = np.array([[3.56, 1.0], [259.0, 1.0], [163.6, 1.0], [2.4e-7, 1.0]], np.float16)
    want = np.prod(x.astype(np.float32), axis=0).astype(np.float16)
    (out,) = _run(lambda x: P.ReduceProd()(x, 0), x, fusion=fusion)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=1e-3)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_sign_of_negative_zero_is_positive_zero(dtype: type) -> None:
    # The kernel's Sign returned its operand for zeros, so sign(-0.0) was -0.0 (numpy: +0.0),
    # and 1/sqrt(sign(-0.0)) came out -inf instead of inf.
    x = np.array([-0.0, 0.0, -2.0, 3.0, np.nan], dtype)
    for fusion in (False, True):
        a, b = _run(lambda x: (P.Sign()(x) * 1.0, P.Rsqrt()(P.Sign()(x))), x, fusion=fusion)
        np.testing.assert_array_equal(np.signbit(a), np.signbit(np.sign(x)))
        np.testing.assert_array_equal(a, np.sign(x))
        np.testing.assert_array_equal(b, np.array([np.inf, np.inf, np.nan, 1.0, np.nan], dtype))
