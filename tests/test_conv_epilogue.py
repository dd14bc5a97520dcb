"""A convolution's BatchNorm / ReLU / residual epilogue fused into its kernel (conv blocks,
backends/c/c_conv_block.py), against numpy on random inputs and random BatchNorm statistics:
channel counts that fill the blocked layout's block and that do not (the output then stays
NCHW), odd spatial sizes, strides 1 and 2, batch 1 (the image's units shared over the threads,
the epilogue run in each unit's work item) and 3, float32 and float64. An independent numpy
convolution (a loop over taps) is the reference, not the ops' own references alone."""
import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.frontend.compile import CompileOptions

ON = CompileOptions(enable_graph_kernel=True)
TOL = {np.float32: 3e-4, np.float64: 1e-11}
EPS = 1e-5  # nn.BatchNorm2d's default


class ConvBNReLU(nn.Cell):
    """conv1 + BN + ReLU (stride), conv2 + BN + the residual + ReLU, a 1x1 conv3 + BN + ReLU:
    conv1's and conv2's results are read by convolutions (blocked where the channels fill
    blocks), conv3's is the graph's output (NCHW)."""

    def __init__(self, cin, c, c3, stride, dtype):
        super().__init__()
        self.c1 = nn.Conv2d(cin, c, 3, stride=stride, pad_mode="pad", padding=1,
                            has_bias=False, dtype=dtype)
        self.c2 = nn.Conv2d(c, c, 3, pad_mode="pad", padding=1, has_bias=False, dtype=dtype)
        self.c3 = nn.Conv2d(c, c3, 1, has_bias=False, dtype=dtype)
        self.b1, self.b2, self.b3 = (nn.BatchNorm2d(k, dtype=dtype) for k in (c, c, c3))
        self.relu = nn.ReLU()

    def construct(self, x):
        y = self.relu(self.b1(self.c1(x)))
        z = self.relu(self.b2(self.c2(y)) + y)
        return self.relu(self.b3(self.c3(z)))


def randomize(net, rng, dtype):
    """Random weights and BatchNorm statistics (a fresh BatchNorm's are the identity)."""
    for name, p in net.parameters_and_names():
        value = rng.standard_normal(p.shape) * (0.3 if name.endswith("weight") else 1.0)
        if "moving_variance" in name:
            value = rng.random(p.shape) + 0.2
        p.set_data(value.astype(dtype))
    net.set_train(False)


def conv(x, w, stride, pad):
    """Direct convolution in float64: a sum over the taps of shifted, strided input slices."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for a in range(kh):
        for b in range(kw):
            patch = xp[:, :, a:a + stride * oh:stride, b:b + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, a, b].astype(np.float64))
    return out


def batchnorm(p, y, k):
    """Inference BatchNorm `b{k}` of parameters `p` (float64, by name) over NCHW `y`."""
    shape = (1, -1, 1, 1)
    return (y - p[f"b{k}.moving_mean"].reshape(shape)) / np.sqrt(
        p[f"b{k}.moving_variance"].reshape(shape) + EPS) * \
        p[f"b{k}.gamma"].reshape(shape) + p[f"b{k}.beta"].reshape(shape)


def reference(net, x, stride):
    p = {name: v.asnumpy().astype(np.float64) for name, v in net.parameters_and_names()}

    def bn(y, k):
        return batchnorm(p, y, k)

    y = np.maximum(bn(conv(x, p["c1.weight"], stride, 1), 1), 0)
    z = np.maximum(bn(conv(y, p["c2.weight"], 1, 1), 2) + y, 0)
    return np.maximum(bn(conv(z, p["c3.weight"], 1, 0), 3), 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c", [32, 16, 20])
@pytest.mark.parametrize("hw,stride", [((13, 11), 1), ((15, 9), 2), ((7, 30), 1)])
@pytest.mark.parametrize("batch", [1, 3])
def test_conv_bn_relu_residual_blocks_match_numpy(dtype, c, hw, stride, batch, rng):
    graphkernel.set_seed(11)
    net = ConvBNReLU(5, c, 24, stride, dtype)
    randomize(net, rng, dtype)
    x = rng.standard_normal((batch, 5, *hw)).astype(dtype)
    exe = graphkernel.compile(net, Tensor(x), options=ON)
    got = exe(Tensor(x)).asnumpy()
    want = reference(net, x, stride)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=TOL[dtype] * scale)
    # Each convolution is one kernel with its BatchNorm, ReLU (and the residual) inside.
    assert exe.kernel_count == 3
    lowered = exe.stages["hwopt_e_lower"]
    notes = [n.notes["conv_block"] for n in lowered.nodes if "conv_block" in n.notes]
    assert len(notes) == 3 and all(v.startswith("one kernel with") for v in notes), notes
    layouts = {n.name: n.notes["layout"] for n in lowered.nodes if "layout" in n.notes}
    block = 16 if dtype == np.float32 else 8
    blocked = [k for k, v in layouts.items() if v.startswith("blocked")]
    # conv1's and conv2's results go blocked exactly when c fills blocks; conv3's is the output
    assert len(blocked) == (2 if c % block == 0 else 0), layouts


class WideBlock(nn.Cell):
    """Two 3x3 convolutions of `c` channels with BN and ReLU, the second's result a graph
    output: at c=256 each has 2.25 MiB of float32 weights (c_conv_units.PREFETCH_MIN_BYTES)."""

    def __init__(self, c, dtype):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, pad_mode="pad", padding=1, has_bias=False, dtype=dtype)
        self.c2 = nn.Conv2d(c, c, 3, stride=2, pad_mode="pad", padding=1, has_bias=False,
                            dtype=dtype)
        self.b1, self.b2 = nn.BatchNorm2d(c, dtype=dtype), nn.BatchNorm2d(c, dtype=dtype)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.b2(self.c2(self.relu(self.b1(self.c1(x))))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c,prefetched", [(256, True), (64, False)])
def test_large_weights_prefetch_and_match_numpy(dtype, c, prefetched, rng):
    from graphkernel.backends.c.c_conv_units import PREFETCH_MIN_BYTES
    assert (c * c * 9 * 4 >= PREFETCH_MIN_BYTES) == prefetched
    graphkernel.set_seed(5)
    net = WideBlock(c, dtype)
    randomize(net, rng, dtype)
    x = rng.standard_normal((1, c, 7, 6)).astype(dtype)
    exe = graphkernel.compile(net, Tensor(x), options=ON)
    got = exe(Tensor(x)).asnumpy()
    p = {name: v.asnumpy().astype(np.float64) for name, v in net.parameters_and_names()}

    def bn(y, k):
        return batchnorm(p, y, k)

    y = np.maximum(bn(conv(x, p["c1.weight"], 1, 1), 1), 0)
    want = np.maximum(bn(conv(y, p["c2.weight"], 2, 1), 2), 0)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=TOL[dtype] * scale)
    sources = [k.source for k in exe.kernels if k.source and "Conv2D" in k.name]
    assert len(sources) == 2
    assert all(("__builtin_prefetch" in s) == prefetched for s in sources)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("store", [None, 0, 1])
@pytest.mark.parametrize("hw,stride", [((13, 11), 1), ((15, 9), 2), ((9, 29), 1)])
def test_epilogue_in_the_stores_or_after_matches_numpy(dtype, store, hw, stride, rng):
    """The conv block's epilogue on the accumulators as the units store them or as a pass
    after each unit (CConfig.conv_store_epilogue, a tuning knob; None: the rule, in the stores
    for conv1's 45 taps over more than FLAT_PIXELS outputs, after for conv2's 288): the same
    results within the tolerance, and the stores carry the epilogue exactly where chosen."""
    from graphkernel.backends.c.c_conv_units import FLAT_PIXELS
    from graphkernel.backends.c.config import CConfig
    graphkernel.set_seed(13)
    net = ConvBNReLU(5, 32, 24, stride, dtype)
    randomize(net, rng, dtype)
    x = rng.standard_normal((2, 5, *hw)).astype(dtype)
    options = CompileOptions(enable_graph_kernel=True,
                             backend_config=CConfig(conv_store_epilogue=store))
    exe = graphkernel.compile(net, Tensor(x), options=options)
    want = reference(net, x, stride)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(exe(Tensor(x)).asnumpy().astype(np.float64), want, rtol=0,
                               atol=TOL[dtype] * scale)
    sources = [k.source for k in exe.kernels if k.source and "Conv2D" in k.name]
    assert len(sources) == 3
    # conv1's and conv2's outputs are blocked (32 channels), conv3's (the result) NCHW
    oh, ow = [(d + 2 - 3) // stride + 1 for d in hw]
    expected = {None: int(oh * ow > FLAT_PIXELS), 0: 0, 1: 2}[store]
    assert sum("gk_acc" in s for s in sources) == expected, (store, hw)
    # and the plan's schedule notes say so
    notes = [n for n in exe.executable.plan.schedule_notes.values() if "convolution on" in n]
    assert sum("epilogue in each unit's stores" in n for n in notes) == expected, notes
