"""`@jit`: a function (or a Cell's construct) compiled in graph mode when called."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tracing import current_tracer


class _FunctionCell(Cell):
    """A function as a cell: construct calls it."""

    fn: Callable[..., Any]

    def __init__(self, fn: Callable[..., Any], owner: Cell | None = None) -> None:
        super().__init__(auto_prefix=False)
        object.__setattr__(self, "fn", fn)
        if owner is not None:
            object.__setattr__(self, "owner", owner)
            self._cells["owner"] = owner  # the owner's weights are this graph's weights

    def construct(self, *args: Any) -> Any:
        owner = self.__dict__.get("owner")
        return self.fn(owner, *args) if owner is not None else self.fn(*args)


def jit(function: Callable[..., Any] | None = None, **options: Any) -> Any:
    """MindSpore's `@jit` (also `@jit(...)` with options, which graphkernel ignores: the
    context decides fusion). Each call compiles for its input signature once, then runs the
    compiled graph; called while another graph is traced, the function is inlined."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        cells: dict[int, _FunctionCell] = {}

        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            owner = args[0] if args and isinstance(args[0], Cell) else None
            if current_tracer() is not None:
                return fn(*args)
            key = id(owner)
            if key not in cells:
                cells[key] = _FunctionCell(fn, owner)
            rest = args[1:] if owner is not None else args
            from graphkernel.frontend.compile import compile_cached
            return compile_cached(cells[key], rest)(*rest)
        return wrapper
    return decorate(function) if function is not None else decorate
