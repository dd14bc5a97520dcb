"""The MindSpore surface MindCV's model files stand on (issue 28, its blockers): the
`common.initializer` module with its classes and lazily drawn tensors, `graphkernel.numpy`
(mindspore.numpy), Conv2d's and Dense's attributes, nn.HSigmoid, nn.GroupNorm, ops.constexpr
and the `nn.cell` module path. Written the way MindSpore's own tests are: a small net per API,
compared with numpy, graph mode with fusion on and off (and op by op where it differs)."""
from __future__ import annotations

import importlib
import math
from typing import Any

import numpy as np
import pytest
from test_autodiff import A, check_gradients

import graphkernel as gk
from graphkernel import Parameter, Tensor, nn, ops
from graphkernel.errors import GraphModeError, InputError, ShapeError, UnsupportedError
from graphkernel.frontend import context
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)


def run_both(net: nn.Cell, *arrays: np.ndarray) -> list[np.ndarray]:
    """The net's outputs fused, after checking the unfused ones agree."""
    outs = []
    for options in (ON, OFF):
        outs.append(gk.compile(net, *arrays, options=options).run_arrays(*arrays))
    for fused, unfused in zip(*outs):
        np.testing.assert_allclose(fused, unfused, rtol=1e-5, atol=1e-6)
    return outs[0]  # type: ignore[no-any-return]


@pytest.fixture(params=[False, True], ids=["unfused", "fused"])
def fusion(request: Any) -> Any:
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=request.param)
    yield request.param
    context.set_context(enable_graph_kernel=False)


# -- common.initializer ---------------------------------------------------------------------
def test_initializer_imports_as_a_module_the_way_mindcv_does():
    init = importlib.import_module("graphkernel.common.initializer")
    import graphkernel.common.initializer as as_written  # MindCV: `import ... as init`
    assert as_written is init
    for name in ("HeNormal", "HeUniform", "Normal", "TruncatedNormal", "XavierUniform",
                 "XavierNormal", "Constant", "Zero", "One", "Uniform", "initializer"):
        assert callable(getattr(as_written, name)), name
    from graphkernel.common.initializer import TruncatedNormal, XavierUniform, initializer
    assert isinstance(initializer(XavierUniform(), (2, 3)), Tensor)
    assert isinstance(initializer(TruncatedNormal(0.02), (2, 3)), Tensor)


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    field = math.prod(shape[2:])
    return shape[1] * field, shape[0] * field


def test_initializer_classes_follow_mindspore_formulas():
    import graphkernel.common.initializer as init
    gk.set_seed(3)
    shape = (64, 32, 3, 3)
    fan_in, fan_out = _fans(shape)

    def values(initialiser: Any) -> np.ndarray:
        return init.initializer(initialiser, shape, gk.float32).asnumpy().astype(np.float64)

    # Uniform ones: inside their bound and reaching near it; normal ones: their std.
    uniform_bounds = {
        init.Uniform(): 0.07, init.Uniform(scale=0.5): 0.5,
        init.XavierUniform(): math.sqrt(6 / (fan_in + fan_out)),
        init.XavierUniform(gain=2.0): 2 * math.sqrt(6 / (fan_in + fan_out)),
        init.HeUniform(): math.sqrt(2) * math.sqrt(3 / fan_in),
        init.HeUniform(negative_slope=math.sqrt(5)): math.sqrt(2 / 6) * math.sqrt(3 / fan_in),
        init.HeUniform(mode="fan_out", nonlinearity="relu"): math.sqrt(2) * math.sqrt(
            3 / fan_out),
    }
    for initialiser, bound in uniform_bounds.items():
        v = values(initialiser)
        assert np.abs(v).max() <= bound * (1 + 1e-6) and np.abs(v).max() > 0.99 * bound, \
            initialiser
        assert abs(v.std() - bound / math.sqrt(3)) < 0.02 * bound, initialiser
    stds = {
        init.Normal(): 0.01, init.Normal(sigma=0.2, mean=1.0): 0.2,
        init.XavierNormal(): math.sqrt(2 / (fan_in + fan_out)),
        init.HeNormal(): math.sqrt(2 / fan_in),
        init.HeNormal(mode="fan_out", nonlinearity="relu"): math.sqrt(2 / fan_out),
    }
    for initialiser, std in stds.items():
        v = values(initialiser)
        assert abs(v.std() - std) < 0.02 * std, initialiser
    assert abs(values(init.Normal(sigma=0.2, mean=1.0)).mean() - 1.0) < 0.01
    truncated = values(init.TruncatedNormal(sigma=0.02))
    assert np.abs(truncated).max() <= 0.04 + 1e-7 and 0.015 < truncated.std() < 0.02
    np.testing.assert_array_equal(values(init.Constant(0.5)), 0.5)
    np.testing.assert_array_equal(values(init.Zero()), 0)
    np.testing.assert_array_equal(values(init.One()), 1)
    # An Initializer also fills a numpy array in place, as MindSpore's do.
    array = np.zeros((2, 2))
    init.Constant(3)(array)
    np.testing.assert_array_equal(array, 3)
    # A user's initialiser written MindSpore's way, filling an array in _initialize.
    class Arange(init.Initializer):
        def _initialize(self, arr):
            arr[...] = np.arange(arr.size).reshape(arr.shape)

    np.testing.assert_array_equal(init.initializer(Arange(), (2, 3)).asnumpy(),
                                  np.arange(6).reshape(2, 3))
    # The names MindSpore takes give the same classes.
    gk.set_seed(9)
    by_name = init.initializer("he_normal", (8, 4)).asnumpy()
    gk.set_seed(9)
    np.testing.assert_array_equal(init.initializer(init.HeNormal(), (8, 4)).asnumpy(), by_name)


def test_initializer_returns_a_lazily_drawn_tensor():
    import graphkernel.common.initializer as init
    gk.set_seed(1)
    lazy = init.initializer(init.Normal(sigma=1.0), [2, 3], gk.float16)
    assert lazy.shape == (2, 3) and lazy.dtype == np.float16  # known before drawing
    gk.set_seed(7)  # the values are drawn when first read, from the generator as it is then
    drawn = lazy.init_data()
    assert isinstance(drawn, Tensor) and drawn.dtype == np.float16
    gk.set_seed(7)
    np.testing.assert_array_equal(drawn.asnumpy(),
                                  init.initializer(init.Normal(sigma=1.0), (2, 3),
                                                   gk.float16).asnumpy())
    np.testing.assert_array_equal(lazy.asnumpy(), drawn.asnumpy())  # drawn once

    # Accepted wherever a tensor was: a Parameter, set_data, a layer's weight_init.
    weight = Parameter(init.initializer("ones", (2, 3)), "w")
    np.testing.assert_array_equal(weight.asnumpy(), np.ones((2, 3)))
    weight.set_data(init.initializer(init.Constant(2.5), weight.shape, weight.dtype))
    np.testing.assert_array_equal(weight.asnumpy(), np.full((2, 3), 2.5))
    dense = nn.Dense(3, 2, weight_init=init.initializer(init.Zero(), (2, 3)),
                     bias_init=init.One())
    out = dense(Tensor(np.ones((1, 3), np.float32))).asnumpy()
    np.testing.assert_array_equal(out, [[1, 1]])
    assert init.initializer(5, (2,), gk.int32).asnumpy().tolist() == [5, 5]

    with pytest.raises(InputError, match="unknown initializer 'glorot'"):
        init.initializer("glorot", (2, 2))
    with pytest.raises(InputError, match="shape"):
        init.initializer(init.Normal(), (2, -1))
    with pytest.raises(InputError, match="mode must be 'fan_in' or 'fan_out'"):
        init.HeNormal(mode="fan_avg")
    with pytest.raises(InputError, match=r"initial value has shape \(3,\)"):
        init.initializer(np.ones(3), (2,))


def test_conv2d_dense_and_norm_attributes_and_a_mindcv_style_init_loop():
    import graphkernel.common.initializer as init
    conv = nn.Conv2d(4, 8, (3, 1), stride=2, pad_mode="pad", padding=1, group=2)
    assert conv.bias is None and conv.has_bias is False
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.pad_mode,
            conv.padding, conv.dilation, conv.group) == (4, 8, (3, 1), (2, 2), "pad", 1, (1, 1), 2)
    assert conv.weight.shape == (8, 2, 3, 1)
    assert nn.Conv2d(2, 2, 1, has_bias=True).bias.shape == (2,)
    dense = nn.Dense(3, 5, has_bias=False)
    assert dense.bias is None and (dense.in_channels, dense.out_channels) == (3, 5)
    norm = nn.LayerNorm((6,), epsilon=1e-6)
    assert norm.normalized_shape == (6,) and norm.epsilon == 1e-6

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, has_bias=False)
            self.bn = nn.BatchNorm2d(4)
            self.fc = nn.Dense(4, 2)

        def construct(self, x):
            return self.fc(P.ReduceMean()(self.bn(self.conv(x)), (2, 3)))

    net = Net()
    for _, cell in net.cells_and_names():  # the loop MindCV's models run
        if isinstance(cell, nn.Conv2d):
            n = cell.kernel_size[0] * cell.kernel_size[1] * cell.out_channels
            cell.weight.set_data(init.initializer(init.Normal(sigma=math.sqrt(2.0 / n)),
                                                  cell.weight.shape, cell.weight.dtype))
            if cell.bias is not None:
                cell.bias.set_data(init.initializer("zeros", cell.bias.shape, cell.bias.dtype))
        elif isinstance(cell, nn.BatchNorm2d):
            cell.gamma.set_data(init.initializer("ones", cell.gamma.shape, cell.gamma.dtype))
        elif isinstance(cell, nn.Dense):
            cell.weight.set_data(init.initializer(init.TruncatedNormal(sigma=0.02),
                                                  cell.weight.shape, cell.weight.dtype))
            cell.bias.set_data(init.initializer(init.Zero(), cell.bias.shape, cell.bias.dtype))
    assert not net.fc.bias.asnumpy().any() and np.abs(net.fc.weight.asnumpy()).max() <= 0.04
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 5)).astype(np.float32)
    assert run_both(net, x)[0].shape == (2, 2)


def test_nn_cell_module_path():
    from graphkernel.nn.cell import Cell
    assert Cell is nn.Cell


# -- nn.HSigmoid, nn.GroupNorm ----------------------------------------------------------------
def test_hsigmoid_against_numpy_and_its_gradient(fusion):
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.hsigmoid = nn.HSigmoid()

        def construct(self, x):
            return self.hsigmoid(x)

    x = np.linspace(-5, 5, 24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_allclose(Net()(Tensor(x)).asnumpy(), np.clip(x + 3, 0, 6) / 6,
                               rtol=1e-6, atol=1e-7)
    assert isinstance(nn.get_activation("hsigmoid"), nn.HSigmoid)
    check_gradients(lambda t: nn.HSigmoid()(t), [A(np.random.default_rng(2), (3, 5)) * 2])


def _group_norm(x: np.ndarray, groups: int, gamma: np.ndarray, beta: np.ndarray,
                eps: float) -> np.ndarray:
    n, c = x.shape[:2]
    g = x.astype(np.float64).reshape(n, groups, -1)
    normed = (g - g.mean(2, keepdims=True)) / np.sqrt(g.var(2, keepdims=True) + eps)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return normed.reshape(x.shape) * gamma.reshape(shape) + beta.reshape(shape)


@pytest.mark.parametrize("shape, groups", [((2, 6, 4, 5), 3), ((3, 4, 7), 4), ((2, 4), 1)])
def test_group_norm_against_numpy(shape, groups):
    rng = np.random.default_rng(4)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.norm = nn.GroupNorm(groups, shape[1], eps=1e-4)

        def construct(self, x):
            return self.norm(x)

    net = Net()
    net.norm.gamma.set_data(rng.uniform(0.5, 1.5, shape[1]))
    net.norm.beta.set_data(rng.standard_normal(shape[1]))
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    want = _group_norm(x, groups, net.norm.gamma.asnumpy(), net.norm.beta.asnumpy(), 1e-4)
    np.testing.assert_allclose(run_both(net, x)[0], want, rtol=1e-5, atol=2e-5)
    context.set_context(mode=context.PYNATIVE_MODE)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), want, rtol=1e-5, atol=2e-5)


def test_group_norm_gradient(fusion):
    rng = np.random.default_rng(6)
    norm = nn.GroupNorm(2, 4, dtype=np.float64)

    # gamma and beta reach the gradient as the cell's own weights: the input's gradient here,
    # the weights' through a training step below.
    check_gradients(lambda x: norm(x), [A(rng, (2, 4, 3))])

    class Loss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.norm = nn.GroupNorm(2, 4, dtype=np.float64)

        def construct(self, x):
            return P.ReduceSum()(self.norm(x) * Tensor(np.arange(24.0).reshape(2, 4, 3)))

    net = Loss()
    x = A(rng, (2, 4, 3))
    grads = gk.grad(net, None, net.trainable_params())(Tensor(x))
    normed = _group_norm(x, 2, np.ones(4), np.zeros(4), 1e-5)
    weights = np.arange(24.0).reshape(2, 4, 3)
    np.testing.assert_allclose(grads[0].asnumpy(), (normed * weights).sum((0, 2)), rtol=1e-9)
    np.testing.assert_allclose(grads[1].asnumpy(), weights.sum((0, 2)), rtol=1e-9)


def test_group_norm_errors():
    with pytest.raises(ShapeError, match="must be positive and divide num_channels=6"):
        nn.GroupNorm(4, 6)
    with pytest.raises(ShapeError, match=r"expects input \(N, 4, ...\)"):
        nn.GroupNorm(2, 4)(Tensor(np.ones((2, 3, 5), np.float32)))


# -- ops.constexpr --------------------------------------------------------------------------
def test_constexpr_computes_constants_while_compiling(fusion):
    @ops.constexpr
    def window_shape(shape, size):
        return (shape[0] * (shape[1] // size), size)

    class Net(nn.Cell):
        def construct(self, x):
            return P.Reshape()(x, window_shape(x.shape, 2)) * 2.0

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(Net()(Tensor(x)).asnumpy(), x.reshape(6, 2) * 2)

    @ops.constexpr(reuse_result=False)
    def twice(value):
        return value * 2

    class Bad(nn.Cell):
        def construct(self, x):
            return twice(x)

    with pytest.raises(GraphModeError, match="@constexpr function 'twice' got a tensor"):
        Bad()(Tensor(x))


# -- graphkernel.numpy (mindspore.numpy) ----------------------------------------------------
class Fn(nn.Cell):
    """A net applying one mindspore.numpy function to its inputs."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def construct(self, *xs: Any) -> Any:
        return self.fn(*xs)


def test_numpy_imports_as_mindspore_code_does():
    from graphkernel import numpy as mnp
    from graphkernel.numpy import ones, roll
    assert mnp.roll is roll and gk.numpy.ones is ones
    with pytest.raises(UnsupportedError, match="graphkernel.numpy .mindspore.numpy. has no "
                                               "'fft' yet; it has arange"):
        mnp.fft  # noqa: B018


@pytest.mark.parametrize("shift, axis", [(1, 1), ((2, -1), (1, 2)), (-3, None), (5, 0),
                                         ((1, 1), 1), (0, 2)])
def test_numpy_roll(shift, axis):
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    np.testing.assert_array_equal(run_both(Fn(lambda t: gk.numpy.roll(t, shift, axis)), x)[0],
                                  np.roll(x, shift, axis))


def test_numpy_roll_gradient(fusion):
    rng = np.random.default_rng(8)
    check_gradients(lambda t: gk.numpy.roll(t, (1, -2), (0, 1)), [A(rng, (3, 4))])


def test_numpy_creation_functions():
    from graphkernel import numpy as mnp
    cases = [(mnp.ones((2, 3)), np.ones((2, 3), np.float32)),
             (mnp.zeros(4, gk.int32), np.zeros(4, np.int32)),
             (mnp.full((2,), 1.5), np.full(2, 1.5, np.float32)),
             (mnp.arange(5), np.arange(5, dtype=np.int32)),
             (mnp.arange(1, 2, 0.25), np.arange(1, 2, 0.25, dtype=np.float32)),
             (mnp.arange(6, dtype=gk.float32), np.arange(6, dtype=np.float32)),
             (mnp.linspace(0, 1, 5), np.linspace(0, 1, 5, dtype=np.float32)),
             (mnp.linspace(0, 1, 4, endpoint=False), np.linspace(0, 1, 4, False,
                                                                  dtype=np.float32))]
    for got, want in cases:
        assert isinstance(got, Tensor) and got.dtype == want.dtype, (got, want)
        np.testing.assert_array_equal(got.asnumpy(), want)
    with pytest.raises(InputError, match="step must not be zero"):
        mnp.arange(0, 3, 0)

    class DropPathLike(nn.Cell):  # MindCV's DropPath: ones of a shape read in construct
        def construct(self, x):
            return x * mnp.ones((x.shape[0],) + (1,) * (x.ndim - 1))

    x = np.ones((2, 3, 4), np.float32)
    np.testing.assert_array_equal(run_both(DropPathLike(), x)[0], x)


def test_numpy_joining_splitting_and_elementwise():
    from graphkernel import numpy as mnp
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 6)).astype(np.float32)
    b = rng.standard_normal((2, 6)).astype(np.float32)
    cases = [
        (lambda x, y: mnp.concatenate((x, y), 1), np.concatenate((a, b), 1)),
        (lambda x, y: mnp.concatenate((x, y), None), np.concatenate((a, b), None)),
        (lambda x, y: mnp.stack([x, y], -1), np.stack([a, b], -1)),
        (lambda x, y: mnp.where(x > y, x, 0.0), np.where(a > b, a, 0)),
        (lambda x, y: mnp.clip(x, -0.5, y), np.clip(a, -0.5, b)),
        (lambda x, y: mnp.clip(x, None, 0.25), np.clip(a, None, 0.25)),
        (lambda x, y: mnp.tile(x, (2, 1, 2)), np.tile(a, (2, 1, 2))),
        (lambda x, y: mnp.tile(x, 3), np.tile(a, 3)),
        (lambda x, y: mnp.tensordot(x, y, ([1], [1])), np.tensordot(a, b, ([1], [1]))),
        (lambda x, y: mnp.tensordot(x, mnp.stack([y, x * y], -1), 2),
         np.tensordot(a, np.stack([b, a * b], -1), 2)),
        (lambda x, y: mnp.split(x, 3, 1), np.split(a, 3, 1)),
        (lambda x, y: mnp.split(x, [1, 4, -1], 1), np.split(a, [1, 4, -1], 1)),
        (lambda x, y: mnp.split(x, [4, 2], 1), np.split(a, [4, 2], 1)),
    ]
    for fn, want in cases:
        got = run_both(Fn(fn), a, b)
        want = want if isinstance(want, list) else [want]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeError, match="4 sections do not divide axis 1 of size 6"):
        mnp.split(Tensor(a), 4, 1)
    with pytest.raises(UnsupportedError, match="where.condition. alone"):
        mnp.where(Tensor(a))
    with pytest.raises(ShapeError, match="axis 2 is out of range"):
        mnp.roll(Tensor(a), 1, 2)


# -- the call forms MindCV's ViT, ConvNeXt and Swin use -------------------------------------
def test_tensor_reshape_astype_and_mean(fusion):
    class Net(nn.Cell):
        def construct(self, x):
            pooled = x.mean([-2, -1])  # ConvNeXt's global pooling
            tokens = x.reshape(x.shape[0], -1).astype(gk.float16)
            return pooled, tokens.reshape((2, 3, -1)), x.mean(), x.mean(1, keep_dims=True)

    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5) / 7
    pooled, tokens, everything, kept = Net()(Tensor(x))
    np.testing.assert_allclose(pooled.asnumpy(), x.mean((-2, -1)), rtol=1e-6)
    assert tokens.dtype == np.float16
    np.testing.assert_array_equal(tokens.asnumpy(), x.reshape(2, 3, -1).astype(np.float16))
    np.testing.assert_allclose(everything.asnumpy(), x.mean(), rtol=1e-6)
    np.testing.assert_allclose(kept.asnumpy(), x.mean(1, keepdims=True), rtol=1e-6)
    weight = Parameter(np.zeros((4, 6), np.float32), "w")  # ViT's init: set_data of a reshape
    weight.set_data(Tensor(np.arange(24.0)).reshape(weight.shape))
    assert weight.asnumpy()[3, 5] == 23


def test_cells_take_keyword_inputs(fusion):
    class Attention(nn.Cell):
        def construct(self, x, scale=2.0, mask=None):
            out = x * scale
            return out if mask is None else out + mask

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.attn = Attention()

        def construct(self, x, mask):
            return self.attn(x, mask=mask)  # Swin's call

    x, mask = np.ones((2, 3), np.float32), np.full((2, 3), 0.5, np.float32)
    np.testing.assert_array_equal(Net()(Tensor(x), Tensor(mask)).asnumpy(), x * 2 + 0.5)
    np.testing.assert_array_equal(Attention()(Tensor(x), mask=Tensor(mask)).asnumpy(),
                                  x * 2 + 0.5)
    with pytest.raises(InputError, match="Attention.construct: got an unexpected keyword "
                                         "argument 'bias'"):
        Attention()(Tensor(x), bias=Tensor(mask))


def test_drop_path_mask_of_ones_is_drawn_on_every_call(fusion):
    """MindCV's DropPath: `dropout(ones(shape))` in construct, a random op on a constant. It is
    a node of the graph, drawing a new mask on every step, not a draw made once while tracing
    and frozen into the graph."""
    from graphkernel.numpy import ones

    class DropPath(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dropout = nn.Dropout(p=0.5)

        def construct(self, x):
            return x * self.dropout(ones((x.shape[0],) + (1,) * (x.ndim - 1)))

    net = DropPath()
    net.set_train(True)
    x = np.ones((64, 3), np.float32)
    masks = [net(Tensor(x)).asnumpy() for _ in range(2)]
    for mask in masks:
        assert set(np.unique(mask)) <= {0.0, 2.0} and (mask == mask[:, :1]).all()
        assert 0 < mask[:, 0].sum() < 128  # both kept and dropped rows
    assert not np.array_equal(masks[0], masks[1])
    net.set_train(False)
    np.testing.assert_array_equal(net(Tensor(x)).asnumpy(), x)


def test_initializer_and_numpy_errors_check_arguments_and_name_the_users_line():
    import graphkernel.common.initializer as init
    from graphkernel import numpy as mnp
    cases = [
        (lambda: init.Normal(sigma="x"), InputError, "Normal: sigma must be a finite"),
        (lambda: init.Uniform(scale=-1), InputError, "Uniform: scale must be a finite non-neg"),
        (lambda: init.TruncatedNormal(a=1.0, b=-1.0), InputError, "leave no interval"),
        (lambda: init.HeNormal(nonlinearity="swish"), InputError, "unknown nonlinearity"),
        (lambda: init.initializer("normal", (2,), foo=1), InputError, "unexpected keyword"),
        (lambda: init.initializer(object(), (2,)), InputError, "init must be a name"),
        (lambda: mnp.split(Tensor(np.ones((2, 6), np.float32)), 4, 1), ShapeError,
         "4 sections do not divide"),
    ]
    for make, error, message in cases:
        with pytest.raises(error, match=message) as info:
            make()
        assert info.value.location is not None and info.value.location.filename == __file__

    class Net(nn.Cell):
        def construct(self, x):
            return mnp.roll(x, 1, 5)  # the line the error names

    with pytest.raises(ShapeError, match="roll: axis 5 is out of range") as info:
        Net()(Tensor(np.ones((2, 3), np.float32)))
    assert "the line the error names" in info.value.location.text
