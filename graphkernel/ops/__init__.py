"""Primitives (`from graphkernel.ops import operations as P`) and their functional forms
(`graphkernel.ops.mul(x, y)`), all generated from the op table in graphkernel/ir/opset.py."""
from graphkernel.frontend.primitive import Primitive, make_functional
from graphkernel.ir.opset import user_ops
from graphkernel.ops import operations

for _op in user_ops():
    globals()[_op.functional_name] = make_functional(_op)

__all__ = ["operations", "Primitive"] + [op.functional_name for op in user_ops()]
