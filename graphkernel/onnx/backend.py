"""graphkernel as an ONNX backend (`onnx.backend.base.Backend`), so ONNX's own backend test
suite (`onnx.backend.test.BackendTest`) runs against it: `prepare` loads the model as
`graphkernel.load` does (refusing what it cannot run, before anything runs) and the returned
rep runs it through `nn.GraphCell`."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from graphkernel.frontend.tensor import Tensor
from graphkernel.nn.graph_cell import GraphCell
from graphkernel.onnx.importer import load_model


class GraphKernelRep(BackendRep):
    """A prepared model: its GraphCell, compiled on the first run."""

    def __init__(self, cell: GraphCell) -> None:
        self.cell = cell

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
        out = self.cell(*[Tensor(np.asarray(a)) for a in arrays])
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(o.asnumpy() for o in outs)


class GraphKernelBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return device == "CPU"

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU",
                **kwargs: Any) -> GraphKernelRep:
        super().prepare(model, device, **kwargs)
        return GraphKernelRep(GraphCell(load_model(model)))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, Any]] | None = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        raise NotImplementedError("graphkernel runs whole models: use prepare/run_model")


prepare = GraphKernelBackend.prepare
run_model = GraphKernelBackend.run_model
supports_device = GraphKernelBackend.supports_device

__all__ = ["GraphKernelBackend", "GraphKernelRep", "prepare", "run_model", "supports_device"]
