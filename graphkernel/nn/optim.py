"""Optimizers, MindSpore's: `optimizer(gradients)` inside a traced construct (TrainOneStepCell)
writes every parameter and its state in place through the update primitives (ApplyMomentum,
Adam, AdamWeightDecay, Assign; ir/opdefs/optim.py). With fusion on each parameter's update
(its new value and every state tensor, written together) is one elementwise kernel, fused with
the gradient work before it; unfused, each update primitive runs as one numpy step.

The learning rate is a float, a list or array of per-step values (the last one repeats), or a
`LearningRateSchedule` cell computing it from the step count in the graph; the step count is a
Parameter the optimizer increments each call (only when the rate changes with it).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tensor import Parameter, Tensor
from graphkernel.frontend.tracing import user_location
from graphkernel.ops import operations as P


class LearningRateSchedule(Cell):
    """A learning rate computed in the graph from `global_step` (a float scalar tensor)."""

    def construct(self, global_step: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define construct(global_step)")


class ExponentialDecayLR(LearningRateSchedule):
    """learning_rate * decay_rate ** (step / decay_steps), floored with is_stair."""

    def __init__(self, learning_rate: float, decay_rate: float, decay_steps: int,
                 is_stair: bool = False) -> None:
        super().__init__()
        self.learning_rate, self.decay_rate = float(learning_rate), float(decay_rate)
        self.decay_steps, self.is_stair = int(decay_steps), is_stair

    def construct(self, global_step: Any) -> Any:
        p = global_step / float(self.decay_steps)
        if self.is_stair:
            p = P.Floor()(p)
        return P.Pow()(self.decay_rate, p) * self.learning_rate


_GROUP_KEYS = ("params", "lr", "weight_decay", "order_params")


class Optimizer(Cell):
    """The parameters to update, the learning rate and weight decay; subclasses' `construct`
    takes the gradients (a tuple aligned with `self.parameters`).

    `parameters` is a Cell, a list of Parameters, or MindSpore's parameter groups: a list of
    dicts, each with "params" (a list of Parameters) and optionally its own "lr" and
    "weight_decay" (else the optimizer's), plus at most one {"order_params": [...]} naming
    every grouped parameter once, in the order the optimizer keeps them (else group by
    group)."""

    def __init__(self, learning_rate: Any, parameters: Any, weight_decay: float = 0.0) -> None:
        super().__init__(auto_prefix=False)
        groups = _parameter_groups(type(self).__name__, parameters)
        order = next((g["order_params"] for g in groups if "order_params" in g), None)
        groups = [g for g in groups if "order_params" not in g]
        params = [p for g in groups for p in g["params"]]
        self.parameters = tuple(_ordered(params, order) if order is not None else params)
        # Scalars the optimizer keeps (step count, rates, beta powers) in the widest dtype of
        # its parameters: float64 parameters get float64 rates.
        self.scalar_dtype = np.result_type(*(p.dtype for p in params), np.float32)
        self.weight_decay = _weight_decay(weight_decay)
        self.learning_rate = self._rate(learning_rate)
        # Per parameter: its weight decay and which rate it follows (0: the optimizer's; k:
        # group_lr_k, a group's own "lr").
        decays: dict[int, float] = {}
        rate_of: dict[int, int] = {}
        rates: list[Any] = [self.learning_rate]
        for group in groups:
            if "lr" in group:
                rates.append(self._rate(group["lr"]))
                if isinstance(rates[-1], LearningRateSchedule):  # registered as a sub-cell
                    setattr(self, f"group_lr_{len(rates) - 1}", rates[-1])
            for p in group["params"]:
                decays[id(p)] = _weight_decay(group.get("weight_decay", weight_decay))
                rate_of[id(p)] = len(rates) - 1 if "lr" in group else 0
        self.is_group_lr = len(rates) > 1
        self.group_rates = tuple(rates)
        self.weight_decays = tuple(decays[id(p)] for p in self.parameters)
        self.rate_index = tuple(rate_of[id(p)] for p in self.parameters)
        self.dynamic_lr = any(not isinstance(r, float) for r in rates)
        if self.dynamic_lr:
            self.global_step = Parameter(np.zeros((), self.scalar_dtype), "global_step",
                                         requires_grad=False)

    def _rate(self, learning_rate: Any) -> Any:
        """A learning rate as kept: a float, an array of per-step rates, or a schedule."""
        if isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool):
            if learning_rate < 0:
                raise InputError(f"learning_rate must be >= 0, got {learning_rate}",
                                 user_location())
            return float(learning_rate)
        if isinstance(learning_rate, LearningRateSchedule):
            return learning_rate
        if isinstance(learning_rate, (list, tuple, np.ndarray, Tensor)):
            rates = np.asarray(learning_rate, dtype=self.scalar_dtype).ravel()
            if rates.size == 0:
                raise InputError("learning_rate: an empty list of rates", user_location())
            return rates
        raise InputError(f"learning_rate must be a float, a list of per-step rates or a "
                         f"LearningRateSchedule, got {type(learning_rate).__name__}",
                         user_location())

    def _state(self, prefix: str, init: float = 0.0) -> tuple[Parameter, ...]:
        """One state tensor per parameter (moments, ...), registered as this cell's."""
        states = []
        for i, p in enumerate(self.parameters):
            state = Parameter(np.full(p.shape, init, p.dtype), f"{prefix}.{p.name}",
                              requires_grad=False)
            setattr(self, f"{prefix}_{i}", state)
            states.append(state)
        return tuple(states)

    def get_lr(self) -> Any:
        """This step's learning rate (a float, or a float32 scalar tensor), and the step count
        incremented for the next call; with groups of their own "lr", a tuple of one rate per
        parameter (as MindSpore's)."""
        rates = self._step_rates()
        return tuple(rates[k] for k in self.rate_index) if self.is_group_lr else rates[0]

    def parameter_lrs(self) -> list[Any]:
        """This step's learning rate of each parameter (get_lr, one per parameter)."""
        rates = self._step_rates()
        return [rates[k] for k in self.rate_index]

    def _step_rates(self) -> list[Any]:
        if not self.dynamic_lr:
            return list(self.group_rates)
        step = self.global_step * 1.0
        out = [self._rate_at(rate, step) for rate in self.group_rates]
        P.AssignAdd()(self.global_step, 1.0)
        return out

    @staticmethod
    def _rate_at(rate: Any, step: Any) -> Any:
        if isinstance(rate, float):
            return rate
        if isinstance(rate, LearningRateSchedule):
            return rate(step)
        index = P.Minimum()(step, float(len(rate) - 1))
        steps = np.arange(len(rate), dtype=rate.dtype)
        return P.ReduceSum()(P.Select()(P.Equal()(steps, index), rate, rate.dtype.type(0)))

    def decay(self, index: int, param: Any, grad: Any) -> Any:
        """The gradient of parameter `index` with its weight decay (L2) added."""
        rate = self.weight_decays[index]
        return grad if rate == 0.0 else grad + param * rate

    def _check(self, gradients: Sequence[Any]) -> list[Any]:
        gradients = list(gradients)
        if len(gradients) != len(self.parameters):
            raise InputError(f"{type(self).__name__} updates {len(self.parameters)} "
                             f"parameter(s) but got {len(gradients)} gradient(s)",
                             user_location())
        return gradients

    @staticmethod
    def _typed(lr: Any, param: Parameter) -> Any:
        return lr if isinstance(lr, float) or lr.dtype == param.dtype else \
            P.Cast()(lr, param.dtype)


def _weight_decay(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise InputError(f"weight_decay must be a float >= 0, got {value!r}", user_location())
    return float(value)


def _parameter_groups(owner: str, parameters: Any) -> list[dict[str, Any]]:
    """`parameters` as MindSpore's groups (a plain list is one group), each checked."""
    if isinstance(parameters, Cell):
        parameters = parameters.trainable_params()
    items = list(parameters) if isinstance(parameters, (list, tuple)) else None
    if items and all(isinstance(g, dict) for g in items):
        groups = [dict(g) for g in items]  # the caller's dicts stay as they were
    elif items and all(isinstance(p, Parameter) for p in items):
        groups = [{"params": items}]
    else:
        raise InputError(f"{owner} needs a non-empty list of Parameters (e.g. "
                         "net.trainable_params()) or of parameter groups (dicts with "
                         f"'params'), got {parameters!r}", user_location())
    seen: dict[int, int] = {}
    ordered = 0
    for n, group in enumerate(groups):
        unknown = sorted(set(group) - set(_GROUP_KEYS))
        if unknown:
            raise InputError(f"{owner}: parameter group {n} has key(s) {unknown}; a group takes "
                             f"{', '.join(_GROUP_KEYS)}", user_location())
        if "order_params" in group:
            ordered += 1
            if len(group) != 1 or ordered > 1:
                raise InputError(f"{owner}: 'order_params' must be a group of its own, given "
                                 "once", user_location())
            key = "order_params"
        elif "params" not in group:
            raise InputError(f"{owner}: parameter group {n} has no 'params'", user_location())
        else:
            key = "params"
        members = group[key]
        members = list(members.trainable_params() if isinstance(members, Cell) else members)
        if not members or not all(isinstance(p, Parameter) for p in members):
            raise InputError(f"{owner}: parameter group {n}'s {key!r} must be a non-empty "
                             "list of Parameters", user_location())
        group[key] = members
        if key == "params":
            for p in members:
                if id(p) in seen:
                    raise InputError(f"{owner}: parameter {p.name!r} is in groups "
                                     f"{seen[id(p)]} and {n}; give each parameter one group",
                                     user_location())
                seen[id(p)] = n
    return groups


def _ordered(params: list[Parameter], order: list[Parameter]) -> list[Parameter]:
    """The grouped parameters in 'order_params' order: the same parameters, each once."""
    grouped = {id(p) for p in params}
    stray = [p.name for p in order if id(p) not in grouped]
    missing = [p.name for p in params if id(p) not in {id(q) for q in order}]
    if stray or missing or len(order) != len(params):
        raise InputError("'order_params' must name every grouped parameter once: "
                         f"{f'not in any group: {stray}; ' if stray else ''}"
                         f"{f'grouped but not ordered: {missing}; ' if missing else ''}"
                         f"{len(order)} ordered, {len(params)} grouped", user_location())
    return list(order)


class Momentum(Optimizer):
    """accum = momentum * accum + grad; param -= lr * accum (ApplyMomentum per parameter)."""

    def __init__(self, params: Any, learning_rate: Any, momentum: float,
                 weight_decay: float = 0.0, use_nesterov: bool = False) -> None:
        super().__init__(learning_rate, params, weight_decay)
        if momentum < 0:
            raise InputError(f"momentum must be >= 0, got {momentum}", user_location())
        self.momentum = float(momentum)
        self.moments = self._state("moments")
        self.apply = P.ApplyMomentum(use_nesterov=use_nesterov)

    def construct(self, gradients: Any) -> Any:
        lrs = self.parameter_lrs()
        for i, (p, m, g) in enumerate(zip(self.parameters, self.moments,
                                          self._check(gradients))):
            self.apply(p, m, self._typed(lrs[i], p), self.decay(i, p, g), self.momentum)
        return True


class SGD(Optimizer):
    """MindSpore's SGD: accum = momentum * accum + (1 - dampening) * grad (accum starts at the
    first gradient); step = grad + momentum * accum with nesterov, else accum; momentum 0:
    step = grad."""

    def __init__(self, params: Any, learning_rate: Any = 0.1, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        super().__init__(learning_rate, params, weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise InputError("SGD: nesterov needs momentum > 0 and dampening 0",
                             user_location())
        self.momentum, self.dampening, self.nesterov = float(momentum), float(dampening), \
            nesterov
        if self.momentum > 0:
            self.accum = self._state("accum")
            self.first = Parameter(np.ones((), self.scalar_dtype), "sgd_first_step",
                                   requires_grad=False)

    def construct(self, gradients: Any) -> Any:
        lrs = self.parameter_lrs()
        grads = self._check(gradients)
        if self.momentum > 0:
            first = self.first * 1.0
        for i, (p, g) in enumerate(zip(self.parameters, grads)):
            g = self.decay(i, p, g)
            step = g
            if self.momentum > 0:
                a = self.accum[i]
                later = a * self.momentum + g * (1.0 - self.dampening)
                f = self._typed(first, p)
                new = later + (g - later) * f  # the first step starts the average at grad
                P.Assign()(a, new)
                step = g + new * self.momentum if self.nesterov else new
            P.Assign()(p, p - step * self._typed(lrs[i], p))
        if self.momentum > 0:
            P.Assign()(self.first, first * 0.0)
        return True


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction; weight_decay adds decay * param to the gradient
    (L2), as MindSpore's Adam."""

    def __init__(self, params: Any, learning_rate: Any = 1e-3, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                 use_nesterov: bool = False) -> None:
        super().__init__(learning_rate, params, weight_decay)
        _check_betas(beta1, beta2, eps)
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.moment1, self.moment2 = self._state("moment1"), self._state("moment2")
        one = np.ones((), self.scalar_dtype)
        self.beta1_power = Parameter(one, "beta1_power", requires_grad=False)
        self.beta2_power = Parameter(one.copy(), "beta2_power", requires_grad=False)
        self.apply = P.Adam(use_nesterov=use_nesterov)

    def construct(self, gradients: Any) -> Any:
        lrs = self.parameter_lrs()
        b1p = P.Assign()(self.beta1_power, self.beta1_power * self.beta1)
        b2p = P.Assign()(self.beta2_power, self.beta2_power * self.beta2)
        for i, (p, m, v, g) in enumerate(zip(self.parameters, self.moment1, self.moment2,
                                             self._check(gradients))):
            typed = [self._typed(x, p) for x in (b1p, b2p)]
            self.apply(p, m, v, typed[0], typed[1], self._typed(lrs[i], p), self.beta1,
                       self.beta2, self.eps, self.decay(i, p, g))
        return True


class AdamWeightDecay(Optimizer):
    """AdamW as MindSpore's (no bias correction): param -= lr * (m / (sqrt(v) + eps) +
    weight_decay * param)."""

    def __init__(self, params: Any, learning_rate: Any = 1e-3, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.0) -> None:
        super().__init__(learning_rate, params, weight_decay)
        _check_betas(beta1, beta2, eps)
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.moments1, self.moments2 = self._state("adam_m"), self._state("adam_v")
        self.apply = P.AdamWeightDecay()

    def construct(self, gradients: Any) -> Any:
        lrs = self.parameter_lrs()
        for i, (p, m, v, g) in enumerate(zip(self.parameters, self.moments1, self.moments2,
                                             self._check(gradients))):
            # Decoupled: the decay is applied by the update itself, not added to the gradient.
            self.apply(p, m, v, self._typed(lrs[i], p), self.beta1, self.beta2, self.eps,
                       self.weight_decays[i], g)
        return True


def _check_betas(beta1: float, beta2: float, eps: float) -> None:
    if not (0 <= beta1 < 1 and 0 <= beta2 < 1 and eps > 0):
        raise InputError(f"need 0 <= beta1, beta2 < 1 and eps > 0; got beta1={beta1}, "
                         f"beta2={beta2}, eps={eps}", user_location())
