"""ONNX operators as compositions of graphkernel's primitives (ir/opdefs/).

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
from graphkernel.onnx.arrays import tensor_array

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

    def __init__(self, node: onnx.NodeProto, opset: int, where: str, label: str) -> None:
        self.node = node
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


# -- elementwise -----------------------------------------------------------------------------
def _unary(prim: str) -> Converter:
    return lambda cx, x: op(prim, x)


for _onnx, _prim in [("Relu", "ReLU"), ("Sigmoid", "Sigmoid"), ("Tanh", "Tanh"), ("Exp", "Exp"),
                     ("Log", "Log"), ("Sqrt", "Sqrt"), ("Reciprocal", "Reciprocal"),
                     ("Neg", "Neg"), ("Abs", "Abs"), ("Floor", "Floor"), ("Erf", "Erf"),
                     ("Sin", "Sin"), ("Cos", "Cos"), ("Softsign", "Softsign"),
                     ("Softplus", "Softplus"), ("Not", "LogicalNot"), ("Sign", "Sign"),
                     ("IsNaN", "IsNan"), ("Round", "Round"), ("HardSwish", "HSwish")]:
    CONVERTERS[_onnx] = _unary(_prim)


@converts("Identity")
def _identity(cx: NodeContext, x: Value) -> Value:
    return x


@converts("Ceil")
def _ceil(cx: NodeContext, x: Value) -> Value:
    return op("Neg", op("Floor", op("Neg", x)))


def _binary(prim: str) -> Converter:
    return lambda cx, a, b: op(prim, a, b)


for _onnx, _prim in [("Add", "Add"), ("Sub", "Sub"), ("Mul", "Mul"), ("Equal", "Equal"),
                     ("Less", "Less"), ("Greater", "Greater"), ("LessOrEqual", "LessEqual"),
                     ("GreaterOrEqual", "GreaterEqual"), ("And", "LogicalAnd"),
                     ("Or", "LogicalOr"), ("Xor", "NotEqual")]:
    CONVERTERS[_onnx] = _binary(_prim)


@converts("Div")
def _div(cx: NodeContext, a: Value, b: Value) -> Value:
    if T.is_float(dtype_of(a)):
        return op("RealDiv", a, b)
    # Integer division truncates toward zero in ONNX; FloorDiv rounds down: one up where the
    # quotient is negative and not exact.
    q = op("FloorDiv", a, b)
    inexact = op("NotEqual", op("Mul", q, b), a)
    negative = op("NotEqual", op("Less", a, const(0, a)), op("Less", b, const(0, b)))
    return op("Select", op("LogicalAnd", inexact, negative), op("Add", q, const(1, q)), q)


@converts("Pow")
def _pow(cx: NodeContext, a: Value, b: Value) -> Value:
    if not T.is_float(dtype_of(a)):  # exact in float64 while the result fits its 53 bits
        wide = op("Pow", op("Cast", a, dtype=T.float64), op("Cast", b, dtype=T.float64))
        return op("Cast", wide, dtype=dtype_of(a))
    if dtype_of(b) != dtype_of(a):
        b = op("Cast", b, dtype=dtype_of(a))
    return op("Pow", a, b)


@converts("Mod")
def _mod(cx: NodeContext, a: Value, b: Value) -> Value:
    fmod = cx.attr("fmod", 0)
    if not fmod and T.is_float(dtype_of(a)):
        raise cx.refuse("fmod=0 on floats is not valid ONNX")
    return op("Mod" if fmod else "FloorMod", a, b)


def _fold_variadic(prim: str) -> Converter:
    def convert(cx: NodeContext, *xs: Value) -> Value:
        out = xs[0]
        for x in xs[1:]:
            out = op(prim, out, x)
        return out
    return convert


CONVERTERS["Max"] = _fold_variadic("Maximum")
CONVERTERS["Min"] = _fold_variadic("Minimum")
CONVERTERS["Sum"] = _fold_variadic("Add")


@converts("Mean")
def _mean(cx: NodeContext, *xs: Value) -> Value:
    total = _fold_variadic("Add")(cx, *xs)
    return op("RealDiv", total, const(len(xs), total))


@converts("Where")
def _where(cx: NodeContext, cond: Value, x: Value, y: Value) -> Value:
    return op("Select", cond, x, y)


@converts("Cast")
def _cast(cx: NodeContext, x: Value) -> Value:
    to = cx.attr("to")
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(to)
    except Exception:  # an unknown type number
        raise cx.refuse(f"cast to element type {to!r}") from None
    if np.dtype(dtype) not in T.SUPPORTED_DTYPES:
        raise cx.refuse(f"cast to {np.dtype(dtype).name} (graphkernel runs "
                        f"{', '.join(d.name for d in T.SUPPORTED_DTYPES)})")
    return x if dtype_of(x) == dtype else op("Cast", x, dtype=np.dtype(dtype))


@converts("CastLike")
def _cast_like(cx: NodeContext, x: Value, target: Value) -> Value:
    return x if dtype_of(x) == dtype_of(target) else op("Cast", x, dtype=dtype_of(target))


def _fold_cast(cx: NodeContext, x: np.ndarray) -> np.ndarray:
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(cx.attr("to")))
    if not np.issubdtype(dtype, np.integer):
        raise cx.refuse("a dynamic size (dim_param) cast to a non-integer type")
    return x


FOLDERS["Cast"] = _fold_cast


# -- activations -----------------------------------------------------------------------------
@converts("LeakyRelu")
def _leaky_relu(cx: NodeContext, x: Value) -> Value:
    alpha = cx.attr("alpha", 0.01)
    return op("Select", op("Less", x, const(0, x)), op("Mul", x, const(alpha, x)), x)


@converts("PRelu")
def _prelu(cx: NodeContext, x: Value, slope: Value) -> Value:
    return op("Select", op("Less", x, const(0, x)), op("Mul", x, slope), x)


@converts("Elu")
def _elu(cx: NodeContext, x: Value) -> Value:
    alpha = cx.attr("alpha", 1.0)
    return op("Select", op("Less", x, const(0, x)), op("Mul", op("Expm1", x), const(alpha, x)),
              x)


@converts("Selu")
def _selu(cx: NodeContext, x: Value) -> Value:
    alpha = cx.attr("alpha", 1.67326319217681884765625)
    gamma = cx.attr("gamma", 1.05070102214813232421875)
    neg = op("Mul", op("Expm1", x), const(alpha, x))
    return op("Mul", op("Select", op("LessEqual", x, const(0, x)), neg, x), const(gamma, x))


@converts("Celu")
def _celu(cx: NodeContext, x: Value) -> Value:
    alpha = cx.attr("alpha", 1.0)
    neg = op("Mul", op("Expm1", op("RealDiv", x, const(alpha, x))), const(alpha, x))
    return op("Add", op("Maximum", x, const(0, x)), op("Minimum", neg, const(0, x)))


@converts("ThresholdedRelu")
def _thresholded_relu(cx: NodeContext, x: Value) -> Value:
    alpha = cx.attr("alpha", 1.0)
    return op("Select", op("Greater", x, const(alpha, x)), x, const(0, x))


@converts("HardSigmoid")
def _hard_sigmoid(cx: NodeContext, x: Value) -> Value:
    alpha, beta = cx.attr("alpha", 0.2), cx.attr("beta", 0.5)
    y = op("Add", op("Mul", x, const(alpha, x)), const(beta, x))
    return op("Maximum", op("Minimum", y, const(1, x)), const(0, x))


@converts("Gelu")
def _gelu(cx: NodeContext, x: Value) -> Value:
    approximate = cx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise cx.refuse(f"approximate={approximate!r}")
    return op("GeLU", x, approximate=approximate)


@converts("Clip")
def _clip(cx: NodeContext, x: Value, low: Value = None, high: Value = None) -> Value:
    if low is not None:
        x = op("Maximum", x, low)
    if high is not None:
        x = op("Minimum", x, high)
    return x


def _softmax(prim: str) -> Converter:
    def convert(cx: NodeContext, x: Value) -> Value:
        axis = norm_axis(cx, cx.attr("axis", -1), rank(x))
        return op(prim, x, axis=axis)
    return convert


CONVERTERS["Softmax"] = _softmax("Softmax")
CONVERTERS["LogSoftmax"] = _softmax("LogSoftmax")


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


# -- convolution and pooling -----------------------------------------------------------------
def _window_pads(cx: NodeContext, size: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dilations: Sequence[int]) -> list[int]:
    """ONNX pads (all begins, then all ends) from `pads` or `auto_pad`."""
    auto = cx.attr("auto_pad", "NOTSET")
    n = len(size)
    if auto in ("NOTSET", ""):
        pads = list(cx.attr("pads", [0] * 2 * n))
        if len(pads) != 2 * n or min(pads) < 0:
            raise cx.refuse(f"pads={pads}")
        return pads
    if auto == "VALID":
        return [0] * 2 * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise cx.refuse(f"auto_pad={auto!r}")
    begins, ends = [], []
    for length, k, s, d in zip(size, kernel, strides, dilations):
        if not isinstance(length, int):
            raise cx.refuse(f"auto_pad={auto} over a dynamic spatial size")
        total = max(0, (-(-length // s) - 1) * s + (k - 1) * d + 1 - length)
        small, large = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else large)
        ends.append(large if auto == "SAME_UPPER" else small)
    return begins + ends


def pad_constant(x: Value, pads: Sequence[int], value: float) -> Value:
    """`x` with `pads` (ONNX order: all begins, then all ends) of `value` around it."""
    n = rank(x)
    for axis in range(n):
        before, after = pads[axis], pads[axis + n]
        if before == 0 and after == 0:
            continue
        parts = [_filled_block(x, axis, count, value) if count else None
                 for count in (before, after)]
        x = ops_list("Concat", [p for p in (parts[0], x, parts[1]) if p is not None], axis=axis)
    return x


def _filled_block(x: Value, axis: int, count: int, value: float) -> Value:
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


def _spatial(cx: NodeContext, x: Value, what: str) -> int:
    n = rank(x) - 2
    if n not in (1, 2):
        raise cx.refuse(f"{what} over {n} spatial dimension(s) (1 and 2 are supported)")
    return n


@converts("Conv")
def _conv(cx: NodeContext, x: Value, w: Value, bias: Value = None) -> Value:
    n = _spatial(cx, x, "convolution")
    if rank(w) != n + 2:
        raise cx.refuse(f"weight of rank {rank(w)} for an input of rank {rank(x)}")
    kernel = list(cx.attr("kernel_shape", shape_of(w)[2:]))
    if kernel != list(shape_of(w)[2:]):
        raise cx.refuse(f"kernel_shape {kernel} differs from the weight's {shape_of(w)[2:]}")
    strides = list(cx.attr("strides", [1] * n))
    dilations = list(cx.attr("dilations", [1] * n))
    pads = _window_pads(cx, shape_of(x)[2:], kernel, strides, dilations)
    if n == 1:  # as a 2-D convolution over a height of 1
        x = op("ExpandDims", x, axis=2)
        w = op("ExpandDims", w, axis=2)
        kernel, strides, dilations = [1] + kernel, [1] + strides, [1] + dilations
        pads = [0, pads[0], 0, pads[1]]
    out_channels = shape_of(w)[0]
    pad = (pads[0], pads[2], pads[1], pads[3])
    y = op("Conv2D", x, w, out_channel=out_channels, kernel_size=tuple(kernel),
           pad_mode="pad" if any(pad) else "valid", pad=pad if any(pad) else 0,
           stride=tuple(strides), dilation=tuple(dilations), group=cx.attr("group", 1))
    if n == 1:
        y = op("Squeeze", y, axis=(2,))
    if bias is not None:
        y = op("Add", y, reshape(cx, bias, (1, out_channels) + (1,) * n))
    return y


def _pool_geometry(cx: NodeContext, x: Value, count_pads: bool
                   ) -> tuple[int, list[int], list[int], list[int]]:
    n = _spatial(cx, x, "pooling")
    kernel = list(cx.attr("kernel_shape", []))
    if len(kernel) != n:
        raise cx.refuse(f"kernel_shape={kernel} for {n} spatial dimension(s)")
    strides = list(cx.attr("strides", [1] * n))
    dilations = list(cx.attr("dilations", [1] * n))
    if any(d != 1 for d in dilations):
        raise cx.refuse(f"dilations={dilations} (pooling with dilation 1 only)")
    size = shape_of(x)[2:]
    if not all(isinstance(d, int) for d in size):
        raise cx.refuse(f"pooling over the dynamic spatial sizes {size}")
    pads = _window_pads(cx, size, kernel, strides, dilations)
    if cx.attr("ceil_mode", 0):
        for i, (length, k, s) in enumerate(zip(size, kernel, strides)):
            padded = length + pads[i] + pads[i + n]
            floor_out = (padded - k) // s + 1
            ceil_out = -(-(padded - k) // s) + 1
            if ceil_out > floor_out and (ceil_out - 1) * s >= length + pads[i]:
                ceil_out -= 1  # the last window would start in the end padding
            if ceil_out > floor_out:
                if count_pads:
                    raise cx.refuse("ceil_mode=1 where it adds a partial window (average pool)")
                pads[i + n] += (ceil_out - 1) * s + k - padded
    return n, kernel, strides, pads


def _pool2d(prim: str, x: Value, n: int, kernel: list[int], strides: list[int]) -> Value:
    if n == 1:
        x = op("ExpandDims", x, axis=2)
        kernel, strides = [1] + kernel, [1] + strides
    y = op(prim, x, kernel_size=tuple(kernel), strides=tuple(strides), pad_mode="valid")
    return op("Squeeze", y, axis=(2,)) if n == 1 else y


def _full_pads(spatial: list[int]) -> list[int]:
    """Spatial pads (begins, then ends) as pads of every axis of an (N, C, ...) input."""
    n = len(spatial) // 2
    return [0, 0] + spatial[:n] + [0, 0] + spatial[n:]


@converts("MaxPool")
def _max_pool(cx: NodeContext, x: Value) -> Value:
    if cx.wants(1):
        raise cx.refuse("the Indices output is not supported")
    n, kernel, strides, pads = _pool_geometry(cx, x, count_pads=False)
    if any(pads):
        x = pad_constant(x, _full_pads(pads), -np.inf if T.is_float(dtype_of(x)) else
                         np.iinfo(dtype_of(x)).min)
    return _pool2d("MaxPool", x, n, kernel, strides)


@converts("AveragePool")
def _average_pool(cx: NodeContext, x: Value) -> Value:
    n, kernel, strides, pads = _pool_geometry(cx, x, count_pads=True)
    if not any(pads):
        return _pool2d("AvgPool", x, n, kernel, strides)
    y = _pool2d("AvgPool", pad_constant(x, _full_pads(pads), 0.0), n, kernel, strides)
    if cx.attr("count_include_pad", 0):
        return y
    # The mean over the window's elements inside the input: rescale by the static count.
    size = shape_of(x)[2:]
    ones = np.pad(np.ones(size), [(pads[i], pads[i + n]) for i in range(n)])
    counts = ones
    for axis, (k, s) in enumerate(zip(kernel, strides)):
        windows = np.lib.stride_tricks.sliding_window_view(counts, k, axis=axis)
        counts = windows.sum(axis=-1).take(range(0, windows.shape[axis], s), axis=axis)
    scale = (math.prod(kernel) / counts).reshape((1, 1) + counts.shape)
    return op("Mul", y, const(scale, y))


def _global_pool(prim: str) -> Converter:
    def convert(cx: NodeContext, x: Value) -> Value:
        return op(prim, x, axis=tuple(range(2, rank(x))), keep_dims=True)
    return convert


CONVERTERS["GlobalAveragePool"] = _global_pool("ReduceMean")
CONVERTERS["GlobalMaxPool"] = _global_pool("ReduceMax")


# -- normalisation ---------------------------------------------------------------------------
def _channel(cx: NodeContext, p: Value, x: Value) -> Value:
    """A per-channel parameter shaped to broadcast over an (N, C, ...) input."""
    return reshape(cx, p, (shape_of(p)[0],) + (1,) * (rank(x) - 2))


@converts("BatchNormalization")
def _batch_norm(cx: NodeContext, x: Value, scale: Value, bias: Value, mean: Value,
                var: Value) -> Value:
    if cx.attr("training_mode", 0) or any(cx.wants(i) for i in (1, 2)):
        raise cx.refuse("training_mode=1 (inference only)")
    eps = cx.attr("epsilon", 1e-5)
    if rank(x) in (2, 4) and all(dtype_of(p) == dtype_of(x) for p in (scale, bias, mean, var)):
        y = op("BatchNorm", x, scale, bias, mean, var, is_training=False, epsilon=eps)
        return y[0] if isinstance(y, tuple) else y
    if rank(x) < 2:
        raise cx.refuse(f"an input of rank {rank(x)}")
    inv = op("Rsqrt", op("Add", _channel(cx, var, x), const(eps, var)))
    y = op("Mul", op("Sub", x, _channel(cx, mean, x)), op("Mul", inv, _channel(cx, scale, x)))
    return op("Add", y, _channel(cx, bias, x))


def _normalise(x: Value, axes: tuple[int, ...], eps: float) -> tuple[Value, Value, Value]:
    mean = op("ReduceMean", x, axis=axes, keep_dims=True)
    centred = op("Sub", x, mean)
    var = op("ReduceMean", op("Mul", centred, centred), axis=axes, keep_dims=True)
    inv = op("Rsqrt", op("Add", var, const(eps, var)))
    return op("Mul", centred, inv), mean, inv


@converts("InstanceNormalization")
def _instance_norm(cx: NodeContext, x: Value, scale: Value, bias: Value) -> Value:
    if rank(x) < 3:
        raise cx.refuse(f"an input of rank {rank(x)}")
    y, _, _ = _normalise(x, tuple(range(2, rank(x))), cx.attr("epsilon", 1e-5))
    return op("Add", op("Mul", y, _channel(cx, scale, x)), _channel(cx, bias, x))


@converts("LayerNormalization")
def _layer_norm(cx: NodeContext, x: Value, scale: Value, bias: Value = None) -> Any:
    axis = norm_axis(cx, cx.attr("axis", -1), rank(x))
    eps = cx.attr("epsilon", 1e-5)
    if cx.attr("stash_type", 1) != 1 and dtype_of(x) != np.float32:
        raise cx.refuse("stash_type other than float32")
    norm_shape = shape_of(x)[axis:]
    if not (cx.wants(1) or cx.wants(2)) and bias is not None and \
            shape_of(scale) == norm_shape and shape_of(bias) == norm_shape:
        return op("LayerNorm", x, scale, bias, begin_norm_axis=axis, begin_params_axis=axis,
                  epsilon=eps)
    y, mean, inv = _normalise(x, tuple(range(axis, rank(x))), eps)
    y = op("Mul", y, scale)
    if bias is not None:
        y = op("Add", y, bias)
    return y, mean, inv


# -- shapes ----------------------------------------------------------------------------------
@converts("Shape")
def _shape(cx: NodeContext, x: Value) -> np.ndarray:
    shape = list(shape_of(x))
    n = len(shape)
    start, end = cx.attr("start", 0), cx.attr("end", n)
    start = min(max(start + n if start < 0 else start, 0), n)
    end = min(max(end + n if end < 0 else end, 0), n)
    part = shape[start:end]
    if all(isinstance(d, int) for d in part):
        return np.array(part, dtype=np.int64)
    return np.array(part, dtype=object)


FOLDERS["Shape"] = _shape


@converts("Size")
def _size(cx: NodeContext, x: Value) -> np.ndarray:
    size = math.prod(shape_of(x))
    if not isinstance(size, int):
        return np.array(size, dtype=object)
    return np.array(size, dtype=np.int64)


FOLDERS["Size"] = _size


@converts("Constant")
def _constant(cx: NodeContext) -> np.ndarray:
    attrs = cx.node.attribute
    if len(attrs) != 1:
        raise cx.refuse("a Constant needs exactly one value attribute")
    name = attrs[0].name
    value = cx.attrs[name]
    if name == "value":
        return tensor_array(value, cx.label)
    if name in ("value_float", "value_floats"):
        return np.array(value, dtype=np.float32)
    if name in ("value_int", "value_ints"):
        return np.array(value, dtype=np.int64)
    raise cx.refuse(f"a Constant given as {name} (strings and sparse tensors are not supported)")


FOLDERS["Constant"] = _constant


@converts("ConstantOfShape")
def _constant_of_shape(cx: NodeContext, shape: Value) -> np.ndarray:
    dims = cx.ints(shape, "the shape")
    value = cx.attrs.get("value")
    fill = tensor_array(value, cx.label).reshape(-1) if value is not None else \
        np.zeros(1, np.float32)
    if fill.size != 1:
        raise cx.refuse("value must hold one element")
    if any(d < 0 for d in dims):
        raise cx.refuse(f"negative shape {dims}")
    return np.full(dims, fill[0], dtype=fill.dtype)


@converts("Range")
def _range(cx: NodeContext, start: Value, limit: Value, delta: Value) -> np.ndarray:
    a, b, d = (cx.known(v, what) for v, what in ((start, "start"), (limit, "limit"),
                                                 (delta, "delta")))
    if d == 0:
        raise cx.refuse("delta 0")
    count = max(int(np.ceil((b - a) / d)), 0)
    return (a + d * np.arange(count)).astype(a.dtype)


@converts("Reshape")
def _reshape(cx: NodeContext, x: Value, shape: Value) -> Value:
    target = list(cx.known(shape, "the shape").reshape(-1))
    if not cx.attr("allowzero", 0):
        target = [shape_of(x)[i] if isinstance(d, (int, np.integer)) and d == 0 else d
                  for i, d in enumerate(target)]
    return reshape(cx, x, target)


def _fold_reshape(cx: NodeContext, x: np.ndarray, shape: np.ndarray) -> np.ndarray:
    return np.reshape(x, [int(d) for d in cx.ints(shape, "the shape")])


FOLDERS["Reshape"] = _fold_reshape


@converts("Flatten")
def _flatten(cx: NodeContext, x: Value) -> Value:
    n = rank(x)
    axis = cx.attr("axis", 1)
    axis = axis + n if axis < 0 else axis
    if not 0 <= axis <= n:
        raise cx.refuse(f"axis {cx.attr('axis')} for rank {n}")
    shape = shape_of(x)
    return reshape(cx, x, (math.prod(shape[:axis]), math.prod(shape[axis:])))


@converts("Transpose")
def _transpose(cx: NodeContext, x: Value) -> Value:
    perm = tuple(cx.attr("perm", list(range(rank(x)))[::-1]))
    if sorted(perm) != list(range(rank(x))):
        raise cx.refuse(f"perm={list(perm)} for rank {rank(x)}")
    return x if perm == tuple(range(rank(x))) else op("Transpose", x, perm=perm)


def _axes(cx: NodeContext, axes: Value, n: int) -> list[int] | None:
    listed = cx.attr("axes") if axes is None else cx.ints(axes, "axes")
    return None if listed is None else _checked_axes(cx, listed, n)


def _checked_axes(cx: NodeContext, listed: list[int], n: int) -> list[int]:
    out = [norm_axis(cx, a, n, "axes entry") for a in listed]
    if len(set(out)) != len(out):
        raise cx.refuse(f"axes {listed} repeat an axis")
    return out


@converts("Squeeze")
def _squeeze(cx: NodeContext, x: Value, axes: Value = None) -> Value:
    listed = _axes(cx, axes, rank(x))
    if listed is None:
        listed = [i for i, d in enumerate(shape_of(x)) if d == 1]
    if any(shape_of(x)[a] != 1 for a in listed):
        raise cx.refuse(f"squeezing axes {listed} of shape {shape_of(x)} (not all of size 1)")
    if isinstance(x, np.ndarray):
        return np.squeeze(x, axis=tuple(listed))
    return op("Squeeze", x, axis=tuple(listed)) if listed else x


@converts("Unsqueeze")
def _unsqueeze(cx: NodeContext, x: Value, axes: Value = None) -> Value:
    listed = sorted(_axes(cx, axes, rank(x) + len(cx.ints(axes, "axes") if axes is not None
                                                  else cx.attr("axes", []))) or [])
    if isinstance(x, np.ndarray):
        return np.expand_dims(x, tuple(listed))
    for a in listed:
        x = op("ExpandDims", x, axis=a)
    return x


FOLDERS["Squeeze"] = _squeeze
FOLDERS["Unsqueeze"] = _unsqueeze


@converts("Concat")
def _concat(cx: NodeContext, *xs: Value) -> Value:
    axis = norm_axis(cx, cx.attr("axis"), rank(xs[0]))
    parts = [x for x in xs if shape_of(x)[axis] != 0] or list(xs[:1])
    if len(parts) == 1:
        return parts[0]
    return ops_list("Concat", parts, axis=axis)


def _fold_concat(cx: NodeContext, *xs: np.ndarray) -> np.ndarray:
    return np.concatenate(xs, axis=cx.attr("axis"))


FOLDERS["Concat"] = _fold_concat


@converts("Split")
def _split(cx: NodeContext, x: Value, split: Value = None) -> list[Value]:
    axis = norm_axis(cx, cx.attr("axis", 0), rank(x))
    length = shape_of(x)[axis]
    if not isinstance(length, int):
        raise cx.refuse("splitting a dynamic axis")
    if split is not None:
        sizes = cx.ints(split, "split")
    elif cx.attr("split") is not None:
        sizes = list(cx.attr("split"))
    else:
        count = cx.attr("num_outputs", len(cx.outputs))
        step = -(-length // count)
        sizes = [min(step, length - i * step) for i in range(count)]
    if sum(sizes) != length or min(sizes) < 0:
        raise cx.refuse(f"split sizes {sizes} for axis {axis} of size {length}")
    if len(set(sizes)) == 1 and len(sizes) > 1:
        return list(op("Split", x, axis=axis, output_num=len(sizes)))
    outs, start = [], 0
    for size in sizes:
        begin = [0] * rank(x)
        extent = list(shape_of(x))
        begin[axis], extent[axis] = start, size
        outs.append(_slice_static(cx, x, begin, extent))
        start += size
    return outs


def _slice_static(cx: NodeContext, x: Value, begin: list[int], size: list[Any]) -> Value:
    if list(size) == list(shape_of(x)):
        return x
    n = rank(x)
    end = [b + s if isinstance(s, int) else 0 for b, s in zip(begin, size)]
    mask = sum(1 << i for i, s in enumerate(size) if not isinstance(s, int))
    return op("StridedSlice", x, begin=tuple(begin), end=tuple(end), strides=(1,) * n,
              begin_mask=mask, end_mask=mask)


@converts("Slice")
def _slice(cx: NodeContext, x: Value, starts: Value, ends: Value, axes: Value = None,
           steps: Value = None) -> Value:
    n = rank(x)
    begin_list, end_list = cx.ints(starts, "starts"), cx.ints(ends, "ends")
    axis_list = _checked_axes(cx, cx.ints(axes, "axes"), n) if axes is not None else \
        list(range(len(begin_list)))
    step_list = cx.ints(steps, "steps") if steps is not None else [1] * len(begin_list)
    if not len(begin_list) == len(end_list) == len(axis_list) == len(step_list):
        raise cx.refuse("starts, ends, axes and steps differ in length")
    index: list[slice] = [slice(None)] * n
    for b, e, a, s in zip(begin_list, end_list, axis_list, step_list):
        if s == 0:
            raise cx.refuse("a step of 0")
        length = shape_of(x)[a]
        if not isinstance(length, int):
            raise cx.refuse(f"slicing dynamic axis {a}")
        b = b + length if b < 0 else b
        e = e + length if e < 0 else e
        if s > 0:
            b, e = min(max(b, 0), length), min(max(e, 0), length)
            index[a] = slice(b, max(e, b), s)
        else:
            b, e = min(max(b, -1), length - 1), min(max(e, -1), length - 1)
            index[a] = slice(b, e if e >= 0 else None, s)
    if isinstance(x, np.ndarray):
        return x[tuple(index)]
    if all(sl == slice(None) for sl in index):
        return x
    begin, end, strides, begin_mask, end_mask = [], [], [], 0, 0
    for axis, sl in enumerate(index):
        begin.append(sl.start if sl.start is not None else 0)
        end.append(sl.stop if sl.stop is not None else 0)
        strides.append(sl.step or 1)
        if sl.start is None:
            begin_mask |= 1 << axis
        if sl.stop is None:
            end_mask |= 1 << axis
    out_shape = [len(range(*sl.indices(d))) if isinstance(d, int) else d
                 for sl, d in zip(index, shape_of(x))]
    if 0 in out_shape:  # nothing to read: the empty result is known
        if not all(isinstance(d, int) for d in out_shape):
            raise cx.refuse(f"a slice with no elements of dynamic shape {out_shape}")
        return np.zeros(out_shape, dtype=dtype_of(x))
    return op("StridedSlice", x, begin=tuple(begin), end=tuple(end), strides=tuple(strides),
              begin_mask=begin_mask, end_mask=end_mask)


FOLDERS["Slice"] = _slice


@converts("Gather")
def _gather(cx: NodeContext, x: Value, indices: Value) -> Value:
    axis = norm_axis(cx, cx.attr("axis", 0), rank(x))
    length = shape_of(x)[axis]
    if isinstance(indices, np.ndarray):
        indices = concrete(indices, "the indices")
        if not isinstance(length, int):
            raise cx.refuse("gathering along a dynamic axis")
        if indices.size and (indices.min() < -length or indices.max() >= length):
            raise cx.refuse(f"an index out of range for axis {axis} of size {length}")
        indices = np.where(indices < 0, indices + length, indices).astype(indices.dtype)
        if isinstance(x, np.ndarray):
            return np.take(x, indices, axis=axis)
    elif isinstance(length, int):
        indices = op("Select", op("Less", indices, const(0, indices)),
                     op("Add", indices, const(length, indices)), indices)
    return op("Gather", x, indices, axis=axis)


FOLDERS["Gather"] = _gather


@converts("Expand")
def _expand(cx: NodeContext, x: Value, shape: Value) -> Value:
    target = [int(d) if isinstance(d, (int, np.integer)) else d
              for d in cx.known(shape, "the shape").reshape(-1)]
    have = list(shape_of(x))
    n = max(len(target), len(have))
    target = [1] * (n - len(target)) + target
    have = [1] * (n - len(have)) + have
    out = []
    for t, h in zip(target, have):
        if isinstance(t, int) and t == 1:
            out.append(h)
        elif isinstance(h, int) and h == 1:
            out.append(t)
        elif t is h or t == h:
            out.append(h)
        else:
            raise cx.refuse(f"shape {shape_of(x)} cannot expand to {target}")
    if not all(isinstance(d, int) for d in out):
        if tuple(out) == tuple(have):
            return reshape(cx, x, out)
        raise cx.refuse(f"expanding to the dynamic shape {out}")
    x = reshape(cx, x, have) if len(have) != rank(x) else x
    return x if tuple(out) == shape_of(x) else op("BroadcastTo", x, shape=tuple(out))


@converts("Tile")
def _tile(cx: NodeContext, x: Value, repeats: Value) -> Value:
    reps = cx.ints(repeats, "repeats")
    if len(reps) != rank(x) or min(reps, default=1) < 1:
        raise cx.refuse(f"repeats {reps} for rank {rank(x)}")
    return x if all(r == 1 for r in reps) else op("Tile", x, multiples=tuple(reps))


@converts("Dropout")
def _dropout(cx: NodeContext, x: Value, ratio: Value = None, training: Value = None) -> Any:
    if training is not None and bool(cx.known(training, "training_mode").reshape(-1)[0]):
        raise cx.refuse("training_mode=True (inference only)")
    if cx.wants(1):
        return x, np.ones(static_shape(cx, x), dtype=np.bool_)
    return x


@converts("Pad")
def _pad(cx: NodeContext, x: Value, pads: Value, value: Value = None, axes: Value = None
         ) -> Value:
    mode = cx.attr("mode", "constant")
    if mode != "constant":
        raise cx.refuse(f"mode={mode!r} (constant only)")
    n = rank(x)
    listed = cx.ints(pads, "pads")
    axis_list = _checked_axes(cx, cx.ints(axes, "axes"), n) if axes is not None else \
        list(range(n))
    if len(listed) != 2 * len(axis_list):
        raise cx.refuse(f"pads {listed} for axes {axis_list}")
    full = [0] * 2 * n
    for i, a in enumerate(axis_list):
        full[a], full[a + n] = listed[i], listed[i + len(axis_list)]
    if min(full) < 0:
        raise cx.refuse(f"negative pads {listed}")
    fill = 0.0
    if value is not None:
        known = cx.known(value, "constant_value").reshape(-1)
        fill = known[0].item() if known.size else 0.0
    return pad_constant(x, full, fill)


# -- reductions ------------------------------------------------------------------------------
def _reduce(prim: str, pre: Callable[[Value], Value] | None = None,
            post: Callable[[Value], Value] | None = None) -> Converter:
    def convert(cx: NodeContext, x: Value, axes: Value = None) -> Value:
        listed = _axes(cx, axes, rank(x))
        if not listed and cx.attr("noop_with_empty_axes", 0):
            return x
        empty = _empty_reduction(cx, x, listed, prim)
        if empty is not None:
            return post(empty) if post else empty
        if prim in _EMPTY_IDENTITY and dtype_of(x) == np.bool_:  # any / all, through int32
            y = convert(cx, op("Cast", x, dtype=T.int32), axes)
            return y.astype(np.bool_) if isinstance(y, np.ndarray) else \
                op("Cast", y, dtype=T.bool_)
        y = pre(x) if pre else x
        y = op(prim, y, axis=tuple(listed or ()), keep_dims=bool(cx.attr("keepdims", 1)))
        return post(y) if post else y
    return convert


# What a reduction of no elements gives, as ONNX defines it: the reduction's identity.
_EMPTY_IDENTITY = {"ReduceMax": -np.inf, "ReduceMin": np.inf}


def _empty_reduction(cx: NodeContext, x: Value, listed: list[int] | None, prim: str
                     ) -> np.ndarray | None:
    """The result of a max or min over an axis of size 0 (a constant), else None."""
    axes = listed or list(range(rank(x)))
    if prim not in _EMPTY_IDENTITY or not any(shape_of(x)[a] == 0 for a in axes):
        return None
    dtype = dtype_of(x)
    identity = _EMPTY_IDENTITY[prim]
    if dtype == np.bool_:  # any of none is False, all of none is True
        identity = identity > 0
    elif not T.is_float(dtype):
        limits = np.iinfo(dtype)
        identity = limits.min if identity < 0 else limits.max
    keep = bool(cx.attr("keepdims", 1))
    shape = [1 if i in axes else d for i, d in enumerate(shape_of(x)) if keep or i not in axes]
    if not all(isinstance(d, int) for d in shape):
        raise cx.refuse("a max or min over an empty axis, with a dynamic size left")
    return np.full(shape, identity, dtype=dtype)


CONVERTERS["ReduceSum"] = _reduce("ReduceSum")
CONVERTERS["ReduceMean"] = _reduce("ReduceMean")
CONVERTERS["ReduceMax"] = _reduce("ReduceMax")
CONVERTERS["ReduceMin"] = _reduce("ReduceMin")
CONVERTERS["ReduceProd"] = _reduce("ReduceProd")
CONVERTERS["ReduceL1"] = _reduce("ReduceSum", lambda x: op("Abs", x))
CONVERTERS["ReduceL2"] = _reduce("ReduceSum", lambda x: op("Mul", x, x), lambda y: op("Sqrt", y))
CONVERTERS["ReduceSumSquare"] = _reduce("ReduceSum", lambda x: op("Mul", x, x))
CONVERTERS["ReduceLogSum"] = _reduce("ReduceSum", None, lambda y: op("Log", y))


@converts("ReduceLogSumExp")
def _reduce_log_sum_exp(cx: NodeContext, x: Value, axes: Value = None) -> Value:
    listed = _axes(cx, axes, rank(x))
    if not listed and cx.attr("noop_with_empty_axes", 0):
        return x
    axis = tuple(listed or ())
    empty = _empty_reduction(cx, x, listed, "ReduceMax")  # log(0) = -inf, as max's identity
    if empty is not None:
        return empty
    top = op("ReduceMax", x, axis=axis, keep_dims=True)
    total = op("ReduceSum", op("Exp", op("Sub", x, top)), axis=axis, keep_dims=True)
    y = op("Add", op("Log", total), top)
    if not cx.attr("keepdims", 1):
        y = op("Squeeze", y, axis=tuple(range(rank(x))) if not axis else axis)
    return y


def _arg(find_max: bool) -> Converter:
    def convert(cx: NodeContext, x: Value) -> Value:
        axis = norm_axis(cx, cx.attr("axis", 0), rank(x))
        last = cx.attr("select_last_index", 0)
        length = shape_of(x)[axis]
        if last:  # the first extreme of the reversed axis is the last one
            if not isinstance(length, int):
                raise cx.refuse("select_last_index=1 along a dynamic axis")
            x = _reversed(x, axis)
        if find_max:
            index = op("Argmax", x, axis=axis, output_type=T.int64)
        else:
            index = op("ArgMinWithValue", x, axis=axis)[0]
            if dtype_of(index) != np.int64:
                index = op("Cast", index, dtype=T.int64)
        if last:
            index = op("Sub", const(length - 1, index), index)
        return op("ExpandDims", index, axis=axis) if cx.attr("keepdims", 1) else index
    return convert


def _reversed(x: Value, axis: int) -> Value:
    n = rank(x)
    mask = sum(1 << i for i in range(n))
    strides = [1] * n
    strides[axis] = -1
    return op("StridedSlice", x, begin=(0,) * n, end=(0,) * n, strides=tuple(strides),
              begin_mask=mask, end_mask=mask)


CONVERTERS["ArgMax"] = _arg(True)
CONVERTERS["ArgMin"] = _arg(False)


@converts("CumSum")
def _cumsum(cx: NodeContext, x: Value, axis: Value) -> Value:
    n = rank(x)
    a = norm_axis(cx, cx.ints(axis, "axis")[0], n)
    length = shape_of(x)[a]
    if not isinstance(length, int):
        raise cx.refuse("a cumulative sum along a dynamic axis")
    # A sum along the axis as a product with a triangular matrix of ones (moved last).
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    keep = (i >= j) if cx.attr("reverse", 0) else (i <= j)
    if cx.attr("exclusive", 0):
        keep &= i != j
    perm = tuple(k for k in range(n) if k != a) + (a,)
    moved = op("Transpose", x, perm=perm) if perm != tuple(range(n)) else x
    summed = op("MatMul", moved if n > 1 else op("ExpandDims", moved, axis=0),
                keep.astype(dtype_of(x)))
    if n == 1:
        return op("Squeeze", summed, axis=(0,))
    back = tuple(int(p) for p in np.argsort(perm))
    return op("Transpose", summed, perm=back) if perm != tuple(range(n)) else summed


@converts("Trilu")
def _trilu(cx: NodeContext, x: Value, k: Value = None) -> Value:
    if rank(x) < 2:
        raise cx.refuse(f"an input of rank {rank(x)}")
    rows, cols = static_shape(cx, x)[-2:]
    shift = cx.ints(k, "k")[0] if k is not None else 0
    i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    keep = (j - i >= shift) if cx.attr("upper", 1) else (j - i <= shift)
    return op("Select", keep, x, const(0, x))


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


@converts("LRN")
def _lrn(cx: NodeContext, x: Value) -> Value:
    """Local response normalisation across channels: the windowed sum of squares is a product
    with a band matrix of ones over the channel axis, moved last."""
    size = cx.attr("size")
    if not isinstance(size, int) or size < 1 or rank(x) < 3:
        raise cx.refuse(f"size={size!r} on an input of rank {rank(x)}")
    alpha, beta, bias = cx.attr("alpha", 1e-4), cx.attr("beta", 0.75), cx.attr("bias", 1.0)
    channels = shape_of(x)[1]
    if not isinstance(channels, int):
        raise cx.refuse("a dynamic channel count")
    lo = (size - 1) // 2
    c_from, c_to = np.arange(channels)[:, None], np.arange(channels)[None, :]
    band = ((c_from >= c_to - lo) & (c_from <= c_to + size - 1 - lo)).astype(dtype_of(x))
    n = rank(x)
    last = (0,) + tuple(range(2, n)) + (1,)
    back = tuple(int(p) for p in np.argsort(last))
    sums = op("Transpose", op("MatMul", op("Transpose", op("Mul", x, x), perm=last), band),
              perm=back)
    scale = op("Add", op("Mul", sums, const(alpha / size, x)), const(bias, x))
    return op("Mul", x, op("Pow", scale, const(-beta, x)))
