"""nn.DistributedGradReducer: sums (or averages) a step's gradients over the process group
(graphkernel.communication) in one AllReduce, MindSpore's gradient reducer for data parallel."""
from __future__ import annotations

from typing import Any

from graphkernel.communication import get_group_size
from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tracing import user_location
from graphkernel.ops import operations as P


class DistributedGradReducer(Cell):
    """`reducer(grads)` -> the gradients summed over every process, divided by `degree` (the
    group size unless given) when `mean`. All gradients go into one AllReduce node: its tensors
    of one dtype travel as one buffer, one collective call per dtype and step."""

    def __init__(self, parameters: Any, mean: bool = True, degree: int | None = None) -> None:
        super().__init__()
        self.count = len(list(parameters))
        degree = get_group_size() if degree is None else degree
        if not isinstance(degree, int) or isinstance(degree, bool) or degree < 1:
            raise InputError(f"DistributedGradReducer degree must be a positive int, got "
                             f"{degree!r}", user_location())
        self.degree = degree
        self.mean = bool(mean)
        self.all_reduce = P.AllReduce(op="sum", scale=1.0 / degree if self.mean else 1.0)

    def construct(self, grads: Any) -> Any:
        grads = tuple(grads)
        if len(grads) != self.count:
            raise InputError(f"DistributedGradReducer was made for {self.count} parameter(s), "
                             f"got {len(grads)} gradient(s)", user_location())
        if not grads:
            return grads
        reduced = self.all_reduce(grads)
        return tuple(reduced) if isinstance(reduced, (tuple, list)) else (reduced,)
