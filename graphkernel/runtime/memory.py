"""The pooled memory of a running graph: one set of arrays per buffer id of the plan.

The plan (runtime/plan.py `plan_memory`) decides which results share a buffer within a call.
Across calls the rule is the pool's: an array is reused only when nothing but the pool refers
to it: not the caller (a result it holds), not a view (a Reshape or Transpose keeps its base
alive), not a live slot. Reusing saves fresh pages, whose first touch costs more than a
bandwidth-bound kernel on these VMs (about 2.5 us per 4 KiB page; a fresh 32 MiB array with huge
pages took 80 ms).
"""
from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
from collections.abc import Callable, Sequence

import numpy as np

from graphkernel.ir.types import is_static

# Arrays one buffer keeps; while the caller holds more results than this, fresh ones are made.
KEEP_PER_BUFFER = 4
# Buffers smaller than this are not touched ahead of the first call: too few pages to matter.
PREFAULT_MIN_BYTES = 64 << 10

Key = tuple[tuple[int, ...], np.dtype]

# Where a pooled array starts: on a 64-byte boundary, a cache line and an AVX-512 vector. numpy
# starts large arrays 16 bytes into a page (malloc's header), so each vector a kernel loads or
# stores at a multiple of 64 bytes in would span two lines.
VECTOR_ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised C-contiguous array starting on a VECTOR_ALIGNMENT boundary (a view of
    a byte array a few bytes longer, which it keeps alive as its base)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + VECTOR_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % VECTOR_ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)

# madvise(2) advice: fault in every page of a range, writable, without writing to it (Linux 5.14).
_MADV_POPULATE_WRITE = 23
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_populate_state: dict[str, object] = {}
# Bytes per madvise call: the kernel holds the process's memory-map lock for the whole range,
# and the compile running meanwhile maps memory too (dlopen, large allocations): one call for
# 64 MiB stalled a warm compile from 5 to 12 ms; 4 MiB steps (whole huge pages) let it through.
_POPULATE_CHUNK = 4 << 20


def physical_memory() -> int:
    """Bytes of RAM this machine has (0 when unknown)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError(n)


def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's madvise through ctypes (which releases the GIL around the call), or None."""
    if "fn" not in _populate_state:
        fn = None
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):  # no C library to ask (Windows)
            fn = None
        _populate_state["fn"] = fn
    return _populate_state["fn"]  # type: ignore[return-value]  # set to the function or None just above


def populate(array: np.ndarray, stop: threading.Event | None = None) -> str:
    """Fault in the pages of a fresh C-contiguous array ahead of its first use; the way taken.

    The kernel zeroes each fresh page as it maps it, so writing zeros over the array as well
    (what `array[...] = 0` does) pays for the memory twice: MADV_POPULATE_WRITE maps the pages
    in one system call that writes nothing (4-5 ms for 64 MiB here, against 6-15 ms for the
    fill), with the GIL released. Where the kernel refuses it (before Linux 5.14, another OS),
    one element per page is written instead. `stop` set: the rest is left to fault in when it
    is first written ("stopped")."""
    madvise = _madvise()
    start = -(-array.ctypes.data // _PAGE) * _PAGE  # whole pages inside the array
    end = (array.ctypes.data + array.nbytes) // _PAGE * _PAGE
    if madvise is not None and end > start:
        for lo in range(start, end, _POPULATE_CHUNK):
            if stop is not None and stop.is_set():
                return "stopped"
            if madvise(lo, min(_POPULATE_CHUNK, end - lo), _MADV_POPULATE_WRITE) != 0:
                break
        else:
            flat = array.reshape(-1)
            flat[:1] = 0  # the partial pages at both ends
            flat[-1:] = 0
            return "madvise"
    flat = array.reshape(-1)
    flat[::max(1, _PAGE // array.itemsize)] = 0
    flat[-1:] = 0
    return "touch"


def _unviewed(array: np.ndarray) -> bool:
    """Whether no view refers to `array`'s memory: numpy makes a view's base the array that
    owns the memory, so a view of an `aligned_empty` array refers to its byte array."""
    # References to the owner: `array`'s base and getrefcount's argument.
    return array.base is None or sys.getrefcount(array.base) == 2


class BufferPool:
    """Arrays per buffer id (each of one shape and dtype), reused when no one else holds them."""

    def __init__(self, buffers: Sequence[Key], keep: int = KEEP_PER_BUFFER) -> None:
        self.buffers = list(buffers)
        self._arrays: list[list[np.ndarray]] = [[] for _ in self.buffers]
        self._keep = keep
        self._prefault_stop: threading.Event | None = None

    def take(self, buffer: int) -> np.ndarray:
        arrays = self._arrays[buffer]
        for array in arrays:
            # References: the list, this loop's name and getrefcount's argument.
            if sys.getrefcount(array) == 3 and _unviewed(array):
                return array
        shape, dtype = self.buffers[buffer]
        array = aligned_empty(shape, dtype)
        if len(arrays) < self._keep:
            arrays.append(array)
        return array

    def take_shaped(self, buffer: int, shape: tuple[int, ...]) -> np.ndarray:
        """`take` for a buffer of dynamic shape: this call's `shape`. A free array of another
        shape makes room for the new one, so the pool follows the sizes a caller uses."""
        arrays = self._arrays[buffer]
        for k, array in enumerate(arrays):
            if sys.getrefcount(array) == 3 and _unviewed(array):
                if array.shape == shape:
                    return array
                spare = k
                break
        else:
            spare = -1
        array = aligned_empty(shape, self.buffers[buffer][1])
        if spare >= 0:
            arrays[spare] = array
        elif len(arrays) < self._keep:
            arrays.append(array)
        return array

    def arrays(self, buffer: int) -> list[np.ndarray]:
        """The arrays the pool keeps for one buffer (for tests and reports)."""
        return list(self._arrays[buffer])

    def forget(self, buffer: int, array: np.ndarray) -> None:
        """Stop keeping `array` (handed to another owner: the compiled entry's pool)."""
        self._arrays[buffer] = [a for a in self._arrays[buffer] if a is not array]

    @property
    def held_bytes(self) -> int:
        return sum(a.nbytes for arrays in self._arrays for a in arrays)

    def prefault(self) -> threading.Thread | None:
        """Allocate and fault in one array per large buffer on a background thread, while the
        compile runs: the first call finds them ready instead of faulting in fresh pages while
        it computes. `stop_prefault` ends it early: a warm compile is shorter than faulting in
        a large buffer (5 ms against 8-13 ms for 64 MiB here), and waiting for the rest would
        cost the first call more than its kernels faulting the remaining pages on all their
        threads as they write them."""
        wanted = [b for b, (shape, dtype) in enumerate(self.buffers) if is_static(shape) and
                  dtype.itemsize * math.prod(shape) >= PREFAULT_MIN_BYTES]
        if not wanted:
            return None
        stop = self._prefault_stop = threading.Event()

        def work() -> None:
            for b in wanted:
                if stop.is_set():
                    return
                shape, dtype = self.buffers[b]
                array = aligned_empty(shape, dtype)
                populate(array, stop)  # stopped part-way, its pages so far are still ready
                if not self._arrays[b]:
                    self._arrays[b].append(array)

        thread = threading.Thread(target=work, name="graphkernel-prefault", daemon=True)
        thread.start()
        return thread

    def stop_prefault(self) -> None:
        """Ask the prefault thread to stop after the range it is faulting in now."""
        if self._prefault_stop is not None:
            self._prefault_stop.set()
