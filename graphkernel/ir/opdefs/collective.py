"""Collective ops across processes, for data-parallel training: AllReduce, and its
non-blocking halves AllReduceStart and AllReduceWait.

AllReduce takes a tuple of tensors (a step's gradients) and returns each summed over every
process of the group, times `scale` (1/group size for a mean): the tensors of one dtype travel
in one flat buffer, one collective call per dtype, so a step costs a few messages, not one per
parameter. The op table cannot reach a communication library (it sits below everything): the
frontend's `graphkernel.communication.init()` installs the group here (`set_collectives`).

AllReduceStart(xs) starts the sum of its tensors (one dtype: a bucket of gradients) and returns
a ticket, an int64 scalar; AllReduceWait((*tickets, *xs), buckets=(n1, n2, ...)) waits for
those sums and returns the tensors (n1 of the first bucket, ...) summed, times `scale`.
nn.DistributedGradReducer with buckets emits one start per bucket and one wait for them all
(so no update can be fused into the backward pass ahead of it); the backend schedules each
start right after its last tensor is made and the wait right before the first use of its
results (graph_kernel/collectives.py), so the exchange of the last layers' gradients runs
while the backward pass computes the first layers' (the overlap PyTorch's
DistributedDataParallel makes).
"""
from __future__ import annotations

import itertools
from typing import Any, Protocol

import numpy as np

from graphkernel.errors import CommunicationError, DTypeError, ShapeError
from graphkernel.ir.opset import OpDef, PatternKind, declare
from graphkernel.ir.types import FLOAT_DTYPES, TensorType, TupleType, ValueType


class Collectives(Protocol):
    """A process group: its size, an in-place sum over its processes, and a gather of one
    buffer from each (stacked in rank order)."""

    @property
    def size(self) -> int: ...

    def allreduce_sum(self, buffer: np.ndarray) -> None: ...

    def allgather(self, buffer: np.ndarray) -> np.ndarray: ...


class PendingSum(Protocol):
    """A sum begun by `start_allreduce_sum`: `wait()` returns once the buffer holds it."""

    def wait(self) -> None: ...


class StartsCollectives(Collectives, Protocol):
    """A group that can also begin a sum and let the caller go on (MPI's Iallreduce)."""

    def start_allreduce_sum(self, buffer: np.ndarray) -> PendingSum: ...


_group: list[Collectives] = []


def set_collectives(group: Collectives | None) -> None:
    """Install (or, with None, remove) the group AllReduce runs over."""
    _group.clear()
    if group is not None:
        _group.append(group)


def collectives() -> Collectives:
    if not _group:
        raise CommunicationError("AllReduce needs a process group: call "
                                 "graphkernel.communication.init() first (under mpirun)")
    return _group[0]


def _all_reduce_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    if not types:
        raise ShapeError("AllReduce takes at least one tensor")
    for t in types:
        if t.dtype not in FLOAT_DTYPES:
            raise DTypeError(f"AllReduce reduces float tensors, got {t.dtype.name}")
    if attrs["op"] != "sum":
        raise DTypeError(f"AllReduce op={attrs['op']!r}: only 'sum' is supported")
    return TupleType(tuple(types))


def _all_reduce_ref(*arrays: np.ndarray, op: str = "sum", scale: float = 1.0
                    ) -> tuple[np.ndarray, ...]:
    group = collectives()
    out: list[np.ndarray] = [np.empty(0)] * len(arrays)
    for dtype in dict.fromkeys(a.dtype for a in arrays):  # one buffer per dtype, in order
        members = [i for i, a in enumerate(arrays) if a.dtype == dtype]
        # float16 sums in float32 (MPI has no half type; fewer roundings too).
        wide = np.float32 if dtype == np.float16 else dtype
        flat = np.concatenate([arrays[i].ravel() for i in members]).astype(wide, copy=False)
        group.allreduce_sum(flat)
        if scale != 1.0:
            flat *= np.asarray(scale, wide)
        start = 0
        for i in members:
            size = arrays[i].size
            out[i] = flat[start:start + size].reshape(arrays[i].shape).astype(dtype)
            start += size
    return tuple(out)


declare(OpDef(name="AllReduce", kind=PatternKind.OPAQUE, inputs=("xs",), infer=_all_reduce_infer,
              reference=_all_reduce_ref, init_attrs=(("op", "sum"), ("scale", 1.0)),
              variadic=True,
              doc="Sum (times scale) of each tensor over the processes of the group "
                  "(graphkernel.communication), the tensors of a dtype in one buffer"))


# The sums begun and not yet waited for, by ticket. A ticket is new for every start, so a call
# that failed between a start and its wait never hands its sum to a later call.
_started: dict[int, tuple[PendingSum, np.ndarray]] = {}
_tickets = itertools.count(1)


def _bucket_dtype(types: tuple[TensorType, ...], op: str) -> None:
    if not types:
        raise ShapeError(f"{op} takes at least one tensor")
    for t in types:
        if t.dtype not in FLOAT_DTYPES:
            raise DTypeError(f"{op} reduces float tensors, got {t.dtype.name}")
    if len({t.dtype for t in types}) > 1:
        raise DTypeError(f"{op} takes tensors of one dtype (a bucket), got "
                         f"{', '.join(sorted({t.dtype.name for t in types}))}")


def _start_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    _bucket_dtype(types, "AllReduceStart")
    return TensorType((), np.dtype(np.int64))


def _start_ref(*arrays: np.ndarray) -> np.ndarray:
    group = collectives()
    start = getattr(group, "start_allreduce_sum", None)
    if start is None:
        raise CommunicationError(f"the process group ({type(group).__name__}) cannot begin a "
                                 "sum without waiting for it (no start_allreduce_sum): "
                                 "gradient buckets need one; leave grad_bucket_mb unset")
    # float16 sums in float32, as AllReduce does.
    wide = np.float32 if arrays[0].dtype == np.float16 else arrays[0].dtype
    flat = np.concatenate([a.ravel() for a in arrays]).astype(wide, copy=False)
    ticket = next(_tickets)
    _started[ticket] = (start(flat), flat)
    return np.array(ticket, np.int64)


def _wait_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    counts = attrs["buckets"]
    if not isinstance(counts, tuple) or not counts or \
            any(not isinstance(n, int) or n < 1 for n in counts):
        raise ShapeError(f"AllReduceWait buckets={counts!r}: give the number of tensors of "
                         "each bucket, positive ints")
    ticket = TensorType((), np.dtype(np.int64))
    if len(types) != len(counts) + sum(counts) or \
            any(t != ticket for t in types[:len(counts)]):
        raise ShapeError(f"AllReduceWait takes the tickets of {len(counts)} AllReduceStart(s), "
                         f"then their {sum(counts)} tensors; got {len(types)} input(s)")
    start = len(counts)
    for n in counts:
        _bucket_dtype(types[start:start + n], "AllReduceWait")
        start += n
    return TupleType(tuple(types[len(counts):]))


def _wait_ref(*arrays: np.ndarray, buckets: tuple[int, ...] = (), scale: float = 1.0
              ) -> tuple[np.ndarray, ...]:
    tickets, tensors = arrays[:len(buckets)], arrays[len(buckets):]
    out: list[np.ndarray] = []
    for ticket, count in zip(tickets, buckets):
        began = _started.pop(int(ticket), None)
        if began is None:
            raise CommunicationError(f"AllReduceWait: no sum was begun under ticket "
                                     f"{int(ticket)} (its AllReduceStart did not run in this "
                                     "call)")
        pending, flat = began
        pending.wait()
        if scale != 1.0:
            flat *= np.asarray(scale, flat.dtype)
        start = 0
        for a in tensors[len(out):len(out) + count]:
            out.append(flat[start:start + a.size].reshape(a.shape).astype(a.dtype))
            start += a.size
    return tuple(out)


declare(OpDef(name="AllReduceStart", kind=PatternKind.OPAQUE, inputs=("xs",), infer=_start_infer,
              reference=_start_ref, variadic=True,
              doc="Begin the sum of each tensor (one dtype) over the processes of the group; "
                  "returns a ticket for AllReduceWait"))
declare(OpDef(name="AllReduceWait", kind=PatternKind.OPAQUE, inputs=("xs",), infer=_wait_infer,
              reference=_wait_ref, init_attrs=(("buckets", ()), ("scale", 1.0)), variadic=True,
              doc="Wait for the sums AllReduceStarts began: their tickets first, then their "
                  "tensors, `buckets` giving how many each; each tensor summed, times scale"))
