"""A Gather step (an embedding lookup) run by the compiled entry (backends/c/c_entry.py): rows of
the table copied into the step's pooled buffer, so a plan that starts with one stays one C call.

Out-of-range indices are an error, with the message the Python runner's check gives
(ir/opdefs/array.py `check_indices`; a Gather declared with `negative_indices` takes -rows..-1
too, from the end): the entry checks every index before it runs anything
and returns NotImplemented on a bad one, so the Python runner raises it. That needs the indices
to be an argument of the entry (a call input, a weight or a constant), known before the first
step; indices computed inside the graph keep the Python runner.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphkernel.ir.types import is_static
from graphkernel.runtime.plan import ExecutionPlan, SlotRole, Step

_INDEX_TYPES = {np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t"}


@dataclass(frozen=True)
class GatherCall:
    params: int  # slots
    indices: int
    out: int
    outer: int  # the table's axes before the gathered one, merged
    rows: int  # the gathered axis' length
    count: int  # indices
    inner_bytes: int  # bytes of the axes after it
    index_type: str
    negative: bool  # -rows..-1 count from the end (the OpDef's negative_indices)


def gather_call(plan: ExecutionPlan, step: Step) -> GatherCall | None:
    """The entry's copy of a pooled Gather step, or None."""
    if step.op != "Gather" or not step.pooled:
        return None
    (params, indices), (out,) = step.reads, step.writes
    table, ids = plan.slots[params], plan.slots[indices]
    if ids.role is SlotRole.VALUE or ids.type.dtype not in _INDEX_TYPES:
        return None  # indices the entry cannot check before it starts
    if not all(is_static(plan.slots[s].type.shape) for s in (params, indices, out)):
        return None
    shape = tuple(table.type.shape)
    axis = step.attrs["axis"] % len(shape)
    return GatherCall(params, indices, out, math.prod(shape[:axis]), shape[axis],
                      math.prod(ids.type.shape), math.prod(shape[axis + 1:]) *
                      table.type.dtype.itemsize, _INDEX_TYPES[ids.type.dtype],
                      bool(step.attrs.get("negative_indices", False)))


def emit_check(call: GatherCall, indices: str) -> list[str]:
    """Lines at the top of `gk_run`: any index out of range -> NotImplemented."""
    low = -call.rows if call.negative else 0
    return [f"  {{ const {call.index_type} *gk_ix = (const {call.index_type} *){indices};",
            f"    for (int64_t i = 0; i < {call.count}; ++i)",
            f"      if (gk_ix[i] < {low} || gk_ix[i] >= {call.rows}) Py_RETURN_NOTIMPLEMENTED;",
            "  }"]


def emit_gather(call: GatherCall, data: dict[int, str]) -> list[str]:
    """The step's lines in `gk_run`: one memcpy per gathered row (of each outer index)."""
    # a checked negative index is its row counted from the end
    row = f"(gk_ix[i] < 0 ? gk_ix[i] + {call.rows} : gk_ix[i])" if call.negative else "gk_ix[i]"
    return [
        f"  {{ const {call.index_type} *gk_ix = (const {call.index_type} *){data[call.indices]};",
        f"    const char *gk_src = (const char *){data[call.params]};",
        f"    char *gk_dst = (char *){data[call.out]};",
        f"    for (int64_t o = 0; o < {call.outer}; ++o)",
        f"      for (int64_t i = 0; i < {call.count}; ++i)",
        f"        memcpy(gk_dst + (o * {call.count} + i) * {call.inner_bytes}, gk_src + "
        f"(o * {call.rows} + {row}) * {call.inner_bytes}, {call.inner_bytes});",
        "  }",
    ]
