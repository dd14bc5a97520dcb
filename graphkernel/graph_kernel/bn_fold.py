"""Inference BatchNorm folded into the convolution before it (fusion on, before expansion):

    BatchNorm(BiasAdd(Conv2D(x, w), b), gamma, beta, mean, var)
      -> Conv2DFoldedBN(x, w, gamma, var) + (beta + (b - mean) * s),  s = gamma / sqrt(var + eps)

The convolution computes with w * s (per output channel), so the kernel after it adds one
per-channel shift instead of scaling and shifting every element. The weights are parameters that
may change between calls, so the folded weights are made on each call inside the convolution's
library step (out_channel * in_channel * kh * kw multiplies, no launch of their own).

Exact enough: float32 and float64 only. The folded result differs from the unfolded one by the
rounding of w * s, one unit in the last place per weight, inside a sum the convolution rounds
anyway; float16 weights would round w * s to 11 bits (and could overflow), so a float16
convolution keeps its BatchNorm in the kernel after it. Each decision is a line of the compile
report (`CompileReport.rewrites`)."""
from __future__ import annotations

import numpy as np

from graphkernel.ir.graph import Constant, Graph, Node, Value
from graphkernel.ir.opset import get_op

FOLD_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _single_user(value: Value, users: dict[int, list[Node]], results: set[int]) -> bool:
    return value.uid not in results and len(users.get(value.uid, [])) == 1


def _attrs(node: Node) -> dict:
    return {**get_op(node.op).attr_defaults, **node.attrs}


def fold_batch_norms(graph: Graph) -> list[str]:
    """Fold every inference BatchNorm that follows a convolution alone; returns one line per
    BatchNorm after a convolution saying what was done (or why not)."""
    lines: list[str] = []
    names = {n.name for n in graph.nodes}
    for bn in [n for n in graph.nodes if n.op == "BatchNorm" and n.subgraph is None]:
        users = graph.users()
        results = {v.uid for v in graph.results()}
        attrs = _attrs(bn)
        x, gamma, beta, mean, variance = bn.inputs
        items = users.get(bn.uid, [])
        if attrs["is_training"] or bn.uid in results or \
                any(u.op != "GetItem" or u.attrs["index"] != 0 for u in items):
            continue
        bias_add = x if isinstance(x, Node) and x.op == "BiasAdd" and \
            _single_user(x, users, results) else None  # on NCHW: the channel axis
        conv = bias_add.inputs[0] if bias_add is not None else x
        if not isinstance(conv, Node) or conv.op != "Conv2D" or \
                not _single_user(conv, users, results):
            continue
        params = [gamma, beta, mean, variance] + ([bias_add.inputs[1]] if bias_add else [])
        if conv.dtype not in FOLD_DTYPES or any(p.dtype != conv.dtype for p in params):
            lines.append(f"{bn.name} kept in the kernel after {conv.name}: folding it into "
                         f"{conv.dtype.name} weights is not exact enough (float32 and "
                         f"float64 fold)")
            continue
        new = _fold(conv, bias_add, bn, names)
        out = new[-1]
        at = graph.nodes.index(bn)
        drop = {conv.uid, bn.uid} | {u.uid for u in items} | \
            ({bias_add.uid} if bias_add is not None else set())
        graph.nodes[at:at] = new
        graph.nodes = [n for n in graph.nodes if n.uid not in drop]
        for item in items:
            graph.replace_uses(item, out)
        lines.append(f"{bn.name} folded into {conv.name}'s weights (inference BatchNorm: the "
                     f"convolution computes with weight * gamma / sqrt(variance + "
                     f"{attrs['epsilon']:g}), the kernel after it adds the per-channel shift "
                     f"beta {'+ (bias - mean)' if bias_add is not None else '- mean'} * that "
                     f"scale)")
    return lines


def _fold(conv: Node, bias_add: Node | None, bn: Node, names: set[str]) -> list[Node]:
    """The nodes replacing conv (+ bias add) + BatchNorm, the last one computing its output."""
    x, weight = conv.inputs
    _, gamma, beta, mean, variance = bn.inputs
    epsilon = _attrs(bn)["epsilon"]
    nodes: list[Node] = []

    def make(op: str, inputs: list[Value], name: str, **attrs: object) -> Node:
        opdef = get_op(op)
        type_ = opdef.infer(tuple(v.tensor_type for v in inputs),
                            {**opdef.attr_defaults, **attrs})
        unique = name
        while unique in names:
            unique += "_"
        names.add(unique)
        node = Node(op, inputs, attrs, type_, unique, bn.loc)
        nodes.append(node)
        return node

    eps = Constant(np.asarray(epsilon, conv.dtype), "epsilon")
    folded = make("Conv2DFoldedBN", [x, weight, gamma, variance], f"{conv.name}_folded",
                  **{**conv.attrs, "epsilon": epsilon})
    folded.loc = conv.loc
    folded.notes["folded"] = f"{bn.name}'s scale folded into the weights"
    scale = make("Mul", [gamma, make("Rsqrt", [make("Add", [variance, eps], f"{bn.name}_var")],
                                     f"{bn.name}_rsqrt")], f"{bn.name}_scale")
    if bias_add is not None:
        centred = make("Sub", [bias_add.inputs[1], mean], f"{bn.name}_centred")
        shift = make("Add", [beta, make("Mul", [centred, scale], f"{bn.name}_moved")],
                     f"{bn.name}_shift")
    else:
        shift = make("Sub", [beta, make("Mul", [mean, scale], f"{bn.name}_moved")],
                     f"{bn.name}_shift")
    channels = conv.shape[1]
    per_channel = make("Reshape", [shift], f"{bn.name}_per_channel", shape=(channels, 1, 1))
    make("Add", [folded, per_channel], bn.name)
    return nodes
