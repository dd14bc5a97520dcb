"""Argmax as a generated kernel: a classifier's last op, so that a plan of kernels and BLAS
products (backends/c/c_gemm.py) keeps the compiled entry, one C call per graph, instead of a Python
step for numpy's argmax (the digits CNN: conv blocks, Dense, BiasAdd, Argmax).

The loop is scalar (an early exit at the first NaN, as numpy returns it): numpy's argmax is
vectorised, so a large input stays numpy's (`ARGMAX_MAX_ELEMENTS`)."""
from __future__ import annotations

import math

import numpy as np

from graphkernel.backends.c.c_loops import Buffer, KernelSource
from graphkernel.ir.graph import Node
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import SymSize

# Above this many input elements numpy's vectorised argmax beats one scalar pass more than a
# Python step costs (~5 us).
ARGMAX_MAX_ELEMENTS = 1 << 14

_C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
            np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t"}


def why_not_argmax_kernel(node: Node) -> str | None:
    """Why an Argmax node runs as numpy's argmax (None: it gets a generated kernel)."""
    if node.op != "Argmax" or node.subgraph is not None:
        return "not an Argmax"
    x = node.inputs[0].tensor_type
    if x.dtype not in _C_TYPES:
        return f"{x.dtype.name} input"
    if any(isinstance(d, SymSize) for d in x.shape):
        return "a dynamic size"
    if math.prod(x.shape) > ARGMAX_MAX_ELEMENTS:
        return "large: numpy's argmax is vectorised"
    return None


def emit_argmax_kernel(node: Node, name: str) -> KernelSource:
    """The C of an Argmax node `why_not_argmax_kernel` accepts; argv: its input, then its
    output."""
    x, out = node.inputs[0].tensor_type, node.tensor_type
    axis = {**get_op("Argmax").attr_defaults, **node.attrs}["axis"] % x.rank
    outer, size, inner = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:])
    t, o = _C_TYPES[x.dtype], _C_TYPES[out.dtype]
    floating = x.dtype.kind == "f"
    lines = [
        f"/* {name}: Argmax over axis {axis} of {x.dtype.name}{list(x.shape)} */",
        f"void {name}(void *const *args) {{",
        f"  const {t} *restrict x = (const {t} *)args[0];",
        f"  {o} *restrict out = ({o} *)args[1];",
        f"  for (int64_t r = 0; r < {outer * inner}; ++r) {{",
        f"    const {t} *p = x + (r / {inner}) * {size * inner} + r % {inner};",
        f"    {t} best = p[0];",
        "    int64_t at = 0;",
        # the first NaN is the answer, as in numpy (NaN compares false: a NaN start stays)
        *(["    if (best == best)"] if floating else []),
        f"    for (int64_t j = 1; j < {size}; ++j) {{",
        f"      const {t} v = p[j * {inner}];",
        "      if (v > best) { best = v; at = j; }",
        *(["      else if (v != v) { at = j; break; }"] if floating else []),
        "    }",
        f"    out[r] = ({o})at;",
        "  }",
        "}",
    ]
    buffers = [Buffer(node.inputs[0], tuple(x.shape), False, 0),
               Buffer(node, tuple(out.shape), True, 0)]
    return KernelSource(name, "\n".join(lines) + "\n", buffers)
