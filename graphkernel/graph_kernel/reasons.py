"""Why two adjacent ops ended up in different kernels (the WhyNoFuse of this compiler)."""
from __future__ import annotations

from dataclasses import dataclass

RULES = ("pattern", "flag", "limit", "cycle", "shape", "cost")


@dataclass(frozen=True)
class FusionReason:
    """`producer` feeds `consumer`; `rule` is one of RULES; `detail` says it in words."""

    stage: str
    producer: str
    consumer: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.producer} -> {self.consumer}: not fused ({self.rule}): {self.detail}"
