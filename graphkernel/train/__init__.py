"""`graphkernel.train`, MindSpore's `mindspore.train`: `Model` (train, fit, eval, predict),
callbacks (`LossMonitor`, `TimeMonitor`, `ModelCheckpoint` + `CheckpointConfig`,
`EarlyStopping`, `History`) and metrics (`Accuracy`, `Loss`, `Top1CategoricalAccuracy`,
`Top5CategoricalAccuracy`)."""
from graphkernel.train.callback import (
    Callback,
    CheckpointConfig,
    EarlyStopping,
    History,
    LossMonitor,
    ModelCheckpoint,
    RunContext,
    TimeMonitor,
    TrainingError,
)
from graphkernel.train.metrics import (
    Accuracy,
    Loss,
    Metric,
    MetricError,
    Top1CategoricalAccuracy,
    Top5CategoricalAccuracy,
    TopKCategoricalAccuracy,
    get_metric_fn,
)
from graphkernel.train.model import Model

__all__ = ["Accuracy", "Callback", "CheckpointConfig", "EarlyStopping", "History", "Loss",
           "LossMonitor", "Metric", "MetricError", "Model", "ModelCheckpoint", "RunContext",
           "TimeMonitor", "Top1CategoricalAccuracy", "Top5CategoricalAccuracy", "TrainingError",
           "TopKCategoricalAccuracy", "get_metric_fn"]
