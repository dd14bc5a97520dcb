"""ONNX tensors (initializers, Constant values) and element types as numpy arrays and dtypes
graphkernel runs, refused clearly when they are not."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from graphkernel.errors import FormatError, UnsupportedError
from graphkernel.ir import types as T


def tensor_array(tensor: onnx.TensorProto, label: str) -> np.ndarray:
    """An initializer or Constant tensor as an array of a dtype graphkernel supports."""
    try:
        array = numpy_helper.to_array(tensor)
    except Exception as exc:  # a declared shape that its data does not fill, a bad type
        raise FormatError(f"{label}: tensor {tensor.name!r} cannot be read: {exc}") from None
    return np.array(array, dtype=supported_dtype(array.dtype, f"tensor {tensor.name!r}", label))


def supported_dtype(dtype: np.dtype, what: str, label: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in T.SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in T.SUPPORTED_DTYPES)
        raise UnsupportedError(f"{label}: {what} has dtype {dtype.name}; graphkernel runs "
                               f"{names}")
    return dtype


def onnx_dtype(elem_type: int, what: str, label: str) -> np.dtype:
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    except Exception:  # an unknown or undefined element type
        raise FormatError(f"{label}: {what} has an unknown element type {elem_type}") from None
    return supported_dtype(dtype, what, label)
