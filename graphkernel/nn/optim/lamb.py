"""MindSpore's Lamb (mindspore.nn.optim.lamb)."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.frontend.tensor import Parameter
from graphkernel.nn.optim.adam import _check_betas
from graphkernel.nn.optim.optimizer import Optimizer
from graphkernel.ops import operations as P


class Lamb(Optimizer):
    """MindSpore's Lamb (You et al.), written as MindSpore's graph-kernel path writes it: per
    parameter, LambApplyOptimizerAssign's Adam-style update (bias-corrected at step t, plus
    weight_decay * param), then LambApplyWeightAssign's step param -= lr * |param| / |update| *
    update (the trust ratio 1 where either norm is 0)."""

    def __init__(self, params: Any, learning_rate: Any, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.0) -> None:
        super().__init__(learning_rate, params, weight_decay)
        _check_betas(beta1, beta2, eps)
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.moments1, self.moments2 = self._state("lamb_m"), self._state("lamb_v")
        self.steps = Parameter(np.zeros((), self.scalar_dtype), "lamb_steps",
                               requires_grad=False)
        self.optimizer_step = P.LambApplyOptimizerAssign()
        self.weight_step = P.LambApplyWeightAssign()
        self.sum, self.sqrt = P.ReduceSum(), P.Sqrt()

    def _norm(self, x: Any) -> Any:
        return self.sqrt(self.sum(x * x))

    def construct(self, gradients: Any) -> Any:
        lrs = self.parameter_lrs()
        steps = P.AssignAdd()(self.steps, 1.0)  # t = 1 at the first step
        for i, (p, m, v, g) in enumerate(zip(self.parameters, self.moments1, self.moments2,
                                             self._check(gradients))):
            update, _, _ = self.optimizer_step(
                g, v, m, p, self.beta1, 1.0 - self.beta1, self.beta2, 1.0 - self.beta2,
                self.eps, self._typed(steps, p), 1.0, self.weight_decays[i])
            self.weight_step(self._norm(p), self._norm(update), self._typed(lrs[i], p), update,
                             p)
        return True
