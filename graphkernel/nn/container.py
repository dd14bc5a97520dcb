"""Containers: SequentialCell (a list or an OrderedDict of cells, run in order) and CellList
(cells a construct indexes or loops over). Their cells are named "0", "1", ... (or by the dict's
keys), so parameters are "0.weight", "layers.1.bias" as in MindSpore."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell


class _Listed(Cell):
    _order: tuple[Cell, ...]

    def __init__(self) -> None:
        super().__init__()
        # A tuple, replaced on each append: a graph that ran the cells guards it by identity
        # (a list appended to in place would go unseen: frontend/guards.py).
        object.__setattr__(self, "_order", ())

    def _add(self, name: str, cell: Any) -> None:
        if not isinstance(cell, Cell):
            raise InputError(f"{type(self).__name__} holds cells, got a {type(cell).__name__}")
        setattr(self, name, cell)
        object.__setattr__(self, "_order", (*self._order, cell))

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[Cell]:
        return iter(self._order)

    def __getitem__(self, index: int) -> Cell:
        return self._order[index]

    def append(self, cell: Cell) -> None:
        self._add(str(len(self._order)), cell)


class SequentialCell(_Listed):
    def __init__(self, *args: Any) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], (OrderedDict, dict)):
            for name, cell in args[0].items():
                self._add(str(name), cell)
            return
        cells = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
        for cell in cells:
            self.append(cell)

    def construct(self, x: Any) -> Any:
        for cell in self._order:
            x = cell(x)
        return x


class CellList(_Listed):
    def __init__(self, args: Any = None) -> None:
        super().__init__()
        for cell in args or ():
            self.append(cell)

    def extend(self, cells: Any) -> CellList:
        for cell in cells:
            self.append(cell)
        return self

    def construct(self, *inputs: Any) -> Any:
        raise InputError("a CellList is not called: index it or loop over it in construct")
