"""Metrics, MindSpore's (`mindspore.train.Accuracy`, `Loss`, `Top1CategoricalAccuracy`,
`Top5CategoricalAccuracy`): `clear()`, `update(*inputs)` once per batch, `eval()` at the end.
They run on the host in numpy, on the outputs a compiled evaluation step returned."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.errors import GraphKernelError, InputError
from graphkernel.frontend.tensor import Tensor


class MetricError(GraphKernelError, RuntimeError):
    """A metric read before any batch, or given outputs it cannot score."""


def _array(value: Any, metric: str, what: str) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.asnumpy()
    if isinstance(value, (np.ndarray, list, tuple, int, float, np.number)):
        return np.asarray(value)
    raise InputError(f"{metric}.update: {what} must be a Tensor or a numpy array, got "
                     f"{type(value).__name__}")


class Metric:
    """Base class: subclasses define clear, update and eval."""

    def clear(self) -> None:
        raise NotImplementedError

    def update(self, *inputs: Any) -> None:
        raise NotImplementedError

    def eval(self) -> Any:
        raise NotImplementedError

    def _inputs(self, inputs: tuple[Any, ...], count: int) -> list[np.ndarray]:
        name = type(self).__name__
        if len(inputs) != count:
            raise InputError(f"{name}.update takes {count} inputs (y_pred, y), got "
                             f"{len(inputs)}")
        return [_array(v, name, what) for v, what in zip(inputs, ("y_pred", "y"))]


def _labels(y_pred: np.ndarray, y: np.ndarray, metric: str) -> np.ndarray:
    """Class indices from `y`: indices as they are, one-hot rows by their argmax."""
    if y_pred.ndim != 2:
        raise InputError(f"{metric}: y_pred must be [batch, classes], got shape {y_pred.shape}")
    if y.ndim == 2 and y.shape == y_pred.shape:
        y = y.argmax(axis=1)
    if y.shape != y_pred.shape[:1]:
        raise InputError(f"{metric}: y of shape {y.shape} does not label y_pred of shape "
                         f"{y_pred.shape} (class indices [batch] or one-hot [batch, classes])")
    return y


class Accuracy(Metric):
    """The fraction of samples whose largest score is their label's class."""

    def __init__(self, eval_type: str = "classification") -> None:
        if eval_type != "classification":
            raise InputError(f"Accuracy: eval_type {eval_type!r} is not supported; graphkernel "
                             "has 'classification'")
        self.eval_type = eval_type
        self.clear()

    def clear(self) -> None:
        self._correct_num = 0
        self._total_num = 0

    def update(self, *inputs: Any) -> None:
        y_pred, y = self._inputs(inputs, 2)
        y = _labels(y_pred, y, "Accuracy")
        self._correct_num += int((y_pred.argmax(axis=1) == y).sum())
        self._total_num += len(y)

    def eval(self) -> float:
        if self._total_num == 0:
            raise MetricError("Accuracy can not be calculated, because the number of samples "
                              "is 0: update it with at least one batch first")
        return self._correct_num / self._total_num


class TopKCategoricalAccuracy(Metric):
    """The fraction of samples whose label is among their `k` largest scores."""

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"TopKCategoricalAccuracy: k must be an int >= 1, got {k!r}")
        self.k = k
        self.clear()

    def clear(self) -> None:
        self._correct_num = 0
        self._samples_num = 0

    def update(self, *inputs: Any) -> None:
        y_pred, y = self._inputs(inputs, 2)
        y = _labels(y_pred, y, type(self).__name__)
        top = np.argsort(-y_pred, axis=1, kind="stable")[:, :self.k]
        self._correct_num += int((top == y[:, None]).any(axis=1).sum())
        self._samples_num += len(y)

    def eval(self) -> float:
        if self._samples_num == 0:
            raise MetricError(f"{type(self).__name__} can not be calculated, because the "
                              "number of samples is 0: update it with at least one batch first")
        return self._correct_num / self._samples_num


class Top1CategoricalAccuracy(TopKCategoricalAccuracy):
    def __init__(self) -> None:
        super().__init__(1)


class Top5CategoricalAccuracy(TopKCategoricalAccuracy):
    def __init__(self) -> None:
        super().__init__(5)


class Loss(Metric):
    """The mean of the losses given to update (one per batch)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._sum_loss = 0.0
        self._total_num = 0

    def update(self, *inputs: Any) -> None:
        if len(inputs) != 1:
            raise InputError(f"Loss.update takes one input (the loss), got {len(inputs)}")
        loss = _array(inputs[0], "Loss", "the loss")
        if loss.ndim > 1:
            raise InputError(f"Loss.update: the loss must be a scalar or 1-D, got shape "
                             f"{loss.shape}")
        self._sum_loss += float(loss.mean())
        self._total_num += 1

    def eval(self) -> float:
        if self._total_num == 0:
            raise MetricError("Loss can not be calculated, because the number of losses is 0: "
                              "update it with at least one batch first")
        return self._sum_loss / self._total_num


# The names `Model(metrics={...})` takes, MindSpore's.
_FACTORY: dict[str, type[Metric]] = {
    "accuracy": Accuracy, "acc": Accuracy, "loss": Loss,
    "top_1_accuracy": Top1CategoricalAccuracy, "top_5_accuracy": Top5CategoricalAccuracy,
}


def get_metric_fn(name: str) -> Metric:
    """A new metric by MindSpore's name ('accuracy', 'loss', 'top_1_accuracy', ...)."""
    if name not in _FACTORY:
        raise InputError(f"unknown metric {name!r}; graphkernel has {sorted(_FACTORY)} (or pass "
                         "a dict of name: Metric instance)")
    return _FACTORY[name]()


def names_to_metrics(metrics: Any) -> dict[str, Metric]:
    """`Model(metrics=...)`: a set (or list) of names, or a dict of name: Metric."""
    if metrics is None:
        return {}
    if isinstance(metrics, dict):
        bad = [k for k, v in metrics.items() if not isinstance(v, Metric)]
        if bad:
            raise InputError(f"metrics: the values for {bad} are not Metric instances")
        return dict(metrics)
    if isinstance(metrics, (set, list, tuple, frozenset)) and \
            all(isinstance(m, str) for m in metrics):
        return {name: get_metric_fn(name) for name in sorted(metrics)}
    raise InputError(f"metrics must be a set of names or a dict of name: Metric, got "
                     f"{metrics!r}")
