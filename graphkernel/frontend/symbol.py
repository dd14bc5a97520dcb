"""`Symbol`, MindSpore's symbolic dimension for `Cell.set_inputs`.

`Tensor(shape=[s, 4], dtype=float32)` with `s = Symbol(...)` declares a dynamic dimension with
constraints on its size, checked on every call: at least `min`, at most `max` (when it is above
`min`), `remainder` modulo `divisor`. The default min of 1 is not checked (a size 0 runs as for
None, and the cell keeps its compiled entry's per-call path: a check costs ~12 us a call). As in
MindSpore, the dimensions that carry one Symbol object all have the same size only when it is
`unique`; otherwise they share the constraints and each is a dynamic dimension of its own.
`Symbol.named("batch")` is a unique Symbol with a name (the label errors use), for importers
that map named dimensions (ONNX's `dim_param`) onto one.

A name is only a label: the symbols of compiled graphs are named by the compiler (N, M, ...;
frontend/dynamic.py), so no text from a user or a file reaches generated code.
"""
from __future__ import annotations

from typing import Any

from graphkernel.errors import InputError, ShapeError
from graphkernel.frontend.location import user_location


def _whole(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(f"Symbol {what} must be an int, got {value!r} "
                         f"({type(value).__name__})", user_location())
    return value


class Symbol:
    """A dynamic dimension's size: `divisor * k + remainder` for some k, between `min` and
    `max` (`max` counts only when it is above `min`); `unique`: every dimension carrying this
    object has one size."""

    __slots__ = ("max", "min", "divisor", "remainder", "unique", "name")

    def __init__(self, max: int = 0, min: int = 1, divisor: int = 1, remainder: int = 0,
                 unique: bool = False, **kwargs: Any) -> None:
        name = kwargs.pop("name", None)
        if kwargs:
            raise InputError(f"Symbol takes max, min, divisor, remainder, unique and name; got "
                             f"{', '.join(sorted(kwargs))}", user_location())
        self.max = _whole(max, "max")
        self.min = _whole(min, "min")
        self.divisor = _whole(divisor, "divisor")
        self.remainder = _whole(remainder, "remainder")
        if not isinstance(unique, bool):
            raise InputError(f"Symbol unique must be True or False, got {unique!r}",
                             user_location())
        self.unique = unique
        if name is not None and (not isinstance(name, str) or not name):
            raise InputError(f"Symbol name must be a non-empty str, got {name!r}",
                             user_location())
        self.name: str | None = name
        if self.min < 1:
            raise ShapeError(f"Symbol min must be positive, got {self.min}", user_location())
        if self.divisor < 1:
            raise ShapeError(f"Symbol divisor must be positive, got {self.divisor}",
                             user_location())
        if not 0 <= self.remainder < self.divisor:
            raise ShapeError(f"Symbol remainder must be in [0, divisor) = [0, {self.divisor}), "
                             f"got {self.remainder}", user_location())

    @classmethod
    def named(cls, name: str, *, max: int = 0, min: int = 1, divisor: int = 1,
              remainder: int = 0) -> Symbol:
        """One named dynamic dimension: every dimension carrying it has the same size (a
        unique Symbol); `name` labels it in errors."""
        return cls(max=max, min=min, divisor=divisor, remainder=remainder, unique=True,
                   name=name)

    @property
    def bounded(self) -> bool:
        """Whether `max` limits the size (MindSpore: only when it is above `min`)."""
        return self.max > self.min

    def __repr__(self) -> str:
        parts = [f"name={self.name!r}"] if self.name is not None else []
        parts += [f"{key}={getattr(self, key)!r}" for key, default in
                  (("max", 0), ("min", 1), ("divisor", 1), ("remainder", 0), ("unique", False))
                  if getattr(self, key) != default]
        return f"Symbol({', '.join(parts)})"
