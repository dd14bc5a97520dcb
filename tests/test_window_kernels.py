"""Convolutions and pools as generated C (backends/c/c_window.py): random geometries (odd sizes,
strides, dilation, every pad mode, groups, more channels than one vector holds, pixel counts
that leave a short block) against the ops' numpy references, fusion on and off; NaN and
infinities; float16 rounding once; a dynamic batch; the plan runs each as one native kernel.
Also: a per-channel epilogue computes its per-channel values outside the vector loop."""
import numpy as np
import pytest
from cells import OFF, ON, Fn

import graphkernel
from graphkernel import Tensor, context, nn
from graphkernel.backends.c.c_depthwise import PhasePlanes
from graphkernel.ir.opset import get_op
from graphkernel.ops import operations as P


def compiled(fn, *arrays, options=ON):
    return graphkernel.compile(Fn(fn), *arrays, options=options)


def reference(op, *arrays, **attrs):
    opdef = get_op(op)
    return opdef.reference(*arrays, **{**opdef.attr_defaults, **attrs})


def native_ops(exe):
    return [tuple(k.op_names) for k in exe.kernels if k.backend == "native"]


def random_conv(rng):
    """A random valid Conv2D geometry: (x shape, weight shape, attrs)."""
    while True:
        group = int(rng.choice([1, 1, 2, 3]))
        c = group * int(rng.integers(1, 6))
        o = group * int(rng.integers(1, 12))
        kernel = (int(rng.integers(1, 5)), int(rng.integers(1, 5)))
        stride = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        dilation = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
        mode = str(rng.choice(["valid", "same", "pad"]))
        pad = tuple(int(p) for p in rng.integers(0, 3, 4)) if mode == "pad" else 0
        h, w = int(rng.integers(1, 14)), int(rng.integers(1, 14))
        span = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]
        padded = (h + (sum(pad[:2]) if mode == "pad" else 0),
                  w + (sum(pad[2:]) if mode == "pad" else 0))
        if mode != "same" and (padded[0] < span[0] or padded[1] < span[1]):
            continue
        attrs = dict(out_channel=o, kernel_size=kernel, pad_mode=mode, pad=pad,
                     stride=stride, dilation=dilation, group=group)
        n = int(rng.integers(1, 4))
        return (n, c, h, w), (o, c // group) + kernel, attrs


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_random_convolutions_match_the_reference(dtype, rng):
    tol = 2e-5 if dtype == "float32" else 1e-12
    for _ in range(12):
        xs, ws, attrs = random_conv(rng)
        x = rng.standard_normal(xs).astype(dtype)
        w = rng.standard_normal(ws).astype(dtype)
        conv = P.Conv2D(**attrs)
        want = reference("Conv2D", x, w, **attrs)
        outs = []
        for options in (ON, OFF):
            exe = compiled(lambda a, b, f=conv: f(a, b), x, w, options=options)
            assert native_ops(exe) == [("Conv2D",)], (attrs, exe.kernels)
            outs.append(exe.run_arrays(x, w)[0])
            scale = max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(outs[-1], want, rtol=tol, atol=tol * scale,
                                       err_msg=str((xs, ws, attrs)))
        np.testing.assert_array_equal(outs[0], outs[1])


def test_wide_convolution_blocks_channels_and_pixels(rng):
    """More output channels than a vector holds, pixels that leave a short last block."""
    x = rng.standard_normal((3, 20, 9, 7)).astype(np.float32)
    w = rng.standard_normal((37, 20, 3, 3)).astype(np.float32)
    conv = P.Conv2D(37, 3, pad_mode="same")
    exe = compiled(lambda a, b: conv(a, b), x, w)
    want = reference("Conv2D", x.astype(np.float64), w.astype(np.float64),
                                      out_channel=37, kernel_size=3, pad_mode="same")
    np.testing.assert_allclose(exe.run_arrays(x, w)[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("geometry", [
    ((2, 3, 8, 8), 40, 3, dict(pad_mode="same")),  # channel blocks in a pair and one alone
    ((2, 4, 9, 6), 32, 3, dict(pad_mode="pad", pad=(1, 0, 2, 1), stride=(2, 1))),
    ((1, 6, 11, 7), 18, 2, dict(pad_mode="valid", dilation=(2, 3), group=3)),
    ((3, 1, 5, 5), 16, 3, dict(pad_mode="same", stride=2)),  # 3 x 3 out: rows one by one
    ((2, 3, 16, 8), 48, 3, dict(pad_mode="same")),  # 128 pixels: whole rows, by pixel
    ((2, 3, 16, 8), 20, 3, dict(pad_mode="same")),  # whole rows, a partial channel block
])
def test_narrow_outputs_go_in_blocks_of_whole_rows(dtype, geometry, rng):
    """Outputs at most 8 wide (the digits CNN's): row blocks, pairs of channel blocks, odd
    channel counts, strides, dilation, padding, groups; the same values fused and not."""
    xs, o, k, attrs = geometry
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((o, xs[1] // attrs.get("group", 1), k, k)).astype(dtype)
    attrs = dict(out_channel=o, kernel_size=k, **attrs)
    conv = P.Conv2D(**attrs)
    want = reference("Conv2D", x, w, **attrs)
    assert want.shape[3] <= 8
    tol = 2e-5 if dtype == "float32" else 1e-12
    outs = [compiled(lambda a, b: conv(a, b), x, w, options=options).run_arrays(x, w)[0]
            for options in (ON, OFF)]
    np.testing.assert_allclose(outs[0], want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("geometry", [
    ((1, 8, 30, 70), 20, 3, dict(pad_mode="same")),  # rows in 12-pixel segments + a short one
    ((1, 32, 40, 40), 40, 1, dict(pad_mode="valid")),  # 1x1; a channel-block pair + one alone
    ((2, 24, 19, 23), 48, 3, dict(pad_mode="pad", pad=(1, 1, 1, 1), stride=2)),
    ((1, 64, 20, 150), 64, 3, dict(pad_mode="same", group=64)),  # depthwise: 64-pixel chunks
    ((2, 5, 17, 131), 10, 3, dict(pad_mode="pad", pad=(1, 0, 1, 2), stride=2, group=5)),
    ((1, 3, 33, 35), 64, 7, dict(pad_mode="pad", pad=(3, 3, 3, 3), stride=2)),  # a 7x7 stem
    # 1x1 of few taps, row segments and a short one, stored by pixel (48 channels) or with a
    # partial channel block channel by channel (40)
    ((2, 24, 31, 45), 48, 1, dict(pad_mode="valid")),
    ((2, 24, 31, 45), 40, 1, dict(pad_mode="valid")),
])
def test_real_size_convolutions_share_an_image_over_threads(dtype, geometry, rng):
    """Images large enough that one image's work goes to threads (a batch of one or two),
    wide rows, depthwise convolutions vectorised along pixels, strides: against a float64
    reference, and the same values fused and not."""
    xs, o, k, attrs = geometry
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((o, xs[1] // attrs.get("group", 1), k, k)).astype(dtype)
    attrs = dict(out_channel=o, kernel_size=k, **attrs)
    conv = P.Conv2D(**attrs)
    want = reference("Conv2D", x.astype(np.float64), w.astype(np.float64), **attrs)
    taps = w.shape[1] * k * k
    assert o * want.shape[2] * want.shape[3] * taps >= 1 << 20 or xs[0] > 1
    tol = 2e-5 if dtype == "float32" else 1e-12
    outs = []
    for options in (ON, OFF):
        exe = compiled(lambda a, b: conv(a, b), x, w, options=options)
        assert native_ops(exe) == [("Conv2D",)]
        outs.append(exe.run_arrays(x, w)[0])
    np.testing.assert_allclose(outs[0], want, rtol=tol,
                               atol=tol * np.sqrt(taps) * max(1.0, np.abs(want).max()))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("geometry", [
    ((2, 24, 14, 14), 24, 3, dict(pad_mode="pad", pad=(1, 1, 1, 1), stride=2, group=24)),
    ((3, 12, 7, 7), 12, 3, dict(pad_mode="same", group=12)),  # 7 rows as one run
    ((2, 6, 15, 11), 6, 3, dict(pad_mode="pad", pad=(0, 2, 1, 0), stride=(3, 2), group=6)),
    ((1, 4, 29, 13), 8, 3, dict(pad_mode="pad", pad=(2, 1, 0, 1), stride=(1, 3),
                                dilation=(2, 1), group=4)),  # 2 outputs per group
    ((2, 9, 13, 17), 3, 2, dict(pad_mode="same", stride=2, dilation=2, group=3)),  # 3 inputs
    ((1, 3, 9, 150), 3, 5, dict(pad_mode="pad", pad=(2, 2, 2, 2), stride=2, group=3)),  # wide
    ((2, 5, 30, 30), 5, 3, dict(pad_mode="valid", stride=2, group=5)),  # blocks and a tail
])
def test_strided_depthwise_convolutions_read_stride_phases(dtype, geometry, rng):
    """Few output channels a group (depthwise): vectors along pixels over the scratch split
    into stride phases, narrow rows several at a time, wide rows in chunks, uneven strides,
    dilation, padding on one side, groups of several inputs or outputs; against a float64
    reference, fused and not."""
    xs, o, k, attrs = geometry
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((o, xs[1] // attrs["group"], k, k)).astype(dtype)
    attrs = dict(out_channel=o, kernel_size=k, **attrs)
    conv = P.Conv2D(**attrs)
    want = reference("Conv2D", x.astype(np.float64), w.astype(np.float64), **attrs)
    tol = 2e-5 if dtype == "float32" else 1e-12
    outs = []
    for options in (ON, OFF):
        exe = compiled(lambda a, b: conv(a, b), x, w, options=options)
        assert native_ops(exe) == [("Conv2D",)]
        outs.append(exe.run_arrays(x, w)[0])
    np.testing.assert_allclose(outs[0], want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()),
                               err_msg=str((xs, attrs)))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("hp, wp, sh, sw", [(9, 9, 1, 1), (16, 16, 2, 2), (15, 11, 3, 2),
                                            (7, 30, 1, 3)])
def test_stride_phases_put_a_strided_window_row_in_a_run(hp, wp, sh, sw):
    """Every padded element has its own place in the phase planes, and output pixel (i, j)
    of a tap reads i * wq + j past the tap's offset: so a block of pixels reads one run."""
    planes = PhasePlanes(hp, wp, sh, sw)
    places = {planes.offset(ci, r, q) for ci in range(2) for r in range(hp) for q in range(wp)}
    assert len(places) == 2 * hp * wp and max(places) < 2 * planes.per_channel
    for a, b in [(0, 0), (1, 2), (2, 1), (4, 3)]:
        for i in range((hp - 1 - a) // sh + 1):
            for j in range((wp - 1 - b) // sw + 1):
                assert planes.offset(1, i * sh + a, j * sw + b) == \
                    planes.offset(1, a, b) + i * planes.wq + j


@pytest.mark.parametrize("kind", ["MaxPool", "AvgPool"])
@pytest.mark.parametrize("geometry", [((1, 64, 112, 112), 3, 2, "same"),
                                      ((2, 8, 57, 61), 3, 2, "valid"),
                                      ((1, 70, 45, 47), 2, 1, "same"),
                                      # rows narrower than POOL_ROW_MIN_OUTPUTS: by output
                                      ((3, 5, 8, 8), 2, 2, "valid"),
                                      ((2, 4, 9, 7), 3, 2, "same")])
def test_real_size_pools_share_an_image_over_threads(kind, geometry, rng):
    """ResNet's stem pool and odd sizes at a batch of one: channels on threads, rows without
    tests inside the image; NaN and infinities where they fall, against the reference."""
    xs, k, stride, mode = geometry
    x = rng.standard_normal(xs).astype(np.float32)
    x.flat[rng.integers(0, x.size, 50)] = np.nan
    x.flat[rng.integers(0, x.size, 50)] = np.inf
    pool = getattr(P, kind)(kernel_size=k, strides=stride, pad_mode=mode)
    exe = compiled(lambda a: pool(a), x)
    assert native_ops(exe) == [(kind,)]
    want = reference(kind, x, kernel_size=k, strides=stride, pad_mode=mode)
    np.testing.assert_allclose(exe.run_arrays(x)[0], want, rtol=1e-6, atol=1e-6)


def test_convolution_propagates_nan_and_infinity(rng):
    x = rng.standard_normal((2, 2, 5, 5)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    x[0, 1, 2, 2] = np.nan
    x[1, 0, 0, 0] = np.inf
    conv = P.Conv2D(3, 3, pad_mode="same")
    out = compiled(lambda a, b: conv(a, b), x, w).run_arrays(x, w)[0]
    want = reference("Conv2D", x, w, out_channel=3, kernel_size=3, pad_mode="same")
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isposinf(out), np.isposinf(want))
    np.testing.assert_allclose(out[finite], want[finite], rtol=1e-5, atol=1e-5)


def test_float16_convolution_and_pools_round_once(rng):
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float16)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float16)
    conv = P.Conv2D(5, 3, pad_mode="same")
    exe = compiled(lambda a, b: conv(a, b), x, w)
    assert native_ops(exe) == [("Conv2D",)]
    out = exe.run_arrays(x, w)[0]
    assert out.dtype == np.float16
    wide = reference("Conv2D", x.astype(np.float32), w.astype(np.float32),
                                      out_channel=5, kernel_size=3, pad_mode="same")
    # One rounding of a float32 sum: within one float16 unit of the wide result.
    np.testing.assert_allclose(out.astype(np.float32), wide, rtol=1e-3, atol=2e-3)
    for prim in (P.MaxPool(3, 2, pad_mode="same"), P.AvgPool(3, 2, pad_mode="same")):
        exe = compiled(lambda a, p=prim: p(a), x)
        assert native_ops(exe) == [(type(prim).__name__,)]
        ref = reference(type(prim).__name__, x, kernel_size=3, strides=2,
                                                    pad_mode="same")
        np.testing.assert_array_equal(exe.run_arrays(x)[0], ref)


@pytest.mark.parametrize("kind", ["MaxPool", "AvgPool"])
def test_random_pools_match_the_reference_with_nan_and_infinity(kind, rng):
    for _ in range(10):
        kernel = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        stride = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        mode = str(rng.choice(["valid", "same"]))
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 5)),
                 int(rng.integers(kernel[0], 11)), int(rng.integers(kernel[1], 11)))
        x = rng.standard_normal(shape).astype(np.float32)
        flat = x.reshape(-1)
        picks = rng.integers(0, flat.size, 3)
        flat[picks[0]], flat[picks[1]], flat[picks[2]] = np.nan, np.inf, -np.inf
        attrs = dict(kernel_size=kernel, strides=stride, pad_mode=mode)
        prim = getattr(P, kind)(**attrs)
        exe = compiled(lambda a, f=prim: f(a), x)
        assert native_ops(exe) == [(kind,)]
        out = exe.run_arrays(x)[0]
        want = reference(kind, x, **attrs)
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6,
                                   err_msg=str((shape, attrs)))
        off = compiled(lambda a, f=prim: f(a), x, options=OFF).run_arrays(x)[0]
        np.testing.assert_array_equal(out, off)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_wide_max_pools_take_rows_first_and_match_the_reference(dtype, rng):
    """Rows of at least POOL_ROW_MIN_OUTPUTS outputs: a MaxPool of several window rows takes
    the maximum down the rows, then across (c_pool.SEPARABLE_MAX); odd widths, strides 1-3,
    windows 2-4 (one window row: the plain row form), padded and not, NaN and infinities,
    against the reference and the unfused plan."""
    from graphkernel.backends.c.c_pool import pool_parts
    for _ in range(6):
        kernel = (int(rng.integers(1, 5)), int(rng.integers(2, 5)))
        stride = (int(rng.integers(1, 4)), int(rng.integers(1, 3)))
        mode = str(rng.choice(["valid", "same"]))
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 5)),
                 int(rng.integers(kernel[0], 23)), int(rng.integers(16 * stride[1] + 3, 71)))
        x = rng.standard_normal(shape).astype(dtype)
        flat = x.reshape(-1)
        picks = rng.integers(0, flat.size, 6)
        flat[picks[:2]], flat[picks[2:4]], flat[picks[4:]] = np.nan, np.inf, -np.inf
        attrs = dict(kernel_size=kernel, strides=stride, pad_mode=mode)
        prim = P.MaxPool(**attrs)
        exe = compiled(lambda a, f=prim: f(a), x)
        assert native_ops(exe) == [("MaxPool",)]
        node = next(n for n in exe.graph.nodes if n.op == "MaxPool")
        source = "\n".join(pool_parts(node, "probe", {**get_op("MaxPool").attr_defaults,
                                                       **node.attrs})[0])
        assert ("vm[q]" in source) == (kernel[0] > 1), (shape, attrs)
        out = exe.run_arrays(x)[0]
        want = reference("MaxPool", x, **attrs)
        np.testing.assert_array_equal(out, want, err_msg=str((shape, attrs)))
        off = compiled(lambda a, f=prim: f(a), x, options=OFF).run_arrays(x)[0]
        np.testing.assert_array_equal(out, off)


class ConvPool(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="same", has_bias=True)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)

    def construct(self, x):
        return self.pool(self.relu(self.bn(self.conv(x))))


def conv_pool_reference(net, x):
    """The ConvPool net in numpy (the ops' references), from its parameters."""
    p = {k: v.asnumpy() for k, v in net.parameters_dict().items()}
    y = reference("Conv2D", x, p["conv.weight"], out_channel=8, kernel_size=3,
                                   pad_mode="same") + p["conv.bias"].reshape(-1, 1, 1)
    y = (y - p["bn.moving_mean"].reshape(-1, 1, 1)) / np.sqrt(
        p["bn.moving_variance"].reshape(-1, 1, 1) + 1e-5) * p["bn.gamma"].reshape(-1, 1, 1) + \
        p["bn.beta"].reshape(-1, 1, 1)
    return reference("MaxPool", np.maximum(y, 0), kernel_size=2, strides=2)


def test_a_dynamic_batch_passes_its_size_to_the_kernels(rng):
    context.set_context(enable_graph_kernel=True)
    net = ConvPool()
    net.bn.moving_variance.set_data(Tensor(rng.uniform(0.5, 1.5, 8).astype(np.float32)))
    net.bn.moving_mean.set_data(Tensor(rng.standard_normal(8).astype(np.float32)))
    net.set_inputs(Tensor(shape=[None, 3, 6, 6], dtype=graphkernel.float32))
    for b in (1, 5, 3):
        x = rng.standard_normal((b, 3, 6, 6)).astype(np.float32)
        out = net(Tensor(x)).asnumpy()
        assert out.shape == (b, 8, 3, 3)
        np.testing.assert_allclose(out, conv_pool_reference(net, x), rtol=1e-5, atol=1e-5)
    (generic,) = {id(v): v for v in net._compiled.values()}.values()
    (block,) = [k for k in generic.kernels if k.op_names[0] == "Conv2DFoldedBN"]
    assert block.backend == "native" and block.op_names[-1] == "MaxPool"
    assert "const int64_t N = " in block.source


def test_conv_bn_relu_pool_is_one_kernel_image_by_image(rng):
    net = ConvPool()
    net.bn.moving_variance.set_data(Tensor(rng.uniform(0.5, 1.5, 8).astype(np.float32)))
    x = rng.standard_normal((5, 3, 6, 6)).astype(np.float32)
    exe = graphkernel.compile(net, x, options=ON)
    (kernel,) = exe.kernels
    assert kernel.backend == "native"
    assert kernel.op_names[0] == "Conv2DFoldedBN" and kernel.op_names[-1] == "MaxPool"
    assert "Maximum" in kernel.op_names  # the ReLU
    conv = next(n for n in exe.graph.nodes if n.op == "Conv2DFoldedBN")
    assert conv.notes["conv_block"].startswith("one kernel with")
    want = conv_pool_reference(net, x)
    np.testing.assert_allclose(exe.run_arrays(x)[0], want, rtol=1e-5, atol=1e-5)
    off = graphkernel.compile(net, x, options=OFF)
    assert len(off.kernels) > 1
    np.testing.assert_allclose(off.run_arrays(x)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_random_blocks_with_a_residual_and_per_channel_epilogue(dtype, rng):
    """conv -> + bias per channel, * scale per channel, + residual, ReLU (-> pool)."""
    tol = 2e-5 if dtype == "float32" else 1e-12
    for trial in range(6):
        c = int(rng.integers(1, 6))
        o = c if trial % 2 == 0 else int(rng.integers(1, 20))  # residual only when o == c
        h, w = int(rng.integers(2, 11)), int(rng.integers(2, 11))
        x = rng.standard_normal((int(rng.integers(1, 4)), c, h, w)).astype(dtype)
        wt = rng.standard_normal((o, c, 3, 3)).astype(dtype)
        bias = rng.standard_normal((o, 1, 1)).astype(dtype)
        scale = rng.standard_normal((1, o, 1, 1)).astype(dtype)
        conv = P.Conv2D(o, 3, pad_mode="same", stride=1)
        pool = [None, P.MaxPool(2, 2), P.AvgPool(3, 1, pad_mode="same")][trial % 3]
        residual = o == c

        def fn(a, k, b, s, conv=conv, pool=pool, residual=residual):
            y = conv(a, k) + b
            y = y * s + a if residual else y * s
            y = P.ReLU()(y)
            return pool(y) if pool is not None else y

        exe = compiled(fn, x, wt, bias, scale)
        assert len(exe.kernels) == 1 and exe.kernels[0].op_names[0] == "Conv2D", exe.kernels
        y = reference("Conv2D", x, wt, out_channel=o, kernel_size=3, pad_mode="same") + bias
        y = np.maximum(y * scale + x if residual else y * scale, 0)
        if pool is not None:
            attrs = ({"kernel_size": 2, "strides": 2} if trial % 3 == 1 else
                     {"kernel_size": 3, "strides": 1, "pad_mode": "same"})
            y = reference(type(pool).__name__, y, **attrs)
        out = exe.run_arrays(x, wt, bias, scale)[0]
        np.testing.assert_allclose(out, y, rtol=tol, atol=tol * max(1.0, np.abs(y).max()))
        off = compiled(fn, x, wt, bias, scale, options=OFF).run_arrays(x, wt, bias, scale)[0]
        np.testing.assert_allclose(out, off, rtol=tol, atol=tol * max(1.0, np.abs(y).max()))


def test_a_convolution_read_twice_keeps_its_own_kernel_and_says_why(rng):
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    wt = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    conv = P.Conv2D(4, 3, pad_mode="same")

    def fn(a, k):
        y = conv(a, k)
        return P.ReLU()(y * 2.0), y

    exe = compiled(fn, x, wt)
    assert [k.op_names[0] for k in exe.kernels][0] == "Conv2D"
    assert len(exe.kernels) == 2
    node = next(n for n in exe.graph.nodes if n.op == "Conv2D")
    assert "a kernel of its own" in node.notes["conv_block"]
    y = reference("Conv2D", x, wt, out_channel=4, kernel_size=3, pad_mode="same")
    relu, raw = exe.run_arrays(x, wt)
    np.testing.assert_allclose(raw, y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(relu, np.maximum(y * 2, 0), rtol=1e-5, atol=1e-5)


def test_two_convolutions_feeding_one_epilogue_make_one_block(rng):
    """A residual block's main and shortcut convolutions both read by one fused Add + ReLU:
    both offer it an epilogue, one block takes it, the other convolution runs as a kernel of
    its own before it (lowering had planned neither, reading a result never computed)."""
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    wa = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    wb = rng.standard_normal((8, 4, 1, 1)).astype(np.float32)
    conv_a, conv_b = P.Conv2D(8, 3, pad_mode="same"), P.Conv2D(8, 1)

    def fn(a, ka, kb):
        return P.ReLU()(conv_a(a, ka) + conv_b(a, kb))

    exe = compiled(fn, x, wa, wb)
    assert len(exe.kernels) == 2, exe.kernels
    notes = sorted(n.notes["conv_block"] for n in exe.graph.nodes if n.op == "Conv2D")
    assert notes[0].startswith("a kernel of its own:") and "joins" in notes[0], notes
    assert notes[1].startswith("one kernel with"), notes
    want = np.maximum(reference("Conv2D", x, wa, out_channel=8, kernel_size=3, pad_mode="same")
                      + reference("Conv2D", x, wb, out_channel=8, kernel_size=1), 0)
    np.testing.assert_allclose(exe.run_arrays(x, wa, wb)[0], want, rtol=1e-5, atol=1e-4)


def test_a_per_channel_epilogue_hoists_its_scale_out_of_the_vector_loop(rng):
    bn = nn.BatchNorm2d(6)
    bn.moving_variance.set_data(Tensor(rng.uniform(0.5, 1.5, 6).astype(np.float32)))
    bn.set_train(False)
    x = rng.standard_normal((3, 6, 7, 5)).astype(np.float32)
    exe = graphkernel.compile(bn, x, options=ON)
    (kernel,) = exe.kernels
    # The per-channel scale (sqrt of the variance) is computed once per channel, before the
    # vector loop over the pixels.
    body = kernel.source[kernel.source.index("#pragma omp simd"):]
    assert "sqrtf" not in body and "sqrtf" in kernel.source
    off = graphkernel.compile(bn, x, options=OFF)
    np.testing.assert_allclose(exe.run_arrays(x)[0], off.run_arrays(x)[0], rtol=1e-5,
                               atol=1e-6)


class ConvBNReLU6(nn.Cell):
    """conv (bias-free, depthwise when group == cin) -> BatchNorm -> ReLU6 (+ the input)."""

    def __init__(self, cin: int, cout: int, k: int, stride: int, group: int,
                 residual: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, pad_mode="pad", padding=k // 2,
                              group=group)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU6()
        self.residual = residual

    def construct(self, x):
        y = self.act(self.bn(self.conv(x)))
        return y + x if self.residual else y


def conv_bn_relu6_reference(net, x, stride, group, residual):
    p = {k: v.asnumpy().astype(np.float64) for k, v in net.parameters_dict().items()}
    w = p["conv.weight"]
    y = reference("Conv2D", x.astype(np.float64), w, out_channel=w.shape[0],
                  kernel_size=w.shape[2], pad_mode="pad", pad=(w.shape[2] // 2,) * 4,
                  stride=stride, group=group)
    c = (-1, 1, 1)
    y = (y - p["bn.moving_mean"].reshape(c)) / np.sqrt(p["bn.moving_variance"].reshape(c)
                                                         + 1e-5)
    y = np.clip(y * p["bn.gamma"].reshape(c) + p["bn.beta"].reshape(c), 0, 6)
    return y + x if residual else y


@pytest.mark.parametrize("geometry", [
    (2, 24, 24, 1, 30, 1, 1, True),  # 1x1, a residual
    (1, 40, 40, 3, 23, 2, 40, False),  # depthwise, stride 2, odd size
    (2, 16, 16, 3, 33, 1, 16, True),  # depthwise, a residual
    (1, 20, 36, 3, 29, 1, 1, False),  # 3x3, a batch of one (its units on threads)
])
def test_real_size_conv_bn_relu6_is_one_kernel(geometry, rng):
    """A convolution whose scratch plane exceeds the stack (ResNet's and MobileNetV2's sizes)
    still takes its BatchNorm shift, ReLU6 and residual into its kernel, image by image (they
    were a kernel of their own that read the whole batch back); against float64 numpy."""
    n, cin, cout, k, hw, stride, group, residual = geometry
    net = ConvBNReLU6(cin, cout, k, stride, group, residual)
    net.bn.moving_variance.set_data(Tensor(rng.uniform(0.5, 1.5, cout).astype(np.float32)))
    net.bn.moving_mean.set_data(Tensor(rng.standard_normal(cout).astype(np.float32)))
    net.bn.beta.set_data(Tensor(rng.uniform(0, 3, cout).astype(np.float32)))
    net.set_train(False)
    x = rng.standard_normal((n, cin, hw, hw)).astype(np.float32)
    exe = graphkernel.compile(net, x, options=ON)
    assert len(exe.kernels) == 1 and exe.kernels[0].backend == "native", exe.kernels
    conv = next(v for v in exe.graph.nodes if v.op == "Conv2DFoldedBN")
    assert conv.notes["conv_block"].startswith("one kernel with"), conv.notes
    if k == 1:  # a 1x1 convolution without padding reads its input in place: no scratch
        assert "_fill(" not in exe.kernels[0].source
    else:
        assert "static __thread" in exe.kernels[0].source  # the scratch is not on the stack
    want = conv_bn_relu6_reference(net, x, stride, group, residual)
    for _ in range(2):  # the kept scratch plane's border is still zero on the second call
        np.testing.assert_allclose(exe.run_arrays(x)[0], want, rtol=1e-4, atol=1e-4)
    off = graphkernel.compile(net, x, options=OFF)
    np.testing.assert_allclose(off.run_arrays(x)[0], want, rtol=1e-4, atol=1e-4)


def test_a_pool_after_a_result_too_large_for_the_stack_is_a_kernel_of_its_own(rng):
    x = rng.standard_normal((2, 16, 30, 30)).astype(np.float32)
    wt = (rng.standard_normal((32, 16, 3, 3)) / 12).astype(np.float32)  # 112 KiB an image out
    conv = P.Conv2D(32, 3, pad_mode="same")
    pool = P.MaxPool(2, 2)
    exe = compiled(lambda a, k: pool(P.ReLU()(conv(a, k))), x, wt)
    assert [k.op_names[0] for k in exe.kernels] == ["Conv2D", "MaxPool"], exe.kernels
    node = next(n for n in exe.graph.nodes if n.op == "Conv2D")
    assert "MaxPool" in node.notes["conv_block"] and "KiB of stack" in node.notes["conv_block"]
    y = reference("Conv2D", x, wt, out_channel=32, kernel_size=3, pad_mode="same")
    want = reference("MaxPool", np.maximum(y, 0), kernel_size=2, strides=2)
    np.testing.assert_allclose(exe.run_arrays(x, wt)[0], want, rtol=1e-4, atol=1e-4)


# Register tiles (backends/c/conv_tile.py; tuned per kernel as Knobs.conv_channel_vectors and
# conv_pixels): the rule's, one channel vector, three and four (a group's last unit then holds
# the rest), fewer pixels than the rule's.
TILES = [(None, None), (1, None), (3, None), (4, 5), (2, 7)]
# (input channels, output channels, kernel, stride, size, group, dtype): a 1x1 read in place
# (stride 1, float32/64), 1x1 strided and float16 (their pixels sampled into the scratch), a
# padded 3x3 of grouped channels, output channel counts leaving a partial unit (48 = 3 vectors),
# rows wider than a tile (segments) and images of at most FLAT_PIXELS (flat blocks).
TILE_CASES = [(24, 48, 1, 1, 9, 1, "float32"), (20, 40, 1, 2, 19, 1, "float32"),
              (16, 72, 1, 1, 7, 1, "float64"), (12, 20, 1, 1, 6, 1, "float16"),
              (8, 64, 3, 1, 11, 2, "float32"), (6, 36, 3, 2, 13, 1, "float64")]


@pytest.mark.parametrize("tile", TILES, ids=str)
def test_register_tiles_match_the_reference(tile, rng):
    """Every tile gives the reference's results on every unit shape, and the same results as
    the rule's tile, bit for bit (each output sums its taps in tap order on every tile)."""
    from graphkernel.backends.c.config import CConfig
    from graphkernel.graph_kernel.pipeline import CompileOptions
    options = CompileOptions(enable_graph_kernel=True, backend_config=CConfig(
        conv_channel_vectors=tile[0], conv_pixels=tile[1]))
    for ci, co, k, s, hw, g, dtype in TILE_CASES:
        x = rng.standard_normal((2, ci, hw, hw)).astype(dtype)
        w = (rng.standard_normal((co, ci // g, k, k)) * 0.3).astype(dtype)
        conv = P.Conv2D(co, k, pad_mode="pad", pad=k // 2, stride=s, group=g)
        want = reference("Conv2D", x.astype(np.float64), w.astype(np.float64), out_channel=co,
                         kernel_size=k, pad_mode="pad", pad=k // 2, stride=s, group=g)
        exe = compiled(lambda a, b, f=conv: P.ReLU()(f(a, b)), x, w, options=options)
        got = exe.run_arrays(x, w)[0]
        tol = {"float16": 2e-3, "float32": 2e-5, "float64": 1e-12}[dtype]
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got.astype(np.float64), np.maximum(want, 0), rtol=tol,
                                   atol=tol * scale, err_msg=str((tile, ci, co, k, s, dtype)))
        rule = compiled(lambda a, b, f=conv: P.ReLU()(f(a, b)), x, w)
        np.testing.assert_array_equal(got, rule.run_arrays(x, w)[0])


def test_pointwise_convolution_reads_its_input_in_place(rng):
    """A 1x1 convolution without padding at stride 1 copies no scratch (its input is one); at
    stride 2 its scratch holds the sampled pixels alone, a quarter of the input."""
    from graphkernel.backends.c.c_window import conv_parts
    x = rng.standard_normal((2, 32, 10, 10)).astype(np.float32)
    w = rng.standard_normal((16, 32, 1, 1)).astype(np.float32)
    for stride, scratch in ((1, 0), (2, 32 * 5 * 5)):
        conv = P.Conv2D(16, 1, stride=stride)
        exe = compiled(lambda a, b, f=conv: f(a, b), x, w)
        node = next(n for n in exe.graph.nodes if n.op == "Conv2D")
        parts = conv_parts(node, "k", {**get_op("Conv2D").attr_defaults, **node.attrs})
        assert parts.scratch == scratch
        assert ("_fill(" in "".join(exe.executable.kernel_sources.values())) == bool(scratch)
        want = reference("Conv2D", x, w, out_channel=16, kernel_size=1, stride=stride)
        np.testing.assert_allclose(exe.run_arrays(x, w)[0], want, rtol=2e-5, atol=2e-5)
