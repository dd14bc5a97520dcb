"""MindSpore's SGD (momentum, dampening, nesterov)."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.tensor import Parameter
from graphkernel.frontend.tracing import user_location
from graphkernel.nn.optim.optimizer import Optimizer
from graphkernel.ops import operations as P


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
