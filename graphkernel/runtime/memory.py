"""Memory of a running graph: one pool of output buffers shared by all its steps, and the plan
of when each intermediate value dies.

A buffer is reused once nothing but the pool refers to it: not the caller (a result it holds),
not a view (a Reshape or Transpose keeps its base alive), not a live slot. Slots are cleared
after their last reader, so within one call a dead intermediate's buffer serves a later step:
fewer fresh pages, whose first touch costs more than a bandwidth-bound kernel on these VMs
(about 2.5 us per 4 KiB page; a fresh 32 MiB array with huge pages took 80 ms).
"""
from __future__ import annotations

import math
import sys
import threading
from collections.abc import Sequence

import numpy as np

# Buffers of one shape and dtype the pool keeps; more live at once are allocated and dropped.
KEEP_PER_SHAPE = 16
# Buffers smaller than this are not touched ahead of the first call: too few pages to matter.
PREFAULT_MIN_BYTES = 64 << 10

Key = tuple[tuple[int, ...], np.dtype]


class BufferPool:
    """Output buffers by (shape, dtype), reused when no one else holds them."""

    def __init__(self, keep: int = KEEP_PER_SHAPE) -> None:
        self._free: dict[Key, list[np.ndarray]] = {}
        self._keep = keep

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        arrays = self._free.setdefault((shape, dtype), [])
        for array in arrays:
            # References: the list, this loop's name and getrefcount's argument.
            if sys.getrefcount(array) == 3:
                return array
        array = np.empty(shape, dtype)
        if len(arrays) < self._keep:
            arrays.append(array)
        return array

    @property
    def held_bytes(self) -> int:
        return sum(a.nbytes for arrays in self._free.values() for a in arrays)

    def prefault(self, keys: Sequence[Key]) -> threading.Thread | None:
        """Allocate and touch these buffers on a background thread, then hand them to the pool:
        the first call finds them ready instead of faulting in fresh pages while it computes.
        Compiling leaves the other core idle; numpy writes the pages without the GIL."""
        keys = [k for k in keys if k[1].itemsize * math.prod(k[0]) >= PREFAULT_MIN_BYTES]
        if not keys:
            return None

        def work() -> None:
            made: dict[Key, list[np.ndarray]] = {}
            for shape, dtype in keys:
                array = np.empty(shape, dtype)
                array[...] = 0
                made.setdefault((shape, dtype), []).append(array)
            for key, arrays in made.items():
                pool = self._free.setdefault(key, [])
                pool.extend(arrays[:max(0, self._keep - len(pool))])

        thread = threading.Thread(target=work, name="graphkernel-prefault", daemon=True)
        thread.start()
        return thread


def first_call_buffers(takes: Sequence[Sequence[Key]], reads: Sequence[Sequence[int]],
                       writes: Sequence[int | None], aliases: Sequence[bool],
                       release: Sequence[Sequence[int]]) -> list[Key]:
    """The pooled buffers one call creates, found by replaying the steps: each takes buffers
    for its outputs (`takes`), a step that may return a view of its inputs (`aliases`) keeps
    their buffers alive, and a buffer returns to the pool when no live slot holds it."""
    free: dict[Key, list[int]] = {}
    created: list[Key] = []
    holds: dict[int, set[int]] = {}  # slot -> buffers it keeps alive
    holders: dict[int, int] = {}  # buffer -> how many live slots hold it
    key_of: dict[int, Key] = {}
    for step_takes, read, written, alias, dead in zip(takes, reads, writes, aliases, release):
        mine: set[int] = set()
        for key in step_takes:
            if free.get(key):
                buffer = free[key].pop()
            else:
                buffer = len(created)
                created.append(key)
                key_of[buffer] = key
            mine.add(buffer)
        if alias:
            for s in read:
                mine |= holds.get(s, set())
        if written is not None:
            holds[written] = mine
            for b in mine:
                holders[b] = holders.get(b, 0) + 1
        for s in dead:
            for b in holds.pop(s, set()):
                holders[b] -= 1
                if holders[b] == 0:
                    free.setdefault(key_of[b], []).append(b)
    return created


def release_plan(reads: Sequence[Sequence[int]], writes: Sequence[int | None],
                 keep: set[int]) -> list[tuple[int, ...]]:
    """For each step, the slots to clear after it: values no later step reads. `keep`: slots
    that live for the whole call (inputs, weights, results)."""
    last: dict[int, int] = {}
    for index, (read, written) in enumerate(zip(reads, writes)):
        if written is not None:
            last.setdefault(written, index)  # a value nobody reads dies where it is made
        for s in read:
            last[s] = index
    plan: list[list[int]] = [[] for _ in reads]
    for s, index in last.items():
        if s not in keep:
            plan[index].append(s)
    return [tuple(sorted(p)) for p in plan]

