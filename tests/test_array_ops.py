"""The array, math and nn primitives of ir/opdefs/array.py, math_ops.py and nn.py against numpy
(and, for Conv2D and the pools, against a direct loop written here), fusion on and off, odd
shapes. Their elementwise members are also in tests/test_ops.py's every-dtype sweep."""
import itertools

import numpy as np
import pytest
from cells import OFF, ON, Fn

import graphkernel
from graphkernel import Tensor, nn, ops
from graphkernel.errors import DTypeError, InputError, ShapeError
from graphkernel.ops import operations as P

DTYPES = ["float16", "float32", "float64", "int32", "int64", "bool"]


def both(fn, *arrays):
    """Outputs with fusion on and off (they must agree exactly) and the kernels of each."""
    results, kernels = [], []
    for options in (ON, OFF):
        exe = graphkernel.compile(Fn(fn), *arrays, options=options)
        results.append(exe.run_arrays(*arrays))
        kernels.append(exe.kernels)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    return results[0], kernels


def sample(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-20, 20, shape).astype(dtype)
    return (rng.standard_normal(shape) * 3).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_concat_stack_split_unstack_every_dtype(dtype, rng):
    a, b = sample(rng, (2, 3, 5), dtype), sample(rng, (2, 1, 5), dtype)
    out, _ = both(lambda x, y: P.Concat(1)((x, y, x)), a, b)
    np.testing.assert_array_equal(out[0], np.concatenate([a, b, a], axis=1))
    out, _ = both(lambda x: P.Stack(-1)((x, x)), a)
    np.testing.assert_array_equal(out[0], np.stack([a, a], axis=-1))
    out, _ = both(lambda x: P.Split(2, 5)(x), a)
    for got, want in zip(out, np.split(a, 5, axis=2)):
        np.testing.assert_array_equal(got, want)
    out, _ = both(lambda x: P.Unstack(axis=1)(x), a)
    assert len(out) == 3
    for i, got in enumerate(out):
        np.testing.assert_array_equal(got, a[:, i])


def test_concat_feeds_a_fused_kernel_and_its_result_is_right(rng):
    a, b = sample(rng, (3, 4), "float32"), sample(rng, (3, 7), "float32")
    out, kernels = both(lambda x, y: P.ReLU()(P.Concat(-1)((x * 2.0, y))) + 1.0, a, b)
    np.testing.assert_allclose(out[0], np.maximum(np.concatenate([a * 2, b], -1), 0) + 1)
    assert "native" in [k.backend for k in kernels[0]]


def test_concat_and_split_errors_name_the_shapes(rng):
    a, b = sample(rng, (2, 3), "float32"), sample(rng, (3, 3), "float32")
    with pytest.raises(ShapeError, match=r"Concat along axis 1: shapes \(2, 3\), \(3, 3\)"):
        graphkernel.compile(Fn(lambda x, y: P.Concat(1)((x, y))), a, b)
    with pytest.raises(ShapeError, match="output_num=2"):
        graphkernel.compile(Fn(lambda x: P.Split(0, 2)(x)), b)
    with pytest.raises(DTypeError, match="share one dtype"):
        P.Concat()((Tensor(a), Tensor(a.astype(np.float64))))


@pytest.mark.parametrize("dtype", ["float16", "int32", "bool"])
def test_slice_and_strided_slice(dtype, rng):
    x = sample(rng, (4, 5, 6), dtype)
    out, _ = both(lambda t: P.Slice()(t, (1, 0, 2), (2, -1, 3)), x)
    np.testing.assert_array_equal(out[0], x[1:3, :, 2:5])
    cases = [
        (dict(), (0, 1, 5), (4, 5, 0), (2, 2, -2), np.s_[0:4:2, 1:5:2, 5:0:-2]),
        (dict(begin_mask=0b101, end_mask=0b010), (3, 1, 4), (0, 1, 0), (-1, 1, -3),
         np.s_[:0:-1, 1:, :0:-3]),
        (dict(shrink_axis_mask=0b001, new_axis_mask=0b100), (-1, 0, 0, 2), (0, 5, 0, 6),
         (1, 3, 1, 1), np.s_[-1, 0:5:3, None, 2:6]),
        (dict(ellipsis_mask=0b010, shrink_axis_mask=0b100), (1, 0, -2), (3, 0, 0), (1, 1, 1),
         np.s_[1:3, ..., -2]),
    ]
    for masks, begin, end, strides, index in cases:
        out, _ = both(lambda t, m=masks, b=begin, e=end, s=strides:
                      P.StridedSlice(**m)(t, b, e, s), x)
        np.testing.assert_array_equal(out[0], x[index])


def test_slice_out_of_bounds_is_a_shape_error(rng):
    x = sample(rng, (4, 5), "float32")
    with pytest.raises(ShapeError, match="out of bounds for axis 1 of size 5"):
        graphkernel.compile(Fn(lambda t: P.Slice()(t, (0, 3), (2, 3))), x)
    with pytest.raises(ShapeError, match="index 4 is out of bounds for axis 0"):
        graphkernel.compile(Fn(lambda t: P.StridedSlice(shrink_axis_mask=1)(
            t, (4, 0), (5, 5), (1, 1))), x)


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_gather_and_one_hot(index_dtype, rng):
    params = sample(rng, (5, 3, 4), "float32")
    idx = rng.integers(0, 3, (2, 7)).astype(index_dtype)
    out, _ = both(lambda p, i: P.Gather()(p, i, 1) * 2.0, params, idx)
    np.testing.assert_array_equal(out[0], np.take(params, idx, axis=1) * 2)
    labels = np.array([[0, 3, -1], [2, 9, 1]], index_dtype)  # -1 and 9: rows of off_value
    out, _ = both(lambda i: P.OneHot()(i, 4, Tensor(1.0), Tensor(0.0)), labels)
    want = (labels[..., None] == np.arange(4)).astype(np.float32)
    np.testing.assert_array_equal(out[0], want)
    out, _ = both(lambda i: ops.one_hot(i, 4, 5, -1, axis=0), labels)
    np.testing.assert_array_equal(out[0], np.moveaxis(np.where(want, 5, -1), -1, 0))


def test_gather_index_out_of_range_is_a_clear_error(rng):
    params = sample(rng, (5, 3), "float32")
    with pytest.raises(ShapeError, match="index 5 is out of range for axis 0 of size 5"):
        graphkernel.compile(Fn(lambda p, i: P.Gather()(p, i, 0)), params,
                            np.array([1, 5], np.int32)).run_arrays(params,
                                                                   np.array([1, 5], np.int32))


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_a_gather_declared_with_negative_indices_counts_them_from_the_end(index_dtype, rng):
    """ONNX's (and numpy's) Gather: -size..-1 are rows from the end; MindSpore's refuses them."""
    params = sample(rng, (5, 3, 4), "float32")
    idx = np.array([[-3, 2, -1], [0, -2, 1]], index_dtype)
    out, _ = both(lambda p, i: P.Gather(negative_indices=True)(p, i, 1) * 2.0, params, idx)
    np.testing.assert_array_equal(out[0], np.take(params, idx, axis=1) * 2)
    for options in (ON, OFF):
        wrapping = graphkernel.compile(Fn(lambda p, i: P.Gather(negative_indices=True)(p, i, 1)),
                                       params, idx, options=options)
        for bad in (-4, 3):
            with pytest.raises(ShapeError, match=f"index {bad} is out of range for axis 1 of "
                               "size 3"):
                wrapping.run_arrays(params, np.array([[0, bad, 1], [0, 0, 0]], index_dtype))
        plain = graphkernel.compile(Fn(lambda p, i: P.Gather()(p, i, 1)), params, idx,
                                    options=options)
        with pytest.raises(ShapeError, match="index -3 is out of range for axis 1 of size 3"):
            plain.run_arrays(params, idx)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_arg_reductions(dtype, rng):
    x = sample(rng, (3, 6, 5), dtype)
    out, _ = both(lambda t: P.Argmax()(t), x)
    assert out[0].dtype == np.int32
    np.testing.assert_array_equal(out[0], np.argmax(x, -1))
    out, _ = both(lambda t: P.ArgMaxWithValue(axis=1, keep_dims=True)(t), x)
    np.testing.assert_array_equal(out[0], np.argmax(x, 1)[:, None])
    np.testing.assert_array_equal(out[1], np.max(x, 1, keepdims=True))
    out, _ = both(lambda t: P.ArgMinWithValue()(t), x)
    np.testing.assert_array_equal(out[0], np.argmin(x, 0))
    np.testing.assert_array_equal(out[1], np.min(x, 0))
    out, _ = both(lambda t: ops.argmax(t), x)
    assert out[0] == np.argmax(x) and out[0].dtype == np.int64


# float32 on every run; the other dtypes (a graph per fill op each) in the slow step.
@pytest.mark.parametrize("dtype", [d if d == "float32" else pytest.param(d, marks=pytest.mark.slow)
                                   for d in DTYPES])
def test_zeros_ones_fill_every_dtype(dtype, rng):
    x = sample(rng, (3, 5), dtype)
    out, _ = both(lambda t: (P.ZerosLike()(t), P.OnesLike()(t)), x)
    np.testing.assert_array_equal(out[0], np.zeros_like(x))
    np.testing.assert_array_equal(out[1], np.ones_like(x))
    out, kernels = both(lambda t: P.Cast()(P.OnesLike()(t), np.float32) * 2.0 +
                        P.Cast()(P.ZerosLike()(t), np.float32), x)
    np.testing.assert_array_equal(out[0], np.full(x.shape, 2, np.float32))
    assert [k.backend for k in kernels[0]] == ["native"]  # one generated kernel
    filled = P.Fill()(np.dtype(dtype), (2, 3), 1)
    assert filled.dtype == np.dtype(dtype) and filled.shape == (2, 3)
    out, _ = both(lambda t: P.Select()(P.Equal()(t, t), P.Fill()(np.dtype(dtype), (3, 5), 1), t), x)
    np.testing.assert_array_equal(out[0], np.ones((3, 5), dtype))


def test_shape_and_size_are_python_values_in_graph_mode(rng):
    x = sample(rng, (2, 3, 4), "float32")
    seen = []

    def fn(t):
        seen.append((P.Shape()(t), ops.size(t)))
        return P.Reshape()(t, (P.Shape()(t)[0], -1))

    out, _ = both(fn, x)
    assert seen[0] == ((2, 3, 4), 24)
    np.testing.assert_array_equal(out[0], x.reshape(2, -1))


def test_float_floor_div_and_mods_match_numpy_on_special_values():
    vals = np.array([0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 7.0, -7.0, 1e-30, np.inf, -np.inf, np.nan,
                     3.0, 0.1], np.float32)
    a, b = (np.array(p, np.float32).T for p in zip(*itertools.product(vals, vals)))

    class Kernel(nn.GraphKernel):
        def construct(self, x, y):
            return ops.floor_div(x, y), ops.floor_mod(x, y), P.Mod()(x, y)

    for options in (ON, OFF):
        exe = graphkernel.compile(Fn(Kernel()), a, b, options=options)
        got = exe.run_arrays(a, b)
        with np.errstate(all="ignore"):
            want = [np.floor_divide(a, b), np.remainder(a, b), np.fmod(a, b)]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)  # NaNs and signed zeros included
            np.testing.assert_array_equal(np.signbit(g), np.signbit(w))


def test_int_floor_div_edge_cases_do_not_trap():
    a = np.array([-2**31, -2**31, 7, -7, 7, -7, 0, 5], np.int32)
    b = np.array([-1, 1, 2, 2, -2, -2, 0, 0], np.int32)

    class Kernel(nn.GraphKernel):
        def construct(self, x, y):
            return ops.floor_div(x, y), ops.floor_mod(x, y), P.Mod()(x, y)

    got = graphkernel.compile(Fn(Kernel()), a, b, options=ON).run_arrays(a, b)
    with np.errstate(all="ignore"):
        for g, w in zip(got, [a // b, a % b, np.fmod(a, b)]):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("op,fn", [("ReduceAll", np.all), ("ReduceAny", np.any)])
@pytest.mark.parametrize("axis,keep", [((), False), (1, True), ((0, 2), False), (-1, False)])
def test_logical_reductions(op, fn, axis, keep, rng):
    x = rng.random((3, 5, 4)) < 0.8
    out, kernels = both(lambda t: getattr(P, op)(keep_dims=keep)(t, axis), x)
    np.testing.assert_array_equal(out[0], fn(x, axis=None if axis == () else axis,
                                             keepdims=keep))


# -- Conv2D and pools, against direct loops ----------------------------------------------------

def direct_conv(x, w, stride, pads, dilation, group):
    """A plain loop over every output element: independent of the im2col reference."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (t, b), (left, r) = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, b), (left, r)))
    oh = (h + t + b - (kh - 1) * dilation[0] - 1) // stride[0] + 1
    ow = (wd + left + r - (kw - 1) * dilation[1] - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // group
    for oc in range(o):
        g = oc // og
        for i in range(oh):
            for j in range(ow):
                acc = np.zeros(n)
                for ci in range(cg):
                    for p in range(kh):
                        for q in range(kw):
                            acc += xp[:, g * cg + ci, i * stride[0] + p * dilation[0],
                                      j * stride[1] + q * dilation[1]] * w[oc, ci, p, q]
                out[:, oc, i, j] = acc
    return out


CONV_CASES = [
    # (x shape, out channels, kernel, stride, dilation, group, pad_mode, pad)
    ((2, 3, 7, 5), 4, (3, 3), 1, 1, 1, "valid", 0),
    ((1, 4, 8, 9), 6, (3, 2), 2, 1, 2, "same", 0),
    ((2, 2, 9, 7), 2, (3, 3), (2, 1), (2, 1), 2, "pad", (1, 2, 0, 3)),
    ((1, 1, 1, 1), 3, (1, 1), 1, 1, 1, "valid", 0),
    ((3, 6, 5, 5), 6, (5, 5), 3, 1, 6, "same", 0),  # depthwise
    ((1, 3, 4, 11), 2, (1, 4), (1, 3), 1, 1, "pad", 2),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(c[0]) + c[6] for c in CONV_CASES])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_conv2d_matches_a_direct_loop(case, dtype, rng):
    shape, o, kernel, stride, dilation, group, pad_mode, pad = case
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal((o, shape[1] // group) + kernel).astype(dtype)
    conv = P.Conv2D(o, kernel, pad_mode=pad_mode, pad=pad, stride=stride, dilation=dilation,
                    group=group)
    out, _ = both(lambda a, b: conv(a, b), x, w)
    from graphkernel.ir.opdefs.nn import pair, window_padding
    st, dl = pair(stride, "", ""), pair(dilation, "", "")
    pads = window_padding(shape[2:], kernel, st, dl, pad_mode, pad, "")
    want = direct_conv(x, w, st, pads, dl, group)
    np.testing.assert_allclose(out[0], want, rtol=1e-4 if dtype == "float32" else 1e-10,
                               atol=1e-4 if dtype == "float32" else 1e-10)


def test_conv2d_float16_computes_wide(rng):
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float16)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float16)
    out, _ = both(lambda a, b: P.Conv2D(3, 3, pad_mode="same")(a, b), x, w)
    assert out[0].dtype == np.float16
    want = direct_conv(x, w, (1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    np.testing.assert_allclose(out[0].astype(np.float64), want, rtol=5e-3, atol=5e-3)


def test_conv2d_bad_arguments_are_shape_errors(rng):
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    with pytest.raises(ShapeError, match="group=3 must divide"):
        graphkernel.compile(Fn(lambda a, b: P.Conv2D(6, 3, group=3)(a, b)), x, w)
    with pytest.raises(ShapeError, match="needs pad_mode='pad'"):
        graphkernel.compile(Fn(lambda a, b: P.Conv2D(6, 3, pad=1, group=2)(a, b)), x, w)
    with pytest.raises(ShapeError, match="larger than the padded input"):
        graphkernel.compile(Fn(lambda a, b: P.Conv2D(6, 3, dilation=3, group=2)(a, b)), x, w)


def direct_pool(x, kernel, stride, pads, kind, counted=False):
    (t, b), (left, r) = pads
    n, c, h, w = x.shape
    oh = (h + t + b - kernel[0]) // stride[0] + 1
    ow = (w + left + r - kernel[1]) // stride[1] + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * stride[0] - t, j * stride[1] - left
            window = x[:, :, max(r0, 0):min(r0 + kernel[0], h), max(c0, 0):min(c0 + kernel[1], w)]
            if kind == "max":
                out[:, :, i, j] = window.max(axis=(2, 3))
            else:  # counted: the padding's zeros are in the mean
                size = kernel[0] * kernel[1] if counted else window.shape[2] * window.shape[3]
                out[:, :, i, j] = window.astype(np.float64).sum(axis=(2, 3)) / size
    return out


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("shape,kernel,stride,mode", [
    ((2, 3, 7, 5), (2, 2), (2, 2), "valid"), ((1, 2, 7, 6), (3, 3), (2, 2), "same"),
    ((1, 1, 5, 9), (1, 3), (1, 2), "same"), ((2, 2, 1, 1), 1, 1, "valid"),
    ((1, 3, 6, 6), 3, 1, "same")])
def test_pools_match_direct_loops(kind, shape, kernel, stride, mode, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    prim = (P.MaxPool if kind == "max" else P.AvgPool)(kernel_size=kernel, strides=stride,
                                                       pad_mode=mode)
    out, _ = both(lambda a: prim(a), x)
    from graphkernel.ir.opdefs.nn import pair, window_padding
    k, s = pair(kernel, "", ""), pair(stride, "", "")
    pads = window_padding(shape[2:], k, s, (1, 1), mode, 0, "")
    np.testing.assert_allclose(out[0], direct_pool(x, k, s, pads, kind), rtol=1e-6, atol=1e-6)


# ONNX's explicit pads (ResNet's stem pool: 3x3, stride 2, pad 1; asymmetric ones from ceil_mode)
# taken by the pool itself: a window's padding never wins a maximum and is not averaged. Both
# plane forms: output by output (narrow rows) and row by row (16 outputs a row or more).
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("shape,kernel,stride,pad", [
    ((2, 3, 9, 9), 3, 2, 1), ((1, 2, 7, 6), (3, 2), (2, 1), (1, 0, 0, 1)),
    ((1, 2, 34, 40), 3, 2, (1, 2, 1, 2)), ((1, 1, 4, 4), 2, 2, (0, 1, 1, 0))])
def test_pools_with_explicit_pads_match_direct_loops(kind, shape, kernel, stride, pad, rng):
    x = rng.standard_normal(shape).astype(np.float32) - 3  # all negative: padding must not win
    prim = (P.MaxPool if kind == "max" else P.AvgPool)(kernel_size=kernel, strides=stride,
                                                       pad_mode="pad", pad=pad)
    out, _ = both(lambda a: prim(a), x)
    from graphkernel.ir.opdefs.nn import pair, window_padding
    k, s = pair(kernel, "", ""), pair(stride, "", "")
    pads = window_padding(shape[2:], k, s, (1, 1), "pad", pad, "")
    np.testing.assert_allclose(out[0], direct_pool(x, k, s, pads, kind), rtol=1e-6, atol=1e-6)


# count_include_pad (ONNX's AveragePool, torch's avg_pool2d default): the padding's zeros are
# averaged too, every window dividing by its size; both plane forms.
@pytest.mark.parametrize("shape,kernel,stride,pad", [
    ((2, 3, 9, 9), 3, 1, 1), ((1, 2, 7, 6), (3, 2), (2, 1), (1, 0, 0, 1)),
    ((1, 2, 35, 35), 3, 1, 1)])
def test_avg_pools_counting_their_pads_match_direct_loops(shape, kernel, stride, pad, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    prim = P.AvgPool(kernel_size=kernel, strides=stride, pad_mode="pad", pad=pad,
                     count_include_pad=True)
    out, _ = both(lambda a: prim(a), x)
    from graphkernel.ir.opdefs.nn import pair, window_padding
    k, s = pair(kernel, "", ""), pair(stride, "", "")
    pads = window_padding(shape[2:], k, s, (1, 1), "pad", pad, "")
    np.testing.assert_allclose(out[0], direct_pool(x, k, s, pads, "avg", counted=True),
                               rtol=1e-6, atol=1e-6)


def test_a_pool_pad_without_pad_mode_pad_is_a_clear_error(rng):
    x = rng.standard_normal((1, 1, 6, 6)).astype(np.float32)
    with pytest.raises(ShapeError, match="needs pad_mode='pad'"):
        graphkernel.compile(Fn(lambda a: P.MaxPool(kernel_size=3, pad=1)(a)), x)
    with pytest.raises(ShapeError, match="is negative"):
        graphkernel.compile(Fn(lambda a: P.MaxPool(kernel_size=3, pad_mode="pad", pad=-1)(a)),
                            x)


# -- BatchNorm and Dropout ---------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3, 5, 2), (6, 5), (1, 1, 1, 1)])
@pytest.mark.parametrize("training", [False, True])
def test_batch_norm_matches_numpy_fused_and_not(shape, training, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    c = shape[1]
    scale, bias = rng.random(c).astype(np.float32) + 0.5, rng.standard_normal(c).astype(np.float32)
    mean, var = rng.standard_normal(c).astype(np.float32), rng.random(c).astype(np.float32) + 0.1
    bn = P.BatchNorm(is_training=training, epsilon=1e-3)
    axes = (0,) if len(shape) == 2 else (0, 2, 3)
    bshape = (1, c) + (1,) * (len(shape) - 2)
    m = x.astype(np.float64).mean(axes) if training else mean
    v = x.astype(np.float64).var(axes) if training else var
    want = (x - m.reshape(bshape)) / np.sqrt(v.reshape(bshape) + 1e-3) * scale.reshape(bshape) \
        + bias.reshape(bshape)
    for options in (ON, OFF):
        exe = graphkernel.compile(Fn(lambda *a: bn(*a)), x, scale, bias, mean, var,
                                  options=options)
        got = exe.run_arrays(x, scale, bias, mean, var)
        np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got[1], m, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[2], v, rtol=1e-4, atol=1e-6)
        if options is ON:
            assert "BatchNorm" not in [k.op_names[0] for k in exe.kernels]  # expanded


def test_inference_batch_norm_fuses_into_one_kernel_with_relu(rng):
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    params = [rng.random(3).astype(np.float32) + 0.5 for _ in range(4)]
    bn = P.BatchNorm()
    exe = graphkernel.compile(Fn(lambda a, *p: P.ReLU()(bn(a, *p)[0])), x, *params, options=ON)
    big = [k for k in exe.kernels if k.output.endswith("[2,3,4,4]")]
    assert len(big) == 1 and big[0].backend == "native"
    assert {"Mul", "Add", "Maximum"} <= set(big[0].op_names)


def test_dropout_is_seeded_and_scales_the_kept_values(rng):
    x = rng.standard_normal((200, 50)).astype(np.float32)
    drop = P.Dropout(keep_prob=0.8, Seed0=3, Seed1=4)
    exe = graphkernel.compile(Fn(lambda a: drop(a)), x, options=ON)
    out1, mask1 = exe.run_arrays(x)
    out2, mask2 = exe.run_arrays(x)
    assert not np.array_equal(mask1, mask2)  # a new mask every call
    assert set(np.unique(mask1)) <= {0.0, 1.0} and abs(mask1.mean() - 0.8) < 0.02
    np.testing.assert_allclose(out1, x * mask1 / np.float32(0.8), rtol=1e-6)
    again = graphkernel.compile(Fn(lambda a: drop(a)), x, options=ON)
    from graphkernel.ir.opdefs import nn as nn_defs
    nn_defs._generators.pop((3, 4))  # a fresh stream from the same seeds repeats itself
    np.testing.assert_array_equal(again.run_arrays(x)[1], mask1)


def test_two_dropouts_on_one_input_are_not_merged(rng):
    x = rng.standard_normal((64, 64)).astype(np.float32)
    drop = P.Dropout(keep_prob=0.5)
    exe = graphkernel.compile(Fn(lambda a: (drop(a)[1], drop(a)[1])), x, options=ON)
    m1, m2 = exe.run_arrays(x)
    assert not np.array_equal(m1, m2)


def test_tensor_attribute_must_be_concrete():
    x = Tensor(np.array([0, 1], np.int32))
    with pytest.raises(InputError, match="on_value"):
        graphkernel.compile(Fn(lambda i: P.OneHot()(i, 3, P.Cast()(i, np.float32), 0.0)), x)


def test_tensor_indexing_inside_construct(rng):
    x = sample(rng, (3, 4, 5), "float32")
    ids = np.array([2, 0, 2], np.int32)
    out, kernels = both(lambda t, i: (t[0], t[:, 1:3], t[..., None], t[-1, ::-2, 1],
                                      t[1:, None, -3:-1, ...], t[i], t[:, -1] * 2.0), x, ids)
    wants = [x[0], x[:, 1:3], x[..., None], x[-1, ::-2, 1], x[1:, None, -3:-1, ...], x[ids],
             x[:, -1] * 2]
    for got, want in zip(out, wants):
        np.testing.assert_array_equal(got, want)
    ops_run = {op for k in kernels[0] for op in k.op_names}
    assert ops_run <= {"StridedSlice", "Gather", "Mul"}


def test_bad_indices_are_clear_errors(rng):
    x = sample(rng, (3, 4), "float32")
    from graphkernel.errors import UnsupportedError
    with pytest.raises(ShapeError, match="index 3 is out of bounds for axis 0 of size 3"):
        graphkernel.compile(Fn(lambda t: t[3]), x)
    with pytest.raises(UnsupportedError, match="list"):
        graphkernel.compile(Fn(lambda t: t[[0, 1]]), x)
    with pytest.raises(UnsupportedError, match="immutable"):
        Tensor(x)[0] = 1.0
