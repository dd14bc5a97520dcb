"""graphkernel.load of ONNX models: told from GKIR exports by content, run by nn.GraphCell,
compared with ONNX Runtime; shape subgraphs folded, dim_params dynamic, old opsets converted,
operators graphkernel cannot run refused at load."""
import os

import numpy as np
import pytest

if not os.environ.get("CI"):  # CI (.ci/run) installs the test extra: there a missing one fails
    pytest.importorskip("onnx", reason="pip install -e '.[test]' (onnx, onnxruntime)")
    pytest.importorskip("onnxruntime", reason="pip install -e '.[test]' (onnxruntime)")

from onnx import TensorProto  # noqa: E402
from onnx_models import (  # noqa: E402
    cnn,
    encoder_block,
    helper_node,
    init,
    mlp,
    model,
    onnxruntime_outputs,
    value,
)

import graphkernel  # noqa: E402
from graphkernel import Tensor, nn  # noqa: E402
from graphkernel.errors import ShapeError, UnsupportedError  # noqa: E402
from graphkernel.frontend import context  # noqa: E402
from graphkernel.ir.types import SymSize  # noqa: E402


@pytest.mark.parametrize("fusion", [True, False])
def test_a_cnn_with_a_dynamic_batch_matches_onnxruntime(rng, fusion):
    context.set_context(enable_graph_kernel=fusion)
    made = cnn(rng)
    loaded = graphkernel.load(made)
    (name, type_), = loaded.signature
    assert name == "x" and isinstance(type_.shape[0], SymSize) and type_.shape[1:] == (3, 16, 16)
    cell = nn.GraphCell(loaded)
    compiled = []
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        got = cell(Tensor(x)).asnumpy()
        expected, = onnxruntime_outputs(made, {"x": x})
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
        compiled.append(cell.compiled)
    assert compiled[0] is compiled[1]  # one compile serves both batch sizes


@pytest.mark.parametrize("fusion", [True, False])
def test_an_encoder_block_with_a_dynamic_batch_matches_onnxruntime(rng, fusion):
    context.set_context(enable_graph_kernel=fusion)
    made = encoder_block(rng)
    cell = nn.GraphCell(graphkernel.load(made))
    compiled = []
    for batch in (1, 3):
        x = rng.standard_normal((batch, 6, 8)).astype(np.float32)
        got = cell(Tensor(x)).asnumpy()
        expected, = onnxruntime_outputs(made, {"x": x})
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        compiled.append(cell.compiled)
    assert compiled[0] is compiled[1]  # one compile serves both batch sizes


def test_path_bytes_and_model_proto_load_alike(tmp_path, rng):
    made = mlp(rng)
    path = tmp_path / "mlp.onnx"
    path.write_bytes(made.SerializeToString())
    x = rng.standard_normal((5, 6)).astype(np.float32)
    expected, = onnxruntime_outputs(made, {"x": x})
    for source in (str(path), path, made.SerializeToString(), made, open(path, "rb")):
        got = nn.GraphCell(graphkernel.load(source))(Tensor(x)).asnumpy()
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch", [4, "batch"])
def test_the_shape_subgraph_folds_at_load(rng, batch):
    nodes = [helper_node("Shape", ["x"], ["shape"]),
             helper_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper_node("Unsqueeze", ["n", "axes0"], ["n1"]),
             helper_node("Concat", ["n1", "minus1"], ["flat"], axis=0),
             helper_node("Reshape", ["x", "flat"], ["f"]),
             helper_node("Relu", ["f"], ["y"])]
    inits = [init("zero", np.array(0, np.int64)), init("axes0", np.array([0], np.int64)),
             init("minus1", np.array([-1], np.int64))]
    made = model(nodes, [value("x", [batch, 2, 3])], [value("y", [batch, 6])], inits)
    loaded = graphkernel.load(made)
    # Shape -> Gather -> Unsqueeze -> Concat became the Reshape's shape, known at load.
    assert sorted(node.op for node in loaded.graph.nodes) == ["ReLU", "Reshape"]
    x = rng.standard_normal((4, 2, 3)).astype(np.float32)
    got = nn.GraphCell(loaded)(Tensor(x)).asnumpy()
    np.testing.assert_array_equal(got, np.maximum(x.reshape(4, 6), 0))


def test_an_old_opset_is_converted(rng):
    nodes = [helper_node("Unsqueeze", ["x"], ["u"], axes=[1]),  # axes an attribute before 13
             helper_node("Softmax", ["u"], ["y"], axis=2)]
    made = model(nodes, [value("x", [2, 5])], [value("y", [2, 1, 5])], opset=11)
    x = rng.standard_normal((2, 5)).astype(np.float32)
    got = nn.GraphCell(graphkernel.load(made))(Tensor(x)).asnumpy()
    expected, = onnxruntime_outputs(made, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("equation,shapes", [
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),  # attention scores
    ("bij,jk->bik", [(2, 3, 4), (4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("bik,bk->i", [(2, 3, 4), (2, 4)]),  # b summed by the contraction, not kept
])
def test_einsum_contractions_match_numpy(rng, equation, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    expected = np.einsum(equation, *arrays)
    made = model([helper_node("Einsum", names, ["y"], equation=equation)],
                 [value(n, list(s)) for n, s in zip(names, shapes)],
                 [value("y", list(expected.shape))])
    got = nn.GraphCell(graphkernel.load(made))(*[Tensor(a) for a in arrays]).asnumpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_an_operator_it_cannot_run_is_refused_at_load():
    nodes = [helper_node("Relu", ["x"], ["r"]),
             helper_node("NonMaxSuppression", ["r", "r"], ["y"], name="nms_1")]
    made = model(nodes, [value("x", [1, 4, 4])], [value("y", [None, 3], 7)])
    with pytest.raises(UnsupportedError, match=r"'nms_1' \(NonMaxSuppression, opset 17\)"):
        graphkernel.load(made)


def test_an_attribute_value_it_cannot_run_is_refused_at_load():
    nodes = [helper_node("Einsum", ["x"], ["y"], equation="...ii->...i", name="diagonal")]
    made = model(nodes, [value("x", [2, 3, 3])], [value("y", [2, 3])], opset=17)
    with pytest.raises(UnsupportedError, match=r"'diagonal' \(Einsum, opset 17\): equation "
                                               r"'...ii->...i': an ellipsis"):
        graphkernel.load(made)


def test_empty_reductions_and_slices_and_integer_powers(rng):
    """ONNX's answers where graphkernel's primitives refuse: a max or min over no elements is
    the reduction's identity, an empty slice is known empty, Pow of integers is exact."""
    nodes = [helper_node("ReduceMax", ["e", "axes1"], ["max_empty"], keepdims=0),
             helper_node("ReduceMin", ["b", "axes1"], ["all_of"], keepdims=1),
             helper_node("Slice", ["x", "start", "stop"], ["none"]),
             helper_node("Pow", ["i", "k"], ["power"])]
    inits = [init("axes1", np.array([1], np.int64)), init("start", np.array([5], np.int64)),
             init("stop", np.array([9], np.int64)), init("k", np.array([3], np.int64))]
    made = model(nodes, [value("e", [2, 0]), value("b", [2, 3], TensorProto.BOOL),
                         value("x", [4, 2]), value("i", [3], TensorProto.INT64)],
                 [value("max_empty", [2]), value("all_of", [2, 1], TensorProto.BOOL),
                  value("none", [0, 2]), value("power", [3], TensorProto.INT64)], inits,
                 opset=20)  # ReduceMax takes axes as an input from 18, bools from 20
    b = np.array([[True, True, True], [True, False, True]])
    i = np.array([-3, 2, 1 << 17], np.int64)
    x = rng.standard_normal((4, 2)).astype(np.float32)
    got = nn.GraphCell(graphkernel.load(made))(
        Tensor(np.zeros((2, 0), np.float32)), Tensor(b), Tensor(x), Tensor(i))
    max_empty, all_of, none, power = (g.asnumpy() for g in got)
    np.testing.assert_array_equal(max_empty, np.full(2, -np.inf, np.float32))
    np.testing.assert_array_equal(all_of, [[True], [False]])
    assert none.shape == (0, 2) and none.dtype == np.float32
    np.testing.assert_array_equal(power, i ** 3)


def test_local_response_normalisation_matches_onnxruntime(rng):
    made = model([helper_node("LRN", ["x"], ["y"], size=3, alpha=0.02, beta=0.6, bias=1.5)],
                 [value("x", ["batch", 5, 4, 4])], [value("y", ["batch", 5, 4, 4])])
    x = rng.standard_normal((2, 5, 4, 4)).astype(np.float32)
    got = nn.GraphCell(graphkernel.load(made))(Tensor(x)).asnumpy()
    expected, = onnxruntime_outputs(made, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_shape_arithmetic_on_a_dynamic_batch_folds_or_is_refused(rng):
    """PyTorch's `Expand(x, Where(Equal(shape, -1), 1, shape))` and `ConstantOfShape(shape)`
    over a dim_param fold to traced tensors serving every batch; comparing the dynamic size
    with a positive number is undecidable at load: a clear refusal naming the node."""
    def nodes(compare_with):
        return [helper_node("Shape", ["x"], ["shape"]),
                helper_node("Shape", ["shape"], ["rank"]),
                helper_node("ConstantOfShape", ["rank"], ["ones"],
                            value=init("one", np.ones(1, np.int64))),
                helper_node("Constant", [], ["other"], value_ints=[compare_with] * 2),
                helper_node("Equal", ["shape", "other"], ["unknown"], name="eq"),
                helper_node("Where", ["unknown", "ones", "shape"], ["target"]),
                helper_node("Expand", ["row", "target"], ["rows"]),
                helper_node("ConstantOfShape", ["shape"], ["twos"],
                            value=init("two", np.full(1, 2.0, np.float32))),
                helper_node("Mul", ["rows", "twos"], ["y"])]

    row = rng.standard_normal((1, 5)).astype(np.float32)
    io = [value("x", ["batch", 5])], [value("y", ["batch", 5])], [init("row", row)]
    cell = nn.GraphCell(graphkernel.load(model(nodes(-1), *io)))
    for batch in (1, 3):
        x = np.zeros((batch, 5), np.float32)
        np.testing.assert_array_equal(cell(Tensor(x)).asnumpy(), np.repeat(row * 2, batch, 0))
    with pytest.raises(UnsupportedError, match=r"'eq' \(Equal, opset 17\): comparing the "
                                               r"dynamic size N with 2"):
        graphkernel.load(model(nodes(2), *io))


def test_a_range_up_to_a_dynamic_batch_is_traced_or_refused(rng):
    """Range(0, batch, 1) is a tensor of the dynamic length, each element its position (one
    compile serves every batch, as ONNX Runtime computes); from another start its length is
    not the input's dimension: a clear refusal naming the node."""
    def nodes(start):
        return [helper_node("Shape", ["x"], ["shape"]),
                helper_node("Constant", [], ["first"], value_ints=[0]),
                helper_node("Gather", ["shape", "first"], ["batch1"]),
                helper_node("Squeeze", ["batch1"], ["batch"]),
                helper_node("Constant", [], ["start"], value=init("s", np.int64(start))),
                helper_node("Constant", [], ["step"], value=init("d", np.int64(1))),
                helper_node("Range", ["start", "batch", "step"], ["rows"], name="range"),
                helper_node("Cast", ["rows"], ["rowsf"], to=TensorProto.FLOAT),
                helper_node("Constant", [], ["axes"], value_ints=[1]),
                helper_node("Unsqueeze", ["rowsf", "axes"], ["column"]),
                helper_node("Add", ["x", "column"], ["y"])]

    io = [value("x", ["batch", 5])], [value("y", ["batch", 5])]
    made = model(nodes(0), *io)
    cell = nn.GraphCell(graphkernel.load(made))
    for batch in (1, 4):
        x = rng.standard_normal((batch, 5)).astype(np.float32)
        expected, = onnxruntime_outputs(made, {"x": x})
        np.testing.assert_array_equal(cell(Tensor(x)).asnumpy(), expected)
    with pytest.raises(UnsupportedError, match=r"'range' \(Range, opset 17\): a Range from "
                                               r"\[2\] to \[N\].*must start at 0"):
        graphkernel.load(model(nodes(2), *io))


def test_a_gather_of_negative_indices_is_one_gather_and_matches_onnxruntime(rng):
    """ONNX's indices may count from the end: the import is one Gather declared so, no wrapping
    step of its own (which, indices computed, also kept the plan off the compiled entry); a
    known index from the end of a dynamic axis runs too, and an index out of range is a clear
    error when the call's indices are known."""
    context.set_context(enable_graph_kernel=True)
    table = rng.standard_normal((7, 4)).astype(np.float32)
    made = model([helper_node("Gather", ["table", "ids"], ["rows"]),
                  helper_node("Constant", [], ["two"], value=init("c", np.float32(2.0))),
                  helper_node("Mul", ["rows", "two"], ["y"])],
                 [value("ids", [2, 3], TensorProto.INT64)], [value("y", [2, 3, 4])],
                 [init("table", table)])
    cell = nn.GraphCell(graphkernel.load(made))
    ids = np.array([[-1, 3, -7], [0, 6, -2]], np.int64)
    expected, = onnxruntime_outputs(made, {"ids": ids})
    np.testing.assert_array_equal(cell(Tensor(ids)).asnumpy(), expected)
    compiled = cell.compiled
    assert [k.op_names for k in compiled.kernels] == [["Gather"], ["Mul"]], compiled.kernels
    assert compiled.executable.runner.entry is not None
    with pytest.raises(ShapeError, match="index -8 is out of range for axis 0 of size 7"):
        cell(Tensor(np.array([[0, 0, 0], [0, -8, 0]], np.int64)))

    last = model([helper_node("Constant", [], ["end"], value_ints=[-1]),
                  helper_node("Gather", ["x", "end"], ["y"], axis=0)],
                 [value("x", ["batch", 5])], [value("y", [1, 5])])
    cell = nn.GraphCell(graphkernel.load(last))
    for batch in (1, 3):
        x = rng.standard_normal((batch, 5)).astype(np.float32)
        np.testing.assert_array_equal(cell(Tensor(x)).asnumpy(), x[-1:])


@pytest.mark.parametrize("attrs, shape", [
    (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), [2, 3, 9, 9]),
    (dict(kernel_shape=[2, 3], dilations=[2, 1], ceil_mode=1, storage_order=1), [1, 2, 8, 7]),
    (dict(kernel_shape=[2, 2, 2], strides=[2, 1, 2], pads=[0, 1, 0, 1, 0, 1]), [1, 2, 4, 5, 6]),
])
def test_maxpool_indices_match_onnxruntime(rng, attrs, shape):
    nodes = [helper_node("MaxPool", ["x"], ["y", "where"], **attrs)]
    out = [f"d{i}" for i in range(len(shape))]  # the checker infers the sizes
    made = model(nodes, [value("x", shape)],
                 [value("y", out), value("where", out, TensorProto.INT64)])
    x = rng.standard_normal(shape).astype(np.float32)
    got = [t.asnumpy() for t in nn.GraphCell(graphkernel.load(made))(Tensor(x))]
    expected = onnxruntime_outputs(made, {"x": x})
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
