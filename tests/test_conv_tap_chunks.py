"""A 1x1 convolution's units walk their pixels over chunks of taps (c_conv_units.tap_chunk,
CConfig.conv_tap_chunk_bytes), leaving each chunk's sums in the output for the next: the same
results bit for bit as one pass over all taps, and the numpy reference's within the tolerance,
on every pixel-block form (a small image in flat blocks, whole rows, row segments), strides 1
and 2, batch 1 (an image's units shared over the threads) and 3, the epilogue in the stores or
after, float32 and float64, 512- and 256-bit code, a group's last unit too narrow to chunk."""
import numpy as np
import pytest
from test_conv_epilogue import TOL, batchnorm, conv, randomize

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c.config import CConfig
from graphkernel.backends.c.conv_tile import check_tap_chunk_bytes
from graphkernel.errors import ContextError
from graphkernel.frontend.compile import CompileOptions

CHUNKED = "kc < KC"  # the chunk loop in a unit's C


class PointwiseBetween(nn.Cell):
    """A 3x3 conv + BN + ReLU, a 1x1 of `c` -> `o` channels (stride) + BN + ReLU whose input
    and output convolutions read and write blocked, then a 3x3 to NCHW."""

    def __init__(self, c, o, stride, dtype):
        super().__init__()
        self.c1 = nn.Conv2d(5, c, 3, pad_mode="pad", padding=1, has_bias=False, dtype=dtype)
        self.c2 = nn.Conv2d(c, o, 1, stride=stride, has_bias=False, dtype=dtype)
        self.c3 = nn.Conv2d(o, 16, 3, pad_mode="pad", padding=1, has_bias=False, dtype=dtype)
        self.b1, self.b2, self.b3 = (nn.BatchNorm2d(k, dtype=dtype) for k in (c, o, 16))
        self.relu = nn.ReLU()

    def construct(self, x):
        y = self.relu(self.b1(self.c1(x)))
        z = self.relu(self.b2(self.c2(y)))
        return self.relu(self.b3(self.c3(z)))


def reference(net, x, stride):
    p = {name: v.asnumpy().astype(np.float64) for name, v in net.parameters_and_names()}
    y = np.maximum(batchnorm(p, conv(x, p["c1.weight"], 1, 1), 1), 0)
    z = np.maximum(batchnorm(p, conv(y, p["c2.weight"], stride, 0), 2), 0)
    return np.maximum(batchnorm(p, conv(z, p["c3.weight"], 1, 1), 3), 0)


def compiled(net, x, **config):
    options = CompileOptions(enable_graph_kernel=True, backend_config=CConfig(**config))
    return graphkernel.compile(net, Tensor(x), options=options)


def pointwise_source(exe):
    sources = [k.source for k in exe.kernels if k.source and "Conv2D" in k.name]
    assert len(sources) == 3
    return [s for s in sources if ", 1, 1] ->" in s][0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("hw,stride", [((7, 6), 1), ((15, 9), 1), ((9, 29), 1), ((17, 30), 2)])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("store", [0, 1])
def test_chunks_of_taps_match_one_pass_and_numpy(dtype, hw, stride, batch, store, rng):
    graphkernel.set_seed(17)
    net = PointwiseBetween(64, 48, stride, dtype)
    randomize(net, rng, dtype)
    x = rng.standard_normal((batch, 5, *hw)).astype(dtype)
    # 2 KiB a chunk: 16 taps of a two-vector unit (a 512-bit vector a tap each), so the 64
    # input channels go in 4 chunks; the 48 outputs' last unit of one float32 vector takes 32
    # taps a chunk (float64: 8 lanes a vector, six vectors, no short unit).
    chunked = compiled(net, x, conv_tap_chunk_bytes=2048, conv_store_epilogue=store)
    whole = compiled(net, x, conv_tap_chunk_bytes=0, conv_store_epilogue=store)
    assert CHUNKED in pointwise_source(chunked) and CHUNKED not in pointwise_source(whole)
    got = chunked(Tensor(x)).asnumpy()
    np.testing.assert_array_equal(got, whole(Tensor(x)).asnumpy())
    want = reference(net, x, stride)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=TOL[dtype] * scale)


def test_chunks_in_256_bit_code_match(rng):
    graphkernel.set_seed(19)
    net = PointwiseBetween(64, 32, 1, np.float32)
    randomize(net, rng, np.float32)
    x = rng.standard_normal((2, 5, 11, 13)).astype(np.float32)
    chunked = compiled(net, x, conv_tap_chunk_bytes=1024, vector_width=256)
    whole = compiled(net, x, conv_tap_chunk_bytes=0, vector_width=256)
    assert CHUNKED in pointwise_source(chunked)
    np.testing.assert_array_equal(chunked(Tensor(x)).asnumpy(), whole(Tensor(x)).asnumpy())


def test_the_rule_leaves_few_taps_and_3x3s_whole(rng):
    """At the default budget (16 KiB: 128 taps of a two-vector unit) a 1x1 of 64 input channels
    runs in one pass; of 512 in chunks; a 3x3 never (its input rows stay in L1)."""
    from graphkernel.backends.c.c_conv_units import tap_chunk
    assert tap_chunk(64, 128, 16, 16 << 10) == 64
    assert tap_chunk(255, 128, 16, 16 << 10) == 255  # under two chunks' worth: one pass
    assert tap_chunk(512, 128, 16, 16 << 10) == 128
    assert tap_chunk(576, 128, 16, 16 << 10) == 128  # 5 chunks of whole channel blocks
    assert tap_chunk(512, 128, 16, 0) == 512
    graphkernel.set_seed(23)
    net = PointwiseBetween(256, 32, 1, np.float32)
    randomize(net, rng, np.float32)
    x = rng.standard_normal((1, 5, 6, 6)).astype(np.float32)
    exe = compiled(net, x, conv_tap_chunk_bytes=4096)
    sources = [k.source for k in exe.kernels if k.source and "Conv2D" in k.name]
    assert [CHUNKED in s for s in sources] == [", 1, 1] ->" in s for s in sources]
    assert sum(CHUNKED in s for s in sources) == 1


@pytest.mark.parametrize("value", [-1, 1.5, "16k", None, 1 << 33])
def test_a_bad_chunk_size_is_refused_with_its_name(value):
    assert "conv_tap_chunk_bytes" in (check_tap_chunk_bytes(value) or "")
    with pytest.raises(ContextError, match="conv_tap_chunk_bytes"):
        CConfig(conv_tap_chunk_bytes=value)
