"""Cells: `Cell`, `GraphKernel`, and layers built from primitives."""
from graphkernel.frontend.cell import Cell, GraphKernel
from graphkernel.nn.distributed import DistributedGradReducer
from graphkernel.nn.graph_cell import GraphCell
from graphkernel.nn.layers import GELU, Dense, LayerNorm, ReLU, SequentialCell, Softmax

__all__ = ["Cell", "DistributedGradReducer", "GraphCell", "GraphKernel", "Dense", "GELU",
           "LayerNorm", "ReLU", "SequentialCell", "Softmax"]
