"""The machinery of the ONNX converters: the node context, the tables, folding, and helpers shared
by the operator modules. ONNX operators as compositions of graphkernel's primitives (ir/opdefs/).

Each converter takes the node's context and its inputs and returns its outputs. An input is
either a numpy array (known at load time: an initializer, a Constant, or the folded result of
nodes on known values, a shape subgraph) or a traced Tensor. A node whose inputs are all known
is folded there and then: its converter runs on the arrays through the primitives' numpy
references (or, for shape arithmetic that holds dynamic sizes, through `FOLDERS`). An attribute
value a converter does not support is an `UnsupportedError` naming it, raised at load.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from graphkernel.errors import UnsupportedError
from graphkernel.frontend.tensor import Tensor, apply_op
from graphkernel.ir import types as T

Value = Any  # np.ndarray (known) or Tensor (traced)
Converter = Callable[..., Any]

CONVERTERS: dict[str, Converter] = {}
# Folding of shape arithmetic on known arrays that may hold dynamic sizes (object arrays).
FOLDERS: dict[str, Callable[..., Any]] = {}


class ValueNeededError(UnsupportedError):
    """A node needs, when the model is loaded, a value the model computes from its inputs
    (axes, a shape, pads given as a graph input): binding those inputs to values
    (`load_model(..., bind=...)`) lets it load."""


class NodeContext:
    """One node being converted: its attributes, the opset, and how to refuse."""

    def __init__(self, node: onnx.NodeProto, opset: int, where: str, label: str,
                 size_sources: dict[str, tuple[Tensor, int]] | None = None) -> None:
        self.node = node
        # Where each dynamic size comes from: a model input and its axis (by symbol name).
        self.size_sources = size_sources or {}
        self.opset = opset
        self.where = where
        self.label = label
        self.attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        self.outputs = [o for o in node.output]

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return value

    def refuse(self, what: str) -> UnsupportedError:
        return UnsupportedError(f"{self.where}: {what}")

    def wants(self, index: int) -> bool:
        """Whether the node's output `index` is used (named)."""
        return index < len(self.outputs) and self.outputs[index] != ""

    def known(self, value: Value, what: str) -> np.ndarray:
        """An input that must be known at load time (a shape, axes, pads)."""
        if isinstance(value, np.ndarray):
            return value
        raise ValueNeededError(f"{self.where}: {what} must be known when the model is loaded "
                               "(an initializer, a Constant or a shape computation), not "
                               "computed from the inputs")

    def ints(self, value: Value, what: str) -> list[int]:
        array = self.known(value, what)
        if array.dtype == object or not np.issubdtype(array.dtype, np.integer):
            raise self.refuse(f"{what} must be integers known when loading, got {array!r:.80}")
        return [int(v) for v in array.reshape(-1)]


def converts(*names: str) -> Callable[[Converter], Converter]:
    def register(f: Converter) -> Converter:
        for name in names:
            CONVERTERS[name] = f
        return f
    return register


def run(convert: Converter, cx: NodeContext, inputs: list[Value]) -> list[Value]:
    """The node's outputs, folded to arrays where every input is known."""
    present = [v for v in inputs if v is not None]
    folding = bool(present) and all(isinstance(v, np.ndarray) for v in present)
    folder = FOLDERS.get(cx.node.op_type)
    if folding and folder is not None and any(v.dtype == object for v in present):
        results = folder(cx, *inputs)
    elif not present and cx.node.op_type in FOLDERS:
        results = FOLDERS[cx.node.op_type](cx, *inputs)
    else:
        if folding and any(v.dtype == object for v in present):
            raise cx.refuse("it computes on a dynamic size (a dim_param) as data, which is "
                            "known only when the model runs")
        results = convert(cx, *inputs)
    outs = list(results) if isinstance(results, (tuple, list)) else [results]
    return [_settle(r) for r in outs]


def _settle(value: Any) -> Value:
    if isinstance(value, Tensor):
        return value if value.is_symbolic else value.asnumpy()
    if not isinstance(value, np.ndarray):  # one item of a folded shape (np.take gives it bare)
        return np.array(value, dtype=object if isinstance(value, T.SymSize) else None)
    return value


def concrete(value: np.ndarray, what: str) -> np.ndarray:
    """A known array as data: a shape that holds a dynamic size cannot be."""
    if value.dtype == object:
        if all(isinstance(v, (int, np.integer)) for v in value.reshape(-1)):
            return value.astype(np.int64)
        raise UnsupportedError(f"{what} holds a dynamic size (a dim_param), known only when the "
                               "model runs, where data is needed")
    return value


def op(name: str, *args: Any, **attrs: Any) -> Any:
    """A primitive applied to tensors or arrays (traced, or run on arrays when all are known)."""
    return apply_op(name, [concrete(a, name) if isinstance(a, np.ndarray) else a for a in args],
                    attrs)


def ops_list(name: str, values: Sequence[Any], **attrs: Any) -> Any:
    return apply_op(name, [concrete(a, name) if isinstance(a, np.ndarray) else a
                           for a in values], attrs)


def shape_of(value: Value) -> tuple[Any, ...]:
    return tuple(value.shape)


def dtype_of(value: Value) -> np.dtype:
    return np.dtype(value.dtype)


def const(value: Any, like: Value) -> np.ndarray:
    return np.asarray(value, dtype=dtype_of(like))


def rank(value: Value) -> int:
    return len(shape_of(value))


def norm_axis(cx: NodeContext, axis: int, n: int, what: str = "axis") -> int:
    if not -n <= axis < max(n, 1):
        raise cx.refuse(f"{what} {axis} is out of range for rank {n}")
    return axis % n if n else 0


def reshape(cx: NodeContext, x: Value, shape: Sequence[Any]) -> Value:
    """Reshape to `shape`, which may hold dynamic sizes: the one that is not a number is -1."""
    dims = [int(d) if isinstance(d, (int, np.integer)) else d for d in shape]
    if -1 in dims:  # worked out here, so that a dynamic size elsewhere can take the -1
        rest = math.prod(d for d in dims if not (isinstance(d, int) and d == -1))
        dims[dims.index(-1)] = _quotient(cx, math.prod(shape_of(x)), rest, shape)
    unknown = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    if unknown:
        if len(unknown) > 1 or -1 in dims:
            raise cx.refuse(f"reshaping to {tuple(dims)}: more than one size is known only when "
                            "the model runs")
        dims[unknown[0]] = -1
    if tuple(dims) == shape_of(x):
        return x
    return op("Reshape", x, shape=tuple(dims))


def _quotient(cx: NodeContext, total: Any, part: Any, shape: Sequence[Any]) -> Any:
    """total / part for sizes that may be dynamic (`SymSize`: a number times named sizes)."""
    t_coef, t_names = (total, []) if isinstance(total, int) else (total.coef, list(total.names))
    p_coef, p_names = (part, []) if isinstance(part, int) else (part.coef, list(part.names))
    for name in p_names:
        if name not in t_names:
            raise cx.refuse(f"cannot reshape a tensor of {total} elements to {tuple(shape)}")
        t_names.remove(name)
    if p_coef == 0 or t_coef % p_coef:
        raise cx.refuse(f"cannot reshape a tensor of {total} elements to {tuple(shape)}")
    return t_coef // p_coef if not t_names else T.SymSize(t_coef // p_coef, tuple(t_names))


def static_shape(cx: NodeContext, x: Value, what: str = "its input") -> tuple[int, ...]:
    shape = shape_of(x)
    if not all(isinstance(d, int) for d in shape):
        raise cx.refuse(f"{what} has a dynamic size {shape}; this operator needs static sizes")
    return shape



# -- helpers shared by several operator modules ----------------------------------------------
def listed_axes(cx: NodeContext, axes: Value, n: int) -> list[int] | None:
    listed = cx.attr("axes") if axes is None else cx.ints(axes, "axes")
    return None if listed is None else checked_axes(cx, listed, n)


def checked_axes(cx: NodeContext, listed: list[int], n: int) -> list[int]:
    """`listed` axes of a rank-n input, normalised; a repeated axis refused."""
    out = [norm_axis(cx, a, n, "axes entry") for a in listed]
    if len(set(out)) != len(out):
        raise cx.refuse(f"axes {listed} repeat an axis")
    return out



def reversed_along(x: Value, axis: int) -> Value:
    n = rank(x)
    mask = sum(1 << i for i in range(n))
    strides = [1] * n
    strides[axis] = -1
    return op("StridedSlice", x, begin=(0,) * n, end=(0,) * n, strides=tuple(strides),
              begin_mask=mask, end_mask=mask)


def pad_constant(x: Value, pads: Sequence[int], value: float) -> Value:
    """`x` with `pads` (ONNX order: all begins, then all ends) of `value` around it."""
    n = rank(x)
    for axis in range(n):
        before, after = pads[axis], pads[axis + n]
        if before == 0 and after == 0:
            continue
        parts = [filled_block(x, axis, count, value) if count else None
                 for count in (before, after)]
        x = ops_list("Concat", [p for p in (parts[0], x, parts[1]) if p is not None], axis=axis)
    return x


def filled_block(x: Value, axis: int, count: int, value: float) -> Value:
    """A block of `value` shaped like `x` but `count` long on `axis`."""
    shape = list(shape_of(x))
    shape[axis] = count
    if all(isinstance(d, int) for d in shape):
        return op("BroadcastTo", const(value, x), shape=tuple(shape))
    # A dynamic size (an ONNX dim_param) has no number to broadcast to: `x` reduced to one
    # along the axis, zeroed, filled and repeated, has the shape.
    n = rank(x)
    one = op("ReduceSum", x, axis=(axis,), keep_dims=True)
    filled = op("Add", op("ZerosLike", one), const(value, x))
    multiples = [1] * n
    multiples[axis] = count
    return op("Tile", filled, multiples=tuple(multiples)) if count > 1 else filled


def take_along(cx: NodeContext, x: Value, indices: Value, axis: int) -> Value:
    """ONNX GatherElements: out[..., i, ...] = x[..., indices[..., i, ...], ...] along `axis`,
    as one Gather from the flattened input at flat positions worked out from the static shapes
    (the position of every output element but for the axis term is a constant)."""
    shape = static_shape(cx, x, "its data")
    index_shape = static_shape(cx, indices, "its indices")
    if len(index_shape) != len(shape) or any(
            i > d for k, (i, d) in enumerate(zip(index_shape, shape)) if k != axis):
        raise cx.refuse(f"indices of shape {index_shape} for data of shape {shape}")
    length = shape[axis]
    strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    grid = np.indices(index_shape, dtype=np.int64)
    base = sum((grid[k] * strides[k] for k in range(len(shape)) if k != axis),
               np.zeros(index_shape, np.int64))
    if isinstance(indices, np.ndarray):
        indices = concrete(indices, "the indices").astype(np.int64)
        if indices.size and (indices.min() < -length or indices.max() >= length):
            raise cx.refuse(f"an index out of range for axis {axis} of size {length}")
        flat = base + np.where(indices < 0, indices + length, indices) * strides[axis]
    else:
        if dtype_of(indices) != np.int64:
            indices = op("Cast", indices, dtype=T.int64)
        indices = op("Select", op("Less", indices, const(0, indices)),
                     op("Add", indices, const(length, indices)), indices)
        flat = op("Add", op("Mul", indices, const(strides[axis], indices)), base)
    return op("Gather", reshape(cx, x, (math.prod(shape),)), flat, axis=0)


def _one_line(source: Value, axis: int) -> Value:
    """The elements of `source` along `axis` at the first position of its other axes: a Slice
    (a view a kernel reads in place) where those axes are static and not empty, else their sum
    (a reduction, a library step where its dtype is an integer one)."""
    shape = shape_of(source)
    others = [a for a in range(len(shape)) if a != axis]
    if not others:
        return source
    if all(isinstance(shape[a], (int, np.integer)) and shape[a] > 0 for a in others):
        return op("Slice", source, begin=(0,) * len(shape),
                  size=tuple(-1 if a == axis else 1 for a in range(len(shape))))
    return op("ReduceSum", source, axis=tuple(others), keep_dims=True)


def zeros_of_shape(cx: NodeContext, shape: Sequence[Any], dtype: np.dtype) -> Value:
    """Zeros of `shape`, which may hold dynamic sizes: a dynamic size has no number to build
    a constant from, so each is taken from the model input it comes from (one line of it along
    that axis, zeroed) and broadcast against the static part."""
    dtype = np.dtype(dtype)
    work = np.int32 if dtype == np.bool_ else dtype
    n = len(shape)
    zeros: Value = np.zeros([d if isinstance(d, int) else 1 for d in shape], dtype=work)
    for axis, size in enumerate(shape):
        if isinstance(size, (int, np.integer)):
            continue
        if not (isinstance(size, T.SymSize) and size.coef == 1 and len(size.names) == 1
                and size.names[0] in cx.size_sources):
            raise cx.refuse(f"a tensor of the dynamic shape {tuple(shape)}: its size {size} is "
                            "not one of the model's input dimensions")
        source, source_axis = cx.size_sources[size.names[0]]
        line = _one_line(source, source_axis)
        line = op("ZerosLike", line)
        if dtype_of(line) != work:
            line = op("Cast", line, dtype=T.to_dtype(work))
        line = reshape(cx, line, tuple(size if k == axis else 1 for k in range(n)))
        zeros = op("Add", zeros, line)
    return op("Cast", zeros, dtype=T.bool_) if dtype == np.bool_ else zeros
