"""MindSpore's module paths, as MindSpore code imports them: `graphkernel.set_context`,
`common.api.jit`, `ops.composite` as C (GradOperation, MultitypeFuncGraph, HyperMap, Map),
`ops.functional` as F, and `nn.optim.optimizer.Optimizer` subclassed the way MindSpore's own
optimizers and its tutorial's are."""
from __future__ import annotations

import numpy as np
import pytest

import graphkernel as ms
from graphkernel import Parameter, Tensor, nn, ops
from graphkernel.common import dtype as mstype
from graphkernel.common.api import jit
from graphkernel.errors import InputError, UnsupportedError
from graphkernel.nn.optim.optimizer import Optimizer
from graphkernel.ops import composite as C
from graphkernel.ops import functional as F
from graphkernel.ops import operations as P


@pytest.fixture(autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE, enable_graph_kernel=True)
    yield
    ms.set_context(mode=ms.GRAPH_MODE, enable_graph_kernel=False)


def test_set_context_at_the_top_level():
    """
    Feature: ms.set_context / ms.get_context, ms.Model
    Description: set the mode and fusion through the top-level names
    Expectation: the context module reads the same values; Model is at the top level
    """
    ms.set_context(mode=ms.PYNATIVE_MODE)
    assert ms.get_context("mode") == ms.context.PYNATIVE_MODE
    assert ms.get_context("enable_graph_kernel") is True
    # and `ms.Model`, `ms.train`, `ms.dataset` after `import graphkernel as ms`
    import graphkernel.train as train
    assert ms.Model is train.Model and ms.dataset.NumpySlicesDataset is not None


def test_common_api_jit_on_a_function_and_a_construct():
    """
    Feature: mindspore.common.api.jit
    Description: @jit on a function and on a Cell's construct, called in PyNative mode
    Expectation: the values numpy gives
    """
    ms.set_context(mode=ms.PYNATIVE_MODE)

    @jit
    def scaled_relu(x):
        return ops.relu(x) * 2.0

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(Tensor(np.full((3,), 0.5, np.float32)), name="w")

        @jit
        def construct(self, x):
            return ops.exp(x) * self.w

    x = np.array([-1.0, 0.5, 2.0], np.float32)
    np.testing.assert_allclose(scaled_relu(Tensor(x)).asnumpy(), np.maximum(x, 0) * 2)
    np.testing.assert_allclose(Net()(Tensor(x)).asnumpy(), np.exp(x) * 0.5, rtol=1e-6)


def test_composite_multitype_func_graph_dispatches_on_types():
    """
    Feature: C.MultitypeFuncGraph
    Description: registrations for (Tensor, Tensor) and (Number, Tensor); a call matching none
    Expectation: each call runs its registration; no match is an InputError naming the types
    """
    add = C.MultitypeFuncGraph("add")

    @add.register("Tensor", "Tensor")
    def _tensors(x, y):
        return ops.add(x, y)

    @add.register("Number", "Tensor")
    def _number(x, y):
        return y * float(x) + 100.0

    a = Tensor(np.array([1.0, 2.0], np.float32))
    np.testing.assert_allclose(add(a, a).asnumpy(), [2.0, 4.0])
    np.testing.assert_allclose(add(3, a).asnumpy(), [103.0, 106.0])
    with pytest.raises(InputError, match=r"'add' has no registration for arguments "
                                         r"\(String, Tensor\)"):
        add("x", a)
    with pytest.raises(InputError, match="type name"):
        add.register("Tensr")


def test_composite_hyper_map_and_map():
    """
    Feature: C.HyperMap, C.Map
    Description: map over flat and nested tuples, with a partial and a broadcast argument,
        forward and reverse
    Expectation: elementwise results in order; reverse calls the last first; ragged tuples
        are an InputError
    """
    calls = []

    def record(x, y):
        calls.append(x)
        return x * 10 + y

    assert C.HyperMap()(record, (1, (2, 3)), (4, (5, 6))) == (14, (25, 36))
    assert C.Map(record)((1, 2), 7) == (17, 27)
    calls.clear()
    assert C.HyperMap(None, True)(F.partial(record, y=0), (1, 2, 3)) == (10, 20, 30)
    assert calls == [3, 2, 1]
    with pytest.raises(InputError, match="different lengths"):
        C.HyperMap()(record, (1, 2), (1,))
    assert C.GradOperation is ops.GradOperation


def test_functional_as_f():
    """
    Feature: mindspore.ops.functional as F
    Description: generated forms, MindSpore's older names, partial; a name graphkernel lacks
    Expectation: the forms compute; the missing name is an UnsupportedError (an
        AttributeError) naming it
    """
    x = Tensor(np.array([-1.0, 2.0], np.float32))
    np.testing.assert_allclose(F.relu(x).asnumpy(), [0.0, 2.0])
    np.testing.assert_allclose(F.tensor_add(x, x).asnumpy(), [-2.0, 4.0])
    np.testing.assert_allclose(F.reduce_sum(F.cast(x, mstype.float64)).asnumpy(), 1.0)
    assert F.partial(max, 3)(5) == 5
    with pytest.raises(UnsupportedError, match=r"no 'scatter_nd_max' \(MindSpore's "
                                               r"F.scatter_nd_max\) yet"):
        F.scatter_nd_max  # noqa: B018
    assert not hasattr(F, "no_such_op")


class TutorialMomentum(Optimizer):
    """The MindSpore tutorial's custom optimizer, unchanged but for the imports."""

    def __init__(self, params, learning_rate, momentum=0.9):
        super(TutorialMomentum, self).__init__(learning_rate, params)  # noqa: UP008 (as written)
        self.momentum = Parameter(Tensor(momentum, ms.float32), name="momentum")
        self.moments = self.parameters.clone(prefix="moments", init="zeros")
        self.assign = ops.Assign()

    def construct(self, gradients):
        lr = self.get_lr()
        params = self.parameters
        for i in range(len(params)):
            self.assign(self.moments[i], self.moments[i] * self.momentum + gradients[i])
            update = params[i] - self.moments[i] * lr
            self.assign(params[i], update)
        return params


_momentum_opt = C.MultitypeFuncGraph("momentum_opt")


@_momentum_opt.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _tensor_run_opt(opt, momentum, learning_rate, gradient, weight, moment):
    return F.depend(True, opt(weight, moment, learning_rate, gradient, momentum))


class HyperMapMomentum(Optimizer):
    """Written as MindSpore's own nn.Momentum is: hyper_map over a MultitypeFuncGraph."""

    def __init__(self, params, learning_rate, momentum, weight_decay=0.0, loss_scale=1.0):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        self.momentum = Parameter(Tensor(momentum, mstype.float32), name="momentum")
        self.params = self.parameters
        self.moments = self.params.clone(prefix="moments", init="zeros")
        self.hyper_map = C.HyperMap()
        self.opt = P.ApplyMomentum()

    def construct(self, gradients):
        gradients = self.decay_weight(gradients)
        gradients = self.scale_grad(gradients)
        gradients = self.gradients_centralization(gradients)
        lr = self.get_lr()
        return self.hyper_map(F.partial(_momentum_opt, self.opt, self.momentum, lr),
                              gradients, self.params, self.moments)


def results_decay(make):
    """The weight decay the optimizer `make` builds has."""
    return make(nn.Dense(1, 1).trainable_params()).weight_decay


@pytest.mark.parametrize("make", [
    lambda p: TutorialMomentum(p, 0.1, 0.9),
    lambda p: HyperMapMomentum(p, 0.1, 0.9, weight_decay=0.01, loss_scale=4.0),
], ids=["tutorial", "hyper_map"])
def test_user_optimizer_subclass_matches_nn_momentum(make, tmp_path):
    """
    Feature: nn.optim.optimizer.Optimizer as a base class
    Description: MindSpore-style subclasses (parameters.clone, get_lr, decay_weight,
        scale_grad, hyper_map) trained in TrainOneStepCell next to nn.Momentum; the
        hyper_map one with weight decay and a loss scale (its loss scaled by sens)
    Expectation: the same losses and weights; the clones are checkpointed as "moments.*"
    """
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = rng.integers(0, 3, 16).astype(np.int32)
    results = []
    for custom in (False, True):
        ms.set_seed(0)
        net = nn.Dense(4, 3)
        opt = make(net.trainable_params()) if custom else nn.Momentum(
            net.trainable_params(), 0.1, 0.9, weight_decay=results_decay(make))
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt, sens=opt.loss_scale)
        losses = [float(step(Tensor(x), Tensor(y)).asnumpy()) for _ in range(4)]
        results.append((losses, net.weight.asnumpy().copy(), step))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-6)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-5, atol=1e-7)
    ms.save_checkpoint(results[1][2], str(tmp_path / "step.ckpt"))
    names = set(ms.load_checkpoint(str(tmp_path / "step.ckpt")))
    assert {"weight", "bias", "moments.weight", "moments.bias", "momentum"} <= names


def test_optimizer_modules_keep_their_old_imports():
    """
    Feature: nn/optim as a package
    Description: the optimizers through nn, nn.optim and their MindSpore module paths
    Expectation: the same classes
    """
    from graphkernel.nn.optim import SGD, Adam, Momentum
    from graphkernel.nn.optim.adam import Adam as AdamByPath
    from graphkernel.nn.optim.momentum import Momentum as MomentumByPath
    from graphkernel.nn.optim.sgd import SGD as SGDByPath
    assert (Momentum, SGD, Adam) == (nn.Momentum, nn.SGD, nn.Adam)
    assert (MomentumByPath, SGDByPath, AdamByPath) == (nn.Momentum, nn.SGD, nn.Adam)
    assert Optimizer is nn.Optimizer
    with pytest.raises(InputError, match="loss_scale must be a float > 0"):
        Optimizer(0.1, nn.Dense(2, 2).trainable_params(), loss_scale=0)
