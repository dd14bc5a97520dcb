"""MaxPoolGrad and AvgPoolGrad as generated C (backends/c/c_pool.py pool_grad_kernel): random
geometries (odd sizes, strides 1-3, windows 1-3 per axis, every pad mode, pads wider than the
window) against the ops' numpy references to the bit, with integer-valued inputs so that windows
hold ties (the gradient goes to the first maximum, row-major), NaN and infinities, float16
summed in float and rounded once, planes on threads; and a ResNet-style training step whose plan
runs no pool gradient's reference."""
import numpy as np
import pytest
from cells import OFF, ON, Fn
from test_window_kernels import reference

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c.c_pool import POOL_GRAD_STACK_BYTES
from graphkernel.ops import operations as P

POOL_GRADS = ("MaxPoolGrad", "AvgPoolGrad")


def grad_exe(op, x, out, dout, attrs, options=ON):
    prim = getattr(P, op)(**attrs)
    return graphkernel.compile(Fn(lambda a, b, c: prim(a, b, c)), x, out, dout, options=options)


def lowerings(exe):
    """(op, what it runs as) of each plan step of a pool gradient."""
    return [(s.op_names[0], s.lowering.kind.value) for s in exe.plan.steps
            if s.lowering is not None and s.op_names and s.op_names[0] in POOL_GRADS]


def check_exact(op, x, attrs, rng, dtype):
    out = reference(op[:-len("Grad")], x, **attrs)
    dout = rng.standard_normal(out.shape).astype(dtype)
    exe = grad_exe(op, x, out, dout, attrs)
    assert lowerings(exe) == [(op, "window")], attrs
    got = exe.run_arrays(x, out, dout)[0]
    with np.errstate(all="ignore"):  # an average's all-padding window divides by 0 and drops
        want = reference(op, x, out, dout, **attrs)
    assert got.dtype == want.dtype and got.shape == want.shape
    # The same sums in the same order: equal to the bit (NaN where the reference has NaN).
    np.testing.assert_array_equal(got, want, err_msg=f"{op} {x.shape} {attrs}")
    return exe


def random_geometry(rng):
    kernel = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    stride = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    mode = str(rng.choice(["valid", "same", "pad"]))
    attrs = dict(kernel_size=kernel, strides=stride, pad_mode=mode)
    if mode == "pad":  # per side, up to the window's size (windows all in padding too)
        attrs["pad"] = tuple(int(rng.integers(0, kernel[i // 2] + 1)) for i in range(4))
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 5)),
             int(rng.integers(kernel[0], 12)), int(rng.integers(kernel[1], 12)))
    return shape, attrs


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_random_max_pool_gradients_with_ties_match_the_reference(dtype, rng):
    for _ in range(12):
        shape, attrs = random_geometry(rng)
        x = rng.integers(-2, 3, shape).astype(dtype)  # few values: most windows tie
        check_exact("MaxPoolGrad", x, attrs, rng, dtype)


@pytest.mark.parametrize("counted", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_random_avg_pool_gradients_match_the_reference(dtype, counted, rng):
    for _ in range(8):
        shape, attrs = random_geometry(rng)
        attrs["count_include_pad"] = counted
        check_exact("AvgPoolGrad", rng.standard_normal(shape).astype(dtype), attrs, rng, dtype)


def test_max_pool_gradient_with_nan_and_infinities(rng):
    # A window holding NaN gives no gradient (its maximum is NaN, which no element equals);
    # a window of -inf gives it to its first element, dropped when that is padding.
    for attrs in (dict(kernel_size=3, strides=2, pad_mode="same"),
                  dict(kernel_size=2, strides=1, pad_mode="pad", pad=(1, 0, 1, 2)),
                  dict(kernel_size=(3, 2), strides=(1, 2), pad_mode="valid")):
        x = rng.integers(-1, 2, (2, 3, 9, 8)).astype(np.float32)
        x[0, 0, :4, :4] = -np.inf
        x[1, 2] = -np.inf
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, 6)] = np.nan
        flat[rng.integers(0, flat.size, 6)] = np.inf
        check_exact("MaxPoolGrad", x, attrs, rng, "float32")


@pytest.mark.parametrize("op", POOL_GRADS)
def test_resnet_stem_pool_gradient_runs_planes_on_threads(op, rng):
    # ResNet's stem pool (3x3, stride 2, pad 1) at 112x112: 64 planes over the threads'
    # threshold, the plane's interior windows without padding.
    attrs = dict(kernel_size=3, strides=2, pad_mode="pad", pad=1)
    x = rng.integers(-3, 4, (2, 64, 112, 112)).astype(np.float32)
    exe = check_exact(op, x, attrs, rng, "float32")
    (step,) = [s for s in exe.plan.steps if s.op_names and s.op_names[0] == op]
    assert "#pragma omp parallel for" in exe.executable.kernel_sources[step.kernel.name]


@pytest.mark.parametrize("op", POOL_GRADS)
def test_float16_pool_gradients_sum_in_float_and_round_once(op, rng):
    attrs = dict(kernel_size=3, strides=1, pad_mode="same")  # every element in 9 windows
    x = rng.integers(-2, 3, (2, 3, 10, 9)).astype(np.float16)
    check_exact(op, x, attrs, rng, "float16")


def test_float16_plane_too_large_for_the_stack_keeps_the_reference(rng):
    side = int((POOL_GRAD_STACK_BYTES // 4) ** 0.5) + 1  # float sums of one plane overflow
    x = rng.integers(-2, 3, (1, 1, side, side)).astype(np.float16)
    attrs = dict(kernel_size=2, strides=2)
    out = reference("MaxPool", x, **attrs)
    dout = rng.standard_normal(out.shape).astype(np.float16)
    exe = grad_exe("MaxPoolGrad", x, out, dout, attrs)
    assert lowerings(exe) == [("MaxPoolGrad", "library")]
    np.testing.assert_array_equal(exe.run_arrays(x, out, dout)[0],
                                  reference("MaxPoolGrad", x, out, dout, **attrs))


class ResNetStem(nn.Cell):
    """conv 7x7/2 + BN + ReLU + max pool 3x3/2 + a 3x3 conv + average pool: ResNet's stem and
    a block's shape, small."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 7, stride=2, pad_mode="pad", padding=3, has_bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="same")
        self.conv2 = nn.Conv2d(8, 8, 3, pad_mode="same", has_bias=False)
        self.avg = nn.AvgPool2d(kernel_size=2, stride=2)
        self.sum = P.ReduceSum()

    def construct(self, x, r):
        return self.sum(self.avg(self.conv2(self.pool(self.relu(self.bn(self.conv1(x)))))) * r)


def test_resnet_style_training_step_runs_no_pool_gradient_reference(rng):
    x = rng.standard_normal((2, 3, 30, 29)).astype(np.float32)
    r = rng.standard_normal((2, 8, 4, 4)).astype(np.float32)
    after = {}
    for name, options in (("fused", ON), ("unfused", OFF)):
        net = ResNetStem()
        for p in net.trainable_params():
            p.set_data(Tensor(np.random.default_rng(len(p.name)).standard_normal(
                p.shape).astype(np.float32)))
        step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.01))
        exe = graphkernel.compile(step, x, r, options=options)
        exe.run_arrays(x, r)
        assert sorted(lowerings(exe)) == [("AvgPoolGrad", "window"), ("MaxPoolGrad", "window")]
        after[name] = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    for key, value in after["fused"].items():
        np.testing.assert_allclose(value, after["unfused"][key], rtol=1e-4, atol=1e-5,
                                   err_msg=key)
