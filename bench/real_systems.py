"""The systems a `--real` row times (bench/real.py): graphkernel compiled from a cell or a
loaded file, ONNX Runtime, OpenVINO and torch on the same graph, and training steps; each
returns call(i) for input set i and what it learned while preparing."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

LABELS = {"gk_fused": "graphkernel fused", "gk_unfused": "graphkernel unfused",
          "gk_generic": "graphkernel shape-generic", "gk_handwritten": "graphkernel hand-written",
          "gk_imported": "graphkernel imported (ONNX)", "onnxruntime": "ONNX Runtime",
          "openvino": "OpenVINO", "torch": "torch eager", "mindspore": "MindSpore 2.10 fused"}
# A training step's loss change (second loss - first) may differ from the reference's by this
# much, relative: float32 gradients of deep nets, and BatchNorm's batch statistics.
STEP_CHANGE_RTOL = 0.05


def with_threads_stats(call: Callable[[int], np.ndarray], compiled: Any
                       ) -> Callable[[int], np.ndarray]:
    """`call`, carrying its compiled entry's thread-mode counters as `call.threads_stats()`
    (calls run alone, probes, switches: backends/c/c_entry_threads.py) where it has them, so a
    row can say whether an outlier sample was a call on one thread."""
    library = getattr(compiled.executable, "library", None)
    entry = getattr(library, "entry_module", None)
    if entry is not None and hasattr(entry, "threads_stats"):
        call.threads_stats = lambda: dict(entry.threads_stats())  # type: ignore[attr-defined]
    return call


def plan_flops(plan: Any) -> int | None:
    """Floating-point operations a call of the plan performs, as the report counts them
    (runtime/flops.py: 2 per multiply-add of a product or convolution); None when a step's count
    is unknown (a gradient kernel with no expander)."""
    counts = [step.flops for step in plan.steps]
    return None if any(c is None for c in counts) else int(sum(counts))


# -- availability --------------------------------------------------------------------------------

def missing(module: str) -> str | None:
    import importlib.util
    return None if importlib.util.find_spec(module) else f"{module} is not installed"


def needs_torch_export() -> str | None:
    why = missing("torch") or missing("onnx")
    return f"the ONNX file is torch's export: {why}" if why else None


# -- systems -------------------------------------------------------------------------------------

def gk_inference(cell: Any, sets: list[list[np.ndarray]], fused: bool
                 ) -> tuple[Callable[[int], np.ndarray], dict[str, Any]]:
    import graphkernel
    from graphkernel.graph_kernel.pipeline import CompileOptions

    t0 = time.perf_counter()
    exe = graphkernel.compile(cell, *sets[0], options=CompileOptions(enable_graph_kernel=fused))
    compile_s = time.perf_counter() - t0
    tensors = [[graphkernel.Tensor(a) for a in s] for s in sets]

    def call(i: int) -> np.ndarray:
        out = exe(*tensors[i])
        return (out[0] if isinstance(out, tuple) else out).asnumpy()
    return with_threads_stats(call, exe), {
        "compile_s": compile_s, "kernel_count": len(exe.kernels),
        "compile_cache": exe.report.compile_cache.split(":")[0], "flops": plan_flops(exe.plan)}


def gk_loaded(source: Any, sets: list[list[np.ndarray]], fused: bool
              ) -> tuple[Callable[[int], np.ndarray], dict[str, Any]]:
    """graphkernel.load of an ONNX model (a path or a ModelProto) run by nn.GraphCell. The
    import runs the fusion pipeline with the context's setting, so fusion is set around the
    load; a dynamic batch axis stays symbolic (one compile serves every batch)."""
    import graphkernel
    from graphkernel import nn
    from graphkernel.frontend import context

    before = context.get_context("enable_graph_kernel")
    context.set_context(enable_graph_kernel=fused)
    try:
        t0 = time.perf_counter()
        cell = nn.GraphCell(graphkernel.load(source))
        load_s = time.perf_counter() - t0
    finally:
        context.set_context(enable_graph_kernel=before)
    t0 = time.perf_counter()
    compiled = cell.compiled
    compile_s = time.perf_counter() - t0
    tensors = [[graphkernel.Tensor(a) for a in s] for s in sets]

    def call(i: int) -> np.ndarray:
        out = compiled(*tensors[i])
        return (out[0] if isinstance(out, tuple) else out).asnumpy()
    # Whether one C call runs the graph (backends/c/c_entry.py), and the steps that are not a
    # generated kernel: what keeps a row on the Python runner's steps (issue 27's rows).
    others = sorted({f"{s.kind.value} {s.op}" for s in compiled.plan.steps
                     if s.kind.value != "kernel"})
    return with_threads_stats(call, compiled), {
        "load_s": load_s, "compile_s": compile_s, "kernel_count": len(compiled.kernels),
        "flops": plan_flops(compiled.plan), "c_entry": compiled.entry is not None,
        "other_steps": others, "signature": [f"{n}: {t}" for n, t in cell._loaded.signature]}


def mindspore_missing() -> str | None:
    """Why MindSpore cannot run here, or None (bench/peers.py MindSporeFused's probe)."""
    from bench.peers import MindSporeFused
    return MindSporeFused().probe()


def mindspore_cnn(model: str, params: dict[str, np.ndarray], xs: list[np.ndarray], tmp: str
                  ) -> tuple[Callable[[int], np.ndarray], dict[str, Any]]:
    """bench/real_models.py's `model` on MindSpore 2.10 (graph mode, graph-kernel fusion on, as
    the suite's MindSpore system) with `params`, in a helper process (bench/ms_worker.py: its
    import sets OMP_NUM_THREADS=1 process-wide); a call asks it for input set i's result, so its
    time includes a pipe's round trip (~0.1 ms) and the 1000-class output's copy."""
    import weakref

    from bench.remote import RemoteWorker
    params_path = os.path.join(tmp, f"{model}_mindspore_params.npz")
    inputs_path = os.path.join(tmp, f"{model}_mindspore_inputs.npz")
    np.savez(params_path, **params)
    np.savez(inputs_path, *xs)
    worker = RemoteWorker("bench.ms_worker")
    try:
        t0 = time.perf_counter()
        info = worker.request("prepare_cnn", model=model, params_path=params_path,
                              inputs_path=inputs_path)
        info["prepare_in_helper_s"] = time.perf_counter() - t0
    except Exception:
        worker.close()
        raise

    def call(i: int) -> np.ndarray:
        return worker.request("output", mode="fresh", index=i)
    weakref.finalize(call, worker.close)  # the helper ends with the row
    return call, info


def ort(path: str, names: list[str], sets: list[list[np.ndarray]]
        ) -> tuple[Callable[[int], np.ndarray], dict[str, Any]]:
    import onnx

    from bench.peers import ort_session
    t0 = time.perf_counter()
    sess = ort_session(onnx.load(path))
    session_s = time.perf_counter() - t0
    feeds = [dict(zip(names, s)) for s in sets]
    out = sess.get_outputs()[0].name
    return (lambda i: sess.run([out], feeds[i])[0]), {"session_s": session_s}


def openvino(path: str, names: list[str], sets: list[list[np.ndarray]]
             ) -> tuple[Callable[[int], np.ndarray], dict[str, Any]]:
    from bench.peers import openvino_compiled
    t0 = time.perf_counter()
    compiled = openvino_compiled(path)
    compile_s = time.perf_counter() - t0
    request = compiled.create_infer_request()
    feeds = [dict(zip(names, s)) for s in sets]
    threads = compiled.get_property("INFERENCE_NUM_THREADS")
    precision = str(compiled.get_property("INFERENCE_PRECISION_HINT"))

    def call(i: int) -> np.ndarray:
        request.infer(feeds[i])
        return np.array(request.get_output_tensor(0).data, copy=True)
    return call, {"compile_s": compile_s, "threads": int(threads), "precision": precision}


def torch_inference(model: Any, sets: list[list[np.ndarray]]
                    ) -> tuple[Callable[[int], np.ndarray], dict[str, Any]]:
    import torch
    tensors = [[torch.from_numpy(a) for a in s] for s in sets]

    def call(i: int) -> np.ndarray:
        with torch.inference_mode():
            out = model(*tensors[i])
        out = out[0] if isinstance(out, (tuple, list)) else getattr(
            out, "last_hidden_state", out)
        return out.numpy()
    return call, {"threads": torch.get_num_threads()}


def torch_export(model: Any, example: list[np.ndarray], names: list[str], path: str,
                 dynamic_batch: bool, opset: int = 17) -> None:
    import torch
    args = tuple(torch.from_numpy(a) for a in example)
    axes = {n: {0: "batch"} for n in names + ["out"]} if dynamic_batch else None
    with torch.no_grad():
        torch.onnx.export(model, args, path, input_names=names, output_names=["out"],
                          dynamic_axes=axes, opset_version=opset, dynamo=False)


def fix_batch(path: str, batch: int, out_path: str) -> None:
    """The same ONNX file with its symbolic batch dimension set to `batch`."""
    import onnx
    model = onnx.load(path)
    for v in list(model.graph.input) + list(model.graph.output):
        dim = v.type.tensor_type.shape.dim
        if dim and dim[0].HasField("dim_param"):
            dim[0].dim_value = batch
    onnx.save(model, out_path)


# -- training steps ------------------------------------------------------------------------------

LR, BETA1, BETA2, ADAM_EPS = 1e-3, 0.9, 0.999, 1e-5


def gk_train(net: Any, sets: list[list[np.ndarray]], fused: bool
             ) -> tuple[Callable[[int], np.ndarray], dict[str, Any]]:
    """TrainOneStepCell(net + 0.5*sum((net(x)-target)^2)/batch, Adam): the loss per call."""
    import graphkernel
    from graphkernel import nn
    from graphkernel.graph_kernel.pipeline import CompileOptions
    from graphkernel.ops import operations as P

    rows = float(sets[0][0].shape[0])

    class WithLoss(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.net = net
            self.sum, self.square = P.ReduceSum(), P.Square()

        def construct(self, x: Any, target: Any) -> Any:
            return self.sum(self.square(self.net(x) - target)) * (0.5 / rows)

    loss_net = WithLoss()
    step = nn.TrainOneStepCell(loss_net, nn.Adam(loss_net.trainable_params(), LR, BETA1,
                                                 BETA2, ADAM_EPS))
    step.set_train(True)
    t0 = time.perf_counter()
    exe = graphkernel.compile(step, *sets[0], options=CompileOptions(enable_graph_kernel=fused))
    compile_s = time.perf_counter() - t0

    def call(i: int) -> np.ndarray:
        return np.asarray(exe.run_arrays(*sets[i])[0], np.float32).reshape(1)
    return call, {"compile_s": compile_s, "kernel_count": len(exe.kernels),
                  "flops": plan_flops(exe.plan)}


def torch_train(model: Any, sets: list[list[np.ndarray]]
                ) -> tuple[Callable[[int], np.ndarray], dict[str, Any]]:
    import torch
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=LR, betas=(BETA1, BETA2), eps=ADAM_EPS,
                           foreach=True)
    tensors = [[torch.from_numpy(a) for a in s] for s in sets]
    rows = float(sets[0][0].shape[0])

    steps = [0]

    def call(i: int) -> np.ndarray:
        torch.set_grad_enabled(True)
        opt.zero_grad(set_to_none=False)
        x, target = tensors[i]
        loss = 0.5 * ((model(x) - target) ** 2).sum() / rows
        loss.backward()
        # torch adds eps to the bias-corrected sqrt(v), graphkernel's (MindSpore's) Adam to the
        # uncorrected one: the same step with eps / sqrt(1 - beta2^t) (as bench/training.py).
        steps[0] += 1
        opt.param_groups[0]["eps"] = ADAM_EPS / (1 - BETA2 ** steps[0]) ** 0.5
        opt.step()
        return np.asarray([float(loss.detach())], np.float32)
    return call, {"threads": torch.get_num_threads(), "optimizer": "Adam(foreach=True)"}
