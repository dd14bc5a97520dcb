"""nn.DistributedGradReducer: sums (or averages) a step's gradients over the process group
(graphkernel.communication) in one AllReduce, MindSpore's gradient reducer for data parallel;
or, with `bucket_mb`, in buckets whose sums overlap the backward pass (PyTorch DDP's way)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.communication import get_group_size
from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tracing import user_location
from graphkernel.ops import operations as P


class DistributedGradReducer(Cell):
    """`reducer(grads)` -> the gradients summed over every process, divided by `degree` (the
    group size unless given) when `mean`. All gradients go into one AllReduce node: its tensors
    of one dtype travel as one buffer, one collective call per dtype and step.

    With `bucket_mb` (a positive number) the gradients go, last parameter first (the order the
    backward pass makes them), into buckets of one dtype and at most that many megabytes (a
    larger gradient is a bucket of its own). Each bucket is one AllReduceStart, begun once its
    gradients are made; one AllReduceWait waits for them all, before the first use of the sums
    (the optimizer): the sums of the last layers travel while the backward pass computes the
    first layers' gradients. The
    results are the same as without buckets: each element is the same sum over the ranks."""

    def __init__(self, parameters: Any, mean: bool = True, degree: int | None = None,
                 bucket_mb: float | None = None) -> None:
        super().__init__()
        self.count = len(list(parameters))
        degree = get_group_size() if degree is None else degree
        if not isinstance(degree, int) or isinstance(degree, bool) or degree < 1:
            raise InputError(f"DistributedGradReducer degree must be a positive int, got "
                             f"{degree!r}", user_location())
        self.degree = degree
        self.mean = bool(mean)
        scale = 1.0 / degree if self.mean else 1.0
        self.all_reduce = P.AllReduce(op="sum", scale=scale)
        if bucket_mb is not None and (isinstance(bucket_mb, bool) or not isinstance(
                bucket_mb, (int, float)) or not bucket_mb > 0 or bucket_mb == float("inf")):
            raise InputError(f"DistributedGradReducer bucket_mb must be None or a positive "
                             f"number of megabytes, got {bucket_mb!r}", user_location())
        self.bucket_bytes = None if bucket_mb is None else int(bucket_mb * 1e6)
        self.scale = scale
        self.start = P.AllReduceStart()

    def construct(self, grads: Any) -> Any:
        grads = tuple(grads)
        if len(grads) != self.count:
            raise InputError(f"DistributedGradReducer was made for {self.count} parameter(s), "
                             f"got {len(grads)} gradient(s)", user_location())
        if not grads:
            return grads
        if self.bucket_bytes is None:
            reduced = self.all_reduce(grads)
            return tuple(reduced) if isinstance(reduced, (tuple, list)) else (reduced,)
        buckets = self.buckets([(g.dtype, math.prod(g.shape) * g.dtype.itemsize)
                                for g in grads])
        tickets = [self.start(tuple(grads[i] for i in bucket)) for bucket in buckets]
        order = [i for bucket in buckets for i in bucket]
        wait = P.AllReduceWait(buckets=tuple(len(b) for b in buckets), scale=self.scale)
        summed = wait((*tickets, *(grads[i] for i in order)))
        summed = summed if isinstance(summed, (tuple, list)) else (summed,)
        out: list[Any] = [None] * len(grads)
        for i, value in zip(order, summed):
            out[i] = value
        return tuple(out)

    def buckets(self, gradients: list[tuple[np.dtype, int]]) -> list[list[int]]:
        """The gradients' positions in buckets, from (dtype, bytes) of each: last first, one
        dtype per bucket, at most `bucket_bytes` each (a larger gradient alone)."""
        assert self.bucket_bytes is not None
        buckets: list[list[int]] = []
        filled, dtype = 0, None
        for i in reversed(range(len(gradients))):
            kind, size = gradients[i]
            if not buckets or kind != dtype or filled + size > self.bucket_bytes:
                buckets.append([])
                filled, dtype = 0, kind
            buckets[-1].append(i)
            filled += size
        return buckets
