"""The two example networks of examples/ as workloads: the digits CNN ("cnn": conv + BatchNorm
+ ReLU blocks, a residual block, max pools, a Dense head; output the logits) and the BERT-tiny
encoder ("bert": embeddings, two layers of masked multi-head attention and GeLU feed-forward;
output the sequence). Parameters are named as the example cells name them, so graphkernel
loads them with load_param_into_net; numpy computes the same nets from the same dict."""
from __future__ import annotations

import importlib.util
import math
import pathlib
from typing import Any

import numpy as np

NET_KINDS = ("cnn", "bert")
EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
BERT_EPS = 1e-12


def input_shapes(kind: str, d: dict[str, int]) -> dict[str, tuple[int, ...]]:
    if kind == "cnn":
        return {"x": (d["batch"], 1, 8, 8)}
    return {"ids": (d["batch"], d["seq"]), "mask": (d["batch"], d["seq"])}


def output_shape(kind: str, d: dict[str, int]) -> tuple[int, ...]:
    return (d["batch"], 10) if kind == "cnn" else (d["batch"], d["seq"], d["hidden"])


def _conv_bn(prefix: str, cin: int, cout: int) -> dict[str, tuple[int, ...]]:
    shapes = {f"{prefix}.conv.weight": (cout, cin, 3, 3), f"{prefix}.conv.bias": (cout,)}
    for name in ("gamma", "beta", "moving_mean", "moving_variance"):
        shapes[f"{prefix}.bn.{name}"] = (cout,)
    return shapes


def param_shapes(kind: str, d: dict[str, int]) -> dict[str, tuple[int, ...]]:
    if kind == "cnn":
        return {**_conv_bn("features.block1", 1, 16), **_conv_bn("features.block2", 16, 16),
                **_conv_bn("features.block3", 16, 32), "fc.weight": (10, 128),
                "fc.bias": (10,)}
    h, f = d["hidden"], d["inner"]
    shapes: dict[str, tuple[int, ...]] = {
        "word_embeddings.embedding_table": (d["vocab"], h),
        "position_embeddings.embedding_table": (d["seq"], h),
        "embedding_norm.gamma": (h,), "embedding_norm.beta": (h,)}
    for i in range(d["layers"]):
        a = f"layers.{i}.attention"
        for n in ("query", "key", "value", "output"):
            shapes[f"{a}.{n}.weight"], shapes[f"{a}.{n}.bias"] = (h, h), (h,)
        shapes[f"{a}.norm.gamma"], shapes[f"{a}.norm.beta"] = (h,), (h,)
        ff = f"layers.{i}.ffn"
        shapes[f"{ff}.dense_in.weight"], shapes[f"{ff}.dense_in.bias"] = (f, h), (f,)
        shapes[f"{ff}.dense_out.weight"], shapes[f"{ff}.dense_out.bias"] = (h, f), (h,)
        shapes[f"{ff}.norm.gamma"], shapes[f"{ff}.norm.beta"] = (h,), (h,)
    shapes["pooler.weight"], shapes["pooler.bias"] = (h, h), (h,)
    return shapes


def make_inputs(kind: str, d: dict[str, int], rng: np.random.Generator
                ) -> dict[str, np.ndarray]:
    if kind == "cnn":
        return {"x": rng.random((d["batch"], 1, 8, 8)).astype(np.float32)}
    ids = rng.integers(1, d["vocab"], (d["batch"], d["seq"])).astype(np.int32)
    lengths = rng.integers(d["seq"] // 2, d["seq"] + 1, d["batch"])
    mask = (np.arange(d["seq"])[None, :] < lengths[:, None]).astype(np.int32)
    return {"ids": ids * mask, "mask": mask}


def make_params(kind: str, d: dict[str, int], rng: np.random.Generator
                ) -> dict[str, np.ndarray]:
    params = {}
    for name, shape in param_shapes(kind, d).items():
        if name.endswith("moving_variance"):
            a = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("gamma"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("weight") or name.endswith("table"):
            fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
            a = rng.uniform(-1, 1, shape) / math.sqrt(fan_in)
        else:
            a = 0.1 * rng.standard_normal(shape)
        params[name] = a.astype(np.float32)
    return params


# -- numpy --------------------------------------------------------------------------------------

def _conv3x3_same(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, :, i:i + h, j:j + wd] for i in range(3) for j in range(3)], axis=2)
    out = np.einsum("nckhw,ock->nohw", cols, w.reshape(w.shape[0], c, 9), optimize=True)
    return out + b.reshape(1, -1, 1, 1)


def _bn(x: np.ndarray, p: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    def channel(name: str) -> np.ndarray:
        return p[f"{prefix}.{name}"].reshape(1, -1, 1, 1)
    return (x - channel("moving_mean")) / np.sqrt(channel("moving_variance") + 1e-5) * \
        channel("gamma") + channel("beta")


def _pool2(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def np_cnn(x: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    def block(t: np.ndarray, name: str, residual: bool = False) -> np.ndarray:
        y = _bn(_conv3x3_same(t, p[f"{name}.conv.weight"], p[f"{name}.conv.bias"]), p,
                f"{name}.bn")
        return np.maximum(y + t if residual else y, 0)

    t = _pool2(block(x, "features.block1"))
    t = block(block(t, "features.block2", residual=True), "features.block3")
    t = _pool2(t).reshape(len(x), -1)
    return t @ p["fc.weight"].T + p["fc.bias"]


def _gelu(v: np.ndarray) -> np.ndarray:  # tanh form, as the example's nn.Dense("gelu")
    return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_bert(ids: np.ndarray, mask: np.ndarray, p: dict[str, np.ndarray], heads: int
            ) -> np.ndarray:
    def dense(t: np.ndarray, name: str) -> np.ndarray:
        return t @ p[name + ".weight"].T + p[name + ".bias"]

    def norm(t: np.ndarray, name: str) -> np.ndarray:
        mean = t.mean(-1, keepdims=True)
        var = ((t - mean) ** 2).mean(-1, keepdims=True)
        return (t - mean) / np.sqrt(var + BERT_EPS) * p[name + ".gamma"] + p[name + ".beta"]

    b, s = ids.shape
    table = p["word_embeddings.embedding_table"]
    x = norm(table[ids] + p["position_embeddings.embedding_table"][:s], "embedding_norm")
    bias = (1.0 - mask.astype(x.dtype)[:, None, None, :]) * -10000.0
    layer = 0
    while f"layers.{layer}.attention.query.weight" in p:
        a = f"layers.{layer}.attention"
        hd = x.shape[-1] // heads

        def split(t: np.ndarray, hd: int = hd) -> np.ndarray:
            return t.reshape(b, s, heads, hd).transpose(0, 2, 1, 3)

        q, k, v = (split(dense(x, f"{a}.{n}")) for n in ("query", "key", "value"))
        probs = _softmax(q @ k.transpose(0, 1, 3, 2) * (1.0 / math.sqrt(hd)) + bias)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, -1)
        x = norm(dense(ctx, f"{a}.output") + x, f"{a}.norm")
        ff = f"layers.{layer}.ffn"
        x = norm(dense(_gelu(dense(x, f"{ff}.dense_in")), f"{ff}.dense_out") + x, f"{ff}.norm")
        layer += 1
    return x


def _into(result: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """`out=` as the other workloads take it (here a copy at the end, not the last ufunc)."""
    if out is None:
        return result
    np.copyto(out, result)
    return out


def numpy_fn(kind: str, d: dict[str, int], params: dict[str, np.ndarray]) -> Any:
    if kind == "cnn":
        return lambda x, out=None: _into(np_cnn(x, params), out)
    return lambda ids, mask, out=None: _into(np_bert(ids, mask, params, d["heads"]), out)


# -- graphkernel ----------------------------------------------------------------------------------

def load_example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"bench_example_{name}",
                                                  EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def make_cell(kind: str, d: dict[str, int], params: dict[str, np.ndarray]) -> Any:
    """The example's cell with the workload's parameters loaded by name."""
    import graphkernel
    if kind == "cnn":
        net = load_example("cnn_digits").DigitsCNN()
    else:
        bert = load_example("bert_tiny")
        net = bert.BertTiny(bert.Config(vocab_size=d["vocab"], hidden_size=d["hidden"],
                                        num_layers=d["layers"], num_heads=d["heads"],
                                        intermediate_size=d["inner"], max_position=d["seq"]))
    not_loaded, unused = graphkernel.load_param_into_net(net, params)
    if not_loaded or unused:
        raise KeyError(f"{kind}: parameters not loaded {not_loaded}, unused {unused}")
    return net
