"""Training wrappers, MindSpore's: `WithLossCell` joins a network and its loss (`WithEvalCell`
also returns the outputs and label, for metrics);
`TrainOneStepCell` is one training step in one compiled graph: the forward, its backward
(passes/autodiff.py) and the optimizer's in-place updates (Graph.assigns)."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.communication import check_same_parameters
from graphkernel.errors import GraphModeError, InputError
from graphkernel.frontend import context
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.compile import compile_cached
from graphkernel.frontend.grad import _Spec, traced_gradients
from graphkernel.frontend.tensor import Tensor
from graphkernel.frontend.tracing import current_tracer, user_location
from graphkernel.nn.distributed import DistributedGradReducer
from graphkernel.nn.optim import Optimizer
from graphkernel.ops import operations as P


class WithLossCell(Cell):
    """loss_fn(backbone(data), label)."""

    def __init__(self, backbone: Cell, loss_fn: Cell) -> None:
        super().__init__(auto_prefix=False)  # the backbone's weights keep their names
        self._backbone = backbone
        self._loss_fn = loss_fn

    def construct(self, data: Any, label: Any) -> Any:
        return self._loss_fn(self._backbone(data), label)

    @property
    def backbone_network(self) -> Cell:
        return self._backbone


class TrainOneStepCell(Cell):
    """`step(*inputs)` runs network(*inputs) (a scalar loss), its gradients with respect to the
    optimizer's parameters (scaled by `sens`), and the optimizer's update, as one graph; it
    returns the loss from before the update."""

    def __init__(self, network: Cell, optimizer: Optimizer, sens: float = 1.0) -> None:
        super().__init__(auto_prefix=False)
        if not isinstance(optimizer, Optimizer):
            raise InputError(f"TrainOneStepCell takes an optimizer from graphkernel.nn (Momentum, "
                             f"SGD, Adam, ...), got {type(optimizer).__name__}", user_location())
        self.network = network
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.sens = float(sens)
        self.network.set_train()
        # Data parallel: every process sums (or averages) its gradients with the others'
        # before the optimizer, so all hold the same weights after each step.
        self.grad_reducer: DistributedGradReducer | None = None
        if context.get_auto_parallel_context("parallel_mode") == context.DATA_PARALLEL:
            self.grad_reducer = DistributedGradReducer(
                self.weights, context.get_auto_parallel_context("gradients_mean"),
                bucket_mb=context.get_auto_parallel_context("grad_bucket_mb"))
            # Gradients travel as one flat buffer per dtype: ranks whose parameters differ
            # would sum misaligned values, or wait on each other forever. Checked once, here.
            check_same_parameters(
                [(p.name, p.shape, p.dtype) for p in self.weights],
                "TrainOneStepCell's parameters")

    def __call__(self, *inputs: Any) -> Any:
        if current_tracer() is None:  # compiled in PYNATIVE mode too: the step is one graph
            return compile_cached(self, inputs)(*inputs)
        return super().__call__(*inputs)

    def construct(self, *inputs: Any) -> Any:
        tracer = current_tracer()
        assert tracer is not None
        spec = _Spec(None, False, tuple(self.weights), with_value=True, sens=self.sens)
        loss, grads = traced_gradients(tracer, self.network, spec, inputs)
        if self.grad_reducer is not None:
            grads = self.grad_reducer(grads)
        self.optimizer(grads)
        return loss


class WithEvalCell(Cell):
    """(loss_fn(network(data), label), network(data), label): what `Model.eval` feeds its
    metrics (MindSpore's). add_cast_fp32: float outputs and label cast to float32 first."""

    def __init__(self, network: Cell, loss_fn: Cell, add_cast_fp32: bool = False) -> None:
        super().__init__(auto_prefix=False)
        self._network = network
        self._loss_fn = loss_fn
        self.add_cast_fp32 = add_cast_fp32

    def construct(self, data: Any, label: Any) -> Any:
        outputs = self._network(data)
        if self.add_cast_fp32:  # a float16 network (amp O2, O3) scored in float32
            outputs = _to_float32(outputs)
            label = _to_float32(label)
        return self._loss_fn(outputs, label), outputs, label


def _to_float32(value: Any) -> Any:
    if isinstance(value, Tensor) and value.dtype.kind == "f" and value.dtype != np.float32:
        return P.Cast()(value, np.float32)
    return value


class _ScaledGradients(Cell):
    """(loss, gradients / scale) of network(*data) with respect to `weights`, the backward pass
    seeded with `scale` (the last input): one graph."""

    def __init__(self, network: Cell, weights: tuple[Any, ...]) -> None:
        super().__init__(auto_prefix=False)
        self.network = network
        self.weights = weights

    def __call__(self, *inputs: Any) -> Any:
        if current_tracer() is None:
            return compile_cached(self, inputs)(*inputs)
        return super().__call__(*inputs)

    def construct(self, *inputs: Any) -> Any:
        tracer = current_tracer()
        assert tracer is not None
        spec = _Spec(None, False, tuple(self.weights), with_value=True, sens_param=True)
        loss, grads = traced_gradients(tracer, self.network, spec, inputs)
        scale = inputs[-1]
        return loss, tuple(g / scale for g in grads)


class _ApplyGradients(Cell):
    """The optimizer's update from given gradients, as one graph."""

    def __init__(self, optimizer: Optimizer) -> None:
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer

    def __call__(self, *grads: Any) -> Any:
        if current_tracer() is None:
            return compile_cached(self, grads)(*grads)
        return super().__call__(*grads)

    def construct(self, *grads: Any) -> Any:
        self.optimizer(grads)
        return grads[0]  # a graph returns a tensor; the update is its point


class TrainOneStepWithLossScaleCell(Cell):
    """MindSpore's TrainOneStepWithLossScaleCell(network, optimizer, scale_sense): a training
    step with the loss scaled by `scale_sense` before the backward pass (so float16 gradients
    do not underflow) and the gradients divided by it again before the update. A step whose
    gradients overflow (Inf or NaN) is dropped: weights and optimizer state stay as they were.

    `scale_sense` is a number or a one-element Tensor (a fixed scale), or a loss-scale manager
    from graphkernel.amp (`manager.get_update_cell()`), which gives each step's scale and is
    told whether it overflowed (DynamicLossScaleManager then lowers or raises it). Returns
    (loss, overflow, scale), MindSpore's. Two graphs per step: the scaled gradients, then, unless
    the step is dropped, the optimizer's update; the overflow check runs on the host between."""

    def __init__(self, network: Cell, optimizer: Optimizer, scale_sense: Any) -> None:
        super().__init__(auto_prefix=False)
        if not isinstance(optimizer, Optimizer):
            raise InputError(f"TrainOneStepWithLossScaleCell takes an optimizer from "
                             f"graphkernel.nn, got {type(optimizer).__name__}", user_location())
        self.network = network
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.network.set_train()
        self.manager: Any = None
        self.fixed_scale = 1.0
        if all(hasattr(scale_sense, m) for m in ("get_loss_scale", "update_loss_scale",
                                                 "get_drop_overflow_update")):
            self.manager = scale_sense
        else:
            value = scale_sense.asnumpy() if hasattr(scale_sense, "asnumpy") else scale_sense
            try:
                self.fixed_scale = float(np.asarray(value, np.float64).reshape(()))
            except (TypeError, ValueError):
                raise InputError(f"TrainOneStepWithLossScaleCell: scale_sense must be a "
                                 f"number, a one-element Tensor or a loss-scale manager, got "
                                 f"{scale_sense!r:.60}", user_location()) from None
        self.gradients = _ScaledGradients(network, tuple(self.weights))
        self.apply_gradients = _ApplyGradients(optimizer)

    def __call__(self, *inputs: Any) -> Any:
        if current_tracer() is not None:
            raise GraphModeError("TrainOneStepWithLossScaleCell runs as a step of its own (its "
                                 "overflow check decides on the host whether to update); call "
                                 "it from Python, not inside a construct", user_location())
        return self.construct(*inputs)

    def construct(self, *inputs: Any) -> Any:
        scale = self.manager.get_loss_scale() if self.manager is not None else self.fixed_scale
        loss, grads = self.gradients(*inputs, Tensor(np.asarray(scale, np.float32)))
        overflow = not all(bool(np.isfinite(g.asnumpy()).all()) for g in grads)
        drop = self.manager.get_drop_overflow_update() if self.manager is not None else True
        if not (overflow and drop):
            self.apply_gradients(*grads)
        if self.manager is not None:
            self.manager.update_loss_scale(overflow)
        return loss, Tensor(np.asarray(overflow)), Tensor(np.asarray(scale, np.float32))
