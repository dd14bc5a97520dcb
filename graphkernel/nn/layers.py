"""Basic layers, MindSpore's names, arguments and defaults: Dense, LayerNorm, Flatten, Dropout,
Embedding. Weights are Parameters initialised by name (graphkernel/common/initializer.py)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.common.initializer import init_array
from graphkernel.errors import InputError, ShapeError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tensor import Parameter
from graphkernel.nn.activation import get_activation
from graphkernel.ops import operations as P


def _init(init: Any, shape: tuple[int, ...], dtype: Any, default: str,
          rng: np.random.Generator | None = None, **params: Any) -> np.ndarray:
    """`init` by name, Initializer, number or array; None is the layer's default (`default`,
    with `params`). A seeded `rng` draws the default uniform initialisation locally."""
    if init is None and rng is not None:
        bound = params["bound"]
        return rng.uniform(-bound, bound, shape).astype(dtype)
    if isinstance(init, str) and init.lower() == "uniform" and "bound" in params:
        return init_array("uniform", shape, dtype, scale=params["bound"])
    if init is None:  # the layer's default takes the layer's arguments
        return init_array(default, shape, dtype,
                          **{k: v for k, v in params.items() if k != "bound"})
    return init_array(init, shape, dtype)


class Dense(Cell):
    """y = activation(x @ W^T + b), W of shape [out, in]; x may have any rank >= 2 (the last
    axis is the features). Default initialisation as MindSpore 2.x: HeUniform(sqrt(5)) weights
    and Uniform(1/sqrt(in)) bias; `seed` (graphkernel's) draws both from a private stream."""

    def __init__(self, in_channels: int, out_channels: int, weight_init: Any = None,
                 bias_init: Any = None, has_bias: bool = True, activation: Any = None,
                 dtype: Any = np.float32, seed: int | None = None) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        rng = np.random.default_rng(seed) if seed is not None else None
        bound = 1.0 / math.sqrt(in_channels) if in_channels else 0.0
        self.weight = Parameter(_init(weight_init, (out_channels, in_channels), dtype,
                                      "he_uniform", rng, negative_slope=math.sqrt(5),
                                      bound=bound), "weight")
        self.has_bias = has_bias
        self.bias = None  # MindSpore's: None without a bias
        if has_bias:
            self.bias = Parameter(_init(bias_init, (out_channels,), dtype, "uniform", rng,
                                        bound=bound), "bias")
            self.bias_add = P.BiasAdd()
            self.add = P.Add()
        self.matmul = P.MatMul(transpose_b=True)
        self.activation = get_activation(activation)

    def construct(self, x: Any) -> Any:
        if len(x.shape) < 2 or x.shape[-1] != self.in_channels:
            raise ShapeError(f"Dense({self.in_channels}, {self.out_channels}) needs input with "
                             f"{self.in_channels} features on its last axis, got {x.shape}")
        y = self.matmul(x, self.weight)
        if self.has_bias:
            # BiasAdd's channel axis is 1 for rank > 2: N-d Dense adds along the last axis.
            y = self.bias_add(y, self.bias) if len(x.shape) == 2 else self.add(y, self.bias)
        if self.activation is not None:
            y = self.activation(y)
        return y


class LayerNorm(Cell):
    """LayerNorm over the trailing `normalized_shape` axes with gamma (ones) and beta (zeros)."""

    def __init__(self, normalized_shape: tuple[int, ...] | list[int], begin_norm_axis: int = -1,
                 begin_params_axis: int = -1, gamma_init: Any = "ones", beta_init: Any = "zeros",
                 epsilon: float = 1e-7, dtype: Any = np.float32) -> None:
        super().__init__()
        shape = tuple(normalized_shape)
        self.normalized_shape = shape
        self.begin_norm_axis, self.begin_params_axis = begin_norm_axis, begin_params_axis
        self.epsilon = epsilon
        self.gamma = Parameter(init_array(gamma_init, shape, dtype), "gamma")
        self.beta = Parameter(init_array(beta_init, shape, dtype), "beta")
        self.layer_norm = P.LayerNorm(begin_norm_axis=begin_norm_axis,
                                      begin_params_axis=begin_params_axis, epsilon=epsilon)

    def construct(self, x: Any) -> Any:
        y, _, _ = self.layer_norm(x, self.gamma, self.beta)
        return y


class Flatten(Cell):
    """Axes start_dim..end_dim merged into one (MindSpore 2.x: from axis 1 to the last)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim
        self.reshape = P.Reshape()

    def construct(self, x: Any) -> Any:
        rank = len(x.shape)
        start, end = self.start_dim % max(rank, 1), self.end_dim % max(rank, 1)
        if start > end:
            raise ShapeError(f"Flatten: start_dim {self.start_dim} is after end_dim "
                             f"{self.end_dim} for shape {x.shape}")
        merged = math.prod(x.shape[start:end + 1])
        target = tuple(x.shape[:start]) + (merged,) + tuple(x.shape[end + 1:])
        dynamic = [i for i, d in enumerate(target) if not isinstance(d, (int, np.integer))]
        if len(dynamic) == 1:  # a dynamic size (set_inputs): Reshape infers it from -1
            target = target[:dynamic[0]] + (-1,) + target[dynamic[0] + 1:]
        return self.reshape(x, target)


class Dropout(Cell):
    """Zeroes each element with probability p while training (scaling the rest by 1/(1-p));
    the identity otherwise (MindSpore 2.x: `p`, or the older `keep_prob`)."""

    def __init__(self, keep_prob: float | None = None, p: float | None = None,
                 dtype: Any = np.float32, seed: int = 0) -> None:
        super().__init__()
        if keep_prob is not None and p is not None:
            raise InputError("Dropout takes keep_prob or p, not both")
        drop = (1 - keep_prob) if keep_prob is not None else (0.5 if p is None else p)
        if not 0 <= drop < 1:
            raise InputError(f"Dropout probability must be in [0, 1), got {drop}")
        self.p = drop
        self.dropout = P.Dropout(keep_prob=1 - drop, Seed0=seed, Seed1=0) if drop else None

    def construct(self, x: Any) -> Any:
        if not self.training or self.dropout is None:
            return x
        out, _ = self.dropout(x)
        return out


class Embedding(Cell):
    """A lookup table [vocab_size, embedding_size]; `padding_idx`'s row starts at zero."""

    def __init__(self, vocab_size: int, embedding_size: int, use_one_hot: bool = False,
                 embedding_table: Any = "normal", dtype: Any = np.int32,
                 padding_idx: int | None = None) -> None:
        super().__init__()
        if padding_idx is not None and not 0 <= padding_idx < vocab_size:
            raise InputError(f"Embedding: padding_idx {padding_idx} is outside the vocabulary "
                             f"of {vocab_size}")
        self.vocab_size, self.embedding_size = vocab_size, embedding_size
        table = init_array(embedding_table, (vocab_size, embedding_size), np.float32)
        if padding_idx is not None:
            table[padding_idx] = 0
        self.embedding_table = Parameter(table, "embedding_table")
        self.use_one_hot = use_one_hot
        self.gather = P.Gather()
        self.one_hot = P.OneHot()
        self.matmul = P.MatMul()

    def construct(self, ids: Any) -> Any:
        if self.use_one_hot:
            hot = self.one_hot(ids, self.vocab_size, 1.0, 0.0)
            return self.matmul(hot, self.embedding_table)
        return self.gather(self.embedding_table, ids, 0)
