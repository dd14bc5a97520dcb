"""Training wrappers, MindSpore's: `WithLossCell` joins a network and its loss (`WithEvalCell`
also returns the outputs and label, for metrics);
`TrainOneStepCell` is one training step in one compiled graph: the forward, its backward
(passes/autodiff.py) and the optimizer's in-place updates (Graph.assigns)."""
from __future__ import annotations

from typing import Any

from graphkernel.communication import check_same_parameters
from graphkernel.errors import InputError
from graphkernel.frontend import context
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.compile import compile_cached
from graphkernel.frontend.grad import _Spec, traced_gradients
from graphkernel.frontend.tracing import current_tracer, user_location
from graphkernel.nn.distributed import DistributedGradReducer
from graphkernel.nn.optim import Optimizer


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
    metrics (MindSpore's)."""

    def __init__(self, network: Cell, loss_fn: Cell, add_cast_fp32: bool = False) -> None:
        super().__init__(auto_prefix=False)
        self._network = network
        self._loss_fn = loss_fn
        self.add_cast_fp32 = add_cast_fp32

    def construct(self, data: Any, label: Any) -> Any:
        outputs = self._network(data)
        return self._loss_fn(outputs, label), outputs, label
