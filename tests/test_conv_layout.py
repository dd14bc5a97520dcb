"""The blocked channel layout between convolution kernels (graph_kernel/conv_layout.py): which
tensors go blocked and why the others stay NCHW (notes and the plan's describe()), kernel
counts, and results against fusion off (the ops' numpy references) on ResNet- and
MobileNetV2-style blocks: channel counts that are and are not multiples of the block, batch 1
and 3, float32 and float64, strides, padding, dilation, depthwise and grouped convolutions."""
import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.frontend.compile import CompileOptions

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)
NUMPY = CompileOptions(enable_graph_kernel=False, backend="numpy")  # the ops' references
TOL = {np.float32: 2e-4, np.float64: 1e-11}


class Bottleneck(nn.Cell):
    """ResNet's: 1x1, 3x3 (stride), 1x1 with BatchNorm, the shortcut a strided 1x1 + BN where
    the shape changes, the residual add and ReLU in the last conv's block."""

    def __init__(self, cin, mid, cout, stride=1, bn=True, dtype=np.float32, dilation=1):
        super().__init__()
        def conv(i, o, k, s=1, d=1):
            pad = d * (k // 2)
            return nn.Conv2d(i, o, k, stride=s, pad_mode="pad", padding=pad, dilation=d,
                             has_bias=not bn, dtype=dtype)
        self.c1, self.c2, self.c3 = conv(cin, mid, 1), conv(mid, mid, 3, stride, dilation), \
            conv(mid, cout, 1)
        self.bn = bn
        if bn:
            self.b1, self.b2, self.b3 = (nn.BatchNorm2d(mid), nn.BatchNorm2d(mid),
                                         nn.BatchNorm2d(cout))
        self.down = conv(cin, cout, 1, stride) if stride != 1 or cin != cout else None
        if self.down is not None and bn:
            self.bd = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()

    def construct(self, x):
        def norm(name, y):
            return getattr(self, name)(y) if self.bn else y
        y = self.relu(norm("b1", self.c1(x)))
        y = self.relu(norm("b2", self.c2(y)))
        y = norm("b3", self.c3(y))
        short = x if self.down is None else norm("bd", self.down(x))
        return self.relu(y + short)


class ResNetish(nn.Cell):
    def __init__(self, c, mid, bn=True, dtype=np.float32, pool=False):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, pad_mode="pad", padding=1, has_bias=True, dtype=dtype)
        self.pool = nn.MaxPool2d(2, 2) if pool else None
        self.l1 = Bottleneck(c, mid, 2 * c, 2, bn, dtype)
        self.l2 = Bottleneck(2 * c, mid, 2 * c, 1, bn, dtype, dilation=2)
        self.relu = nn.ReLU()

    def construct(self, x):
        y = self.relu(self.stem(x))
        if self.pool is not None:
            y = self.pool(y)
        return self.l2(self.l1(y))


class InvertedResidual(nn.Cell):
    """MobileNetV2's: expand 1x1, depthwise 3x3 (stride), project 1x1, the residual add."""

    def __init__(self, c, expand, stride=1, dtype=np.float32):
        super().__init__()
        e = c * expand
        self.expand = nn.Conv2d(c, e, 1, has_bias=True, dtype=dtype)
        self.dw = nn.Conv2d(e, e, 3, stride=stride, pad_mode="pad", padding=1, group=e,
                            has_bias=True, dtype=dtype)
        self.project = nn.Conv2d(e, c, 1, has_bias=True, dtype=dtype)
        self.act = nn.ReLU6()
        self.residual = stride == 1

    def construct(self, x):
        y = self.project(self.act(self.dw(self.act(self.expand(x)))))
        return y + x if self.residual else y


class MobileNetish(nn.Cell):
    def __init__(self, c, dtype=np.float32):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, stride=2, pad_mode="pad", padding=1, has_bias=True,
                              dtype=dtype)
        self.b1 = InvertedResidual(c, 6, 1, dtype)
        self.b2 = InvertedResidual(c, 4, 1, dtype)
        self.head = nn.Conv2d(c, 2 * c, 1, has_bias=True, dtype=dtype)
        self.groups = nn.Conv2d(2 * c, 2 * c, 3, pad_mode="pad", padding=1, group=2,
                                has_bias=True, dtype=dtype)
        self.act = nn.ReLU6()

    def construct(self, x):
        y = self.b2(self.b1(self.act(self.stem(x))))
        return self.groups(self.act(self.head(y)))


def layouts(exe):
    """Writer name -> its layout note, for every convolution kernel's result."""
    lowered = exe.stages["hwopt_e_lower"]
    return {n.name: n.notes["layout"] for n in lowered.nodes if "layout" in n.notes}


def run_both(net, x):
    """The fused plan, its result and numpy's; the unfused plan (C kernels, one op each)
    checked against numpy on the way."""
    fused = graphkernel.compile(net, x, options=ON)
    want = graphkernel.compile(net, x, options=NUMPY)(x).asnumpy()
    unfused = graphkernel.compile(net, x, options=OFF)(x).asnumpy()
    check_close(unfused, want, want.dtype.type)
    return fused, fused(x).asnumpy(), want


def check_close(got, want, dtype):
    tol = 2e-2 if dtype == np.float16 else TOL[dtype]
    want = want.astype(np.float64)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=tol * scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("channels", [(32, 16), (24, 8), (20, 12)])
@pytest.mark.parametrize("batch", [1, 3])
def test_resnet_style_blocks_keep_the_blocked_layout(dtype, channels, batch, rng):
    graphkernel.set_seed(3)
    c, mid = channels
    net = ResNetish(c, mid, bn=dtype == np.float32, dtype=dtype)
    net.set_train(False)
    x = Tensor(rng.standard_normal((batch, 3, 13, 14)).astype(dtype))
    exe, got, want = run_both(net, x)
    check_close(got, want, dtype)
    block = 16 if dtype == np.float32 else 8
    notes = layouts(exe)
    # Every convolution kernel's result but the graph's output (the last block's) is a
    # candidate; it goes blocked exactly when its channels and its readers' fill blocks.
    blocked = [k for k, v in notes.items() if v.startswith("blocked")]
    nchw = {k: v for k, v in notes.items() if v.startswith("NCHW")}
    assert sum("a graph output" in v for v in nchw.values()) == 1
    sizes = {c, mid, 2 * c}
    if all(s % block == 0 for s in sizes):
        assert len(nchw) == 1 and len(blocked) == len(notes) - 1 >= 6
        assert all(f"{block} channels" in v for k, v in notes.items() if k in blocked)
    elif all(s % block for s in sizes):
        assert not blocked
        assert all("not a multiple of the block" in v or "a graph output" in v
                   for v in nchw.values())
    described = exe.plan.describe()
    assert ("writes blocked" in described) == bool(blocked)
    # one kernel per convolution (blocks: BN, ReLU and the residual add inside)
    assert exe.kernel_count == 8


def test_a_pool_between_convolutions_reads_nchw(rng):
    graphkernel.set_seed(5)
    net = ResNetish(32, 16, pool=True)
    net.set_train(False)
    x = Tensor(rng.standard_normal((2, 3, 16, 16)).astype(np.float32))
    exe, got, want = run_both(net, x)
    check_close(got, want, np.float32)
    notes = layouts(exe)
    stem = [v for v in notes.values() if "MaxPool" in v]
    assert len(stem) == 1 and stem[0].startswith("NCHW") and "a pool (it" in stem[0]
    assert sum(v.startswith("blocked") for v in notes.values()) == 6  # all but stem, output


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c", [16, 24])
@pytest.mark.parametrize("batch", [1, 3])
def test_mobilenetv2_style_blocks(dtype, c, batch, rng):
    graphkernel.set_seed(4)
    net = MobileNetish(c, dtype)
    net.set_train(False)
    x = Tensor(rng.standard_normal((batch, 3, 18, 17)).astype(dtype))
    exe, got, want = run_both(net, x)
    check_close(got, want, dtype)
    notes = layouts(exe)
    block = 16 if dtype == np.float32 else 8
    # Depthwise convolutions read and write blocks (their vectors run along a block's
    # channels): the expands' results (6c, 4c channels: whole blocks) and theirs go blocked;
    # the grouped 3x3 (2 groups of 2c) reads planes.
    planes = [v for v in notes.values() if "groups" in v]
    assert len(planes) == 1 and planes[0].startswith("NCHW") and "2 groups" in planes[0]
    assert not any("depthwise" in v for v in notes.values())
    # blocked: the expands' and depthwise results always; the stem's and the projects' (read
    # by 1x1s and residual adds) where c fills blocks
    blocked = [k for k, v in notes.items() if v.startswith("blocked")]
    assert len(blocked) == 4 + 3 * (c % block == 0), notes
    assert all("not a multiple of the block" in v for v in notes.values()
               if v.startswith("NCHW") and "groups" not in v and "graph output" not in v)
    assert any("a graph output" in v for v in notes.values())
    described = exe.plan.describe()
    assert described.count("depthwise channel-vectored") == 2, described
    assert described.count("writes blocked") == len(blocked)
    assert exe.kernel_count == 9


class PlainChain(nn.Cell):
    """Convolutions without BatchNorm or bias, each its own kernel: 3x3, a strided 1x1 (its
    scratch samples a blocked input), then a 1x1 and a depthwise 3x3 of that, added (an Add
    of its own), and a 1x1."""

    def __init__(self, c, dtype):
        super().__init__()
        self.a = nn.Conv2d(3, c, 3, pad_mode="pad", padding=1, dtype=dtype)
        self.b = nn.Conv2d(c, c, 1, stride=2, pad_mode="valid", dtype=dtype)
        self.dw = nn.Conv2d(c, c, 3, pad_mode="pad", padding=1, group=c, dtype=dtype)
        self.d = nn.Conv2d(c, c, 1, pad_mode="valid", dtype=dtype)
        self.e = nn.Conv2d(c, c, 1, pad_mode="valid", dtype=dtype)

    def construct(self, x):
        y = self.b(self.a(x))
        return self.e(self.d(y) + self.dw(y))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_convolutions_of_their_own_read_and_write_blocks(dtype, rng):
    graphkernel.set_seed(6)
    net = PlainChain(32, dtype)
    net.set_train(False)
    x = Tensor(rng.standard_normal((3, 3, 15, 16)).astype(dtype))
    exe, got, want = run_both(net, x)
    check_close(got, want, dtype)
    notes = layouts(exe)
    # a's result is read by b (a strided 1x1) alone: blocked; b's by d and the depthwise
    # one, which both read blocks: blocked; d's and the depthwise one's by the Add; e's is
    # the output
    assert sorted(v.split(":")[0].split(",")[0] for v in notes.values()) == \
        ["NCHW", "NCHW", "NCHW", "blocked", "blocked"]
    assert not any("depthwise" in v for v in notes.values())
    assert sum("(single op), which reads NCHW" in v for v in notes.values()) == 2
    described = exe.plan.describe()
    assert described.count("depthwise channel-vectored (vectors along a channel block") == 1


class PooledStem(nn.Cell):
    """ResNet's stem at a size where the pool runs as a kernel of its own (an image's result
    over the conv block's stack tile): conv + BN + ReLU, a pool, then a bottleneck; with
    `pool_out` the pool's result is the graph's output instead."""

    def __init__(self, c, dtype, pool, pool_out=False):
        super().__init__()
        bn = dtype == np.float32  # (as ResNetish: BatchNorm's parameters are float32)
        self.stem = nn.Conv2d(3, c, 5, stride=2, pad_mode="pad", padding=2, has_bias=not bn,
                              dtype=dtype)
        self.bn = nn.BatchNorm2d(c) if bn else None
        self.relu = nn.ReLU()
        self.pool = pool
        self.block = Bottleneck(c, 16, 2 * c, 1, bn, dtype)
        self.pool_out = pool_out

    def construct(self, x):
        y = self.stem(x)
        # float64 pools negative values too (no ReLU): its window's maximum starts at -inf
        y = self.pool(self.relu(self.bn(y)) if self.bn is not None else y)
        return y if self.pool_out else self.block(y)


def pool_lowering(exe):
    lowered = exe.stages["hwopt_e_lower"]
    return [n.lowering.reason for n in lowered.nodes if n.op in ("MaxPool", "AvgPool")]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [1, 2])
def test_a_max_pool_of_its_own_keeps_the_blocked_layout(dtype, batch, rng, tmp_path,
                                                         monkeypatch):
    from cells import compiled_with

    from graphkernel.backends.c import c_pool
    graphkernel.set_seed(7)
    net = PooledStem(32, dtype, nn.MaxPool2d(3, 2, pad_mode="same"))
    net.set_train(False)
    x = rng.standard_normal((batch, 3, 45, 47)).astype(dtype)
    x[0, 1, 20, 30] = np.nan  # the pool passes NaN on, as numpy's maximum does
    exe, got, want = run_both(net, Tensor(x))
    assert np.isnan(want).any() and np.array_equal(np.isnan(got), np.isnan(want))
    check_close(got, want, dtype)
    notes = layouts(exe)
    block = 16 if dtype == np.float32 else 8
    # every kernel's result blocked but the graph's output: the stem's (read by the pool),
    # the pool's (read by two convolutions), the bottleneck's
    assert [k for k, v in notes.items() if not v.startswith("blocked")] == [list(notes)[-1]]
    assert len(notes) == 6 and notes[list(notes)[-1]] == "NCHW: a graph output"
    assert notes["MaxPool"] == f"blocked, {block} channels a pixel: every reader is a " \
        "convolution or pool kernel that reads the layout"
    (reason,) = pool_lowering(exe)
    assert "reads" in reason and f"blocked, writes blocked ({block} channels)" in reason
    # The same maxima as the planes' kernel, and the convolutions after it sum the same
    # taps in the same order: equal bit for bit.
    planes = compiled_with(net, x, (c_pool, "BLOCKED_MAX_POOL", False), str(tmp_path),
                           monkeypatch)
    assert layouts(planes)["MaxPool"] == "NCHW: a pool writes the layout it reads, NCHW here"
    np.testing.assert_array_equal(planes(Tensor(x)).asnumpy(), got)
    assert exe.kernel_count == planes.kernel_count == 6


def test_pools_that_keep_planes_say_why(rng):
    graphkernel.set_seed(8)
    x = Tensor(rng.standard_normal((1, 3, 40, 40)).astype(np.float32))
    # a pool's result the graph's output: the pool writes planes, so it reads them too
    net = PooledStem(32, np.float32, nn.MaxPool2d(2, 2), pool_out=True)
    net.set_train(False)
    exe, got, want = run_both(net, x)
    check_close(got, want, np.float32)
    notes = layouts(exe)
    stem = [v for k, v in notes.items() if k != "MaxPool"]
    assert stem == ["NCHW: read by MaxPool, a pool that keeps it NCHW (a graph output)"], notes
    # an average pool's kernel reads planes alone
    net = PooledStem(32, np.float32, nn.AvgPool2d(2, 2))
    net.set_train(False)
    exe, got, want = run_both(net, x)
    check_close(got, want, np.float32)
    notes = layouts(exe)
    assert any("the blocked pool kernel is MaxPool's" in v for v in notes.values()), notes
    # the pool runs as a kernel of its own, on the planes it was given
    assert pool_lowering(exe) == ["a generated window kernel"]
    assert notes["AvgPool"] == "NCHW: a pool writes the layout it reads, NCHW here", notes
