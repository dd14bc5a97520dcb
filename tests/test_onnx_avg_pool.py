"""ONNX AveragePool with explicit pads (Inception's and DenseNet's 3x3 stride-1 pools, ceil_mode's
extra end padding, count_include_pad): the import gives the pads to graphkernel's AvgPool, whose
padding is not counted, as MaxPool's are; count_include_pad's larger divisors are a constant
rescale after it. The import used to concatenate zero borders first (Concat steps that kept the
plan off the compiled entry). And the way back: a padded AvgPool exports as AveragePool."""
import os

import numpy as np
import pytest

if not os.environ.get("CI"):  # CI (.ci/run) installs the test extra: there a missing one fails
    pytest.importorskip("onnx", reason="pip install -e '.[test]' (onnx, onnxruntime)")
    pytest.importorskip("onnxruntime", reason="pip install -e '.[test]' (onnxruntime)")

import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from onnx_models import onnxruntime_outputs  # noqa: E402

import graphkernel  # noqa: E402
from graphkernel import Tensor, nn  # noqa: E402
from graphkernel.frontend import context  # noqa: E402
from graphkernel.graph_kernel.cluster import flat_ops  # noqa: E402
from graphkernel.ops import operations as P  # noqa: E402


def pool_model(shape, kernel, strides, pads, count_include_pad, ceil_mode):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=list(kernel),
                            strides=list(strides), pads=list(pads),
                            count_include_pad=count_include_pad, ceil_mode=ceil_mode)
    relu = helper.make_node("Relu", ["p"], ["y"])  # something after the pool to fuse with
    model = helper.make_model(helper.make_graph([node, relu], "pool", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    inferred = onnx.shape_inference.infer_shapes(model)  # the output's shape, from ONNX's rules
    pooled, = [v for v in inferred.graph.value_info if v.name == "p"]
    model.graph.output[0].type.CopyFrom(pooled.type)
    return model


# shape, kernel, strides, pads (begins, then ends), count_include_pad, ceil_mode
CASES = [
    ((2, 3, 9, 9), (3, 3), (1, 1), (1, 1, 1, 1), 0, 0),  # Inception's branch pool
    ((2, 3, 9, 9), (3, 3), (1, 1), (1, 1, 1, 1), 1, 0),
    ((1, 4, 10, 7), (3, 2), (2, 2), (1, 0, 0, 1), 0, 1),  # asymmetric, ceil's end padding
    ((1, 4, 10, 7), (3, 2), (2, 2), (1, 0, 0, 1), 1, 1),
    ((1, 2, 20, 20), (5, 5), (3, 3), (2, 2, 2, 2), 1, 1),  # ceil adds 2 uncounted rows, cols
]


@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"k{c[1][0]}s{c[2][0]}p{c[3]}"
                         f"cip{c[4]}ceil{c[5]}")
def test_an_average_pool_with_pads_is_one_padded_pool_and_matches_onnxruntime(
        case, fusion, tmp_path, rng):
    shape, kernel, strides, pads, count_include_pad, ceil_mode = case
    context.set_context(enable_graph_kernel=fusion)
    model = pool_model(*case)
    path = str(tmp_path / "pool.onnx")
    onnx.save(model, path)
    loaded = graphkernel.load(path)
    ops = [n.op for n in loaded.graph.nodes]
    pools = [n for n in loaded.graph.nodes if n.op == "AvgPool"]
    assert len(pools) == 1 and pools[0].attrs["pad_mode"] == "pad", ops
    assert "Concat" not in ops, ops
    # The pool divides as ONNX does by itself, but for count_include_pad beside ceil_mode's
    # uncounted end padding (the 5x5 case): a rescale (Mul) after it.
    rescaled = case == CASES[-1]
    flat = [m.op for n in loaded.graph.nodes for m in flat_ops(n)]
    assert ("Mul" in flat) == rescaled, flat
    assert pools[0].attrs["count_include_pad"] == (bool(count_include_pad) and not rescaled)
    compiled = nn.GraphCell(loaded).compiled
    if fusion:
        assert compiled.entry is not None, compiled.plan.describe()
        # the pool, then the Relu (and any rescale)
        assert compiled.kernel_count == 2, [k.name for k in compiled.kernels]
    x = (rng.standard_normal(shape) + 0.5).astype(np.float32)
    expected, = onnxruntime_outputs(model, {"x": x})
    got = compiled(Tensor(x)).asnumpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_window_of_padding_alone_keeps_the_zero_bordered_form(tmp_path, rng):
    """A window over padding only (pads as large as the kernel, which ONNX Runtime refuses)
    averages nothing in graphkernel's AvgPool; count_include_pad=1 makes it zero: the import
    keeps the zero-bordered form there."""
    model = pool_model((1, 1, 4, 4), (2, 2), (2, 2), (2, 2, 0, 0), 1, 0)
    path = str(tmp_path / "pool.onnx")
    onnx.save(model, path)
    context.set_context(enable_graph_kernel=True)
    x = rng.standard_normal((1, 1, 4, 4)).astype(np.float32)
    padded = np.pad(x, ((0, 0), (0, 0), (2, 0), (2, 0)))
    expected = np.maximum(padded.reshape(1, 1, 3, 2, 3, 2).mean(axis=(3, 5)), 0)
    got = nn.GraphCell(graphkernel.load(path))(Tensor(x)).asnumpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("pad_mode,padding,counted", [
    ("same", 0, False), ("pad", (1, 0, 2, 1), False), ("pad", (1, 1, 1, 1), True)])
def test_a_padded_avg_pool_exports_as_average_pool_and_runs_in_onnxruntime(
        pad_mode, padding, counted, tmp_path, rng):
    """graphkernel's AvgPool counts its padding as ONNX's count_include_pad says."""
    context.set_context(enable_graph_kernel=True)

    class ConvPool(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, pad_mode="same")
            self.pool = P.AvgPool(kernel_size=3, strides=2, pad_mode=pad_mode, pad=padding,
                                  count_include_pad=counted)

        def construct(self, x):
            return self.pool(self.conv(x))

    net = ConvPool()
    net.set_train(False)
    x = rng.standard_normal((2, 3, 11, 10)).astype(np.float32)
    expected = net(Tensor(x)).asnumpy()
    path = graphkernel.export(net, Tensor(x), file_name=str(tmp_path / "pool"),
                              file_format="ONNX")
    made = onnx.load(path)
    onnx.checker.check_model(made, full_check=True)
    pool, = [n for n in made.graph.node if n.op_type == "AveragePool"]
    assert any(p > 0 for a in pool.attribute if a.name == "pads" for p in a.ints)
    assert [a.i for a in pool.attribute if a.name == "count_include_pad"] == [int(counted)]
    (name,) = [i.name for i in made.graph.input]
    got, = onnxruntime_outputs(made, {name: x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    back = nn.GraphCell(graphkernel.load(path))(Tensor(x)).asnumpy()  # and read back in
    np.testing.assert_allclose(back, expected, rtol=1e-5, atol=1e-6)
