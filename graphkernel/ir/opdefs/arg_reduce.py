"""Ops that pick one element along an axis, MindSpore's signatures: the arg-reductions
(Argmax, ArgMaxWithValue, ArgMinWithValue) and Median (with MedianGrad's rule). They run as
numpy kernels between fused kernels."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, ShapeError
from graphkernel.ir import types as T
from graphkernel.ir.opdefs.array import INDEX_DTYPES, _axis
from graphkernel.ir.opset import NUMBERS, OpDef, PatternKind, declare
from graphkernel.ir.types import TensorType, TupleType, ValueType

# -- Arg-reductions ---------------------------------------------------------------------------

def _arg_axis(x: TensorType, axis: Any, op: str) -> int:
    if x.rank == 0:
        raise ShapeError(f"{op} needs a tensor of rank 1 or more")
    a = _axis(axis, x.rank, op)
    if x.shape[a] == 0:
        raise ShapeError(f"{op}: axis {axis} of shape {x.shape} is empty")
    return a


def _argmax_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    a = _arg_axis(x, attrs["axis"], "Argmax")
    out = T.to_dtype(attrs["output_type"])
    if out not in INDEX_DTYPES:
        raise DTypeError(f"Argmax: output_type must be int32 or int64, got {out.name}")
    return TensorType(x.shape[:a] + x.shape[a + 1:], out)


def _argmax_ref(x: np.ndarray, axis: int = -1, output_type: Any = T.int32) -> np.ndarray:
    return np.argmax(x, axis=axis).astype(T.to_dtype(output_type))


declare(OpDef(name="Argmax", kind=PatternKind.OPAQUE, inputs=("x",), infer=_argmax_infer,
              reference=_argmax_ref, init_attrs=(("axis", -1), ("output_type", T.int32)),
              accepts=NUMBERS, functional=("argmax",)))


def _arg_value_infer(op: str) -> Any:
    def infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
        (x,) = types
        a = _arg_axis(x, attrs["axis"], op)
        shape = tuple(1 if i == a else d for i, d in enumerate(x.shape)) if attrs["keep_dims"] \
            else x.shape[:a] + x.shape[a + 1:]
        return TupleType((TensorType(shape, T.int32), TensorType(shape, x.dtype)))
    return infer


def _arg_value_ref(arg: Any, pick: Any) -> Any:
    def ref(x: np.ndarray, axis: int = 0, keep_dims: bool = False) -> tuple[np.ndarray, ...]:
        index = arg(x, axis=axis, keepdims=True)
        value = np.take_along_axis(x, index, axis=axis)
        if not keep_dims:
            index, value = np.squeeze(index, axis), np.squeeze(value, axis)
        return index.astype(np.int32), np.ascontiguousarray(value)
    return ref


declare(OpDef(name="ArgMaxWithValue", kind=PatternKind.OPAQUE, inputs=("x",),
              infer=_arg_value_infer("ArgMaxWithValue"),
              reference=_arg_value_ref(np.argmax, np.max),
              init_attrs=(("axis", 0), ("keep_dims", False)), accepts=NUMBERS,
              functional=("arg_max_with_value",)))
declare(OpDef(name="ArgMinWithValue", kind=PatternKind.OPAQUE, inputs=("x",),
              infer=_arg_value_infer("ArgMinWithValue"),
              reference=_arg_value_ref(np.argmin, np.min),
              init_attrs=(("axis", 0), ("keep_dims", False)), accepts=NUMBERS,
              functional=("arg_min_with_value",)))


# -- Median -----------------------------------------------------------------------------------

def _median_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    if attrs["global_median"]:
        shape: tuple[T.Dim, ...] = (1,) * x.rank if attrs["keep_dims"] else ()
    else:
        axis = _axis(attrs["axis"], x.rank, "Median")
        shape = x.shape[:axis] + ((1,) if attrs["keep_dims"] else ()) + x.shape[axis + 1:]
    if x.size == 0:
        raise ShapeError(f"Median of an empty tensor (shape {x.shape}) has no value")
    return TupleType((TensorType(shape, x.dtype), TensorType(shape, T.int64)))


def _median_ref(x: np.ndarray, global_median: bool = False, axis: int = 0,
                keep_dims: bool = False) -> tuple[np.ndarray, np.ndarray]:
    # The lower median (of an even count, the smaller middle value), as MindSpore's: the
    # element at (n - 1) // 2 in a stable sort; its index is where it stands in the input.
    flat = x.reshape(1, -1) if global_median else np.moveaxis(x, axis, -1)
    order = np.argsort(flat, axis=-1, kind="stable")
    index = order[..., (flat.shape[-1] - 1) // 2]
    value = np.take_along_axis(flat, index[..., None], axis=-1)[..., 0]
    if global_median:
        value, index = value.reshape(()), np.zeros((), np.int64)
        shape = (1,) * x.ndim if keep_dims else ()
        return value.reshape(shape), index.reshape(shape)
    if keep_dims:
        value, index = np.expand_dims(value, axis), np.expand_dims(index, axis)
    return np.ascontiguousarray(value), index.astype(np.int64)


def _median_grad(b: Any, n: Any, dout: tuple[Any, ...], attrs: dict[str, Any]) -> list[Any]:
    """dy to the median's position along the axis (MindSpore's MedianGrad); a global median's
    dy spread evenly over the elements equal to it (its index is not kept)."""
    dy = dout[0]
    if dy is None:
        return [None]
    (x,) = n.inputs
    dtype = x.tensor_type.dtype
    if attrs["global_median"]:
        hits = b("Cast", b("Equal", x, b.item(n, 0)), dtype=dtype)
        share = b("RealDiv", dy, b("ReduceSum", hits, axis=(), keep_dims=attrs["keep_dims"]))
        return [b("Mul", hits, share)]
    rank = x.tensor_type.rank
    axis = _axis(attrs["axis"], rank, "Median")
    index, grad = b.item(n, 1), dy
    if attrs["keep_dims"]:
        index = b("Squeeze", index, axis=(axis,))
    else:
        grad = b("ExpandDims", grad, axis=axis)
    hot = b("OneHot", index, depth=x.tensor_type.shape[axis], on_value=1.0, off_value=0.0,
            axis=axis)
    return [b("Mul", b("Cast", hot, dtype=dtype), grad)]


declare(OpDef(name="Median", kind=PatternKind.OPAQUE, inputs=("x",), infer=_median_infer,
              reference=_median_ref, grad=_median_grad,
              init_attrs=(("global_median", False), ("axis", 0), ("keep_dims", False)),
              accepts=NUMBERS, functional=("median",),
              doc="(the lower median along axis, or of all elements, its index) as MindSpore's "
                  "Median; the index of a global median is 0, as MindSpore leaves it unset"))
