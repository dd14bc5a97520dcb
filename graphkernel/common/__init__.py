"""MindSpore's `mindspore.common` faces: `dtype` (imported as mstype), `initializer`, and
checkpoints (`save_checkpoint`, `load_checkpoint`, `load_param_into_net`)."""
from graphkernel.common import dtype
from graphkernel.common.checkpoint import load_checkpoint, load_param_into_net, save_checkpoint
from graphkernel.common.initializer import initializer, set_seed

__all__ = ["dtype", "initializer", "load_checkpoint", "load_param_into_net", "save_checkpoint",
           "set_seed"]
