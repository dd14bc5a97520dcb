"""`mindspore.ops.composite` (imported as C): `GradOperation`, and the helpers MindSpore's
optimizers are written with: `MultitypeFuncGraph` (a function chosen by its arguments' types)
and `HyperMap` / `Map` (a function applied across tuples). In graph mode MindSpore resolves
these while compiling; here they run while `construct` is traced, so each call becomes the
primitives it makes, fused like any other."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.grad import GradOperation
from graphkernel.frontend.location import user_location
from graphkernel.frontend.tensor import Tensor


def _is_function(value: Any) -> bool:
    return callable(value) and not isinstance(value, (Tensor, type))


# MindSpore's type names for MultitypeFuncGraph.register, as checks on a value.
_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "Tensor": lambda v: isinstance(v, (Tensor, np.ndarray)),
    "Number": lambda v: isinstance(v, (int, float, np.number)) and not isinstance(v, bool),
    "Int": lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool),
    "Float": lambda v: isinstance(v, (float, np.floating)),
    "Bool": lambda v: isinstance(v, (bool, np.bool_)),
    "String": lambda v: isinstance(v, str),
    "Tuple": lambda v: isinstance(v, tuple),
    "List": lambda v: isinstance(v, list),
    "Dict": lambda v: isinstance(v, dict),
    "None": lambda v: v is None,
    "Function": _is_function,
}


def _type_name(value: Any) -> str:
    return next((name for name, check in _TYPE_CHECKS.items() if check(value)),
                type(value).__name__)


class MultitypeFuncGraph:
    """A function with one implementation per argument-type signature:

        add = C.MultitypeFuncGraph("add")

        @add.register("Tensor", "Tensor")
        def _add_tensors(x, y): ...

    A call runs the first registration whose types match its arguments (type names:
    "Tensor", "Number", "Int", "Float", "Bool", "String", "Tuple", "List", "Dict", "None",
    "Function")."""

    def __init__(self, name: str, read_value: bool = False) -> None:
        self.name = name
        self._entries: list[tuple[tuple[str, ...], Callable[..., Any]]] = []

    def register(self, *type_names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        unknown = [t for t in type_names if t not in _TYPE_CHECKS]
        if unknown:
            raise InputError(f"MultitypeFuncGraph {self.name!r}: type name(s) {unknown} are not "
                             f"supported; graphkernel has {sorted(_TYPE_CHECKS)}",
                             user_location())

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._entries.append((tuple(type_names), fn))
            return fn
        return decorate

    def __call__(self, *args: Any) -> Any:
        for types, fn in self._entries:
            if len(types) == len(args) and all(_TYPE_CHECKS[t](a) for t, a in zip(types, args)):
                return fn(*args)
        given = ", ".join(_type_name(a) for a in args)
        registered = "; ".join("(" + ", ".join(t) + ")" for t, _ in self._entries) or "none"
        raise InputError(f"MultitypeFuncGraph {self.name!r} has no registration for arguments "
                         f"({given}); registered: {registered}", user_location())


def _lengths(seqs: list[Any], owner: str) -> int | None:
    """The common length of the tuple/list arguments (None: no sequence among them)."""
    lengths = {len(s) for s in seqs if isinstance(s, (tuple, list))}
    if len(lengths) > 1:
        raise InputError(f"{owner}: the sequences it maps over have different lengths "
                         f"{sorted(lengths)}", user_location())
    return lengths.pop() if lengths else None


class Map:
    """`Map(fn)(xs, ys, ...)` -> (fn(xs[0], ys[0], ...), ...): one level of tuples; a
    non-sequence argument is passed to every call as it is. `reverse=True` calls the last
    elements first (the results stay in order)."""

    def __init__(self, ops: Callable[..., Any] | None = None, reverse: bool = False) -> None:
        if ops is not None and not callable(ops):
            raise InputError(f"{type(self).__name__}: ops must be callable, got "
                             f"{type(ops).__name__}", user_location())
        self.ops = ops
        self.reverse = reverse

    def _split(self, args: tuple[Any, ...]) -> tuple[Callable[..., Any], list[Any]]:
        if self.ops is not None:
            return self.ops, list(args)
        if not args or not callable(args[0]):
            raise InputError(f"{type(self).__name__}() without ops takes the function as its "
                             "first argument", user_location())
        return args[0], list(args[1:])

    def __call__(self, *args: Any) -> Any:
        fn, seqs = self._split(args)
        return self._map(fn, seqs, recurse=False)

    def _map(self, fn: Callable[..., Any], seqs: list[Any], recurse: bool) -> Any:
        n = _lengths(seqs, type(self).__name__)
        if n is None:
            return fn(*seqs)
        order = range(n - 1, -1, -1) if self.reverse else range(n)
        results: dict[int, Any] = {}
        for i in order:
            items = [s[i] if isinstance(s, (tuple, list)) else s for s in seqs]
            results[i] = self._map(fn, items, recurse) if recurse and any(
                isinstance(x, (tuple, list)) for x in items) else fn(*items)
        return tuple(results[i] for i in range(n))


class HyperMap(Map):
    """`Map` through nested tuples: every leaf gets the function."""

    def __call__(self, *args: Any) -> Any:
        fn, seqs = self._split(args)
        return self._map(fn, seqs, recurse=True)


__all__ = ["GradOperation", "HyperMap", "Map", "MultitypeFuncGraph"]
