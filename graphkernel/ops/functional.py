"""MindSpore 2.x functional ops whose signatures differ from their primitive's (`ops.gelu`
defaults to approximate='none', `ops.softmax(x, axis)`, `ops.split` by sizes, `ops.sum(x, dim,
keepdim)`, ...), and the `depend` helper. `graphkernel.ops` exports these over the forms it
generates from the op table; each calls the primitives, so it traces and fuses like them."""
from __future__ import annotations

import builtins
import functools
from typing import Any

import numpy as np

from graphkernel.errors import GraphModeError, InputError, ShapeError, UnsupportedError
from graphkernel.frontend.location import user_location
from graphkernel.frontend.primitive import make_functional
from graphkernel.frontend.symbolic import current_graph
from graphkernel.frontend.tensor import Parameter, Tensor, mixed_precision_dtype, value_in
from graphkernel.ir.opset import user_ops
from graphkernel.ops import operations as P


def gelu(input: Any, approximate: str = "none") -> Any:  # noqa: A002 (MindSpore's names)
    return P.GeLU(approximate=approximate)(input)


def softmax(input: Any, axis: int = -1, *, dtype: Any = None) -> Any:  # noqa: A002
    if dtype is not None:
        input = P.Cast()(input, dtype)
    return P.Softmax(axis=axis)(input)


def log_softmax(logits: Any, axis: int = -1) -> Any:
    return P.LogSoftmax(axis=axis)(logits)


def concat(tensors: Any, axis: int = 0) -> Any:
    return P.Concat(axis)(tuple(tensors))


cat = concat


def stack(tensors: Any, axis: int = 0) -> Any:
    return P.Stack(axis)(tuple(tensors))


def unstack(input_x: Any, axis: int = 0) -> Any:
    return P.Unstack(axis)(input_x)


unbind = unstack


def split(tensor: Any, split_size_or_sections: Any, axis: int = 0) -> tuple[Any, ...]:
    """Chunks of `split_size_or_sections` elements along `axis` (the last may be smaller), or
    pieces of the listed sizes."""
    rank = len(tensor.shape)
    if not -rank <= axis < rank:
        raise ShapeError(f"split: axis {axis} is out of range for shape {tensor.shape}")
    axis %= rank
    size = tensor.shape[axis]
    if isinstance(split_size_or_sections, (int, np.integer)):
        step = int(split_size_or_sections)
        if step < 1:
            raise ShapeError(f"split: split_size {step} must be positive")
        if size % step == 0 and size:
            return P.Split(axis, size // step)(tensor)
        sizes = [step] * (size // step) + ([size % step] if size % step else [])
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if builtins.sum(sizes) != size or min(sizes, default=0) < 0:
            raise ShapeError(f"split: sections {sizes} do not add up to {size}, the size of "
                             f"axis {axis} of {tensor.shape}")
    pieces, start = [], 0
    for s in sizes:
        begin = [0] * rank
        begin[axis] = start
        extent = list(tensor.shape)
        extent[axis] = s
        pieces.append(P.Slice()(tensor, tuple(begin), tuple(extent)))
        start += s
    return tuple(pieces)


def one_hot(indices: Any, depth: int, on_value: Any = 1, off_value: Any = 0,
            axis: int = -1) -> Any:
    return P.OneHot(axis)(indices, depth, on_value, off_value)


def argmax(input: Any, dim: int | None = None, keepdim: bool = False) -> Any:  # noqa: A002
    if dim is None:
        input = P.Reshape()(input, (-1,))
        dim = 0
    out = P.Argmax(axis=dim, output_type=np.int64)(input)
    return P.ExpandDims()(out, dim) if keepdim else out


def argmin(input: Any, dim: int | None = None, keepdim: bool = False) -> Any:  # noqa: A002
    if dim is None:
        input = P.Reshape()(input, (-1,))
        dim = 0
    index, _ = P.ArgMinWithValue(axis=dim, keep_dims=keepdim)(input)
    return P.Cast()(index, np.int64)


def _axes(axis: Any) -> Any:
    return () if axis is None else axis


def sum(input: Any, dim: Any = None, keepdim: bool = False, *,  # noqa: A001, A002
        dtype: Any = None) -> Any:
    if dtype is not None:
        input = P.Cast()(input, dtype)
    return P.ReduceSum(keep_dims=keepdim)(input, _axes(dim))


def mean(input: Any, axis: Any = None, keep_dims: bool = False) -> Any:  # noqa: A002
    return P.ReduceMean(keep_dims=keep_dims)(input, _axes(axis))


def prod(input: Any, axis: Any = None, keep_dims: bool = False) -> Any:  # noqa: A002
    return P.ReduceProd(keep_dims=keep_dims)(input, _axes(axis))


def amax(input: Any, axis: Any = None, keepdims: bool = False) -> Any:  # noqa: A002
    return P.ReduceMax(keep_dims=keepdims)(input, _axes(axis))


def amin(input: Any, axis: Any = None, keepdims: bool = False) -> Any:  # noqa: A002
    return P.ReduceMin(keep_dims=keepdims)(input, _axes(axis))


def all(input: Any, axis: Any = None, keep_dims: bool = False) -> Any:  # noqa: A001, A002
    return P.ReduceAll(keep_dims=keep_dims)(input, _axes(axis))


def any(input: Any, axis: Any = None, keep_dims: bool = False) -> Any:  # noqa: A001, A002
    return P.ReduceAny(keep_dims=keep_dims)(input, _axes(axis))


def squeeze(input: Any, axis: Any = None) -> Any:  # noqa: A002
    return P.Squeeze(() if axis is None else axis)(input)


def broadcast_to(input: Any, shape: Any) -> Any:  # noqa: A002
    return P.BroadcastTo(tuple(shape))(input)


def layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,  # noqa: A002
               eps: float = 1e-5) -> Any:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    dtype = input.dtype
    weight = Tensor(np.ones(shape, dtype)) if weight is None else weight
    bias = Tensor(np.zeros(shape, dtype)) if bias is None else bias
    begin = len(input.shape) - len(shape)
    y, _, _ = P.LayerNorm(begin_norm_axis=begin, begin_params_axis=begin,
                          epsilon=eps)(input, weight, bias)
    return y


def conv2d(input: Any, weight: Any, bias: Any = None, stride: Any = 1,  # noqa: A002
           pad_mode: str = "valid", padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Any:
    out_channel, _, kh, kw = weight.shape
    out = P.Conv2D(out_channel, (kh, kw), pad_mode=pad_mode, pad=padding, stride=stride,
                   dilation=dilation, group=groups)(input, weight)
    return out if bias is None else P.BiasAdd()(out, bias)


def batch_norm(input_x: Any, running_mean: Any, running_var: Any, weight: Any, bias: Any,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Any:
    y, *_ = P.BatchNorm(is_training=training, epsilon=eps, momentum=momentum)(
        input_x, weight, bias, running_mean, running_var)
    return y


def dropout(input: Any, p: float = 0.5, training: bool = True, seed: int | None = None) -> Any:  # noqa: A002
    if not training or p == 0:
        return input
    out, _ = P.Dropout(keep_prob=1 - p, Seed0=seed or 0, Seed1=0)(input)
    return out


def assign(variable: Any, value: Any) -> Any:
    """MindSpore's `F.assign`: after the call, the Parameter `variable` holds `value`. In graph
    mode the graph records it (`Graph.assigns`: the runtime writes the weight after each call);
    op by op it is written now."""
    if not isinstance(variable, Parameter):
        raise InputError(f"assign writes a Parameter, got a {type(variable).__name__}",
                         user_location())
    if not isinstance(value, Tensor):
        value = Tensor(np.asarray(value, variable.dtype))
    if mixed_precision_dtype() is not None and value.dtype != variable.dtype and \
            value.dtype.kind == variable.dtype.kind == "f":
        # A cell computing in float16 (to_float, amp) writes its float32 weights: MindSpore
        # converts the value to the Parameter's dtype, and so does this.
        value = P.Cast()(value, variable.dtype)
    if tuple(value.shape) != variable.shape or value.dtype != variable.dtype:
        raise InputError(f"assign: {variable.name} is {variable.dtype.name}"
                         f"{list(variable.shape)}, the value {value.dtype.name}"
                         f"{list(value.shape)}", user_location())
    graph = current_graph()
    if graph is None:
        variable.set_data(value.asnumpy())
        return value
    if graph.parent is not None:
        raise GraphModeError("assign inside a GraphKernel: assign in the cell that calls it",
                             user_location())
    weight = graph.weight(variable)
    if builtins.any(w is weight for w, _ in graph.graph.assigns):
        raise GraphModeError(f"{variable.name} is assigned twice in one graph", user_location())
    graph.graph.assigns.append((weight, value_in(graph, value)))  # type: ignore[arg-type]  # a graph's weight is an Input
    return value


def depend(value: Any, expr: Any) -> Any:
    """MindSpore's ordering hint: `value`, once `expr` has been computed. Every graph here runs
    its ops in the order construct called them, so the order already holds."""
    return value


def print_(*input_x: Any) -> None:
    """MindSpore's ops.print_: P.Print()(*input_x), strings and Tensors written to stdout on
    every call (in graph mode when the graph runs)."""
    P.Print()(*input_x)


def scalar_cast(input_x: Any, input_y: Any) -> Any:
    """MindSpore's ops.scalar_cast: a Python number as a Python scalar of dtype input_y's
    kind (P.ScalarCast)."""
    return P.ScalarCast()(input_x, input_y)


MINDSPORE_SIGNATURES = [
    "gelu", "softmax", "log_softmax", "concat", "cat", "stack", "unstack", "unbind", "split",
    "one_hot", "argmax", "argmin", "sum", "mean", "prod", "amax", "amin", "all", "any", "squeeze",
    "broadcast_to", "layer_norm", "conv2d", "batch_norm", "dropout", "depend", "assign",
    "scalar_cast", "print_",
]

__all__ = MINDSPORE_SIGNATURES

# `from graphkernel.ops import functional as F`, MindSpore's F: besides the forms above, every
# functional form graphkernel.ops generates (F.relu, F.cast, F.reduce_sum, ...), F.partial, and
# MindSpore's older names for a few of them.
partial = functools.partial
_OLDER_NAMES = {"tensor_add": "add", "tensor_sub": "sub", "tensor_mul": "mul",
                "tensor_div": "div", "tensor_pow": "pow", "scalar_cast": "cast"}


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    target = _OLDER_NAMES.get(name, name)
    for op in user_ops():
        if target in op.functional_names:
            fn = make_functional(op)
            globals()[name] = fn
            return fn
    raise UnsupportedError(f"graphkernel.ops.functional has no {name!r} (MindSpore's "
                           f"F.{name}) yet; graphkernel.ops.__all__ lists the forms it has",
                           user_location())
