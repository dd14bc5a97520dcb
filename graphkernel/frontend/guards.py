"""Guards: what a compiled graph was built from besides its input types, and the per-call check.

While `construct` is traced, every attribute it reads from the cells it runs (the cell and its
sub-cells, at any depth) is recorded: plain values (numbers, strings, flags, None, tuples of them)
by value, everything else (Parameters, sub-cells, primitives, arrays) by identity. Each read also
notes the object the cell's own `__dict__` held under that name (or that it held none). Every
call checks, for every read, that the dict still holds that very object: a lookup and an
identity comparison each, in the compiled entry's C (backends/c/c_entry.py) or `Guards.hold`. The
check reads the values themselves, so a write is seen however it was made: `cell.x = v`,
`object.__setattr__` (`set_train`), a write into `cell.__dict__`, a replaced sub-cell or
Parameter. When an object differs, `Guards.changed` compares by value: an equal value (the same
float set again) is remembered as the new object, a different one means a recompile.

Not seen (documented limits): a mutable object changed in place (a list appended to, an array
attribute written into), a class attribute changed on the class, a module global, a cell's whole
`__dict__` replaced by another dict.
A Parameter's data changed in place or by `set_data` needs no guard: weights are graph inputs
(the entry checks their shape and dtype on each call).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import is_
from typing import Any

import numpy as np

_PLAIN = (bool, int, float, complex, str, bytes, type(None), np.generic)
# The cell's own bookkeeping, and what every construct reads.
_INTERNAL = frozenset({"_cells", "_params", "_compiled", "_traced_call",
                       "construct", "_declared_inputs", "_shape_history", "_static_families",
                       "_generic", "_last_call"})
_MISSING = object()

_state = threading.local()


def is_plain(value: Any) -> bool:
    """Compared by value (immutable, no identity of its own that matters)."""
    if isinstance(value, _PLAIN):
        return True
    return type(value) is tuple and all(is_plain(v) for v in value)


def _same(recorded: Any, current: Any, by_value: bool) -> bool:
    if not by_value:
        return recorded is current
    # By type and text: NaN is NaN, -0.0 is not 0.0, 1 is not 1.0 or True (each traces
    # differently).
    return type(recorded) is type(current) and repr(recorded) == repr(current)


@dataclass
class Read:
    cell: Any
    name: str
    value: Any  # _MISSING: construct looked for it and it was not there
    by_value: bool

    def describe(self, current: Any) -> str:
        where = f"{type(self.cell).__name__}.{self.name}"
        if current is _MISSING:
            return f"{where} was deleted"
        if self.value is _MISSING:
            return f"{where} was set"
        if self.by_value and is_plain(current):
            return f"{where} changed from {self.value!r} to {current!r}"
        return f"{where} was replaced by another {type(current).__name__} object"


@dataclass
class Guards:
    """The attributes one compiled graph read, and the per-call check that they still hold."""

    reads: list[Read] = field(default_factory=list)
    # (id(cell), name) of every read, so a repeated read is one lookup (BERT-tiny's trace reads
    # ~500 attributes: a scan of the reads for each was a fifth of the trace). `reads` keeps
    # the cells alive, so their ids stay theirs.
    seen: set[tuple[int, str]] = field(default_factory=set)
    # The per-call check, one entry per read: dicts[i].get(names[i], _MISSING) is expected[i].
    # `expected` is changed in place (Guards.changed), so the entry's C sees the new objects.
    dicts: list[dict[str, Any]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    expected: list[Any] = field(default_factory=list)
    _missing: list[object] = field(default_factory=list)  # the `default` column of dict.get

    @property
    def table(self) -> tuple[list[dict[str, Any]], list[str], list[Any], object]:
        """What the compiled entry's C checks on each call (backends/c/c_entry.py `call`)."""
        return self.dicts, self.names, self.expected, _MISSING

    def hold(self) -> bool:
        """Every attribute read still holds the object it held when last checked (builtins
        only: no Python frame per call)."""
        return all(map(is_, map(dict.get, self.dicts, self.names, self._missing),
                       self.expected))

    def add(self, cell: Any, own: dict[str, Any], name: str, value: Any) -> None:
        self.reads.append(Read(cell, name, value, is_plain(value)))
        self.dicts.append(own)
        self.names.append(name)
        self.expected.append(own.get(name, _MISSING))
        self._missing.append(_MISSING)

    def changed(self) -> str | None:
        """Why this graph is stale (the first attribute that differs), or None; called when
        `hold` failed. Values equal to the traced ones are remembered as the new objects."""
        for read, own, expected in zip(self.reads, self.dicts, self.expected):
            current = own.get(read.name, _MISSING)
            if current is expected:
                continue
            if current is _MISSING and read.value is not _MISSING:
                current = getattr(read.cell, read.name, _MISSING)  # a class attribute
            if not _same(read.value, current, read.by_value):
                return read.describe(current)
        for i, (own, name) in enumerate(zip(self.dicts, self.names)):
            self.expected[i] = own.get(name, _MISSING)
        return None


def _record(cell: Any, name: str, value: Any) -> None:
    guards: Guards | None = getattr(_state, "guards", None)
    if guards is None or name in _INTERNAL or name.startswith("__"):
        return
    own = object.__getattribute__(cell, "__dict__")
    if name not in own and not is_plain(value) and value is not _MISSING:
        return  # methods and other class-level objects
    if (id(cell), name) in guards.seen:
        return
    guards.seen.add((id(cell), name))
    guards.add(cell, own, name, value)


_recording_classes: dict[type, type] = {}


def _recording_class(cls: type) -> type:
    """A subclass of `cls` that records attribute reads (same name: graphs are named after it)."""
    if cls not in _recording_classes:
        # The class's own slot, called with the instance (mypy reads it as bound to `cls`).
        base_getattribute: Callable[[Any, str], Any] = \
            cls.__getattribute__  # type: ignore[assignment]  # see above

        def __getattribute__(self: Any, name: str) -> Any:
            try:
                value = base_getattribute(self, name)
            except AttributeError:
                _record(self, name, _MISSING)  # a getattr(self, name, default) that may change
                raise
            _record(self, name, value)
            return value

        _recording_classes[cls] = type(cls.__name__, (cls,), {
            "__getattribute__": __getattribute__, "__slots__": (),
            "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return _recording_classes[cls]


def _is_cell(value: Any) -> bool:
    own = getattr(value, "__dict__", None)
    return type(own) is dict and "_cells" in own


def _reachable(cell: Any) -> list[Any]:
    """The cell and every cell its construct may run: sub-cells, and cells held as attributes
    some other way (set with object.__setattr__, in a list or tuple attribute)."""
    seen: dict[int, Any] = {}
    stack = [cell]
    while stack:
        c = stack.pop()
        if id(c) in seen:
            continue
        seen[id(c)] = c
        stack.extend(c.__dict__.get("_cells", {}).values())
        for name, value in c.__dict__.items():
            if name in _INTERNAL:
                continue
            items = value if type(value) in (list, tuple) else (value,)
            stack.extend(item for item in items if _is_cell(item))
    return list(seen.values())


@contextmanager
def recording(cell: Any) -> Iterator[Guards]:
    """Record what tracing `cell` reads from it and its sub-cells."""
    guards = Guards()
    cells = _reachable(cell)
    originals = [(c, type(c)) for c in cells]
    previous = getattr(_state, "guards", None)
    _state.guards = guards
    try:
        for c, cls in originals:  # object's setter: Cell.__setattr__ would count a change
            object.__setattr__(c, "__class__", _recording_class(cls))
        yield guards
    finally:
        for c, cls in originals:
            object.__setattr__(c, "__class__", cls)
        _state.guards = previous
