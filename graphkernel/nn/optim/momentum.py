"""MindSpore's Momentum: ApplyMomentum per parameter."""
from __future__ import annotations

from typing import Any

from graphkernel.errors import InputError
from graphkernel.frontend.tracing import user_location
from graphkernel.nn.optim.optimizer import Optimizer
from graphkernel.ops import operations as P


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
