"""Depthwise convolutions with channel-vectored units (backends/c/c_depthwise_blocked.py): in
MobileNetV2-style inverted residual blocks the 1x1 expand -> depthwise -> 1x1 project chain
stays in the blocked channel layout (kernel counts, layout notes, the lowering's form note),
and fused, unfused and numpy agree on random inputs: channels that are and are not multiples of
the block, batch 1 and 3, strides 1 and 2, 3x3 and 5x5, dilation, float16/32/64. Small NCHW
maps and 25 taps or more take the channel-vectored form, larger maps of fewer taps the pixel
path, and both match numpy."""
import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor, nn, ops
from graphkernel.backends.c.c_depthwise_blocked import CHANNEL_VECTOR_PIXELS, CHANNEL_VECTOR_TAPS
from graphkernel.frontend.compile import CompileOptions

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)
NUMPY = CompileOptions(enable_graph_kernel=False, backend="numpy")
TOL = {np.float16: 2e-2, np.float32: 2e-4, np.float64: 1e-11}


class Inverted(nn.Cell):
    """Expand 1x1 + BN + ReLU6, depthwise kxk (stride, dilation) + BN + ReLU6, project 1x1
    + BN, the residual add where the shape allows."""

    def __init__(self, c, e, k, stride, dilation, dtype, bn=True):
        super().__init__()
        pad = dilation * (k // 2)
        self.expand = nn.Conv2d(c, e, 1, has_bias=not bn, dtype=dtype)
        self.dw = nn.Conv2d(e, e, k, stride=stride, pad_mode="pad", padding=pad,
                            dilation=dilation, group=e, has_bias=not bn, dtype=dtype)
        self.project = nn.Conv2d(e, c, 1, has_bias=not bn, dtype=dtype)
        self.bn = bn
        if bn:
            self.b1, self.b2, self.b3 = nn.BatchNorm2d(e), nn.BatchNorm2d(e), nn.BatchNorm2d(c)
        self.act = nn.ReLU6()
        self.residual = stride == 1

    def construct(self, x):
        def norm(name, y):
            return getattr(self, name)(y) if self.bn else y
        y = self.act(norm("b1", self.expand(x)))
        y = self.act(norm("b2", self.dw(y)))
        y = norm("b3", self.project(y))
        return y + x if self.residual else y


class Net(nn.Cell):
    def __init__(self, c, e, k, stride, dilation, dtype, bn=True):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, pad_mode="pad", padding=1, has_bias=True, dtype=dtype)
        self.block = Inverted(c, e, k, stride, dilation, dtype, bn)
        self.head = nn.Conv2d(c, c, 1, has_bias=True, dtype=dtype)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.head(self.block(self.relu(self.stem(x))))


def check_close(got, want, dtype):
    want = want.astype(np.float64)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=TOL[dtype] * scale)


def run_three(net, x, dtype):
    fused = graphkernel.compile(net, x, options=ON)
    want = graphkernel.compile(net, x, options=NUMPY)(x).asnumpy()
    unfused = graphkernel.compile(net, x, options=OFF)(x).asnumpy()
    got = fused(x).asnumpy()
    check_close(unfused, want, dtype)
    check_close(got, want, dtype)
    return fused


def layouts(exe):
    lowered = exe.stages["hwopt_e_lower"]
    return {n.name: n.notes["layout"] for n in lowered.nodes if "layout" in n.notes}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("e", [32, 40])  # a multiple of both blocks; of neither
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("k,stride,dilation", [(3, 1, 1), (3, 2, 1), (5, 1, 1), (5, 2, 1),
                                               (3, 1, 2)])
def test_inverted_residual_keeps_the_chain_blocked(dtype, e, batch, k, stride, dilation, rng):
    graphkernel.set_seed(11)
    net = Net(16, e, k, stride, dilation, dtype, bn=dtype == np.float32)
    net.set_train(False)
    x = Tensor(rng.standard_normal((batch, 3, 19, 18)).astype(dtype))
    exe = run_three(net, x, dtype)
    # stem, expand, depthwise, project (+ add), head: one kernel each
    assert exe.kernel_count == 5
    notes = layouts(exe)
    block = 16 if dtype == np.float32 else 8
    blocked = sorted(k for k, v in notes.items() if v.startswith("blocked"))
    whole = e % block == 0
    # the stem's result (16 channels) is read by the expand and the residual add (or the
    # expand alone): blocked; the expand's and the depthwise one's where e fills blocks;
    # the project's by the head; the head's is the output
    assert len(blocked) == 2 + 2 * whole, notes
    described = exe.plan.describe()
    if whole:
        assert "depthwise channel-vectored (vectors along a channel block" in described
        assert not any("depthwise" in v or "groups" in v for v in notes.values())
    else:
        assert sum("not a multiple of the block" in v for v in notes.values()) == 2, notes


class PlainChain(nn.Cell):
    """Convolutions without bias or epilogue (float16 forms no conv blocks): stem, expand,
    depthwise, project, head, each its own kernel."""

    def __init__(self, c, e, k, stride, dtype):
        super().__init__()
        def conv(i, o, kk, s=1, g=1):
            return nn.Conv2d(i, o, kk, stride=s, pad_mode="pad", padding=kk // 2, group=g,
                             has_bias=False, dtype=dtype)
        self.convs = nn.SequentialCell([conv(3, c, 3), conv(c, e, 1), conv(e, e, k, stride, e),
                                        conv(e, c, 1), conv(c, c, 1)])

    def construct(self, x):
        return self.convs(x)


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("stride", [1, 2])
def test_float16_depthwise_reads_and_writes_blocks(k, stride, rng):
    graphkernel.set_seed(12)
    net = PlainChain(16, 32, k, stride, np.float16)
    net.set_train(False)
    x = Tensor(rng.standard_normal((2, 3, 15, 14)).astype(np.float16))
    exe = run_three(net, x, np.float16)
    assert exe.kernel_count == 5
    assert sum(v.startswith("blocked") for v in layouts(exe).values()) == 4, layouts(exe)
    assert "depthwise channel-vectored (vectors along a channel block" in exe.plan.describe()


class Depthwise(nn.Cell):
    def __init__(self, c, k, stride, dilation, dtype):
        super().__init__()
        self.dw = nn.Conv2d(c, c, k, stride=stride, pad_mode="pad",
                            padding=dilation * (k // 2), dilation=dilation, group=c,
                            has_bias=False, dtype=dtype)
        self.act = nn.ReLU6()

    def construct(self, x):
        return self.act(self.dw(x))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", [
    ((1, 576, 7, 7), 5, 1, 1),  # MobileNetV3's small-map 5x5: channel-vectored
    ((3, 40, 14, 14), 5, 1, 1),  # 196 pixels: channel-vectored, 40 channels (not whole blocks)
    ((1, 19, 9, 11), 5, 1, 2),  # 99 pixels, dilation: channel-vectored
    ((2, 20, 3, 4), 5, 1, 1),  # no interior column: every column a border one
    ((1, 16, 12, 21), 5, 1, 1),  # interior 17: two groups of 8 and a group of 1
    ((3, 40, 14, 14), 3, 1, 1),  # 9 taps, 196 pixels: channel-vectored
    ((2, 24, 28, 28), 5, 2, 1),  # strided to 14x14: channel-vectored
    ((2, 24, 15, 15), 5, 1, 1),  # 225 pixels, 25 taps: channel-vectored
    ((1, 40, 29, 31), 5, 1, 1),  # 899 pixels, 25 taps: channel-vectored
    ((2, 24, 33, 35), 7, 2, 1),  # 49 taps, strided to 17x18: channel-vectored
    ((2, 24, 15, 15), 3, 1, 1),  # 225 pixels, 9 taps: the pixel path
    ((2, 24, 30, 31), 3, 2, 1),  # strided to 15x16: the pixel path
])
def test_nchw_depthwise_form_by_map_size(dtype, geometry, rng):
    shape, k, stride, dilation = geometry
    graphkernel.set_seed(13)
    net = Depthwise(shape[1], k, stride, dilation, dtype)
    net.set_train(False)
    x = Tensor(rng.standard_normal(shape).astype(dtype))
    exe = run_three(net, x, dtype)
    assert exe.kernel_count == 1
    oh = (shape[2] + 2 * dilation * (k // 2) - dilation * (k - 1) - 1) // stride + 1
    ow = (shape[3] + 2 * dilation * (k // 2) - dilation * (k - 1) - 1) // stride + 1
    described = exe.plan.describe()
    if oh * ow <= CHANNEL_VECTOR_PIXELS:
        assert f"depthwise channel-vectored: {oh * ow} output pixels" in described
    elif k * k >= CHANNEL_VECTOR_TAPS:
        assert f"depthwise channel-vectored: {k * k} taps" in described
    else:
        assert f"depthwise pixel path (vectors along pixels over phase planes): {oh * ow}" \
            in described


class SqueezeExcite(nn.Cell):
    """MobileNetV3's block shape: expand 1x1 (blocked), depthwise kxk, squeeze-and-excitation
    (mean over the map, 1x1, ReLU, 1x1, HardSigmoid, times the map), project 1x1."""

    def __init__(self, c, e, k, stride, dtype):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, pad_mode="pad", padding=1, has_bias=True, dtype=dtype)
        self.expand = nn.Conv2d(c, e, 1, has_bias=True, dtype=dtype)
        self.dw = nn.Conv2d(e, e, k, stride=stride, pad_mode="pad", padding=k // 2, group=e,
                            has_bias=True, dtype=dtype)
        self.fc1 = nn.Conv2d(e, 8, 1, has_bias=True, dtype=dtype)
        self.fc2 = nn.Conv2d(8, e, 1, has_bias=True, dtype=dtype)
        self.project = nn.Conv2d(e, c, 1, has_bias=True, dtype=dtype)
        self.relu = nn.ReLU()
        self.hswish = nn.HSwish()
        self.hsigmoid = nn.HSigmoid()
        self.mean = ops.ReduceMean(keep_dims=True)

    def construct(self, x):
        y = self.hswish(self.dw(self.hswish(self.expand(self.relu(self.stem(x))))))
        s = self.hsigmoid(self.fc2(self.relu(self.fc1(self.mean(y, (2, 3))))))
        return self.project(y * s)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("e,hw,k,stride", [(48, 13, 5, 1), (48, 17, 3, 2), (32, 9, 5, 1),
                                         (32, 40, 3, 1)])  # 40 x 42: tiles of 10 rows
def test_depthwise_before_squeeze_excite_writes_planes(dtype, e, hw, k, stride, rng):
    """The depthwise kernel reads its input blocked and writes planes for the SE's readers
    (through an L1 tile transposed in registers where the plane fits, pixels past a whole
    number of blocks lane by lane)."""
    graphkernel.set_seed(14)
    net = SqueezeExcite(16, e, k, stride, dtype)
    net.set_train(False)
    x = Tensor(rng.standard_normal((2, 3, hw, hw + 2)).astype(dtype))
    exe = run_three(net, x, dtype)
    notes = layouts(exe)
    assert any(v.startswith("NCHW: read by ReduceMean") for v in notes.values()), notes
    assert "depthwise channel-vectored (vectors along a channel block" in exe.plan.describe()
