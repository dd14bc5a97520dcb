"""graphkernel: a graph-kernel fusion compiler and runtime for tensor programs.

Write a network the MindSpore way (an `nn.Cell` whose `construct` calls primitives), switch on
`context.set_context(enable_graph_kernel=True)`, and graphkernel fuses its operators into
generated C kernels. See docs/architecture.md for the map of the house.
"""
from typing import Any

# `ms.train.Model` (also `ms.Model`), `ms.dataset` and `ms.numpy` after a bare import, as
# MindSpore's.
from graphkernel import amp, communication, dataset, nn, numpy, ops, train  # noqa: E402
from graphkernel._version import __version__
from graphkernel.common import dtype
from graphkernel.common.checkpoint import load_checkpoint, load_param_into_net, save_checkpoint
from graphkernel.common.initializer import set_seed
from graphkernel.frontend import context
from graphkernel.frontend.compile import compile
from graphkernel.frontend.context import GRAPH_MODE, PYNATIVE_MODE, get_context, set_context
from graphkernel.frontend.grad import ParameterTuple, grad, value_and_grad
from graphkernel.frontend.jit import jit
from graphkernel.frontend.symbol import Symbol
from graphkernel.frontend.tensor import Parameter, Tensor
from graphkernel.ir.types import bool_, float16, float32, float64, int32, int64
from graphkernel.onnx import export, load  # GKIR and ONNX files (onnx/__init__.py)
from graphkernel.train import Model

__all__ = ["__version__", "amp", "GRAPH_MODE", "PYNATIVE_MODE", "communication", "context",
           "compile",
           "dataset", "dtype", "export", "get_context", "grad", "jit", "load", "load_checkpoint",
           "load_param_into_net", "numpy", "Parameter", "ParameterTuple", "save_checkpoint",
           "set_context", "set_seed", "Symbol", "Tensor", "nn", "ops", "value_and_grad",
           "float16", "float32", "float64", "int32", "int64", "bool_", "Model", "train"]


def __getattr__(name: str) -> Any:
    """A MindSpore name graphkernel lacks: say so, and what to use instead."""
    if name.startswith("_"):
        raise AttributeError(name)
    from graphkernel.frontend.mindspore_names import missing_name_error
    raise missing_name_error("graphkernel", name, __all__)
