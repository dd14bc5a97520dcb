"""Cells: `Cell`, `GraphKernel`, layers built from primitives (MindSpore's names), losses,
optimizers and the training wrappers."""
from typing import Any

from graphkernel.frontend.cell import Cell, GraphKernel
from graphkernel.nn.activation import (
    GELU,
    FastGelu,
    HSigmoid,
    HSwish,
    Identity,
    LogSoftmax,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softsign,
    Tanh,
    get_activation,
)
from graphkernel.nn.container import CellList, SequentialCell
from graphkernel.nn.conv import AvgPool2d, Conv2d, MaxPool2d
from graphkernel.nn.distributed import DistributedGradReducer
from graphkernel.nn.graph_cell import GraphCell
from graphkernel.nn.layers import Dense, Dropout, Embedding, Flatten, LayerNorm
from graphkernel.nn.loss import (
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    L1Loss,
    LossBase,
    MSELoss,
    SoftmaxCrossEntropyWithLogits,
)
from graphkernel.nn.normalization import BatchNorm1d, BatchNorm2d, GroupNorm
from graphkernel.nn.optim import (
    SGD,
    Adam,
    AdamWeightDecay,
    ExponentialDecayLR,
    Lamb,
    LearningRateSchedule,
    Momentum,
    Optimizer,
)
from graphkernel.nn.rnn import LSTM
from graphkernel.nn.wrap import (
    TrainOneStepCell,
    TrainOneStepWithLossScaleCell,
    WithEvalCell,
    WithLossCell,
)

__all__ = ["Cell", "DistributedGradReducer", "GraphCell", "GraphKernel", "AvgPool2d",
           "BatchNorm1d", "BatchNorm2d", "CellList", "Conv2d", "Dense", "Dropout", "Embedding",
           "FastGelu", "Flatten", "GELU", "GroupNorm", "HSigmoid", "HSwish", "Identity",
           "LayerNorm", "LogSoftmax", "LSTM",
           "MaxPool2d", "ReLU", "ReLU6", "SequentialCell", "Sigmoid", "SiLU", "Softmax",
           "Softsign", "Tanh", "get_activation", "BCEWithLogitsLoss", "CrossEntropyLoss", "L1Loss",
           "LossBase",
           "MSELoss", "SoftmaxCrossEntropyWithLogits", "SGD", "Adam", "AdamWeightDecay", "Lamb",
           "ExponentialDecayLR", "LearningRateSchedule", "Momentum", "Optimizer",
           "TrainOneStepCell", "TrainOneStepWithLossScaleCell", "WithEvalCell", "WithLossCell"]


def __getattr__(name: str) -> Any:
    """A MindSpore name graphkernel.nn lacks: say so, and what to use instead."""
    if name.startswith("_"):
        raise AttributeError(name)
    from graphkernel.frontend.mindspore_names import missing_name_error
    raise missing_name_error("graphkernel.nn", name, __all__)
