"""Layers: small Cells over the primitives, with numpy-initialised Parameters."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tensor import Parameter
from graphkernel.ops import operations as P


class Dense(Cell):
    """y = x @ W^T + b, W of shape [out, in] (MindSpore's layout), seeded initialisation."""

    def __init__(self, in_channels: int, out_channels: int, has_bias: bool = True,
                 activation: Cell | None = None, seed: int = 0, dtype: Any = np.float32) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        bound = 1.0 / np.sqrt(in_channels)
        self.weight = Parameter(rng.uniform(-bound, bound, (out_channels, in_channels))
                                .astype(dtype), "weight")
        self.has_bias = has_bias
        if has_bias:
            self.bias = Parameter(rng.uniform(-bound, bound, (out_channels,)).astype(dtype),
                                  "bias")
            self.bias_add = P.BiasAdd()
        self.matmul = P.MatMul(transpose_b=True)
        self.activation = activation

    def construct(self, x: Any) -> Any:
        y = self.matmul(x, self.weight)
        if self.has_bias:
            y = self.bias_add(y, self.bias)
        if self.activation is not None:
            y = self.activation(y)
        return y


class GELU(Cell):
    def __init__(self, approximate: bool = True) -> None:
        super().__init__()
        self.gelu = P.GeLU(approximate="tanh" if approximate else "none")

    def construct(self, x: Any) -> Any:
        return self.gelu(x)


class ReLU(Cell):
    def __init__(self) -> None:
        super().__init__()
        self.relu = P.ReLU()

    def construct(self, x: Any) -> Any:
        return self.relu(x)


class Softmax(Cell):
    def __init__(self, axis: int = -1) -> None:
        super().__init__()
        self.softmax = P.Softmax(axis=axis)

    def construct(self, x: Any) -> Any:
        return self.softmax(x)


class LayerNorm(Cell):
    """LayerNorm over the trailing `normalized_shape` axes with gamma (ones) and beta (zeros)."""

    def __init__(self, normalized_shape: tuple[int, ...] | list[int], begin_norm_axis: int = -1,
                 begin_params_axis: int = -1, epsilon: float = 1e-7, dtype: Any = np.float32
                 ) -> None:
        super().__init__()
        shape = tuple(normalized_shape)
        self.gamma = Parameter(np.ones(shape, dtype), "gamma")
        self.beta = Parameter(np.zeros(shape, dtype), "beta")
        self.layer_norm = P.LayerNorm(begin_norm_axis=begin_norm_axis,
                                      begin_params_axis=begin_params_axis, epsilon=epsilon)

    def construct(self, x: Any) -> Any:
        y, _, _ = self.layer_norm(x, self.gamma, self.beta)
        return y


class SequentialCell(Cell):
    def __init__(self, *cells: Cell) -> None:
        super().__init__()
        if len(cells) == 1 and isinstance(cells[0], (list, tuple)):
            cells = tuple(cells[0])
        self._order = []
        for i, cell in enumerate(cells):
            setattr(self, f"cell{i}", cell)
            self._order.append(cell)

    def construct(self, x: Any) -> Any:
        for cell in self._order:
            x = cell(x)
        return x
