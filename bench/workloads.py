"""The workloads: shapes, inputs, the float64 reference and the numpy eager version of each.

Every workload is one `kind` (the math) at one size. Per-call arrays are `inputs`; the weights
of the two networks (MLP, encoder) are `params`, which each system holds the way its users
would (Parameters, initializers, closure tensors). The float64 reference is the numpy code run
on float64 copies of the same arrays; the numpy eager system is that code on float32.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench import net_workloads
from bench.net_workloads import NET_KINDS

EPS = 1e-5  # LayerNorm epsilon, the same for every system
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

KINDS = ("basic", "composite", "chain", "bias_gelu", "layernorm", "softmax", "mlp", "encoder",
         "cnn", "bert", "mlp_train", "encoder_train")
# Training steps (bench/training.py): forward, backward and an Adam update of every weight.
TRAIN_KINDS = ("mlp_train", "encoder_train")
ELEMENTWISE_KINDS = ("basic", "composite", "chain", "bias_gelu")


@dataclass(frozen=True)
class Workload:
    key: str
    kind: str
    title: str
    dims: dict[str, int] = field(default_factory=dict)
    rtol: float = 1e-5
    atol: float = 1e-6  # relative to max |reference|

    @property
    def is_overhead(self) -> bool:
        """Tiny workloads measure the cost of a call, not of the arithmetic."""
        return self.nbytes()["total"] < (1 << 16)

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return input_shapes(self.kind, self.dims)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return param_shapes(self.kind, self.dims)

    def output_shape(self) -> tuple[int, ...]:
        if self.kind in NET_KINDS:
            return net_workloads.output_shape(self.kind, self.dims)
        if self.kind in TRAIN_KINDS:  # the loss, then every updated weight
            return (1 + sum(math.prod(s) for s in self.param_shapes().values()),)
        return next(iter(self.input_shapes().values()))

    def matmul_flops(self) -> int:
        """Floating-point operations of the matrix products (2 per multiply-add)."""
        d = self.dims
        if self.kind in TRAIN_KINDS:  # backward: two more products per forward product
            base = Workload(self.key, self.kind.removesuffix("_train"), self.title, self.dims)
            return 3 * base.matmul_flops()
        if self.kind == "mlp":
            return 2 * 2 * d["batch"] * d["hidden"] * d["inner"]
        if self.kind == "encoder":
            rows, h, f = d["batch"] * d["seq"], d["hidden"], d["inner"]
            attention = 2 * 2 * d["batch"] * d["seq"] * d["seq"] * h
            return 2 * rows * h * h * 4 + 2 * 2 * rows * h * f + attention
        return 0

    def nbytes(self) -> dict[str, int]:
        """Bytes a perfect kernel moves: each input and weight read once, the output written
        once (float32)."""
        read = sum(4 * math.prod(s) for s in self.input_shapes().values())
        read += sum(4 * math.prod(s) for s in self.param_shapes().values())
        written = 4 * math.prod(self.output_shape())
        return {"read": read, "written": written, "total": read + written}


def input_shapes(kind: str, d: dict[str, int]) -> dict[str, tuple[int, ...]]:
    if kind in NET_KINDS:
        return net_workloads.input_shapes(kind, d)
    if kind in TRAIN_KINDS:  # the forward's input and the regression target
        x = input_shapes(kind.removesuffix("_train"), d)["x"]
        return {"x": x, "target": x}
    if kind in ("basic", "composite", "chain"):
        return {"x": (d["rows"], d["cols"])}
    if kind == "bias_gelu":
        return {"x": (d["rows"], d["cols"]), "b": (d["cols"],)}
    if kind == "layernorm":
        return {"x": (d["rows"], d["cols"]), "gamma": (d["cols"],), "beta": (d["cols"],)}
    if kind == "softmax":
        return {"x": (d["rows"], d["cols"])}
    if kind == "mlp":
        return {"x": (d["batch"], d["hidden"])}
    if kind == "encoder":
        return {"x": (d["batch"], d["seq"], d["hidden"])}
    raise KeyError(kind)


def param_shapes(kind: str, d: dict[str, int]) -> dict[str, tuple[int, ...]]:
    if kind in NET_KINDS:
        return net_workloads.param_shapes(kind, d)
    kind = kind.removesuffix("_train")
    if kind == "mlp":
        h, f = d["hidden"], d["inner"]
        return {"w1": (f, h), "b1": (f,), "w2": (h, f), "b2": (h,), "gamma": (h,),
                "beta": (h,)}
    if kind == "encoder":
        h, f = d["hidden"], d["inner"]
        shapes: dict[str, tuple[int, ...]] = {}
        for name in ("q", "k", "v", "o"):
            shapes["w" + name] = (h, h)
            shapes["b" + name] = (h,)
        shapes.update({"g1": (h,), "be1": (h,), "w1": (f, h), "b1": (f,), "w2": (h, f),
                       "b2": (h,), "g2": (h,), "be2": (h,)})
        return shapes
    return {}


def make_arrays(w: Workload, seed: int = 0, with_params: bool = True
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Float32 inputs and params, deterministic for a seed."""
    rng = np.random.default_rng(seed)
    if w.kind in NET_KINDS:  # token ids and masks are int32
        inputs = net_workloads.make_inputs(w.kind, w.dims, rng)
        params = net_workloads.make_params(w.kind, w.dims, rng) if with_params else {}
        return inputs, params
    inputs = {}
    for name, shape in w.input_shapes().items():
        if name == "gamma":
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name in ("beta", "b"):
            a = 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape)
        inputs[name] = a.astype(np.float32)
    params: dict[str, np.ndarray] = {}
    for name, shape in (w.param_shapes() if with_params else {}).items():
        if name.startswith("w"):
            a = rng.uniform(-1, 1, shape) / math.sqrt(shape[1])
        elif name.startswith("g"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            a = 0.1 * rng.standard_normal(shape)
        params[name] = a.astype(np.float32)
    return inputs, params


def input_sets(w: Workload, seeds: list[int]) -> tuple[list[dict[str, np.ndarray]],
                                                      dict[str, np.ndarray]]:
    """One set of per-call inputs per seed (rotated through so that repeated calls do not find
    their inputs in cache) and the params of the first seed."""
    first, params = make_arrays(w, seeds[0])
    return [first] + [make_arrays(w, s, False)[0] for s in seeds[1:]], params


# ---------------------------------------------------------------------------------------------
# numpy: one code path; float32 arrays give numpy eager, float64 arrays the reference.

def np_basic(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return np.multiply((x * 2.0) + 1.0, 3.0, out=out)


def np_chain(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return np.multiply(np.tanh(np.exp(x * 0.5 + 0.1) * 0.3 - 0.7) + 1.0, x, out=out)


def np_gelu(v: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    inner = np.tanh(SQRT_2_OVER_PI * (v + 0.044715 * (v * v * v)))
    return np.multiply(0.5 * v, 1.0 + inner, out=out)


def np_bias_gelu(x: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return np_gelu(x + b, out=out)


def np_layernorm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                 out: np.ndarray | None = None) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    scaled = centered / np.sqrt(var + EPS) * gamma
    return np.add(scaled, beta, out=out)


def np_softmax(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return np.divide(e, e.sum(axis=-1, keepdims=True), out=out)


def np_mlp(x: np.ndarray, p: dict[str, np.ndarray], out: np.ndarray | None = None
           ) -> np.ndarray:
    h = np_gelu(x @ p["w1"].T + p["b1"])
    y = h @ p["w2"].T + p["b2"]
    return np_layernorm(y + x, p["gamma"], p["beta"], out=out)


def np_encoder(x: np.ndarray, p: dict[str, np.ndarray], heads: int,
               out: np.ndarray | None = None) -> np.ndarray:
    b, s, h = x.shape
    hd = h // heads
    x2 = x.reshape(b * s, h)

    def proj(name: str) -> np.ndarray:
        t = x2 @ p["w" + name].T + p["b" + name]
        return t.reshape(b, s, heads, hd).transpose(0, 2, 1, 3)

    q, k, v = proj("q"), proj("k"), proj("v")
    scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(hd))
    ctx = (np_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(b * s, h)
    h1 = np_layernorm(x2 + (ctx @ p["wo"].T + p["bo"]), p["g1"], p["be1"])
    f = np_gelu(h1 @ p["w1"].T + p["b1"]) @ p["w2"].T + p["b2"]
    out2 = None if out is None else out.reshape(b * s, h)
    return np_layernorm(h1 + f, p["g2"], p["be2"], out=out2).reshape(b, s, h)


def numpy_fn(w: Workload, params: dict[str, np.ndarray]
             ) -> Callable[..., np.ndarray]:
    """fn(*inputs, out=None) in the workload's input order."""
    kind = w.kind
    if kind in NET_KINDS:
        return net_workloads.numpy_fn(kind, w.dims, params)
    if kind in ("basic", "composite"):
        return np_basic
    if kind == "chain":
        return np_chain
    if kind == "bias_gelu":
        return np_bias_gelu
    if kind == "layernorm":
        return np_layernorm
    if kind == "softmax":
        return np_softmax
    if kind == "mlp":
        return lambda x, out=None: np_mlp(x, params, out=out)
    if kind == "encoder":
        heads = w.dims["heads"]
        return lambda x, out=None: np_encoder(x, params, heads, out=out)
    raise KeyError(kind)


def reference(w: Workload, inputs: dict[str, np.ndarray], params: dict[str, np.ndarray]
              ) -> np.ndarray:
    """The float64 answer every system is checked against (inference workloads;
    bench.training.reference covers the training steps too)."""
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    fn = numpy_fn(w, p64)
    return fn(*[a.astype(np.float64) if a.dtype.kind == "f" else a for a in inputs.values()])


def check(w: Workload, out: Any, ref: np.ndarray) -> dict[str, Any]:
    """Compare one system's output with the float64 reference."""
    arr = np.asarray(out)
    result: dict[str, Any] = {"dtype": str(arr.dtype), "shape": list(arr.shape)}
    if arr.shape != ref.shape:
        result.update(ok=False, error=f"shape {arr.shape}, expected {ref.shape}")
        return result
    if arr.dtype != np.float32:
        result.update(ok=False, error=f"dtype {arr.dtype}, expected float32")
        return result
    diff = np.abs(arr.astype(np.float64) - ref)
    scale = float(np.max(np.abs(ref))) or 1.0
    bound = w.rtol * np.abs(ref) + w.atol * scale
    bad = ~(diff <= bound)  # NaN counts as bad
    result["max_abs_err"] = float(np.nanmax(diff)) if diff.size else 0.0
    result["max_rel_err"] = float(np.nanmax(diff / (np.abs(ref) + w.atol * scale))) \
        if diff.size else 0.0
    result["max_err_over_max_ref"] = result["max_abs_err"] / scale
    result["bad_elements"] = int(bad.sum())
    result["ok"] = not bool(bad.any())
    if not result["ok"]:
        where = np.unravel_index(int(np.argmax(np.where(bad, diff, -1))), ref.shape)
        at = [int(i) for i in where]
        result["error"] = (f"{result['bad_elements']} of {ref.size} elements outside "
                           f"rtol={w.rtol}, atol={w.atol}*max|ref|; worst at {at}: got "
                           f"{float(arr[where])!r}, expected {float(ref[where])!r}")
    return result


# ---------------------------------------------------------------------------------------------
# The suites

def _w(key: str, kind: str, title: str, rtol: float = 1e-5, atol: float = 1e-6,
       **dims: int) -> Workload:
    return Workload(key, kind, title, dims, rtol, atol)


def _suite(n_small: int, n_big: int, ln: tuple[int, int], mlp: tuple[int, int, int],
           enc: tuple[int, int, int, int]) -> list[Workload]:
    rows, cols = ln
    b, h, f = mlp
    eb, es, eh, heads = enc
    # Matmul-based nets: float32 sums of a few thousand terms, then LayerNorm.
    net_tol = {"rtol": 2e-4, "atol": 2e-4}
    # exp/tanh: float32 libraries differ by a few ulp to ~1e-5 (vectorised approximations).
    fn_tol = {"rtol": 1e-4, "atol": 1e-5}
    # Updated weights move ~1e-3 per step; float32 gradients differ in the last digits.
    train_tol = {"rtol": 1e-4, "atol": 2e-5}
    return [
        _w(f"basic_{n_small}x{n_small}", "basic", f"NetBasicFuse ((x*2)+1)*3, "
           f"{n_small}x{n_small}", rows=n_small, cols=n_small),
        _w(f"basic_{n_big}x{n_big}", "basic", f"NetBasicFuse ((x*2)+1)*3, {n_big}x{n_big}",
           rows=n_big, cols=n_big),
        _w(f"composite_{n_small}x{n_small}", "composite", f"NetCompositeFuse, "
           f"{n_small}x{n_small}", rows=n_small, cols=n_small),
        _w(f"composite_{n_big}x{n_big}", "composite", f"NetCompositeFuse, {n_big}x{n_big}",
           rows=n_big, cols=n_big),
        _w(f"chain8_{n_big}x{n_big}", "chain", f"8-op chain (tanh(exp(x*0.5+0.1)*0.3-0.7)+1)*x,"
           f" {n_big}x{n_big}", rows=n_big, cols=n_big, **fn_tol),
        _w(f"bias_gelu_{n_big}x{n_big}", "bias_gelu", f"BiasAdd + GeLU(tanh), "
           f"[{n_big},{n_big}] + [{n_big}]", rows=n_big, cols=n_big, **fn_tol),
        _w(f"layernorm_{rows}x{cols}", "layernorm", f"LayerNorm (last axis), [{rows},{cols}]",
           rtol=1e-4, atol=1e-5, rows=rows, cols=cols),
        _w(f"softmax_{rows}x{cols}", "softmax", f"Softmax (last axis), [{rows},{cols}]",
           rtol=1e-4, atol=1e-6, rows=rows, cols=cols),
        _w(f"mlp_{b}x{h}x{f}", "mlp", f"MLP Dense-GeLU-Dense-residual-LayerNorm, batch {b}, "
           f"hidden {h}, inner {f}", batch=b, hidden=h, inner=f, **net_tol),
        _w(f"encoder_{eb}x{es}x{eh}", "encoder", f"Transformer encoder layer, batch {eb}, seq "
           f"{es}, hidden {eh}, {heads} heads", batch=eb, seq=es, hidden=eh, heads=heads,
           inner=4 * eh, **net_tol),
        # One training step (forward + backward + Adam); the checked output is the loss and
        # the updated weights (bench/training.py).
        _w(f"mlp_train_{b}x{h}x{f}", "mlp_train", f"Training step: MLP block + MSE + Adam, "
           f"batch {b}, hidden {h}, inner {f}", batch=b, hidden=h, inner=f, **train_tol),
        _w(f"encoder_train_{eb}x{es}x{eh}", "encoder_train", f"Training step: encoder layer + "
           f"MSE + Adam, batch {eb}, seq {es}, hidden {eh}, {heads} heads", batch=eb, seq=es,
           hidden=eh, heads=heads, inner=4 * eh, **train_tol),
    ]


def _examples(cnn_batch: int, bert: tuple[int, int, int]) -> list[Workload]:
    """The example networks (examples/cnn_digits.py, examples/bert_tiny.py)."""
    bb, bs, bh = bert
    return [
        _w(f"cnn_digits_{cnn_batch}", "cnn", f"Digits CNN (conv-BN-ReLU, residual, pools, "
           f"Dense), batch {cnn_batch} of 8x8", rtol=2e-4, atol=2e-4, batch=cnn_batch),
        _w(f"bert_tiny_{bb}x{bs}x{bh}", "bert", f"BERT-tiny (2 layers, masked attention), "
           f"batch {bb}, seq {bs}, hidden {bh}", rtol=5e-4, atol=5e-4, batch=bb, seq=bs,
           hidden=bh, heads=2, layers=2, inner=4 * bh, vocab=1000),
    ]


def full_suite() -> list[Workload]:
    return _suite(4, 4096, (8192, 1024), (512, 1024, 4096), (8, 128, 256, 4)) + \
        _examples(256, (8, 128, 128))


def quick_suite() -> list[Workload]:
    return _suite(4, 256, (256, 128), (32, 64, 256), (2, 16, 32, 4)) + _examples(16, (2, 16, 32))


def tiny_suite() -> list[Workload]:
    return _suite(4, 16, (8, 16), (4, 8, 32), (1, 4, 8, 2)) + _examples(4, (2, 6, 16))


SUITES: dict[str, Callable[[], list[Workload]]] = {
    "full": full_suite, "quick": quick_suite, "tiny": tiny_suite}
