"""Callbacks, MindSpore's: `Callback` with its `on_train_*` / `on_eval_*` hooks, `RunContext`,
and `LossMonitor`, `TimeMonitor`, `ModelCheckpoint` with `CheckpointConfig`, `EarlyStopping`,
`History`. The printed lines follow MindSpore 2.x's, so logs read the same."""
from __future__ import annotations

import os
import re
import time
import warnings
from typing import Any

import numpy as np

from graphkernel.common.checkpoint import save_checkpoint
from graphkernel.errors import GraphKernelError, InputError, NoEffectWarning, UnsupportedError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tensor import Parameter, Tensor


class TrainingError(GraphKernelError, ValueError):
    """Training cannot go on: the loss is NaN or infinite (a ValueError, as MindSpore's)."""


class InternalCallbackParam(dict):
    """What a callback reads from `run_context.original_args()`: a dict whose keys are also
    attributes (cur_epoch_num, cur_step_num, batch_num, net_outputs, train_network, ...)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


class RunContext:
    """The running train or eval: its parameters, and a stop request a callback can make."""

    def __init__(self, original_args: InternalCallbackParam) -> None:
        self._original_args = original_args
        self._stop_requested = False

    def original_args(self) -> InternalCallbackParam:
        return self._original_args

    def request_stop(self) -> None:
        """Stop after the current step (training ends cleanly: on_train_end still runs)."""
        self._stop_requested = True

    def get_stop_requested(self) -> bool:
        return self._stop_requested


class Callback:
    """Override the hooks to run code during `Model.train` / `Model.eval`. The `on_train_*` and
    `on_eval_*` hooks call the older names (begin, epoch_begin, step_begin, step_end, epoch_end,
    end) unless overridden, as MindSpore's."""

    def begin(self, run_context: RunContext) -> None:
        """Called once before the network runs."""

    def epoch_begin(self, run_context: RunContext) -> None:
        """Called before each epoch."""

    def epoch_end(self, run_context: RunContext) -> None:
        """Called after each epoch."""

    def step_begin(self, run_context: RunContext) -> None:
        """Called before each step."""

    def step_end(self, run_context: RunContext) -> None:
        """Called after each step."""

    def end(self, run_context: RunContext) -> None:
        """Called once after the last step."""

    def on_train_begin(self, run_context: RunContext) -> None:
        self.begin(run_context)

    def on_train_epoch_begin(self, run_context: RunContext) -> None:
        self.epoch_begin(run_context)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        self.epoch_end(run_context)

    def on_train_step_begin(self, run_context: RunContext) -> None:
        self.step_begin(run_context)

    def on_train_step_end(self, run_context: RunContext) -> None:
        self.step_end(run_context)

    def on_train_end(self, run_context: RunContext) -> None:
        self.end(run_context)

    def on_eval_begin(self, run_context: RunContext) -> None:
        self.begin(run_context)

    def on_eval_epoch_begin(self, run_context: RunContext) -> None:
        self.epoch_begin(run_context)

    def on_eval_epoch_end(self, run_context: RunContext) -> None:
        self.epoch_end(run_context)

    def on_eval_step_begin(self, run_context: RunContext) -> None:
        self.step_begin(run_context)

    def on_eval_step_end(self, run_context: RunContext) -> None:
        self.step_end(run_context)

    def on_eval_end(self, run_context: RunContext) -> None:
        self.end(run_context)


class CallbackList(Callback):
    """Several callbacks called in order; `callbacks` is None, one Callback or a list."""

    def __init__(self, callbacks: Any) -> None:
        if callbacks is None:
            items: list[Any] = []
        elif isinstance(callbacks, (list, tuple)):
            items = list(callbacks)
        else:
            items = [callbacks]
        bad = [type(cb).__name__ for cb in items if not isinstance(cb, Callback)]
        if bad:
            raise InputError(f"callbacks must be Callback instances (graphkernel.train), got "
                             f"{bad}")
        self.callbacks = items

    def _each(self, hook: str, run_context: RunContext) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(run_context)


for _hook in [n for n in vars(Callback) if n.startswith("on_")]:
    setattr(CallbackList, _hook,
            lambda self, run_context, _hook=_hook: self._each(_hook, run_context))


def loss_value(net_outputs: Any) -> float | None:
    """The loss in a step's outputs, as MindSpore reads it: the first of a tuple, or the
    mean of a tensor."""
    if isinstance(net_outputs, (tuple, list)) and net_outputs:
        net_outputs = net_outputs[0]
    if isinstance(net_outputs, Tensor):
        return float(np.mean(net_outputs.asnumpy()))
    if isinstance(net_outputs, (np.ndarray, float, int, np.number)):
        return float(np.mean(net_outputs))
    return None


def _non_negative_int(value: Any, name: str, owner: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InputError(f"{owner}: {name} must be an int >= 0, got {value!r}")
    return int(value)


class LossMonitor(Callback):
    """Prints the loss every `per_print_times` steps ("epoch: 1 step: 5, loss is 0.25"), and
    the evaluation results at each epoch's end when `Model.fit` evaluates."""

    def __init__(self, per_print_times: int = 1) -> None:
        self._per_print_times = _non_negative_int(per_print_times, "per_print_times",
                                                  "LossMonitor")
        self._last_print_time = 0

    def on_train_begin(self, run_context: RunContext) -> None:
        self._last_print_time = 0

    def on_train_step_end(self, run_context: RunContext) -> None:
        cb_params = run_context.original_args()
        loss = loss_value(cb_params.net_outputs)
        step_in_epoch = (cb_params.cur_step_num - 1) % cb_params.batch_num + 1
        if loss is not None and not np.isfinite(loss):
            raise TrainingError(f"epoch: {cb_params.cur_epoch_num} step: {step_in_epoch}. "
                                f"Invalid loss {loss}, terminating training.")
        if self._per_print_times and \
                cb_params.cur_step_num - self._last_print_time >= self._per_print_times:
            self._last_print_time = cb_params.cur_step_num
            print(f"epoch: {cb_params.cur_epoch_num} step: {step_in_epoch}, loss is {loss}",
                  flush=True)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        cb_params = run_context.original_args()
        metrics = cb_params.get("metrics")
        if metrics:
            print(f"Eval result: epoch {cb_params.cur_epoch_num}, metrics: {metrics}",
                  flush=True)


class TimeMonitor(Callback):
    """Prints each epoch's time and the mean time of its steps, in milliseconds."""

    def __init__(self, data_size: int | None = None, data_time: bool = False) -> None:
        if data_size is not None:
            data_size = _non_negative_int(data_size, "data_size", "TimeMonitor")
        self.data_size = data_size
        self.epoch_time = time.time()

    def on_train_epoch_begin(self, run_context: RunContext) -> None:
        self.epoch_time = time.time()

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        epoch_ms = (time.time() - self.epoch_time) * 1000
        batch_num = run_context.original_args().get("batch_num")
        steps = batch_num if isinstance(batch_num, int) and batch_num > 0 else self.data_size
        if not steps:
            raise InputError("TimeMonitor: the number of steps per epoch is unknown; give "
                             "TimeMonitor(data_size=steps)")
        print(f"epoch time: {epoch_ms:5.3f} ms, per step time: {epoch_ms / steps:5.3f} ms",
              flush=True)


class CheckpointConfig:
    """When `ModelCheckpoint` saves: every `save_checkpoint_steps` steps (or every
    `save_checkpoint_seconds` when steps is 0), keeping the newest `keep_checkpoint_max`
    files. `saved_network` saves that cell instead of the training network (which also holds
    the optimizer's state)."""

    def __init__(self, save_checkpoint_steps: int = 1, save_checkpoint_seconds: int = 0,
                 keep_checkpoint_max: int = 5, keep_checkpoint_per_n_minutes: int = 0,
                 integrated_save: bool = True, async_save: bool = False,
                 saved_network: Cell | None = None, append_info: Any = None,
                 enc_key: Any = None, enc_mode: str = "AES-GCM",
                 exception_save: bool = False) -> None:
        owner = "CheckpointConfig"
        steps = _non_negative_int(save_checkpoint_steps or 0, "save_checkpoint_steps", owner)
        seconds = _non_negative_int(save_checkpoint_seconds or 0, "save_checkpoint_seconds",
                                    owner)
        keep = _non_negative_int(keep_checkpoint_max or 0, "keep_checkpoint_max", owner)
        if not steps and not seconds:
            raise InputError("CheckpointConfig: save_checkpoint_steps and "
                             "save_checkpoint_seconds can't both be 0 or None")
        if keep_checkpoint_per_n_minutes:
            raise UnsupportedError("CheckpointConfig: keep_checkpoint_per_n_minutes is not "
                                   "supported by graphkernel yet; use keep_checkpoint_max")
        if append_info is not None or enc_key is not None:
            raise UnsupportedError("CheckpointConfig: append_info and enc_key are not "
                                   "supported by graphkernel yet (checkpoints hold the "
                                   "parameters only, unencrypted)")
        if saved_network is not None and not isinstance(saved_network, Cell):
            raise InputError(f"CheckpointConfig: saved_network must be a Cell, got "
                             f"{type(saved_network).__name__}")
        self.save_checkpoint_steps = steps
        self.save_checkpoint_seconds = 0 if steps else seconds  # steps win, as MindSpore's
        self.keep_checkpoint_max = keep
        self.integrated_save, self.async_save = integrated_save, async_save
        self.saved_network = saved_network
        self.exception_save = exception_save


class ModelCheckpoint(Callback):
    """Saves `.ckpt` files (graphkernel.save_checkpoint, MindSpore's format) named
    `{prefix}-{epoch}_{step in epoch}.ckpt` in `directory` (the working directory when None),
    as `config` says, and once more at the end of training when the last step was not saved.
    A prefix whose files are already in the directory becomes `{prefix}_1` (then _2, ...), so a
    new run never deletes an old run's files."""

    def __init__(self, prefix: str = "CKP", directory: str | None = None,
                 config: CheckpointConfig | None = None) -> None:
        if not isinstance(prefix, str) or not prefix or re.search(r"[/\\]", prefix):
            raise InputError(f"ModelCheckpoint: prefix must be a file name prefix (no '/'), "
                             f"got {prefix!r}")
        if config is not None and not isinstance(config, CheckpointConfig):
            raise InputError(f"ModelCheckpoint: config must be a CheckpointConfig, got "
                             f"{type(config).__name__}")
        self._prefix = prefix
        self._directory = os.path.abspath(directory) if directory is not None else os.getcwd()
        self._config = config if config is not None else CheckpointConfig()
        self._last_triggered_step = 0
        self._last_time = time.time()
        self._saved: list[str] = []
        self._prefix_checked = False
        self.latest_ckpt_file_name = ""

    def _unique_prefix(self) -> None:
        os.makedirs(self._directory, exist_ok=True)
        names = os.listdir(self._directory)

        def taken(prefix: str) -> bool:
            pattern = re.compile(re.escape(prefix) + r"-\d+_\d+\.ckpt")
            return any(pattern.fullmatch(name) for name in names)

        prefix, n = self._prefix, 0
        while taken(prefix):
            n += 1
            prefix = f"{self._prefix}_{n}"
        self._prefix = prefix
        self._prefix_checked = True

    def on_train_begin(self, run_context: RunContext) -> None:
        self._last_time = time.time()

    def on_train_step_end(self, run_context: RunContext) -> None:
        cb_params = run_context.original_args()
        cfg = self._config
        if cfg.save_checkpoint_steps:
            due = cb_params.cur_step_num % cfg.save_checkpoint_steps == 0
        else:
            due = time.time() - self._last_time >= cfg.save_checkpoint_seconds
        if due:
            self._save(cb_params)

    def on_train_end(self, run_context: RunContext) -> None:
        cb_params = run_context.original_args()
        if cb_params.cur_step_num != self._last_triggered_step:
            self._save(cb_params)

    def _save(self, cb_params: InternalCallbackParam) -> None:
        if not self._prefix_checked:
            self._unique_prefix()
        step_in_epoch = (cb_params.cur_step_num - 1) % cb_params.batch_num + 1
        path = os.path.join(self._directory,
                            f"{self._prefix}-{cb_params.cur_epoch_num}_{step_in_epoch}.ckpt")
        network = self._config.saved_network or cb_params.train_network
        save_checkpoint(network, path)
        self._last_triggered_step = cb_params.cur_step_num
        self._last_time = time.time()
        self.latest_ckpt_file_name = path
        if path in self._saved:
            self._saved.remove(path)
        self._saved.append(path)
        keep = self._config.keep_checkpoint_max
        while keep and len(self._saved) > keep:
            oldest = self._saved.pop(0)
            if os.path.exists(oldest):
                os.remove(oldest)


_SMALLER_IS_BETTER = {"loss", "eval_loss", "mae", "mse", "perplexity"}


class EarlyStopping(Callback):
    """Stops training when `monitor` has not improved by more than `min_delta` for `patience`
    epochs. "loss" is the training loss; "eval_loss" and the metric names are the results of
    `Model.fit`'s evaluation. mode 'auto' minimises losses and maximises the rest."""

    def __init__(self, monitor: str = "eval_loss", min_delta: float = 0, patience: int = 0,
                 verbose: bool = False, mode: str = "auto", baseline: float | None = None,
                 restore_best_weights: bool = False) -> None:
        if not isinstance(monitor, str):
            raise InputError(f"EarlyStopping: monitor must be a str, got {monitor!r}")
        if mode not in ("auto", "min", "max"):
            raise InputError(f"EarlyStopping: mode must be 'auto', 'min' or 'max', got "
                             f"{mode!r}")
        self.monitor = monitor
        self.min_delta = abs(float(min_delta))
        self.patience = _non_negative_int(patience, "patience", "EarlyStopping")
        self.verbose = verbose
        self.mode = mode
        self.baseline = baseline
        self.restore_best_weights = restore_best_weights
        self._minimise = mode == "min" or (mode == "auto" and monitor in _SMALLER_IS_BETTER)
        self.on_train_begin(None)  # type: ignore[arg-type]  # MindSpore's signature; unused

    def _better(self, a: float, b: float) -> bool:
        return a < b - self.min_delta if self._minimise else a > b + self.min_delta

    def on_train_begin(self, run_context: RunContext) -> None:
        self.wait = 0
        self.stopped_epoch = 0
        self.best = np.inf if self._minimise else -np.inf
        self.best_weights: list[tuple[Parameter, np.ndarray]] | None = None

    def _monitor_value(self, cb_params: InternalCallbackParam) -> float | None:
        if self.monitor == "loss":
            value = loss_value(cb_params.get("net_outputs"))
            candidates = {"loss"}
        else:
            results = cb_params.get("eval_results") or {}
            value = results.get(self.monitor)
            candidates = {"loss", *results}
        if value is None:
            warnings.warn(f"EarlyStopping is conditioned on {self.monitor!r}, which is not "
                          f"available; available: {sorted(candidates)} (evaluation results "
                          "come from Model.fit with a valid_dataset)", NoEffectWarning,
                          stacklevel=2)
            return None
        return float(value)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        cb_params = run_context.original_args()
        current = self._monitor_value(cb_params)
        if current is None:
            return
        network = cb_params.train_network
        self.wait += 1
        if self._better(current, self.best):
            self.best = current
            if self.restore_best_weights:
                self.best_weights = [(p, p.asnumpy().copy()) for p in network.get_parameters()]
            if self.baseline is None or self._better(current, self.baseline):
                self.wait = 0
        if self.wait >= self.patience:
            self.stopped_epoch = cb_params.cur_epoch_num
            run_context.request_stop()
            if self.restore_best_weights and self.best_weights is not None:
                if self.verbose:
                    print("Restoring model weights from the end of the best epoch.")
                for param, value in self.best_weights:
                    param.set_data(value)

    def on_train_end(self, run_context: RunContext) -> None:
        if self.stopped_epoch > 0 and self.verbose:
            print(f"Epoch {self.stopped_epoch:05d}: early stopping", flush=True)


class History(Callback):
    """Records per epoch: `epoch` {"epoch": [1, 2, ...]} and `history` {"net_output": [loss
    at the epoch's last step, ...], and each evaluation metric when Model.fit evaluates}."""

    def __init__(self) -> None:
        self.history: dict[str, list[Any]] = {}
        self.epoch: dict[str, list[int]] = {"epoch": []}

    def on_train_begin(self, run_context: RunContext) -> None:
        self.epoch = {"epoch": []}

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        cb_params = run_context.original_args()
        self.epoch["epoch"].append(cb_params.get("cur_epoch_num", 1))
        record = {"net_output": loss_value(cb_params.net_outputs)}
        record.update(cb_params.get("metrics") or {})
        for key, value in record.items():
            self.history.setdefault(key, []).append(value)
