"""What a cell's `construct` takes: its input names, how many, and the types of one call's
arguments (the signature a compiled graph is built for)."""
from __future__ import annotations

import inspect
from typing import Any, Protocol

import numpy as np

from graphkernel.errors import DTypeError, InputError
from graphkernel.frontend.location import user_location
from graphkernel.frontend.tensor import Tensor
from graphkernel.ir import types as T
from graphkernel.ir.types import TensorType


class CellLike(Protocol):
    """What compiling needs of a cell (frontend/cell.py `Cell`)."""

    _compiled: dict[Any, Any]

    def construct(self, *inputs: Any) -> Any: ...

    def _traced_call(self, inputs: tuple[Any, ...]) -> Any: ...


def input_names(cell: CellLike, count: int) -> list[str]:
    try:
        params = [p for p in inspect.signature(cell.construct).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        names = [p.name for p in params]
    except (TypeError, ValueError):
        names = []
    names += [f"input{i}" for i in range(len(names), count)]
    return names[:count]


def check_count(args: tuple[Any, ...], cell: CellLike) -> None:
    """The number of inputs `construct` takes (not counting self), as an InputError."""
    try:
        params = list(inspect.signature(cell.construct).parameters.values())
    except (TypeError, ValueError):
        return
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) <= len(args) <= len(positional):
        return
    names = ", ".join(p.name for p in positional) or "none"
    want = str(len(positional)) if len(required) == len(positional) else \
        f"{len(required)} to {len(positional)}"
    raise InputError(f"{type(cell).__name__}.construct takes {want} input(s) ({names}), got "
                     f"{len(args)}", user_location())


def signature(args: tuple[Any, ...], cell: CellLike) -> list[TensorType]:
    check_count(args, cell)
    names = input_names(cell, len(args))
    types = []
    for arg, name in zip(args, names):
        if isinstance(arg, (Tensor, np.ndarray)):
            try:
                dtype = T.to_dtype(arg.dtype)
            except DTypeError as err:
                raise InputError(f"{type(cell).__name__} input {name!r}: {err.problem}",
                                 user_location()) from None
            types.append(TensorType(tuple(arg.shape), dtype))
        else:
            raise InputError(f"{type(cell).__name__} input {name!r} must be a Tensor or a numpy "
                             f"array in graph mode, got {type(arg).__name__} ({arg!r:.40})",
                             user_location())
    return types
