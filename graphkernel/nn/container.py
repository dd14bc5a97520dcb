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
        self._append_named(cell, self._appended_prefix())

    def _append_named(self, cell: Cell, prefix: str) -> None:
        """Add `cell` as the next item; its parameters are named as MindSpore names those of a
        cell appended to a list: prefix + index + its own attribute path (a name it had before
        is dropped, as MindSpore's update_parameters_name drops it)."""
        index = str(len(self._order))
        self._add(index, cell)
        if self._auto_prefix and isinstance(cell, Cell):
            for path, param in cell.parameters_and_names():
                param.name = f"{prefix}{index}.{path}"

    def _appended_prefix(self) -> str:
        """What goes before the index in the names of an appended cell's parameters. A list
        already set on its parent ("layers") has items named "layers.0.weight": the prefix is
        "layers.", read off the first item's first parameter name, as MindSpore reads it: the
        part before a name component equal to that item's key, the last such component unless
        a second item's name confirms an earlier one. (So MindSpore names the parameters of a
        list built by appends before it is set on its parent "0.blocks.1.blocks.0.weight" when
        its items hold lists of their own, as MindCV's Swin does: checkpoints carry those
        names.)"""
        firsts = []  # (key, first parameter name) of the first two items with parameters
        for key, item in self._cells.items():
            named = item.parameters_and_names()
            if named:
                firsts.append((key, named[0][1].name.split(".")))
                if len(firsts) == 2:
                    break
        if not firsts:
            return ""
        (key, parts), prefix = firsts[0], ""
        for i, part in enumerate(parts):
            if part == key:
                prefix = "".join(f"{p}." for p in parts[:i])
                if len(firsts) == 2 and i < len(firsts[1][1]) and firsts[1][1][i] == firsts[1][0]:
                    break
        return prefix


class SequentialCell(_Listed):
    def __init__(self, *args: Any) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], (OrderedDict, dict)):
            for name, cell in args[0].items():
                self._add(str(name), cell)
            return
        cells = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
        for cell in cells:  # named by index alone, not by append's rule (as MindSpore)
            self._add(str(len(self._order)), cell)

    def construct(self, x: Any) -> Any:
        for cell in self._order:
            x = cell(x)
        return x


class CellList(_Listed):
    def __init__(self, args: Any = None) -> None:
        super().__init__()
        for cell in args or ():  # named by index alone, not by append's rule (as MindSpore)
            self._add(str(len(self._order)), cell)

    def extend(self, cells: Any) -> CellList:
        prefix = self._appended_prefix()  # once, before the first is added (as MindSpore)
        for cell in cells:
            self._append_named(cell, prefix)
        return self

    def construct(self, *inputs: Any) -> Any:
        raise InputError("a CellList is not called: index it or loop over it in construct")
