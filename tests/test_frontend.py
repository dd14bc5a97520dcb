"""The MindSpore-shaped frontend: Tensor, operators in construct, scalar typing, broadcasting,
cells and layers, graph vs PyNative mode."""
import numpy as np
import pytest
from cells import product_atol

import graphkernel
from graphkernel import Parameter, Tensor, nn
from graphkernel.frontend import context
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P

ON = CompileOptions(enable_graph_kernel=True)


def test_tensor_basics():
    t = Tensor([[1.0, 2.0], [3.0, 4.0]])
    assert t.shape == (2, 2) and t.dtype == np.float32 and t.ndim == 2
    assert "Tensor(shape=[2, 2], dtype=float32" in repr(t)
    assert Tensor(np.arange(3)).dtype == np.int64
    assert Tensor([1, 2], dtype=graphkernel.float16).dtype == np.float16
    np.testing.assert_array_equal(t.asnumpy(), [[1, 2], [3, 4]])
    assert "[[1. 2.]" in f"{t}"
    with pytest.raises(graphkernel.errors.DTypeError, match="not supported"):
        Tensor(np.array(["a"]))


class Operators(nn.Cell):
    def construct(self, x, y):
        return -(x * 2.0 + y) / 4.0 - 1.0 + (2.0 * x) ** 2.0


@pytest.mark.parametrize("mode", [context.GRAPH_MODE, context.PYNATIVE_MODE])
def test_python_operators_route_to_primitives(mode, rng):
    context.set_context(mode=mode, enable_graph_kernel=True)
    x, y = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    out = Operators()(Tensor(x), Tensor(y))
    want = -(x * 2 + y) / 4 - 1 + (2 * x) ** 2
    np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-5)
    assert out.dtype == np.float32
    if mode == context.GRAPH_MODE:
        exe = graphkernel.compile(Operators(), x, y, options=ON)
        ops = exe.stages["6_validate"].nodes
        assert [n.op for n in ops] == ["Mul", "Add", "Neg", "RealDiv", "Sub", "Mul", "Pow", "Add"]
        assert len(exe.kernels) == 1


@pytest.mark.parametrize("dtype,scalar,expected", [
    ("float32", 2.0, "float32"), ("float16", 2.0, "float16"), ("float64", 2, "float64"),
    ("int32", 2, "int32"), ("int32", 2.5, "float32"), ("int64", True, "int64")])
def test_weak_scalar_typing(dtype, scalar, expected):
    x = np.ones((2, 2), dtype)
    for mode in (context.GRAPH_MODE, context.PYNATIVE_MODE):
        context.set_context(mode=mode)

        class Net(nn.Cell):
            def __init__(self):
                super().__init__()
                self.mul = P.Mul()

            def construct(self, x):
                return self.mul(x, scalar)
        assert Net()(Tensor(x)).dtype == np.dtype(expected)


def test_broadcasting_between_tensors(rng):
    a = rng.standard_normal((4, 1, 3)).astype(np.float32)
    b = rng.standard_normal((5, 1)).astype(np.float32)
    c = rng.standard_normal((3,)).astype(np.float64)

    class Net(nn.Cell):
        def construct(self, a, b, c):
            return (a + b) * c
    exe = graphkernel.compile(Net(), a, b, c, options=ON)
    out = exe.run_arrays(a, b, c)[0]
    assert out.shape == (4, 5, 3) and out.dtype == np.float64
    np.testing.assert_allclose(out, (a + b) * c, rtol=1e-12)
    assert len(exe.kernels) == 1


def test_graph_kernel_cell_with_weights_and_two_outputs(rng):
    class Inner(nn.GraphKernel):
        def __init__(self):
            super().__init__()
            self.scale = Parameter(np.full((3,), 2.0, np.float32), "scale")

        def construct(self, x):
            y = x * self.scale
            return y + 1.0, y - 1.0

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def construct(self, x):
            a, b = self.inner(x)
            return a * b
    x = rng.standard_normal((2, 3)).astype(np.float32)
    for fusion in (True, False):
        exe = graphkernel.compile(Net(), x, options=CompileOptions(enable_graph_kernel=fusion))
        np.testing.assert_allclose(exe.run_arrays(x)[0], (2 * x + 1) * (2 * x - 1), rtol=1e-6)
        assert len(exe.kernels) == (1 if fusion else 2)


def test_layers_and_sequential(rng):
    net = nn.SequentialCell([nn.Dense(8, 16, seed=3), nn.ReLU(), nn.Dense(16, 4, seed=4),
                             nn.Softmax()])
    x = rng.standard_normal((5, 8)).astype(np.float32)
    d1, d2 = net[0], net[2]
    h = np.maximum(x @ d1.weight.asnumpy().T + d1.bias.asnumpy(), 0)
    logits = h @ d2.weight.asnumpy().T + d2.bias.asnumpy()
    e = np.exp(logits - logits.max(1, keepdims=True))
    want = e / e.sum(1, keepdims=True)
    # The logits' rounding (both products, the first carried through the second's weights);
    # a softmax moves by at most twice its inputs' largest change.
    w2 = d2.weight.asnumpy().T
    logits_atol = product_atol(h, w2) + \
        product_atol(x, d1.weight.asnumpy().T) * np.abs(w2).sum(0).max()
    for mode in (context.PYNATIVE_MODE, context.GRAPH_MODE):
        context.set_context(mode=mode, enable_graph_kernel=True)
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), want, rtol=1e-5,
                                   atol=2 * logits_atol)
    names = [n for n, _ in net.parameters_and_names()]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias"]  # MindSpore's names
    assert nn.Dense(8, 16, seed=3).weight.asnumpy().tolist() == d1.weight.asnumpy().tolist()
