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


class Optimizer(Cell):
    """The parameters to update, the learning rate and weight decay; subclasses' `construct`
    takes the gradients (a tuple aligned with `self.parameters`)."""

    def __init__(self, learning_rate: Any, parameters: Any, weight_decay: float = 0.0) -> None:
        super().__init__(auto_prefix=False)
        params = list(parameters.trainable_params() if isinstance(parameters, Cell)
                      else parameters)
        if not params or not all(isinstance(p, Parameter) for p in params):
            raise InputError(f"{type(self).__name__} needs a non-empty list of Parameters "
                             "(e.g. net.trainable_params())", user_location())
        self.parameters = tuple(params)
        # Scalars the optimizer keeps (step count, rates, beta powers) in the widest dtype of
        # its parameters: float64 parameters get float64 rates.
        self.scalar_dtype = np.result_type(*(p.dtype for p in params), np.float32)
        self.weight_decay = float(weight_decay)
        self.dynamic_lr = not isinstance(learning_rate, (int, float))
        if isinstance(learning_rate, (int, float)):
            if learning_rate < 0:
                raise InputError(f"learning_rate must be >= 0, got {learning_rate}",
                                 user_location())
            self.learning_rate = float(learning_rate)
        elif isinstance(learning_rate, LearningRateSchedule):
            self.learning_rate = learning_rate
        elif isinstance(learning_rate, (list, tuple, np.ndarray, Tensor)):
            rates = np.asarray(learning_rate, dtype=self.scalar_dtype).ravel()
            if rates.size == 0:
                raise InputError("learning_rate: an empty list of rates", user_location())
            self.learning_rate = rates
        else:
            raise InputError(f"learning_rate must be a float, a list of per-step rates or a "
                             f"LearningRateSchedule, got {type(learning_rate).__name__}",
                             user_location())
        if self.dynamic_lr:
            self.global_step = Parameter(np.zeros((), self.scalar_dtype), "global_step",
                                         requires_grad=False)

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
        incremented for the next call."""
        if not self.dynamic_lr:
            return self.learning_rate
        step = self.global_step * 1.0
        if isinstance(self.learning_rate, LearningRateSchedule):
            lr = self.learning_rate(step)
        else:
            rates = self.learning_rate
            index = P.Minimum()(step, float(len(rates) - 1))
            steps = np.arange(len(rates), dtype=rates.dtype)
            lr = P.ReduceSum()(P.Select()(P.Equal()(steps, index), rates, rates.dtype.type(0)))
        P.AssignAdd()(self.global_step, 1.0)
        return lr

    def decay(self, param: Any, grad: Any) -> Any:
        return grad if self.weight_decay == 0.0 else grad + param * self.weight_decay

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
        lr = self.get_lr()
        for p, m, g in zip(self.parameters, self.moments, self._check(gradients)):
            self.apply(p, m, self._typed(lr, p), self.decay(p, g), self.momentum)
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
        lr = self.get_lr()
        grads = self._check(gradients)
        if self.momentum > 0:
            first = self.first * 1.0
        for i, (p, g) in enumerate(zip(self.parameters, grads)):
            g = self.decay(p, g)
            step = g
            if self.momentum > 0:
                a = self.accum[i]
                later = a * self.momentum + g * (1.0 - self.dampening)
                f = self._typed(first, p)
                new = later + (g - later) * f  # the first step starts the average at grad
                P.Assign()(a, new)
                step = g + new * self.momentum if self.nesterov else new
            P.Assign()(p, p - step * self._typed(lr, p))
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
        lr = self.get_lr()
        b1p = P.Assign()(self.beta1_power, self.beta1_power * self.beta1)
        b2p = P.Assign()(self.beta2_power, self.beta2_power * self.beta2)
        for p, m, v, g in zip(self.parameters, self.moment1, self.moment2,
                              self._check(gradients)):
            typed = [self._typed(x, p) for x in (b1p, b2p)]
            self.apply(p, m, v, typed[0], typed[1], self._typed(lr, p), self.beta1, self.beta2,
                       self.eps, self.decay(p, g))
        return True


class AdamWeightDecay(Optimizer):
    """AdamW as MindSpore's (no bias correction): param -= lr * (m / (sqrt(v) + eps) +
    weight_decay * param)."""

    def __init__(self, params: Any, learning_rate: Any = 1e-3, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.0) -> None:
        super().__init__(learning_rate, params, 0.0)
        _check_betas(beta1, beta2, eps)
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.decay_rate = float(weight_decay)
        self.moments1, self.moments2 = self._state("adam_m"), self._state("adam_v")
        self.apply = P.AdamWeightDecay()

    def construct(self, gradients: Any) -> Any:
        lr = self.get_lr()
        for p, m, v, g in zip(self.parameters, self.moments1, self.moments2,
                              self._check(gradients)):
            self.apply(p, m, v, self._typed(lr, p), self.beta1, self.beta2, self.eps,
                       self.decay_rate, g)
        return True


def _check_betas(beta1: float, beta2: float, eps: float) -> None:
    if not (0 <= beta1 < 1 and 0 <= beta2 < 1 and eps > 0):
        raise InputError(f"need 0 <= beta1, beta2 < 1 and eps > 0; got beta1={beta1}, "
                         f"beta2={beta2}, eps={eps}", user_location())
