"""Primitives: one callable class per op of the op table, and the single dispatch `apply_op`
that traces a node (graph mode) or runs the numpy reference (op by op)."""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, GraphKernelError, InputError, ResourceError
from graphkernel.frontend.tensor import Parameter, Tensor
from graphkernel.frontend.tracing import Tracer, current_tracer, user_location
from graphkernel.ir import types as T
from graphkernel.ir.graph import Constant, Value
from graphkernel.ir.opset import OpDef, _check_dtypes, get_op
from graphkernel.ir.types import TensorType, TupleType

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
    return out


def physical_memory() -> int:
    """Bytes of RAM this machine has (0 when unknown)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError(n)


def check_fits_in_memory(op: str, out_type: Any) -> None:
    """An op whose result alone is larger than the machine's memory is an error before it runs."""
    items = out_type.items if isinstance(out_type, TupleType) else (out_type,)
    need = sum(t.nbytes for t in items)
    have = physical_memory()
    if have and need > have:
        raise ResourceError(f"{op} would produce {out_type} ({format_bytes(need)}), more than "
                            f"this machine's memory ({format_bytes(have)})")


def apply_op(name: str, args: list[Any], attrs: dict[str, Any]) -> Tensor | tuple[Tensor, ...]:
    """Apply a primitive to operands: trace it or run it eagerly."""
    op = get_op(name)
    loc = user_location()
    try:
        return _apply(op, args, attrs, loc)
    except GraphKernelError as err:
        raise err.with_location(loc) from None


def _apply(op: OpDef, args: list[Any], attrs: dict[str, Any], loc: Any
           ) -> Tensor | tuple[Tensor, ...]:
    operands = _normalise_args(op, args)
    full_attrs = {**op.attr_defaults, **attrs}
    types = tuple(TensorType(tuple(o.shape), o.dtype) for o in operands)
    _check_dtypes(op.name, types, op.accepts)
    out_type = op.infer(types, full_attrs)
    check_fits_in_memory(op.name, out_type)
    tracer = _tracer_for(operands)
    if tracer is None:
        arrays = [o.asnumpy() if isinstance(o, Tensor) else o for o in operands]
        result = op.reference(*arrays, **full_attrs)
        return _wrap_eager(result, out_type)
    values: list[Value] = []
    for o in operands:
        if isinstance(o, Tensor):
            values.append(tracer.value_of(o))
        else:
            values.append(Constant(o, tracer.unique("const")))
    node = tracer.add_node(op.name, values, attrs_for_ir(op, full_attrs), out_type, loc)
    if isinstance(out_type, TupleType):
        items = []
        for index, item in enumerate(out_type.items):
            getter = tracer.add_node("GetItem", [node], {"index": index}, item, loc)
            items.append(Tensor._symbolic(getter, tracer))
        return tuple(items)
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


def _tracer_for(operands: list[Tensor | np.ndarray]) -> Tracer | None:
    for o in operands:
        if isinstance(o, Tensor) and o._tracer is not None:
            return current_tracer() or o._tracer
    tracer = current_tracer()
    if tracer is not None and any(isinstance(o, Parameter) for o in operands):
        return tracer  # weights stay graph inputs, never folded into constants
    return None


def _wrap_eager(result: Any, out_type: Any) -> Tensor | tuple[Tensor, ...]:
    if isinstance(out_type, TupleType):
        return tuple(Tensor._wrap(np.asarray(r, dtype=t.dtype))
                     for r, t in zip(result, out_type.items))
    array = np.asarray(result)
    if array.dtype != out_type.dtype:
        array = array.astype(out_type.dtype)
    return Tensor._wrap(array)


class Primitive:
    """Base of the generated primitive classes (`P.Mul`, `P.ReduceSum`, ...)."""

    op_name: str = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        op = get_op(self.op_name)
        names = [name for name, _ in op.init_attrs]
        if len(args) > len(names):
            raise InputError(f"{op.name}() takes at most {len(names)} attribute(s) "
                             f"({', '.join(names) or 'none'}), got {len(args)}", user_location())
        attrs = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names:
                raise InputError(f"{op.name}() has no attribute {key!r}; its attributes: "
                                 f"{', '.join(names) or 'none'}", user_location())
            attrs[key] = value
        self.attrs = attrs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        op = get_op(self.op_name)
        if op.variadic:
            if len(args) < 1 or not isinstance(args[0], (list, tuple)):
                raise InputError(f"{op.name} takes one list or tuple of tensors", user_location())
            tensors, rest = list(args[0]), list(args[1:])
        else:
            n = len(op.inputs)
            if len(args) < n:
                raise InputError(f"{op.name} takes {n} tensor input(s) ({', '.join(op.inputs)}), "
                                 f"got {len(args)}", user_location())
            tensors, rest = list(args[:n]), list(args[n:])
        call_names = [name for name, _ in op.call_attrs]
        if len(rest) > len(call_names):
            raise InputError(f"{op.name} takes {len(op.inputs)} tensor input(s) and "
                             f"{len(call_names)} more argument(s) "
                             f"({', '.join(call_names) or 'none'}), got {len(args)} in all",
                             user_location())
        attrs = dict(self.attrs)
        attrs.update(zip(call_names, rest))
        for key, value in kwargs.items():
            if key not in call_names:
                raise InputError(f"{op.name}() got an unexpected argument {key!r}; it takes "
                                 f"{', '.join(op.inputs + tuple(call_names))}", user_location())
            attrs[key] = value
        for key, value in attrs.items():
            if isinstance(value, Tensor):
                raise InputError(f"{op.name} argument {key!r} must be a Python value known "
                                 "when the graph is compiled, not a Tensor", user_location())
        return apply_op(op.name, tensors, attrs)

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attrs.items())
        return f"{self.op_name}({attrs})"


def make_primitive_class(op: OpDef, name: str | None = None) -> type[Primitive]:
    return type(name or op.name, (Primitive,), {"op_name": op.name, "__doc__": op.doc or
                                                 f"The {op.name} primitive."})


def make_functional(op: OpDef) -> Any:
    """`graphkernel.ops.mul(x, y)`: tensors, then call arguments, with init attrs as keywords."""
    init_names = {name for name, _ in op.init_attrs}
    cls = make_primitive_class(op)

    def functional(*args: Any, **kwargs: Any) -> Any:
        init = {k: kwargs.pop(k) for k in list(kwargs) if k in init_names}
        return cls(**init)(*args, **kwargs)

    functional.__name__ = op.functional_name
    functional.__doc__ = f"Functional form of {op.name}."
    return functional
