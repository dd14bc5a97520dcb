"""Tensor and Parameter. A Tensor holds either an array (eager) or, while `construct` is being
traced in graph mode, a symbolic IR value."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from graphkernel.errors import GraphModeError
from graphkernel.ir import types as T

if TYPE_CHECKING:
    from graphkernel.frontend.tracing import Tracer
    from graphkernel.ir.graph import Value

_STATIC_GRAPH_HELP = (
    "graph mode compiles `construct` into a static graph once per input signature, so Python "
    "code cannot look at a tensor's values while tracing (no `if`/`while` on a tensor, no "
    "float()/int()/bool(), no .asnumpy()). Compute the condition with ops such as P.Select, or "
    "run op by op with context.set_context(mode=context.PYNATIVE_MODE)")


class Tensor:
    """An n-dimensional array, MindSpore style."""

    __array_priority__ = 100  # numpy defers `ndarray * Tensor` to Tensor.__rmul__

    def __init__(self, input_data: Any = None, dtype: Any = None) -> None:
        self._value: Value | None = None
        self._tracer: Tracer | None = None
        if input_data is None:
            raise TypeError("Tensor needs data: an array, a list or a scalar")
        if isinstance(input_data, Tensor):
            input_data = input_data.asnumpy()
        if isinstance(input_data, np.ndarray):
            array = input_data if dtype is None else input_data.astype(T.to_dtype(dtype))
        else:
            array = np.asarray(input_data)
            if dtype is not None:
                array = array.astype(T.to_dtype(dtype))
            elif array.dtype == np.float64:
                array = array.astype(np.float32)  # Python floats default to float32
        T.to_dtype(array.dtype)  # rejects unsupported dtypes with a clear message
        self._array: np.ndarray | None = array

    @classmethod
    def _symbolic(cls, value: Value, tracer: Tracer) -> Tensor:
        t = cls.__new__(cls)
        t._array = None
        t._value = value
        t._tracer = tracer
        return t

    @classmethod
    def _wrap(cls, array: np.ndarray) -> Tensor:
        t = cls.__new__(cls)
        t._array = array
        t._value = None
        t._tracer = None
        return t

    # -- properties ------------------------------------------------------------------------
    @property
    def is_symbolic(self) -> bool:
        return self._value is not None

    @property
    def shape(self) -> tuple[int, ...]:
        if self._value is not None:
            return self._value.shape
        assert self._array is not None
        return tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype:
        if self._value is not None:
            return self._value.dtype
        assert self._array is not None
        return self._array.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def asnumpy(self) -> np.ndarray:
        if self._array is None:
            from graphkernel.frontend.tracing import user_location
            raise GraphModeError(f"Tensor.asnumpy() (or a numpy function on a tensor) called "
                                 f"while tracing: {_STATIC_GRAPH_HELP}", user_location())
        return self._array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.asnumpy()
        return array if dtype is None else array.astype(dtype)

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes Tensor lacks (x.sum(), x.reshape(...)): say what exists.
        if name.startswith("_"):
            raise AttributeError(name)
        from graphkernel.errors import UnsupportedError
        from graphkernel.frontend.tracing import user_location
        raise UnsupportedError(f"Tensor has no attribute {name!r}: graphkernel tensors have "
                               "shape, dtype, ndim, size and asnumpy(), the operators + - * / ** "
                               "@ < <= > >=, and every op as a primitive (e.g. P.ReduceSum()(x, "
                               "axis)) from graphkernel.ops.operations", user_location())

    # -- Python protocols that need values ---------------------------------------------------
    def _needs_value(self, what: str) -> None:
        if self._array is None:
            from graphkernel.frontend.tracing import user_location
            raise GraphModeError(f"{what} on a tensor while tracing `construct`: "
                                 f"{_STATIC_GRAPH_HELP}", user_location())

    def __bool__(self) -> bool:
        self._needs_value("bool() (an `if`, `while`, `and`/`or` or assert)")
        assert self._array is not None
        return bool(self._array)

    def __float__(self) -> float:
        self._needs_value("float()")
        return float(self._array)  # type: ignore[arg-type]

    def __int__(self) -> int:
        self._needs_value("int()")
        return int(self._array)  # type: ignore[arg-type]

    def __index__(self) -> int:
        self._needs_value("using a tensor as an index")
        return int(self._array)  # type: ignore[arg-type]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Any:
        self._needs_value("iterating")
        assert self._array is not None
        return (Tensor._wrap(np.asarray(row)) for row in self._array)

    # -- arithmetic: the same primitives as P.Add etc. -------------------------------------------
    def _binary(self, op: str, other: Any, reverse: bool = False) -> Tensor:
        from graphkernel.frontend.primitive import apply_op
        args = (other, self) if reverse else (self, other)
        return apply_op(op, list(args), {})  # type: ignore[return-value]

    def __add__(self, other: Any) -> Tensor:
        return self._binary("Add", other)

    def __radd__(self, other: Any) -> Tensor:
        return self._binary("Add", other, reverse=True)

    def __sub__(self, other: Any) -> Tensor:
        return self._binary("Sub", other)

    def __rsub__(self, other: Any) -> Tensor:
        return self._binary("Sub", other, reverse=True)

    def __mul__(self, other: Any) -> Tensor:
        return self._binary("Mul", other)

    def __rmul__(self, other: Any) -> Tensor:
        return self._binary("Mul", other, reverse=True)

    def __truediv__(self, other: Any) -> Tensor:
        return self._binary("RealDiv", other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return self._binary("RealDiv", other, reverse=True)

    def __pow__(self, other: Any) -> Tensor:
        return self._binary("Pow", other)

    # Comparisons give bool tensors (so `if x > 0:` in graph mode reaches __bool__'s clear
    # error). == and != stay Python's identity tests: Tensors remain hashable.
    def __lt__(self, other: Any) -> Tensor:
        return self._binary("Less", other)

    def __le__(self, other: Any) -> Tensor:
        return self._binary("LessEqual", other)

    def __gt__(self, other: Any) -> Tensor:
        return self._binary("Greater", other)

    def __ge__(self, other: Any) -> Tensor:
        return self._binary("GreaterEqual", other)

    def __neg__(self) -> Tensor:
        from graphkernel.frontend.primitive import apply_op
        return apply_op("Neg", [self], {})  # type: ignore[return-value]

    def __matmul__(self, other: Any) -> Tensor:
        from graphkernel.frontend.primitive import apply_op
        return apply_op("MatMul", [self, other], {})  # type: ignore[return-value]

    # -- text ---------------------------------------------------------------------------------
    def __repr__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        if self._array is None:
            return f"Tensor(shape=[{dims}], dtype={self.dtype.name}, symbolic)"
        body = np.array2string(self._array, separator=", ", prefix="       ")
        return f"Tensor(shape=[{dims}], dtype={self.dtype.name}, value=\n{body})"

    def __str__(self) -> str:
        if self._array is None:
            return repr(self)
        return str(self._array)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class Parameter(Tensor):
    """A weight a Cell owns: a graph input bound at call time, so updates are seen."""

    def __init__(self, default_input: Any, name: str = "", requires_grad: bool = True) -> None:
        super().__init__(default_input)
        if self._array is not None and not self._array.flags.c_contiguous:
            self._array = np.ascontiguousarray(self._array)
        self.name = name
        self.requires_grad = requires_grad

    def set_data(self, data: Any) -> None:
        """Replace the value; shape and dtype must stay (compiled graphs rely on them)."""
        array = np.ascontiguousarray(np.asarray(data, dtype=self.dtype))
        if array.shape != self.shape:
            raise ValueError(f"Parameter {self.name}: new shape {array.shape} != {self.shape}")
        self._array = array

    def __repr__(self) -> str:
        return f"Parameter(name={self.name!r}, shape={list(self.shape)}, dtype={self.dtype.name})"

