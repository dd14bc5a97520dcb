"""MindSpore primitives a ported script calls (issue 28), tested as MindSpore's graph-kernel tests
are written: a Net over the primitive, run with graph-kernel fusion on and off, each compared
with numpy; gradients where MindSpore has them."""
import numpy as np
import pytest

import graphkernel as gk
from graphkernel import Parameter, Tensor, context, nn, ops
from graphkernel.common import dtype as mstype
from graphkernel.errors import GradientError, InputError
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P


class Net(nn.Cell):
    def __init__(self, prim):
        super().__init__()
        self.prim = prim

    def construct(self, *xs):
        return self.prim(*xs)


def _both(net_factory, *arrays):
    """The outputs (numpy arrays) with fusion on, then off, after checking they agree."""
    outs = []
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        out = net_factory()(*(Tensor(a) for a in arrays))
        outs.append([o.asnumpy() for o in out] if isinstance(out, tuple) else [out.asnumpy()])
    for fused, plain in zip(*outs):
        assert fused.dtype == plain.dtype and fused.shape == plain.shape
        np.testing.assert_allclose(fused, plain, rtol=2e-6, atol=1e-6)
    return outs[0]


@pytest.mark.parametrize("prim,inputs", [
    (P.EqualCount(), 2), (P.SquareSumAll(), 2), (P.FloatStatus(), 1),
    (P.SigmoidCrossEntropyWithLogits(), 2), (P.SoftmaxCrossEntropyWithLogits(), 2)])
def test_fused_as_mindspores_graph_kernel_fuses_them(prim, inputs):
    x = Tensor(np.ones((4, 6), np.float32))
    exe = gk.compile(Net(prim), *[x] * inputs, options=CompileOptions(True))
    assert {k.backend for k in exe.kernels} == {"native"}  # generated C, no library step
    assert exe.kernels[0].op_names != [type(prim).__name__]  # expanded into basic ops


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_equal_count(dtype):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 3, (16, 40)).astype(dtype)
    y = rng.integers(0, 3, (16, 40)).astype(dtype)
    (count,) = _both(lambda: Net(P.EqualCount()), x, y)
    assert count.dtype == dtype and count.shape == (1,)
    assert count[0] == np.count_nonzero(x == y)


def test_square_sum_all():
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((2, 8, 33)).astype(np.float32)
    sx, sy = _both(lambda: Net(P.SquareSumAll()), x, y)
    assert sx.shape == sy.shape == ()
    np.testing.assert_allclose([sx, sy], [np.sum(x.astype(np.float64) ** 2),
                                          np.sum(y.astype(np.float64) ** 2)], rtol=1e-6)


def test_float_status():
    x = np.ones((4, 5), np.float32)
    (ok,) = _both(lambda: Net(P.FloatStatus()), x)
    assert ok.dtype == np.float32 and ok.tolist() == [0.0]
    for bad in (np.inf, -np.inf, np.nan):
        x[2, 3] = bad
        assert _both(lambda: Net(P.FloatStatus()), x)[0].tolist() == [1.0]


def _sigmoid_ce(x, y):
    x = x.astype(np.float64)
    return np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))


def test_sigmoid_cross_entropy_with_logits_and_its_gradient():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 10)) * 30).astype(np.float32)  # far into both tails
    y = rng.random((6, 10)).astype(np.float32)
    (loss,) = _both(lambda: Net(P.SigmoidCrossEntropyWithLogits()), x, y)
    np.testing.assert_allclose(loss, _sigmoid_ce(x, y), rtol=1e-5, atol=1e-6)
    net = Net(P.SigmoidCrossEntropyWithLogits())
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        dx, dy = gk.grad(lambda a, b: P.ReduceSum()(net(a, b)), (0, 1))(Tensor(x), Tensor(y))
        sig = 1 / (1 + np.exp(-x.astype(np.float64)))
        np.testing.assert_allclose(dx.asnumpy(), sig - y, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(dy.asnumpy(), 0)  # MindSpore's bprop: no label gradient


def test_softmax_cross_entropy_with_logits_and_its_gradient():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((5, 7)) * 10).astype(np.float32)
    labels = np.eye(7, dtype=np.float32)[rng.integers(0, 7, 5)]
    loss, backprop = _both(lambda: Net(P.SoftmaxCrossEntropyWithLogits()), x, labels)
    x64 = x.astype(np.float64)
    log_p = x64 - x64.max(1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
    np.testing.assert_allclose(loss, -(labels * log_p).sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(backprop, np.exp(log_p) - labels, rtol=1e-5, atol=1e-6)
    weights = np.arange(1, 6, dtype=np.float32)
    net = Net(P.SoftmaxCrossEntropyWithLogits())
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        dx = gk.grad(lambda a, b: P.ReduceSum()(net(a, b)[0] * Tensor(weights)))(Tensor(x),
                                                                       Tensor(labels))
        np.testing.assert_allclose(dx.asnumpy(), (np.exp(log_p) - labels) * weights[:, None],
                                   rtol=1e-5, atol=1e-6)
    with pytest.raises(GradientError, match="second output"):
        gk.grad(lambda a, b: P.ReduceSum()(net(a, b)[1]))(Tensor(x), Tensor(labels))


class Filled(nn.Cell):
    def __init__(self):
        super().__init__()
        self.ones, self.zeros, self.dtype = P.Ones(), P.Zeros(), P.DType()
        self.cast = P.Cast()

    def construct(self, x):
        ones = self.ones((2, 3), mstype.float32)
        zeros = self.zeros(3, self.dtype(x))
        return ones + zeros, self.cast(x, self.dtype(ones))


def test_ones_zeros_and_dtype():
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    total, cast = _both(Filled, x)
    assert total.dtype == np.float64 and cast.dtype == np.float32
    np.testing.assert_array_equal(total, np.ones((2, 3)))
    np.testing.assert_array_equal(cast, x)
    assert P.DType()(Tensor(x)) == mstype.float64
    assert P.Zeros()((2,), mstype.int32).asnumpy().tolist() == [0, 0]


@pytest.mark.parametrize("axis,keep_dims", [(0, False), (1, True), (-1, False)])
def test_median_is_the_lower_median_with_its_index(axis, keep_dims):
    rng = np.random.default_rng(5)
    x = rng.permutation(48).reshape(6, 8).astype(np.float32)
    value, index = _both(lambda: Net(P.Median(axis=axis, keep_dims=keep_dims)), x)
    n = x.shape[axis]
    want = np.sort(x, axis=axis).take((n - 1) // 2, axis=axis)
    want_index = np.argsort(x, axis=axis).take((n - 1) // 2, axis=axis)
    if keep_dims:
        want, want_index = np.expand_dims(want, axis), np.expand_dims(want_index, axis)
    assert index.dtype == np.int64
    np.testing.assert_array_equal(value, want)
    np.testing.assert_array_equal(index, want_index)
    (glob, _) = _both(lambda: Net(P.Median(global_median=True)), x)
    assert glob == np.sort(x, axis=None)[(x.size - 1) // 2]


class DependNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.p = Parameter(np.zeros(3, np.float32), "p")
        self.assign, self.depend = P.Assign(), P.Depend()

    def construct(self, x):
        written = self.assign(self.p, x * 2.0)
        return self.depend(x + 1.0, written)


def test_depend_returns_its_value_and_keeps_the_write():
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        net = DependNet()
        out = net(Tensor(np.arange(3, dtype=np.float32)))
        np.testing.assert_array_equal(out.asnumpy(), [1, 2, 3])
        np.testing.assert_array_equal(net.p.asnumpy(), [0, 2, 4])


def test_scalar_cast():
    cast = P.ScalarCast()
    assert cast(3, mstype.float32) == 3.0 and isinstance(cast(3, mstype.float32), float)
    assert cast(2.7, mstype.int32) == 2 and cast(0.0, mstype.bool_) is False
    assert cast(Tensor(np.array(1.5)), mstype.float64) == 1.5
    with pytest.raises(InputError, match="ScalarCast takes a number"):
        cast("1", mstype.float32)
    assert ops.scalar_cast(7, mstype.float64) == 7.0


def _lamb_reference(grad, v, m, var, beta1, beta2, eps, steps, use, wd):
    next_v = beta2 * v + (1 - beta2) * grad * grad
    next_m = beta1 * m + (1 - beta1) * grad
    update = (next_m / (1 - beta1 ** steps)) / (np.sqrt(next_v / (1 - beta2 ** steps)) + eps)
    return update + use * wd * var, next_v, next_m


class Lamb(nn.Cell):
    """One LAMB step as MindSpore's Lamb optimizer writes it with the two primitives."""

    def __init__(self, var, v, m):
        super().__init__()
        self.var, self.v, self.m = (Parameter(a.copy(), n) for a, n in
                                    ((var, "var"), (v, "v"), (m, "m")))
        self.optimizer = P.LambApplyOptimizerAssign()
        self.weight = P.LambApplyWeightAssign()
        self.sum, self.sqrt = P.ReduceSum(), P.Sqrt()

    def norm(self, x):
        return self.sqrt(self.sum(x * x))

    def construct(self, grad, beta1, beta2, eps, steps, use, wd, lr):
        update, _, _ = self.optimizer(grad, self.v, self.m, self.var, beta1, 1.0 - beta1,
                                      beta2, 1.0 - beta2, eps, steps, use, wd)
        return self.weight(self.norm(self.var), self.norm(update), lr, update, self.var)


def test_lamb_apply_optimizer_and_weight_assign():
    rng = np.random.default_rng(6)
    grad, v, m, var = (rng.standard_normal((4, 6)).astype(np.float32) for _ in range(4))
    v = np.abs(v)
    scalars = [np.array([s], np.float32) for s in (0.9, 0.999, 1e-6, 3.0, 1.0, 0.01, 0.1)]
    results = []
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        net = Lamb(var, v, m)
        out = net(Tensor(grad), *(Tensor(s) for s in scalars))
        results.append((out.asnumpy(), net.var.asnumpy().copy(), net.v.asnumpy().copy(),
                        net.m.asnumpy().copy()))
    b1, b2, eps, steps, use, wd, lr = (float(s[0]) for s in scalars)
    update, next_v, next_m = _lamb_reference(*(a.astype(np.float64) for a in (grad, v, m, var)),
                                             b1, b2, eps, steps, use, wd)
    ratio = np.linalg.norm(var) / np.linalg.norm(update)
    next_var = var - lr * ratio * update
    for out, new_var, new_v, new_m in results:
        np.testing.assert_allclose(out, next_var, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(new_var, next_var, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(new_v, next_v, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(new_m, next_m, rtol=1e-5, atol=1e-7)


# -- Call forms MindSpore code uses -----------------------------------------------------------

class CastTo(nn.Cell):
    def __init__(self):
        super().__init__()
        self.cast = P.Cast()

    def construct(self, x, dtype):
        return self.cast(x, dtype)


def test_a_dtype_as_a_construct_input():
    x = np.arange(4, dtype=np.float32)
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        net = CastTo()
        assert net(Tensor(x), mstype.float16).dtype == np.float16
        assert net(Tensor(x), mstype.int32).asnumpy().tolist() == [0, 1, 2, 3]  # recompiled


class ReadsData(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(np.full(3, 2.0, np.float32), "w")

    def construct(self, x):
        return x * self.w.data


def test_tensor_data_is_the_tensor():
    w = Parameter(np.ones(3, np.float32), "w")
    assert w.data is w and Tensor(np.ones(2)).data.shape == (2,)
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        out = ReadsData()(Tensor(np.arange(3, dtype=np.float32)))
        np.testing.assert_array_equal(out.asnumpy(), [0, 2, 4])


class NestedOut(nn.Cell):
    def construct(self, x):
        return x, (x + 1.0, (x * 2.0,))


def test_nested_tuples_in_a_return():
    x = np.arange(3, dtype=np.float32)
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        a, (b, (c,)) = NestedOut()(Tensor(x))
        np.testing.assert_array_equal(a.asnumpy(), x)
        np.testing.assert_array_equal(b.asnumpy(), x + 1)
        np.testing.assert_array_equal(c.asnumpy(), x * 2)


def test_bias_add_takes_mindspores_data_format():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    (out,) = _both(lambda: Net(P.BiasAdd(data_format="NCHW")), x, b)
    np.testing.assert_allclose(out, x + b[None, :, None, None], rtol=1e-6)
    with pytest.raises(InputError, match="data_format 'NHWC' is not supported"):
        Net(P.BiasAdd(data_format="NHWC"))(Tensor(x), Tensor(b))


class Momentum(nn.Cell):
    def __init__(self):
        super().__init__()
        self.apply = P.ApplyMomentum()
        self.w = Parameter(np.ones(3, np.float32), "w")
        self.accum = Parameter(np.zeros(3, np.float32), "accum")

    def construct(self, grad):
        updated = self.apply(self.w, self.accum, 0.1, grad, 0.9)
        return updated * 2.0  # MindSpore's ApplyMomentum returns the variable, a Tensor


def test_apply_momentum_returns_the_updated_variable():
    grad = np.array([1.0, 2.0, 3.0], np.float32)
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        net = Momentum()
        out = net(Tensor(grad))
        want = 1.0 - 0.1 * grad
        np.testing.assert_allclose(out.asnumpy(), 2 * want, rtol=1e-6)
        np.testing.assert_allclose(net.w.asnumpy(), want, rtol=1e-6)
        np.testing.assert_allclose(net.accum.asnumpy(), grad, rtol=1e-6)
    eager = P.ApplyMomentum()(Parameter(np.ones(3, np.float32), "v"),
                              Parameter(np.zeros(3, np.float32), "a"), 0.1, Tensor(grad), 0.9)
    np.testing.assert_allclose(eager.asnumpy(), 1.0 - 0.1 * grad, rtol=1e-6)
