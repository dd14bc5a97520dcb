"""Collective ops across processes, for data-parallel training: AllReduce.

AllReduce takes a tuple of tensors (a step's gradients) and returns each summed over every
process of the group, times `scale` (1/group size for a mean): the tensors of one dtype travel
in one flat buffer, one collective call per dtype, so a step costs a few messages, not one per
parameter. The op table cannot reach a communication library (it sits below everything): the
frontend's `graphkernel.communication.init()` installs the group here (`set_collectives`).
"""
from __future__ import annotations

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
