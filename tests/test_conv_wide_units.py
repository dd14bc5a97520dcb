"""The register tile's rule for a stride-1 1x1 convolution, whose units read its input in place:
four channel vectors a unit where its output rows are long (conv_tile.rule_vectors), two
elsewhere. The wide units give the two-vector units' results bit for bit (each output sums its
taps in tap order on every tile) and the numpy reference's within the tolerance: batch 1 (an
image's units shared over the threads) and 3, float32 and float64, the epilogue in the stores
or after, chunks of taps or one pass; a chosen tile stays as chosen."""
import numpy as np
import pytest
from test_conv_epilogue import TOL, randomize
from test_conv_tap_chunks import PointwiseBetween, compiled, pointwise_source, reference

import graphkernel
from graphkernel import Tensor
from graphkernel.backends.c import toolchain
from graphkernel.backends.c.conv_tile import (
    DEFAULT_VECTORS,
    RULE_TILE,
    WIDE_POINTWISE_MIN_ROW,
    WIDE_POINTWISE_MIN_TAPS,
    WIDE_POINTWISE_VECTORS,
    ConvTile,
    fit_pixels,
    rule_vectors,
)

needs_avx512 = pytest.mark.skipif(
    toolchain.detect() is None or not toolchain.detect().avx512,
    reason="the register tile shapes the 512-bit code alone")


def unit_vectors(source):
    """The channel vectors of a unit of the 512-bit code, as the kernel's C declares them."""
    line = next(s for s in source.splitlines() if "_UV = " in s and "_NU = " in s)
    return int(line.split("_UV = ")[1].split(",")[0])


def test_the_rule_widens_in_place_pointwise_units_with_long_rows():
    wide, row, taps = WIDE_POINTWISE_VECTORS, WIDE_POINTWISE_MIN_ROW, WIDE_POINTWISE_MIN_TAPS
    assert rule_vectors(True, 4, row, taps) == wide
    assert rule_vectors(True, 8, 56, 256) == wide
    assert rule_vectors(True, 4, row - 1, 256) == DEFAULT_VECTORS  # rows of 14 and 7 keep two
    assert rule_vectors(True, 8, 56, taps - 1) == DEFAULT_VECTORS  # so do few taps
    assert rule_vectors(True, 3, 56, 256) == DEFAULT_VECTORS  # no unit may be short
    assert rule_vectors(True, 6, 56, 256) == DEFAULT_VECTORS
    assert rule_vectors(False, 8, 56, 256) == DEFAULT_VECTORS  # 3x3s and strided 1x1s
    assert RULE_TILE.for_convolution(True, 8, 56, 256) == ConvTile(vectors=wide)
    assert RULE_TILE.for_convolution(False, 8, 56, 256) is RULE_TILE
    chosen = ConvTile(vectors=1)
    assert chosen.for_convolution(True, 8, 56, 256) is chosen
    # chosen pixels that a wide unit's registers cannot hold keep the rule's two vectors
    many = ConvTile(pixels=fit_pixels(wide) + 1)
    assert many.for_convolution(True, 8, 56, 256) is many
    few = ConvTile(pixels=fit_pixels(wide))
    assert few.for_convolution(True, 8, 56, 256) == \
        ConvTile(vectors=wide, pixels=fit_pixels(wide))


@needs_avx512
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("store,chunk", [(0, 0), (1, 0), (0, 2048)])
def test_wide_units_match_two_vector_units_and_numpy(dtype, batch, store, chunk, rng):
    graphkernel.set_seed(29)
    # 64 taps; 64 output channels: four float32 vectors (one wide unit), eight float64 (two)
    net = PointwiseBetween(64, 64, 1, dtype)
    randomize(net, rng, dtype)
    x = rng.standard_normal((batch, 5, 5, 30)).astype(dtype)
    rule = compiled(net, x, conv_store_epilogue=store, conv_tap_chunk_bytes=chunk)
    two = compiled(net, x, conv_store_epilogue=store, conv_tap_chunk_bytes=chunk,
                   conv_channel_vectors=2)
    assert unit_vectors(pointwise_source(rule)) == WIDE_POINTWISE_VECTORS
    assert unit_vectors(pointwise_source(two)) == 2
    got = rule(Tensor(x)).asnumpy()
    np.testing.assert_array_equal(got, two(Tensor(x)).asnumpy())
    want = reference(net, x, 1)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=TOL[dtype] * scale)


@needs_avx512
@pytest.mark.parametrize("c,o,hw,stride", [(64, 64, (6, 14), 1), (64, 48, (4, 30), 1),
                                          (64, 64, (9, 60), 2), (32, 64, (4, 30), 1)])
def test_short_rows_partial_units_and_strides_keep_two_vectors(c, o, hw, stride, rng):
    graphkernel.set_seed(31)
    net = PointwiseBetween(c, o, stride, np.float32)
    randomize(net, rng, np.float32)
    x = rng.standard_normal((2, 5, *hw)).astype(np.float32)
    exe = compiled(net, x)
    assert unit_vectors(pointwise_source(exe)) == DEFAULT_VECTORS
    want = reference(net, x, stride)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(exe(Tensor(x)).asnumpy(), want, rtol=0,
                               atol=TOL[np.float32] * scale)
