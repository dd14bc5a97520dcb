"""Shape-generic exports: a graph with dynamic dimensions (Cell.set_inputs, automatic dynamic
shapes, an ONNX dim_param) is written with its symbols and their rules, and the loaded graph runs
every size they allow with one compile; a graph exported at fixed shapes stays fixed."""
import json
import zipfile

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphkernel
from graphkernel import Symbol, Tensor, nn
from graphkernel.errors import InputError
from graphkernel.frontend import context
from graphkernel.ops import operations as P

FEATURES = 12


def mlp() -> nn.Cell:
    return nn.SequentialCell([nn.Dense(FEATURES, 24), nn.GELU(), nn.LayerNorm((24,)),
                              nn.Dense(24, 5), nn.Softmax()])


class Pairs(nn.Cell):
    """A Reshape that needs an even row count: the compiler makes the batch 2*N."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(FEATURES, 4)

    def construct(self, x):
        return P.Reshape()(self.dense(x), (-1, 8)) * 2.0


def manifest(path):
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read("manifest.json"))


def rows(rng, n):
    return rng.standard_normal((n, FEATURES)).astype(np.float32)


@pytest.mark.parametrize("fusion", [True, False])
def test_a_set_inputs_export_runs_every_batch_with_one_compile(tmp_path, rng, fusion):
    context.set_context(enable_graph_kernel=fusion)
    net = mlp()
    net.set_inputs(Tensor(shape=[None, FEATURES], dtype=graphkernel.float32))
    path = graphkernel.export(net, Tensor(rows(rng, 4)), file_name=str(tmp_path / "net"))
    written = manifest(path)
    assert written["version"] == 2
    assert written["signature"][0]["shape"] == [{"coef": 1, "symbols": ["N"]}, FEATURES]
    cell = nn.GraphCell(graphkernel.load(path))
    for n in (1, 4, 9, 33):
        x = rows(rng, n)
        np.testing.assert_array_equal(cell(Tensor(x)).asnumpy(), net(Tensor(x)).asnumpy())
    assert cell(Tensor(rows(rng, 0))).shape == (0, 5)
    assert cell.compile_count == 1
    with pytest.raises(InputError, match=r"must be float32\[N,12\].*got float32\[3, 11\]"):
        cell(Tensor(rng.standard_normal((3, 11)).astype(np.float32)))


def test_symbol_rules_travel_with_the_export(tmp_path, rng):
    context.set_context(enable_graph_kernel=True)
    net = Pairs()
    net.set_inputs(Tensor(shape=[Symbol(min=2, max=40), FEATURES], dtype=graphkernel.float32))
    path = graphkernel.export(net, Tensor(rows(rng, 8)), file_name=str(tmp_path / "pairs"))
    loaded = graphkernel.load(path)
    assert [(r.symbol, r.min, r.max, r.divisor) for r in loaded.size_rules] == \
        [("N", 2, 40, 1), ("N", 0, 0, 2)]
    cell = nn.GraphCell(loaded)
    for n in (2, 6, 40):
        x = rows(rng, n)
        np.testing.assert_array_equal(cell(Tensor(x)).asnumpy(), net(Tensor(x)).asnumpy())
    assert cell.compile_count == 1
    with pytest.raises(InputError, match=r"axis 0 is 42, but it must be at most 40 "
                                         r"\(Symbol\(max=40, min=2\)\)"):
        cell(Tensor(rows(rng, 42)))
    with pytest.raises(InputError, match=r"must be float32\[2\*N,12\]"):  # odd: no pairs
        cell(Tensor(rows(rng, 7)))
    with pytest.raises(InputError, match="must be at least 2"):
        cell.compiled(Tensor(rows(rng, 0)))  # the compiled graph checks the rules itself
    assert cell.compile_count == 1


def test_automatic_dynamic_shapes_export_the_shape_generic_graph(tmp_path, rng):
    context.set_context(enable_graph_kernel=True)
    net = mlp()
    for n in (3, 5):  # a second batch size: the next compile makes the batch symbolic
        net(Tensor(rows(rng, n)))
    path = graphkernel.export(net, Tensor(rows(rng, 7)), file_name=str(tmp_path / "auto"))
    cell = nn.GraphCell(graphkernel.load(path))
    assert str(cell._loaded.signature[0][1]) == "float32[N,12]"
    for n in (1, 7, 20):
        x = rows(rng, n)
        np.testing.assert_array_equal(cell(Tensor(x)).asnumpy(), net(Tensor(x)).asnumpy())
    assert cell.compile_count == 1


def test_a_fixed_batch_export_stays_fixed_and_keeps_version_1(tmp_path, rng):
    context.set_context(enable_graph_kernel=True)
    path = graphkernel.export(mlp(), Tensor(rows(rng, 4)), file_name=str(tmp_path / "fixed"))
    assert manifest(path)["version"] == 1  # readable by releases before dynamic sizes
    assert "size_rules" not in manifest(path)
    cell = nn.GraphCell(graphkernel.load(path))
    cell(Tensor(rows(rng, 4)))
    with pytest.raises(InputError, match=r"must be float32\[4,12\] \(the exported signature\), "
                                         r"got float32\[5, 12\]"):
        cell(Tensor(rows(rng, 5)))


def _onnx_mlp(rng):
    weight = rng.standard_normal((FEATURES, 3)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(
        nodes, "onnx_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.ravel())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, weight


def test_an_onnx_dim_param_survives_a_gkir_export(tmp_path, rng):
    model, weight = _onnx_mlp(rng)
    from_onnx = nn.GraphCell(graphkernel.load(model))
    path = graphkernel.export(from_onnx, file_name=str(tmp_path / "from_onnx"))
    cell = nn.GraphCell(graphkernel.load(path))
    assert str(cell._loaded.signature[0][1]) == "float32[N,12]"
    for n in (1, 6):
        x = rows(rng, n)
        np.testing.assert_allclose(cell(Tensor(x)).asnumpy(), np.maximum(x @ weight, 0),
                                   rtol=1e-5, atol=1e-6)
    assert cell.compile_count == 1


def test_declared_tensors_as_inputs_export_shape_generic(tmp_path, rng):
    """MindSpore's call: export(net, Tensor(shape=[None, 12], dtype=...)) declares the inputs
    as set_inputs does (it compiled a graph of size -1 before, and wrote an unloadable file)."""
    context.set_context(enable_graph_kernel=True)
    net = mlp()
    batch = Symbol(max=20)
    declared = Tensor(shape=[batch, FEATURES], dtype=graphkernel.float32)
    assert str(graphkernel.compile(net, declared).graph.inputs[0].type) == "float32[N,12]"
    path = graphkernel.export(net, declared, file_name=str(tmp_path / "declared"))
    cell = nn.GraphCell(graphkernel.load(path))
    for n in (2, 20):
        x = rows(rng, n)
        # The net compiled for 2 static rows runs its products on the row-vector kernel
        # (c_gemm_row.py), whose sums are in another order than BLAS's: float32 rounding apart.
        np.testing.assert_allclose(cell(Tensor(x)).asnumpy(), net(Tensor(x)).asnumpy(),
                                   rtol=1e-6, atol=1e-7)
    with pytest.raises(InputError, match=r"at most 20 \(Symbol\(max=20\)\)"):
        cell(Tensor(rows(rng, 21)))
    assert cell.compile_count == 1
    with pytest.raises(InputError, match="a declaration of an input.*call the cell on Tensors "
                                         "holding data"):
        net(declared)
