"""The training-step workloads: one call is forward, backward and an Adam update of every weight
of the MLP block or the encoder layer.

The loss is 0.5 * sum((net(x) - target)^2) / rows (rows: the batch, or batch * seq), with Adam
at lr 1e-3, betas (0.9, 0.999) and eps 1e-5 (eps well above float32's noise in the smallest
gradients, so an update never flips with rounding: the check compares updated weights).

A step's checked output is one vector: the loss / hidden, then every updated weight (in the
workload's parameter order), after exactly one step from the initial weights. Each system warms
up, then puts its weights and optimizer state back before the check; timed calls keep training.

The float64 reference is graphkernel's unfused step run in float64: every op is its numpy
reference, and the gradients come from the op table's gradient rules, which
tests/test_autodiff.py checks against central finite differences. Peers (PyTorch autograd with
torch.optim.Adam, jax.value_and_grad with a hand-written Adam) are checked against it.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench import workloads
from bench.workloads import Workload

TRAIN_KINDS = workloads.TRAIN_KINDS
# A prepared step: call(i) runs one step on input set i, to_numpy(its result) is the checked
# vector, info describes it.
StepParts = tuple[Callable[[int], Any], Callable[[Any], np.ndarray], dict[str, Any]]
LR, BETA1, BETA2, ADAM_EPS = 1e-3, 0.9, 0.999, 1e-5


def reference(w: Workload, inputs: dict[str, np.ndarray], params: dict[str, np.ndarray]
              ) -> np.ndarray:
    """The float64 answer of any workload: a training step's here, the others' from
    bench.workloads."""
    if w.kind in TRAIN_KINDS:
        return gk_reference(w, inputs, params)
    return workloads.reference(w, inputs, params)


def base_kind(kind: str) -> str:
    return kind.removesuffix("_train")


def rows(w: Workload) -> int:
    d = w.dims
    return d["batch"] * d.get("seq", 1)


def step_vector(w: Workload, loss: Any, params: list[np.ndarray]) -> np.ndarray:
    """The checked output: loss / hidden, then every weight, flat, float32."""
    parts = [np.asarray(loss, np.float64).reshape(1) / w.dims["hidden"]]
    parts += [np.asarray(p, np.float64).ravel() for p in params]
    return np.concatenate(parts).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# graphkernel

def gk_step_cell(w: Workload, params: dict[str, np.ndarray], dtype: Any = np.float32) -> Any:
    """TrainOneStepCell(network with its loss, nn.Adam) over copies of `params`."""
    from bench.gk_cells import EncoderLayer, MLPBlock
    from graphkernel import nn
    from graphkernel.ops import operations as P

    p = {k: np.array(v, dtype=dtype) for k, v in params.items()}  # copies: training writes
    d = w.dims
    net = MLPBlock(p) if w.kind == "mlp_train" else \
        EncoderLayer(p, d["batch"], d["seq"], d["hidden"], d["heads"])
    n = float(rows(w))

    class WithLoss(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def construct(self, x: Any, target: Any) -> Any:
            return P.ReduceSum()(P.Square()(self.net(x) - target)) * (0.5 / n)

    loss_net = WithLoss()
    optimizer = nn.Adam(loss_net.trainable_params(), LR, BETA1, BETA2, ADAM_EPS)
    step = nn.TrainOneStepCell(loss_net, optimizer)
    # The weights' Parameters in the workload's order, matched by value now (before any step):
    # a Parameter owns a copy of the array it was made from. The bench's work, no user's:
    # prepare_graphkernel leaves its time out of the compile probe's first result.
    t0 = time.perf_counter()
    free = list(net.trainable_params())
    order = []
    for name in w.param_shapes():
        match = next(q for q in free if q.shape == p[name].shape and
                     np.array_equal(q.asnumpy(), p[name]))
        free.remove(match)
        order.append(match)
    step.bench_weights = order
    step.bench_untimed_s = time.perf_counter() - t0
    return step


def _gk_weights(step: Any, w: Workload) -> list[np.ndarray]:
    """The network's weight arrays (updated in place by each step), in the workload's order."""
    return [q.asnumpy() for q in step.bench_weights]


def gk_reference(w: Workload, inputs: dict[str, np.ndarray], params: dict[str, np.ndarray]
                 ) -> np.ndarray:
    import graphkernel
    from graphkernel.graph_kernel.pipeline import CompileOptions

    step = gk_step_cell(w, params, np.float64)
    arrays = [a.astype(np.float64) for a in inputs.values()]
    exe = graphkernel.compile(step, *arrays, options=CompileOptions(enable_graph_kernel=False))
    loss = exe.run_arrays(*arrays)[0]
    return step_vector(w, loss, _gk_weights(step, w)).astype(np.float64)


def _state_of(params: list[Any]) -> list[tuple[Any, np.ndarray]]:
    return [(p, p.asnumpy().copy()) for p in params]


def _restore(saved: list[tuple[Any, np.ndarray]]) -> None:
    for param, initial in saved:
        param[...] = initial  # through the Parameter: its version moves, as compiled plans see


def prepare_graphkernel(key: str, fused: bool, w: Workload, sets: list[dict[str, np.ndarray]],
                        params: dict[str, np.ndarray]) -> tuple[Callable[[int], Any],
                                                                Callable[[Any], np.ndarray],
                                                                dict[str, Any]]:
    import time

    import graphkernel
    from graphkernel.graph_kernel.pipeline import CompileOptions

    step = gk_step_cell(w, params)
    arrays = [list(s.values()) for s in sets]
    t0 = time.perf_counter()
    exe = graphkernel.compile(step, *arrays[0],
                              options=CompileOptions(enable_graph_kernel=fused))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    every = [p for _, p in step.parameters_and_names()]
    saved = _state_of(every)
    untimed = time.perf_counter() - t0
    t0 = time.perf_counter()
    exe.run_arrays(*arrays[0])
    first_call = time.perf_counter() - t0
    t0 = time.perf_counter()
    _restore(saved)  # the checked call is the first step from the initial weights
    weights = _gk_weights(step, w)
    run = exe.run_arrays

    def call(i: int) -> Any:
        return run(*arrays[i])[0]

    info = {"compile_s": compile_s, "first_call_s": first_call,
            "compile_seconds_reported": exe.compile_seconds, "from_cache": exe.from_cache,
            "compile_cache": exe.report.compile_cache.split(":")[0],
            "kernel_count": len(exe.kernels), "kernels": [k.name for k in exe.kernels],
            "assigns": len(exe.stages["hwopt_d_end"].assigns) if hasattr(exe, "stages")
            else None}
    # The bench's own bookkeeping, no user's: the weights' copy for the restore and the
    # replayed pass stage `assigns` reads (80-140 ms warm, counted in the compile probe's
    # first result until the probe subtracted it: bench/probe.py).
    info["untimed_s"] = untimed + time.perf_counter() - t0 + step.bench_untimed_s
    return call, lambda loss: step_vector(w, loss, weights), info


# ---------------------------------------------------------------------------------------------
# PyTorch: autograd, torch.optim.Adam (foreach); torch.compile compiles forward + backward

def prepare_torch(w: Workload, sets: list[dict[str, np.ndarray]], params: dict[str, np.ndarray],
                  compiled: bool, torch_fn: Callable[..., Any]) -> StepParts:
    import time

    import torch

    torch.set_grad_enabled(True)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    forward = torch_fn(_inference(w), tp)
    tsets = [[torch.from_numpy(a) for a in s.values()] for s in sets]
    n = float(rows(w))

    def loss_and_grads(x: Any, target: Any) -> Any:
        loss = 0.5 * ((forward(x) - target) ** 2).sum() / n
        loss.backward()
        return loss

    fwd_bwd = torch.compile(loss_and_grads, dynamic=False) if compiled else loss_and_grads
    opt = torch.optim.Adam(list(tp.values()), lr=LR, betas=(BETA1, BETA2), eps=ADAM_EPS,
                           foreach=True)

    steps = [0]

    def call(i: int) -> Any:
        opt.zero_grad(set_to_none=False)
        loss = fwd_bwd(*tsets[i])
        # torch adds eps to the bias-corrected sqrt(v); MindSpore's Adam (and the others here)
        # to the uncorrected one: the same step with eps / sqrt(1 - beta2^t).
        steps[0] += 1
        opt.param_groups[0]["eps"] = ADAM_EPS / math.sqrt(1 - BETA2 ** steps[0])
        opt.step()
        return loss

    initial = {k: v.detach().clone() for k, v in tp.items()}
    t0 = time.perf_counter()
    call(0)
    first = time.perf_counter() - t0
    with torch.no_grad():  # back to the initial weights, a fresh optimizer state
        for k, v in tp.items():
            v.copy_(initial[k])
    opt.state.clear()
    steps[0] = 0

    def to_numpy(loss: Any) -> np.ndarray:
        return step_vector(w, float(loss.detach()), [v.detach().numpy() for v in tp.values()])

    return call, to_numpy, {"first_call_s": first,
                            "optimizer": "torch.optim.Adam(foreach=True)",
                            "compiled": "forward + backward" if compiled else "eager"}


# ---------------------------------------------------------------------------------------------
# JAX: jit of value_and_grad and an Adam update in one function

def prepare_jax(w: Workload, sets: list[dict[str, np.ndarray]], params: dict[str, np.ndarray],
                jax_fn: Callable[..., Any]) -> StepParts:
    import time

    import jax
    import jax.numpy as jnp

    forward = jax_fn(_inference(w))
    n = float(rows(w))

    def loss_fn(p: Any, x: Any, target: Any) -> Any:
        return 0.5 * jnp.sum((forward(x, p) - target) ** 2) / n

    @jax.jit
    def train_step(p: Any, m: Any, v: Any, t: Any, x: Any, target: Any) -> Any:
        loss, g = jax.value_and_grad(loss_fn)(p, x, target)
        t = t + 1
        m = jax.tree_util.tree_map(lambda m_, g_: BETA1 * m_ + (1 - BETA1) * g_, m, g)
        v = jax.tree_util.tree_map(lambda v_, g_: BETA2 * v_ + (1 - BETA2) * g_ * g_, v, g)
        lr_t = LR * jnp.sqrt(1 - BETA2 ** t) / (1 - BETA1 ** t)
        p = jax.tree_util.tree_map(lambda p_, m_, v_: p_ - lr_t * m_ / (jnp.sqrt(v_) +
                                                                        ADAM_EPS), p, m, v)
        return loss, p, m, v, t

    initial = {k: jnp.asarray(a) for k, a in params.items()}
    zeros = {k: jnp.zeros_like(a) for k, a in initial.items()}
    jsets = [[jax.device_put(a) for a in s.values()] for s in sets]
    state: dict[str, Any] = {}

    def reset() -> None:
        state.update(p=initial, m=zeros, v=zeros, t=jnp.zeros((), jnp.float32))

    def call(i: int) -> Any:
        loss, state["p"], state["m"], state["v"], state["t"] = train_step(
            state["p"], state["m"], state["v"], state["t"], *jsets[i])
        return loss.block_until_ready()

    reset()
    t0 = time.perf_counter()
    call(0)
    first = time.perf_counter() - t0
    reset()

    def to_numpy(loss: Any) -> np.ndarray:
        return step_vector(w, float(loss), [np.asarray(state["p"][k]) for k in params])

    return call, to_numpy, {"first_call_s": first,
                            "step": "jax.jit(value_and_grad + Adam), weights passed through"}


def _inference(w: Workload) -> Workload:
    """The forward workload a training step trains."""
    return dataclasses.replace(w, kind=base_kind(w.kind))

