"""The systems a user would pick instead: PyTorch eager, torch.compile (inductor), jax.jit,
ONNX Runtime and MindSpore with graph-kernel fusion. Each is optional: `probe` says why one is
skipped. Every workload is written the way that system's users write it (torch.nn.functional,
jax.nn, an ONNX graph from onnx.helper, MindSpore primitives)."""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench import net_peers
from bench.net_workloads import NET_KINDS
from bench.systems import (
    FRESH,
    PREALLOCATED,
    GraphKernel,
    NumExpr,
    NumpyEager,
    Prepared,
    Runner,
    System,
)
from bench.workloads import EPS, SQRT_2_OVER_PI, TRAIN_KINDS, Workload

# ---------------------------------------------------------------------------------------------
# PyTorch


def torch_fn(w: Workload, p: dict[str, Any]) -> Callable[..., Any]:
    """fn(*tensors, out=None); out is honoured where torch offers it (elementwise ops)."""
    import torch
    import torch.nn.functional as F

    kind = w.kind
    if kind in NET_KINDS:
        return net_peers.torch_net(kind, w.dims, p)
    if kind in ("basic", "composite"):
        return lambda x, out=None: torch.mul(x * 2.0 + 1.0, 3.0, out=out)
    if kind == "chain":
        return lambda x, out=None: torch.mul(torch.tanh(torch.exp(x * 0.5 + 0.1) * 0.3 - 0.7)
                                             + 1.0, x, out=out)
    if kind == "bias_gelu":
        return lambda x, b, out=None: F.gelu(x + b, approximate="tanh")
    if kind == "layernorm":
        n = w.dims["cols"]
        return lambda x, g, b, out=None: F.layer_norm(x, (n,), g, b, EPS)
    if kind == "softmax":
        return lambda x, out=None: torch.softmax(x, dim=-1)
    if kind == "mlp":
        h = w.dims["hidden"]

        def mlp(x: Any, out: Any = None) -> Any:
            y = F.linear(F.gelu(F.linear(x, p["w1"], p["b1"]), approximate="tanh"), p["w2"],
                         p["b2"])
            return F.layer_norm(y + x, (h,), p["gamma"], p["beta"], EPS)
        return mlp
    if kind == "encoder":
        d = w.dims
        b, s, h, heads = d["batch"], d["seq"], d["hidden"], d["heads"]
        hd = h // heads

        def encoder(x: Any, out: Any = None) -> Any:
            def split(t: Any) -> Any:
                return t.view(b, s, heads, hd).transpose(1, 2)
            q = split(F.linear(x, p["wq"], p["bq"]))
            k = split(F.linear(x, p["wk"], p["bk"]))
            v = split(F.linear(x, p["wv"], p["bv"]))
            ctx = F.scaled_dot_product_attention(q, k, v)
            ctx = ctx.transpose(1, 2).reshape(b, s, h)
            h1 = F.layer_norm(x + F.linear(ctx, p["wo"], p["bo"]), (h,), p["g1"], p["be1"], EPS)
            f = F.linear(F.gelu(F.linear(h1, p["w1"], p["b1"]), approximate="tanh"), p["w2"],
                         p["b2"])
            return F.layer_norm(h1 + f, (h,), p["g2"], p["be2"], EPS)
        return encoder
    raise KeyError(kind)


class TorchEager(System):
    key, label = "torch", "PyTorch eager"
    runs_example_nets = True  # bench/net_peers.py
    dists = ("torch",)

    def probe(self) -> str | None:
        try:
            import torch
        except ImportError as exc:
            return f"torch not installed ({exc})"
        torch.set_num_threads(2)
        torch.set_grad_enabled(False)
        return None

    def preload(self) -> None:
        import torch.nn.functional  # noqa: F401

    def threads(self) -> dict[str, Any]:
        import torch
        return {"torch_num_threads": torch.get_num_threads(),
                "torch_interop_threads": torch.get_num_interop_threads()}

    def _tensors(self, sets: list[dict[str, np.ndarray]], params: dict[str, np.ndarray]
                 ) -> tuple[list[list[Any]], dict[str, Any]]:
        import torch
        tsets = [[torch.from_numpy(a) for a in s.values()] for s in sets]
        return tsets, {k: torch.from_numpy(v) for k, v in params.items()}

    def prepare(self, w: Workload, sets: list[dict[str, np.ndarray]],
                params: dict[str, np.ndarray], seeds: list[int]) -> Prepared:
        import torch
        if w.kind in TRAIN_KINDS:
            from bench.training import prepare_torch
            call, to_numpy, info = prepare_torch(w, sets, params, False, torch_fn)
            return Prepared([Runner(self.key, FRESH, call, to_numpy, len(sets))], info)
        torch.set_grad_enabled(False)
        tsets, tp = self._tensors(sets, params)
        fn = torch_fn(w, tp)
        n = len(sets)
        runners = [Runner(self.key, FRESH, lambda i: fn(*tsets[i]), _torch_numpy, n)]
        info: dict[str, Any] = {}
        if w.kind in ("basic", "composite", "chain"):
            out = torch.zeros(w.output_shape(), dtype=torch.float32)
            runners.append(Runner(self.key, PREALLOCATED, lambda i: fn(*tsets[i], out=out),
                                  _torch_numpy, n))
            info["preallocated"] = "out= on the last op"
        if w.kind == "encoder":
            info["attention"] = "F.scaled_dot_product_attention"
        return Prepared(runners, info)


def _torch_numpy(t: Any) -> np.ndarray:
    return t.detach().numpy()


class TorchCompile(TorchEager):
    key, label = "inductor", "torch.compile (inductor)"

    def probe(self) -> str | None:
        reason = super().probe()
        if reason:
            return reason
        import shutil
        if not (shutil.which("g++") or shutil.which("c++") or os.environ.get("CXX")):
            return "torch.compile's CPU backend needs a C++ compiler"
        return None

    def prepare(self, w: Workload, sets: list[dict[str, np.ndarray]],
                params: dict[str, np.ndarray], seeds: list[int]) -> Prepared:
        import torch
        if w.kind in TRAIN_KINDS:
            from bench.training import prepare_torch
            call, to_numpy, info = prepare_torch(w, sets, params, True, torch_fn)
            return Prepared([Runner(self.key, FRESH, call, to_numpy, len(sets))], info)
        torch.set_grad_enabled(False)
        tsets, tp = self._tensors(sets, params)
        eager = torch_fn(w, tp)
        fn = torch.compile(lambda *xs: eager(*xs), dynamic=False)
        t0 = time.perf_counter()
        fn(*tsets[0])
        first = time.perf_counter() - t0
        n = len(sets)
        return Prepared([Runner(self.key, FRESH, lambda i: fn(*tsets[i]), _torch_numpy, n)],
                        {"first_call_s": first, "mode": "default, dynamic=False"})


# ---------------------------------------------------------------------------------------------
# JAX

def jax_fn(w: Workload) -> Callable[..., Any]:
    """fn(*inputs, params) for jax.jit."""
    import jax
    import jax.numpy as jnp

    def layer_norm(x: Any, g: Any, b: Any) -> Any:
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + EPS) * g + b

    def gelu(x: Any) -> Any:
        return jax.nn.gelu(x, approximate=True)

    kind = w.kind
    if kind in NET_KINDS:
        return net_peers.jax_net(kind, w.dims)
    if kind in ("basic", "composite"):
        return lambda x, p: ((x * 2.0) + 1.0) * 3.0
    if kind == "chain":
        return lambda x, p: (jnp.tanh(jnp.exp(x * 0.5 + 0.1) * 0.3 - 0.7) + 1.0) * x
    if kind == "bias_gelu":
        return lambda x, b, p: gelu(x + b)
    if kind == "layernorm":
        return lambda x, g, b, p: layer_norm(x, g, b)
    if kind == "softmax":
        return lambda x, p: jax.nn.softmax(x, axis=-1)
    if kind == "mlp":
        def mlp(x: Any, p: dict[str, Any]) -> Any:
            y = gelu(x @ p["w1"].T + p["b1"]) @ p["w2"].T + p["b2"]
            return layer_norm(y + x, p["gamma"], p["beta"])
        return mlp
    if kind == "encoder":
        d = w.dims
        b, s, h, heads = d["batch"], d["seq"], d["hidden"], d["heads"]
        hd = h // heads

        def encoder(x: Any, p: dict[str, Any]) -> Any:
            def proj(name: str) -> Any:
                t = x @ p["w" + name].T + p["b" + name]
                return t.reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
            q, k, v = proj("q"), proj("k"), proj("v")
            scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(hd))
            ctx = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
            h1 = layer_norm(x + ctx @ p["wo"].T + p["bo"], p["g1"], p["be1"])
            f = gelu(h1 @ p["w1"].T + p["b1"]) @ p["w2"].T + p["b2"]
            return layer_norm(h1 + f, p["g2"], p["be2"])
        return encoder
    raise KeyError(kind)


class JaxJit(System):
    key, label = "jax", "jax.jit"
    runs_example_nets = True  # bench/net_peers.py
    dists = ("jax", "jaxlib")

    def probe(self) -> str | None:
        try:
            import jax
        except ImportError as exc:
            return f"jax not installed ({exc})"
        jax.config.update("jax_platforms", "cpu")
        return None

    def preload(self) -> None:
        import jax.numpy  # noqa: F401

    def threads(self) -> dict[str, Any]:
        import jax
        return {"jax_devices": [str(d) for d in jax.devices()],
                "xla_flags": os.environ.get("XLA_FLAGS", "")}

    def prepare(self, w: Workload, sets: list[dict[str, np.ndarray]],
                params: dict[str, np.ndarray], seeds: list[int]) -> Prepared:
        import jax
        if w.kind in TRAIN_KINDS:
            from bench.training import prepare_jax
            call, to_numpy, info = prepare_jax(w, sets, params, jax_fn)
            return Prepared([Runner(self.key, FRESH, call, to_numpy, len(sets))], info)
        fn = jax.jit(jax_fn(w))
        jsets = [[jax.device_put(a) for a in s.values()] for s in sets]
        jp = {k: jax.device_put(v) for k, v in params.items()}
        t0 = time.perf_counter()
        fn(*jsets[0], jp).block_until_ready()
        first = time.perf_counter() - t0

        def call(i: int) -> Any:
            return fn(*jsets[i], jp).block_until_ready()

        return Prepared([Runner(self.key, FRESH, call, np.asarray, len(sets))],
                        {"first_call_s": first, "output": "jax.Array (block_until_ready)"})


# ---------------------------------------------------------------------------------------------
# ONNX Runtime

class _Graph:
    """A small onnx.helper graph builder."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.count = 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        from onnx import numpy_helper
        n = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), n))
        return n

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        from onnx import helper
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def gelu(self, v: str) -> str:
        cube = self.op("Mul", self.op("Mul", v, v), v)
        inner = self.op("Add", v, self.op("Mul", cube, self.const(0.044715)))
        t = self.op("Tanh", self.op("Mul", inner, self.const(SQRT_2_OVER_PI)))
        return self.op("Mul", self.op("Mul", v, self.const(0.5)),
                       self.op("Add", t, self.const(1.0)))

    def linear(self, x: str, w: str, b: str) -> str:
        return self.op("Gemm", x, w, b, transB=1)

    def layer_norm(self, x: str, g: str, b: str, eps: float = EPS) -> str:
        return self.op("LayerNormalization", x, g, b, axis=-1, epsilon=eps)


def onnx_model(w: Workload, params: dict[str, np.ndarray]) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    g = _Graph()
    for name, value in params.items():
        if not (w.kind == "bert" and name.startswith("pooler.")):  # the pooled output is not
            g.inits.append(numpy_helper.from_array(value, name))  # the workload's output
    kind = w.kind
    if kind in NET_KINDS:
        out = net_peers.onnx_net(g, kind, w.dims, params)
    elif kind in ("basic", "composite"):
        out = g.op("Mul", g.op("Add", g.op("Mul", "x", g.const(2.0)), g.const(1.0)),
                   g.const(3.0))
    elif kind == "chain":
        t = g.op("Exp", g.op("Add", g.op("Mul", "x", g.const(0.5)), g.const(0.1)))
        t = g.op("Tanh", g.op("Sub", g.op("Mul", t, g.const(0.3)), g.const(0.7)))
        out = g.op("Mul", g.op("Add", t, g.const(1.0)), "x")
    elif kind == "bias_gelu":
        out = g.gelu(g.op("Add", "x", "b"))
    elif kind == "layernorm":
        out = g.layer_norm("x", "gamma", "beta")
    elif kind == "softmax":
        out = g.op("Softmax", "x", axis=-1)
    elif kind == "mlp":
        y = g.linear(g.gelu(g.linear("x", "w1", "b1")), "w2", "b2")
        out = g.layer_norm(g.op("Add", y, "x"), "gamma", "beta")
    elif kind == "encoder":
        d = w.dims
        b, s, h, heads = d["batch"], d["seq"], d["hidden"], d["heads"]
        hd = h // heads
        x2 = g.op("Reshape", "x", g.const([b * s, h], np.int64))
        split_shape = g.const([b, s, heads, hd], np.int64)

        def proj(name: str, perm: list[int]) -> str:
            t = g.op("Reshape", g.linear(x2, "w" + name, "b" + name), split_shape)
            return g.op("Transpose", t, perm=perm)
        q, k, v = proj("q", [0, 2, 1, 3]), proj("k", [0, 2, 3, 1]), proj("v", [0, 2, 1, 3])
        scores = g.op("Mul", g.op("MatMul", q, k), g.const(1.0 / math.sqrt(hd)))
        ctx = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
        ctx = g.op("Reshape", g.op("Transpose", ctx, perm=[0, 2, 1, 3]),
                   g.const([b * s, h], np.int64))
        h1 = g.layer_norm(g.op("Add", x2, g.linear(ctx, "wo", "bo")), "g1", "be1")
        f = g.linear(g.gelu(g.linear(h1, "w1", "b1")), "w2", "b2")
        y = g.layer_norm(g.op("Add", h1, f), "g2", "be2")
        out = g.op("Reshape", y, g.const([b, s, h], np.int64))
    else:
        raise KeyError(kind)
    inputs = [helper.make_tensor_value_info(
        n, TensorProto.INT32 if n in net_peers.INT_INPUTS else TensorProto.FLOAT, list(shape))
        for n, shape in w.input_shapes().items()]
    output = helper.make_tensor_value_info(out, TensorProto.FLOAT, list(w.output_shape()))
    graph = helper.make_graph(g.nodes, f"bench_{w.kind}", inputs, [output], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def ort_session(model: Any) -> Any:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Passive waiting, like OMP_WAIT_POLICY=PASSIVE for the OpenMP pools in this process.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


class OnnxRuntime(System):
    key, label = "onnxruntime", "ONNX Runtime"
    runs_example_nets = True  # bench/net_peers.py
    dists = ("onnxruntime", "onnx")

    def probe(self) -> str | None:
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            return f"onnx/onnxruntime not installed ({exc})"
        return None

    def threads(self) -> dict[str, Any]:
        return {"ort_intra_op_threads": 2, "ort_inter_op_threads": 1, "ort_spinning": False}

    def supports(self, w: Workload) -> str | None:
        if w.kind in TRAIN_KINDS:
            return "ONNX Runtime here runs inference graphs (its training package is apart)"
        return None

    def prepare(self, w: Workload, sets: list[dict[str, np.ndarray]],
                params: dict[str, np.ndarray], seeds: list[int]) -> Prepared:
        model = onnx_model(w, params)
        t0 = time.perf_counter()
        sess = ort_session(model)
        session_s = time.perf_counter() - t0
        out_name = sess.get_outputs()[0].name
        feeds = [dict(s) for s in sets]
        run = sess.run

        def fresh(i: int) -> Any:
            return run([out_name], feeds[i])[0]

        out = np.zeros(w.output_shape(), np.float32)
        bindings = []
        for s in sets:
            bind = sess.io_binding()
            for name, a in s.items():
                bind.bind_cpu_input(name, a)
            bind.bind_output(out_name, "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
            bindings.append(bind)
        run_bound = sess.run_with_iobinding

        def into(i: int) -> Any:
            run_bound(bindings[i])
            return out

        t0 = time.perf_counter()
        fresh(0)
        first = time.perf_counter() - t0
        n = len(sets)
        return Prepared([Runner(self.key, FRESH, fresh, n_sets=n),
                         Runner(self.key, PREALLOCATED, into, n_sets=n)],
                        {"session_s": session_s, "first_call_s": first,
                         "preallocated": "io_binding bound output",
                         "opset": 17, "onnx_nodes": len(model.graph.node)})


# OpenVINO's CPU plugin on the very ONNX graph ONNX Runtime runs: float32 (it would pick bf16
# where the CPU has it), latency mode, every core.
OPENVINO_CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}


def openvino_compiled(model_bytes: bytes | str) -> Any:
    """An OpenVINO compiled model from ONNX bytes or an ONNX file's path."""
    import os

    import openvino as ov
    core = ov.Core()
    model = core.read_model(model_bytes) if isinstance(model_bytes, str) else \
        core.read_model(model_bytes, b"")
    config = dict(OPENVINO_CONFIG, INFERENCE_NUM_THREADS=os.cpu_count() or 1)
    return core.compile_model(model, "CPU", config)


class OpenVINO(System):
    key, label = "openvino", "OpenVINO"
    runs_example_nets = True  # the same graphs as ONNX Runtime (bench/net_peers.py)
    dists = ("openvino", "onnx")

    def probe(self) -> str | None:
        try:
            import onnx  # noqa: F401
            import openvino  # noqa: F401
        except ImportError as exc:
            return f"onnx/openvino not installed ({exc})"
        return None

    def threads(self) -> dict[str, Any]:
        import os
        return {"openvino_inference_threads": os.cpu_count(), **OPENVINO_CONFIG}

    def supports(self, w: Workload) -> str | None:
        if w.kind in TRAIN_KINDS:
            return "OpenVINO runs inference graphs"
        return None

    def prepare(self, w: Workload, sets: list[dict[str, np.ndarray]],
                params: dict[str, np.ndarray], seeds: list[int]) -> Prepared:
        model = onnx_model(w, params)
        t0 = time.perf_counter()
        compiled = openvino_compiled(model.SerializeToString())
        compile_s = time.perf_counter() - t0
        request = compiled.create_infer_request()
        feeds = [dict(s) for s in sets]

        def fresh(i: int) -> Any:
            request.infer(feeds[i])
            # the request's output buffer is reused by the next call: a user keeps a copy
            return np.array(request.get_output_tensor(0).data, copy=True)

        t0 = time.perf_counter()
        fresh(0)
        first = time.perf_counter() - t0
        return Prepared([Runner(self.key, FRESH, fresh, n_sets=len(sets))],
                        {"compile_s": compile_s, "first_call_s": first, "opset": 17,
                         "precision": str(compiled.get_property("INFERENCE_PRECISION_HINT")),
                         "threads": int(compiled.get_property("INFERENCE_NUM_THREADS"))})


class MindSporeFused(System):
    """MindSpore 2.10 on CPU, graph mode, graph-kernel fusion on. It runs in a helper process:
    importing MindSpore sets OMP_NUM_THREADS=1 for the process (which would slow every OpenMP
    pool loaded after it) and it writes kernel folders into the working directory."""

    key, label = "mindspore", "MindSpore 2.10 fused"
    dists = ("mindspore",)

    def __init__(self) -> None:
        self._worker: Any = None

    def probe(self) -> str | None:
        import importlib.util
        if importlib.util.find_spec("mindspore") is None:
            return "mindspore not installed"
        if importlib.util.find_spec("decorator") is None:
            return "mindspore's kernel compiler needs the `decorator` package"
        return None

    def worker(self) -> Any:
        from bench.remote import RemoteWorker
        if self._worker is not None and self._worker.proc.poll() is not None:
            self._worker = None  # it died (recorded on the workload it died in): start anew
        if self._worker is None:
            self._worker = RemoteWorker("bench.ms_worker")
        return self._worker

    def threads(self) -> dict[str, Any]:
        return self.worker().request("threads")

    def prepare(self, w: Workload, sets: list[dict[str, np.ndarray]],
                params: dict[str, np.ndarray], seeds: list[int]) -> Prepared:
        worker = self.worker()
        info = worker.request("prepare", workload=w, seeds=seeds)
        return Prepared([worker.runner(self.key, FRESH, len(sets))], info)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None


def all_systems() -> list[System]:
    """Every system the benchmark knows, graphkernel's first (this module sits above
    systems.py, so the list of both lives here)."""
    return [GraphKernel(True), GraphKernel(False), GraphKernel(True, generic=True),
            NumpyEager(), NumExpr(), TorchEager(), TorchCompile(), JaxJit(), OnnxRuntime(),
            OpenVINO(), MindSporeFused()]
