"""Matrix products: MatMul, Gemm and Einsum."""
from __future__ import annotations

import math
from typing import Any

from graphkernel.onnx.ops.base import (
    NodeContext,
    Value,
    const,
    converts,
    op,
    rank,
    reshape,
    shape_of,
)


# -- matrix products ---------------------------------------------------------------------------
@converts("MatMul")
def _matmul(cx: NodeContext, a: Value, b: Value) -> Value:
    a_vec, b_vec = rank(a) == 1, rank(b) == 1
    if a_vec:
        a = op("ExpandDims", a, axis=0)
    if b_vec:
        b = op("ExpandDims", b, axis=-1)
    out = op("MatMul", a, b)
    if a_vec:
        out = op("Squeeze", out, axis=(rank(out) - 2,))
    if b_vec:
        out = op("Squeeze", out, axis=(rank(out) - 1,))
    return out


@converts("Gemm")
def _gemm(cx: NodeContext, a: Value, b: Value, c: Value = None) -> Value:
    alpha, beta = cx.attr("alpha", 1.0), cx.attr("beta", 1.0)
    out = op("MatMul", a, b, transpose_a=bool(cx.attr("transA", 0)),
             transpose_b=bool(cx.attr("transB", 0)))
    if alpha != 1.0:
        out = op("Mul", out, const(alpha, out))
    if c is not None and beta != 0.0:
        out = op("Add", out, c if beta == 1.0 else op("Mul", c, const(beta, c)))
    return out




# -- Einsum --------------------------------------------------------------------------------
def _permute(x: Value, order: str, want: str) -> Value:
    perm = tuple(order.index(c) for c in want)
    return x if perm == tuple(range(len(perm))) else op("Transpose", x, perm=perm)


@converts("Einsum")
def _einsum(cx: NodeContext, *xs: Value) -> Value:
    """One or two operands, each index once per operand (no diagonals, no ellipsis): sums of
    indices only one operand has, then the contraction as one (batched) MatMul."""
    equation = str(cx.attr("equation", "")).replace(" ", "")
    if "..." in equation:
        raise cx.refuse(f"equation {equation!r}: an ellipsis is not supported")
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    if not arrow:  # implicit output: the indices used once, in alphabetical order
        out = "".join(sorted(c for c in set(lhs) if lhs.count(c) == 1 and c.isalpha()))
    if len(terms) != len(xs) or len(xs) not in (1, 2) or not all(
            all(c.isalpha() for c in t) and len(set(t)) == len(t) and len(t) == rank(x)
            for t, x in zip(terms, xs)) or len(set(out)) != len(out) or \
            not set(out) <= set(lhs):
        raise cx.refuse(f"equation {equation!r} (one or two operands, each index once per "
                        "operand, matching their ranks)")
    sizes: dict[str, Any] = {}
    for term, x in zip(terms, xs):
        for c, d in zip(term, shape_of(x)):
            if sizes.setdefault(c, d) != d:
                raise cx.refuse(f"equation {equation!r}: index {c} has sizes {sizes[c]} and {d}")
    values, kept = list(xs), []
    for i, (term, x) in enumerate(zip(terms, values)):
        others = "".join(t for j, t in enumerate(terms) if j != i)
        alone = [k for k, c in enumerate(term) if c not in out and c not in others]
        if alone:
            values[i] = op("ReduceSum", x, axis=tuple(alone), keep_dims=False)
            term = "".join(c for k, c in enumerate(term) if k not in alone)
        kept.append(term)
    if len(values) == 1:
        return _permute(values[0], kept[0], out)
    (ta, tb), (a, b) = kept, values
    batch = "".join(c for c in out if c in ta and c in tb)
    contract = "".join(c for c in ta if c in tb and c not in out)
    left = "".join(c for c in ta if c not in tb)
    right = "".join(c for c in tb if c not in ta)
    batch_dims = tuple(sizes[c] for c in batch)
    a = reshape(cx, _permute(a, ta, batch + left + contract),
                batch_dims + (math.prod(sizes[c] for c in left),
                              math.prod(sizes[c] for c in contract)))
    b = reshape(cx, _permute(b, tb, batch + contract + right),
                batch_dims + (math.prod(sizes[c] for c in contract),
                              math.prod(sizes[c] for c in right)))
    y = op("MatMul", a, b)
    y = reshape(cx, y, batch_dims + tuple(sizes[c] for c in left + right))
    return _permute(y, batch + left + right, out)
