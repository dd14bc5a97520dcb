"""Optimizers, MindSpore's module layout: the base class a user subclasses is
`graphkernel.nn.optim.optimizer.Optimizer` (mindspore.nn.optim.optimizer.Optimizer); Momentum,
SGD, Adam, AdamWeightDecay and Lamb live beside it, each in its own module as in MindSpore."""
from graphkernel.nn.optim.adam import Adam, AdamWeightDecay
from graphkernel.nn.optim.lamb import Lamb
from graphkernel.nn.optim.momentum import Momentum
from graphkernel.nn.optim.optimizer import ExponentialDecayLR, LearningRateSchedule, Optimizer
from graphkernel.nn.optim.sgd import SGD

__all__ = ["Adam", "AdamWeightDecay", "ExponentialDecayLR", "Lamb", "LearningRateSchedule",
           "Momentum", "Optimizer", "SGD"]
