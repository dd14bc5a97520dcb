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

__all__ = ["Primitive"] + [op.name for op in user_ops()] + list(ALIASES)


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
