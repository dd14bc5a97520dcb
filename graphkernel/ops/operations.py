"""Primitive classes, MindSpore style: attributes at construction, tensors at call.

    from graphkernel.ops import operations as P
    P.ReduceSum(keep_dims=True)(x, axis)

Generated from the op table (graphkernel/ir/opset.py), aliases included (TensorAdd, Div).
"""
from graphkernel.frontend.primitive import Primitive, make_primitive_class
from graphkernel.ir.opset import ALIASES, OPS, user_ops

for _op in user_ops():
    globals()[_op.name] = make_primitive_class(_op)
for _alias, _target in ALIASES.items():
    globals()[_alias] = make_primitive_class(OPS[_target], _alias)

__all__ = ["Primitive"] + [op.name for op in user_ops()] + list(ALIASES)
