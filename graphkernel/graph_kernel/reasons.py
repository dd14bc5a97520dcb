"""Why two ops ended up in different kernels (the WhyNoFuse of this compiler): a producer and
its consumer left apart by vertical fusion, or two independent groups left as two launches by
parallel (horizontal) fusion."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FuseRule(StrEnum):
    """The rule that refused a fusion: legality (pattern, flag, limit, cycle, shape) or the cost
    model (cost). A str, so reports and tests can compare it with its name."""

    PATTERN = "pattern"  # an op kind that does not fuse (opaque, a data-moving view)
    FLAG = "flag"  # graph_kernel_flags said no
    LIMIT = "limit"  # the group would exceed composite_op_limit_size
    CYCLE = "cycle"  # fusing would make the graph cyclic
    SHAPE = "shape"  # no single loop nest computes the group
    COST = "cost"  # legal, but the cost model says it does not pay


RULES = tuple(FuseRule)  # in the order reports list them


@dataclass(frozen=True)
class FusionReason:
    """`producer` feeds `consumer`; `rule` says which rule refused; `detail` says it in words.
    A `parallel` reason is about two groups with no edge between them (parallel fusion would
    have launched them as one kernel): `producer` is the earlier, `consumer` the later."""

    stage: str
    producer: str
    consumer: str
    rule: FuseRule
    detail: str
    parallel: bool = False

    def __str__(self) -> str:
        if self.parallel:
            return (f"{self.producer} || {self.consumer}: not one launch ({self.rule}): "
                    f"{self.detail}")
        return f"{self.producer} -> {self.consumer}: not fused ({self.rule}): {self.detail}"
