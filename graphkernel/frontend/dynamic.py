"""Dynamic dimensions: which input dimensions a compiled graph leaves symbolic.

Two ways a dimension becomes a symbol (`ir.types.SymSize`), so that one compiled graph (one
library) serves every size of it:
- declared: `Cell.set_inputs(Tensor(shape=[None, 64], dtype=float32))`, MindSpore's API; every
  None is its own symbol (N, M, K, ... in order);
- automatic (no set_inputs; context `automatic_dynamic_shapes`, on by default): when a cell is
  called with a second value of a dimension, the next compile makes that dimension symbolic.
  Dimensions whose values were equal in every call so far share one symbol (a batch axis of two
  inputs). A dimension that was 1 becomes symbolic like any other once it varies; a symbol never
  broadcasts, so where the graph needs it to (it meets a static size other than 1) tracing fails
  and that call compiles for its static shapes instead, as does any graph that cannot be
  shape-generic (a mean over a dynamic axis); those input ranks and dtypes then stay static.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.location import user_location
from graphkernel.ir import types as T
from graphkernel.ir.types import SymSize, TensorType, shape_fits

SYMBOL_NAMES = ("N", "M", "K", "L", "P", "Q", "R", "S")


def symbol_name(index: int) -> str:
    if index < len(SYMBOL_NAMES):
        return SYMBOL_NAMES[index]
    return f"N{index}"


def declared_types(cell: Any, tensors: Sequence[Any]) -> list[TensorType]:
    """The types `set_inputs` declares: each None (or -1) dimension a new symbol."""
    types, count = [], 0
    for i, t in enumerate(tensors):
        declared = getattr(t, "_declared", None)
        if declared is None:
            if not hasattr(t, "shape") or not hasattr(t, "dtype"):
                raise InputError(f"{type(cell).__name__}.set_inputs input {i} must be a Tensor "
                                 f"(Tensor(shape=[None, 64], dtype=float32)), got "
                                 f"{type(t).__name__}", user_location())
            declared = (tuple(t.shape), T.to_dtype(t.dtype))
        dims: list[int | SymSize] = []
        for d in declared[0]:
            if d is None:
                dims.append(SymSize.dim(symbol_name(count)))
                count += 1
            else:
                dims.append(int(d))
        types.append(TensorType(tuple(dims), declared[1]))
    return types


def type_text(t: TensorType) -> str:
    return f"{t.dtype.name}[{', '.join(str(d) for d in t.shape)}]"


def mismatch(cell: Any, declared: Sequence[TensorType], inputs: Sequence[Any]) -> str | None:
    """Why a call does not match the declared inputs (naming both), or None."""
    name = type(cell).__name__
    if len(inputs) != len(declared):
        return (f"{name} was declared with set_inputs for {len(declared)} input(s), called with "
                f"{len(inputs)}")
    sizes: dict[str, int] = {}
    for i, (t, a) in enumerate(zip(declared, inputs)):
        shape, dtype = tuple(a.shape), np.dtype(a.dtype)
        got = f"{dtype.name}[{', '.join(str(d) for d in shape)}]"
        problem = ""
        if dtype != t.dtype or len(shape) != len(t.shape):
            problem = "dtype or rank differs"
        for axis, (want, have) in enumerate(zip(t.shape, shape)):
            if problem:
                break
            if isinstance(want, SymSize):
                bound = sizes.setdefault(want.names[0], have)
                if bound != have:
                    problem = f"{want} is {bound} in an earlier input, {have} here"
            elif want != have:
                problem = f"axis {axis} must be {want}"
        if problem:
            return (f"{name} input {i} is {got} but set_inputs declared {type_text(t)} "
                    f"({problem})")
    return None


def family(inputs: Sequence[Any]) -> tuple[Any, ...]:
    """Calls whose inputs have the same ranks and dtypes: one history of sizes."""
    return tuple((len(a.shape), np.dtype(a.dtype).str) for a in inputs)


def automatic_types(history: list[tuple[tuple[int, ...], ...]], inputs: Sequence[Any]
                    ) -> list[TensorType] | None:
    """The types of the next compile after `history` (earlier calls' shapes, this call last):
    varying dimensions symbolic, equal histories one symbol; None when nothing varies."""
    columns: dict[tuple[int, int], tuple[int, ...]] = {}
    for i, a in enumerate(inputs):
        for axis in range(len(a.shape)):
            columns[(i, axis)] = tuple(shapes[i][axis] for shapes in history)
    names: dict[tuple[int, ...], str] = {}
    types = []
    for i, a in enumerate(inputs):
        dims: list[int | SymSize] = []
        for axis, size in enumerate(a.shape):
            seen = columns[(i, axis)]
            if len(set(seen)) > 1:
                if seen not in names:
                    names[seen] = symbol_name(len(names))
                dims.append(SymSize.dim(names[seen]))
            else:
                dims.append(int(size))
        types.append(TensorType(tuple(dims), T.to_dtype(a.dtype)))
    return types if names else None


def matches(types: Sequence[TensorType], inputs: Sequence[Any]) -> bool:
    """Whether a call's arrays fit these (possibly symbolic) types."""
    sizes: dict[str, int] = {}
    return all(np.dtype(a.dtype) == t.dtype and shape_fits(tuple(a.shape), t.shape, sizes)
               for t, a in zip(types, inputs))
