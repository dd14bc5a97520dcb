"""`Model`, MindSpore's training front door: a network, its loss and optimizer, trained over a
`graphkernel.dataset` pipeline with callbacks (`train`, `fit`), scored with metrics (`eval`),
and run on inputs (`predict`).

The training network is MindSpore's: `TrainOneStepCell(WithLossCell(network, loss_fn),
optimizer)`, one compiled graph per step (forward, backward and the optimizer's in-place
update). Evaluation runs `WithEvalCell(network, loss_fn)` and feeds its (loss, outputs, label)
to the metrics on the host."""
from __future__ import annotations

import warnings
from typing import Any

from graphkernel.amp import AMP_LEVELS, LossScaleManager, auto_mixed_precision
from graphkernel.dataset import Dataset
from graphkernel.errors import InputError, NoEffectWarning
from graphkernel.frontend.cell import Cell
from graphkernel.nn.optim import Optimizer
from graphkernel.nn.wrap import (
    TrainOneStepCell,
    TrainOneStepWithLossScaleCell,
    WithEvalCell,
    WithLossCell,
)
from graphkernel.train.callback import (
    CallbackList,
    InternalCallbackParam,
    RunContext,
    loss_value,
)
from graphkernel.train.metrics import Loss, names_to_metrics
from graphkernel.train.progress import training_bar


def _positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"Model: {name} must be an int >= {minimum}, got {value!r}")
    return value


class Model:
    """`Model(network, loss_fn=None, optimizer=None, metrics=None, eval_network=None,
    eval_indexes=None, amp_level="O0", loss_scale_manager=None)`. amp_level sets the network's
    mixed precision (graphkernel.amp.auto_mixed_precision); a loss_scale_manager from
    graphkernel.amp makes each step TrainOneStepWithLossScaleCell's. With a loss and an
    optimizer, `train` updates the network; with metrics (a set of names such as {"accuracy",
    "loss"}, or a dict of name: Metric), `eval` scores it. `eval_indexes` says which of
    eval_network's outputs are (loss, outputs, label)."""

    def __init__(self, network: Cell, loss_fn: Cell | None = None,
                 optimizer: Optimizer | None = None, metrics: Any = None,
                 eval_network: Cell | None = None, eval_indexes: list[int] | None = None,
                 amp_level: str = "O0", boost_level: str = "O0", **kwargs: Any) -> None:
        if not isinstance(network, Cell):
            raise InputError(f"Model: network must be a Cell, got {type(network).__name__}")
        if loss_fn is not None and not isinstance(loss_fn, Cell):
            raise InputError(f"Model: loss_fn must be a Cell (a loss from graphkernel.nn), got "
                             f"{type(loss_fn).__name__}")
        if optimizer is not None and not isinstance(optimizer, Optimizer):
            raise InputError(f"Model: optimizer must be a graphkernel.nn optimizer, got "
                             f"{type(optimizer).__name__}")
        self._loss_scale_manager = kwargs.pop("loss_scale_manager", None)
        if self._loss_scale_manager is not None and \
                not isinstance(self._loss_scale_manager, LossScaleManager):
            raise InputError(f"Model: loss_scale_manager must be a graphkernel.amp "
                             f"FixedLossScaleManager or DynamicLossScaleManager, got "
                             f"{type(self._loss_scale_manager).__name__}")
        if amp_level not in AMP_LEVELS:
            raise InputError(f"Model: amp_level must be one of {', '.join(AMP_LEVELS)}, got "
                             f"{amp_level!r}")
        if boost_level != "O0" or kwargs:
            given = {"boost_level": boost_level, **kwargs}
            given = {k: v for k, v in given.items() if v != "O0"}
            warnings.warn(f"Model: {given} have no effect in graphkernel", NoEffectWarning,
                          stacklevel=2)
        # MindSpore's build_train_network: the network itself computes at amp_level.
        auto_mixed_precision(network, amp_level)
        self._amp_level = amp_level
        self._network = network
        self._loss_fn = loss_fn
        self._optimizer = optimizer
        self._metric_fns = names_to_metrics(metrics)
        if eval_indexes is not None and (eval_network is None or len(eval_indexes) != 3):
            raise InputError("Model: eval_indexes needs an eval_network and three indexes "
                             "(loss, outputs, label)")
        if self._metric_fns and eval_network is None and loss_fn is None:
            raise InputError("Model: metrics need a loss_fn (to build the evaluation network) "
                             "or an eval_network")
        self._eval_indexes = eval_indexes
        self._train_network = self._build_train_network()
        self._eval_network = eval_network if eval_network is not None else \
            WithEvalCell(network, loss_fn, amp_level in ("O2", "O3")) \
            if loss_fn is not None else None
        if eval_network is None and loss_fn is not None:
            self._eval_indexes = [0, 1, 2]

    def _build_train_network(self) -> Cell:
        if self._optimizer is not None:
            net = WithLossCell(self._network, self._loss_fn) if self._loss_fn is not None \
                else self._network
            if self._loss_scale_manager is not None:
                return TrainOneStepWithLossScaleCell(
                    net, self._optimizer, self._loss_scale_manager.get_update_cell())
            return TrainOneStepCell(net, self._optimizer)
        if self._loss_fn is not None:
            return WithLossCell(self._network, self._loss_fn)
        return self._network

    @property
    def train_network(self) -> Cell:
        return self._train_network

    @property
    def predict_network(self) -> Cell:
        return self._network

    @property
    def eval_network(self) -> Cell | None:
        return self._eval_network

    # -- training -------------------------------------------------------------------------------
    def train(self, epoch: int, train_dataset: Dataset, callbacks: Any = None,
              dataset_sink_mode: bool = False, sink_size: int = -1,
              initial_epoch: int = 0) -> None:
        """Train for epochs initial_epoch+1 .. epoch over `train_dataset` (each batch's columns
        are the training network's inputs), calling `callbacks` at each step and epoch."""
        self._check_sink(dataset_sink_mode)
        self._train(epoch, train_dataset, callbacks, initial_epoch, None, 1)

    def fit(self, epoch: int, train_dataset: Dataset, valid_dataset: Dataset | None = None,
            valid_frequency: int = 1, callbacks: Any = None, dataset_sink_mode: bool = False,
            valid_dataset_sink_mode: bool = False, sink_size: int = -1,
            initial_epoch: int = 0) -> None:
        """`train`, evaluating on `valid_dataset` every `valid_frequency` epochs; callbacks
        read the results as cb_params.metrics and cb_params.eval_results (with "eval_loss")."""
        self._check_sink(dataset_sink_mode or valid_dataset_sink_mode)
        valid_frequency = _positive_int(valid_frequency, "valid_frequency")
        if valid_dataset is not None:
            self._check_dataset(valid_dataset, "fit's valid_dataset")
            if not self._metric_fns:
                raise InputError("Model.fit: evaluating a valid_dataset needs metrics, e.g. "
                                 "Model(..., metrics={'accuracy'})")
        self._train(epoch, train_dataset, callbacks, initial_epoch, valid_dataset,
                    valid_frequency)

    @staticmethod
    def _check_sink(sink: bool) -> None:
        if sink:
            warnings.warn("dataset_sink_mode=True has no effect: graphkernel runs on the CPU, "
                          "where (as in MindSpore) the data is fed step by step", NoEffectWarning,
                          stacklevel=3)

    @staticmethod
    def _check_dataset(dataset: Any, what: str) -> int:
        if not isinstance(dataset, Dataset):
            raise InputError(f"Model: {what} must be a graphkernel.dataset Dataset (e.g. "
                             f"NumpySlicesDataset(...).batch(32)), got {type(dataset).__name__}")
        size = dataset.get_dataset_size()
        if size < 0:
            raise InputError(f"Model: {what} repeats forever (repeat() without a count), so an "
                             "epoch would never end; give repeat a count")
        if size == 0:
            raise InputError(f"Model: {what} is empty (no batch: batch_size larger than the "
                             "data with drop_remainder=True?)")
        return size

    def _train(self, epoch: int, dataset: Dataset, callbacks: Any, initial_epoch: int,
               valid_dataset: Dataset | None, valid_frequency: int) -> None:
        epoch = _positive_int(epoch, "epoch")
        initial_epoch = _positive_int(initial_epoch, "initial_epoch", minimum=0)
        if initial_epoch >= epoch:
            raise InputError(f"Model.train: initial_epoch {initial_epoch} must be smaller than "
                             f"epoch {epoch}")
        if self._optimizer is None:
            raise InputError("Model.train needs an optimizer: Model(network, loss_fn, "
                             "optimizer)")
        batch_num = self._check_dataset(dataset, "train_dataset")
        callback_list = CallbackList(callbacks)
        cb_params = InternalCallbackParam(
            train_network=self._train_network, network=self._network, loss_fn=self._loss_fn,
            optimizer=self._optimizer, train_dataset=dataset, epoch_num=epoch,
            batch_num=batch_num, cur_epoch_num=initial_epoch,
            cur_step_num=initial_epoch * batch_num, net_outputs=None, mode="train",
            dataset_sink_mode=False, list_callback=callback_list, metrics=None,
            eval_results=None)
        run_context = RunContext(cb_params)
        iterator = dataset.create_tuple_iterator(num_epochs=epoch - initial_epoch)
        bar = training_bar((epoch - initial_epoch) * batch_num)
        callback_list.on_train_begin(run_context)
        try:
            for n in range(initial_epoch, epoch):
                cb_params.cur_epoch_num = n + 1
                self._train_network.set_train(True)
                callback_list.on_train_epoch_begin(run_context)
                for batch in iterator:
                    cb_params.cur_step_num += 1
                    callback_list.on_train_step_begin(run_context)
                    cb_params.net_outputs = self._train_network(*batch)
                    callback_list.on_train_step_end(run_context)
                    if bar is not None:
                        bar.advance(n + 1, loss_value(cb_params.net_outputs))
                    if run_context.get_stop_requested():
                        break
                if valid_dataset is not None and (n + 1) % valid_frequency == 0:
                    metrics, eval_loss = self._evaluate(valid_dataset, CallbackList(None))
                    cb_params.metrics = metrics
                    cb_params.eval_results = dict(metrics)
                    if eval_loss is not None:
                        cb_params.eval_results["eval_loss"] = eval_loss
                    self._train_network.set_train(True)
                callback_list.on_train_epoch_end(run_context)
                if run_context.get_stop_requested():
                    break
        finally:
            iterator.stop()
            if bar is not None:
                bar.stop()
        callback_list.on_train_end(run_context)

    # -- evaluation and prediction ----------------------------------------------------------------
    def eval(self, valid_dataset: Dataset, callbacks: Any = None,
             dataset_sink_mode: bool = False) -> dict[str, Any]:
        """{metric name: value} over one pass of `valid_dataset`."""
        self._check_sink(dataset_sink_mode)
        if not self._metric_fns:
            raise InputError("Model.eval needs metrics: Model(..., metrics={'accuracy'})")
        self._check_dataset(valid_dataset, "valid_dataset")
        metrics, _ = self._evaluate(valid_dataset, CallbackList(callbacks))
        return metrics

    def _evaluate(self, dataset: Dataset, callback_list: CallbackList
                  ) -> tuple[dict[str, Any], float | None]:
        """One pass of the evaluation network over `dataset`: the metrics, and the mean loss
        when eval_indexes say where it is (None otherwise)."""
        network = self._eval_network
        assert network is not None
        cb_params = InternalCallbackParam(
            eval_network=network, valid_dataset=dataset,
            batch_num=dataset.get_dataset_size(), cur_step_num=0, net_outputs=None,
            mode="eval", list_callback=callback_list, metrics=None)
        run_context = RunContext(cb_params)
        for metric in self._metric_fns.values():
            metric.clear()
        eval_loss = Loss() if self._eval_indexes is not None else None
        network.set_train(False)
        callback_list.on_eval_begin(run_context)
        callback_list.on_eval_epoch_begin(run_context)
        iterator = dataset.create_tuple_iterator(num_epochs=1)
        try:
            for batch in iterator:
                cb_params.cur_step_num += 1
                callback_list.on_eval_step_begin(run_context)
                outputs = network(*batch)
                outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
                cb_params.net_outputs = outputs
                self._update_metrics(outputs)
                if eval_loss is not None:
                    eval_loss.update(outputs[self._eval_indexes[0]])  # type: ignore[index]  # a tuple here
                callback_list.on_eval_step_end(run_context)
        finally:
            iterator.stop()
        callback_list.on_eval_epoch_end(run_context)
        metrics = {name: metric.eval() for name, metric in self._metric_fns.items()}
        cb_params.metrics = metrics
        callback_list.on_eval_end(run_context)
        return metrics, eval_loss.eval() if eval_loss is not None else None

    def _update_metrics(self, outputs: tuple[Any, ...]) -> None:
        """As MindSpore's: with eval_indexes (loss, outputs, label), Loss gets the loss and
        the others (outputs, label); without, every metric gets all the outputs."""
        if self._eval_indexes is None:
            for metric in self._metric_fns.values():
                metric.update(*outputs)
            return
        loss_index, out_index, label_index = self._eval_indexes
        if len(outputs) <= max(self._eval_indexes):
            raise InputError(f"Model.eval: the evaluation network returned {len(outputs)} "
                             f"output(s); eval_indexes {self._eval_indexes} need (loss, "
                             "outputs, label) among them")
        for metric in self._metric_fns.values():
            if isinstance(metric, Loss):
                metric.update(outputs[loss_index])
            else:
                metric.update(outputs[out_index], outputs[label_index])

    def predict(self, *predict_data: Any) -> Any:
        """The network's outputs on `predict_data`, in inference mode (the network's mode
        is restored after)."""
        training = self._network.training
        self._network.set_train(False)
        try:
            return self._network(*predict_data)
        finally:
            self._network.set_train(training)
