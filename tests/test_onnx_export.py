"""graphkernel.export(..., file_format="ONNX"): a network's forward graph as an ONNX model that
onnx.checker accepts and ONNX Runtime runs with graphkernel's result; read back by
graphkernel.load."""
import os

import numpy as np
import pytest

if not os.environ.get("CI"):  # CI (.ci/run) installs the test extra: there a missing one fails
    pytest.importorskip("onnx", reason="pip install -e '.[test]' (onnx, onnxruntime)")
    pytest.importorskip("onnxruntime", reason="pip install -e '.[test]' (onnxruntime)")

import onnx  # noqa: E402
from onnx_models import onnxruntime_outputs  # noqa: E402

import graphkernel  # noqa: E402
from graphkernel import Tensor, nn  # noqa: E402
from graphkernel.errors import UnsupportedError  # noqa: E402
from graphkernel.frontend import context  # noqa: E402
from graphkernel.ops import operations as P  # noqa: E402


def cnn():
    net = nn.SequentialCell([
        nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True), nn.BatchNorm2d(4),
        nn.ReLU(), nn.MaxPool2d(2, 2), nn.Conv2d(4, 6, 3, stride=2, pad_mode="same"),
        nn.Flatten(), nn.Dense(24, 5), nn.GELU(), nn.LayerNorm((5,)), nn.Softmax()])
    net.set_train(False)
    return net


@pytest.mark.parametrize("fusion", [True, False])
def test_an_exported_network_runs_in_onnxruntime_with_the_same_result(tmp_path, rng, fusion):
    context.set_context(enable_graph_kernel=fusion)
    net = cnn()
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    expected = net(Tensor(x)).asnumpy()
    path = graphkernel.export(net, Tensor(x), file_name=str(tmp_path / "cnn"),
                              file_format="ONNX")
    assert path.endswith(".onnx")
    made = onnx.load(path)
    onnx.checker.check_model(made, full_check=True)
    (name,) = [i.name for i in made.graph.input]
    got, = onnxruntime_outputs(made, {name: x})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    back = nn.GraphCell(graphkernel.load(path))(Tensor(x)).asnumpy()  # and read back in
    np.testing.assert_allclose(back, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("axis", [0, -1])
def test_unstack_exports_as_one_gather_per_item(tmp_path, rng, axis):
    """Unstack (ViT's attention splits q, k, v with it) has several outputs: each item taken
    becomes an ONNX Gather of that index, which drops the axis as Unstack does."""
    class SplitQKV(nn.Cell):
        def __init__(self):
            super().__init__()
            self.unstack = P.Unstack(axis=axis)
            self.matmul = P.BatchMatMul(transpose_b=True)

        def construct(self, x):
            q, k, v = self.unstack(x)
            return self.matmul(q, k) + v

    x = rng.standard_normal((3, 2, 4, 4) if axis == 0 else (2, 4, 4, 3)).astype(np.float32)
    net = SplitQKV()
    expected = net(Tensor(x)).asnumpy()
    path = graphkernel.export(net, Tensor(x), file_name=str(tmp_path / "qkv"),
                              file_format="ONNX")
    made = onnx.load(path)
    onnx.checker.check_model(made, full_check=True)
    assert [n.op_type for n in made.graph.node].count("Gather") == 3
    got, = onnxruntime_outputs(made, {made.graph.input[0].name: x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("index", [
    (slice(None), 0), (Ellipsis, slice(1, None, 2)), (1, None, slice(None, None, -1)),
    (slice(None), -1, slice(0, 2)), (Ellipsis, None), (slice(-3, None),)])
def test_tensor_indexing_exports_as_slice_squeeze_unsqueeze(tmp_path, rng, index):
    """`x[:, 0]` (ViT's class token), steps, negative and integer indices, new axes and an
    ellipsis: StridedSlice exported as ONNX Slice/Squeeze/Unsqueeze gives numpy's result."""
    class Index(nn.Cell):
        def construct(self, x):
            return x[index] * 2.0

    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    expected = x[index] * 2.0
    np.testing.assert_allclose(Index()(Tensor(x)).asnumpy(), expected)
    path = graphkernel.export(Index(), Tensor(x), file_name=str(tmp_path / "index"),
                              file_format="ONNX")
    made = onnx.load(path)
    onnx.checker.check_model(made, full_check=True)
    got, = onnxruntime_outputs(made, {made.graph.input[0].name: x})
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_slice_exports(tmp_path, rng):
    class SliceCell(nn.Cell):
        def construct(self, x):
            return P.Slice()(x, (1, 0, 2), (2, 4, 3))

    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    path = graphkernel.export(SliceCell(), Tensor(x), file_name=str(tmp_path / "slice"),
                              file_format="ONNX")
    made = onnx.load(path)
    got, = onnxruntime_outputs(made, {made.graph.input[0].name: x})
    np.testing.assert_array_equal(got, x[1:3, 0:4, 2:5])


def test_a_primitive_without_an_onnx_mapping_is_refused_before_writing(tmp_path):
    class OneHotCell(nn.Cell):
        def construct(self, x):
            return P.OneHot()(x, 4, 1.0, 0.0)

    with pytest.raises(UnsupportedError, match="OneHot"):
        graphkernel.export(OneHotCell(), Tensor(np.array([0, 2], np.int32)),
                           file_name=str(tmp_path / "h"), file_format="ONNX")
    assert not os.listdir(tmp_path)


class Pairs(nn.Cell):
    """A Reshape whose size depends on the batch (rows of 8 from rows of 4: batch 2*N)."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(6, 4)

    def construct(self, x):
        return P.Reshape()(self.dense(x), (-1, 8)) * 2.0


@pytest.mark.parametrize("make,features,batches", [(cnn, (3, 8, 8), (1, 3)),
                                                   (Pairs, (6,), (2, 6))])
def test_a_shape_generic_network_exports_dim_params(tmp_path, rng, make, features, batches):
    context.set_context(enable_graph_kernel=True)
    net = make()
    net.set_inputs(Tensor(shape=[None, *features], dtype=graphkernel.float32))
    path = graphkernel.export(net, Tensor(np.zeros((batches[0], *features), np.float32)),
                              file_name=str(tmp_path / "generic"), file_format="ONNX")
    made = onnx.load(path)
    onnx.checker.check_model(made, full_check=True)
    (inp,) = made.graph.input
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert dims[1:] == list(features) and dims[0] in ("N", "2*N")
    for batch in batches:  # one file, two batch sizes, as graphkernel runs them
        x = rng.standard_normal((batch, *features)).astype(np.float32)
        got, = onnxruntime_outputs(made, {inp.name: x})
        np.testing.assert_allclose(got, net(Tensor(x)).asnumpy(), rtol=1e-4, atol=1e-6)


EXPORTS = os.path.join(os.path.dirname(__file__), "data", "onnx")
# tests/data/onnx/make_models.py's PyTorch exports: the input's shape after the dynamic batch
# (the masked ones take an attention mask too, and hold a Range up to the batch)
REAL_EXPORTS = {"resnet18_small": (3, 32, 32), "mobilenetv3_small": (3, 64, 64),
                "bert_encoder_small": (16,), "gpt2_block_small": (16,),
                "bert_encoder_masked_small": (16,), "gpt2_block_masked_small": (16,)}


@pytest.mark.parametrize("name", sorted(REAL_EXPORTS))
def test_an_imported_model_written_back_out_runs_in_onnxruntime_alike(tmp_path, rng, name):
    """graphkernel.export(GraphCell(load(x)), ..., file_format="ONNX"): the imported model's
    graph as loaded (initializers as constants, the dynamic batch a dim_param) runs in ONNX
    Runtime with the original model's result at batch 1 and 3."""
    source = os.path.join(EXPORTS, f"{name}.onnx")
    rest = REAL_EXPORTS[name]
    context.set_context(enable_graph_kernel=True)
    cell = nn.GraphCell(graphkernel.load(source))

    def example(batch):
        if len(rest) > 1:  # an image
            return [rng.standard_normal((batch,) + rest).astype(np.float32)]
        ids = rng.integers(0, 100, (batch,) + rest).astype(np.int64)
        mask = np.ones_like(ids)
        mask[:, -3:] = 0  # used by the masked exports only
        return [ids, mask][:len(cell._loaded.signature)]
    path = graphkernel.export(cell, *[Tensor(a) for a in example(2)],
                              file_name=str(tmp_path / name), file_format="ONNX")
    made, original = onnx.load(path), onnx.load(source)
    onnx.checker.check_model(made, full_check=True)
    given = {t.name for t in original.graph.initializer}
    written = [i.name for i in made.graph.input]
    read = [i.name for i in original.graph.input if i.name not in given]
    assert all(i.type.tensor_type.shape.dim[0].dim_param for i in made.graph.input)  # any batch
    for batch in (1, 3):
        arrays = example(batch)
        got, = onnxruntime_outputs(made, dict(zip(written, arrays)))
        expected, = onnxruntime_outputs(original, dict(zip(read, arrays)))
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


def test_a_graph_cell_of_a_gkir_export_is_refused_for_onnx(tmp_path, rng):
    """A GKIR export holds only its fused final graph: writing it as ONNX is a clear refusal,
    and nothing is written."""
    net = cnn()
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    gkir = graphkernel.export(net, Tensor(x), file_name=str(tmp_path / "cnn"))
    cell = nn.GraphCell(graphkernel.load(gkir))
    with pytest.raises(UnsupportedError, match="GKIR export"):
        graphkernel.export(cell, Tensor(x), file_name=str(tmp_path / "back"), file_format="ONNX")
    assert not os.path.exists(tmp_path / "back.onnx")
