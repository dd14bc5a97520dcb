"""Every primitive's declaration, one module per family. Importing this package fills the op
table (`graphkernel.ir.opset.OPS`); `graphkernel.ir` does so on import."""
from graphkernel.ir.opdefs import (  # noqa: F401  (each module declares its ops on import)
    arg_reduce,
    array,
    collective,
    composite,
    effects,
    elementwise,
    grad,
    math_ops,
    matmul,
    nn,
    nn_grad,
    optim,
    reduction,
    shape,
    structural,
)
