"""Convolution gradients as forward convolutions and products (graph_kernel/grad_expanders.py):
Conv2DBackpropInput as one stride-1 convolution per stride phase of the flipped, transposed
weights, Conv2DBackpropFilter as a convolution with batch and channels swapped (a product for a
1x1 kernel). Against the ops' numpy references on random and ResNet-like geometries (strides
1-3, pads, dilation, groups, depthwise, 1x1/3x3/7x7, float32/float64/float16), the plan running
them as generated window kernels and BLAS (no step runs the reference; a grouped filter
gradient is a kernel of its own, backends/c/c_filter_grad.py; a 1x1 input gradient on a few
pixels a product), and gradients of a small conv net against torch."""
import numpy as np
import pytest
from cells import OFF, ON, Fn
from test_window_kernels import random_conv, reference

import graphkernel
from graphkernel import Tensor, context, nn
from graphkernel.graph_kernel.grad_expanders import DX_PRODUCT_MAX_PIXELS
from graphkernel.ops import operations as P

BACKPROPS = ("Conv2DBackpropInput", "Conv2DBackpropFilter")


def backprops(attrs, x_shape, w_shape, options=ON, dtype="float32"):
    """The two backprops of a Conv2D, each compiled alone: (input's, filter's)."""
    d_in, d_w = P.Conv2DBackpropInput(**attrs), P.Conv2DBackpropFilter(**attrs)
    out = reference("Conv2D", np.zeros(x_shape, dtype), np.zeros(w_shape, dtype), **attrs).shape
    dout = np.zeros(out, dtype)
    return (graphkernel.compile(Fn(lambda d, w: d_in(d, w, x_shape)), dout,
                                np.zeros(w_shape, dtype), options=options),
            graphkernel.compile(Fn(lambda d, x: d_w(d, x, w_shape)), dout,
                                np.zeros(x_shape, dtype), options=options))


def reference_steps(exe):
    """The plan's steps that run a backprop's numpy reference."""
    return [s.op for s in exe.plan.steps if s.op in BACKPROPS]


def window_kernels(exe):
    return [s for s in exe.plan.steps
            if s.lowering is not None and s.lowering.kind.value == "window"]


def check(attrs, x_shape, w_shape, rng, dtype="float32"):
    tol = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-3}[dtype]
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    out = reference("Conv2D", x, w, **attrs)
    dout = rng.standard_normal(out.shape).astype(dtype)
    exe_in, exe_w = backprops(attrs, x_shape, w_shape, dtype=dtype)
    for exe, args, op, size in ((exe_in, (dout, w), BACKPROPS[0], {"input_size": x_shape}),
                                (exe_w, (dout, x), BACKPROPS[1], {"filter_size": w_shape})):
        got = exe.run_arrays(*args)[0]
        want = reference(op, *args, **size, **attrs)
        assert got.dtype == want.dtype and got.shape == want.shape
        scale = max(1.0, float(np.abs(want.astype(np.float64)).max()))
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=0, atol=tol * scale, err_msg=f"{op} {attrs}")
    return exe_in, exe_w


RESNET_LIKE = [  # (x shape, weight shape, attrs): ResNet's convolutions, small
    ((2, 3, 17, 16), (8, 3, 7, 7), dict(kernel_size=7, stride=2, pad_mode="pad", pad=3)),
    ((2, 8, 9, 9), (16, 8, 1, 1), dict(kernel_size=1)),
    ((2, 16, 9, 8), (16, 16, 3, 3), dict(kernel_size=3, pad_mode="pad", pad=1)),
    ((2, 16, 9, 9), (16, 16, 3, 3), dict(kernel_size=3, stride=2, pad_mode="pad", pad=1)),
    ((2, 16, 10, 9), (32, 16, 1, 1), dict(kernel_size=1, stride=2)),
    ((1, 24, 7, 7), (40, 24, 1, 1), dict(kernel_size=1)),  # few pixels: one product
    ((2, 6, 11, 10), (9, 6, 3, 3), dict(kernel_size=3, dilation=2, pad_mode="same")),
    ((2, 6, 12, 11), (6, 3, 3, 3), dict(kernel_size=3, group=2, stride=2, pad_mode="same")),
    ((2, 8, 9, 9), (8, 1, 3, 3), dict(kernel_size=3, group=8, pad_mode="pad", pad=1)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("x_shape, w_shape, attrs", RESNET_LIKE)
def test_resnet_like_gradients_match_the_reference_as_kernels(x_shape, w_shape, attrs, dtype,
                                                              rng):
    attrs = {"out_channel": w_shape[0], **attrs}
    exe_in, exe_w = check(attrs, x_shape, w_shape, rng, dtype)
    # The input's gradient is convolutions (a product for a 1x1 on few pixels); the filter's
    # too (a grouped one a kernel of its own, backends/c/c_filter_grad.py).
    assert reference_steps(exe_in) == []
    assert window_kernels(exe_in) or pointwise_product(attrs, x_shape)
    assert reference_steps(exe_w) == []
    if attrs.get("group", 1) > 1 or w_shape[2:] != (1, 1):
        assert window_kernels(exe_w)


def pointwise_product(attrs, x_shape):
    """Whether a 1x1 input gradient goes to BLAS (grad_expanders.DX_PRODUCT_MAX_PIXELS)."""
    return attrs["kernel_size"] == 1 and attrs.get("stride", 1) == 1 and \
        attrs.get("group", 1) == 1 and x_shape[2] * x_shape[3] <= DX_PRODUCT_MAX_PIXELS


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("x_shape, w_shape", [
    ((4, 48, 7, 7), (24, 48, 1, 1)),  # ResNet-50's last stage, small
    ((3, 10, 5, 9), (17, 10, 1, 1)),  # odd sizes
    ((2, 8, 8, 8), (16, 8, 1, 1)),  # 64 pixels: the last the product takes
])
def test_pointwise_input_gradient_on_few_pixels_is_a_product(x_shape, w_shape, dtype, rng):
    # A 1x1 input gradient on a map of at most DX_PRODUCT_MAX_PIXELS pixels: W^T times each
    # image's dout on BLAS (the window kernel was 1.4-1.65x slower on ResNet-50's 7x7 maps),
    # no window kernel, the choice and its reason in the plan's description.
    attrs = {"out_channel": w_shape[0], "kernel_size": 1}
    exe_in, _ = check(attrs, x_shape, w_shape, rng, dtype)
    assert reference_steps(exe_in) == [] and window_kernels(exe_in) == []
    assert [s.op for s in exe_in.plan.steps if s.op == "BatchMatMul"] == ["BatchMatMul"]
    assert "a 1x1 input gradient on" in exe_in.plan.describe()


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 8, 9, 8), (16, 8, 1, 1), dict(kernel_size=1)),  # 72 pixels: window kernel
    ((2, 8, 7, 7), (16, 8, 1, 1), dict(kernel_size=1, pad_mode="pad", pad=1)),
    ((2, 8, 7, 7), (16, 8, 1, 1), dict(kernel_size=1, stride=2)),
    ((2, 8, 7, 7), (16, 2, 1, 1), dict(kernel_size=1, group=4)),
])
def test_other_pointwise_input_gradients_keep_the_window_kernel(x_shape, w_shape, attrs, rng):
    attrs = {"out_channel": w_shape[0], **attrs}
    exe_in, _ = check(attrs, x_shape, w_shape, rng)
    assert window_kernels(exe_in) and "a 1x1 input gradient on" not in exe_in.plan.describe()


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 8, 9, 9), (8, 1, 3, 3), dict(kernel_size=3, pad_mode="pad", pad=1)),  # depthwise
    ((3, 6, 13, 10), (12, 1, 3, 2), dict(kernel_size=(3, 2), stride=(2, 1), dilation=(1, 2),
                                         pad_mode="pad", pad=(2, 0, 1, 3))),  # multiplier 2
    ((2, 6, 12, 11), (6, 3, 3, 3), dict(kernel_size=3, stride=2, pad_mode="same")),
    ((2, 4, 5, 5), (8, 2, 5, 5), dict(kernel_size=5, pad_mode="pad", pad=4)),
    ((2, 4, 1, 1), (4, 2, 3, 3), dict(kernel_size=3, stride=3, pad_mode="pad", pad=1)),
])
def test_grouped_filter_gradients_are_kernels(x_shape, w_shape, attrs, dtype, rng):
    # A grouped or depthwise convolution's filter gradient (MobileNet's) ran its numpy
    # reference on the Python runner: now one generated kernel (c_filter_grad.py), taps that
    # read only padding zero, float16 summed in float.
    attrs = {"out_channel": w_shape[0], "group": x_shape[1] // w_shape[1], **attrs}
    _, exe_w = check(attrs, x_shape, w_shape, rng, dtype)
    assert reference_steps(exe_w) == [] and len(window_kernels(exe_w)) == 1
    off = backprops(attrs, x_shape, w_shape, options=OFF)[1]  # unfused: the same kernel
    assert reference_steps(off) == [] and len(window_kernels(off)) == 1


def test_mobilenet_size_depthwise_filter_gradient_runs_channels_on_threads(rng):
    attrs = dict(out_channel=96, kernel_size=3, stride=2, pad_mode="pad", pad=1, group=96)
    _, exe_w = check(attrs, (2, 96, 56, 56), (96, 1, 3, 3), rng)
    (step,) = window_kernels(exe_w)
    assert "#pragma omp parallel for" in exe_w.executable.kernel_sources[step.kernel.name]


def distinct_window_kernels(exe):
    """The distinct C texts (kernel name taken out) of the plan's window kernels."""
    sources = exe.executable.kernel_sources
    return {sources[s.kernel.name].replace(s.kernel.name, "K") for s in window_kernels(exe)}


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 16, 9, 9), (16, 16, 3, 3), dict(kernel_size=3, stride=2, pad_mode="pad", pad=1)),
    ((2, 8, 12, 11), (8, 8, 3, 3), dict(kernel_size=3, stride=2, pad_mode="same")),
    ((2, 8, 13, 13), (8, 8, 5, 5), dict(kernel_size=5, stride=3, pad_mode="pad", pad=2)),
    ((2, 8, 12, 12), (8, 8, 4, 4), dict(kernel_size=4, stride=2, pad_mode="pad", pad=1)),
])
def test_stride_phases_share_one_kernel(x_shape, w_shape, attrs, rng):
    # Each stride phase of an input's gradient reads the same rows of dout with zero taps
    # where its own taps end: one compiled kernel for all s*s phases (a 3x3 of stride 2 had
    # four distinct ones, 1x1, 1x2, 2x1, 2x2), results unchanged.
    attrs = {"out_channel": w_shape[0], **attrs}
    exe_in, _ = check(attrs, x_shape, w_shape, rng)
    stride = attrs["stride"]
    assert len(window_kernels(exe_in)) == stride * stride
    assert len(distinct_window_kernels(exe_in)) == 1


def test_dilation_prime_to_the_stride_keeps_each_phase_geometry(rng):
    # Phases whose first rows are not on the dilation's grid cannot share a window: each keeps
    # its own taps, results unchanged.
    attrs = dict(out_channel=8, kernel_size=3, stride=2, dilation=3, pad_mode="pad", pad=3)
    exe_in, _ = check(attrs, (2, 8, 14, 13), (8, 8, 3, 3), rng)
    assert len(distinct_window_kernels(exe_in)) == 4


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_random_geometries_match_the_reference(dtype, rng):
    for _ in range(10):
        x_shape, w_shape, attrs = random_conv(rng)
        exe_in, _ = check(attrs, x_shape, w_shape, rng, dtype)
        assert reference_steps(exe_in) == []


def test_float16_rounds_once(rng):
    # float16 convolutions compute in float32 and round once, as the references do.
    for x_shape, w_shape, attrs in RESNET_LIKE[2:5]:
        check({"out_channel": w_shape[0], **attrs}, x_shape, w_shape, rng, "float16")


def test_fusion_off_keeps_the_reference(rng):
    # Unfused, each op runs as itself: the expansion is the fusion pipeline's.
    exe_in, exe_w = backprops(dict(out_channel=4, kernel_size=3), (1, 2, 6, 6), (4, 2, 3, 3),
                              options=OFF)
    assert reference_steps(exe_in) == ["Conv2DBackpropInput"]
    assert reference_steps(exe_w) == ["Conv2DBackpropFilter"]


class SmallNet(nn.Cell):
    """A strided 3x3, a dilated one, a grouped one and a 1x1 stride-2 shortcut."""

    def __init__(self, dtype):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, stride=2, pad_mode="pad", padding=1, dtype=dtype)
        self.c2 = nn.Conv2d(8, 8, 3, pad_mode="same", dilation=2, dtype=dtype)
        self.c3 = nn.Conv2d(8, 8, 3, pad_mode="same", group=4, dtype=dtype)
        self.down = nn.Conv2d(3, 8, 1, stride=2, dtype=dtype)
        self.relu = nn.ReLU()
        self.sum = P.ReduceSum()

    def construct(self, x, r):
        y = self.c3(self.relu(self.c2(self.relu(self.c1(x))))) + self.down(x)
        return self.sum(y * r)


def test_small_net_gradients_match_torch(rng):
    torch = pytest.importorskip("torch")
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=True)
    try:
        net = SmallNet(np.float64)
        x = rng.standard_normal((2, 3, 11, 10))
        r = rng.standard_normal((2, 8, 6, 5))
        grads = graphkernel.grad(net, (0,), weights=net.trainable_params())(Tensor(x),
                                                                           Tensor(r))
    finally:
        context.set_context(enable_graph_kernel=False)
    params = {p.name: torch.tensor(p.asnumpy(), requires_grad=True)
              for p in net.trainable_params()}
    tx = torch.tensor(x, requires_grad=True)
    F = torch.nn.functional
    h = F.relu(F.conv2d(tx, params["c1.weight"], stride=2, padding=1))
    h = F.relu(F.conv2d(h, params["c2.weight"], padding=2, dilation=2))
    y = F.conv2d(h, params["c3.weight"], padding=1, groups=4) + \
        F.conv2d(tx, params["down.weight"], stride=2)
    (y * torch.tensor(r)).sum().backward()
    (dx,), dws = grads
    np.testing.assert_allclose(dx.asnumpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-10)
    for p, g in zip(net.trainable_params(), dws):
        np.testing.assert_allclose(g.asnumpy(), params[p.name].grad.numpy(), rtol=1e-10,
                                   atol=1e-10, err_msg=p.name)


def test_training_step_runs_no_reference_backprop(rng):
    # A training step of the small net: fused, no step runs a backprop's reference (the
    # grouped convolution's filter gradient is a kernel of its own, fused or not), and the
    # updated weights equal the unfused step's.
    x = rng.standard_normal((2, 3, 11, 10)).astype(np.float32)
    r = rng.standard_normal((2, 8, 6, 5)).astype(np.float32)
    after = {}
    for name, options in (("fused", ON), ("unfused", OFF)):
        net = SmallNet(np.float32)
        for p in net.trainable_params():
            p.set_data(Tensor(np.random.default_rng(len(p.name)).standard_normal(
                p.shape).astype(np.float32)))
        step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.01))
        exe = graphkernel.compile(step, x, r, options=options)
        exe.run_arrays(x, r)
        after[name] = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
        if name == "fused":
            assert reference_steps(exe) == []
        else:
            assert sorted(reference_steps(exe)) == ["Conv2DBackpropFilter"] * 3 + \
                ["Conv2DBackpropInput"] * 2  # c2 and c3: x needs none; c3's dw in C
        grouped_dw = [s for s in window_kernels(exe) if s.op_names == ("Conv2DBackpropFilter",)]
        assert len(grouped_dw) == 1, name
    for key, value in after["fused"].items():
        np.testing.assert_allclose(value, after["unfused"][key], rtol=1e-4, atol=1e-5,
                                   err_msg=key)


def test_disable_expand_ops_keeps_a_backprop_on_its_reference(rng):
    """The backprops are composite ops like any expanded one: MindSpore's --disable_expand_ops
    names them (it refused them as ops graphkernel does not expand), and a disabled one runs its
    reference while the other is still expanded."""
    import warnings

    from graphkernel.graph_kernel.flags import parse_flags
    from graphkernel.graph_kernel.pipeline import CompileOptions
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "graphkernel does not expand ..." was a warning
        flags = parse_flags("--disable_expand_ops=Conv2DBackpropInput", warn=True)
    assert not flags.expands("Conv2DBackpropInput", False)
    options = CompileOptions(enable_graph_kernel=True, flags=flags)
    x_shape, w_shape = (2, 8, 9, 9), (8, 8, 3, 3)
    attrs = dict(out_channel=8, kernel_size=3, pad_mode="pad", pad=1)
    exe_in, exe_w = backprops(attrs, x_shape, w_shape, options=options)
    assert reference_steps(exe_in) == ["Conv2DBackpropInput"]
    assert reference_steps(exe_w) == [] and window_kernels(exe_w)
    dout = rng.standard_normal((2, 8, 9, 9)).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    np.testing.assert_allclose(exe_in.run_arrays(dout, w)[0],
                               reference("Conv2DBackpropInput", dout, w, input_size=x_shape,
                                         **attrs), rtol=1e-5, atol=1e-5)
