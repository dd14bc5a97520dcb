"""Primitive classes, MindSpore style: attributes at construction, tensors at call.

    from graphkernel.ops import operations as P
    P.ReduceSum(keep_dims=True)(x, axis)

Generated from the op table (graphkernel/ir/opset.py), aliases included (TensorAdd, Div).
"""
from typing import Any

from graphkernel.frontend.primitive import Primitive, make_primitive_class
from graphkernel.ir.opset import ALIASES, OPS, user_ops

for _op in user_ops():
    globals()[_op.name] = make_primitive_class(_op)
for _alias, _target in ALIASES.items():
    globals()[_alias] = make_primitive_class(OPS[_target], _alias)


class Depend:
    """MindSpore's Depend()(value, expr), the primitive form of `ops.depend`: `value`, once
    `expr` has been computed. Every graph here runs its ops in the order construct called them
    and keeps every Parameter write, so the order already holds."""

    def __call__(self, value: Any, expr: Any) -> Any:
        return value


class Print:
    """MindSpore's Print()(*inputs): writes each input, a string or a Tensor (numbers as
    strings), one per line to stdout, on every call: in graph mode when the compiled graph
    runs, not while tracing. Returns None (nothing may depend on it): the op is an effect
    (ir/opdefs/effects.py), kept in the graph where construct called it."""

    def __call__(self, *inputs: Any) -> None:
        from graphkernel.errors import InputError
        from graphkernel.frontend.location import user_location
        from graphkernel.frontend.tensor import Tensor, apply_op
        if not inputs:
            raise InputError("Print takes at least one input (strings or Tensors)",
                             user_location())
        texts, layout, tensors = [], "", []
        for item in inputs:
            if isinstance(item, Tensor):
                tensors.append(item)
                layout += "t"
            elif isinstance(item, (str, bool, int, float)):
                texts.append(str(item))
                layout += "s"
            else:
                raise InputError(f"Print takes strings, numbers and Tensors, got "
                                 f"{type(item).__name__} {item!r:.60}", user_location())
        from graphkernel.frontend.symbolic import current_graph
        tracer = current_graph()
        if tracer is not None and tracer.graph.effects:
            # After the previous effect: its token orders this Print after it (effects.py).
            tensors.insert(0, Tensor._symbolic(tracer.graph.effects[-1], tracer))
            layout = "o" + layout
        apply_op("Print", tensors, {"texts": tuple(texts), "layout": layout})


class ScalarCast:
    """MindSpore's ScalarCast()(x, type): a Python number (or a one-element Tensor known when
    compiling) as a Python scalar of `type`'s kind (float, int or bool)."""

    def __call__(self, value: Any, to: Any) -> Any:
        from graphkernel.errors import InputError
        from graphkernel.frontend.location import user_location
        from graphkernel.frontend.tensor import Tensor
        from graphkernel.ir import types as T
        dtype = T.to_dtype(to)
        if isinstance(value, Tensor):
            if value.is_symbolic or value.size != 1:
                raise InputError("ScalarCast takes a Python number (or a one-element Tensor "
                                 "known when compiling), not a Tensor computed in construct; "
                                 "use P.Cast for tensors", user_location())
            value = value.asnumpy().reshape(()).item()
        if not isinstance(value, (bool, int, float)):
            raise InputError(f"ScalarCast takes a number, got {value!r:.60}", user_location())
        return {"f": float, "i": int, "b": bool}[dtype.kind](value)


__all__ = ["Primitive"] + [op.name for op in user_ops()] + list(ALIASES) + ["Depend",
                                                                            "ScalarCast"]


def __getattr__(name: str) -> Any:
    """`P.Conv2D` and other primitives graphkernel lacks: a clear error listing what exists."""
    if name.startswith("_"):  # private names and submodules (_grad_ops): not primitives
        raise AttributeError(name)
    import difflib

    from graphkernel.errors import UnsupportedError
    from graphkernel.frontend.location import user_location
    close = difflib.get_close_matches(name, __all__, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise UnsupportedError(f"graphkernel has no primitive {name!r}{hint}; supported primitives: "
                           f"{', '.join(sorted(__all__[1:]))}", user_location())
