"""Memory of a running graph: one pool of output buffers shared by all its steps, and the plan
of when each intermediate value dies.

A buffer is reused once nothing but the pool refers to it: not the caller (a result it holds),
not a view (a Reshape or Transpose keeps its base alive), not a live slot. Slots are cleared
after their last reader, so within one call a dead intermediate's buffer serves a later step:
fewer fresh pages, whose first touch costs more than a bandwidth-bound kernel on these VMs
(about 2.5 us per 4 KiB page; a fresh 32 MiB array with huge pages took 80 ms).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

# Buffers of one shape and dtype the pool keeps; more live at once are allocated and dropped.
KEEP_PER_SHAPE = 16


class BufferPool:
    """Output buffers by (shape, dtype), reused when no one else holds them."""

    def __init__(self, keep: int = KEEP_PER_SHAPE) -> None:
        self._free: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
        self._keep = keep

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        arrays = self._free.setdefault((shape, dtype.str), [])
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


def step_reads(step: Any) -> tuple[int, ...]:
    return tuple(getattr(step, "reads", ()))


def step_writes(step: Any) -> int | None:
    return getattr(step, "writes", None)
