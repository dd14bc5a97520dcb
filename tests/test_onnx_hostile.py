"""Hostile and malformed ONNX files are refused by graphkernel.load with clear errors, before
anything is compiled or run: bad bytes, wrong types, huge declared shapes, external data
outside the model's folder, a cycle, a missing initializer."""
import os

import numpy as np
import pytest

if not os.environ.get("CI"):  # CI (.ci/run) installs the test extra: there a missing one fails
    pytest.importorskip("onnx", reason="pip install -e '.[test]' (onnx)")

import onnx  # noqa: E402
from onnx import TensorProto  # noqa: E402
from onnx_models import helper_node, init, mlp, model, value  # noqa: E402

import graphkernel  # noqa: E402
from graphkernel import Tensor, nn  # noqa: E402
from graphkernel.errors import FormatError, ResourceError, UnsupportedError  # noqa: E402


def test_truncated_bytes_are_refused(rng, tmp_path):
    data = mlp(rng).SerializeToString()
    for cut in (len(data) // 2, len(data) - 3, 5):
        with pytest.raises(FormatError, match="ONNX"):
            graphkernel.load(data[:cut])
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(FormatError, match="cut.onnx"):
        graphkernel.load(str(path))


def test_bytes_that_are_no_model_are_refused():
    for junk in (b"", b"\x00" * 64, os.urandom(256), b"hello world, not a model"):
        with pytest.raises(FormatError):
            graphkernel.load(junk)
    with pytest.raises(FormatError, match="takes a path"):
        graphkernel.load(12345)


def test_wrong_types_are_refused():
    nodes = [helper_node("Add", ["x", "k"], ["y"])]
    made = model(nodes, [value("x", [2])], [value("y", [2])],
                 [init("k", np.array([1, 2], np.int64))])  # float + int64: not valid ONNX
    with pytest.raises(FormatError, match="checker"):
        graphkernel.load(made)
    made = model([helper_node("Identity", ["x"], ["y"])], [value("x", [2], TensorProto.UINT8)],
                 [value("y", [2], TensorProto.UINT8)])
    with pytest.raises(UnsupportedError, match="uint8"):
        graphkernel.load(made)


def test_huge_declared_shapes_are_refused():
    made = model([helper_node("Relu", ["x"], ["y"])], [value("x", [1 << 20, 1 << 20])],
                 [value("y", [1 << 20, 1 << 20])])
    with pytest.raises((FormatError, ResourceError), match="x"):
        graphkernel.load(made)
    weight = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 30, 1 << 30],
                              raw_data=b"\x00" * 16)  # a huge shape over 16 bytes
    made = model([helper_node("Add", ["x", "w"], ["y"])], [value("x", [1])],
                 [value("y", [1 << 30, 1 << 30])], [weight])
    with pytest.raises(FormatError, match="'w'"):
        graphkernel.load(made)
    small = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4],
                             raw_data=b"\x00" * 12)  # fewer bytes than its shape needs
    made = model([helper_node("Add", ["x", "w"], ["y"])], [value("x", [4, 4])],
                 [value("y", [4, 4])], [small])
    with pytest.raises(FormatError, match="holds 12 bytes"):
        graphkernel.load(made)


def _external_model(location, length=16):
    weight = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4],
                              data_location=TensorProto.EXTERNAL)
    for key, text in (("location", location), ("offset", "0"), ("length", str(length))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, text
    return model([helper_node("Add", ["x", "w"], ["y"])], [value("x", [4])], [value("y", [4])],
                 [weight])


def test_external_data_loads_from_the_model_folder(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    weights = np.arange(4, dtype=np.float32)
    (folder / "weights.bin").write_bytes(weights.tobytes())
    (folder / "net.onnx").write_bytes(_external_model("weights.bin").SerializeToString())
    x = np.ones(4, np.float32)
    got = nn.GraphCell(graphkernel.load(str(folder / "net.onnx")))(Tensor(x)).asnumpy()
    np.testing.assert_array_equal(got, x + weights)


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin",
                                      "link.bin"])
def test_external_data_outside_the_folder_is_refused(tmp_path, location):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\x01" * 16)
    os.symlink(tmp_path / "secret.bin", folder / "link.bin")  # a link out of the folder
    (folder / "net.onnx").write_bytes(_external_model(location).SerializeToString())
    with pytest.raises(FormatError, match="outside the model's folder"):
        graphkernel.load(str(folder / "net.onnx"))


def test_external_data_past_the_end_of_its_file_is_refused(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\x00" * 8)
    (tmp_path / "net.onnx").write_bytes(_external_model("weights.bin").SerializeToString())
    with pytest.raises(FormatError, match="holds 8"):
        graphkernel.load(str(tmp_path / "net.onnx"))
    with pytest.raises(FormatError, match="load the model from its path"):
        graphkernel.load(_external_model("weights.bin").SerializeToString())


def test_a_cycle_is_refused():
    nodes = [helper_node("Add", ["x", "b"], ["a"]), helper_node("Relu", ["a"], ["b"])]
    made = model(nodes, [value("x", [2])], [value("b", [2])])
    with pytest.raises(FormatError, match="'b'|topologically"):
        graphkernel.load(made)


def test_a_missing_initializer_is_refused():
    made = model([helper_node("MatMul", ["x", "w"], ["y"])], [value("x", [2, 3])],
                 [value("y", [2, 4])])  # no initializer "w", no input "w"
    with pytest.raises(FormatError, match="'w'"):
        graphkernel.load(made)
