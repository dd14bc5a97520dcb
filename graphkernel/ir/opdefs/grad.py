"""Gradient composites, MindSpore's `_grad_ops` with their signatures: the backward of GeLU,
Softmax, LayerNorm, ReLU, ... as one op each. Unfused they run their numpy reference; with
fusion on graph_kernel/grad_expanders.py expands them into basic ops, so backward work fuses
like forward work. Each recomputes what it needs from the forward op's inputs and output (GeLU's
tanh, Softmax's row sum) rather than reading the forward op's inner values."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, InputError, ShapeError
from graphkernel.ir import types as T
from graphkernel.ir.opdefs.elementwise import erf_reference
from graphkernel.ir.opset import FLOATS, NUMBERS, Infer, OpDef, PatternKind, declare
from graphkernel.ir.types import TensorType, TupleType, ValueType

# The names declared here: `graphkernel.ops.operations._grad_ops` offers them, as MindSpore.
GRAD_OPS: list[str] = []


def _grad_composite(name: str, inputs: tuple[str, ...], reference: Callable[..., Any],
                    infer: Infer, init_attrs: tuple[tuple[str, Any], ...] = (),
                    doc: str = "", grad: Callable[..., Any] | None = None,
                    accepts: tuple[np.dtype, ...] = FLOATS) -> None:
    declare(OpDef(name=name, kind=PatternKind.OPAQUE, inputs=inputs, infer=infer,
                  reference=reference, accepts=accepts, init_attrs=init_attrs, composite=True,
                  doc=doc, grad=grad))
    GRAD_OPS.append(name)


def _wide(f: Callable[..., Any]) -> Callable[..., Any]:
    """A reference computed in float64 and rounded once to the first input's dtype (the
    expanders compute float16 in float32 and round once: the two agree to within an ulp)."""
    def ref(*args: Any, **attrs: Any) -> Any:
        dtype = args[0].dtype
        with np.errstate(all="ignore"):
            out = f(*(np.asarray(a, np.float64) for a in args), **attrs)
        if isinstance(out, tuple):
            return tuple(np.asarray(o).astype(dtype) for o in out)
        return np.asarray(out).astype(dtype)
    return ref


def _same_as(op: str, index: int) -> Infer:
    def infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
        shapes = {t.shape for t in types}
        if len(shapes) != 1:
            raise ShapeError(f"{op}: gradient inputs must share one shape, got "
                             f"{', '.join(str(t.shape) for t in types)}")
        # MindSpore's kernels for these take one dtype for all inputs (a float64 y beside
        # float32 dy and x has no kernel): refused on both paths rather than promoted on one.
        if len({t.dtype for t in types}) != 1:
            raise DTypeError(f"{op}: gradient inputs must share one dtype, got "
                             f"{', '.join(t.dtype.name for t in types)}; cast them to one "
                             "dtype first (P.Cast), as MindSpore requires")
        return TensorType(types[index].shape, types[index].dtype)
    return infer


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def _gelu_grad_ref(dy: np.ndarray, x: np.ndarray, y: np.ndarray,
                   approximate: str = "tanh") -> np.ndarray:
    if approximate == "tanh":
        t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3))
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
    else:
        d = 0.5 * (1 + erf_reference(x / math.sqrt(2))) + \
            x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return dy * d


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(0.5 * x))  # no overflow for large |x|


def _fast_gelu_grad_ref(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    s = _sigmoid(1.702 * x)
    return dy * (s + 1.702 * x * s * (1 - s))


# Gradient rules of the gradient ops themselves (second-order gradients: grad of grad). `dd`
# is the gradient of the gradient op's output; each rule gives one gradient per input. The
# part linear in the incoming gradient is the same gradient op again, applied to `dd`.

def _tanh_grad_grad(b: Any, n: Any, dd: Any, attrs: dict[str, Any]) -> list[Any]:
    y, dy = n.inputs  # dy (1 - y^2)
    return [b("Mul", b("Mul", dd, dy), b("Mul", y, -2.0)), b("TanhGrad", y, dd)]


def _sigmoid_grad_grad(b: Any, n: Any, dd: Any, attrs: dict[str, Any]) -> list[Any]:
    y, dy = n.inputs  # dy y (1 - y)
    return [b("Mul", b("Mul", dd, dy), b("Sub", 1.0, b("Mul", y, 2.0))),
            b("SigmoidGrad", y, dd)]


def _relu_grad_grad(b: Any, n: Any, dd: Any, attrs: dict[str, Any]) -> list[Any]:
    _, y = n.inputs  # dy where y > 0: piecewise constant in y
    return [b("ReluGrad", dd, y), None]


def _sqrt_grad_grad(b: Any, n: Any, dd: Any, attrs: dict[str, Any]) -> list[Any]:
    y, dy = n.inputs  # dy / (2 y)
    return [b("Neg", b("RealDiv", b("Mul", b("Mul", dd, dy), 0.5), b("Mul", y, y))),
            b("SqrtGrad", y, dd)]


def _rsqrt_grad_grad(b: Any, n: Any, dd: Any, attrs: dict[str, Any]) -> list[Any]:
    y, dy = n.inputs  # -dy y^3 / 2
    return [b("Mul", b("Mul", dd, dy), b("Mul", b("Mul", y, y), -1.5)),
            b("RsqrtGrad", y, dd)]


def _fast_gelu_grad_grad(b: Any, n: Any, dd: Any, attrs: dict[str, Any]) -> list[Any]:
    dy, x = n.inputs  # f(x) = x s(kx): f'' = k s (1 - s) (2 + k x (1 - 2 s))
    k = 1.702
    s = b("Sigmoid", b("Mul", x, k))
    spread = b("Mul", s, b("Sub", 1.0, s))
    bend = b("Add", b("Mul", b("Mul", x, k), b("Sub", 1.0, b("Mul", s, 2.0))), 2.0)
    second = b("Mul", b("Mul", spread, bend), k)
    return [b("FastGeLUGrad", dd, x), b("Mul", b("Mul", dd, dy), second)]


def _gelu_grad_grad(b: Any, n: Any, dd: Any, attrs: dict[str, Any]) -> list[Any]:
    dy, x, y = n.inputs  # y is recomputed from x (MindSpore's signature): no gradient
    square = b("Mul", x, x)
    if attrs["approximate"] == "tanh":
        # u = c (x + a x^3), t = tanh(u): f'' = (1 - t^2) (u' + x (u'' / 2 - t u'^2))
        c, a = _SQRT_2_OVER_PI, 0.044715
        t = b("Tanh", b("Mul", b("Add", b("Mul", square, a), 1.0), b("Mul", x, c)))
        du = b("Mul", b("Add", b("Mul", square, 3 * a), 1.0), c)
        curve = b("Sub", b("Mul", x, 3 * a * c), b("Mul", t, b("Mul", du, du)))
        second = b("Mul", b("Sub", 1.0, b("Mul", t, t)), b("Add", du, b("Mul", x, curve)))
    else:
        # f'' = phi(x) (2 - x^2), phi the standard normal density
        phi = b("Mul", b("Exp", b("Mul", square, -0.5)), 1 / math.sqrt(2 * math.pi))
        second = b("Mul", phi, b("Sub", 2.0, square))
    return [b("GeLUGrad", dd, x, y, approximate=attrs["approximate"]),
            b("Mul", b("Mul", dd, dy), second), None]


_grad_composite("GeLUGrad", ("dy", "x", "y"), _wide(_gelu_grad_ref), _same_as("GeLUGrad", 1),
                init_attrs=(("approximate", "tanh"),), grad=_gelu_grad_grad,
                doc="dy * GeLU'(x); y is GeLU(x) (MindSpore's signature; recomputed here)")
_grad_composite("FastGeLUGrad", ("dy", "x"), _wide(_fast_gelu_grad_ref),
                _same_as("FastGeLUGrad", 1), grad=_fast_gelu_grad_grad)
_grad_composite("ReluGrad", ("y_backprop", "x"),
                lambda dy, y: np.where(y > 0, dy, np.zeros_like(dy)), _same_as("ReluGrad", 0),
                grad=_relu_grad_grad, accepts=NUMBERS,  # MindSpore's ReluGrad takes int32 too
                doc="dy where the ReLU's output (or input) is positive, else 0")
_grad_composite("SigmoidGrad", ("y", "dy"), _wide(lambda y, dy: dy * y * (1 - y)),
                _same_as("SigmoidGrad", 0), grad=_sigmoid_grad_grad)
_grad_composite("TanhGrad", ("y", "dy"), _wide(lambda y, dy: dy * (1 - y * y)),
                _same_as("TanhGrad", 0), grad=_tanh_grad_grad)
_grad_composite("SqrtGrad", ("y", "dy"), _wide(lambda y, dy: dy * 0.5 / y), _same_as("SqrtGrad", 0),
                grad=_sqrt_grad_grad)
_grad_composite("RsqrtGrad", ("y", "dy"), _wide(lambda y, dy: dy * -0.5 * y * y * y),
                _same_as("RsqrtGrad", 0), grad=_rsqrt_grad_grad)


def _softmax_grad_grad(b: Any, n: Any, dd: Any, attrs: dict[str, Any]) -> list[Any]:
    y, dy = n.inputs  # (dy - sum(dy y)) y
    axes = T.normalize_axes(attrs["axis"], y.tensor_type.rank)
    total = b("ReduceSum", b("Mul", dy, y), axis=axes, keep_dims=True)
    dd_total = b("ReduceSum", b("Mul", dd, y), axis=axes, keep_dims=True)
    return [b("Sub", b("Mul", dd, b("Sub", dy, total)), b("Mul", dy, dd_total)),
            b("SoftmaxGrad", y, dd, axis=attrs["axis"])]


def _log_softmax_grad_grad(b: Any, n: Any, dd: Any, attrs: dict[str, Any]) -> list[Any]:
    y, dy = n.inputs  # dy - exp(y) sum(dy)
    axes = T.normalize_axes(attrs["axis"], y.tensor_type.rank)
    dd_exp = b("Mul", dd, b("Exp", y))
    total = b("ReduceSum", dy, axis=axes, keep_dims=True)
    return [b("Neg", b("Mul", dd_exp, total)),
            b("Sub", dd, b("ReduceSum", dd_exp, axis=axes, keep_dims=True))]


def _softmax_grad_ref(y: np.ndarray, dy: np.ndarray, axis: Any = -1) -> np.ndarray:
    axes = T.normalize_axes(axis, y.ndim)
    return (dy - (dy * y).sum(axis=axes, keepdims=True)) * y


def _log_softmax_grad_ref(y: np.ndarray, dy: np.ndarray, axis: Any = -1) -> np.ndarray:
    axes = T.normalize_axes(axis, y.ndim)
    return dy - np.exp(y) * dy.sum(axis=axes, keepdims=True)


def _axis_same(op: str) -> Infer:
    def infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
        out = _same_as(op, 0)(types, attrs)
        T.normalize_axes(attrs["axis"], out.rank)  # type: ignore[union-attr]  # a TensorType
        return out
    return infer


_grad_composite("SoftmaxGrad", ("y", "dy"), _wide(_softmax_grad_ref), _axis_same("SoftmaxGrad"),
                init_attrs=(("axis", -1),), grad=_softmax_grad_grad,
                doc="(dy - sum(dy * y)) * y, y = Softmax(x)")
_grad_composite("LogSoftmaxGrad", ("y", "dy"), _wide(_log_softmax_grad_ref),
                _axis_same("LogSoftmaxGrad"),
                init_attrs=(("axis", -1),), grad=_log_softmax_grad_grad,
                doc="dy - exp(y) * sum(dy), y = LogSoftmax(x)")


def layer_norm_grad_axes(x: TensorType, attrs: dict[str, Any]) -> tuple[tuple[int, ...],
                                                                         tuple[int, ...]]:
    """(the normalised axes, the axes gamma and beta are summed over)."""
    norm, params = attrs["begin_norm_axis"], attrs["begin_params_axis"]
    for name, a in (("begin_norm_axis", norm), ("begin_params_axis", params)):
        if not -x.rank <= a < x.rank:
            raise ShapeError(f"LayerNormGrad: {name}={a} out of range for input of shape "
                             f"{x.shape}")
    return tuple(range(norm % x.rank, x.rank)), tuple(range(params % x.rank))


def _layer_norm_grad_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    x, dy, var, mean, gamma = types
    norm, params = layer_norm_grad_axes(x, attrs)
    stat = tuple(1 if i in norm else d for i, d in enumerate(x.shape))
    if dy.shape != x.shape or var.shape != stat or mean.shape != stat or \
            gamma.shape != x.shape[len(params):]:
        raise ShapeError(f"LayerNormGrad: x {x.shape}, dy {dy.shape}, variance {var.shape}, "
                         f"mean {mean.shape}, gamma {gamma.shape} do not fit")
    return TupleType((x, gamma, gamma))


def _layer_norm_grad_ref(x: np.ndarray, dy: np.ndarray, var: np.ndarray, mean: np.ndarray,
                         gamma: np.ndarray, begin_norm_axis: int = 1, begin_params_axis: int = 1,
                         epsilon: float = 1e-7) -> tuple[np.ndarray, ...]:
    norm, params = layer_norm_grad_axes(TensorType(x.shape, np.dtype(np.float64)), {
        "begin_norm_axis": begin_norm_axis, "begin_params_axis": begin_params_axis})
    rstd = 1 / np.sqrt(var + epsilon)
    xhat = (x - mean) * rstd
    dxhat = dy * gamma
    dx = rstd * (dxhat - dxhat.mean(axis=norm, keepdims=True) -
                 xhat * (dxhat * xhat).mean(axis=norm, keepdims=True))
    return dx, (dy * xhat).sum(axis=params), dy.sum(axis=params)


_grad_composite("LayerNormGrad", ("x", "dy", "variance", "mean", "gamma"),
                _wide(_layer_norm_grad_ref), _layer_norm_grad_infer,
                init_attrs=(("begin_norm_axis", 1), ("begin_params_axis", 1),
                            ("epsilon", 1e-7)),
                doc="(dx, dgamma, dbeta) of LayerNorm from its input, mean and variance")


def bias_add_grad_axes(rank: int) -> tuple[int, ...]:
    """The axes BiasAddGrad sums: all but the channel axis (1, or the last of a 2-d input)."""
    channel = 1 if rank > 2 else rank - 1
    return tuple(i for i in range(rank) if i != channel)


def _bias_add_grad_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (dy,) = types
    if attrs["data_format"] not in ("NCHW", "NCDHW"):  # as BiasAdd's (opdefs/composite.py)
        raise InputError(f"BiasAddGrad: data_format {attrs['data_format']!r} is not "
                         "supported; the channels are on axis 1 ('NCHW' or 'NCDHW')")
    if dy.rank < 2:
        raise ShapeError(f"BiasAddGrad needs a rank >= 2 gradient, got {dy.shape}")
    return TensorType((dy.shape[1 if dy.rank > 2 else -1],), dy.dtype)


_grad_composite("BiasAddGrad", ("dout",),
                _wide(lambda dy, data_format="NCHW": dy.sum(axis=bias_add_grad_axes(dy.ndim))),
                _bias_add_grad_infer, init_attrs=(("data_format", "NCHW"),))


def _extremum_grad_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    x1, x2, dy = types
    if T.broadcast_shapes(x1.shape, x2.shape) != dy.shape:
        raise ShapeError(f"gradient of shape {dy.shape} does not fit inputs {x1.shape} and "
                         f"{x2.shape}")
    return TupleType((TensorType(x1.shape, x1.dtype), TensorType(x2.shape, x2.dtype)))


def _sum_to(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                      if d == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes, keepdims=True).reshape(shape) if axes else g.reshape(shape)


def _extremum_grad_ref(first_wins: Callable[[np.ndarray, np.ndarray], np.ndarray]
                       ) -> Callable[..., Any]:
    def ref(x1: np.ndarray, x2: np.ndarray, dy: np.ndarray, grad_x: bool = True,
            grad_y: bool = True) -> tuple[np.ndarray, np.ndarray]:
        pick = first_wins(x1, x2)
        return (_sum_to(np.where(pick, dy, 0.0), x1.shape),
                _sum_to(np.where(pick, 0.0, dy), x2.shape))
    return ref


# Ties go to the first input, as in MindSpore.
_grad_composite("MaximumGrad", ("x1", "x2", "grads"), _wide(_extremum_grad_ref(np.greater_equal)),
                _extremum_grad_infer, init_attrs=(("grad_x", True), ("grad_y", True)))
_grad_composite("MinimumGrad", ("x1", "x2", "grads"), _wide(_extremum_grad_ref(np.less_equal)),
                _extremum_grad_infer, init_attrs=(("grad_x", True), ("grad_y", True)))
_grad_composite("DropoutGrad", ("dy", "mask"),
                _wide(lambda dy, mask, keep_prob=0.5: dy * mask / keep_prob),
                _same_as("DropoutGrad", 0),
                init_attrs=(("keep_prob", 0.5),), doc="dy * mask / keep_prob")


def _batch_norm_grad_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    dy, x, scale, mean, var, _ = types
    if x.rank < 2 or dy.shape != x.shape or any(t.shape != (x.shape[1],)
                                                 for t in (scale, mean, var)):
        raise ShapeError(f"BatchNormGrad: dy {dy.shape}, x {x.shape}, scale {scale.shape}, "
                         f"mean {mean.shape}, variance {var.shape} do not fit (channels on "
                         "axis 1)")
    return TupleType((x, scale, scale))


def _batch_norm_grad_ref(dy: np.ndarray, x: np.ndarray, scale: np.ndarray, mean: np.ndarray,
                         var: np.ndarray, reserve: np.ndarray, is_training: bool = False,
                         epsilon: float = 1e-5, data_format: str = "NCHW"
                         ) -> tuple[np.ndarray, ...]:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    axes = (0,) + tuple(range(2, x.ndim))
    rstd = (1 / np.sqrt(var + epsilon)).reshape(shape)
    xhat = (x - mean.reshape(shape)) * rstd
    dscale, dbias = (dy * xhat).sum(axis=axes), dy.sum(axis=axes)
    dxhat = dy * scale.reshape(shape)
    if is_training:
        dx = rstd * (dxhat - dxhat.mean(axis=axes, keepdims=True) -
                     xhat * (dxhat * xhat).mean(axis=axes, keepdims=True))
    else:
        dx = dxhat * rstd
    return dx, dscale, dbias


_grad_composite("BatchNormGrad", ("dy", "x", "scale", "save_mean", "save_variance", "reserve"),
                _wide(_batch_norm_grad_ref), _batch_norm_grad_infer,
                init_attrs=(("is_training", False), ("epsilon", 1e-5), ("data_format", "NCHW")),
                doc="(dx, dscale, dbias) of BatchNorm from the saved batch mean and variance "
                    "(channels on axis 1; `reserve` is accepted for MindSpore's signature and "
                    "not read)")
_grad_composite("SigmoidCrossEntropyWithLogitsGrad", ("x", "y", "dout"),
                _wide(lambda x, y, dout: (_sigmoid(x) - y) * dout),
                _same_as("SigmoidCrossEntropyWithLogitsGrad", 0))
