"""MindSpore's `mindspore.numpy`: numpy's names on graphkernel Tensors, for the functions
MindSpore model code (MindCV) calls. Each is built from the primitives, so it traces, fuses and
differentiates like them in graph mode and runs op by op in PyNative mode; array creation
(`ones`, `arange`, ...) gives constant Tensors. Defaults follow mindspore.numpy: float32 for
floats, int32 for ints. A name not here yet is an UnsupportedError saying so."""
from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from graphkernel.errors import InputError, ShapeError, UnsupportedError
from graphkernel.frontend.location import user_location
from graphkernel.frontend.tensor import Tensor
from graphkernel.ir import types as T
from graphkernel.ops import operations as P


def _tensor(x: Any, what: str) -> Tensor:
    """A Tensor operand: Tensors stay, array_likes (lists, numbers, arrays) become constants."""
    if isinstance(x, Tensor):
        return x
    try:
        return Tensor(np.asarray(x))
    except (TypeError, ValueError) as err:
        raise InputError(f"mindspore.numpy.{what}: cannot make a tensor of a "
                         f"{type(x).__name__} ({err})", user_location()) from None


def _axis(axis: Any, ndim: int, what: str) -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or \
            not -ndim <= axis < builtins.max(ndim, 1):
        raise ShapeError(f"mindspore.numpy.{what}: axis {axis!r} is out of range for a "
                         f"rank-{ndim} tensor", user_location())
    return int(axis) % builtins.max(ndim, 1)


def _shape(shape: Any, what: str) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    try:
        out = tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        raise InputError(f"mindspore.numpy.{what}: shape must be an int or a tuple of ints, "
                         f"got {shape!r}", user_location()) from None
    if builtins.any(d < 0 for d in out):
        raise ShapeError(f"mindspore.numpy.{what}: shape {out} has a negative size",
                         user_location())
    return out


def _dtype(dtype: Any, default: np.dtype) -> np.dtype:
    return default if dtype is None else T.to_dtype(dtype)


# -- creation: constants ----------------------------------------------------------------------
def full(shape: Any, fill_value: Any, dtype: Any = None) -> Tensor:
    """A tensor of `shape` filled with `fill_value` (its dtype by default, as numpy's)."""
    if dtype is None:
        dtype = T.float32 if isinstance(fill_value, float) else \
            T.int32 if isinstance(fill_value, int) and not isinstance(fill_value, bool) else \
            np.asarray(fill_value).dtype
    return Tensor(np.full(_shape(shape, "full"), fill_value, T.to_dtype(dtype)))


def ones(shape: Any, dtype: Any = None) -> Tensor:
    return Tensor(np.ones(_shape(shape, "ones"), _dtype(dtype, T.float32)))


def zeros(shape: Any, dtype: Any = None) -> Tensor:
    return Tensor(np.zeros(_shape(shape, "zeros"), _dtype(dtype, T.float32)))


def _number(x: Any, what: str) -> float | int:
    if isinstance(x, Tensor) and not x.is_symbolic and x.ndim == 0:
        return x.asnumpy().item()
    if not isinstance(x, (int, float, np.integer, np.floating)) or isinstance(x, bool):
        raise UnsupportedError(f"mindspore.numpy.{what} takes Python numbers here, got a "
                               f"{type(x).__name__}", user_location())
    return x.item() if isinstance(x, np.generic) else x


def arange(start: Any, stop: Any = None, step: Any = None, dtype: Any = None) -> Tensor:
    """Evenly spaced values in [start, stop): int32 for int arguments, else float32."""
    bounds = [_number(v, "arange") for v in (start, stop, step) if v is not None]
    if step is not None and bounds[-1] == 0:
        raise InputError("mindspore.numpy.arange: step must not be zero", user_location())
    default = T.int32 if builtins.all(isinstance(v, int) for v in bounds) else T.float32
    if stop is None:
        bounds = [0, bounds[0]] + bounds[1:]
    return Tensor(np.arange(*bounds).astype(_dtype(dtype, default)))


def linspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True,
             retstep: bool = False, dtype: Any = None, axis: int = 0) -> Any:
    """`num` evenly spaced values from start to stop (float32 by default)."""
    if axis != 0:
        raise UnsupportedError("mindspore.numpy.linspace: only axis=0 (number bounds) is "
                               "supported", user_location())
    if int(num) < 0:
        raise InputError(f"mindspore.numpy.linspace: num must be non-negative, got {num}",
                         user_location())
    values, step = np.linspace(_number(start, "linspace"), _number(stop, "linspace"), int(num),
                               endpoint=endpoint, retstep=True)
    out = Tensor(values.astype(_dtype(dtype, T.float32)))
    return (out, step) if retstep else out


# -- joining and splitting ------------------------------------------------------------------
def concatenate(arrays: Any, axis: Any = 0) -> Tensor:
    """Tensors joined along an existing axis (axis=None: flattened first, as numpy)."""
    tensors = [_tensor(a, "concatenate") for a in arrays]
    if not tensors:
        raise InputError("mindspore.numpy.concatenate needs at least one tensor", user_location())
    if axis is None:
        tensors = [P.Reshape()(t, (-1,)) for t in tensors]
        axis = 0
    return P.Concat(_axis(axis, tensors[0].ndim, "concatenate"))(tuple(tensors))


def stack(arrays: Any, axis: int = 0) -> Tensor:
    """Tensors of one shape joined along a new axis."""
    tensors = [_tensor(a, "stack") for a in arrays]
    if not tensors:
        raise InputError("mindspore.numpy.stack needs at least one tensor", user_location())
    return P.Stack(_axis(axis, tensors[0].ndim + 1, "stack"))(tuple(tensors))


def _slice(x: Tensor, axis: int, start: int, stop: int) -> Tensor:
    begin = [0] * x.ndim
    size = list(x.shape)
    begin[axis], size[axis] = start, stop - start
    return P.Slice()(x, tuple(begin), tuple(size))


def split(x: Any, indices_or_sections: Any, axis: int = 0) -> tuple[Tensor, ...]:
    """numpy's split: `n` equal pieces (n must divide the axis), or pieces cut at the listed
    indices."""
    x = _tensor(x, "split")
    axis = _axis(axis, x.ndim, "split")
    size = x.shape[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        n = int(indices_or_sections)
        if n < 1 or size % n:
            raise ShapeError(f"mindspore.numpy.split: {n} sections do not divide axis {axis} "
                             f"of size {size} equally", user_location())
        return tuple(P.Split(axis, n)(x)) if n > 1 else (x,)
    cuts = [builtins.min(builtins.max(int(i) + (size if int(i) < 0 else 0), 0), size)
            for i in indices_or_sections]
    bounds = [0, *cuts, size]
    return tuple(_slice(x, axis, start, builtins.max(start, stop))
                 for start, stop in zip(bounds, bounds[1:]))


def roll(a: Any, shift: Any, axis: Any = None) -> Tensor:
    """Elements shifted along `axis` (or the flattened tensor), those past the end coming back
    at the start: two slices and a concatenation per axis."""
    x = _tensor(a, "roll")
    if axis is None:
        flat = roll(P.Reshape()(x, (-1,)), shift, 0)
        return P.Reshape()(flat, x.shape)
    try:
        pairs = np.broadcast(np.asarray(shift), np.asarray(axis))
    except ValueError:
        raise ShapeError(f"mindspore.numpy.roll: shift {shift!r} and axis {axis!r} do not "
                         "match", user_location()) from None
    if np.asarray(shift).dtype.kind not in "iu" or np.asarray(axis).dtype.kind not in "iu":
        raise InputError(f"mindspore.numpy.roll: shift and axis must be ints, got {shift!r} and "
                         f"{axis!r}", user_location())
    for step, ax in pairs:
        ax = _axis(int(ax), x.ndim, "roll")
        n = x.shape[ax]
        step = int(step) % n if n else 0
        if step:
            x = P.Concat(ax)((_slice(x, ax, n - step, n), _slice(x, ax, 0, n - step)))
    return x


def tile(a: Any, reps: Any) -> Tensor:
    """`a` repeated `reps` times along each axis (numpy's rule when their lengths differ)."""
    x = _tensor(a, "tile")
    reps = _shape(reps, "tile")
    if len(reps) > x.ndim:
        x = P.Reshape()(x, (1,) * (len(reps) - x.ndim) + tuple(x.shape))
    reps = (1,) * (x.ndim - len(reps)) + reps
    return P.Tile()(x, reps)


# -- element-wise ---------------------------------------------------------------------------
def where(condition: Any, x: Any = None, y: Any = None) -> Tensor:
    """x where condition holds, else y (broadcast)."""
    if x is None or y is None:
        raise UnsupportedError("mindspore.numpy.where(condition) alone (the indices of true "
                               "elements) has a data-dependent shape: give x and y",
                               user_location())
    cond = _tensor(condition, "where")
    if cond.dtype != T.bool_:
        cond = P.Cast()(cond, T.bool_)
    return P.Select()(cond, x, y)


def clip(a: Any, a_min: Any, a_max: Any, dtype: Any = None) -> Tensor:
    """Values limited to [a_min, a_max] (either may be None)."""
    if a_min is None and a_max is None:
        raise InputError("mindspore.numpy.clip: give a_min or a_max", user_location())
    x = _tensor(a, "clip")
    if a_min is not None:
        x = P.Maximum()(x, a_min)
    if a_max is not None:
        x = P.Minimum()(x, a_max)
    return x if dtype is None else P.Cast()(x, dtype)


# -- products -------------------------------------------------------------------------------
def tensordot(a: Any, b: Any, axes: Any = 2) -> Tensor:
    """Sum of products over a's `axes[0]` and b's `axes[1]` (an int n: a's last n, b's first
    n): transposed and reshaped to one MatMul."""
    a, b = _tensor(a, "tensordot"), _tensor(b, "tensordot")
    if isinstance(axes, (int, np.integer)):
        n = int(axes)
        if not 0 <= n <= builtins.min(a.ndim, b.ndim):
            raise ShapeError(f"mindspore.numpy.tensordot: axes={n} for ranks {a.ndim} and "
                             f"{b.ndim}", user_location())
        sum_a, sum_b = list(range(a.ndim - n, a.ndim)), list(range(n))
    else:
        first, second = axes
        sum_a = [_axis(i, a.ndim, "tensordot") for i in np.atleast_1d(first)]
        sum_b = [_axis(i, b.ndim, "tensordot") for i in np.atleast_1d(second)]
    if len(sum_a) != len(sum_b) or [a.shape[i] for i in sum_a] != [b.shape[i] for i in sum_b]:
        raise ShapeError(f"mindspore.numpy.tensordot: axes {sum_a} of {a.shape} and {sum_b} of "
                         f"{b.shape} do not match", user_location())
    free_a = [i for i in range(a.ndim) if i not in sum_a]
    free_b = [i for i in range(b.ndim) if i not in sum_b]
    k = math.prod(a.shape[i] for i in sum_a)
    lhs = P.Reshape()(P.Transpose()(a, tuple(free_a + sum_a)),
                      (math.prod(a.shape[i] for i in free_a), k))
    rhs = P.Reshape()(P.Transpose()(b, tuple(sum_b + free_b)),
                      (k, math.prod(b.shape[i] for i in free_b)))
    out = P.MatMul()(lhs, rhs)
    return P.Reshape()(out, tuple(a.shape[i] for i in free_a) +
                       tuple(b.shape[i] for i in free_b))


__all__ = ["arange", "clip", "concatenate", "full", "linspace", "ones", "roll", "split", "stack",
           "tensordot", "tile", "where", "zeros"]


def __getattr__(name: str) -> Any:
    """A mindspore.numpy name graphkernel does not have yet: say so, and what there is."""
    if name.startswith("_"):
        raise AttributeError(name)
    raise UnsupportedError(f"graphkernel.numpy (mindspore.numpy) has no {name!r} yet; it has "
                           f"{', '.join(__all__)}. Other numpy functions can be written with "
                           "the primitives in graphkernel.ops", user_location())
