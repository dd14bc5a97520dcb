"""Weight initialisers, MindSpore's `mindspore.common.initializer`: the classes (`HeUniform`,
`HeNormal`, `XavierUniform`, `XavierNormal`, `Normal`, `TruncatedNormal`, `Uniform`,
`Constant`, `Zero`, `One`) with MindSpore's arguments and formulas, their names as strings
('he_uniform', 'zeros', ...), and `initializer(init, shape, dtype)`, which returns a Tensor
drawn on first use (`init_data()`, as MindSpore's). Every draw comes from one process-wide
generator that `set_seed` reseeds (MindSpore's `set_seed`)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.location import user_location
from graphkernel.frontend.tensor import Tensor
from graphkernel.ir import types as T

_rng = np.random.default_rng(0)


def set_seed(seed: int) -> None:
    """Reseed every initialiser: the same seed gives the same weights."""
    global _rng
    _rng = np.random.default_rng(seed)


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """fan_in and fan_out as MindSpore (and PyTorch) count them: a Dense weight is [out, in], a
    convolution's [out, in, kh, kw] (the receptive field multiplies both)."""
    if len(shape) < 2:
        n = shape[0] if shape else 1
        return n, n
    field = math.prod(shape[2:])
    return shape[1] * field, shape[0] * field


_LINEAR_GAINS = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                 "conv_transpose3d", "sigmoid")


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """MindSpore's (and PyTorch's) recommended gain for a nonlinearity."""
    if nonlinearity in _LINEAR_GAINS:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise InputError(f"unknown nonlinearity {nonlinearity!r} for a gain; graphkernel has "
                     f"{', '.join(_LINEAR_GAINS)}, tanh, relu, leaky_relu, selu", user_location())


def _real(owner: str, name: str, value: Any, non_negative: bool = False) -> float:
    """An initialiser's numeric argument, checked when it is made (not when first drawn)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or (non_negative and value < 0):
        kind = "a finite non-negative number" if non_negative else "a finite number"
        raise InputError(f"{owner}: {name} must be {kind}, got {value!r}", user_location())
    return float(value)


class Initializer:
    """The base of the initialiser classes: `init(array)` fills a numpy array in place (as
    MindSpore's `Initializer.__call__`); `initializer(init, shape, dtype)` makes a Tensor."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs

    def draw(self, shape: tuple[int, ...]) -> np.ndarray:
        """float64 values for a tensor of `shape`. A user's subclass may instead fill an array
        in MindSpore's `_initialize(arr)`."""
        fill = getattr(self, "_initialize", None)
        if fill is None:
            raise InputError(f"{type(self).__name__} defines neither draw(shape) nor "
                             "MindSpore's _initialize(arr)", user_location())
        arr = np.zeros(shape)
        fill(arr)
        return arr

    def __call__(self, arr: np.ndarray) -> None:
        if not isinstance(arr, np.ndarray):
            raise InputError(f"{type(self).__name__}() fills a numpy array, got a "
                             f"{type(arr).__name__}", user_location())
        arr[...] = self.draw(tuple(arr.shape))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._kwargs.items())
        return f"{type(self).__name__}({args})"


class Zero(Initializer):
    def draw(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape)


class One(Initializer):
    def draw(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.ones(shape)


class Constant(Initializer):
    def __init__(self, value: Any) -> None:
        super().__init__(value=value)
        self.value = _real("Constant", "value", value)

    def draw(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.full(shape, self.value, dtype=np.float64)


class Normal(Initializer):
    """N(mean, sigma^2)."""

    def __init__(self, sigma: float = 0.01, mean: float = 0.0) -> None:
        super().__init__(sigma=sigma, mean=mean)
        self.sigma = _real("Normal", "sigma", sigma, non_negative=True)
        self.mean = _real("Normal", "mean", mean)

    def draw(self, shape: tuple[int, ...]) -> np.ndarray:
        return _rng.normal(self.mean, self.sigma, shape)


class TruncatedNormal(Initializer):
    """N(mean, sigma^2) redrawn until every value lies within [mean + a*sigma, mean + b*sigma]
    (two standard deviations either side by default, as MindSpore documents)."""

    def __init__(self, sigma: float = 0.01, mean: float = 0.0, a: float = -2.0,
                 b: float = 2.0) -> None:
        super().__init__(sigma=sigma, mean=mean, a=a, b=b)
        sigma = _real("TruncatedNormal", "sigma", sigma, non_negative=True)
        mean = _real("TruncatedNormal", "mean", mean)
        a, b = _real("TruncatedNormal", "a", a), _real("TruncatedNormal", "b", b)
        if not a < b:
            raise InputError(f"TruncatedNormal: the bounds a={a} and b={b} leave no interval",
                             user_location())
        self.sigma, self.mean, self.a, self.b = sigma, mean, a, b

    def draw(self, shape: tuple[int, ...]) -> np.ndarray:
        low, high = self.mean + self.a * self.sigma, self.mean + self.b * self.sigma
        values = _rng.normal(self.mean, self.sigma, shape)
        if self.sigma == 0:
            return values
        while np.any(bad := (values < low) | (values > high)):
            values[bad] = _rng.normal(self.mean, self.sigma, int(bad.sum()))
        return values


class Uniform(Initializer):
    """U(-scale, scale)."""

    def __init__(self, scale: float = 0.07) -> None:
        super().__init__(scale=scale)
        self.scale = _real("Uniform", "scale", scale, non_negative=True)

    def draw(self, shape: tuple[int, ...]) -> np.ndarray:
        return _rng.uniform(-self.scale, self.scale, shape)


class XavierUniform(Initializer):
    """U(-bound, bound), bound = gain * sqrt(6 / (fan_in + fan_out))."""

    def __init__(self, gain: float = 1.0) -> None:
        super().__init__(gain=gain)
        self.gain = _real("XavierUniform", "gain", gain)

    def draw(self, shape: tuple[int, ...]) -> np.ndarray:
        fan_in, fan_out = _fans(shape)
        bound = self.gain * math.sqrt(6.0 / max(fan_in + fan_out, 1))
        return _rng.uniform(-bound, bound, shape)


class XavierNormal(Initializer):
    """N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out))."""

    def __init__(self, gain: float = 1.0) -> None:
        super().__init__(gain=gain)
        self.gain = _real("XavierNormal", "gain", gain)

    def draw(self, shape: tuple[int, ...]) -> np.ndarray:
        fan_in, fan_out = _fans(shape)
        return _rng.normal(0.0, self.gain * math.sqrt(2.0 / max(fan_in + fan_out, 1)), shape)


class _He(Initializer):
    def __init__(self, negative_slope: float = 0.0, mode: str = "fan_in",
                 nonlinearity: str = "leaky_relu") -> None:
        super().__init__(negative_slope=negative_slope, mode=mode, nonlinearity=nonlinearity)
        if mode not in ("fan_in", "fan_out"):
            raise InputError(f"{type(self).__name__}: mode must be 'fan_in' or 'fan_out', got "
                             f"{mode!r}", user_location())
        self.negative_slope = _real(type(self).__name__, "negative_slope", negative_slope)
        self.mode, self.nonlinearity = mode, nonlinearity
        calculate_gain(nonlinearity, self.negative_slope)  # an unknown name is refused now

    def _std(self, shape: tuple[int, ...]) -> float:
        fan_in, fan_out = _fans(shape)
        fan = fan_in if self.mode == "fan_in" else fan_out
        return calculate_gain(self.nonlinearity, self.negative_slope) / math.sqrt(max(fan, 1))


class HeUniform(_He):
    """U(-bound, bound), bound = gain * sqrt(3 / fan) (Kaiming uniform)."""

    def draw(self, shape: tuple[int, ...]) -> np.ndarray:
        bound = math.sqrt(3.0) * self._std(shape)
        return _rng.uniform(-bound, bound, shape)


class HeNormal(_He):
    """N(0, std^2), std = gain / sqrt(fan) (Kaiming normal)."""

    def draw(self, shape: tuple[int, ...]) -> np.ndarray:
        return _rng.normal(0.0, self._std(shape), shape)


# MindSpore's names for them, compared without case or underscores.
_BY_NAME: dict[str, type[Initializer]] = {
    "zeros": Zero, "zero": Zero, "ones": One, "one": One, "normal": Normal,
    "truncatednormal": TruncatedNormal, "uniform": Uniform, "xavieruniform": XavierUniform,
    "xaviernormal": XavierNormal, "heuniform": HeUniform, "henormal": HeNormal,
}


def _by_name(name: str, **params: Any) -> Initializer:
    key = name.lower().replace("_", "")
    if key not in _BY_NAME:
        raise InputError(f"unknown initializer {name!r}; graphkernel has 'normal', 'zeros', "
                         "'ones', 'uniform', 'truncatednormal', 'xavier_uniform', "
                         "'xavier_normal', 'he_uniform', 'he_normal'", user_location())
    try:
        return _BY_NAME[key](**params)
    except TypeError as err:
        raise InputError(f"initializer {name!r}: {err}", user_location()) from None


def draw(name: str, shape: tuple[int, ...], **params: Any) -> np.ndarray:
    """float64 values of one named initialiser with its arguments (`sigma`, `scale`, ...)."""
    return _by_name(name, **params).draw(shape)


def _shape_of(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise InputError(f"initializer: shape must be an int or a list of ints, got "
                         f"{shape!r}", user_location()) from None
    if any(d < 0 for d in dims):
        raise InputError(f"initializer: shape {dims} has a negative size", user_location())
    return dims


def init_array(init: Any, shape: Any, dtype: Any = T.float32, **params: Any) -> np.ndarray:
    """The values `initializer` gives, drawn now as a numpy array (for the layers' own
    weights): `init` is a name (with `params`), an Initializer, a number, a Tensor or an array."""
    dims = _shape_of(shape)
    dtype = T.to_dtype(dtype)
    if isinstance(init, str):
        return _by_name(init, **params).draw(dims).astype(dtype)
    if isinstance(init, Initializer):
        return init.draw(dims).astype(dtype)
    if isinstance(init, (int, float, np.integer, np.floating)) and not isinstance(init, bool):
        return np.full(dims, init, dtype)
    if not isinstance(init, (Tensor, np.ndarray, list, tuple)):
        raise InputError(f"initializer: init must be a name, an Initializer, a number, a Tensor "
                         f"or an array, got a {type(init).__name__}", user_location())
    array = init.asnumpy() if isinstance(init, Tensor) else np.asarray(init)
    if tuple(array.shape) != dims:
        raise InputError(f"initial value has shape {tuple(array.shape)}, the parameter needs "
                         f"{dims}", user_location())
    return array.astype(dtype)


class InitializedTensor(Tensor):
    """What `initializer(...)` returns: a Tensor whose values are drawn when first read
    (`init_data()`, `asnumpy()`, a Parameter or `set_data` made from it), as MindSpore's
    lazily initialised tensors are. Its shape and dtype are known before."""

    def __init__(self, init: Initializer | np.ndarray, shape: tuple[int, ...],
                 dtype: np.dtype) -> None:
        self.init = init
        self._init_shape, self._init_dtype = shape, dtype
        self._data: np.ndarray | None = None

    @property
    def _array(self) -> np.ndarray:
        if self._data is None:
            init = self.init
            values = init if isinstance(init, np.ndarray) else init.draw(self._init_shape)
            self._data = np.ascontiguousarray(values, dtype=self._init_dtype)
        return self._data

    @_array.setter
    def _array(self, value: np.ndarray) -> None:
        self._data = value

    def init_data(self) -> Tensor:
        """Draw the values now (MindSpore's `Tensor.init_data`); the tensor itself, drawn."""
        self._array  # noqa: B018  (reading it draws)
        return self

    @property
    def shape(self) -> tuple[Any, ...]:
        return self._init_shape

    @property
    def dtype(self) -> np.dtype:
        return self._init_dtype

    def __repr__(self) -> str:
        if self._data is None:
            return (f"Tensor(shape={list(self._init_shape)}, dtype={self._init_dtype.name}, "
                    f"init={self.init!r})")
        return super().__repr__()


def initializer(init: Any, shape: Any = None, dtype: Any = T.float32,
                **params: Any) -> Tensor:
    """MindSpore's `initializer(init, shape, dtype)`: a Tensor of `shape` and `dtype` whose
    values `init` gives (an Initializer such as `HeNormal()`, its name, a number, a Tensor or
    an array), drawn when the tensor is first read."""
    if isinstance(init, (Tensor, np.ndarray)) and shape is None:
        shape = init.shape
    if shape is None:
        raise InputError(f"initializer({init!r}) needs a shape", user_location())
    dims = _shape_of(shape)
    dtype = T.to_dtype(dtype)
    if isinstance(init, str):
        init = _by_name(init, **params)
    elif isinstance(init, (int, float, np.integer, np.floating)) and not isinstance(init, bool):
        init = Constant(init)
    elif not isinstance(init, Initializer):
        init = init_array(init, dims, dtype)  # a Tensor or an array: checked now
    return InitializedTensor(init, dims, dtype)


__all__ = ["Constant", "HeNormal", "HeUniform", "Initializer", "InitializedTensor", "Normal",
           "One", "TruncatedNormal", "Uniform", "XavierNormal", "XavierUniform", "Zero",
           "calculate_gain", "init_array", "initializer", "set_seed"]
