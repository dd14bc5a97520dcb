"""Guards: what a compiled graph was built from besides its input types, and the per-call check.

While `construct` is traced, every attribute it reads from the cells it runs (the cell and its
sub-cells) is recorded: plain values (numbers, strings, flags, None, tuples of them) by value,
everything else (Parameters, sub-cells, primitives, arrays) by identity. `Cell.__setattr__` and
`__delattr__` bump the cell's version and one process-wide counter, so a call pays one integer
comparison while no cell changed; after a change, the graph compares only the attributes it read
of the cells whose version moved, and a different value means a recompile.

Not seen (documented limits): a mutable object changed in place (a list appended to, an array
attribute written into), a class attribute changed on the class, a module global.
A Parameter's data changed in place or by `set_data` needs no guard: weights are graph inputs.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_PLAIN = (bool, int, float, complex, str, bytes, type(None), np.generic)
# The cell's own bookkeeping, and what every construct reads.
_INTERNAL = frozenset({"_cells", "_params", "_compiled", "_version", "_traced_call",
                       "construct", "_declared_inputs", "_shape_history", "_static_families",
                       "_generic", "_last_call"})
_MISSING = object()


class _Counter:
    """Bumped on every attribute change of any cell (read per call: one comparison)."""

    value = 0


counter = _Counter()
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
    """The attributes one compiled graph read, and the cell versions it saw."""

    reads: list[Read] = field(default_factory=list)
    versions: dict[int, tuple[Any, int]] = field(default_factory=dict)  # id -> (cell, version)
    # (id(cell), name) of every read, so a repeated read is one lookup (BERT-tiny's trace reads
    # ~500 attributes: a scan of the reads for each was a fifth of the trace). `versions` keeps
    # the cells alive, so their ids stay theirs.
    seen: set[tuple[int, str]] = field(default_factory=set)
    generation: int = 0

    def changed(self) -> str | None:
        """Why this graph is stale (the first attribute that differs), or None; called only when
        some cell changed since the last check."""
        moved = {key for key, (cell, version) in self.versions.items()
                 if cell.__dict__.get("_version", 0) != version}
        for read in self.reads:
            if id(read.cell) not in moved:
                continue
            current = read.cell.__dict__.get(read.name, _MISSING)
            if current is _MISSING and read.value is not _MISSING:
                current = getattr(read.cell, read.name, _MISSING)  # a class attribute
            if not _same(read.value, current, read.by_value):
                return read.describe(current)
        for key in moved:  # unchanged values: remember the new versions, skip them next time
            cell, _ = self.versions[key]
            self.versions[key] = (cell, cell.__dict__.get("_version", 0))
        self.generation = counter.value
        return None


def _record(cell: Any, name: str, value: Any) -> None:
    guards: Guards | None = getattr(_state, "guards", None)
    if guards is None or name in _INTERNAL or name.startswith("__"):
        return
    own = object.__getattribute__(cell, "__dict__")
    if name not in own and not is_plain(value) and value is not _MISSING:
        return  # methods and other class-level objects
    if id(cell) not in guards.versions:
        guards.versions[id(cell)] = (cell, own.get("_version", 0))
    if (id(cell), name) in guards.seen:
        return
    guards.seen.add((id(cell), name))
    guards.reads.append(Read(cell, name, value, is_plain(value)))


_recording_classes: dict[type, type] = {}


def _recording_class(cls: type) -> type:
    """A subclass of `cls` that records attribute reads (same name: graphs are named after it)."""
    if cls not in _recording_classes:
        base_getattribute = cls.__getattribute__

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


def _reachable(cell: Any) -> list[Any]:
    seen: dict[int, Any] = {}
    stack = [cell]
    while stack:
        c = stack.pop()
        if id(c) in seen:
            continue
        seen[id(c)] = c
        stack.extend(c.__dict__.get("_cells", {}).values())
    return list(seen.values())


@contextmanager
def recording(cell: Any) -> Iterator[Guards]:
    """Record what tracing `cell` reads from it and its sub-cells."""
    guards = Guards(generation=counter.value)
    cells = _reachable(cell)
    for c in cells:  # every cell starts watched: a sub-cell construct never read is no guard
        guards.versions[id(c)] = (c, c.__dict__.get("_version", 0))
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
