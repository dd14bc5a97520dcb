"""A RangeLike step (each element its position along an axis: the ONNX import's Range up to
a dynamic size) run by the compiled entry (backends/c/c_entry.py): the positions written into
the step's pooled buffer, so a shape-generic transformer's plan stays one C call."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphkernel.backends.c.c_text import C_STORAGE
from graphkernel.ir.types import Dim, SymSize
from graphkernel.runtime.plan import ExecutionPlan, Step


@dataclass(frozen=True)
class RangeCall:
    out: int  # slot
    outer: Dim  # the axes before `axis`, merged
    length: Dim  # the axis' length: positions 0 .. length-1
    inner: Dim  # the axes after it, merged: each position repeated
    c_type: str

    @property
    def symbols(self) -> tuple[str, ...]:
        """The dynamic sizes the step reads, in the order the entry hands them over."""
        return tuple(sorted({n for d in (self.outer, self.length, self.inner)
                             if isinstance(d, SymSize) for n in d.names}))


def range_call(plan: ExecutionPlan, step: Step) -> RangeCall | None:
    """The entry's fill of a pooled RangeLike step, or None."""
    if step.op != "RangeLike" or not step.pooled:
        return None
    (out,) = step.writes
    t = plan.slots[out].type
    c_type = C_STORAGE.get(t.dtype)
    if c_type is None or t.dtype == np.bool_:  # positions past 1 have no bool
        return None
    shape = tuple(t.shape)
    axis = step.attrs["axis"] % len(shape)
    return RangeCall(out, math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]),
                     c_type)


def emit_range(call: RangeCall, data: dict[int, str]) -> list[str]:
    """The step's lines: its dynamic sizes are locals of their names (SymSize's text)."""
    return [
        f"  {{ {call.c_type} *gk_dst = ({call.c_type} *){data[call.out]};",
        f"    const int64_t gk_length = {call.length}, gk_inner = {call.inner};",
        f"    for (int64_t o = 0; o < {call.outer}; ++o)",
        "      for (int64_t i = 0; i < gk_length; ++i)",
        "        for (int64_t k = 0; k < gk_inner; ++k)",
        f"          gk_dst[(o * gk_length + i) * gk_inner + k] = ({call.c_type})i;",
        "  }",
    ]
