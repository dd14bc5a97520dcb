"""Dynamic dimensions: which input dimensions a compiled graph leaves symbolic.

Two ways a dimension becomes a symbol (`ir.types.SymSize`), so that one compiled graph (one
library) serves every size of it:
- declared: `Cell.set_inputs(Tensor(shape=[None, 64], dtype=float32))`, MindSpore's API; every
  None is its own symbol (N, M, K, ... in order), and so is every Symbol (frontend/symbol.py)
  except that the dimensions of one unique Symbol share one (a batch axis of data and labels);
  a Symbol's constraints are `SizeRule`s, checked on each call (a bare Symbol, min 1, has
  none: a size 0 runs as for None, and its cells keep the compiled entry's per-call path; a
  divisor with remainder 0 is in the type, 4*N);
- automatic (no set_inputs; context `automatic_dynamic_shapes`, on by default): when a cell is
  called with a second value of a dimension, the next compile makes that dimension symbolic.
  Dimensions whose values were equal in every call so far share one symbol (a batch axis of two
  inputs). A dimension that was 1 becomes symbolic like any other once it varies; a symbol never
  broadcasts, so where the graph needs it to (it meets a static size other than 1) tracing fails
  and that call compiles for its static shapes instead, as does any graph that cannot be
  shape-generic (a dynamic size used as a number); those input ranks and dtypes then stay
  static.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.location import user_location
from graphkernel.frontend.symbol import Symbol
from graphkernel.ir import types as T
from graphkernel.ir.types import SymSize, TensorType, shape_fits, symbol_name


@dataclass(frozen=True)
class SizeRule:
    """What the size of every input dimension carrying `symbol` must be, checked on each call:
    `remainder` modulo `divisor`, at least `min`, at most `max` (0: no bound). `origin` says who
    asked (a Symbol of set_inputs, a Reshape that needs a whole size)."""

    symbol: str
    origin: str
    divisor: int = 1
    remainder: int = 0
    min: int = 0
    max: int = 0

    def violation(self, size: int) -> str | None:
        """Why `size` breaks the rule (what it must be), or None."""
        if size < self.min:
            return f"at least {self.min}"
        if self.max and size > self.max:
            return f"at most {self.max}"
        if size % self.divisor != self.remainder:
            return (f"a multiple of {self.divisor}" if self.remainder == 0 else
                    f"{self.remainder} modulo {self.divisor}")
        return None


@dataclass(frozen=True)
class Declared:
    """What `set_inputs` declared: each input's type (dynamic dimensions as symbols) and the
    rules their sizes follow."""

    types: list[TensorType]
    rules: tuple[SizeRule, ...] = ()


def is_declaration(value: Any) -> bool:
    """Whether `value` is a Tensor that declares a shape and dtype without data
    (`Tensor(shape=[None, 64], dtype=float32)`)."""
    return getattr(value, "_declared", None) is not None and \
        getattr(value, "_array", None) is None


def _symbol_dim(symbol: Symbol, name: str) -> int | SymSize:
    """A Symbol's dimension: a multiple of its divisor is `divisor*name` (kernels and Reshape
    see that it divides), any other a plain symbol."""
    dim = SymSize.dim(name)
    return dim * symbol.divisor if symbol.remainder == 0 else dim


def declared_types(cell: Any, tensors: Sequence[Any]) -> Declared:
    """The types `set_inputs` declares: each None (or -1) dimension a new symbol, and each
    Symbol one too, except that the dimensions of one unique Symbol share theirs."""
    types: list[TensorType] = []
    rules: list[SizeRule] = []
    shared: dict[int, int | SymSize] = {}  # id of a unique Symbol -> its dimension
    count = 0
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
            if isinstance(d, Symbol) and d.unique and id(d) in shared:
                dims.append(shared[id(d)])
            elif d is None or isinstance(d, Symbol):
                name = symbol_name(count)
                count += 1
                if isinstance(d, Symbol):
                    dims.append(_symbol_dim(d, name))
                    if d.unique:
                        shared[id(d)] = dims[-1]
                    if d.min > 1 or d.bounded or d.remainder:  # more than its type says
                        rules.append(SizeRule(name, repr(d), d.divisor, d.remainder, d.min,
                                              d.max if d.bounded else 0))
                else:
                    dims.append(SymSize.dim(name))
            else:
                dims.append(int(d))
        types.append(TensorType(tuple(dims), declared[1]))
    return Declared(types, tuple(rules))


def type_text(t: TensorType) -> str:
    return f"{t.dtype.name}[{', '.join(str(d) for d in t.shape)}]"


def _bind(want: SymSize, have: int, sizes: dict[str, int]) -> str:
    """Bind `want`'s symbol from a dimension of size `have`; why it does not fit, or ''."""
    name = want.names[0]
    if have % want.coef:
        return f"axis size {have} must be a multiple of {want.coef}"
    bound = sizes.setdefault(name, have // want.coef)
    if bound != have // want.coef:
        return f"{want} is {bound * want.coef} in an earlier input, {have} here"
    return ""


def mismatch(cell: Any, declared: Sequence[TensorType], inputs: Sequence[Any],
             rules: Sequence[SizeRule] = ()) -> str | None:
    """Why a call does not match the declared inputs (naming both), or None; then why a size
    breaks one of `rules` (naming the input, its axis and the rule's origin), or None."""
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
                problem = _bind(want, have, sizes)
                problem = problem and f"axis {axis}: {problem}"
            elif want != have:
                problem = f"axis {axis} must be {want}"
        if problem:
            return (f"{name} input {i} is {got} but set_inputs declared {type_text(t)} "
                    f"({problem})")
    return broken_rule(name, declared, inputs, rules)


def broken_rule(name: str, types: Sequence[TensorType], inputs: Sequence[Any],
                rules: Sequence[SizeRule]) -> str | None:
    """The first input dimension (of inputs that fit `types`) whose size breaks a rule on its
    symbol, as a message naming the input, the axis and the rule's origin; or None."""
    if not rules:
        return None
    by_symbol: dict[str, list[SizeRule]] = {}
    for rule in rules:
        by_symbol.setdefault(rule.symbol, []).append(rule)
    for i, (t, a) in enumerate(zip(types, inputs)):
        for axis, (want, have) in enumerate(zip(t.shape, a.shape)):
            if not isinstance(want, SymSize):
                continue
            for rule in by_symbol.get(want.names[0], ()):
                need = rule.violation(int(have))
                if need is not None:
                    return (f"{name} input {i} axis {axis} is {have}, but it must be {need} "
                            f"({rule.origin})")
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
