"""Small ONNX models for tests/test_onnx_*.py, built with onnx.helper (random weights)."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

helper_node = helper.make_node


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def model(nodes, inputs, outputs, initializers=(), opset=17, name="net"):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    made.ir_version = min(made.ir_version, 10)  # what the installed onnxruntime reads
    return made


def value(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def cnn(rng, batch="batch"):
    """Conv (pads, stride) + BatchNormalization + Relu + MaxPool (pads) + AveragePool + a
    PyTorch-style flatten (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) + Gemm +
    Softmax, on NCHW float32[batch, 3, 16, 16]."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["p"], ["a"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Shape", ["a"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["a", "flat_shape"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fc_b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1),
    ]
    inits = [
        init("w", rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3),
        init("b", rng.standard_normal(8).astype(np.float32)),
        init("scale", rng.uniform(0.5, 1.5, 8).astype(np.float32)),
        init("shift", rng.standard_normal(8).astype(np.float32)),
        init("mean", rng.standard_normal(8).astype(np.float32) * 0.1),
        init("var", rng.uniform(0.5, 2.0, 8).astype(np.float32)),
        init("zero", np.array(0, np.int64)), init("axes0", np.array([0], np.int64)),
        init("minus1", np.array([-1], np.int64)),
        init("fc", rng.standard_normal((10, 32)).astype(np.float32) * 0.2),
        init("fc_b", rng.standard_normal(10).astype(np.float32)),
    ]
    return model(nodes, [value("x", [batch, 3, 16, 16])], [value("y", [batch, 10])], inits,
                 name="cnn")


def mlp(rng, opset=17):
    """MatMul + Add + Relu + MatMul, float32[batch, 6] -> [batch, 4]."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    inits = [init("w1", rng.standard_normal((6, 12)).astype(np.float32)),
             init("b1", rng.standard_normal(12).astype(np.float32)),
             init("w2", rng.standard_normal((12, 4)).astype(np.float32))]
    return model(nodes, [value("x", ["batch", 6])], [value("y", ["batch", 4])], inits,
                 opset=opset, name="mlp")


def onnxruntime_outputs(made, feeds):
    import onnxruntime

    session = onnxruntime.InferenceSession(made.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


__all__ = ["cnn", "encoder_block", "helper_node", "init", "mlp", "model", "onnx",
           "onnxruntime_outputs", "value"]


def encoder_block(rng, seq=6, hidden=8, heads=2):
    """A transformer encoder block as exporters write it: LayerNormalization, Q/K/V MatMuls,
    head split through a shape subgraph (Shape -> Gather -> Unsqueeze -> Concat -> Reshape),
    Transpose, scaled scores, Softmax, Gelu MLP, residual Adds; float32[batch, seq, hidden]."""
    d = hidden // heads
    f32 = np.float32

    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(f32)

    nodes = [
        helper.make_node("LayerNormalization", ["x", "ln_g", "ln_b"], ["h"], axis=-1),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Gather", ["xs", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"]),
        helper.make_node("Concat", ["b1", "split_rest"], ["split_shape"], axis=0),
        helper.make_node("Concat", ["b1", "merge_rest"], ["merge_shape"], axis=0),
    ]
    for name in ("q", "k", "v"):
        nodes += [helper.make_node("MatMul", ["h", f"w{name}"], [f"{name}0"]),
                  helper.make_node("Add", [f"{name}0", f"b{name}"], [f"{name}1"]),
                  helper.make_node("Reshape", [f"{name}1", "split_shape"], [f"{name}2"]),
                  helper.make_node("Transpose", [f"{name}2"], [name],
                                   perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])]
    nodes += [
        helper.make_node("MatMul", ["q", "k"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["c0"]),
        helper.make_node("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["c1", "merge_shape"], ["c"]),
        helper.make_node("MatMul", ["c", "wo"], ["o"]),
        helper.make_node("Add", ["x", "o"], ["r"]),
        helper.make_node("MatMul", ["r", "w1"], ["m0"]),
        helper.make_node("Gelu", ["m0"], ["m1"]),
        helper.make_node("MatMul", ["m1", "w2"], ["m2"]),
        helper.make_node("Add", ["r", "m2"], ["y"]),
    ]
    inits = [init("ln_g", rng.uniform(0.5, 1.5, hidden).astype(f32)),
             init("ln_b", w(hidden)), init("zero", np.array(0, np.int64)),
             init("axes0", np.array([0], np.int64)),
             init("split_rest", np.array([seq, heads, d], np.int64)),
             init("merge_rest", np.array([seq, hidden], np.int64)),
             init("scale", np.array(1 / np.sqrt(d), f32)),
             init("wo", w(hidden, hidden)), init("w1", w(hidden, 4 * hidden)),
             init("w2", w(4 * hidden, hidden))]
    inits += [init(f"w{n}", w(hidden, hidden)) for n in "qkv"]
    inits += [init(f"b{n}", w(hidden)) for n in "qkv"]
    return model(nodes, [value("x", ["batch", seq, hidden])],
                 [value("y", ["batch", seq, hidden])], inits, opset=20, name="encoder")
