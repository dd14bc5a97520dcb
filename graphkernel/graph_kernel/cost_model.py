"""When fusing is legal but not worth it. Tunable heuristics live here, apart from legality
(graph_kernel/cluster.py and schedule.py decide what *can* fuse). How the kernels then run is
not fusion's: the C backend's settings (threads, streaming stores, prefetch) are its own
(backends/c/config.py), and BLAS threads and prefault the plan's (runtime/plan.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from graphkernel.graph_kernel.schedule import Schedule
from graphkernel.ir.graph import Constant, Node, Value
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import Dim, SymSize


@dataclass(frozen=True)
class CostModel:
    max_inputs: int = 24
    recompute_limit: int = 8  # an expensive op may be recomputed at most this many times over
    # Parallel (horizontal) fusion (graph_kernel/parallel_fusion.py): independent groups of a
    # graph launched as one kernel. A loop nest moving more than `parallel_max_bytes` is large:
    # its memory traffic (~100 us per MiB here) dwarfs a launch (~1-2 us through the Python
    # runner, ~0.1 us from the C entry), so two large nests gain nothing from sharing one.
    parallel_max_bytes: int = 1 << 20
    # Groups one parallel kernel holds at most.
    parallel_max_groups: int = 32

    def decline(self, nodes: list[Node], inputs: list[Value], sched: Schedule) -> str | None:
        """A reason not to fuse, or None when fusing pays."""
        buffers = [v for v in inputs if not (isinstance(v, Constant) and v.is_scalar)]
        if len(buffers) > self.max_inputs:
            return f"the kernel would read {len(buffers)} inputs (limit {self.max_inputs})"
        space = math.prod(sched.space) if sched.space else 1
        for node in nodes:
            # Recomputing an expensive op (OpDef.expensive) for every element of a larger
            # iteration space can cost more than the memory traffic fusion saves.
            if not get_op(node.op).expensive or sched.is_outer(node):
                continue
            aligned = sched.aligned[node.uid]
            size = math.prod(aligned) if aligned else 1
            # Constant over the innermost axes (a per-channel value over H, W), it is computed
            # once per iteration of the loops outside them (the compiler hoists it): a small
            # fraction of the kernel's work when those inner loops are long.
            varying = max((i for i, d in enumerate(aligned) if d != 1), default=-1)
            loops = math.prod(sched.space[:varying + 1]) if sched.space else 1
            if isinstance(space, SymSize):  # a dynamic size: repeats may grow without bound
                times = _times(loops, size)
                if times is None or (size and times > self.recompute_limit):
                    return (f"{node.op} on {size} elements would be recomputed "
                            f"{'N' if times is None else times}x across the iteration space "
                            f"{sched.space}")
                continue
            if size and loops // max(size, 1) > self.recompute_limit and \
                    loops * self.recompute_limit > space:
                return (f"{node.op} on {size} elements would be recomputed "
                        f"{loops // size}x across the iteration space {sched.space}")
        return None


def parallel_decline(cost: CostModel, nest_bytes: list[int], interleaved: bool,
                     shared_bytes: int) -> str | None:
    """A reason not to launch independent groups as one kernel, or None when it pays.
    `nest_bytes`: bytes each loop nest of the merged kernel would move; `interleaved`: the
    newcomer shares a loop nest with a group already there, which reads `shared_bytes` of the
    same inputs (read once instead of twice)."""
    limit = cost.parallel_max_bytes
    if interleaved:
        if shared_bytes or sum(nest_bytes) <= limit:
            return None
        return (f"one loop nest would move {sum(nest_bytes)} bytes and read no input of the "
                f"other group: it already saturates memory (parallel_max_bytes={limit})")
    large = [b for b in nest_bytes if b > limit]
    if len(large) >= 2:
        return (f"loop nests of {' and '.join(str(b) for b in large[:2])} bytes each already "
                f"saturate memory (parallel_max_bytes={limit}): one launch saved is a small "
                "part of their time")
    return None


def _times(space: Dim, size: Dim) -> int | None:
    """How often a value of `size` elements repeats over `space`; None when that grows with a
    dynamic size (unbounded: never worth recomputing an expensive op for)."""
    if isinstance(space, SymSize) or isinstance(size, SymSize):
        if isinstance(space, SymSize) and isinstance(size, SymSize) and space.names == size.names:
            return space.coef // max(size.coef, 1)
        return None if isinstance(space, SymSize) else 0
    return space // max(size, 1)


DEFAULT_COST_MODEL = CostModel()
