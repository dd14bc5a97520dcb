"""Convolutions whose output channels are not whole vectors, written to NCHW planes
(backends/c/c_conv_units.py `planes_by_whole_vector`): each whole vector of channels stores
through the transpose in registers, the vector holding the last channels channel by channel.
Random inputs at odd channel counts and map sizes (a small image in flat blocks, whole rows,
row segments with a remainder), float32 and float64, fused and unfused, against numpy."""
import numpy as np
import pytest
from cells import OFF, ON, Fn

import graphkernel
from graphkernel.ir.opset import get_op
from graphkernel.ops import operations as P

# (batch, input channels, output channels, height, width, stride): input channels at most 64
# (few taps: the pixel-by-pixel stores), output channels past whole 16- and 8-lane vectors.
CASES = [(1, 16, 72, 56, 56, 1), (2, 24, 88, 13, 29, 1), (1, 16, 40, 7, 9, 1),
         (2, 5, 37, 11, 61, 1), (1, 32, 24, 30, 30, 2), (3, 8, 20, 6, 5, 1),
         (1, 64, 100, 17, 19, 1)]


def reference(x, w, b, stride):
    opdef = get_op("Conv2D")
    y = opdef.reference(x.astype(np.float64), w.astype(np.float64),
                        **{**opdef.attr_defaults, "out_channel": w.shape[0], "kernel_size": 1,
                           "stride": stride})
    return np.maximum(y + b.astype(np.float64).reshape(1, -1, 1, 1), 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES)
def test_channels_past_whole_vectors_store_planes(case, dtype, rng):
    n, c, o, h, wd, stride = case
    x = rng.standard_normal((n, c, h, wd)).astype(dtype)
    w = (rng.standard_normal((o, c, 1, 1)) * 0.3).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    conv = P.Conv2D(o, 1, stride=stride)

    def net(a, k, bias):
        return P.ReLU()(P.BiasAdd()(conv(a, k), bias))
    want = reference(x, w, b, stride)
    tol = {"float32": 2e-5, "float64": 1e-12}[dtype]
    scale = max(1.0, float(np.abs(want).max()))
    results = []
    for options in (ON, OFF):
        exe = graphkernel.compile(Fn(net), x, w, b, options=options)
        got = exe.run_arrays(x, w, b)[0]
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * scale,
                                   err_msg=str((case, dtype, options is ON)))
        results.append(got)
        source = "".join(exe.executable.kernel_sources.values())
        lanes = 16 if dtype == "float32" else 8
        if o % lanes:  # the 512-bit code's units: whole vectors apart from the last one
            assert "+ 1) * VL <= " in source, (case, dtype)
    np.testing.assert_array_equal(results[0], results[1])  # every path sums taps in one order
