"""Training: losses, the in-place update primitives, optimizers against their textbook math,
learning-rate schedules, MindSpore's _grad_ops called directly, and the digits example (an MLP
trained with TrainOneStepCell + Momentum) with fusion on and off."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphkernel as gk
from graphkernel import Parameter, Tensor, nn
from graphkernel.errors import GraphKernelError, InputError
from graphkernel.frontend import context
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ir.opset import OPS
from graphkernel.ops import operations as P
from graphkernel.ops.operations import _grad_ops as G


@pytest.fixture(params=[False, True], ids=["unfused", "fused"])
def fusion(request: Any) -> Any:
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=request.param)
    yield request.param
    context.set_context(enable_graph_kernel=False)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    s = x - x.max(-1, keepdims=True)
    return s - np.log(np.exp(s).sum(-1, keepdims=True))


def _reduce(x: np.ndarray, reduction: str) -> np.ndarray:
    return {"none": x, "mean": x.mean(), "sum": x.sum()}[reduction]


class Apply(nn.Cell):
    def __init__(self, cell: nn.Cell) -> None:
        super().__init__()
        self.cell = cell

    def construct(self, *xs: Any) -> Any:
        return self.cell(*xs)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_losses_match_numpy(reduction: str, fusion: bool) -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 5)) * 30  # large logits: log-sum-exp must not overflow
    labels = rng.integers(0, 5, 6).astype(np.int32)
    onehot = np.eye(5)[labels]
    target = rng.normal(size=(6, 5))
    binary = rng.integers(0, 2, (6, 5)).astype(np.float64)
    cases = [
        (nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction=reduction), (logits, labels),
         -(_log_softmax(logits) * onehot).sum(-1)),
        (nn.SoftmaxCrossEntropyWithLogits(reduction=reduction), (logits, onehot),
         -(_log_softmax(logits) * onehot).sum(-1)),
        (nn.MSELoss(reduction), (logits, target), (logits - target) ** 2),
        (nn.L1Loss(reduction), (logits, target), np.abs(logits - target)),
        (nn.BCEWithLogitsLoss(reduction), (logits, binary),
         np.logaddexp(0, logits) - logits * binary),
    ]
    for loss, args, want in cases:
        got = Apply(loss)(*[Tensor(a) for a in args]).asnumpy()
        np.testing.assert_allclose(got, _reduce(want, reduction), rtol=1e-10, atol=1e-10,
                                   err_msg=type(loss).__name__)


def test_bce_with_weights(fusion: bool) -> None:
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(4, 3)), rng.integers(0, 2, (4, 3)).astype(np.float64)
    w, pw = rng.uniform(0.5, 2, (4, 3)), rng.uniform(0.5, 2, (3,))
    loss = nn.BCEWithLogitsLoss("sum", weight=Tensor(w), pos_weight=Tensor(pw))
    sig = 1 / (1 + np.exp(-x))
    want = -(w * (pw * y * np.log(sig) + (1 - y) * np.log(1 - sig))).sum()
    np.testing.assert_allclose(Apply(loss)(Tensor(x), Tensor(y)).asnumpy(), want, rtol=1e-10)


def test_loss_errors() -> None:
    with pytest.raises(InputError, match="reduction"):
        nn.MSELoss("average")
    context.set_context(mode=context.GRAPH_MODE)
    with pytest.raises(InputError, match="integer labels"):
        Apply(nn.SoftmaxCrossEntropyWithLogits(sparse=True))(Tensor(np.ones((2, 3))),
                                                             Tensor(np.ones((2, 3))))


def test_cross_entropy_gradient_is_softmax_minus_labels(fusion: bool) -> None:
    rng = np.random.default_rng(2)
    logits, labels = rng.normal(size=(4, 6)), rng.integers(0, 6, 4).astype(np.int32)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    g = gk.grad(loss)(Tensor(logits), Tensor(labels)).asnumpy()
    soft = np.exp(_log_softmax(logits))
    np.testing.assert_allclose(g, (soft - np.eye(6)[labels]) / 4, rtol=1e-10, atol=1e-12)


# -- in-place updates ------------------------------------------------------------------------
class Writer(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.p = Parameter(np.zeros((2, 3)), "p")
        self.count = Parameter(np.zeros((), np.int32), "count", requires_grad=False)

    def construct(self, x: Any) -> Any:
        P.Assign()(self.p, x * 2.0)
        P.AssignAdd()(self.count, 1)
        return self.p + 1.0  # reads the value just written


def test_assign_writes_the_parameter_in_place(fusion: bool) -> None:
    net = Writer()
    view = net.p.asnumpy()
    out = net(Tensor(np.ones((2, 3))))
    np.testing.assert_array_equal(out.asnumpy(), 3.0)
    np.testing.assert_array_equal(view, 2.0)  # the same array object, written in place
    net(Tensor(np.full((2, 3), 5.0)))
    assert int(net.count.asnumpy()) == 2 and view[0, 0] == 10.0
    graph = gk.compile(net, Tensor(np.ones((2, 3)))).stages["hwopt_d_end"]
    assert sorted(w.name for w, _ in graph.assigns) == ["count", "p"]


def test_update_primitives_eagerly_and_their_errors() -> None:
    p = Parameter(np.ones(3), "p")
    view = p.asnumpy()
    P.AssignSub()(p, Tensor(np.full(3, 0.25)))
    np.testing.assert_array_equal(view, 0.75)
    with pytest.raises(InputError, match="must be a Parameter"):
        P.Assign()(Tensor(np.ones(3)), Tensor(np.ones(3)))

    class Bad(nn.GraphKernel):
        def __init__(self) -> None:
            super().__init__()
            self.q = Parameter(np.ones(3), "q")

        def construct(self, x: Any) -> Any:
            return P.Assign()(self.q, x)

    class Outer(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.bad = Bad()

        def construct(self, x: Any) -> Any:
            return self.bad(x)
    context.set_context(mode=context.GRAPH_MODE)
    with pytest.raises(GraphKernelError, match="cannot write Parameter"):
        Outer()(Tensor(np.ones(3)))


# -- optimizers ------------------------------------------------------------------------------
class Quadratic(nn.Cell):
    """sum((x @ w + b - y)^2): gradients 2 x^T r and 2 sum(r)."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(3)
        self.w = Parameter(rng.normal(size=(3, 2)), "w")
        self.b = Parameter(rng.normal(size=(2,)), "b")

    def construct(self, x: Any, y: Any) -> Any:
        return P.ReduceSum()(P.Square()(P.MatMul()(x, self.w) + self.b - y))


def _numpy_grads(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray
                 ) -> list[np.ndarray]:
    r = x @ w + b - y
    return [2 * x.T @ r, 2 * r.sum(0)]


def _momentum(p: np.ndarray, g: np.ndarray, s: dict[str, Any], lr: float) -> np.ndarray:
    s["a"] = s.get("a", 0) * 0.9 + g
    return p - lr * s["a"]


def _sgd_nesterov(p: np.ndarray, g: np.ndarray, s: dict[str, Any], lr: float) -> np.ndarray:
    g = g + 0.01 * p
    s["a"] = g if "a" not in s else 0.8 * s["a"] + g
    return p - lr * (g + 0.8 * s["a"])


def _adam(p: np.ndarray, g: np.ndarray, s: dict[str, Any], lr: float) -> np.ndarray:
    s["t"] = s.get("t", 0) + 1
    s["m"] = 0.9 * s.get("m", 0) + 0.1 * g
    s["v"] = 0.999 * s.get("v", 0) + 0.001 * g * g
    lr_t = lr * np.sqrt(1 - 0.999 ** s["t"]) / (1 - 0.9 ** s["t"])
    return p - lr_t * s["m"] / (np.sqrt(s["v"]) + 1e-8)


def _adamw(p: np.ndarray, g: np.ndarray, s: dict[str, Any], lr: float) -> np.ndarray:
    s["m"] = 0.9 * s.get("m", 0) + 0.1 * g
    s["v"] = 0.999 * s.get("v", 0) + 0.001 * g * g
    return p - lr * (s["m"] / (np.sqrt(s["v"]) + 1e-6) + 0.05 * p)


def _lamb(p: np.ndarray, g: np.ndarray, s: dict[str, Any], lr: float) -> np.ndarray:
    s["t"] = s.get("t", 0) + 1
    s["m"] = 0.9 * s.get("m", 0) + 0.1 * g
    s["v"] = 0.999 * s.get("v", 0) + 0.001 * g * g
    m_hat, v_hat = s["m"] / (1 - 0.9 ** s["t"]), s["v"] / (1 - 0.999 ** s["t"])
    update = m_hat / (np.sqrt(v_hat) + 1e-6) + 0.01 * p
    return p - lr * np.linalg.norm(p) / np.linalg.norm(update) * update


OPTIMIZERS = {
    "Momentum": (lambda ps, lr: nn.Momentum(ps, lr, 0.9), _momentum),
    "SGD-nesterov": (lambda ps, lr: nn.SGD(ps, lr, momentum=0.8, weight_decay=0.01,
                                           nesterov=True), _sgd_nesterov),
    "SGD-plain": (lambda ps, lr: nn.SGD(ps, lr), lambda p, g, s, lr: p - lr * g),
    "Adam": (lambda ps, lr: nn.Adam(ps, lr), _adam),
    "AdamWeightDecay": (lambda ps, lr: nn.AdamWeightDecay(ps, lr, weight_decay=0.05), _adamw),
    "Lamb": (lambda ps, lr: nn.Lamb(ps, lr, weight_decay=0.01), _lamb),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_steps_match_the_textbook(name: str, fusion: bool) -> None:
    make, rule = OPTIMIZERS[name]
    net = Quadratic()
    params = [net.w.asnumpy().copy(), net.b.asnumpy().copy()]
    views = [net.w.asnumpy(), net.b.asnumpy()]
    rates = [0.05, 0.04, 0.03]  # per-step rates: the list form of learning_rate
    step = nn.TrainOneStepCell(net, make(net.trainable_params(), rates))
    rng = np.random.default_rng(4)
    states: list[dict[str, Any]] = [{}, {}]
    for i in range(4):
        x, y = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
        loss = step(Tensor(x), Tensor(y)).asnumpy()
        want_loss = ((x @ params[0] + params[1] - y) ** 2).sum()
        np.testing.assert_allclose(loss, want_loss, rtol=1e-10)
        grads = _numpy_grads(params[0], params[1], x, y)
        lr = rates[min(i, len(rates) - 1)]
        params = [rule(p, g, s, lr) for p, g, s in zip(params, grads, states)]
        for view, want in zip(views, params):
            np.testing.assert_allclose(view, want, rtol=1e-9, atol=1e-12)


def test_exponential_decay_schedule(fusion: bool) -> None:
    net = Quadratic()
    schedule = nn.ExponentialDecayLR(0.1, 0.5, decay_steps=2, is_stair=True)
    step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), schedule))
    rng = np.random.default_rng(5)
    w = net.w.asnumpy().copy()
    b = net.b.asnumpy().copy()
    for i in range(5):
        x, y = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
        step(Tensor(x), Tensor(y))
        gw, gb = _numpy_grads(w, b, x, y)
        lr = 0.1 * 0.5 ** (i // 2)
        w, b = w - lr * gw, b - lr * gb
        np.testing.assert_allclose(net.w.asnumpy(), w, rtol=1e-6)


def _l2(rule: Any, decay: float) -> Any:
    """`rule` on the gradient with decay * param added (MindSpore's Momentum, SGD, Adam)."""
    return lambda p, g, s, lr: rule(p, g + decay * p, s, lr)


def _adamw_decay(decay: float) -> Any:
    def rule(p: np.ndarray, g: np.ndarray, s: dict[str, Any], lr: float) -> np.ndarray:
        s["m"] = 0.9 * s.get("m", 0) + 0.1 * g
        s["v"] = 0.999 * s.get("v", 0) + 0.001 * g * g
        return p - lr * (s["m"] / (np.sqrt(s["v"]) + 1e-6) + decay * p)
    return rule


# name: (make(params, learning_rate), rule for the given weight decay)
GROUPED = {
    "Momentum": (lambda ps, lr: nn.Momentum(ps, lr, 0.9), lambda d: _l2(_momentum, d)),
    "SGD": (lambda ps, lr: nn.SGD(ps, lr), lambda d: _l2(lambda p, g, s, lr: p - lr * g, d)),
    "Adam": (lambda ps, lr: nn.Adam(ps, learning_rate=lr), lambda d: _l2(_adam, d)),
    "AdamWeightDecay": (lambda ps, lr: nn.AdamWeightDecay(ps, learning_rate=lr), _adamw_decay),
}


@pytest.mark.parametrize("reverse", [False, True], ids=["net_order", "reversed"])
@pytest.mark.parametrize("name", sorted(GROUPED))
def test_parameter_groups_match_a_float64_reference(name: str, reverse: bool,
                                                    fusion: bool) -> None:
    """MindSpore's groups: w decays (its group's weight_decay) at the optimizer's per-step
    rates, b keeps no decay at its group's own lr; 'order_params' sets the update order."""
    make, rule_for = GROUPED[name]
    net = Quadratic()
    order = [net.b, net.w] if reverse else net.trainable_params()
    groups = [{"params": [net.w], "weight_decay": 0.01}, {"params": [net.b], "lr": 0.02},
              {"order_params": order}]
    rates = [0.05, 0.04, 0.03]
    optimizer = make(groups, rates)
    assert optimizer.parameters == tuple(order)
    step = nn.TrainOneStepCell(net, optimizer)
    params = [net.w.asnumpy().copy(), net.b.asnumpy().copy()]
    rules = [rule_for(0.01), rule_for(0.0)]
    rng = np.random.default_rng(6)
    states: list[dict[str, Any]] = [{}, {}]
    for i in range(4):
        x, y = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
        step(Tensor(x), Tensor(y))
        grads = _numpy_grads(params[0], params[1], x, y)
        lrs = [rates[min(i, len(rates) - 1)], 0.02]
        params = [rule(p, g, s, lr) for rule, p, g, s, lr in zip(rules, params, grads, states, lrs)]
        np.testing.assert_allclose(net.w.asnumpy(), params[0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(net.b.asnumpy(), params[1], rtol=1e-9, atol=1e-12)


def test_parameter_group_errors() -> None:
    net = Quadratic()
    w, b = net.w, net.b
    cases = [
        ([{"params": [w]}, {"params": [w, b]}], "parameter 'w' is in groups 0 and 1"),
        ([{"params": [w], "momentum": 0.5}], r"group 0 has key\(s\) \['momentum'\]"),
        ([{"lr": 0.1}], "group 0 has no 'params'"),
        ([{"params": []}], "group 0's 'params' must be a non-empty list of Parameters"),
        ([{"params": [w]}, {"params": [b]}, {"order_params": [w]}],
         r"grouped but not ordered: \['b'\]"),
        ([{"params": [w]}, {"order_params": [w, b]}], r"not in any group: \['b'\]"),
        ([{"params": [w]}, {"order_params": [w], "lr": 0.1}], "a group of its own"),
        ([{"params": [w], "weight_decay": -1.0}], "weight_decay must be a float >= 0"),
        ([{"params": [w], "lr": "fast"}], "learning_rate must be a float"),
    ]
    for groups, message in cases:
        with pytest.raises(InputError, match=message):
            nn.Adam(groups, learning_rate=0.1)
    kept = {"params": [w], "weight_decay": 0.01}
    nn.Adam([kept, {"params": [b]}], learning_rate=0.1)
    assert kept == {"params": [w], "weight_decay": 0.01}  # the caller's dicts are not changed


def test_optimizer_errors() -> None:
    net = Quadratic()
    with pytest.raises(InputError, match="Parameters"):
        nn.Momentum([], 0.1, 0.9)
    with pytest.raises(InputError, match="beta1"):
        nn.Adam(net.trainable_params(), beta1=1.5)
    with pytest.raises(InputError, match="optimizer"):
        nn.TrainOneStepCell(net, object())  # type: ignore[arg-type]


def test_updates_fuse_with_their_gradients() -> None:
    """Fusion on: each parameter's update (new value and momentum, written together) is one
    kernel, and the bias's gradient reduction joins its update's kernel."""
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=True)
    net = Quadratic()
    step = nn.TrainOneStepCell(net, nn.Momentum(net.trainable_params(), 0.1, 0.9))
    x, y = Tensor(np.ones((5, 3))), Tensor(np.ones((5, 2)))
    exe = gk.compile(step, x, y)
    context.set_context(enable_graph_kernel=False)
    names = [k.name for k in exe.kernels]
    assert sum("ApplyMomentum" in n for n in names) == 2, names
    assert any("ReduceSum" in n and "ApplyMomentum" in n or "BiasAddGrad" in n and
               "ApplyMomentum" in n for n in names) or any(
        n.startswith("Fused_") and "ApplyMomentum" in n for n in names), names
    final = exe.stages["hwopt_d_end"]
    assert len(final.assigns) == 4  # w, b and their two moments


class ReshapedLoss(nn.Cell):
    """A Dense over flattened rows whose loss reads the output in its first shape (an encoder
    layer's loss): the seed gradient, one element broadcast, reaches a Reshape."""

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self.w = Parameter((rng.normal(size=(33, 33)) * 0.1).astype(np.float32), "w")

    def construct(self, x: Any, target: Any) -> Any:
        y = P.MatMul()(P.Reshape()(x, (2048, 33)), self.w)
        return P.ReduceSum()(P.Square()(P.Reshape()(y, (64, 32, 33)) - target)) * 0.25


def test_a_fused_training_step_runs_as_one_c_call() -> None:
    """Fusion on, an Adam step is kernels and BLAS products only: Adam's beta powers (Assign)
    are the values assigned, no step of their own, and the broadcast seed gradient is a scalar
    inside the kernel that reads it (it was a view group numpy ran op by op). The compiled entry
    runs the whole step; three steps match the unfused ones."""
    rng = np.random.default_rng(8)
    x, t = (rng.normal(size=(64, 32, 33)).astype(np.float32) for _ in range(2))
    runs = []
    for enable in (True, False):
        net = ReshapedLoss(np.random.default_rng(3))
        step = nn.TrainOneStepCell(net, nn.Adam(net.trainable_params(), 0.01))
        exe = gk.compile(step, Tensor(x), Tensor(t),
                         options=CompileOptions(enable_graph_kernel=enable))
        if enable:
            plan = exe.plan
            assert not [s.name for s in plan.steps if s.op == "Assign" or
                        s.kind.name == "INTERPRETED"], plan.describe()
            assert exe.executable.runner.entry is not None, plan.describe()
        losses = [float(exe(Tensor(x * (1 + i)), Tensor(t)).asnumpy()) for i in range(3)]
        runs.append((losses, net.w.asnumpy().copy()))
    (fused_losses, fused_w), (losses, w) = runs
    np.testing.assert_allclose(fused_losses, losses, rtol=1e-5)
    np.testing.assert_allclose(fused_w, w, rtol=1e-4, atol=1e-6)



class _TwoLayers(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(4, 4, activation="relu")
        self.fc2 = nn.Dense(4, 4)
        for i, p in enumerate(self.trainable_params()):
            p.set_data(np.random.default_rng(10 + i).normal(size=p.shape).astype(np.float32))

    def construct(self, x: Any) -> Any:
        return self.fc2(self.fc1(x))


@pytest.mark.parametrize("optimizer", ["SGD", "Momentum"])
def test_an_input_that_is_a_weights_own_array_is_read_as_it_was(optimizer: str,
                                                                  fusion: bool) -> None:
    """`Tensor(w.asnumpy())` holds the weight's own array: the step writes fc2.weight in place
    (fused, inside the kernel that computes it) before the product for fc1.weight's gradient
    reads the input, which then read the new weight (losses drifted: 6.158 against 6.066
    after one step). The input is copied first: the same losses and weights as on a copy."""
    make = {"SGD": lambda ps: nn.SGD(ps, 0.1), "Momentum": lambda ps: nn.Momentum(ps, 0.1, 0.9)}
    runs = []
    for aliased in (True, False):
        net = _TwoLayers()
        step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()),
                                   make[optimizer](net.trainable_params()))
        target = Tensor(np.ones((4, 4), np.float32))
        losses = []
        for _ in range(3):
            w = net.fc2.weight.asnumpy()
            losses.append(float(step(Tensor(w if aliased else w.copy()), target).asnumpy()))
        runs.append((losses, [p.asnumpy().copy() for p in net.trainable_params()]))
    (aliased_losses, aliased_weights), (losses, weights) = runs
    assert aliased_losses == losses
    for got, want in zip(aliased_weights, weights):
        np.testing.assert_array_equal(got, want)


# -- MindSpore's _grad_ops called directly -----------------------------------------------------
def _grad_op_cases(rng: np.random.Generator) -> list[tuple[Any, list[np.ndarray]]]:
    x = rng.normal(size=(4, 6)).astype(np.float32)
    dy = rng.normal(size=(4, 6)).astype(np.float32)
    pos = rng.uniform(0.5, 2, (4, 6)).astype(np.float32)
    gamma = rng.normal(size=(6,)).astype(np.float32)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    sm = np.exp(_log_softmax(x)).astype(np.float32)
    img = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    chan = rng.uniform(0.5, 2, (3,)).astype(np.float32)
    return [
        (G.GeLUGrad(), [dy, x, x]), (G.GeLUGrad(approximate="none"), [dy, x, x]),
        (G.FastGeLUGrad(), [dy, x]), (G.ReluGrad(), [dy, x]), (G.SigmoidGrad(), [sm, dy]),
        (G.TanhGrad(), [np.tanh(x), dy]), (G.SqrtGrad(), [pos, dy]), (G.RsqrtGrad(), [pos, dy]),
        (G.SoftmaxGrad(), [sm, dy]), (G.LogSoftmaxGrad(), [np.log(sm), dy]),
        (G.LayerNormGrad(1, 1), [x, dy, var, mean, gamma]),
        (G.BiasAddGrad(), [dy]), (G.BiasAddGrad(), [img]),
        (G.MaximumGrad(), [x, x[:1], dy]), (G.MinimumGrad(), [x, pos, dy]),
        (G.DropoutGrad(0.8), [dy, (pos > 1).astype(np.float32)]),
        (G.BatchNormGrad(is_training=True), [img, img * 0.5, chan, chan * 0.1, chan, chan]),
        (G.BatchNormGrad(), [img, img * 0.5, chan, chan * 0.1, chan, chan]),
        (G.SigmoidCrossEntropyWithLogitsGrad(), [x, (pos > 1).astype(np.float32), dy]),
    ]


def test_grad_ops_fused_match_their_numpy_references() -> None:
    rng = np.random.default_rng(6)
    class One(nn.Cell):
        def __init__(self, prim: Any) -> None:
            super().__init__()
            self.prim = prim

        def construct(self, *xs: Any) -> Any:
            return self.prim(*xs)

    for prim, arrays in _grad_op_cases(rng):
        want = prim(*[Tensor(a) for a in arrays])  # eager: the numpy reference
        context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=True)
        exe = gk.compile(One(prim), *[Tensor(a) for a in arrays])
        got = exe(*[Tensor(a) for a in arrays])
        context.set_context(enable_graph_kernel=False)
        # Fused groups (launched together by parallel fusion where independent), or a lone
        # basic op fusion left apart (LayerNormGrad's dgamma and dbeta reduce over the rows, not
        # along them: they cannot join the row kernel).
        assert all(k.name.startswith(("Fused", "Parallel", prim.op_name)) or
                   (len(k.op_names) == 1 and k.op_names[0] != prim.op_name)
                   for k in exe.kernels), [k.name for k in exe.kernels]
        assert prim.op_name not in [n.op for n in exe.stages["hwopt_d_end"].nodes], \
            f"{prim.op_name} was not expanded"
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=2e-4, atol=2e-5,
                                       err_msg=repr(prim))


def test_every_grad_op_of_the_issue_exists() -> None:
    for name in ("GeLUGrad", "FastGeLUGrad", "LayerNormGrad", "SoftmaxGrad", "LogSoftmaxGrad",
                 "ReluGrad", "SigmoidGrad", "TanhGrad", "SqrtGrad", "RsqrtGrad", "BiasAddGrad",
                 "MaximumGrad", "MinimumGrad", "DropoutGrad", "BatchNormGrad",
                 "SigmoidCrossEntropyWithLogitsGrad"):
        assert name in OPS and hasattr(G, name)


# -- the digits example ----------------------------------------------------------------------
def test_digits_mlp_example() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    try:
        import digits_mlp
    finally:
        sys.path.pop(0)
    off = digits_mlp.train(False, epochs=20)
    on = digits_mlp.train(True, epochs=20)
    context.set_context(enable_graph_kernel=False)
    assert off["accuracy"] >= 0.95 and on["accuracy"] >= 0.95, (off["accuracy"],
                                                                 on["accuracy"])
    np.testing.assert_allclose(on["losses"], off["losses"], rtol=1e-4, atol=1e-5)
    assert on["losses"][-1] < 0.2 * on["losses"][0]
    fused, unfused = len(on["step"].kernels), len(off["step"].kernels)
    assert fused <= 0.6 * unfused, (fused, unfused)
    # The README quotes these counts: they must not go stale.
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    quoted = re.search(r"(\d+) kernels per step fused,\s+(\d+) unfused", readme)
    assert quoted and (int(quoted[1]), int(quoted[2])) == (fused, unfused), (quoted, fused,
                                                                             unfused)
    final = on["step"].stages["hwopt_d_end"]
    # backward ops fuse with each other, with forward ops and with the updates (the labels a
    # fused group was made from: its kernel name shortens past eight of them)
    groups = [set(n.notes["fused_from"]) for n in final.nodes if "fused_from" in n.notes]
    assert any({"ReluGrad", "BiasAddGrad", "ApplyMomentum"} <= g for g in groups), groups
    assert any({"LogSoftmax", "LogSoftmaxGrad"} <= g for g in groups), groups
    assert len(final.assigns) == 8  # 4 parameters and their 4 moments
