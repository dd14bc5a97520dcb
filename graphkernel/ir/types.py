"""Tensor types: dtypes, shapes, broadcasting and scalar promotion rules."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, ShapeError

float16 = np.dtype("float16")
float32 = np.dtype("float32")
float64 = np.dtype("float64")
int32 = np.dtype("int32")
int64 = np.dtype("int64")
bool_ = np.dtype("bool")

SUPPORTED_DTYPES: tuple[np.dtype, ...] = (float16, float32, float64, int32, int64, bool_)
FLOAT_DTYPES = (float16, float32, float64)
INT_DTYPES = (int32, int64)

def to_dtype(value: object) -> np.dtype:
    """Normalise a dtype-like (numpy dtype, type, or name) to a supported numpy dtype."""
    try:
        dt = np.dtype(value)  # type: ignore[call-overload]  # anything: np.dtype judges
    except TypeError as exc:
        raise DTypeError(f"not a dtype: {value!r}") from exc
    if not dt.isnative:
        dt = dt.newbyteorder("=")  # a value's byte order is the runtime's business, not its type
    if dt not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise DTypeError(f"dtype {dt.name} is not supported; supported dtypes: {names}")
    return dt


def is_float(dt: np.dtype) -> bool:
    return dt in FLOAT_DTYPES


def is_int(dt: np.dtype) -> bool:
    return dt in INT_DTYPES


class SymSize:
    """A size known only at run time: `coef` times the product of named dimensions (a shape
    holds single symbols, `SymSize.dim("N")`; products appear as sizes and strides). Its text is
    its C expression too: generated kernels read each symbol into a local of that name.
    Ordering it against a number is undecidable at compile time, so it raises: callers decide
    at run time instead (a threading test in the kernel, a pool keyed on the actual shape)."""

    __slots__ = ("coef", "names")

    def __init__(self, coef: int, names: tuple[str, ...]) -> None:
        self.coef = coef
        self.names = tuple(sorted(names))

    @classmethod
    def dim(cls, name: str) -> SymSize:
        return cls(1, (name,))

    def __mul__(self, other: object) -> int | SymSize:
        if isinstance(other, SymSize):
            return SymSize(self.coef * other.coef, self.names + other.names)
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return 0 if other == 0 else SymSize(self.coef * int(other), self.names)
        return NotImplemented

    __rmul__ = __mul__

    def __floordiv__(self, other: object) -> SymSize:
        if isinstance(other, int) and other > 0 and self.coef % other == 0:
            return SymSize(self.coef // other, self.names)
        raise ShapeError(f"{self} is not a multiple of {other} for every value of "
                         f"{', '.join(self.names)}")

    def __mod__(self, other: object) -> int:
        if isinstance(other, int) and other > 0:
            return self.coef % other
        raise ShapeError(f"{self} modulo {other} is not known before run time")

    def __rtruediv__(self, other: object) -> float:
        raise ShapeError(f"dividing by the dynamic size {self}: its value is known only at run "
                         "time (declare that dimension static)")

    def _undecidable(self, other: object) -> bool:
        raise ShapeError(f"the dynamic size {self} cannot be compared with {other!r} at compile "
                        "time")

    __lt__ = __le__ = __gt__ = __ge__ = _undecidable

    def __index__(self) -> int:
        raise ShapeError(f"the dynamic size {self} has no value while tracing; shape arguments "
                         "take -1 for a dynamic dimension (Reshape) or static sizes")

    __int__ = __index__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SymSize) and (self.coef, self.names) == (other.coef, other.names)

    def __hash__(self) -> int:
        return hash((self.coef, self.names))

    def __str__(self) -> str:
        return "*".join(([str(self.coef)] if self.coef != 1 else []) + list(self.names))

    __repr__ = __str__

    def value(self, sizes: dict[str, int]) -> int:
        return self.coef * math.prod(sizes[n] for n in self.names)


Dim = int | SymSize

# The names the compiler gives symbols (frontend/dynamic.py, the ONNX importer), in order. They
# become C locals of generated kernels, so a name read from a file must be one of these.
SYMBOL_NAMES = ("N", "M", "K", "L", "P", "Q", "R", "S")
MAX_SYMBOLS = 4096


def symbol_name(index: int) -> str:
    """The name of the `index`-th symbol of a graph."""
    if index < len(SYMBOL_NAMES):
        return SYMBOL_NAMES[index]
    return f"N{index}"


def is_symbol_name(name: object) -> bool:
    """Whether `name` is one the compiler gives (`symbol_name` of some index)."""
    if not isinstance(name, str):
        return False
    if name in SYMBOL_NAMES:
        return True
    digits = name[1:]
    return (name[:1] == "N" and digits.isascii() and digits.isdigit() and
            digits == str(int(digits)) and len(SYMBOL_NAMES) <= int(digits) < MAX_SYMBOLS)


class SizeMultipleNeeded(ShapeError):
    """A size that is whole only when the symbol `symbol` is a multiple of `factor` (a Reshape's
    -1 of [N, 6] into (-1, 4) needs N even). The compiler may declare the symbol so (its
    dimensions become factor*N, checked on each call) and trace again; uncaught it is a plain
    ShapeError."""

    def __init__(self, message: str, symbol: str, factor: int) -> None:
        super().__init__(message)
        self.symbol = symbol
        self.factor = factor


def quotient(size: int | SymSize, known: int | SymSize, what: str) -> int | SymSize:
    """`size` divided by `known` (a -1's share), exact for every value of the symbols, or the
    factor one symbol must have (SizeMultipleNeeded); anything else is a ShapeError naming
    `what`."""
    if known == 0:
        raise ShapeError(f"{what}: the other dimensions hold no elements")
    if not isinstance(known, SymSize):
        if not isinstance(size, SymSize):
            if size % known:
                raise ShapeError(f"{what}: {size} elements do not split into rows of {known}")
            return size // known
        if size.coef % known == 0:
            return SymSize(size.coef // known, size.names)
        factor = known // math.gcd(size.coef, known)
        if len(size.names) == 1:
            raise SizeMultipleNeeded(f"{what}: the size {size} splits into rows of {known} only "
                                     f"when {size.names[0]} is a multiple of {factor}",
                                     size.names[0], factor)
        raise ShapeError(f"{what}: the size {size} splits into rows of {known} only for some "
                         f"values of {', '.join(sorted(set(size.names)))}; declare those "
                         "dimensions static")
    left = list(size.names) if isinstance(size, SymSize) else []
    for name in known.names:
        if name not in left:
            raise ShapeError(f"{what}: the size {size} is not a multiple of {known} for every "
                             f"value of {', '.join(sorted(set(known.names)))}")
        left.remove(name)
    coef = size.coef if isinstance(size, SymSize) else size
    if coef % known.coef:
        raise ShapeError(f"{what}: the size {size} is not a multiple of {known}")
    return SymSize(coef // known.coef, tuple(left)) if left else coef // known.coef


def is_static(shape: tuple[Dim, ...]) -> bool:
    return not any(isinstance(d, SymSize) for d in shape)


def symbols_of(shape: tuple[Dim, ...]) -> list[str]:
    """The symbol names a shape mentions, in order of first appearance."""
    out: list[str] = []
    for d in shape:
        if isinstance(d, SymSize):
            out += [n for n in d.names if n not in out]
    return out


def concrete(shape: tuple[Dim, ...], sizes: dict[str, int]) -> tuple[int, ...]:
    """A shape with its symbols replaced by their values in one call."""
    return tuple(d.value(sizes) if isinstance(d, SymSize) else d for d in shape)


@dataclass(frozen=True)
class TensorType:
    """The type of a value: its shape and dtype. A dimension is an int, or a SymSize for a
    dimension declared dynamic (one compiled graph serves every value of it)."""

    shape: tuple[Dim, ...]
    dtype: np.dtype

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_static(self) -> bool:
        return is_static(self.shape)

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]"


@dataclass(frozen=True)
class TupleType:
    """The type of an op with several outputs (e.g. LayerNorm, a multi-output fused kernel)."""

    items: tuple[TensorType, ...]

    def __str__(self) -> str:
        return "(" + ", ".join(str(t) for t in self.items) + ")"


def concrete_attrs(attrs: dict[str, Any], sizes: dict[str, int]) -> dict[str, Any]:
    """Attributes with the dynamic sizes their shapes hold (a gradient's BroadcastTo back to
    [N, 4]) replaced by their values in one call."""
    out = dict(attrs)
    for key, value in attrs.items():
        if isinstance(value, tuple) and any(isinstance(d, SymSize) for d in value):
            out[key] = concrete(value, sizes)
    return out


ValueType = TensorType | TupleType


def broadcast_shapes(*shapes: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """NumPy broadcasting; the error names every shape involved. A dynamic dimension never
    broadcasts (a size-1 dimension stays static): it matches itself, or a 1."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for axis in range(rank):
        size = 1
        for shape in shapes:
            dim = shape[axis - rank + len(shape)] if axis - rank + len(shape) >= 0 else 1
            if dim == 1:
                continue
            if size not in (1, dim):
                listed = " and ".join(_shape_text(s) for s in shapes)
                dynamic = " (a dynamic dimension matches only itself or 1)" if \
                    isinstance(size, SymSize) or isinstance(dim, SymSize) else ""
                raise ShapeError(f"shapes {listed} do not broadcast (axis {axis - rank}: "
                                 f"{size} vs {dim}){dynamic}")
            size = dim
        out.append(size)
    return tuple(out)


def _shape_text(shape: tuple[Dim, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def promote(*dtypes: np.dtype) -> np.dtype:
    """Result dtype of tensors combined by an arithmetic op (NumPy's rules)."""
    return np.result_type(*dtypes)


def scalar_dtype(value: object, partner: np.dtype | None) -> np.dtype:
    """The dtype a Python scalar takes next to a tensor: NumPy-like weak typing.

    A float scalar next to a float tensor takes the tensor's dtype (float32 * 2.0 stays float32);
    next to an int or bool tensor it is float32, so the result is float32 as in MindSpore (an
    int32 tensor times 2.5). An int scalar takes the tensor's dtype unless that is bool.
    """
    if isinstance(value, bool):
        return partner if partner is not None else bool_
    if isinstance(value, int):
        if partner is None or partner == bool_:
            return int64 if partner is None else int64
        return partner
    if isinstance(value, float):
        if partner is None:
            return float32  # a float scalar alone, as in Tensor(2.0)
        return partner if is_float(partner) else float32
    raise DTypeError(f"not a Python scalar: {value!r} ({type(value).__name__})")


def normalize_axes(axis: int | tuple[int, ...] | list[int] | None, rank: int) -> tuple[int, ...]:
    """Turn an axis argument into sorted non-negative axes; None or () means all axes."""
    if axis is None:
        return tuple(range(rank))
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
        axes: tuple[int, ...] = (int(axis),)
    elif isinstance(axis, (tuple, list)) and all(
            isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in axis):
        axes = tuple(int(a) for a in axis)
        if not axes:
            return tuple(range(rank))
    else:
        raise ShapeError(f"axis must be an int, a tuple of ints or None, got {axis!r}")
    out = []
    for a in axes:
        if not -rank <= a < max(rank, 1):
            raise ShapeError(f"axis {a} is out of range for a tensor of rank {rank} "
                             f"(valid: {-rank}..{rank - 1})")
        out.append(a % rank if rank else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"axis {axis!r} repeats an axis")
    return tuple(sorted(out))


def shape_fits(shape: tuple[int, ...], expected: tuple[int | SymSize, ...],
               sizes: dict[str, int]) -> bool:
    """Whether an array's shape is the expected one: static dims equal, each dynamic size the
    same wherever it appears (bound in `sizes` by its first appearance), a multiple of its
    coefficient (2*N: N is half the size)."""
    if len(shape) != len(expected):
        return False
    for have, want in zip(shape, expected):
        if isinstance(want, SymSize):
            if have % want.coef or sizes.setdefault(want.names[0], have // want.coef) != \
                    have // want.coef:
                return False
        elif have != want:
            return False
    return True
