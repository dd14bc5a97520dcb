"""Squeeze-excite blocks (MobileNetV3's): the depthwise convolution keeps its bias and
activation as its conv block's epilogue, and the global mean reads the block's result, instead
of the mean taking the bias and activation into a reduction kernel that re-reads the
convolution's raw map and writes the activated map a second time (graph_kernel/cluster.py
`_conv_epilogue_kept`). Fused against unfused against numpy, float32/float64, batch 1 and 3;
the ONNX form torchvision's export writes against ONNX Runtime."""
import numpy as np
import pytest
from cells import OFF, ON, Fn

import graphkernel
from graphkernel.graph_kernel.reasons import FuseRule
from graphkernel.ir.opset import get_op
from graphkernel.ops import operations as P

HSWISH_OPS = {"Maximum", "Minimum", "Mul", "RealDiv"}


def conv_ref(x, w, **attrs):
    opdef = get_op("Conv2D")
    return opdef.reference(x, w, **{**opdef.attr_defaults, **attrs})


def hswish(x):
    return x * np.clip(x + 3, 0, 6) / 6


def hsigmoid(x):
    return np.clip(x + 3, 0, 6) / 6


class SqueezeExcite:
    """dw 3x3 + bias + hswish -> mean -> 1x1 + ReLU -> 1x1 + hard sigmoid -> scale -> 1x1
    projection (+ the block's input when `residual`), with an optional 1x1 expansion."""

    def __init__(self, rng, c, squeeze, out, expand=None, residual=False, dtype="float32"):
        inner = expand if expand is not None else c
        self.expand, self.residual, self.inner = expand, residual, inner

        def arr(*shape):
            return (rng.standard_normal(shape) * 0.5).astype(dtype)

        self.weights = [arr(inner, c, 1, 1), arr(inner, 1, 1)] if expand is not None else []
        self.weights += [arr(inner, 1, 3, 3), arr(inner, 1, 1), arr(squeeze, inner, 1, 1),
                         arr(squeeze, 1, 1), arr(inner, squeeze, 1, 1), arr(inner, 1, 1),
                         arr(out, inner, 1, 1), arr(out, 1, 1)]
        self.dw = P.Conv2D(inner, 3, pad_mode="same", group=inner)
        self.fc1, self.fc2 = P.Conv2D(squeeze, 1), P.Conv2D(inner, 1)
        self.proj = P.Conv2D(out, 1)
        self.exp = P.Conv2D(inner, 1) if expand is not None else None

    def fn(self, x, *w):
        ws = list(w)
        y = x
        if self.exp is not None:
            y = P.HSwish()(self.exp(y, ws.pop(0)) + ws.pop(0))
        y = P.HSwish()(self.dw(y, ws.pop(0)) + ws.pop(0))
        s = P.ReduceMean(keep_dims=True)(y, (2, 3))
        s = P.ReLU()(self.fc1(s, ws.pop(0)) + ws.pop(0))
        s = P.ReLU6()(self.fc2(s, ws.pop(0)) + ws.pop(0) + 3.0) / 6.0
        out = self.proj(y * s, ws.pop(0)) + ws.pop(0)
        return out + x if self.residual else out

    def reference(self, x):
        ws = [w.astype(np.float64) for w in self.weights]
        y = x.astype(np.float64)
        if self.expand is not None:
            y = hswish(conv_ref(y, ws.pop(0), out_channel=self.inner, kernel_size=1) + ws.pop(0))
        y = hswish(conv_ref(y, ws.pop(0), out_channel=self.inner, kernel_size=3,
                            pad_mode="same", group=self.inner) + ws.pop(0))
        s = y.mean(axis=(2, 3), keepdims=True)
        w1 = ws.pop(0)
        s = np.maximum(conv_ref(s, w1, out_channel=w1.shape[0], kernel_size=1) + ws.pop(0), 0)
        s = hsigmoid(conv_ref(s, ws.pop(0), out_channel=self.inner, kernel_size=1) + ws.pop(0))
        wp = ws.pop(0)
        out = conv_ref(y * s, wp, out_channel=wp.shape[0], kernel_size=1) + ws.pop(0)
        return out + x if self.residual else out


def compile_block(block, x, options):
    return graphkernel.compile(Fn(block.fn), x, *block.weights, options=options)


def depthwise(exe):
    return next(n for n in exe.graph.nodes if n.op == "Conv2D" and n.attrs.get("group", 1) > 1)


def check_structure(exe):
    """The depthwise convolution is a block with its bias and hswish; the mean is a kernel of
    its own that only reduces; the cost rule that kept them apart is in the fusion report."""
    dw = depthwise(exe)
    assert dw.notes["conv_block"].startswith("one kernel with"), dw.notes
    native = [list(k.op_names) for k in exe.kernels if k.backend == "native"]
    dw_kernels = [ops for ops in native if ops[0] == "Conv2D" and HSWISH_OPS <= set(ops)]
    assert dw_kernels, native
    means = [ops for ops in native if "ReduceSum" in ops]
    assert len(means) == 1 and not HSWISH_OPS - {"Mul"} & set(means[0]), native
    kept = [r for r in exe.reasons if r.rule is FuseRule.COST and "block epilogue" in r.detail]
    assert kept and dw.name in kept[0].detail, [str(r) for r in exe.reasons]
    return native


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch", [1, 3])
def test_squeeze_excite_keeps_the_depthwise_block(dtype, batch, rng):
    tol = 1e-4 if dtype == "float32" else 1e-11
    block = SqueezeExcite(rng, c=12, squeeze=4, out=8, dtype=dtype)
    x = rng.standard_normal((batch, 12, 9, 7)).astype(dtype)
    exe = compile_block(block, x, ON)
    native = check_structure(exe)
    # dw block, mean, fc1 block, fc2, gate (hard sigmoid x map), projection, its bias (a
    # lone Add is no fused group, so no block epilogue)
    assert len(exe.kernels) == 7, native
    want = block.reference(x)
    got = exe.run_arrays(x, *block.weights)[0]
    off = compile_block(block, x, OFF).run_arrays(x, *block.weights)[0]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(off, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch", [1, 3])
def test_mobilenetv3_block_with_expansion_and_residual(dtype, batch, rng):
    tol = 1e-4 if dtype == "float32" else 1e-11
    block = SqueezeExcite(rng, c=8, squeeze=6, out=8, expand=24, residual=True, dtype=dtype)
    x = rng.standard_normal((batch, 8, 10, 10)).astype(dtype)
    exe = compile_block(block, x, ON)
    native = check_structure(exe)
    # expansion block, dw block, mean, fc1 block, fc2, gate, projection + residual block
    assert len(exe.kernels) == 7, native
    want = block.reference(x)
    got = exe.run_arrays(x, *block.weights)[0]
    off = compile_block(block, x, OFF).run_arrays(x, *block.weights)[0]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(off, want, rtol=tol, atol=tol)


def test_a_conv_activation_read_only_by_its_mean_still_fuses_into_the_reduction(rng):
    """Where the activated map has no other reader, the mean taking the bias and activation
    saves writing the map at all: the merge goes ahead (the classifier's final pool)."""
    x = rng.standard_normal((2, 6, 5, 5)).astype(np.float32)
    w = rng.standard_normal((10, 6, 1, 1)).astype(np.float32)
    b = rng.standard_normal((10, 1, 1)).astype(np.float32)
    conv = P.Conv2D(10, 1)

    def fn(a, k, c):
        return P.ReduceMean(keep_dims=True)(P.HSwish()(conv(a, k) + c), (2, 3))

    exe = graphkernel.compile(Fn(fn), x, w, b, options=ON)
    native = [list(k.op_names) for k in exe.kernels if k.backend == "native"]
    assert native == [["Conv2D"], native[1]] and "ReduceSum" in native[1] and \
        "Maximum" in native[1], native
    want = hswish(conv_ref(x.astype(np.float64), w.astype(np.float64), out_channel=10,
                           kernel_size=1) + b).mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(exe.run_arrays(x, w, b)[0], want, rtol=1e-5, atol=1e-5)


def onnx_squeeze_excite(rng, c=16, squeeze=8, out=12):
    """torchvision's MobileNetV3 SE block as its ONNX export writes it: depthwise Conv (bias)
    + HardSwish, GlobalAveragePool, Conv + Relu, Conv + HardSigmoid, Mul, projection Conv."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    def arr(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32),
                                       name)

    make = helper.make_node
    nodes = [make("Conv", ["x", "dw", "dw_b"], ["d"], group=c, kernel_shape=[5, 5],
                  pads=[2, 2, 2, 2]),
             make("HardSwish", ["d"], ["a"]),
             make("GlobalAveragePool", ["a"], ["s"]),
             make("Conv", ["s", "fc1", "fc1_b"], ["s1"]),
             make("Relu", ["s1"], ["r"]),
             make("Conv", ["r", "fc2", "fc2_b"], ["s2"]),
             make("HardSigmoid", ["s2"], ["g"], alpha=1 / 6, beta=0.5),
             make("Mul", ["g", "a"], ["m"]),
             make("Conv", ["m", "proj", "proj_b"], ["y"])]
    inits = [arr("dw", c, 1, 5, 5), arr("dw_b", c), arr("fc1", squeeze, c, 1, 1),
             arr("fc1_b", squeeze), arr("fc2", c, squeeze, 1, 1), arr("fc2_b", c),
             arr("proj", out, c, 1, 1), arr("proj_b", out)]
    graph = helper.make_graph(
        nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", out, 7, 7])], inits)
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    made.ir_version = min(made.ir_version, 10)
    onnx.checker.check_model(made)
    return made


@pytest.mark.parametrize("batch", [1, 3])
def test_an_onnx_squeeze_excite_block_matches_onnxruntime(batch, rng):
    rt = pytest.importorskip("onnxruntime")
    from graphkernel import Tensor, context, nn

    made = onnx_squeeze_excite(rng)
    x = rng.standard_normal((batch, 16, 7, 7)).astype(np.float32)
    sess = rt.InferenceSession(made.SerializeToString(), providers=["CPUExecutionProvider"])
    want, = sess.run(None, {"x": x})
    outs = []
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)  # conftest resets the context
        cell = nn.GraphCell(graphkernel.load(made))
        outs.append(cell(Tensor(x)).asnumpy())
        if fusion:
            check_structure(cell.compiled)
        np.testing.assert_allclose(outs[-1], want, rtol=1e-4, atol=1e-5)
