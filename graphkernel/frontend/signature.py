"""What a cell's `construct` takes: its input names, how many, and the types of one call's
arguments (the signature a compiled graph is built for)."""
from __future__ import annotations

import inspect
from typing import Any, Protocol

import numpy as np

from graphkernel.errors import DTypeError, InputError
from graphkernel.frontend.dynamic import is_declaration
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


def construct_arity(cell: CellLike) -> tuple[list[str], int] | None:
    """The names of the positional inputs `construct` takes (not counting self) and how many
    of them are required; None when it takes any number (or cannot be inspected)."""
    try:
        params = list(inspect.signature(cell.construct).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [p.name for p in positional], sum(p.default is p.empty for p in positional)


def check_count(args: tuple[Any, ...], cell: CellLike) -> None:
    """The number of inputs `construct` takes, as an InputError."""
    arity = construct_arity(cell)
    if arity is None or arity[1] <= len(args) <= len(arity[0]):
        return
    positional, required = arity
    names = ", ".join(positional) or "none"
    want = str(len(positional)) if required == len(positional) else \
        f"{required} to {len(positional)}"
    raise InputError(f"{type(cell).__name__}.construct takes {want} input(s) ({names}), got "
                     f"{len(args)}", user_location())


def signature(args: tuple[Any, ...], cell: CellLike) -> list[TensorType]:
    check_count(args, cell)
    names = input_names(cell, len(args))
    types = []
    for arg, name in zip(args, names):
        if is_declaration(arg):  # its shape says -1 for a dynamic size: no size to build for
            raise InputError(f"{type(cell).__name__} input {name!r} is {arg!r}: a declaration "
                             "of an input, for Cell.set_inputs, graphkernel.compile or "
                             "graphkernel.export; call the cell on Tensors holding data",
                             user_location())
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
