"""MindSpore's Adam (bias-corrected, L2 decay) and AdamWeightDecay (decoupled decay)."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.tensor import Parameter
from graphkernel.frontend.tracing import user_location
from graphkernel.nn.optim.optimizer import Optimizer
from graphkernel.ops import operations as P


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
