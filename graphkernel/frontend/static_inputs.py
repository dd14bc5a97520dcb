"""Cell inputs that are not tensors, as MindSpore's graph mode takes them: Python numbers,
strings, dtypes (`mstype.float16`), None and tuples or lists of them are constants baked into the
graph (one compile per value); tuples and lists holding Tensors pass each Tensor as a graph
input (AddN((x, y)))."""
from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.location import user_location
from graphkernel.frontend.tensor import Tensor

_CONSTANTS = (bool, int, float, str, type(None), np.generic, np.dtype)


def has_static(inputs: tuple[Any, ...]) -> bool:
    return not all(isinstance(a, (Tensor, np.ndarray)) for a in inputs)


def _spec(value: Any, where: str) -> Any:
    """A hashable description of one argument: tensors by type, constants by value."""
    if isinstance(value, (Tensor, np.ndarray)):
        return ("tensor", tuple(value.shape), np.dtype(value.dtype).str)
    if isinstance(value, _CONSTANTS):
        return ("const", type(value).__name__, value)
    if isinstance(value, (tuple, list)):
        return ("seq", type(value) is list, tuple(_spec(v, where) for v in value))
    raise InputError(f"{where} is a {type(value).__name__} ({value!r:.40}); graph mode takes "
                     "Tensors, numbers, strings, dtypes, None, and tuples or lists of them",
                     user_location())


def leaves(value: Any) -> list[Any]:
    """The tensors of an argument, depth first."""
    if isinstance(value, (Tensor, np.ndarray)):
        return [value]
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in leaves(v)]
    return []


def _rebuild(value: Any, tensors: list[Any]) -> Any:
    if isinstance(value, (Tensor, np.ndarray)):
        return tensors.pop(0)
    if isinstance(value, (tuple, list)):
        return type(value)(_rebuild(v, tensors) for v in value)
    return value


def _leaf_names(name: str, value: Any) -> list[str]:
    if isinstance(value, (Tensor, np.ndarray)):
        return [name]
    if isinstance(value, (tuple, list)):
        return [n for i, v in enumerate(value) for n in _leaf_names(f"{name}_{i}", v)]
    return []


def bound_cell(cell: Any, inputs: tuple[Any, ...], names: list[str]) -> Any:
    """A cell taking only the tensors of `inputs`, calling `cell` with the constants in place."""
    example = inputs
    leaf_names = [n for name, arg in zip(names, example) for n in _leaf_names(name, arg)]

    def construct(*tensors: Any) -> Any:
        return cell._traced_call(_rebuild(example, list(tensors)))

    construct.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # what inspect reads
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in leaf_names])
    bound = type(type(cell).__name__, (), {})()
    bound.construct = construct
    bound._traced_call = lambda args: construct(*args)
    bound._compiled = {}
    bound._cells = {"cell": cell}  # traced with the cell's guards (frontend/guards.py)
    return bound


class StaticCall:
    """A compiled cell called with the full arguments: passes their tensors on."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled

    def __call__(self, *args: Any) -> Any:
        return self.compiled(*leaves(args))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled, name)


def cache_key(inputs: tuple[Any, ...], names: list[str], cell_name: str) -> Any:
    return tuple(_spec(a, f"{cell_name} input {n!r}") for a, n in zip(inputs, names))
