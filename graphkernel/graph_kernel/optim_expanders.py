"""Expanders of the in-place update primitives (ir/opdefs/optim.py) into basic elementwise ops:
an optimizer step over a Parameter becomes one fused kernel with an output per written tensor,
and the elementwise work that produced the gradient joins it."""
from __future__ import annotations

from graphkernel.graph_kernel.expanders import Builder, expander
from graphkernel.ir.graph import Value


def _scalar(b: Builder, x: Value, like: Value) -> Value:
    """A one-element operand as a rank-0 value of the variable's dtype (it broadcasts)."""
    if x.shape != ():
        x = b("Reshape", x, shape=())
    return x if x.dtype == like.dtype else b("Cast", x, dtype=like.dtype)


@expander("AssignAdd")
def assign_add(b: Builder, var: Value, value: Value) -> Value:
    return b("Add", var, value)


@expander("AssignSub")
def assign_sub(b: Builder, var: Value, value: Value) -> Value:
    return b("Sub", var, value)


@expander("ApplyMomentum")
def apply_momentum(b: Builder, var: Value, accum: Value, lr: Value, grad: Value,
                   momentum: Value, use_locking: bool = False, use_nesterov: bool = False
                   ) -> tuple[Value, Value]:
    lr, momentum = _scalar(b, lr, var), _scalar(b, momentum, var)
    accum = b("Add", b("Mul", accum, momentum), grad)
    step = b("Add", grad, b("Mul", accum, momentum)) if use_nesterov else accum
    return b("Sub", var, b("Mul", step, lr)), accum


@expander("Adam")
def adam(b: Builder, var: Value, m: Value, v: Value, beta1_power: Value, beta2_power: Value,
         lr: Value, beta1: Value, beta2: Value, epsilon: Value, grad: Value,
         use_locking: bool = False, use_nesterov: bool = False) -> tuple[Value, ...]:
    b1, b2, eps = (_scalar(b, x, var) for x in (beta1, beta2, epsilon))
    one_minus_b1, one_minus_b2 = b("Sub", 1.0, b1), b("Sub", 1.0, b2)
    lr_t = b("RealDiv", b("Mul", _scalar(b, lr, var),
                          b("Sqrt", b("Sub", 1.0, _scalar(b, beta2_power, var)))),
             b("Sub", 1.0, _scalar(b, beta1_power, var)))
    m = b("Add", m, b("Mul", b("Sub", grad, m), one_minus_b1))
    v = b("Add", v, b("Mul", b("Sub", b("Mul", grad, grad), v), one_minus_b2))
    direction = b("Add", b("Mul", m, b1), b("Mul", grad, one_minus_b1)) if use_nesterov else m
    step = b("RealDiv", b("Mul", direction, lr_t), b("Add", b("Sqrt", v), eps))
    return b("Sub", var, step), m, v


@expander("AdamWeightDecay")
def adam_weight_decay(b: Builder, var: Value, m: Value, v: Value, lr: Value, beta1: Value,
                      beta2: Value, epsilon: Value, decay: Value, grad: Value,
                      use_locking: bool = False) -> tuple[Value, ...]:
    b1, b2, eps, wd, lr = (_scalar(b, x, var) for x in (beta1, beta2, epsilon, decay, lr))
    m = b("Add", b("Mul", m, b1), b("Mul", grad, b("Sub", 1.0, b1)))
    v = b("Add", b("Mul", v, b2), b("Mul", b("Mul", grad, grad), b("Sub", 1.0, b2)))
    update = b("Add", b("RealDiv", m, b("Add", b("Sqrt", v), eps)), b("Mul", var, wd))
    return b("Sub", var, b("Mul", update, lr)), m, v


@expander("LambApplyOptimizerAssign")
def lamb_apply_optimizer_assign(b: Builder, grad: Value, v: Value, m: Value, var: Value,
                                beta1: Value, one_minus_beta1: Value, beta2: Value,
                                one_minus_beta2: Value, epsilon: Value, steps: Value,
                                do_use_weight: Value, weight_decay_rate: Value
                                ) -> tuple[Value, ...]:
    b1, c1, b2, c2, eps, t, use, wd = (_scalar(b, x, grad) for x in (
        beta1, one_minus_beta1, beta2, one_minus_beta2, epsilon, steps, do_use_weight,
        weight_decay_rate))
    next_v = b("Add", b("Mul", v, b2), b("Mul", b("Mul", grad, grad), c2))
    next_m = b("Add", b("Mul", m, b1), b("Mul", grad, c1))
    # 1 - beta^steps, beta^steps = exp(steps log beta) (MindSpore's form)
    m_hat = b("RealDiv", next_m, b("Sub", 1.0, b("Exp", b("Mul", b("Log", b1), t))))
    v_hat = b("RealDiv", next_v, b("Sub", 1.0, b("Exp", b("Mul", b("Log", b2), t))))
    update = b("Add", b("RealDiv", m_hat, b("Add", b("Sqrt", v_hat), eps)),
               b("Mul", b("Mul", var, wd), use))
    return update, next_v, next_m


@expander("LambApplyWeightAssign")
def lamb_apply_weight_assign(b: Builder, w_norm: Value, g_norm: Value, lr: Value,
                             update: Value, param: Value) -> Value:
    w, g, rate = (_scalar(b, x, param) for x in (w_norm, g_norm, lr))
    one = b.const(1.0, param)
    both = b("LogicalAnd", b("Greater", w, 0.0), b("Greater", g, 0.0))
    ratio = b("Select", both, b("RealDiv", w, b("Select", both, g, one)), one)
    return b("Sub", param, b("Mul", b("Mul", update, rate), ratio))
