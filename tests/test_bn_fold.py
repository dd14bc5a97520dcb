"""Inference BatchNorm folded into the convolution before it (graph_kernel/bn_fold.py): the
convolution computes with weight * gamma / sqrt(var + eps), the kernel after it adds the
per-channel shift; the report says so. Folded against unfolded (fusion off) against numpy on
odd shapes, launches counted, and the cases that must not fold."""
import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)


class Block(nn.Cell):
    def __init__(self, cin, cout, kernel, stride, dilation, group, has_bias, residual,
                 dtype=np.float32):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, dilation=dilation, group=group,
                              has_bias=has_bias, dtype=dtype)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3, dtype=dtype)
        self.relu = nn.ReLU()
        self.residual = residual

    def construct(self, x):
        y = self.bn(self.conv(x))
        return self.relu(y + x if self.residual else y)


def conv_numpy(x, w, stride, dilation, group, pads):
    """A direct loop over output positions, in float64."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), pads[0], pads[1]))
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = (h - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for oc in range(o):
        g = oc // (o // group)
        for i in range(oh):
            for j in range(ow):
                patch = x[:, g * cg:(g + 1) * cg, i * stride:i * stride + dilation * kh:dilation,
                          j * stride:j * stride + dilation * kw:dilation]
                out[:, oc, i, j] = (patch * w[oc]).sum(axis=(1, 2, 3))
    return out


def randomize(net, rng, dtype):
    for _, p in net.parameters_and_names():
        p.set_data(rng.standard_normal(p.shape).astype(dtype))
    net.bn.moving_variance.set_data(rng.random(net.bn.moving_variance.shape).astype(dtype) + 0.2)
    net.set_train(False)


CASES = {  # cin, cout, kernel, stride, dilation, group, bias, residual, input (n, h, w), pads
    "plain": (3, 5, 3, 1, 1, 1, False, False, (2, 7, 5), ((1, 1), (1, 1))),
    "bias_residual": (4, 4, 3, 1, 1, 1, True, True, (3, 6, 6), ((1, 1), (1, 1))),
    "stride2_nonsquare": (2, 6, (3, 1), 2, 1, 1, True, False, (1, 9, 4), ((1, 1), (0, 0))),
    "dilated_groups": (4, 6, 3, 1, 2, 2, True, False, (2, 8, 7), ((2, 2), (2, 2))),
    "one_by_one": (1, 1, 1, 1, 1, 1, True, False, (1, 1, 1), ((0, 0), (0, 0))),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_folded_conv_bn_relu_matches_unfolded_and_numpy(name, dtype, rng):
    cin, cout, k, stride, dilation, group, bias, residual, (n, h, w), pads = CASES[name]
    net = Block(cin, cout, k, stride, dilation, group, bias, residual, dtype)
    randomize(net, rng, dtype)
    x = rng.standard_normal((n, cin, h, w)).astype(dtype)
    on = graphkernel.compile(net, x, options=ON)
    off = graphkernel.compile(net, x, options=OFF)
    p = {name: prm.asnumpy().astype(np.float64) for name, prm in net.parameters_and_names()}
    y = conv_numpy(x, p["conv.weight"], stride, dilation, group, pads)
    if bias:
        y += p["conv.bias"].reshape(1, -1, 1, 1)
    ch = (1, -1, 1, 1)
    y = (y - p["bn.moving_mean"].reshape(ch)) / np.sqrt(p["bn.moving_variance"].reshape(ch)
                                                        + 1e-3) * p["bn.gamma"].reshape(ch) \
        + p["bn.beta"].reshape(ch)
    want = np.maximum(y + x if residual else y, 0)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    folded, unfolded = on.run_arrays(x)[0], off.run_arrays(x)[0]
    np.testing.assert_allclose(folded, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(unfolded, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(folded, unfolded, rtol=tol, atol=tol)
    # One kernel (backends/c/c_conv_block.py): the convolution, then over each image's tile the
    # bias, BatchNorm's shift, residual add and ReLU.
    (kernel,) = on.kernels
    assert kernel.op_names[0] == "Conv2DFoldedBN" and kernel.backend == "native", on.summary()
    assert {"Rsqrt", "Maximum"} <= set(kernel.op_names)
    assert on.report.rewrites == [
        "BatchNorm folded into Conv2D's weights (inference BatchNorm: the convolution computes "
        "with weight * gamma / sqrt(variance + 0.001), the kernel after it adds the per-channel "
        f"shift beta {'+ (bias - mean)' if bias else '- mean'} * that scale)"]
    assert "rewrites:\n  BatchNorm folded into Conv2D's weights" in on.summary()
    assert off.report.rewrites == [] and "Conv2DFoldedBN" not in str(off.kernels)


def test_folded_weights_follow_new_parameters(rng):
    net = Block(3, 4, 3, 1, 1, 1, True, False)
    randomize(net, rng, np.float32)
    x = Tensor(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    graphkernel.context.set_context(enable_graph_kernel=True)
    try:
        first = net(x).asnumpy()
        net.bn.gamma.set_data(net.bn.gamma.asnumpy() * 2)  # no recompile: same signature
        net.bn.moving_variance.set_data(net.bn.moving_variance.asnumpy() + 1)
        second = net(x).asnumpy()
    finally:
        graphkernel.context.set_context(enable_graph_kernel=False)
    want = graphkernel.compile(net, x.asnumpy(), options=OFF).run_arrays(x.asnumpy())[0]
    np.testing.assert_allclose(second, want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(first, second)


def test_float16_is_not_folded_and_the_report_says_why(rng):
    net = Block(2, 3, 3, 1, 1, 1, True, False, np.float16)
    randomize(net, rng, np.float16)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float16)
    on = graphkernel.compile(net, x, options=ON)
    off = graphkernel.compile(net, x, options=OFF)
    np.testing.assert_allclose(on.run_arrays(x)[0].astype(np.float32),
                               off.run_arrays(x)[0].astype(np.float32), rtol=2e-2, atol=2e-2)
    assert on.report.rewrites == ["BatchNorm kept in the kernel after Conv2D: folding it into "
                                  "float16 weights is not exact enough (float32 and float64 "
                                  "fold)"]
    assert "Conv2DFoldedBN" not in [k.op_names[0] for k in on.kernels]


def test_no_fold_in_training_or_when_the_conv_has_another_reader(rng):
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    params = [rng.random(4).astype(np.float32) + 0.5 for _ in range(4)]
    conv = P.Conv2D(4, 3, pad_mode="same")

    class Fn(nn.Cell):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def construct(self, *xs):
            return self.fn(*xs)

    def twice(a, b, *p):
        y = conv(a, b)
        return P.BatchNorm()(y, *p)[0] + y

    def training(a, b, *p):
        return P.BatchNorm(is_training=True)(conv(a, b), *p)[0]

    for fn in (twice, training):
        on = graphkernel.compile(Fn(fn), x, w, *params, options=ON)
        off = graphkernel.compile(Fn(fn), x, w, *params, options=OFF)
        np.testing.assert_allclose(on.run_arrays(x, w, *params)[0],
                                   off.run_arrays(x, w, *params)[0], rtol=1e-5, atol=1e-5)
        assert on.report.rewrites == [] and "Conv2DFoldedBN" not in str(on.kernels)


def test_the_html_report_lists_the_fold(tmp_path, rng):
    from graphkernel.tools.report import write_report
    net = Block(4, 4, 3, 1, 1, 1, True, True)
    randomize(net, rng, np.float32)
    x = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    exe = graphkernel.compile(net, x, options=ON)
    page = open(write_report(exe, str(tmp_path / "r.html"), repeats=2), encoding="utf-8").read()
    assert "<h3>Rewrites</h3><ul><li>BatchNorm folded into Conv2D&#x27;s weights" in page
