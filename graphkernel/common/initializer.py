"""Weight initialisers by MindSpore's names ('normal', 'zeros', 'ones', 'xavier_uniform',
'he_uniform', 'he_normal', 'uniform', 'truncatednormal') with MindSpore's defaults, drawn from
one process-wide generator that `set_seed` reseeds (MindSpore's `set_seed`)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.errors import InputError
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


def _he_gain(negative_slope: float, nonlinearity: str) -> float:
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    return math.sqrt(2.0 / (1 + negative_slope ** 2))  # leaky_relu, MindSpore's default


def draw(name: str, shape: tuple[int, ...], **params: Any) -> np.ndarray:
    """float64 values of one named initialiser."""
    key = name.lower().replace("_", "")
    fan_in, fan_out = _fans(shape)
    if key == "zeros":
        return np.zeros(shape)
    if key == "ones":
        return np.ones(shape)
    if key == "normal":
        return _rng.normal(params.get("mean", 0.0), params.get("sigma", 0.01), shape)
    if key == "truncatednormal":
        sigma = params.get("sigma", 0.01)
        values = _rng.normal(0.0, sigma, shape)
        while np.any(bad := np.abs(values) > 2 * sigma):  # redraw outside two sigmas
            values[bad] = _rng.normal(0.0, sigma, int(bad.sum()))
        return values
    if key == "uniform":
        scale = params.get("scale", 0.07)
        return _rng.uniform(-scale, scale, shape)
    if key == "xavieruniform":
        bound = params.get("gain", 1.0) * math.sqrt(6.0 / max(fan_in + fan_out, 1))
        return _rng.uniform(-bound, bound, shape)
    if key in ("heuniform", "henormal"):
        gain = _he_gain(params.get("negative_slope", 0.0),
                        params.get("nonlinearity", "leaky_relu"))
        fan = fan_in if params.get("mode", "fan_in") == "fan_in" else fan_out
        if key == "heuniform":
            bound = gain * math.sqrt(3.0 / max(fan, 1))
            return _rng.uniform(-bound, bound, shape)
        return _rng.normal(0.0, gain / math.sqrt(max(fan, 1)), shape)
    raise InputError(f"unknown initializer {name!r}; graphkernel has 'normal', 'zeros', 'ones', "
                     "'uniform', 'truncatednormal', 'xavier_uniform', 'he_uniform', 'he_normal'")


def initializer(init: Any, shape: Any, dtype: Any = T.float32, **params: Any) -> np.ndarray:
    """MindSpore's `initializer(init, shape, dtype)`: a name, a number, a Tensor or an array."""
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    dtype = T.to_dtype(dtype)
    if isinstance(init, str):
        return draw(init, shape, **params).astype(dtype)
    if isinstance(init, (int, float)) and not isinstance(init, bool):
        return np.full(shape, init, dtype)
    array = init.asnumpy() if isinstance(init, Tensor) else np.asarray(init)
    if tuple(array.shape) != shape:
        raise InputError(f"initial value has shape {tuple(array.shape)}, the parameter needs "
                         f"{shape}")
    return array.astype(dtype)
