"""The module path MindSpore code imports cells from: `from mindspore.nn.cell import Cell`."""
from graphkernel.frontend.cell import Cell, GraphKernel

__all__ = ["Cell", "GraphKernel"]
