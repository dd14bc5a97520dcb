"""Tensor and Parameter, and `apply_op`: a primitive applied to tensors. A Tensor holds either an
array (eager) or, while `construct` is being traced in graph mode, a symbolic IR value of the
graph being recorded (frontend/symbolic.py); `apply_op` records a node there or runs the numpy
reference. Tensor arithmetic is `apply_op`, so both live here."""
from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from graphkernel.errors import (
    DTypeError,
    GraphKernelError,
    GraphModeError,
    InputError,
    ShapeError,
    UnsupportedError,
)
from graphkernel.frontend.indexing import strided_slice_args
from graphkernel.frontend.location import user_location
from graphkernel.frontend.memory import check_fits_in_memory
from graphkernel.frontend.symbol import Symbol
from graphkernel.frontend.symbolic import SymbolicGraph, current_graph
from graphkernel.ir import types as T
from graphkernel.ir.graph import Constant, Value
from graphkernel.ir.opset import OpDef, _check_dtypes, get_op
from graphkernel.ir.types import TensorType, TupleType

_STATIC_GRAPH_HELP = (
    "graph mode compiles `construct` into a static graph once per input signature, so Python "
    "code cannot look at a tensor's values while tracing (no `if`/`while` on a tensor, no "
    "float()/int()/bool(), no .asnumpy()). Compute the condition with ops such as P.Select, or "
    "run op by op with context.set_context(mode=context.PYNATIVE_MODE)")


# Arrays of these dtypes (supported, native byte order, not bool: a bool array may hold bytes
# other than 0 and 1) are held as they are.
_TAKEN_AS_IS = frozenset(d for d in T.SUPPORTED_DTYPES if d.isnative and d != np.bool_)


class Tensor:
    """An n-dimensional array, MindSpore style."""

    __array_priority__ = 100  # numpy defers `ndarray * Tensor` to Tensor.__rmul__
    # A tensor declared by shape and dtype only (`Tensor(shape=[None, 64], dtype=...)`, for
    # Cell.set_inputs): its type, None for a dynamic dimension. Others have data or a value.
    # A Symbol (frontend/symbol.py) is a dynamic dimension with constraints.
    _declared: tuple[tuple[int | Symbol | None, ...], np.dtype] | None = None
    # A result made by a compiled entry (backends/c/c_entry.py `call`) sets only `_array`.
    _array: np.ndarray | None
    _value: Value | None = None
    _tracer: SymbolicGraph | None = None

    def __init__(self, input_data: Any = None, dtype: Any = None,
                 shape: Any = None) -> None:
        if type(input_data) is np.ndarray and dtype is None and shape is None and \
                input_data.dtype in _TAKEN_AS_IS:
            self._array = input_data  # the per-call path, `net(Tensor(x))`: nothing to convert
            return
        if input_data is None and shape is not None:
            self._array = None
            self._declared = (_declared_shape(shape), T.to_dtype(
                dtype if dtype is not None else T.float32))
            return
        if shape is not None:
            raise TypeError("Tensor takes data or a shape (with a dtype), not both")
        if input_data is None:
            raise TypeError("Tensor needs data (an array, a list or a scalar), or a shape and "
                            "a dtype: Tensor(shape=[None, 64], dtype=float32) declares an input "
                            "for Cell.set_inputs")
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
        if not array.dtype.isnative:  # kernels read native byte order
            array = array.astype(array.dtype.newbyteorder("="))
        if array.dtype == np.bool_ and array.size and array.view(np.uint8).max() > 1:
            array = array.view(np.uint8) != 0  # one byte 0 or 1 per bool, as kernels expect
        self._array = array

    @classmethod
    def _symbolic(cls, value: Value, tracer: SymbolicGraph) -> Tensor:
        t = cls.__new__(cls)
        t._array = None
        t._value = value
        t._tracer = tracer
        return t

    @classmethod
    def _wrap(cls, array: np.ndarray) -> Tensor:
        t = cls.__new__(cls)
        t._array = array
        return t

    # -- properties ------------------------------------------------------------------------
    @property
    def is_symbolic(self) -> bool:
        return self._value is not None

    @property
    def shape(self) -> tuple[Any, ...]:
        if self._value is not None:
            return self._value.shape
        if self._array is None and self._declared is not None:  # -1: dynamic, as MindSpore
            return tuple(d if isinstance(d, int) else -1 for d in self._declared[0])
        assert self._array is not None
        return tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype:
        if self._value is not None:
            return self._value.dtype
        if self._array is None and self._declared is not None:
            return self._declared[1]
        assert self._array is not None
        return self._array.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def data(self) -> Tensor:
        """The tensor itself, as MindSpore's `Parameter.data` and `Tensor.data` are: code that
        reads `param.data` (in construct too) gets the same value."""
        return self

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def asnumpy(self) -> np.ndarray:
        if self._array is None and self._declared is not None:
            raise InputError(f"this Tensor has no data: it declares a shape and dtype "
                             f"({self}) for Cell.set_inputs", user_location())
        if self._array is None:
            raise GraphModeError(f"Tensor.asnumpy() (or a numpy function on a tensor) called "
                                 f"while tracing: {_STATIC_GRAPH_HELP}", user_location())
        return self._array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.asnumpy()
        return array if dtype is None else array.astype(dtype)

    # -- MindSpore's Tensor methods that MindCV's models call: their primitives ---------------
    def reshape(self, *shape: Any) -> Tensor:
        """x.reshape(2, -1) or x.reshape((2, -1)): Reshape."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return apply_op("Reshape", [self], {"shape": tuple(shape)})  # type: ignore[return-value]  # a one-output op: one Tensor

    def astype(self, dtype: Any, copy: bool = True) -> Tensor:
        """The values cast to `dtype`: Cast (the tensor itself when it has that dtype)."""
        if T.to_dtype(dtype) == self.dtype and not copy:
            return self
        return apply_op("Cast", [self], {"dtype": dtype})  # type: ignore[return-value]  # a one-output op: one Tensor

    def mean(self, axis: Any = None, keep_dims: bool = False) -> Tensor:
        """The mean over `axis` (an int, a tuple or list, or None for all): ReduceMean."""
        axes = () if axis is None else tuple(axis) if isinstance(axis, list) else axis
        return apply_op("ReduceMean", [self], {"axis": axes,  # type: ignore[return-value]  # a one-output op
                                               "keep_dims": keep_dims})

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes Tensor lacks (x.sum(), x.view(...)): say what exists.
        if name.startswith("_"):
            raise AttributeError(name)
        raise UnsupportedError(f"Tensor has no attribute {name!r}: graphkernel tensors have "
                               "shape, dtype, ndim, size, asnumpy(), reshape(), astype() and "
                               "mean(), the operators + - * / ** @ < <= > >=, and every op as a "
                               "primitive (e.g. P.ReduceSum()(x, axis)) from "
                               "graphkernel.ops.operations", user_location())

    # -- Python protocols that need values ---------------------------------------------------
    def _needs_value(self, what: str) -> None:
        if self._array is None:
            raise GraphModeError(f"{what} on a tensor while tracing `construct`: "
                                 f"{_STATIC_GRAPH_HELP}", user_location())

    def __bool__(self) -> bool:
        self._needs_value("bool() (an `if`, `while`, `and`/`or` or assert)")
        assert self._array is not None
        return bool(self._array)

    def __float__(self) -> float:
        self._needs_value("float()")
        return float(self._array)  # type: ignore[arg-type]  # _needs_value: an array here

    def __int__(self) -> int:
        self._needs_value("int()")
        return int(self._array)  # type: ignore[arg-type]  # _needs_value: an array here

    def __index__(self) -> int:
        self._needs_value("using a tensor as an index")
        return int(self._array)  # type: ignore[arg-type]  # _needs_value: an array here

    def __getitem__(self, key: Any) -> Tensor:
        """`x[0]`, `x[:, 1:3]`, `x[..., None]`, `x[::-2]`, `x[ids]`: StridedSlice (or Gather)."""
        if isinstance(key, Tensor):
            if key.dtype not in (T.int32, T.int64):
                raise UnsupportedError(f"indexing with a {key.dtype.name} tensor: only int32 or "
                                       "int64 index tensors (a gather along axis 0) are "
                                       "supported", user_location())
            return apply_op("Gather", [self, key], {"axis": 0})  # type: ignore[return-value]  # a one-output op: one Tensor
        try:
            masks, (begin, end, strides) = strided_slice_args(key, self.ndim)
        except GraphKernelError as err:
            raise err.with_location(user_location()) from None
        return apply_op("StridedSlice", [self], {**masks, "begin": begin, "end": end,
                                                 "strides": strides})  # type: ignore[return-value]  # one output

    def __setitem__(self, key: Any, value: Any) -> None:
        raise UnsupportedError("tensors are immutable here: build the new value with ops (e.g. "
                               "P.Select, P.Concat) instead of assigning into a slice",
                               user_location())

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
        args = (other, self) if reverse else (self, other)
        return apply_op(op, list(args), {})  # type: ignore[return-value]  # a one-output op: one Tensor

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
        return apply_op("Neg", [self], {})  # type: ignore[return-value]  # a one-output op: one Tensor

    def __matmul__(self, other: Any) -> Tensor:
        return apply_op("MatMul", [self, other], {})  # type: ignore[return-value]  # a one-output op: one Tensor

    # -- text ---------------------------------------------------------------------------------
    def __repr__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        if self._array is None and self._declared is not None:
            dims = ", ".join(repr(d) for d in self._declared[0])
            return f"Tensor(shape=[{dims}], dtype={self.dtype.name}, no data)"
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


def _declared_shape(shape: Any) -> tuple[int | Symbol | None, ...]:
    if not isinstance(shape, (list, tuple)) or not all(
            d is None or isinstance(d, Symbol) or (isinstance(d, (int, np.integer)) and
                                                   not isinstance(d, bool) and d >= 0) or
            d == -1 for d in shape):
        raise InputError(f"Tensor shape must be a list of sizes (None, -1 or a Symbol for a "
                         f"dynamic dimension), got {shape!r}", user_location())
    return tuple(d if d is None or isinstance(d, Symbol) else None if d == -1 else int(d)
                 for d in shape)


class Parameter(Tensor):
    """A weight a Cell owns: a graph input bound at call time, so updates are seen.

    Its values change only through its write paths, each of which bumps its version word
    (`version`): `set_data`, `p[...] = value`, an op run eagerly that writes it (Assign), and a
    compiled graph's in-place writes (optimizer updates, `CompiledCell` bumps them after the
    call). Compiled graphs keep data derived from it (a convolution's repacked weights) until
    the word moves. `asnumpy()` hands out a read-only view of the live array, so no write
    escapes the count."""

    def __init__(self, default_input: Any, name: str = "", requires_grad: bool = True) -> None:
        super().__init__(default_input)
        if self._array is not None:
            # A Parameter owns its array: graphs that assign to it (optimizer updates) write
            # into it in place, never into the array it was made from.
            self._array = np.array(self._array, order="C", copy=True)
        self.name = name
        self.requires_grad = requires_grad
        # Kernels read it by address (runtime/runner.py bind_versions): changed in place only.
        self._version = np.zeros(1, np.int64)

    @property
    def version(self) -> int:
        """How many times the values were written (a counter, starting at 0)."""
        return int(self._version[0])

    def bump_version(self) -> None:
        """Record that the values changed (every write path calls this)."""
        self._version[0] += 1

    def asnumpy(self) -> np.ndarray:
        """The live values as a read-only view (they change with the Parameter): write through
        `set_data` or `p[...] = value`, which compiled graphs see."""
        array = super().asnumpy()
        view = array.view()
        view.flags.writeable = False
        return view

    def set_data(self, data: Any) -> None:
        """Replace the value, cast to the Parameter's dtype; the shape must stay (compiled
        graphs take this Parameter's array as a weight of that type). Another shape is a new
        Parameter, set as the cell's attribute: graphs that read the old one then recompile."""
        array = np.array(data, dtype=self.dtype, order="C", copy=True)  # owned, as above
        if array.shape != self.shape:
            raise ShapeError(f"Parameter {self.name!r} is {self.dtype.name}{list(self.shape)}; "
                             f"set_data got shape {list(array.shape)}. set_data keeps the "
                             "shape (compiled graphs rely on it): to change it, set a new "
                             "Parameter on the cell (cell.weight = Parameter(...))",
                             user_location())
        self._array = array
        self.bump_version()

    def __setitem__(self, key: Any, value: Any) -> None:
        """`p[key] = value`: written into the Parameter's own array, as numpy assigns (the
        value cast to its dtype, broadcast to the selection)."""
        if self._array is None:
            raise GraphModeError(f"assigning into Parameter {self.name!r} while tracing: use "
                                 "P.Assign (or ops.assign) in construct", user_location())
        source = value.asnumpy() if isinstance(value, Tensor) else value
        try:
            self._array[key] = source
        except (IndexError, ValueError, TypeError) as err:
            raise InputError(f"Parameter {self.name!r} ({self.dtype.name}"
                             f"{list(self.shape)})[{key!r}] = a value: {err}",
                             user_location()) from None
        finally:
            self.bump_version()  # even a failed broadcast may have written some of it

    def __repr__(self) -> str:
        return f"Parameter(name={self.name!r}, shape={list(self.shape)}, dtype={self.dtype.name})"


def value_in(graph: SymbolicGraph, tensor: Tensor) -> Value:
    """The IR value of a tensor operand in the graph being recorded: its own symbolic value (an
    outer graph's captured as an input), a weight input for a Parameter, else a constant."""
    if tensor._value is not None:
        return graph.capture(tensor._value, tensor._tracer)
    if isinstance(tensor, Parameter):
        return graph.weight(tensor)
    return Constant(np.array(tensor.asnumpy()), graph.unique("const"))


# -- applying a primitive to operands ----------------------------------------------------------
_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)


def _operand_tensor_dtypes(op: OpDef, args: list[Any]) -> list[np.dtype]:
    dtypes = [a.dtype for a in args if isinstance(a, Tensor)]
    dtypes += [a.dtype for a in args if isinstance(a, np.ndarray)]
    if op.name == "Select":  # the condition does not decide the scalar's type
        dtypes = [a.dtype for a in args[1:] if isinstance(a, (Tensor, np.ndarray))]
    return dtypes


def _normalise_args(op: OpDef, args: list[Any]) -> list[Tensor | np.ndarray]:
    """Tensors stay; numpy arrays become constants; Python scalars take weak dtypes."""
    partner_dtypes = _operand_tensor_dtypes(op, args)
    partner = T.promote(*partner_dtypes) if partner_dtypes else None
    out: list[Tensor | np.ndarray] = []
    for i, arg in enumerate(args):
        if isinstance(arg, Tensor):
            out.append(arg)
        elif isinstance(arg, np.ndarray):
            T.to_dtype(arg.dtype)
            out.append(arg)
        elif isinstance(arg, _SCALARS):
            value = arg.item() if isinstance(arg, np.generic) else arg
            this_partner = partner
            if op.name == "Select" and i == 0:
                this_partner = T.bool_
            dtype = T.scalar_dtype(value, this_partner)
            out.append(np.asarray(value, dtype=dtype))
        else:
            name = op.inputs[min(i, len(op.inputs) - 1)]
            raise DTypeError(f"{op.name} input {name!r} is a {type(arg).__name__} ({arg!r:.60}); "
                             "expected a Tensor, a numpy array or a Python number")
    if partner is not None and not T.is_float(partner) and any(
            isinstance(a, float) for i, a in enumerate(args) if op.name != "Select" or i):
        # MindSpore: an int tensor meeting a Python float computes in float32 (numpy would
        # give float64): the tensors are cast, the scalar is float32 already.
        first = 1 if op.name == "Select" else 0
        out[first:] = [o if T.is_float(o.dtype) else
                       o.astype(T.float32) if isinstance(o, np.ndarray) else
                       apply_op("Cast", [o], {"dtype": T.float32})  # type: ignore[misc]  # Cast: one Tensor
                       for o in out[first:]]
    return out


def apply_op(name: str, args: list[Any], attrs: dict[str, Any]) -> Tensor | tuple[Tensor, ...]:
    """Apply a primitive to operands: trace it or run it eagerly."""
    op = get_op(name)
    loc = user_location()
    try:
        return _apply(op, args, attrs, loc)
    except GraphKernelError as err:
        raise err.with_location(loc) from None


# Mixed precision (Cell.to_float, graphkernel.amp): the dtype float Parameters are read in
# by the ops of the cell being run, innermost last. Per thread, as tracing is.
_precision = threading.local()


@contextlib.contextmanager
def parameters_read_as(dtype: np.dtype) -> Iterator[None]:
    """While it lasts, an op given a float Parameter of another dtype reads it through a Cast
    to `dtype` (MindSpore's to_float): the weight itself (and its updates) keeps its dtype,
    and the gradient flows back through the Cast into it."""
    stack = _precision.__dict__.setdefault("stack", [])
    stack.append(dtype)
    try:
        yield
    finally:
        stack.pop()


def mixed_precision_dtype() -> np.dtype | None:
    """The dtype the running cell reads its Parameters in (None: their own)."""
    stack = _precision.__dict__.get("stack")
    return stack[-1] if stack else None


def _read_parameters(op: OpDef, args: list[Any]) -> list[Any]:
    stack = _precision.__dict__.get("stack")
    if not stack or op.name == "Cast":
        return args
    dtype = stack[-1]
    return [apply_op("Cast", [a], {"dtype": dtype})
            if isinstance(a, Parameter) and T.is_float(a.dtype) and a.dtype != dtype and
            i not in op.writes else a for i, a in enumerate(args)]


def _apply(op: OpDef, args: list[Any], attrs: dict[str, Any], loc: Any
           ) -> Tensor | tuple[Tensor, ...]:
    operands = _normalise_args(op, _read_parameters(op, args))
    full_attrs = {**op.attr_defaults, **attrs}
    types = tuple(TensorType(tuple(o.shape), o.dtype) for o in operands)
    _check_dtypes(op.name, types, op.accepts)
    if op.static_value is not None:  # Shape, Size: Python values, in graph mode too
        return op.static_value(types, full_attrs)
    out_type = op.infer(types, full_attrs)
    check_fits_in_memory(op.name, out_type)
    for i in op.writes:
        if not isinstance(operands[i], Parameter):
            raise InputError(f"{op.name} writes its input {op.inputs[i]!r} in place, so it must "
                             f"be a Parameter, not a {type(args[i]).__name__}")
    tracer = _tracer_for(operands, op.stateful)
    if tracer is None:
        arrays = [o.asnumpy() if isinstance(o, Tensor) else o for o in operands]
        result = op.reference(*arrays, **full_attrs)
        wrapped = _wrap_eager(result, out_type)
        written = wrapped if isinstance(wrapped, tuple) else (wrapped,)
        for i, k in zip(op.writes, op.written_outputs):
            operands[i][...] = written[k].asnumpy()  # Parameter.__setitem__: counted
        return written[0] if op.returns_first_only else wrapped
    values: list[Value] = []
    for o in operands:
        if isinstance(o, Tensor):
            values.append(value_in(tracer, o))
        else:
            values.append(Constant(o, tracer.unique("const")))
    node = tracer.add_node(op.name, values, attrs_for_ir(op, full_attrs), out_type, loc)
    if op.effect:  # kept for what it does (Print), though nothing reads its result
        tracer.graph.effects.append(node)
    if isinstance(out_type, TupleType):
        items = []
        for index, item in enumerate(out_type.items):
            getter = tracer.add_node("GetItem", [node], {"index": index}, item, loc)
            items.append(Tensor._symbolic(getter, tracer))
        for i, k in zip(op.writes, op.written_outputs):
            tracer.assign(operands[i], items[k]._value)  # type: ignore[arg-type]  # traced: a Value
        return items[0] if op.returns_first_only else tuple(items)
    for i in op.writes:
        tracer.assign(operands[i], node)  # type: ignore[arg-type]  # traced: a Value
    return Tensor._symbolic(node, tracer)


def attrs_for_ir(op: OpDef, attrs: dict[str, Any]) -> dict[str, Any]:
    """Attributes as stored on nodes: hashable (lists become tuples), dtypes as numpy dtypes."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if isinstance(value, list):
            value = tuple(value)
        if key == "dtype" and value is not None:
            value = T.to_dtype(value)
        out[key] = value
    return out


def _tracer_for(operands: list[Tensor | np.ndarray], stateful: bool = False
                ) -> SymbolicGraph | None:
    for o in operands:
        if isinstance(o, Tensor) and o._tracer is not None:
            return current_graph() or o._tracer
    tracer = current_graph()
    if tracer is not None and any(isinstance(o, Parameter) for o in operands):
        return tracer  # weights stay graph inputs, never folded into constants
    if tracer is not None and stateful:
        # A random op (Dropout) on constants, as DropPath's mask of ones: a node drawing anew
        # on every call, not one draw frozen into the graph while tracing.
        return tracer
    return None


def _wrap_eager(result: Any, out_type: Any) -> Tensor | tuple[Tensor, ...]:
    if isinstance(out_type, TupleType):
        return tuple(Tensor._wrap(np.asarray(r, dtype=t.dtype))
                     for r, t in zip(result, out_type.items))
    array = np.asarray(result)
    if array.dtype != out_type.dtype:
        array = array.astype(out_type.dtype)
    return Tensor._wrap(array)
