"""`graphkernel.amp`, MindSpore's `mindspore.amp`: `auto_mixed_precision(network, amp_level)`
and the loss-scale managers `Model(loss_scale_manager=...)` takes.

Mixed precision is `Cell.to_float` (frontend/cell.py): a cell set to float16 casts its float
inputs to float16 and its ops read float Parameters through a Cast, so the weights, their
gradients and the optimizer's updates stay float32 (master weights) while the arithmetic runs in
float16. The levels, as MindSpore's:

- "O0": nothing changes.
- "O1": the cells on MindSpore's white list (Dense, Conv2d) compute in float16, their outputs
  cast back to float32; everything else stays float32.
- "O2": the whole network computes in float16 except the cells on the black list (BatchNorm,
  LayerNorm), which compute in float32 and hand float16 on; the network's outputs are float32.
- "O3": the whole network computes in float16, BatchNorm included; its outputs are float32.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.location import user_location
from graphkernel.ir import types as T
from graphkernel.nn import BatchNorm1d, BatchNorm2d, Conv2d, Dense, LayerNorm

AMP_LEVELS = ("O0", "O1", "O2", "O3")
# MindSpore's AMP_WHITE_LIST and AMP_BLACK_LIST, as far as graphkernel has the cells.
AMP_WHITE_LIST: tuple[type[Cell], ...] = (Dense, Conv2d)
AMP_BLACK_LIST: tuple[type[Cell], ...] = (BatchNorm1d, BatchNorm2d, LayerNorm)


def _set(cell: Cell, name: str, dtype: np.dtype) -> None:
    object.__setattr__(cell, name, dtype)


def auto_mixed_precision(network: Cell, amp_level: str = "O0", dtype: Any = T.float16) -> Cell:
    """MindSpore's `amp.auto_mixed_precision`: `network` set to compute at `amp_level` (see the
    module's docstring), changed in place and returned."""
    where = user_location()
    if not isinstance(network, Cell):
        raise InputError(f"auto_mixed_precision takes a Cell, got {type(network).__name__}",
                         where)
    if amp_level not in AMP_LEVELS:
        raise InputError(f"auto_mixed_precision: amp_level must be one of "
                         f"{', '.join(AMP_LEVELS)}, got {amp_level!r}", where)
    low = T.to_dtype(dtype)
    if low not in (T.float16, T.float32):
        raise InputError(f"auto_mixed_precision: dtype must be float16 or float32, got "
                         f"{low.name}", where)
    if amp_level == "O0":
        return network
    if amp_level == "O1":
        for _, cell in network.cells_and_names():
            if isinstance(cell, AMP_WHITE_LIST):
                cell.to_float(low)
                _set(cell, "_output_dtype", T.float32)
        return network
    network.to_float(low)
    if amp_level == "O2":
        for _, cell in network.cells_and_names():
            if isinstance(cell, AMP_BLACK_LIST):
                cell.to_float(T.float32)
                _set(cell, "_output_dtype", low)
    _set(network, "_output_dtype", T.float32)
    return network


class LossScaleManager:
    """The base of MindSpore's loss-scale managers: the scale the loss is multiplied by before
    the backward pass (gradients are divided by it again before the update)."""

    def get_loss_scale(self) -> float:
        raise NotImplementedError

    def update_loss_scale(self, overflow: bool) -> None:
        raise NotImplementedError

    def get_drop_overflow_update(self) -> bool:
        raise NotImplementedError

    def get_update_cell(self) -> LossScaleManager:
        """What nn.TrainOneStepWithLossScaleCell takes as scale_sense: the manager itself
        (MindSpore gives a cell that updates the scale in the graph; here the step asks the
        manager on the host)."""
        return self


def _positive(value: Any, name: str, owner: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or \
            not np.isfinite(value):
        raise InputError(f"{owner}: {name} must be a positive number, got {value!r}",
                         user_location())
    return float(value)


class FixedLossScaleManager(LossScaleManager):
    """MindSpore's `FixedLossScaleManager(loss_scale=128.0, drop_overflow_update=True)`: a
    constant scale; with drop_overflow_update, a step whose gradients overflow (Inf or NaN)
    leaves the weights and the optimizer's state as they were."""

    def __init__(self, loss_scale: float = 128.0, drop_overflow_update: bool = True) -> None:
        self.loss_scale = _positive(loss_scale, "loss_scale", "FixedLossScaleManager")
        self.drop_overflow_update = bool(drop_overflow_update)

    def get_loss_scale(self) -> float:
        return self.loss_scale

    def update_loss_scale(self, overflow: bool) -> None:
        """A fixed scale does not change."""

    def get_drop_overflow_update(self) -> bool:
        return self.drop_overflow_update


class DynamicLossScaleManager(LossScaleManager):
    """MindSpore's `DynamicLossScaleManager(init_loss_scale=2**24, scale_factor=2,
    scale_window=2000)`: a step that overflows is dropped and divides the scale by
    scale_factor (not below 1); scale_window steps in a row without overflow multiply it."""

    def __init__(self, init_loss_scale: float = 2 ** 24, scale_factor: float = 2,
                 scale_window: int = 2000) -> None:
        owner = "DynamicLossScaleManager"
        self.loss_scale = _positive(init_loss_scale, "init_loss_scale", owner)
        self.scale_factor = _positive(scale_factor, "scale_factor", owner)
        if isinstance(scale_window, bool) or not isinstance(scale_window, int) or \
                scale_window < 1:
            raise InputError(f"{owner}: scale_window must be an int >= 1, got "
                             f"{scale_window!r}", user_location())
        self.scale_window = scale_window
        self.good_steps = 0

    def get_loss_scale(self) -> float:
        return self.loss_scale

    def update_loss_scale(self, overflow: bool) -> None:
        if overflow:
            self.loss_scale = max(self.loss_scale / self.scale_factor, 1.0)
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == self.scale_window:
            self.loss_scale *= self.scale_factor
            self.good_steps = 0

    def get_drop_overflow_update(self) -> bool:
        return True


__all__ = ["AMP_BLACK_LIST", "AMP_LEVELS", "AMP_WHITE_LIST", "DynamicLossScaleManager",
           "FixedLossScaleManager", "LossScaleManager", "auto_mixed_precision"]
