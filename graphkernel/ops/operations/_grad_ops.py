"""MindSpore's `ops.operations._grad_ops`: the gradient primitives (GeLUGrad, LayerNormGrad,
SoftmaxGrad, ...) declared in graphkernel/ir/opdefs/grad.py, so code calling them ports.

    from graphkernel.ops.operations import _grad_ops as G
    G.GeLUGrad()(dy, x, y)
"""
from graphkernel.frontend.primitive import make_primitive_class
from graphkernel.ir.opdefs.grad import GRAD_OPS
from graphkernel.ir.opset import OPS

for _name in GRAD_OPS:
    globals()[_name] = make_primitive_class(OPS[_name])

__all__ = list(GRAD_OPS)
