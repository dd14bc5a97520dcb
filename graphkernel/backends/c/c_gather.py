"""A Gather step (an embedding lookup) run by the compiled entry (backends/c/c_entry.py): rows of
the table copied into the step's pooled buffer, so a plan that starts with one stays one C call.

Out-of-range indices are an error, with the message the Python runner's check gives
(ir/opdefs/array.py `check_indices`; a Gather declared with `negative_indices` takes -rows..-1
too, from the end). Indices that are an argument of the entry (a call input, a weight or a
constant) are checked before anything runs; indices computed inside the graph (transformers'
masks index by arithmetic on a RangeLike) are checked by the step itself, before it copies, and
a bad one makes the entry return NotImplemented after the steps before it ran, so the Python
runner runs the call again and raises. That is only sound when those steps changed nothing
the second run reads: a plan that writes weights or keeps workspaces refuses such a Gather.

Sizes may be dynamic (a batch `N`): the step's counts are then C expressions of the sizes the
entry hands it, as the dynamic products (c_gemm.py) take them.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphkernel.ir.types import Dim, SymSize
from graphkernel.runtime.plan import ExecutionPlan, SlotRole, Step

_INDEX_TYPES = {np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t"}


@dataclass(frozen=True)
class GatherCall:
    params: int  # slots
    indices: int
    out: int
    outer: Dim  # the table's axes before the gathered one, merged
    rows: Dim  # the gathered axis' length
    count: Dim  # indices
    inner_bytes: Dim  # bytes of the axes after it
    index_type: str
    negative: bool  # -rows..-1 count from the end (the OpDef's negative_indices)
    computed: bool  # indices a step writes: checked by the step, not before the first

    @property
    def symbols(self) -> tuple[str, ...]:
        """The dynamic sizes the step reads, in the order the entry hands them over."""
        return tuple(sorted({n for d in (self.outer, self.rows, self.count, self.inner_bytes)
                             if isinstance(d, SymSize) for n in d.names}))


def gather_call(plan: ExecutionPlan, step: Step) -> GatherCall | None:
    """The entry's copy of a pooled Gather step, or None."""
    if step.op != "Gather" or not step.pooled:
        return None
    (params, indices), (out,) = step.reads, step.writes
    table, ids = plan.slots[params], plan.slots[indices]
    if ids.type.dtype not in _INDEX_TYPES:
        return None
    computed = ids.role is SlotRole.VALUE
    # a refusal after earlier steps would have them run twice; a kept workspace (repacked
    # weights) is only refreshed by them, from the same weights
    if computed and (plan.written_weights or any(
            slot.role is SlotRole.WORKSPACE and not (slot.workspace and slot.workspace.kept)
            for slot in plan.slots)):
        return None
    shape = tuple(table.type.shape)
    axis = step.attrs["axis"] % len(shape)
    return GatherCall(params, indices, out, math.prod(shape[:axis]), shape[axis],
                      math.prod(ids.type.shape), math.prod(shape[axis + 1:]) *
                      table.type.dtype.itemsize, _INDEX_TYPES[ids.type.dtype],
                      bool(step.attrs.get("negative_indices", False)), computed)


def _check(call: GatherCall, indices: str, size: Callable[[Dim], str], refuse: str
           ) -> list[str]:
    low = f"-({size(call.rows)})" if call.negative else "0"
    return [f"  {{ const {call.index_type} *gk_ix = (const {call.index_type} *){indices};",
            f"    for (int64_t i = 0; i < {size(call.count)}; ++i)",
            f"      if (gk_ix[i] < {low} || gk_ix[i] >= {size(call.rows)}) {refuse};",
            "  }"]


def emit_check(call: GatherCall, indices: str, size: Callable[[Dim], str]) -> list[str]:
    """Lines at the top of `gk_run` for indices that are an argument: any index out of range
    -> NotImplemented. `size` spells a dimension in C there."""
    return _check(call, indices, size, "Py_RETURN_NOTIMPLEMENTED")


def emit_gather(call: GatherCall, data: dict[int, str]) -> list[str]:
    """The step's lines in `gk_run`: one memcpy per gathered row (of each outer index). Its
    dynamic sizes are locals of their names (SymSize's text); computed indices are checked
    first, and one out of range returns 1 (the entry then returns NotImplemented)."""
    # a checked negative index is its row counted from the end
    rows = f"({call.rows})"
    row = f"(gk_ix[i] < 0 ? gk_ix[i] + {rows} : gk_ix[i])" if call.negative else "gk_ix[i]"
    check = _check(call, data[call.indices], lambda d: f"({d})", "return 1") \
        if call.computed else []
    return check + [
        f"  {{ const {call.index_type} *gk_ix = (const {call.index_type} *){data[call.indices]};",
        f"    const char *gk_src = (const char *){data[call.params]};",
        f"    char *gk_dst = (char *){data[call.out]};",
        f"    const int64_t gk_count = {call.count}, gk_rows = {rows}, "
        f"gk_bytes = {call.inner_bytes};",
        f"    for (int64_t o = 0; o < {call.outer}; ++o)",
        "      for (int64_t i = 0; i < gk_count; ++i)",
        "        memcpy(gk_dst + (o * gk_count + i) * gk_bytes, gk_src + "
        f"(o * gk_rows + {row}) * gk_bytes, (size_t)gk_bytes);",
        "  }",
    ]
