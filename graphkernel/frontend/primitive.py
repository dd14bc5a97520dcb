"""Primitives: one callable class per op of the op table (`P.Mul`, ...) and the functional
forms (`graphkernel.ops.mul`). Each call goes to the single dispatch `apply_op` (tensor.py),
which traces a node (graph mode) or runs the numpy reference (op by op)."""
from __future__ import annotations

from typing import Any

from graphkernel.errors import InputError
from graphkernel.frontend.location import user_location
from graphkernel.frontend.memory import format_bytes, physical_memory
from graphkernel.frontend.tensor import Tensor, apply_op
from graphkernel.ir.opset import OpDef, get_op

# Re-exported: the compile driver checks a whole graph against the machine's memory with them.
__all__ = ["Primitive", "apply_op", "constexpr", "format_bytes", "make_functional",
           "make_primitive_class", "physical_memory"]


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
        try:
            op.check_attrs(attrs)
        except InputError as err:
            raise err.with_location(user_location()) from None
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
                attrs[key] = _static_attr(op.name, key, value)
        try:
            op.check_attrs({**op.attr_defaults, **attrs})
        except InputError as err:
            raise err.with_location(user_location()) from None
        return apply_op(op.name, tensors, attrs)

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attrs.items())
        return f"{self.op_name}({attrs})"


def _static_attr(op: str, key: str, value: Tensor) -> Any:
    """A Tensor given where a value known at compile time is needed (OneHot's on_value): a
    concrete one (made in __init__ or outside construct) is read; a traced one cannot be."""
    if value.is_symbolic:
        raise InputError(f"{op} argument {key!r} must be a Python value known when the graph is "
                         "compiled, not a Tensor computed in construct", user_location())
    array = value.asnumpy()
    return array[()] if array.ndim == 0 else tuple(array.tolist())


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
    functional.__qualname__ = op.functional_name
    functional.__doc__ = f"Functional form of {op.name}."
    return functional


def constexpr(fn: Any = None, *, get_instance: bool = True, reuse_result: bool = True,
              check: bool = True) -> Any:
    """MindSpore's `@constexpr`: a Python function `construct` calls on constants (shapes,
    numbers, dtypes) to compute another constant while the graph is compiled. Tracing runs
    `construct` as Python, so the function simply runs; a tensor computed by the graph has no
    value yet and is refused by name. `get_instance`, `reuse_result`, `check`: MindSpore's
    arguments, with nothing to change here."""
    import functools

    from graphkernel.errors import GraphModeError

    def wrap(func: Any) -> Any:
        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            for arg in (*args, *kwargs.values()):
                if isinstance(arg, Tensor) and arg.is_symbolic:
                    raise GraphModeError(
                        f"@constexpr function {func.__name__!r} got a tensor the graph "
                        "computes: a constexpr function runs while compiling, on constants "
                        "only (pass x.shape or a number, or compute it with ops)",
                        user_location())
            return func(*args, **kwargs)
        return call

    return wrap if fn is None else wrap(fn)
