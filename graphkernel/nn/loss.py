"""Losses, MindSpore's: `reduction` is 'none', 'mean' or 'sum'. Built from primitives, so they
fuse with what computes their inputs and their gradients come from the ops' own rules."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tracing import user_location
from graphkernel.ops import operations as P

REDUCTIONS = ("none", "mean", "sum")


class LossBase(Cell):
    """A loss: `get_loss` applies the reduction (over every axis for 'mean' and 'sum')."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in REDUCTIONS:
            raise InputError(f"{type(self).__name__}: reduction must be one of "
                             f"{', '.join(map(repr, REDUCTIONS))}, got {reduction!r}",
                             user_location())
        self.reduction = reduction

    def get_loss(self, x: Any, weights: Any = 1.0) -> Any:
        if not (isinstance(weights, float) and weights == 1.0):
            x = x * weights
        if self.reduction == "mean":
            return P.ReduceMean()(x, ())
        if self.reduction == "sum":
            return P.ReduceSum()(x, ())
        return x


class SoftmaxCrossEntropyWithLogits(LossBase):
    """-sum(labels * log_softmax(logits)) over the class axis (the last), computed through
    LogSoftmax's log-sum-exp (no overflow). sparse=True: labels are int32 class indices."""

    def __init__(self, sparse: bool = False, reduction: str = "none") -> None:
        super().__init__(reduction)
        self.sparse = sparse

    def construct(self, logits: Any, labels: Any) -> Any:
        if self.sparse:
            if labels.dtype.kind not in "iu" or tuple(labels.shape) != tuple(logits.shape[:-1]):
                raise InputError(f"SoftmaxCrossEntropyWithLogits(sparse=True) takes integer "
                                 f"labels of shape {tuple(logits.shape[:-1])} (class indices), "
                                 f"got {labels.dtype} {tuple(labels.shape)}", user_location())
            classes = np.arange(logits.shape[-1], dtype=labels.dtype)
            labels = P.Cast()(P.Equal()(P.ExpandDims()(labels, -1), classes), logits.dtype)
        elif tuple(labels.shape) != tuple(logits.shape):
            raise InputError(f"SoftmaxCrossEntropyWithLogits: labels of shape "
                             f"{tuple(labels.shape)} for logits of shape {tuple(logits.shape)} "
                             "(one-hot or probabilities; sparse=True for class indices)",
                             user_location())
        loss = -P.ReduceSum()(P.LogSoftmax()(logits) * labels, -1)
        return self.get_loss(loss)


class MSELoss(LossBase):
    """(logits - labels)^2."""

    def construct(self, logits: Any, labels: Any) -> Any:
        return self.get_loss(P.SquaredDifference()(logits, labels))


class L1Loss(LossBase):
    """|logits - labels|."""

    def construct(self, logits: Any, labels: Any) -> Any:
        return self.get_loss(P.Abs()(logits - labels))


class BCEWithLogitsLoss(LossBase):
    """Binary cross entropy on logits, y softplus(-x) + (1 - y) softplus(x), computed as
    max(x, 0) - x y + log1p(exp(-|x|)) (exp never overflows; log1p keeps the tail: log(1 + e)
    was 0 beyond |x| = 17 in float32, where the loss is 2e-9). `weight` scales each element;
    `pos_weight` p the positive term: p y softplus(-x) + (1 - y) softplus(x), whose terms are
    never negative, so nothing cancels (MindSpore's (1 - y) x + (1 + (p - 1) y) (log1p(exp(-|x|))
    + max(-x, 0)) gave 0 for y = 0, x = -20)."""

    def __init__(self, reduction: str = "mean", weight: Any = None,
                 pos_weight: Any = None) -> None:
        super().__init__(reduction)
        self.weight = weight
        self.pos_weight = pos_weight

    def construct(self, logits: Any, labels: Any) -> Any:
        tail = P.Log1p()(P.Exp()(-P.Abs()(logits)))  # log(1 + exp(-|x|)), in (0, log 2]
        if self.pos_weight is None:
            loss = P.Maximum()(logits, 0.0) - logits * labels + tail
        else:
            positive = P.Maximum()(-logits, 0.0) + tail  # softplus(-x)
            negative = P.Maximum()(logits, 0.0) + tail  # softplus(x)
            loss = self.pos_weight * labels * positive + (1.0 - labels) * negative
        return self.get_loss(loss, 1.0 if self.weight is None else self.weight)
