"""MindSpore's `mindspore.common` faces: `dtype` (imported as mstype), the `initializer` module
(`import graphkernel.common.initializer as init`, as MindSpore code does: so the package does not
re-export the function of that name over it), and checkpoints (`save_checkpoint`,
`load_checkpoint`, `load_param_into_net`)."""
from graphkernel.common import dtype, initializer
from graphkernel.common.checkpoint import load_checkpoint, load_param_into_net, save_checkpoint
from graphkernel.common.initializer import set_seed

__all__ = ["dtype", "initializer", "load_checkpoint", "load_param_into_net", "save_checkpoint",
           "set_seed"]
