"""Kernels that only index (products, convolutions, attention: float data, integer indices)
build without -fwrapv (c_text.INDEX_WRAPS, `index_kernel_options`), elementwise kernels keep
it, so integer ops still wrap as numpy's do. Leaving it out changes no float result: a network
built both ways gives the same bits, and numpy's result within the tolerance."""
import numpy as np
import pytest
from cells import ON, compiled_with

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c import c_gemm, c_text
from graphkernel.backends.c.c_gemm_packed import PACKED_PRODUCT_LABEL
from graphkernel.ops import operations as P

NO_WRAPV = '"no-wrapv"'


class ConvDense(nn.Cell):
    """conv 3x3 + BN + ReLU, then a Dense of 2048 -> 512 (a product of 64 rows)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 32, 3, pad_mode="pad", padding=1, has_bias=False)
        self.bn, self.relu = nn.BatchNorm2d(32), nn.ReLU()
        self.flat, self.dense = nn.Flatten(), nn.Dense(32 * 64, 512)

    def construct(self, x):
        return self.dense(self.flat(self.relu(self.bn(self.conv(x)))))


def reference(net, x):
    p = {name: v.asnumpy().astype(np.float64) for name, v in net.parameters_and_names()}
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + 8, j:j + 8], p["conv.weight"][:, :, i, j])
            for i in range(3) for j in range(3))
    scale = p["bn.gamma"] / np.sqrt(p["bn.moving_variance"] + 1e-5)
    y = (y - p["bn.moving_mean"][:, None, None]) * scale[:, None, None] + \
        p["bn.beta"][:, None, None]
    y = np.maximum(y, 0).reshape(len(x), -1)
    return y @ p["dense.weight"].T + p["dense.bias"]


def conv_sources(exe):
    return [k.source for k in exe.kernels if k.source and "Conv2D" in k.name]


def test_products_and_convolutions_give_the_same_bits_without_wrapping(rng, cache_folder,
                                                                        monkeypatch):
    graphkernel.set_seed(5)
    net = ConvDense()
    for _, p in net.parameters_and_names():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.2 + (1.0 if "moving_var" in p.name
                                                                 else 0.0)).astype(np.float32)))
    x = rng.standard_normal((64, 8, 8, 8)).astype(np.float32)
    indexed = graphkernel.compile(net, Tensor(x), options=ON)
    assert conv_sources(indexed) and all(NO_WRAPV in s for s in conv_sources(indexed))
    product = [st for st in indexed.executable.plan.steps if st.op == "MatMul"]
    if product[0].attrs.get("gemm_library") != PACKED_PRODUCT_LABEL:
        pytest.skip("the packed product needs AVX-512 and two OpenMP threads")
    got = indexed(Tensor(x)).asnumpy()
    wrapping = compiled_with(net, x, (c_text, "INDEX_WRAPS", True), cache_folder, monkeypatch)
    assert not any(NO_WRAPV in s for s in conv_sources(wrapping))
    np.testing.assert_array_equal(got, wrapping(Tensor(x)).asnumpy())
    want = reference(net, x)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("wraps", [False, True])
def test_the_entry_product_kernels_follow_the_setting(wraps, monkeypatch):
    """The small, packed and row products, all three in the entry's prelude."""
    monkeypatch.setattr(c_text, "INDEX_WRAPS", wraps)
    prelude = "\n".join(c_gemm.prelude(True, True))
    assert prelude.count(NO_WRAPV) == (0 if wraps else 3)
    assert "GK_INDEX_OPTIONS" not in prelude


def test_integer_elementwise_kernels_keep_wrapping(cache_folder):
    """int32 (a + b) * 3 - a overflows on purpose; numpy wraps, and so does the fused kernel."""
    class Net(nn.Cell):
        def construct(self, a, b):
            return P.Sub()(P.Mul()(P.Add()(a, b), 3), a)

    info = np.iinfo(np.int32)
    a = np.array([info.max, info.max - 5, info.min, 7, -9, 1 << 30] * 8, np.int32)
    b = np.array([1, 9, -1, 3, info.min, 1 << 30] * 8, np.int32)
    exe = graphkernel.compile(Net(), a, b, options=ON)
    sources = [k.source for k in exe.kernels if k.source]
    assert sources and not any(NO_WRAPV in s for s in sources)
    with np.errstate(over="ignore"):
        want = (a + b) * np.int32(3) - a
    np.testing.assert_array_equal(exe.run_arrays(a, b)[0], want)
