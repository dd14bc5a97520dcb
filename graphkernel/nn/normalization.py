"""BatchNorm1d and BatchNorm2d: gamma, beta, moving_mean, moving_variance as MindSpore names
them; GroupNorm. In inference (the default, `set_train(False)`) they normalise with the moving
statistics; in training with the batch's, and update the moving statistics after each call."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.common.initializer import init_array
from graphkernel.errors import ShapeError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tensor import Parameter
from graphkernel.ops import operations as P
from graphkernel.ops.functional import assign


class _BatchNorm(Cell):
    rank = 4

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.9,
                 affine: bool = True, gamma_init: Any = "ones", beta_init: Any = "zeros",
                 moving_mean_init: Any = "zeros", moving_var_init: Any = "ones",
                 use_batch_statistics: bool | None = None, data_format: str = "NCHW",
                 dtype: Any = np.float32) -> None:
        super().__init__()
        if not 0 <= momentum <= 1:
            raise ShapeError(f"{type(self).__name__}: momentum must be in [0, 1], got {momentum}")
        c = (num_features,)
        self.num_features = num_features
        self.gamma = Parameter(init_array(gamma_init, c, dtype), "gamma", requires_grad=affine)
        self.beta = Parameter(init_array(beta_init, c, dtype), "beta", requires_grad=affine)
        self.moving_mean = Parameter(init_array(moving_mean_init, c, dtype), "moving_mean",
                                     requires_grad=False)
        self.moving_variance = Parameter(init_array(moving_var_init, c, dtype),
                                         "moving_variance", requires_grad=False)
        self.eps, self.momentum = eps, momentum
        self.use_batch_statistics = use_batch_statistics
        # MindSpore's layer momentum keeps that much of the old statistics; its primitive's
        # momentum is the weight of the new batch.
        self.bn_train = P.BatchNorm(is_training=True, epsilon=eps, momentum=1 - momentum,
                                    data_format=data_format)
        self.bn_infer = P.BatchNorm(is_training=False, epsilon=eps, data_format=data_format)

    def construct(self, x: Any) -> Any:
        if len(x.shape) != self.rank:
            raise ShapeError(f"{type(self).__name__} expects rank-{self.rank} input, got shape "
                             f"{x.shape}")
        batch_stats = self.training if self.use_batch_statistics is None else \
            self.use_batch_statistics
        if not batch_stats:
            y, *_ = self.bn_infer(x, self.gamma, self.beta, self.moving_mean,
                                  self.moving_variance)
            return y
        y, mean, variance, _, _ = self.bn_train(x, self.gamma, self.beta, self.moving_mean,
                                                self.moving_variance)
        if self.training:
            # The moving statistics keep `momentum` of themselves (MindSpore's convention), the
            # variance unbiased; the graph writes them after each call (Graph.assigns).
            n = math.prod(x.shape) // self.num_features
            unbiased = variance * (n / max(n - 1, 1))
            keep = self.momentum
            assign(self.moving_mean, self.moving_mean * keep + mean * (1 - keep))
            assign(self.moving_variance, self.moving_variance * keep + unbiased * (1 - keep))
        return y


class BatchNorm1d(_BatchNorm):
    rank = 2


class BatchNorm2d(_BatchNorm):
    rank = 4


class GroupNorm(Cell):
    """MindSpore's nn.GroupNorm: the channels of an (N, C, ...) input split into `num_groups`
    groups, each normalised over its channels and positions (biased variance), then scaled by
    gamma and shifted by beta per channel. Built from primitives, so it fuses and its gradient
    is the composition's."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, gamma_init: Any = "ones", beta_init: Any = "zeros",
                 dtype: Any = np.float32) -> None:
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise ShapeError(f"GroupNorm: num_groups={num_groups} must be positive and divide "
                             f"num_channels={num_channels}")
        self.num_groups, self.num_channels, self.eps, self.affine = \
            num_groups, num_channels, eps, affine
        c = (num_channels,)
        self.gamma = Parameter(init_array(gamma_init, c, dtype), "gamma", requires_grad=affine)
        self.beta = Parameter(init_array(beta_init, c, dtype), "beta", requires_grad=affine)
        self.reshape = P.Reshape()
        self.mean = P.ReduceMean(keep_dims=True)
        self.square = P.Square()
        self.rsqrt = P.Rsqrt()

    def construct(self, x: Any) -> Any:
        shape = tuple(x.shape)
        if len(shape) < 2 or shape[1] != self.num_channels:
            raise ShapeError(f"GroupNorm({self.num_groups}, {self.num_channels}) expects input "
                             f"(N, {self.num_channels}, ...), got shape {shape}")
        grouped = self.reshape(x, (shape[0], self.num_groups, -1))
        mean = self.mean(grouped, 2)
        centred = grouped - mean
        variance = self.mean(self.square(centred), 2)
        normed = self.reshape(centred * self.rsqrt(variance + self.eps), shape)
        # gamma and beta broadcast over the positions after the channel axis
        per_channel = (self.num_channels,) + (1,) * (len(shape) - 2)
        return normed * self.reshape(self.gamma, per_channel) + \
            self.reshape(self.beta, per_channel)
