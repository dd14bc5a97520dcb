"""Shape ops (injective): Reshape, Transpose, ExpandDims, Squeeze, BroadcastTo, Tile. They run as
numpy views or copies between kernels, except where graph_kernel/schedule.py lets them fuse."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.errors import ShapeError
from graphkernel.ir import types as T
from graphkernel.ir.opset import AttrKind, OpDef, PatternKind, declare
from graphkernel.ir.types import TensorType, ValueType


def _reshape_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    """A -1 takes what the other sizes leave. Of a dynamic size it may need a symbol to be a
    multiple of something (T.SizeMultipleNeeded: [N, 6] into (-1, 4) needs N even); a shape
    may hold dynamic sizes itself (a gradient's Reshape back to its input's shape)."""
    (x,) = types
    shape = tuple(d if isinstance(d, T.SymSize) else int(d) for d in attrs["shape"])
    what = f"Reshape of {x.shape} into {shape}"
    if shape.count(-1) > 1:
        raise ShapeError(f"Reshape: at most one -1 in shape {shape}")
    if -1 in shape:
        known = math.prod([d for d in shape if d != -1])
        shape = tuple(T.quotient(x.size, known, what) if d == -1 else d for d in shape)
    if any(isinstance(d, int) and d < 0 for d in shape) or math.prod(shape) != x.size:
        dynamic = " (a dynamic size cannot become a static one: give -1 for the dimension " \
            "that holds it)" if isinstance(x.size, T.SymSize) and \
            not isinstance(math.prod(shape), T.SymSize) else ""
        raise ShapeError(f"Reshape: cannot reshape {x.shape} ({x.size} elements) into "
                         f"{shape}{dynamic}")
    return TensorType(shape, x.dtype)


def _reshape_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    """Reshape, ExpandDims, Squeeze: the gradient takes the input's shape back."""
    return [b("Reshape", dy, shape=n.inputs[0].shape)]


# Reshape, ExpandDims and Squeeze join fused kernels when they only add or drop leading unit
# dims (a no-op under right-aligned broadcasting: graph_kernel/schedule.py checks); otherwise
# they run as numpy views between kernels.
declare(OpDef(name="Reshape", kind=PatternKind.INJECTIVE, inputs=("x",), infer=_reshape_infer,
              reference=lambda x, shape: np.reshape(x, shape), call_attrs=(("shape", None),),
              view=True, grad=_reshape_grad, int_tuple_attrs=("shape",),
              attr_kinds=(("shape", AttrKind.SHAPE),)))


def _transpose_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"Transpose: perm {perm} is not a permutation of the {x.rank} axes "
                         f"of a tensor of shape {x.shape}")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _transpose_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    return [b("Transpose", dy, perm=tuple(int(i) for i in np.argsort(attrs["perm"])))]


declare(OpDef(name="Transpose", kind=PatternKind.INJECTIVE, inputs=("x",),
              infer=_transpose_infer, reference=lambda x, perm: np.transpose(x, perm),
              call_attrs=(("perm", None),), grad=_transpose_grad, int_tuple_attrs=("perm",),
              kernel_alone=True))


def _expand_dims_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    axis = attrs["axis"]
    if not isinstance(axis, (int, np.integer)) or not -x.rank - 1 <= axis <= x.rank:
        raise ShapeError(f"ExpandDims: axis {axis!r} out of range for rank {x.rank}")
    axis = axis % (x.rank + 1)
    return TensorType(x.shape[:axis] + (1,) + x.shape[axis:], x.dtype)


declare(OpDef(name="ExpandDims", kind=PatternKind.INJECTIVE, inputs=("x",),
              infer=_expand_dims_infer, reference=lambda x, axis: np.expand_dims(x, axis),
              call_attrs=(("axis", None),), view=True,
              attr_kinds=(("axis", AttrKind.INT),),
              grad=_reshape_grad))


def _squeeze_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    axis = attrs["axis"]
    axes = tuple(i for i, d in enumerate(x.shape) if d == 1) if axis in ((), None) else \
        T.normalize_axes(axis, x.rank)
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeError(f"Squeeze: axis {a} of shape {x.shape} has size {x.shape[a]}, not 1")
    return TensorType(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)


def _squeeze_ref(x: np.ndarray, axis: Any = ()) -> np.ndarray:
    axes = tuple(i for i, d in enumerate(x.shape) if d == 1) if axis in ((), None) else \
        T.normalize_axes(axis, x.ndim)
    return np.squeeze(x, axis=axes)


declare(OpDef(name="Squeeze", kind=PatternKind.INJECTIVE, inputs=("x",), infer=_squeeze_infer,
              reference=_squeeze_ref, init_attrs=(("axis", ()),),
              view=True, grad=_reshape_grad))


def _broadcast_to_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    # Dynamic sizes stay (a gradient's BroadcastTo back to its input's shape [N, 4]).
    target = tuple(d if isinstance(d, T.SymSize) else int(d) for d in attrs["shape"])
    target = tuple(x.shape[i - len(target) + x.rank] if d == -1 else d
                   for i, d in enumerate(target))
    if T.broadcast_shapes(x.shape, target) != target:
        raise ShapeError(f"BroadcastTo: shape {x.shape} cannot broadcast to {target}")
    return TensorType(target, x.dtype)


def _broadcast_to_ref(x: np.ndarray, shape: Any) -> np.ndarray:
    target = _broadcast_to_infer((TensorType(x.shape, x.dtype),), {"shape": shape})
    return np.broadcast_to(x, target.shape)  # type: ignore[union-attr]  # a TensorType


declare(OpDef(name="BroadcastTo", kind=PatternKind.BROADCAST, inputs=("x",),
              infer=_broadcast_to_infer, reference=_broadcast_to_ref,
              init_attrs=(("shape", None),),
              grad=lambda b, n, dy, attrs: [b.sum_to(dy, n.inputs[0].shape)],
              int_tuple_attrs=("shape",), attr_kinds=(("shape", AttrKind.SHAPE),)))


def _tile_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (x,) = types
    mult = tuple(int(m) for m in attrs["multiples"])
    if len(mult) < x.rank or any(m < 0 for m in mult):
        raise ShapeError(f"Tile: multiples {mult} must be non-negative and at least rank "
                         f"{x.rank} for shape {x.shape}")
    shape = (1,) * (len(mult) - x.rank) + x.shape
    return TensorType(tuple(d * m for d, m in zip(shape, mult)), x.dtype)


def _tile_grad(b: Any, n: Any, dy: Any, attrs: dict[str, Any]) -> list[Any]:
    """Each output axis of size m*d is m copies of d: split it, sum the copies."""
    x = n.inputs[0]
    mult = tuple(int(m) for m in attrs["multiples"])
    shape = (1,) * (len(mult) - len(x.shape)) + x.shape
    split = tuple(v for m, d in zip(mult, shape) for v in (m, d))
    summed = b("ReduceSum", b("Reshape", dy, shape=split), axis=tuple(range(0, len(split), 2)))
    return [b("Reshape", summed, shape=x.shape)]


declare(OpDef(name="Tile", kind=PatternKind.INJECTIVE, inputs=("x",), infer=_tile_infer,
              reference=lambda x, multiples: np.tile(x, multiples),
              call_attrs=(("multiples", None),), grad=_tile_grad, int_tuple_attrs=("multiples",)))
