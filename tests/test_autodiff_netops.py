"""Gradients of the real-network ops beyond test_autodiff.CASES, against central differences
in float64, fusion on and off: every Conv2D pad_mode with strides, dilation and groups, pools
with 'same' padding, BatchNorm's statistics outputs and its inference form, Gather off axis 0
and with a scalar index, and Dropout's gradient through the mask its forward drew."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_autodiff import POS, A, check_gradients

import graphkernel as gk
from graphkernel import Tensor
from graphkernel.frontend import context
from graphkernel.ops import operations as P


# Fused on every run; unfused (each op a kernel of its own: the same gradient rules) in the
# slow step.
@pytest.fixture(params=[pytest.param(False, marks=pytest.mark.slow), True],
                ids=["unfused", "fused"])
def fusion(request: Any) -> Any:
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=request.param)
    yield request.param
    context.set_context(enable_graph_kernel=False)


@pytest.mark.parametrize("pad_mode, pad, stride, dilation, group", [
    ("valid", 0, 1, 1, 1), ("same", 0, 2, 1, 1), ("same", 0, 1, 2, 3), ("pad", 2, (2, 1), 1, 1),
    ("valid", 0, 2, (1, 2), 3)])
def test_conv2d_every_pad_mode(pad_mode: str, pad: Any, stride: Any, dilation: Any, group: int,
                               fusion: bool) -> None:
    rng = np.random.default_rng(3)
    conv = P.Conv2D(6, (3, 2), pad_mode=pad_mode, pad=pad, stride=stride, dilation=dilation,
                    group=group)
    check_gradients(lambda x, w: conv(x, w), [A(rng, (2, 3, 6, 5)), A(rng, (6, 3 // group, 3, 2))])


@pytest.mark.parametrize("op", ["MaxPool", "AvgPool"])
@pytest.mark.parametrize("kernel, strides", [(3, 2), ((2, 3), 1), (1, 1)])
def test_pools_same_padding(op: str, kernel: Any, strides: Any, fusion: bool) -> None:
    rng = np.random.default_rng(4)
    pool = getattr(P, op)(kernel_size=kernel, strides=strides, pad_mode="same")
    check_gradients(lambda x: pool(x), [A(rng, (2, 2, 5, 4))])


# Explicit pads (ONNX's), the average's padding counted or not (count_include_pad).
@pytest.mark.parametrize("counted", [False, True])
@pytest.mark.parametrize("kernel, strides, pad", [(3, 1, 1), ((3, 2), 2, (1, 0, 0, 1))])
def test_avg_pool_explicit_pads(counted: bool, kernel: Any, strides: Any, pad: Any,
                                fusion: bool) -> None:
    rng = np.random.default_rng(5)
    pool = P.AvgPool(kernel_size=kernel, strides=strides, pad_mode="pad", pad=pad,
                     count_include_pad=counted)
    check_gradients(lambda x: pool(x), [A(rng, (2, 2, 5, 4))])


def test_max_pool_gradient_goes_to_the_first_maximum_only(fusion: bool) -> None:
    x = np.ones((1, 1, 2, 2))
    grad = gk.grad(lambda t: P.ReduceSum()(P.MaxPool(kernel_size=2)(t)))(Tensor(x)).asnumpy()
    np.testing.assert_array_equal(grad, [[[[1.0, 0.0], [0.0, 0.0]]]])


def test_batch_norm_training_statistics_and_2d_input(fusion: bool) -> None:
    rng = np.random.default_rng(5)

    def fn(x: Any, s: Any, b: Any, m: Any, v: Any) -> Any:
        return P.BatchNorm(is_training=True, epsilon=1e-3)(x, s, b, m, v)[:3]

    check_gradients(fn, [A(rng, (4, 3, 2, 1)), A(rng, (3,)), A(rng, (3,)), A(rng, (3,)),
                         POS(rng, (3,))])
    check_gradients(fn, [A(rng, (5, 3)), A(rng, (3,)), A(rng, (3,)), A(rng, (3,)),
                         POS(rng, (3,))])


def test_batch_norm_inference_reaches_mean_and_variance(fusion: bool) -> None:
    rng = np.random.default_rng(6)

    def fn(x: Any, s: Any, b: Any, m: Any, v: Any) -> Any:
        return P.BatchNorm(is_training=False)(x, s, b, m, v)[0]

    check_gradients(fn, [A(rng, (2, 3, 2, 2)), A(rng, (3,)), A(rng, (3,)), A(rng, (3,)),
                         POS(rng, (3,))])


@pytest.mark.parametrize("axis, indices", [(1, [[2, 2, 0]]), (2, [1, 0, 1]), (0, 3)])
def test_gather_off_axis_zero_and_scalar_index(axis: int, indices: Any, fusion: bool) -> None:
    rng = np.random.default_rng(7)
    idx = np.array(indices, np.int64)
    check_gradients(lambda p: P.Gather()(p, Tensor(idx), axis), [A(rng, (4, 3, 2))])


def test_gather_gradient_counts_repeated_rows(fusion: bool) -> None:
    idx = Tensor(np.array([1, 1, 3, 1], np.int32))
    table = Tensor(np.zeros((5, 2), np.float32))
    grad = gk.grad(lambda t: P.ReduceSum()(P.Gather()(t, idx, 0)))(table).asnumpy()
    np.testing.assert_array_equal(grad, [[0, 0], [3, 3], [0, 0], [1, 1], [0, 0]])


def test_gather_gradient_of_negative_indices_reaches_their_rows(fusion: bool) -> None:
    """A Gather declared with negative indices (ONNX's): -1 is the last row, in the gradient too."""
    idx = Tensor(np.array([1, -4, 3, -1], np.int32))
    table = Tensor(np.zeros((5, 2), np.float32))
    gather = P.Gather(negative_indices=True)
    grad = gk.grad(lambda t: P.ReduceSum()(gather(t, idx, 0)))(table).asnumpy()
    np.testing.assert_array_equal(grad, [[0, 0], [2, 2], [0, 0], [1, 1], [1, 1]])


def test_dropout_gradient_uses_the_forward_mask(fusion: bool) -> None:
    x = np.random.default_rng(8).uniform(0.5, 1.5, (40, 30))
    weights = np.random.default_rng(9).uniform(0.5, 1.5, (40, 30))
    drop = P.Dropout(keep_prob=0.6, Seed0=1, Seed1=2)

    def fn(t: Any) -> Any:
        out, mask = drop(t)
        return P.ReduceSum()(out * Tensor(weights)), mask

    (_, mask), grad = gk.value_and_grad(fn, has_aux=True)(Tensor(x))
    mask = mask.asnumpy()
    assert 0 < mask.mean() < 1
    np.testing.assert_allclose(grad.asnumpy(), weights * mask / 0.6, rtol=1e-12)


def test_strided_slice_with_new_axis_and_ellipsis(fusion: bool) -> None:
    rng = np.random.default_rng(10)
    sl = P.StridedSlice(begin_mask=1, ellipsis_mask=2, new_axis_mask=4)
    check_gradients(lambda x: sl(x, (0, 0, 0, 1), (2, 0, 0, -1), (1, 1, 1, 2)),
                    [A(rng, (3, 2, 5))])
