"""The example networks (bench/net_workloads.py: the digits CNN and BERT-tiny) as each peer's
users write them: torch.nn.functional, jax.lax/jax.nn, and an ONNX graph (opset 17) run by ONNX
Runtime. Same parameters by name as the graphkernel cells and the numpy reference."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from bench.net_workloads import BERT_EPS

BN_EPS = 1e-5
INT_INPUTS = ("ids", "mask")  # BERT's token ids and padding mask are int32
CNN_BLOCKS = (("features.block1", False), ("features.block2", True),
              ("features.block3", False))


def _layers(p: dict[str, Any]) -> int:
    n = 0
    while f"layers.{n}.attention.query.weight" in p:
        n += 1
    return n


# -- PyTorch ------------------------------------------------------------------------------------

def torch_net(kind: str, d: dict[str, int], p: dict[str, Any]) -> Any:
    import torch.nn.functional as F

    def block(t: Any, name: str, residual: bool) -> Any:
        y = F.conv2d(t, p[f"{name}.conv.weight"], p[f"{name}.conv.bias"], padding=1)
        y = F.batch_norm(y, p[f"{name}.bn.moving_mean"], p[f"{name}.bn.moving_variance"],
                         p[f"{name}.bn.gamma"], p[f"{name}.bn.beta"], False, 0.0, BN_EPS)
        return F.relu(y + t if residual else y)

    if kind == "cnn":
        def cnn(x: Any, out: Any = None) -> Any:
            t = F.max_pool2d(block(x, *CNN_BLOCKS[0]), 2)
            t = F.max_pool2d(block(block(t, *CNN_BLOCKS[1]), *CNN_BLOCKS[2]), 2)
            return F.linear(t.flatten(1), p["fc.weight"], p["fc.bias"])
        return cnn
    heads, h = d["heads"], d["hidden"]
    hd = h // heads

    def dense(t: Any, name: str) -> Any:
        return F.linear(t, p[name + ".weight"], p[name + ".bias"])

    def norm(t: Any, name: str) -> Any:
        return F.layer_norm(t, (h,), p[name + ".gamma"], p[name + ".beta"], BERT_EPS)

    def bert(ids: Any, mask: Any, out: Any = None) -> Any:
        b, s = ids.shape
        x = F.embedding(ids, p["word_embeddings.embedding_table"]) + \
            p["position_embeddings.embedding_table"][:s]
        x = norm(x, "embedding_norm")
        bias = (1.0 - mask.to(x.dtype)[:, None, None, :]) * -10000.0
        for i in range(_layers(p)):
            a = f"layers.{i}.attention"
            q, k, v = (dense(x, f"{a}.{n}").view(b, s, heads, hd).transpose(1, 2)
                       for n in ("query", "key", "value"))
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            x = norm(dense(ctx.transpose(1, 2).reshape(b, s, h), f"{a}.output") + x,
                     f"{a}.norm")
            ff = f"layers.{i}.ffn"
            x = norm(dense(F.gelu(dense(x, f"{ff}.dense_in"), approximate="tanh"),
                           f"{ff}.dense_out") + x, f"{ff}.norm")
        return x
    return bert


# -- jax ----------------------------------------------------------------------------------------

def jax_net(kind: str, d: dict[str, int]) -> Any:
    import jax
    import jax.numpy as jnp

    def channel(v: Any) -> Any:
        return v[None, :, None, None]

    def block(t: Any, p: dict[str, Any], name: str, residual: bool) -> Any:
        y = jax.lax.conv_general_dilated(t, p[f"{name}.conv.weight"], (1, 1), "SAME",
                                         dimension_numbers=("NCHW", "OIHW", "NCHW"))
        y = y + channel(p[f"{name}.conv.bias"])
        y = (y - channel(p[f"{name}.bn.moving_mean"])) * channel(
            p[f"{name}.bn.gamma"] * jax.lax.rsqrt(p[f"{name}.bn.moving_variance"] + BN_EPS)) \
            + channel(p[f"{name}.bn.beta"])
        return jax.nn.relu(y + t if residual else y)

    def pool(t: Any) -> Any:
        return jax.lax.reduce_window(t, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2),
                                     "VALID")

    if kind == "cnn":
        def cnn(x: Any, p: dict[str, Any]) -> Any:
            t = pool(block(x, p, *CNN_BLOCKS[0]))
            t = pool(block(block(t, p, *CNN_BLOCKS[1]), p, *CNN_BLOCKS[2]))
            return t.reshape(t.shape[0], -1) @ p["fc.weight"].T + p["fc.bias"]
        return cnn
    heads, h = d["heads"], d["hidden"]
    hd = h // heads

    def norm(t: Any, p: dict[str, Any], name: str) -> Any:
        mean = jnp.mean(t, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(t - mean), axis=-1, keepdims=True)
        return (t - mean) * jax.lax.rsqrt(var + BERT_EPS) * p[name + ".gamma"] + p[name + ".beta"]

    def bert(ids: Any, mask: Any, p: dict[str, Any]) -> Any:
        b, s = ids.shape

        def dense(t: Any, name: str) -> Any:
            return t @ p[name + ".weight"].T + p[name + ".bias"]

        x = jnp.take(p["word_embeddings.embedding_table"], ids, axis=0) + \
            p["position_embeddings.embedding_table"][:s]
        x = norm(x, p, "embedding_norm")
        bias = (1.0 - mask.astype(x.dtype)[:, None, None, :]) * -10000.0
        for i in range(_layers(p)):
            a = f"layers.{i}.attention"
            q, k, v = (dense(x, f"{a}.{n}").reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
                       for n in ("query", "key", "value"))
            scores = q @ k.transpose(0, 1, 3, 2) * (1.0 / math.sqrt(hd)) + bias
            ctx = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
            x = norm(dense(ctx, f"{a}.output") + x, p, f"{a}.norm")
            ff = f"layers.{i}.ffn"
            x = norm(dense(jax.nn.gelu(dense(x, f"{ff}.dense_in"), approximate=True),
                           f"{ff}.dense_out") + x, p, f"{ff}.norm")
        return x
    return bert


# -- ONNX ---------------------------------------------------------------------------------------

def onnx_net(g: Any, kind: str, d: dict[str, int], params: dict[str, np.ndarray]) -> str:
    """Add the network's nodes to `g` (bench/peers.py's _Graph); returns the output's name."""
    if kind == "cnn":
        t = "x"
        for i, (name, residual) in enumerate(CNN_BLOCKS):
            y = g.op("Conv", t, f"{name}.conv.weight", f"{name}.conv.bias", pads=[1, 1, 1, 1],
                     kernel_shape=[3, 3])
            y = g.op("BatchNormalization", y, f"{name}.bn.gamma", f"{name}.bn.beta",
                     f"{name}.bn.moving_mean", f"{name}.bn.moving_variance", epsilon=BN_EPS)
            t = g.op("Relu", g.op("Add", y, t) if residual else y)
            if i != 1:
                t = g.op("MaxPool", t, kernel_shape=[2, 2], strides=[2, 2])
        return g.op("Gemm", g.op("Flatten", t, axis=1), "fc.weight", "fc.bias", transB=1)
    b, s, h, heads = d["batch"], d["seq"], d["hidden"], d["heads"]
    hd = h // heads
    x = g.op("Add", g.op("Gather", "word_embeddings.embedding_table", "ids"),
             "position_embeddings.embedding_table")
    x = g.op("Reshape", g.layer_norm(x, "embedding_norm.gamma", "embedding_norm.beta", BERT_EPS),
             g.const([b * s, h], np.int64))
    mask = g.op("Reshape", g.op("Cast", "mask", to=1), g.const([b, 1, 1, s], np.int64))
    bias = g.op("Mul", g.op("Sub", g.const(1.0), mask), g.const(-10000.0))
    split_shape = g.const([b, s, heads, hd], np.int64)
    for i in range(_layers(params)):
        a = f"layers.{i}.attention"

        def proj(name: str, perm: list[int], a: str = a, x: str = x) -> str:
            t = g.linear(x, f"{a}.{name}.weight", f"{a}.{name}.bias")
            return g.op("Transpose", g.op("Reshape", t, split_shape), perm=perm)
        q, k, v = proj("query", [0, 2, 1, 3]), proj("key", [0, 2, 3, 1]), \
            proj("value", [0, 2, 1, 3])
        scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), g.const(1.0 / math.sqrt(hd))),
                      bias)
        ctx = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
        ctx = g.op("Reshape", g.op("Transpose", ctx, perm=[0, 2, 1, 3]),
                   g.const([b * s, h], np.int64))
        x = g.layer_norm(g.op("Add", g.linear(ctx, f"{a}.output.weight", f"{a}.output.bias"),
                              x), f"{a}.norm.gamma", f"{a}.norm.beta", BERT_EPS)
        ff = f"layers.{i}.ffn"
        f = g.linear(g.gelu(g.linear(x, f"{ff}.dense_in.weight", f"{ff}.dense_in.bias")),
                     f"{ff}.dense_out.weight", f"{ff}.dense_out.bias")
        x = g.layer_norm(g.op("Add", f, x), f"{ff}.norm.gamma", f"{ff}.norm.beta", BERT_EPS)
    return g.op("Reshape", x, g.const([b, s, h], np.int64))
