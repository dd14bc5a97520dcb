"""Opaque library ops: MatMul and BatchMatMul run as numpy (BLAS) calls."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, ShapeError
from graphkernel.ir import types as T
from graphkernel.ir.opset import NUMBERS, OpDef, PatternKind, declare
from graphkernel.ir.types import TensorType, ValueType


def _matmul_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    a, b = types
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"MatMul needs rank >= 2 inputs, got shapes {a.shape} and {b.shape}")
    if a.dtype != b.dtype or a.dtype not in NUMBERS:
        raise DTypeError(f"MatMul inputs must share a numeric dtype, got {a.dtype.name} and "
                         f"{b.dtype.name}")
    m, k = (a.shape[-1], a.shape[-2]) if attrs["transpose_a"] else a.shape[-2:]
    k2, n = (b.shape[-1], b.shape[-2]) if attrs["transpose_b"] else b.shape[-2:]
    if k != k2:
        raise ShapeError(f"MatMul: inner dimensions differ: {a.shape} "
                         f"(transpose_a={attrs['transpose_a']}) and {b.shape} "
                         f"(transpose_b={attrs['transpose_b']})")
    batch = T.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return TensorType(batch + (m, n), a.dtype)


def merged_row_stride(shape: tuple[int, ...], strides: tuple[int, ...], default: int
                      ) -> int | None:
    """The stride of one row when axes of these sizes and strides (the leading axes of a
    matrix stack, its rows last) merge into one run of rows, each axis' stride the next one's
    span (size-1 axes aside); `default` when every axis has size 1; None when they do not
    merge. Shared by `as_rows` and the compiled entry's GEMM layouts (backends/c/c_gemm.py)."""
    lead = [(n, s) for n, s in zip(shape, strides) if n != 1]
    for (_, outer), (n, inner) in zip(lead, lead[1:]):
        if outer != n * inner:
            return None
    return lead[-1][1] if lead else default


def as_rows(x: np.ndarray) -> np.ndarray | None:
    """`x` (rank > 2) as the matrix of its rows: its leading axes merged, a view of the same
    memory; None when they do not merge in place (a row stride is not the next axis' span)."""
    row_stride = merged_row_stride(x.shape[:-1], x.strides[:-1], x.shape[-1] * x.itemsize)
    if row_stride is None:
        return None
    rows = math.prod(x.shape[:-1])
    return np.lib.stride_tricks.as_strided(x, (rows, x.shape[-1]), (row_stride, x.strides[-1]))


def matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """np.matmul(a, b, out=out), an N-d `a` times a matrix `b` as one GEMM over all of `a`'s
    rows where its rows (and `out`'s) merge in place: numpy otherwise calls BLAS once per
    leading index, on one thread (a [8,128,128] x [128,128] product: 238 us on two threads,
    104 us as one [1024,128] GEMM)."""
    if a.ndim > 2 and b.ndim == 2 and a.size and b.size:
        out = np.empty(a.shape[:-1] + b.shape[-1:], np.result_type(a, b)) if out is None else out
        rows, out_rows = as_rows(a), as_rows(out)
        if rows is not None and out_rows is not None:
            np.matmul(rows, b, out=out_rows)
            return out
    return np.matmul(a, b, out=out)


def _matmul_ref(a: np.ndarray, b: np.ndarray, transpose_a: bool = False,
                transpose_b: bool = False) -> np.ndarray:
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    with np.errstate(all="ignore"):  # NaN/Inf in, NaN/Inf out, as in the kernels: no warning
        return matmul_into(a, b)


def _matmul_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    """d(a @ b): each operand's gradient is a MatMul of dy with the other operand, transposed
    through the attributes (no Transpose node); batch axes broadcast are summed back."""
    a, w = n.inputs
    ta, tb, op = attrs["transpose_a"], attrs["transpose_b"], n.op
    if not ta:
        da = b(op, dy, w, transpose_a=False, transpose_b=not tb)
    else:
        da = b(op, w, dy, transpose_a=tb, transpose_b=True)
    if not tb:
        dw = b(op, a, dy, transpose_a=not ta, transpose_b=False)
    else:
        dw = b(op, dy, a, transpose_a=True, transpose_b=ta)
    return [b.sum_to(da, a.shape), b.sum_to(dw, w.shape)]


_MM_ATTRS = (("transpose_a", False), ("transpose_b", False))
declare(OpDef(name="MatMul", kind=PatternKind.OPAQUE, inputs=("a", "b"), infer=_matmul_infer,
              reference=_matmul_ref, init_attrs=_MM_ATTRS, grad=_matmul_grad, gemm=True))
declare(OpDef(name="BatchMatMul", kind=PatternKind.OPAQUE, inputs=("a", "b"),
              infer=_matmul_infer, reference=_matmul_ref, init_attrs=_MM_ATTRS, grad=_matmul_grad,
              gemm=True))
