"""Losses, MindSpore's: `reduction` is 'none', 'mean' or 'sum'. Built from primitives, so they
fuse with what computes their inputs and their gradients come from the ops' own rules."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tensor import apply_op
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


class CrossEntropyLoss(LossBase):
    """MindSpore's nn.CrossEntropyLoss(weight=None, ignore_index=-100, reduction='mean',
    label_smoothing=0.0): cross entropy of `logits` (N, C), (N, C, d1, ...) or (C,), class axis
    1 (0 for 1-D), against either class indices (integer labels without the class axis) or
    class probabilities (float labels of the logits' shape).

    Indices, per position n: l = -w[y] log p[y] (0 where y == ignore_index); 'mean' divides the
    sum by the sum of w[y] over positions not ignored. With label_smoothing e the loss is
    (1 - e) l + e / C * s, s = -sum_c log p[c] (0 where ignored; no class weights), 'mean'
    taking s's plain mean over positions, as MindSpore's nll_loss does. Probabilities: labels become
    labels (1 - e) + e / C, the loss -sum_c w[c] labels[c] log p[c]; 'mean' divides the sum by
    the number of positions. log p comes from LogSoftmax (no overflow)."""

    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0) -> None:
        super().__init__(reduction)
        where = user_location()
        if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
            raise InputError(f"CrossEntropyLoss: ignore_index must be an int, got "
                             f"{ignore_index!r}", where)
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
                or not 0.0 <= label_smoothing <= 1.0:
            raise InputError(f"CrossEntropyLoss: label_smoothing must be a float in [0, 1], got "
                             f"{label_smoothing!r}", where)
        if weight is not None:
            values = weight.asnumpy() if hasattr(weight, "asnumpy") else np.asarray(weight)
            if values.ndim != 1 or values.dtype.kind != "f":
                raise InputError(f"CrossEntropyLoss: weight must be a 1-D float tensor (one "
                                 f"weight per class), got {values.dtype} "
                                 f"{tuple(values.shape)}", where)
            weight = values
        self.weight = weight
        self.ignore_index = ignore_index
        self.label_smoothing = float(label_smoothing)

    def construct(self, logits: Any, labels: Any) -> Any:
        shape = tuple(logits.shape)
        if len(shape) == 0 or logits.dtype.kind != "f":
            raise InputError(f"CrossEntropyLoss takes float logits of shape (N, C, ...) or (C,), "
                             f"got {logits.dtype} {shape}", user_location())
        class_axis = 0 if len(shape) == 1 else 1
        classes = shape[class_axis]
        if self.weight is not None and self.weight.shape[0] != classes:
            raise InputError(f"CrossEntropyLoss: weight has {self.weight.shape[0]} entries for "
                             f"{classes} classes", user_location())
        # The weight, shaped to broadcast along the class axis.
        weight = None if self.weight is None else self.weight.astype(logits.dtype).reshape(
            (classes,) + (1,) * (len(shape) - class_axis - 1))
        log_p = P.LogSoftmax(axis=class_axis)(logits)
        smoothing = self.label_smoothing
        if labels.dtype.kind == "f":
            if tuple(labels.shape) != shape:
                raise InputError(f"CrossEntropyLoss: probability labels of shape "
                                 f"{tuple(labels.shape)} for logits of shape {shape} (class "
                                 "indices must be integers)", user_location())
            if smoothing > 0.0:
                labels = labels * (1.0 - smoothing) + smoothing / classes
            terms = log_p * labels if weight is None else log_p * labels * weight
            if self.reduction == "none":
                return -P.ReduceSum()(terms, class_axis)
            total = -P.ReduceSum()(terms, ())
            if self.reduction == "sum":
                return total
            return total / float(logits.size // classes)
        expected = shape[:class_axis] + shape[class_axis + 1:]
        if labels.dtype.kind not in "iu" or tuple(labels.shape) != expected:
            raise InputError(f"CrossEntropyLoss takes class indices (integers of shape "
                             f"{expected}) or probabilities (floats of shape {shape}), got "
                             f"{labels.dtype} {tuple(labels.shape)}", user_location())
        # A label out of range would one-hot to a row of zeros, a loss of 0: checked where the
        # graph runs (labels are data), an error as in MindSpore.
        labels = apply_op("CheckIndices", [labels], {
            "size": int(classes), "ignore": self.ignore_index,
            "what": "CrossEntropyLoss: class index"})
        kept = P.Cast()(P.NotEqual()(labels, self.ignore_index), logits.dtype)
        hot = P.Cast()(P.OneHot(axis=class_axis)(labels, classes, 1.0, 0.0), logits.dtype)
        if weight is not None:
            hot = hot * weight
        picked = P.ReduceSum()(hot, class_axis) * kept  # w[y], 0 where ignored
        loss = -P.ReduceSum()(hot * log_p, class_axis) * kept
        smooth = None
        if smoothing > 0.0:  # unweighted, as MindSpore's nll_loss has it
            smooth = -P.ReduceSum()(log_p, class_axis) * kept
        if self.reduction == "sum":
            loss = P.ReduceSum()(loss, ())
            smooth = None if smooth is None else P.ReduceSum()(smooth, ())
        elif self.reduction == "mean":
            loss = P.ReduceSum()(loss, ()) / P.ReduceSum()(picked, ())
            smooth = None if smooth is None else P.ReduceMean()(smooth, ())
        if smooth is None:
            return loss
        return (1.0 - smoothing) * loss + (smoothing / classes) * smooth
