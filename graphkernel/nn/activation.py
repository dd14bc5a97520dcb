"""Activation cells by MindSpore's names, and `get_activation` for Dense(activation='relu')."""
from __future__ import annotations

from typing import Any

from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell
from graphkernel.ops import operations as P


class _Unary(Cell):
    """A cell applying one primitive."""

    primitive: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.op = type(self).primitive()

    def construct(self, x: Any) -> Any:
        return self.op(x)


class ReLU(_Unary):
    primitive = P.ReLU


class ReLU6(_Unary):
    primitive = P.ReLU6


class Tanh(_Unary):
    primitive = P.Tanh


class Sigmoid(_Unary):
    primitive = P.Sigmoid


class SiLU(_Unary):
    primitive = P.SiLU


class Softsign(_Unary):
    primitive = P.Softsign


class HSwish(_Unary):
    primitive = P.HSwish


class HSigmoid(Cell):
    """relu6(x + 3) / 6, MindSpore's hard sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.relu6 = P.ReLU6()

    def construct(self, x: Any) -> Any:
        return self.relu6(x + 3.0) / 6.0


class FastGelu(_Unary):
    primitive = P.FastGeLU


class Identity(Cell):
    def construct(self, x: Any) -> Any:
        return x


class GELU(Cell):
    def __init__(self, approximate: bool = True) -> None:
        super().__init__()
        self.gelu = P.GeLU(approximate="tanh" if approximate else "none")

    def construct(self, x: Any) -> Any:
        return self.gelu(x)


class Softmax(Cell):
    def __init__(self, axis: int = -1) -> None:
        super().__init__()
        self.softmax = P.Softmax(axis=axis)

    def construct(self, x: Any) -> Any:
        return self.softmax(x)


class LogSoftmax(Cell):
    def __init__(self, axis: int = -1) -> None:
        super().__init__()
        self.log_softmax = P.LogSoftmax(axis=axis)

    def construct(self, x: Any) -> Any:
        return self.log_softmax(x)


_BY_NAME: dict[str, Any] = {
    "relu": ReLU, "relu6": ReLU6, "tanh": Tanh, "sigmoid": Sigmoid, "silu": SiLU,
    "softsign": Softsign, "hswish": HSwish, "hsigmoid": HSigmoid, "fast_gelu": FastGelu,
    "gelu": GELU, "softmax": Softmax, "logsoftmax": LogSoftmax,
}


def get_activation(name: str | Cell | None) -> Cell | None:
    """An activation cell from MindSpore's name for it (or the cell itself)."""
    if name is None or isinstance(name, Cell):
        return name
    key = str(name).lower()
    if key not in _BY_NAME:
        raise InputError(f"unknown activation {name!r}; graphkernel has "
                         f"{', '.join(sorted(_BY_NAME))}")
    return _BY_NAME[key]()
