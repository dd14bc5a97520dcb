"""Identical fused groups share one compiled kernel.

A stack of identical layers plans one kernel per group per layer, and before this each was
compiled on its own: a cold compile of the 4-layer bert_tiny encoder spent 4.2 of its 5.7 s in
gcc on 22 kernels that are 6 distinct ones. The structural key of a group is the C its emitter
wrote with the kernel's own name taken out: that text is a function of exactly what decides the
code (op types and attributes, shapes, dtypes, the subgraph's structure, the schedule and cost
choices) and of nothing else (value names never reach the C). Two groups share a function only
when their code is the same text up to that name, so a dedup can never merge groups whose code
would differ. Each duplicate keeps its name as a one-line forward to the shared function, so the
plan, the C entry and the loader are unchanged; the forward costs the compiler nothing.
"""
from __future__ import annotations

import bisect
import dataclasses
import enum
import functools
import hashlib
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from graphkernel.backends.c.c_loops import KernelSource
from graphkernel.backends.c.c_text import PRELUDE
from graphkernel.backends.c.config import CConfig
from graphkernel.graph_kernel.lower import KernelKind
from graphkernel.graph_kernel.schedule import Schedule
from graphkernel.ir.graph import Graph, Value
from graphkernel.ir.types import SymSize, TensorType, TupleType
from graphkernel.runtime.plan import KernelSpec

_NAME_MARK = "\x00kernel\x00"  # never in generated C


_WORD = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def _take_out_name(name: str, source: str) -> str:
    """`source` with `name` and the helpers an emitter derives from it (`name_threads`,
    `name_nest0`) replaced by `_NAME_MARK`: `name` starting an identifier (no letter, digit or
    `_` before it) and not continued by a letter or digit. A scan with str.find: a regular
    expression per kernel name cost 0.9 ms to compile, twice per kernel of a compile."""
    pieces: list[str] = []
    start = at = 0
    while (at := source.find(name, at)) >= 0:
        end = at + len(name)
        before = source[at - 1] if at else ""
        if (not before or before not in _WORD and before != "_") and \
                (end == len(source) or source[end] not in _WORD):
            pieces += (source[start:at], _NAME_MARK)
            start = at = end
        else:
            at += 1
    pieces.append(source[start:])
    return "".join(pieces)


# The prelude's identifiers, read once and sorted: searching the prelude's text for each
# kernel's name took 15-27 ms of CPU for a 12-layer encoder's 84 kernels, on every load.
_PRELUDE_IDENTIFIERS = sorted(set(re.findall(r"[A-Za-z0-9_]+", PRELUDE)))


def _in_prelude(name: str) -> bool:
    """Whether an identifier of the prelude is `name` or begins with it as `_take_out_name` reads
    it (`name` then `_`)."""
    ids = _PRELUDE_IDENTIFIERS
    at = bisect.bisect_left(ids, name)
    if at < len(ids) and ids[at] == name:
        return True
    at = bisect.bisect_left(ids, name + "_")  # the identifiers beginning `name_` follow here
    return at < len(ids) and ids[at].startswith(name + "_")


def structural_key(kernel: KernelSource) -> str | None:
    """The kernel's code with its own name taken out, or None when the name cannot be taken
    out safely (a shared C identifier begins with it, so the text would not say which uses are
    the kernel's own)."""
    if _in_prelude(kernel.name):
        return None
    return _take_out_name(kernel.name, kernel.source)


def _forward(name: str, target: str) -> str:
    return f"void {name}(void *const *args) {{ {target}(args); }}\n"


def share_identical(kernels: list[KernelSource]) -> tuple[list[KernelSource], int]:
    """`kernels` with each group of identical ones compiled once: the first of a group keeps
    its code and gains a forward for each later one under that one's name. Returns the
    kernels to compile (every original name still defined) and how many were shared."""
    first: dict[str, int] = {}
    out: list[KernelSource] = []
    forwards: dict[int, list[str]] = {}
    shared = 0
    for kernel in kernels:
        key = structural_key(kernel)
        if key is not None and key in first:
            forwards.setdefault(first[key], []).append(kernel.name)
            shared += 1
            continue
        if key is not None:
            first[key] = len(out)
        out.append(kernel)
    for i, names in forwards.items():
        source = out[i].source + "".join(_forward(n, out[i].name) for n in names)
        out[i] = dataclasses.replace(out[i], source=source)
    return out, shared


# -- one emission per distinct kernel ---------------------------------------------------------
# The structural key above is read from emitted C, so every kernel had to be emitted before two
# could share: a BERT-base training step emitted 206 kernels' C for 18 distinct texts. `spec_key`
# says the same thing from what the emitter reads, before any C is written.

class _Unkeyable(Exception):
    """Something the emitter would read that the key cannot spell exactly: no key, no sharing."""


# Schedule's dicts keyed by a value's uid (a process-wide number): the key spells each one as
# the value's place in the group instead. Every other field is encoded as it is.
_UID_KEYED = frozenset({"aligned", "outer_phase", "maps", "concats", "tiles"})
# What a group's kernel is: KernelSpec's fields the key leaves out. `name` is taken out of the
# C (`_take_out_name`); `node` is the composite the group came from, whose own fields (its name,
# notes, the group as its subgraph) the group emitters never read, only `group` and `schedule`.
_SPEC_NOT_READ = frozenset({"name", "node"})
_GROUP_KINDS = frozenset({KernelKind.LOOP_NEST, KernelKind.PARALLEL, KernelKind.SINGLE_OP})


class _Spelling:
    """The text of one group kernel's key: its graph with every value named by its place (an
    input's position, a node's position, a constant's position and its bytes), its schedule
    and the config, in the order the emitter meets them."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.place: dict[int, str] = {}  # value uid -> its place in the group

    def graph(self, graph: Graph, tag: str) -> None:
        add, place, encode = self.parts.append, self.place, self.encode
        add(f"graph {tag}: inputs")
        for i, value in enumerate(graph.inputs):
            place[value.uid] = f"{tag}i{i}"
            add(encode(value.type))
        add("constants")
        for i, const in enumerate(graph.constants()):
            place[const.uid] = f"{tag}c{i}"
            add(encode(const.value))
        add("nodes")
        for i, node in enumerate(graph.nodes):
            try:
                reads = ",".join([place[v.uid] for v in node.inputs])
            except KeyError:
                raise _Unkeyable(f"{node.name} reads a value not the group's") from None
            add(f"{node.op}({reads}){encode(node.attrs) if node.attrs else '{}'}:"
                f"{encode(node.type)}")
            if node.subgraph is not None:
                self.graph(node.subgraph, f"{tag}n{i}.")
                inner = node.subgraph
                add("binds " + ",".join(self.ref(v) for v in inner.inputs) + " returns " +
                    ",".join(self.ref(v) for v in inner.outputs))
            place[node.uid] = f"{tag}n{i}"
        add("outputs " + ",".join(self.ref(v) for v in graph.outputs))

    def ref(self, value: Value) -> str:
        place = self.place.get(value.uid)
        if place is None:
            raise _Unkeyable(f"{value.name} is not the group's")
        return place

    def encode(self, obj: object) -> str:
        """`obj` as text that tells apart any two values an emitter could tell apart: the type
        of every scalar, a value by its place, an array by its dtype, shape and bytes."""
        kind = type(obj)
        if kind in _SCALARS:
            return f"{kind.__name__}:{obj!r}"
        if isinstance(obj, (tuple, list)) and kind in (tuple, list) and \
                all(type(x) is int for x in obj):
            return f"{kind.__name__}{obj!r}"  # shapes and strides: ints spell themselves
        if isinstance(obj, (TensorType, TupleType, CConfig)) and \
                kind in (TensorType, TupleType, CConfig):  # immutable, met often
            return _immutable_text(obj)
        if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
            return f"{type(obj).__name__}:{obj!r}"
        if isinstance(obj, Value):
            return "@" + self.ref(obj)
        if isinstance(obj, np.ndarray):
            data = np.ascontiguousarray(obj).tobytes()
            return (f"array{obj.dtype.str}{obj.shape}:" +
                    (data.hex() if len(data) <= 64 else hashlib.sha256(data).hexdigest()))
        if isinstance(obj, np.generic):
            return f"{obj.dtype.str}:{obj!r}"
        if isinstance(obj, np.dtype):
            return f"dtype:{obj.str}"
        if isinstance(obj, enum.Enum):
            return f"{type(obj).__qualname__}.{obj.name}"
        if isinstance(obj, SymSize):
            return f"sym:{obj.coef}*{'*'.join(obj.names)}"
        if isinstance(obj, (tuple, list)):
            return f"{type(obj).__name__}[{','.join(self.encode(x) for x in obj)}]"
        if isinstance(obj, dict):  # in its own order: an emitter may walk it in that order
            return "{" + ",".join(f"{self.encode(k)}={self.encode(v)}"
                                  for k, v in obj.items()) + "}"
        if isinstance(obj, Schedule):
            return self.schedule(obj)
        if isinstance(obj, Graph):  # a nest of a parallel kernel: the group's own values
            return ("graph[" + ",".join(self.ref(v) for v in obj.inputs) + "|" +
                    ",".join(self.ref(v) for v in obj.nodes) + "|" +
                    ",".join(self.ref(v) for v in obj.outputs) + "]")
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return self.encode_fields(obj)
        raise _Unkeyable(f"a {type(obj).__qualname__}")

    def encode_fields(self, obj: Any) -> str:
        return f"{type(obj).__qualname__}(" + ",".join(
            f"{f.name}={self.encode(getattr(obj, f.name))}"
            for f in dataclasses.fields(obj)) + ")"

    def schedule(self, sched: Schedule) -> str:
        fields = []
        for f in dataclasses.fields(sched):
            value = getattr(sched, f.name)
            if f.name in _UID_KEYED:
                value = "{" + ",".join(f"{self.place.get(uid) or self.unknown(uid)}="
                                       f"{self.encode(v)}" for uid, v in value.items()) + "}"
            else:
                value = self.encode(value)
            fields.append(f"{f.name}={value}")
        return "Schedule(" + ",".join(fields) + ")"

    @staticmethod
    def unknown(uid: int) -> str:
        raise _Unkeyable(f"value {uid} of the schedule is not the group's")


_SCALARS = frozenset({int, float, str, bool, type(None), bytes})


@functools.lru_cache(maxsize=4096)
def _immutable_text(obj: TensorType | TupleType | CConfig) -> str:
    """The key's text of a type or a config: they hold no values, so their text is their
    own, and a compile meets the same few thousands of times."""
    return _Spelling().encode_fields(obj)


def spec_key(spec: KernelSpec, config: object) -> str | None:
    """What a fused group's C is a function of, written before any C: the group's ops, their
    attributes, types and wiring (values by their place, never their names), its constants'
    bytes, its schedule (iteration space, aligned shapes, phases, index maps, concats, tiles),
    the kernel's kind and flags, and every field of `config` (the knobs). Two specs with one key
    have the same C up to the kernel's name. None for kernels other than fused groups (their
    emitters read state of their own, e.g. stored library choices) and for a group holding
    something the key cannot spell; those are emitted each on its own."""
    if spec.kind not in _GROUP_KINDS or spec.group is None:
        return None
    spelling = _Spelling()
    try:
        spelling.graph(spec.group, "")
        fields = [f"{f.name}={spelling.encode(getattr(spec, f.name))}"
                  for f in dataclasses.fields(spec)
                  if f.name not in _SPEC_NOT_READ and f.name != "group"]
        spelling.parts += fields + [spelling.encode(config)]
    except _Unkeyable:
        return None
    return hashlib.sha256("\n".join(spelling.parts).encode()).hexdigest()


def _renamed(kernel: KernelSource, code: str, name: str) -> KernelSource | None:
    """`kernel`'s C under `name`, the text its emitter writes for `name` (the key says the
    rest is the same), from `code`, its C with its own name taken out (`structural_key`);
    None when `name` cannot be put in safely."""
    if _in_prelude(name):
        return None
    return dataclasses.replace(kernel, name=name, source=code.replace(_NAME_MARK, name))


class EmitOnce:
    """An emitter that writes each distinct fused group's C once per compile: a spec whose
    `spec_key` was met before gets the first one's C under its own name. `emitted` counts the
    emitter's runs, `bound` the kernels given another's C."""

    def __init__(self, emit: Callable[[KernelSpec, Any], KernelSource]) -> None:
        self._emit = emit
        # key -> the first spec's C and that C with its name taken out (None: not separable)
        self._first: dict[str, tuple[KernelSource, str | None]] = {}
        self.emitted = 0
        self.bound = 0

    def __call__(self, spec: KernelSpec, config: Any) -> KernelSource:
        key = spec_key(spec, config)
        first = None if key is None else self._first.get(key)
        if first is not None and first[1] is not None:
            renamed = _renamed(first[0], first[1], spec.name)
            if renamed is not None:
                self.bound += 1
                return renamed
        self.emitted += 1
        source = self._emit(spec, config)
        if key is not None and first is None:
            self._first[key] = (source, structural_key(source))
        return source
