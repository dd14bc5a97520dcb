"""Optimizers, MindSpore's: `optimizer(gradients)` inside a traced construct (TrainOneStepCell)
writes every parameter and its state in place through the update primitives (ApplyMomentum,
Adam, AdamWeightDecay, Assign; ir/opdefs/optim.py). With fusion on each parameter's update
(its new value and every state tensor, written together) is one elementwise kernel, fused with
the gradient work before it; unfused, each update primitive runs as one numpy step.

The learning rate is a float, a list or array of per-step values (the last one repeats), or a
`LearningRateSchedule` cell computing it from the step count in the graph; the step count is a
Parameter the optimizer increments each call (only when the rate changes with it).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.grad import ParameterTuple
from graphkernel.frontend.tensor import Parameter, Tensor
from graphkernel.frontend.tracing import current_tracer, user_location
from graphkernel.ir.graph import OPTIMIZER, PHASE
from graphkernel.ops import operations as P
from graphkernel.ops.composite import HyperMap, Map


class LearningRateSchedule(Cell):
    """A learning rate computed in the graph from `global_step` (a float scalar tensor)."""

    def construct(self, global_step: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define construct(global_step)")


class ExponentialDecayLR(LearningRateSchedule):
    """learning_rate * decay_rate ** (step / decay_steps), floored with is_stair."""

    def __init__(self, learning_rate: float, decay_rate: float, decay_steps: int,
                 is_stair: bool = False) -> None:
        super().__init__()
        self.learning_rate, self.decay_rate = float(learning_rate), float(decay_rate)
        self.decay_steps, self.is_stair = int(decay_steps), is_stair

    def construct(self, global_step: Any) -> Any:
        p = global_step / float(self.decay_steps)
        if self.is_stair:
            p = P.Floor()(p)
        return P.Pow()(self.decay_rate, p) * self.learning_rate


_GROUP_KEYS = ("params", "lr", "weight_decay", "order_params")


class Optimizer(Cell):
    """The parameters to update, the learning rate and weight decay; subclasses' `construct`
    takes the gradients (a tuple aligned with `self.parameters`).

    `parameters` is a Cell, a list of Parameters, or MindSpore's parameter groups: a list of
    dicts, each with "params" (a list of Parameters) and optionally its own "lr" and
    "weight_decay" (else the optimizer's), plus at most one {"order_params": [...]} naming
    every grouped parameter once, in the order the optimizer keeps them (else group by
    group)."""

    def __init__(self, learning_rate: Any, parameters: Any, weight_decay: float = 0.0,
                 loss_scale: float = 1.0) -> None:
        super().__init__(auto_prefix=False)
        groups = _parameter_groups(type(self).__name__, parameters)
        order = next((g["order_params"] for g in groups if "order_params" in g), None)
        groups = [g for g in groups if "order_params" not in g]
        params = [p for g in groups for p in g["params"]]
        self.parameters = ParameterTuple(_ordered(params, order) if order is not None else params)
        self.is_group = isinstance(parameters, (list, tuple)) and \
            any(isinstance(g, dict) for g in parameters)
        if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float)) or \
                not loss_scale > 0:
            raise InputError(f"loss_scale must be a float > 0, got {loss_scale!r}",
                             user_location())
        self.loss_scale = float(loss_scale)
        self.need_scale = self.loss_scale != 1.0
        self.reciprocal_scale = 1.0 / self.loss_scale
        # What MindSpore's optimizers are written with (ops.composite): a subclass's construct
        # maps its update over (gradients, parameters, moments) with these.
        self.map_ = Map()
        self.map_reverse = Map(None, True)
        self.hyper_map = HyperMap()
        self.hyper_map_reverse = HyperMap(None, True)
        # Scalars the optimizer keeps (step count, rates, beta powers) in the widest dtype of
        # its parameters: float64 parameters get float64 rates.
        self.scalar_dtype = np.result_type(*(p.dtype for p in params), np.float32)
        self.weight_decay = _weight_decay(weight_decay)
        self.learning_rate = self._rate(learning_rate)
        # Per parameter: its weight decay and which rate it follows (0: the optimizer's; k:
        # group_lr_k, a group's own "lr").
        decays: dict[int, float] = {}
        rate_of: dict[int, int] = {}
        rates: list[Any] = [self.learning_rate]
        for group in groups:
            if "lr" in group:
                rates.append(self._rate(group["lr"]))
                if isinstance(rates[-1], LearningRateSchedule):  # registered as a sub-cell
                    setattr(self, f"group_lr_{len(rates) - 1}", rates[-1])
            for p in group["params"]:
                decays[id(p)] = _weight_decay(group.get("weight_decay", weight_decay))
                rate_of[id(p)] = len(rates) - 1 if "lr" in group else 0
        self.is_group_lr = len(rates) > 1
        self.group_rates = tuple(rates)
        self.weight_decays = tuple(decays[id(p)] for p in self.parameters)
        self.rate_index = tuple(rate_of[id(p)] for p in self.parameters)
        self.dynamic_lr = any(not isinstance(r, float) for r in rates)
        if self.dynamic_lr:
            self.global_step = Parameter(np.zeros((), self.scalar_dtype), "global_step",
                                         requires_grad=False)

    def _traced_call(self, inputs: tuple[Any, ...]) -> Any:
        # Every node the update adds is noted as the optimizer's, so a report can split a
        # training step into forward, backward and optimizer (ir/graph.py PHASES).
        tracer = current_tracer()
        assert tracer is not None
        first = len(tracer.graph.nodes)
        out = super()._traced_call(inputs)
        for node in tracer.graph.nodes[first:]:
            node.notes[PHASE] = OPTIMIZER
        return out

    def __setattr__(self, name: str, value: Any) -> None:
        # A subclass's state as MindSpore keeps it, `self.moments =
        # self.parameters.clone(prefix="moments", init="zeros")`: each new Parameter is
        # registered as this cell's (checkpoints hold it); the network's own stay the
        # network's.
        super().__setattr__(name, value)
        if isinstance(value, ParameterTuple) and name != "parameters":
            own = {id(p) for p in self.__dict__.get("parameters", ())}
            for i, p in enumerate(value):
                if id(p) not in own:
                    self._params[f"{name}_{i}"] = p

    def decay_weight(self, gradients: Sequence[Any]) -> tuple[Any, ...]:
        """The gradients with each parameter's weight decay (L2) added, times loss_scale as
        MindSpore's: the gradients are still scaled here, and scale_grad divides both."""
        out = []
        for i, (p, g) in enumerate(zip(self.parameters, self._check(gradients))):
            rate = self.weight_decays[i] * self.loss_scale
            out.append(g if rate == 0.0 else g + p * rate)
        return tuple(out)

    def scale_grad(self, gradients: Sequence[Any]) -> tuple[Any, ...]:
        """The gradients divided by loss_scale (unchanged when it is 1)."""
        if not self.need_scale:
            return tuple(gradients)
        return tuple(g * self.reciprocal_scale for g in gradients)

    def gradients_centralization(self, gradients: Sequence[Any]) -> tuple[Any, ...]:
        """The gradients as they are: graphkernel's parameter groups take no
        "grad_centralization" (a group asking for it is refused when the optimizer is made)."""
        return tuple(gradients)

    def _rate(self, learning_rate: Any) -> Any:
        """A learning rate as kept: a float, an array of per-step rates, or a schedule."""
        if isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool):
            if learning_rate < 0:
                raise InputError(f"learning_rate must be >= 0, got {learning_rate}",
                                 user_location())
            return float(learning_rate)
        if isinstance(learning_rate, LearningRateSchedule):
            return learning_rate
        if isinstance(learning_rate, (list, tuple, np.ndarray, Tensor)):
            rates = np.asarray(learning_rate, dtype=self.scalar_dtype).ravel()
            if rates.size == 0:
                raise InputError("learning_rate: an empty list of rates", user_location())
            return rates
        raise InputError(f"learning_rate must be a float, a list of per-step rates or a "
                         f"LearningRateSchedule, got {type(learning_rate).__name__}",
                         user_location())

    def _state(self, prefix: str, init: float = 0.0) -> tuple[Parameter, ...]:
        """One state tensor per parameter (moments, ...), registered as this cell's."""
        states = []
        for i, p in enumerate(self.parameters):
            # A read-only broadcast of one value: Parameter's own copy is the only fill (a
            # filled array copied again wrote every byte twice: 1.5 s for BERT-base's Adam).
            filled = np.broadcast_to(np.asarray(init, p.dtype), p.shape)
            state = Parameter(filled, f"{prefix}.{p.name}", requires_grad=False)
            setattr(self, f"{prefix}_{i}", state)
            states.append(state)
        return tuple(states)

    def get_lr(self) -> Any:
        """This step's learning rate (a scalar tensor in the parameters' widest float dtype),
        and the step count incremented for the next call; with groups of their own "lr", a
        tuple of one rate per parameter (as MindSpore's)."""
        rates = [self._as_tensor(r) for r in self._step_rates()]
        return tuple(rates[k] for k in self.rate_index) if self.is_group_lr else rates[0]

    def _as_tensor(self, rate: Any) -> Any:
        # A subclass registers its update for ("Tensor", ...) learning rates, as MindSpore's
        # get_lr returns a tensor: a fixed rate becomes a scalar constant.
        return Tensor(np.asarray(rate, self.scalar_dtype)) if isinstance(rate, float) else rate

    def parameter_lrs(self) -> list[Any]:
        """This step's learning rate of each parameter (get_lr, one per parameter)."""
        rates = self._step_rates()
        return [rates[k] for k in self.rate_index]

    def _step_rates(self) -> list[Any]:
        if not self.dynamic_lr:
            return list(self.group_rates)
        step = self.global_step * 1.0
        out = [self._rate_at(rate, step) for rate in self.group_rates]
        P.AssignAdd()(self.global_step, 1.0)
        return out

    @staticmethod
    def _rate_at(rate: Any, step: Any) -> Any:
        if isinstance(rate, float):
            return rate
        if isinstance(rate, LearningRateSchedule):
            return rate(step)
        index = P.Minimum()(step, float(len(rate) - 1))
        steps = np.arange(len(rate), dtype=rate.dtype)
        return P.ReduceSum()(P.Select()(P.Equal()(steps, index), rate, rate.dtype.type(0)))

    def decay(self, index: int, param: Any, grad: Any) -> Any:
        """The gradient of parameter `index` with its weight decay (L2) added."""
        rate = self.weight_decays[index]
        return grad if rate == 0.0 else grad + param * rate

    def _check(self, gradients: Sequence[Any]) -> list[Any]:
        gradients = list(gradients)
        if len(gradients) != len(self.parameters):
            raise InputError(f"{type(self).__name__} updates {len(self.parameters)} "
                             f"parameter(s) but got {len(gradients)} gradient(s)",
                             user_location())
        return gradients

    @staticmethod
    def _typed(lr: Any, param: Parameter) -> Any:
        return lr if isinstance(lr, float) or lr.dtype == param.dtype else \
            P.Cast()(lr, param.dtype)


def _weight_decay(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise InputError(f"weight_decay must be a float >= 0, got {value!r}", user_location())
    return float(value)


def _parameter_groups(owner: str, parameters: Any) -> list[dict[str, Any]]:
    """`parameters` as MindSpore's groups (a plain list is one group), each checked."""
    if isinstance(parameters, Cell):
        parameters = parameters.trainable_params()
    items = list(parameters) if isinstance(parameters, (list, tuple)) else None
    if items and all(isinstance(g, dict) for g in items):
        groups = [dict(g) for g in items]  # the caller's dicts stay as they were
    elif items and all(isinstance(p, Parameter) for p in items):
        groups = [{"params": items}]
    else:
        raise InputError(f"{owner} needs a non-empty list of Parameters (e.g. "
                         "net.trainable_params()) or of parameter groups (dicts with "
                         f"'params'), got {parameters!r}", user_location())
    seen: dict[int, int] = {}
    ordered = 0
    for n, group in enumerate(groups):
        unknown = sorted(set(group) - set(_GROUP_KEYS))
        if unknown:
            raise InputError(f"{owner}: parameter group {n} has key(s) {unknown}; a group takes "
                             f"{', '.join(_GROUP_KEYS)}", user_location())
        if "order_params" in group:
            ordered += 1
            if len(group) != 1 or ordered > 1:
                raise InputError(f"{owner}: 'order_params' must be a group of its own, given "
                                 "once", user_location())
            key = "order_params"
        elif "params" not in group:
            raise InputError(f"{owner}: parameter group {n} has no 'params'", user_location())
        else:
            key = "params"
        members = group[key]
        members = list(members.trainable_params() if isinstance(members, Cell) else members)
        if not members or not all(isinstance(p, Parameter) for p in members):
            raise InputError(f"{owner}: parameter group {n}'s {key!r} must be a non-empty "
                             "list of Parameters", user_location())
        group[key] = members
        if key == "params":
            for p in members:
                if id(p) in seen:
                    raise InputError(f"{owner}: parameter {p.name!r} is in groups "
                                     f"{seen[id(p)]} and {n}; give each parameter one group",
                                     user_location())
                seen[id(p)] = n
    return groups


def _ordered(params: list[Parameter], order: list[Parameter]) -> list[Parameter]:
    """The grouped parameters in 'order_params' order: the same parameters, each once."""
    grouped = {id(p) for p in params}
    stray = [p.name for p in order if id(p) not in grouped]
    missing = [p.name for p in params if id(p) not in {id(q) for q in order}]
    if stray or missing or len(order) != len(params):
        raise InputError("'order_params' must name every grouped parameter once: "
                         f"{f'not in any group: {stray}; ' if stray else ''}"
                         f"{f'grouped but not ordered: {missing}; ' if missing else ''}"
                         f"{len(order)} ordered, {len(params)} grouped", user_location())
    return list(order)
