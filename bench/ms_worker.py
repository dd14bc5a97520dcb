"""The MindSpore helper process (see bench/remote.py): MindSpore 2.10, CPU, graph mode, graph-kernel
fusion on. Run as `python -m bench.ms_worker READ_FD WRITE_FD` by the benchmark."""
from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np

from bench.remote import serve, time_calls
from bench.workloads import EPS, Workload, input_sets

_state: dict[str, Any] = {}


def _setup() -> Any:
    import mindspore as ms
    if "ms" not in _state:
        # enable_graph_kernel is the switch the field notes and the course lab use; MindSpore
        # 2.10 warns that jit_config={'jit_level': 'O1'} is its new name.
        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU", enable_graph_kernel=True)
        _state["ms"] = ms
    return ms


def make_cell(w: Workload, params: dict[str, np.ndarray]) -> Any:
    ms = _setup()
    from mindspore import Parameter, Tensor, nn, ops

    class Linear(nn.Cell):
        def __init__(self, weight: np.ndarray, bias: np.ndarray, name: str) -> None:
            super().__init__()
            self.weight = Parameter(Tensor(weight), name + "_w")
            self.bias = Parameter(Tensor(bias), name + "_b")
            self.matmul = ops.MatMul(transpose_b=True)
            self.bias_add = ops.BiasAdd()

        def construct(self, x: Any) -> Any:
            return self.bias_add(self.matmul(x, self.weight), self.bias)

    class Norm(nn.Cell):
        def __init__(self, gamma: np.ndarray, beta: np.ndarray, name: str) -> None:
            super().__init__()
            self.gamma = Parameter(Tensor(gamma), name + "_g")
            self.beta = Parameter(Tensor(beta), name + "_b")
            self.ln = ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=EPS)

        def construct(self, x: Any) -> Any:
            y, _, _ = self.ln(x, self.gamma, self.beta)
            return y

    class Basic(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.mul, self.add = ops.Mul(), ops.Add()

        def construct(self, x: Any) -> Any:
            return self.mul(self.add(self.mul(x, 2.0), 1.0), 3.0)

    class Chain(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.mul, self.add, self.sub = ops.Mul(), ops.Add(), ops.Sub()
            self.exp, self.tanh = ops.Exp(), ops.Tanh()

        def construct(self, x: Any) -> Any:
            t = self.exp(self.add(self.mul(x, 0.5), 0.1))
            t = self.tanh(self.sub(self.mul(t, 0.3), 0.7))
            return self.mul(self.add(t, 1.0), x)

    class BiasGeLU(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.bias_add, self.gelu = ops.BiasAdd(), ops.GeLU()

        def construct(self, x: Any, b: Any) -> Any:
            return self.gelu(self.bias_add(x, b))

    class LayerNormLast(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.ln = ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=EPS)

        def construct(self, x: Any, g: Any, b: Any) -> Any:
            y, _, _ = self.ln(x, g, b)
            return y

    class SoftmaxLast(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.softmax = ops.Softmax(axis=-1)

        def construct(self, x: Any) -> Any:
            return self.softmax(x)

    class MLP(nn.Cell):
        def __init__(self, p: dict[str, np.ndarray]) -> None:
            super().__init__()
            self.dense1 = Linear(p["w1"], p["b1"], "d1")
            self.dense2 = Linear(p["w2"], p["b2"], "d2")
            self.gelu, self.add = ops.GeLU(), ops.Add()
            self.norm = Norm(p["gamma"], p["beta"], "ln")

        def construct(self, x: Any) -> Any:
            return self.norm(self.add(self.dense2(self.gelu(self.dense1(x))), x))

    class Encoder(nn.Cell):
        def __init__(self, p: dict[str, np.ndarray], b: int, s: int, h: int, heads: int
                     ) -> None:
            super().__init__()
            self.b, self.s, self.h, self.heads, self.hd = b, s, h, heads, h // heads
            self.q = Linear(p["wq"], p["bq"], "q")
            self.k = Linear(p["wk"], p["bk"], "k")
            self.v = Linear(p["wv"], p["bv"], "v")
            self.o = Linear(p["wo"], p["bo"], "o")
            self.ff1 = Linear(p["w1"], p["b1"], "ff1")
            self.ff2 = Linear(p["w2"], p["b2"], "ff2")
            self.norm1 = Norm(p["g1"], p["be1"], "n1")
            self.norm2 = Norm(p["g2"], p["be2"], "n2")
            self.reshape, self.transpose = ops.Reshape(), ops.Transpose()
            self.scores = ops.BatchMatMul(transpose_b=True)
            self.context = ops.BatchMatMul()
            self.mul, self.add = ops.Mul(), ops.Add()
            self.softmax = ops.Softmax(axis=-1)
            self.gelu = ops.GeLU()
            self.scale = 1.0 / math.sqrt(self.hd)

        def split(self, t: Any) -> Any:
            return self.transpose(self.reshape(t, (self.b, self.s, self.heads, self.hd)),
                                  (0, 2, 1, 3))

        def construct(self, x: Any) -> Any:
            x2 = self.reshape(x, (self.b * self.s, self.h))
            q, k, v = self.split(self.q(x2)), self.split(self.k(x2)), self.split(self.v(x2))
            probs = self.softmax(self.mul(self.scores(q, k), self.scale))
            ctx = self.transpose(self.context(probs, v), (0, 2, 1, 3))
            ctx = self.reshape(ctx, (self.b * self.s, self.h))
            h1 = self.norm1(self.add(x2, self.o(ctx)))
            out = self.norm2(self.add(h1, self.ff2(self.gelu(self.ff1(h1)))))
            return self.reshape(out, (self.b, self.s, self.h))

    del ms
    kind = w.kind
    if kind in ("basic", "composite"):
        return Basic()
    if kind == "chain":
        return Chain()
    if kind == "bias_gelu":
        return BiasGeLU()
    if kind == "layernorm":
        return LayerNormLast()
    if kind == "softmax":
        return SoftmaxLast()
    if kind == "mlp":
        return MLP(params)
    if kind == "encoder":
        d = w.dims
        return Encoder(params, d["batch"], d["seq"], d["hidden"], d["heads"])
    raise KeyError(kind)


def threads() -> dict[str, Any]:
    import ctypes
    _setup()
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    omp = libc.getenv(b"OMP_NUM_THREADS")
    info: dict[str, Any] = {"OMP_NUM_THREADS (set by mindspore import)":
                            omp.decode() if omp else None}
    try:
        info["runtime_num_threads"] = _state["ms"].get_context("runtime_num_threads")
    except Exception as exc:  # context keys move between releases
        info["runtime_num_threads"] = f"unknown ({exc})"
    return info


def train_step_cell(w: Workload, params: dict[str, np.ndarray]) -> tuple[Any, list[Any]]:
    """MindSpore's TrainOneStepCell over the forward cell, the workload's loss and nn.Adam
    (bench/training.py's settings), and the network's Parameters in the workload's order."""
    import dataclasses

    from mindspore import nn, ops

    from bench.training import ADAM_EPS, BETA1, BETA2, LR, base_kind, rows

    net = make_cell(dataclasses.replace(w, kind=base_kind(w.kind)), params)
    scale = 0.5 / float(rows(w))

    class WithLoss(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.net = net
            self.reduce_sum, self.square = ops.ReduceSum(), ops.Square()

        def construct(self, x: Any, target: Any) -> Any:
            return self.reduce_sum(self.square(self.net(x) - target)) * scale

    loss_net = WithLoss()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=LR, beta1=BETA1, beta2=BETA2,
                        eps=ADAM_EPS)
    step = nn.TrainOneStepCell(loss_net, optimizer)
    # Before any step, each workload weight is the Parameter holding its values.
    free = list(net.trainable_params())
    order = []
    for name in w.param_shapes():
        at = next(i for i, q in enumerate(free) if tuple(q.shape) == params[name].shape and
                  np.array_equal(q.asnumpy(), params[name]))
        order.append(free.pop(at))  # by position: a MindSpore Parameter's == is elementwise
    return step, order


def _prepare_training(workload: Workload, sets: list[dict[str, np.ndarray]],
                      params: dict[str, np.ndarray]) -> dict[str, Any]:
    ms = _setup()
    from bench.training import step_vector

    step, weights = train_step_cell(workload, params)
    tensors = [[ms.Tensor(a) for a in s.values()] for s in sets]
    # Every Parameter of the step (weights, Adam's moments, beta powers, the global step):
    # put back after the compiling call so the checked call is the first step.
    everything = list(step.get_parameters())
    initial = [p.asnumpy().copy() for p in everything]

    def call(i: int) -> Any:
        return step(*tensors[i]).asnumpy()

    t0 = time.perf_counter()
    call(0)
    first = time.perf_counter() - t0
    for p, a in zip(everything, initial):
        p.set_data(ms.Tensor(a))
    _state["call"], _state["n"] = call, len(sets)
    _state["to_numpy"] = lambda loss: step_vector(workload, loss, [q.asnumpy() for q in weights])
    return {"first_call_s": first, "step": "nn.TrainOneStepCell(WithLoss, nn.Adam), graph "
            "kernel on", "parameters_restored": len(everything), "cwd": os.getcwd()}


def prepare(workload: Workload, seeds: list[int]) -> dict[str, Any]:
    from bench.workloads import TRAIN_KINDS

    ms = _setup()
    sets, params = input_sets(workload, seeds)
    _state.pop("to_numpy", None)
    if workload.kind in TRAIN_KINDS:
        return _prepare_training(workload, sets, params)
    cell = make_cell(workload, params)
    tensors = [[ms.Tensor(a) for a in s.values()] for s in sets]

    def call(i: int) -> Any:
        return cell(*tensors[i]).asnumpy()  # asnumpy waits for the result (no copy on CPU)

    t0 = time.perf_counter()
    call(0)
    first = time.perf_counter() - t0
    _state["call"], _state["n"] = call, len(sets)
    return {"first_call_s": first, "output": "Tensor.asnumpy() (synchronises, no copy)",
            "cwd": os.getcwd()}


def prepare_cnn(model: str, params_path: str, inputs_path: str) -> dict[str, Any]:
    """A real-size CNN of bench/real_models.py (the network code graphkernel runs, on MindSpore's
    cells) with the weights and inputs saved at those paths (bench/real_systems.py
    mindspore_cnn); compiled by its first call."""
    ms = _setup()
    from bench.real_models import gk_cnn

    with np.load(params_path) as f:
        params = {k: f[k] for k in f.files}
    with np.load(inputs_path) as f:
        tensors = [ms.Tensor(f[f"arr_{i}"]) for i in range(len(f.files))]
    net = gk_cnn(model, params, classes=len(params["fc.bias"]), framework="mindspore")
    _state.pop("to_numpy", None)

    def call(i: int) -> Any:
        return net(tensors[i]).asnumpy()

    t0 = time.perf_counter()
    call(0)
    first = time.perf_counter() - t0
    _state["call"], _state["n"] = call, len(tensors)
    return {"first_call_in_helper_s": first,
            "graph_kernel": bool(ms.get_context("enable_graph_kernel")),
            "threads": threads(), "calls": "through a pipe to this helper (a round trip each)",
            "cwd": os.getcwd()}


def output(mode: str, index: int) -> np.ndarray:
    result = _state["call"](index)
    if "to_numpy" in _state:  # a training step: the loss, then the updated weights
        return _state["to_numpy"](result)
    return np.array(result)


def time_(mode: str, k: int, start: int) -> float:
    return time_calls(_state["call"], k, start, _state["n"])


if __name__ == "__main__":
    serve({"threads": threads, "prepare": prepare, "prepare_cnn": prepare_cnn, "output": output,
           "time": time_})
