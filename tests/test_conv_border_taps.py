"""A padded convolution's units leave out the taps that read the zero border
(c_conv_units.BorderTaps, SKIP_BORDER_TAPS): on every pixel-block form (a small image in flat
blocks, whole rows, row segments), strides 1 and 2, dilation 2, padding on some sides only,
batch 1 and 3, float32 and float64, the results are those of summing every tap bit for bit, and
numpy's within the tolerance."""
import numpy as np
import pytest
from cells import compiled_with
from test_conv_epilogue import TOL, batchnorm, randomize

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c import c_conv_units
from graphkernel.backends.c.c_conv_units import BorderTaps
from graphkernel.frontend.compile import CompileOptions

LEFT_OUT = "border taps left out"  # the comment on a unit's block that skips taps
ON = CompileOptions(enable_graph_kernel=True)


class TwoConvs(nn.Cell):
    """A 3x3 conv + BN + ReLU of 5 -> 32 channels, then the convolution under test (32 -> 48,
    `kernel`, `stride`, `padding` (top, bottom, left, right), `dilation`) + BN + ReLU, whose
    input is blocked."""

    def __init__(self, kernel, stride, padding, dilation, dtype):
        super().__init__()
        self.c1 = nn.Conv2d(5, 32, 3, pad_mode="pad", padding=1, has_bias=False, dtype=dtype)
        self.c2 = nn.Conv2d(32, 48, kernel, stride=stride, pad_mode="pad", padding=padding,
                            dilation=dilation, has_bias=False, dtype=dtype)
        self.b1, self.b2 = nn.BatchNorm2d(32, dtype=dtype), nn.BatchNorm2d(48, dtype=dtype)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.b2(self.c2(self.relu(self.b1(self.c1(x))))))


def conv(x, w, stride, pads, dilation):
    """Direct convolution in float64 over a zero-padded copy (pads: top, bottom, left, right)."""
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    t, b, left, r = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, b), (left, r)))
    oh = (h + t + b - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + left + r - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dilation:i * dilation + stride * (oh - 1) + 1:stride,
                       j * dilation:j * dilation + stride * (ow - 1) + 1:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


def reference(net, x, stride, pads, dilation):
    p = {name: v.asnumpy().astype(np.float64) for name, v in net.parameters_and_names()}
    y = np.maximum(batchnorm(p, conv(x, p["c1.weight"], 1, (1, 1, 1, 1), 1), 1), 0)
    return np.maximum(batchnorm(p, conv(y, p["c2.weight"], stride, pads, dilation), 2), 0)


def conv_sources(exe):
    return [k.source for k in exe.kernels if k.source and "Conv2D" in k.name]


@pytest.mark.parametrize("hw,kernel,stride,pads,dilation,batch,dtype", [
    ((7, 7), 3, 1, (1, 1, 1, 1), 1, 1, np.float32),      # flat blocks of the whole image
    ((14, 14), 3, 1, (1, 1, 1, 1), 1, 3, np.float32),    # whole rows
    ((9, 30), 3, 1, (1, 1, 1, 1), 1, 1, np.float64),     # row segments and a tail
    ((15, 15), 3, 2, (1, 1, 1, 1), 1, 3, np.float32),    # stride 2
    ((12, 12), 3, 1, (2, 2, 2, 2), 2, 1, np.float32),    # dilation 2
    ((10, 31), 3, 1, (0, 2, 1, 0), 1, 3, np.float32),    # padding below and left only
    ((8, 6), (1, 3), 1, (0, 0, 1, 1), 1, 1, np.float32),  # a 1x3 kernel
])
def test_left_out_taps_change_no_result(hw, kernel, stride, pads, dilation, batch, dtype,
                                        rng, cache_folder, monkeypatch):
    graphkernel.set_seed(23)
    net = TwoConvs(kernel, stride, pads, dilation, dtype)
    randomize(net, rng, dtype)
    x = rng.standard_normal((batch, 5, *hw)).astype(dtype)
    skipping = graphkernel.compile(net, Tensor(x), options=ON)
    assert all(LEFT_OUT in s for s in conv_sources(skipping))
    got = skipping(Tensor(x)).asnumpy()
    summing = compiled_with(net, x, (c_conv_units, "SKIP_BORDER_TAPS", False), cache_folder,
                            monkeypatch)
    assert not any(LEFT_OUT in s for s in conv_sources(summing))
    np.testing.assert_array_equal(got, summing(Tensor(x)).asnumpy())
    want = reference(net, x, stride, pads, dilation)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=TOL[dtype] * scale)


def test_large_kernels_sum_every_tap(rng):
    """A kernel of more than SKIP_MAX_KERNEL_TAPS taps a channel (ResNet's 7x7 stem) keeps the
    tap table's loop everywhere."""
    net = TwoConvs(5, 1, (2, 2, 2, 2), 1, np.float32)
    randomize(net, rng, np.float32)
    x = rng.standard_normal((1, 5, 9, 9)).astype(np.float32)
    exe = graphkernel.compile(net, Tensor(x), options=ON)
    sources = conv_sources(exe)
    assert [LEFT_OUT in s for s in sources] == [True, False]
    want = reference(net, x, 1, (2, 2, 2, 2), 1)
    np.testing.assert_allclose(exe(Tensor(x)).asnumpy(), want, rtol=0,
                               atol=TOL[np.float32] * max(1.0, float(np.abs(want).max())))


def test_border_geometry():
    # 3x3, padding 1, a 7x7 image: each edge row and column reads the border with one of its
    # three kernel rows (columns): 19 of 21 row taps, 19 x 19 of 21 x 21 taps in all.
    border = BorderTaps(3, 3, 1, 1, 1, 1, 1, 1, 7, 7)
    assert sum(sum(border.valid(r, c)) for r in range(7) for c in range(7)) == 19 * 19
    assert border.valid(0, 0) == (False, False, False, False, True, True, False, True, True)
    assert border.valid(3, 6) == (True, True, False) * 3
    assert border.inner_rows(7) == range(1, 6) and border.inner_cols(7) == range(1, 6)
    # stride 2 over 8 rows with padding on top only (output 4 rows): row 0 reads the border
    below = BorderTaps(3, 3, 1, 1, 2, 2, 1, 0, 8, 8)
    assert below.inner_rows(4) == range(1, 4) and below.inner_cols(3) == range(0, 3)
    # dilation 2, padding 2, 5 rows: rows 0-1 and 3-4 read it, row 2 alone does not
    assert BorderTaps(3, 3, 2, 2, 1, 1, 2, 2, 5, 5).inner_rows(5) == range(2, 3)
    assert BorderTaps(3, 3, 1, 1, 1, 1, 1, 1, 1, 1).inner_rows(1) == range(0)
