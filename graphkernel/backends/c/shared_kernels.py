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
import re

from graphkernel.backends.c.c_loops import KernelSource
from graphkernel.backends.c.c_text import PRELUDE

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
