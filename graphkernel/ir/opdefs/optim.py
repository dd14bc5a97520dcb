"""Primitives that write Parameters in place (MindSpore's Assign, AssignAdd, AssignSub,
ApplyMomentum, Adam, AdamWeightDecay, LambApplyOptimizerAssign, LambApplyWeightAssign).
`OpDef.writes` names the inputs written: tracing a call records each written Parameter's new
value in `Graph.assigns`, and the runtime writes it into the Parameter's own array after the
call. Their outputs are the new values, in that order (`OpDef.write_outputs` where not).
Unfused each runs its numpy reference; with fusion on graph_kernel/optim_expanders.py expands
it into basic elementwise ops, which fuse with the gradient that feeds them."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, ShapeError
from graphkernel.ir.opset import FLOATS, NUMBERS, OpDef, PatternKind, declare
from graphkernel.ir.types import TensorType, TupleType, ValueType


def _update_infer(states: int, tensors: tuple[int, ...]) -> Callable[..., ValueType]:
    """The first `states` inputs are written (all of the variable's shape and dtype); inputs at
    `tensors` have that shape too; the others are scalars (learning rate, betas, ...)."""
    def infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
        var = types[0]
        for i, t in enumerate(types):
            if i < states or i in tensors:
                if t.shape != var.shape:
                    raise ShapeError(f"input {i} has shape {t.shape}; the variable's is "
                                     f"{var.shape}")
            elif t.size != 1:
                raise ShapeError(f"input {i} must be a scalar (one element), got shape "
                                 f"{t.shape}")
        for i in range(states):
            if types[i].dtype != var.dtype:
                raise DTypeError(f"state input {i} is {types[i].dtype.name}; the variable is "
                                 f"{var.dtype.name}")
        return var if states == 1 else TupleType((var,) * states)
    return infer


def _scalar(x: np.ndarray, dtype: np.dtype) -> Any:
    return np.asarray(x, dtype=dtype).reshape(())


def _declare(name: str, inputs: tuple[str, ...], writes: tuple[int, ...],
             reference: Callable[..., Any], tensors: tuple[int, ...] = (),
             init_attrs: tuple[tuple[str, Any], ...] = (), accepts: Any = FLOATS,
             doc: str = "", composite: bool = True, returns_first_only: bool = False) -> None:
    declare(OpDef(name=name, kind=PatternKind.OPAQUE, inputs=inputs,
                  infer=_update_infer(len(writes), tensors), reference=reference,
                  accepts=accepts, init_attrs=init_attrs, composite=composite, writes=writes,
                  doc=doc, returns_first_only=returns_first_only))


def _assign_ref(var: np.ndarray, value: np.ndarray) -> np.ndarray:
    return np.array(value, dtype=var.dtype)


# Assign is a copy: a library step, nothing to expand (its value's producer is what fuses).
_declare("Assign", ("variable", "value"), (0,), _assign_ref, tensors=(1,), accepts=None,
         doc="variable = value (written into the Parameter); returns the new value",
         composite=False)
_declare("AssignAdd", ("variable", "value"), (0,),
         lambda var, value: (var + value).astype(var.dtype), tensors=(1,), accepts=NUMBERS,
         doc="variable += value")
_declare("AssignSub", ("variable", "value"), (0,),
         lambda var, value: (var - value).astype(var.dtype), tensors=(1,), accepts=NUMBERS,
         doc="variable -= value")


def _momentum_ref(var: np.ndarray, accum: np.ndarray, lr: np.ndarray, grad: np.ndarray,
                  momentum: np.ndarray, use_locking: bool = False, use_nesterov: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    lr, momentum = _scalar(lr, var.dtype), _scalar(momentum, var.dtype)
    accum = accum * momentum + grad
    step = (grad + accum * momentum) * lr if use_nesterov else accum * lr
    return (var - step).astype(var.dtype), accum.astype(var.dtype)


_declare("ApplyMomentum", ("variable", "accumulation", "learning_rate", "gradient", "momentum"),
         (0, 1), _momentum_ref, tensors=(3,),
         init_attrs=(("use_locking", False), ("use_nesterov", False)),
         doc="accumulation = accumulation * momentum + gradient; variable -= learning_rate * "
             "accumulation (Nesterov: learning_rate * (gradient + momentum * accumulation)). "
             "Both are written in place; the call returns the variable, as MindSpore's",
         returns_first_only=True)


def _adam_ref(var: np.ndarray, m: np.ndarray, v: np.ndarray, beta1_power: np.ndarray,
              beta2_power: np.ndarray, lr: np.ndarray, beta1: np.ndarray, beta2: np.ndarray,
              epsilon: np.ndarray, grad: np.ndarray, use_locking: bool = False,
              use_nesterov: bool = False) -> tuple[np.ndarray, ...]:
    b1, b2, eps = (_scalar(a, var.dtype) for a in (beta1, beta2, epsilon))
    lr_t = _scalar(lr, var.dtype) * np.sqrt(1 - _scalar(beta2_power, var.dtype)) / \
        (1 - _scalar(beta1_power, var.dtype))
    m = m + (grad - m) * (1 - b1)
    v = v + (grad * grad - v) * (1 - b2)
    direction = (m * b1 + grad * (1 - b1)) if use_nesterov else m
    var = var - lr_t * direction / (np.sqrt(v) + eps)
    return tuple(a.astype(grad.dtype) for a in (var, m, v))


_declare("Adam", ("var", "m", "v", "beta1_power", "beta2_power", "lr", "beta1", "beta2",
                  "epsilon", "gradient"), (0, 1, 2), _adam_ref, tensors=(9,),
         init_attrs=(("use_locking", False), ("use_nesterov", False)),
         doc="Adam with bias correction through beta1_power and beta2_power (beta^t); returns "
             "(var, m, v), all written in place")


def _adam_weight_decay_ref(var: np.ndarray, m: np.ndarray, v: np.ndarray, lr: np.ndarray,
                           beta1: np.ndarray, beta2: np.ndarray, epsilon: np.ndarray,
                           decay: np.ndarray, grad: np.ndarray, use_locking: bool = False
                           ) -> tuple[np.ndarray, ...]:
    b1, b2, eps, wd, lr = (_scalar(a, var.dtype) for a in (beta1, beta2, epsilon, decay, lr))
    m = m * b1 + grad * (1 - b1)
    v = v * b2 + grad * grad * (1 - b2)
    var = var - lr * (m / (np.sqrt(v) + eps) + wd * var)
    return tuple(a.astype(grad.dtype) for a in (var, m, v))


_declare("AdamWeightDecay", ("var", "m", "v", "lr", "beta1", "beta2", "epsilon", "decay",
                             "gradient"), (0, 1, 2), _adam_weight_decay_ref, tensors=(8,),
         init_attrs=(("use_locking", False),),
         doc="AdamW without bias correction, as MindSpore's: m, v moving averages; var -= lr * "
             "(m / (sqrt(v) + epsilon) + decay * var); returns (var, m, v) written in place")


def _lamb_optimizer_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    grad = types[0]
    for i, (name, t) in enumerate(zip(_LAMB_OPTIMIZER_INPUTS, types)):
        if i < 4:  # gradient, v, m, var: tensors of one shape; the rest scalars
            if t.shape != grad.shape or t.dtype != grad.dtype:
                raise ShapeError(f"LambApplyOptimizerAssign: {name} is {t.dtype.name}"
                                 f"{list(t.shape)}; the gradient is {grad.dtype.name}"
                                 f"{list(grad.shape)}")
        elif t.size != 1:
            raise ShapeError(f"LambApplyOptimizerAssign: {name} must be a scalar (one element), "
                             f"got shape {t.shape}")
    return TupleType((grad,) * 3)


def _lamb_optimizer_ref(grad: np.ndarray, v: np.ndarray, m: np.ndarray, var: np.ndarray,
                        beta1: np.ndarray, one_minus_beta1: np.ndarray, beta2: np.ndarray,
                        one_minus_beta2: np.ndarray, epsilon: np.ndarray, steps: np.ndarray,
                        do_use_weight: np.ndarray, weight_decay_rate: np.ndarray
                        ) -> tuple[np.ndarray, ...]:
    b1, c1, b2, c2, eps, t, use, wd = (_scalar(a, grad.dtype) for a in (
        beta1, one_minus_beta1, beta2, one_minus_beta2, epsilon, steps, do_use_weight,
        weight_decay_rate))
    next_v = v * b2 + grad * grad * c2
    next_m = m * b1 + grad * c1
    # beta^steps as exp(steps log beta), as MindSpore's expander computes the bias correction
    m_hat = next_m / (1 - np.exp(np.log(b1) * t))
    v_hat = next_v / (1 - np.exp(np.log(b2) * t))
    update = m_hat / (np.sqrt(v_hat) + eps) + var * wd * use
    return tuple(a.astype(grad.dtype) for a in (update, next_v, next_m))


_LAMB_OPTIMIZER_INPUTS = ("gradient", "v", "m", "var", "beta_1", "one_minus_beta_1", "beta_2",
                          "one_minus_beta_2", "epsilon", "steps", "do_use_weight",
                          "weight_decay_rate")
declare(OpDef(name="LambApplyOptimizerAssign", kind=PatternKind.OPAQUE,
              inputs=_LAMB_OPTIMIZER_INPUTS, infer=_lamb_optimizer_infer,
              reference=_lamb_optimizer_ref, accepts=FLOATS, composite=True, writes=(1, 2),
              write_outputs=(1, 2),
              doc="LAMB's Adam-style step: v, m moving averages (written in place), bias-"
                  "corrected by beta^steps; returns (update, v, m), update = m^ / (sqrt(v^) + "
                  "epsilon) + do_use_weight * weight_decay_rate * var"))


def _lamb_weight_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    w_norm, g_norm, lr, update, param = types
    if update.shape != param.shape or update.dtype != param.dtype:
        raise ShapeError(f"LambApplyWeightAssign: update is {update.dtype.name}"
                         f"{list(update.shape)}; the parameter is {param.dtype.name}"
                         f"{list(param.shape)}")
    for name, t in (("w_norm", w_norm), ("g_norm", g_norm), ("lr", lr)):
        if t.size != 1:
            raise ShapeError(f"LambApplyWeightAssign: {name} must be a scalar (one element), "
                             f"got shape {t.shape}")
    return param


def _lamb_weight_ref(w_norm: np.ndarray, g_norm: np.ndarray, lr: np.ndarray,
                     update: np.ndarray, param: np.ndarray) -> np.ndarray:
    w, g, rate = (_scalar(a, param.dtype) for a in (w_norm, g_norm, lr))
    # The trust ratio |w| / |g|, 1 where either norm is 0
    with np.errstate(all="ignore"):
        ratio = np.where((w > 0) & (g > 0), w / g, np.ones((), param.dtype))
    return (param - ratio * rate * update).astype(param.dtype)


declare(OpDef(name="LambApplyWeightAssign", kind=PatternKind.OPAQUE,
              inputs=("w_norm", "g_norm", "lr", "update", "param"), infer=_lamb_weight_infer,
              reference=_lamb_weight_ref, accepts=FLOATS, composite=True, writes=(4,),
              doc="param -= lr * trust_ratio * update, trust_ratio = w_norm / g_norm (1 where "
                  "either is 0); returns the new param, written in place"))
