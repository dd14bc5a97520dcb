"""graphkernel as an ONNX backend (`onnx.backend.base.Backend`), so ONNX's own backend test
suite (`onnx.backend.test.BackendTest`) runs against it: `prepare` loads the model as
`graphkernel.load` does (refusing what it cannot run, before anything runs) and the returned
rep runs it through `nn.GraphCell`."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep

from graphkernel.frontend.tensor import Tensor
from graphkernel.nn.graph_cell import GraphCell
from graphkernel.onnx.importer import load_model
from graphkernel.onnx.ops import ValueNeededError


class GraphKernelRep(BackendRep):
    """A prepared model: its GraphCell, compiled on the first run."""

    def __init__(self, cell: GraphCell) -> None:
        self.cell = cell

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        out = self.cell(*[Tensor(a) for a in _arrays(inputs)])
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(o.asnumpy() for o in outs)


class BoundRep(BackendRep):
    """A model whose nodes need, at load, values it takes as inputs (axes, shapes, pads given
    as graph inputs, as ONNX's node cases do): each run binds its small integer and bool
    inputs and its one-element inputs to the values given and loads the model for them (one
    GraphCell per set of values)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.names = [i.name for i in model.graph.input
                      if i.name not in {t.name for t in model.graph.initializer}]
        self.cells: dict[str, tuple[list[str], GraphCell]] = {}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        arrays = _arrays(inputs)
        bound = {n: a for n, a in zip(self.names, arrays)
                 if (a.dtype.kind in "biu" and a.size <= _MAX_BOUND) or a.size == 1}
        key = repr(sorted((n, a.dtype.str, a.shape, a.tobytes()) for n, a in bound.items()))
        if key not in self.cells:
            cell = GraphCell(load_model(self.model, bind=bound))
            self.cells[key] = ([n for n in self.names if n not in bound], cell)
        names, cell = self.cells[key]
        rest = [a for n, a in zip(self.names, arrays) if n in names]
        return GraphKernelRep(cell).run(rest)


def _arrays(inputs: Any) -> list[np.ndarray]:
    """A run's inputs as arrays (ONNX's test cases give some as TensorProtos)."""
    items = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
    return [numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else np.asarray(a)
            for a in items]


# Inputs this small (axes, shapes, pads, repeats) are bound; larger ones stay data.
_MAX_BOUND = 64


class GraphKernelBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return device == "CPU"

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU",
                **kwargs: Any) -> BackendRep:
        super().prepare(model, device, **kwargs)
        try:
            return GraphKernelRep(GraphCell(load_model(model)))
        except ValueNeededError:
            return BoundRep(model)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, Any]] | None = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        """One node on arrays: the node as a one-node model (its outputs' types inferred by
        onnx), run as a model is."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info, **kwargs)
        arrays = _arrays(inputs)
        names = [n for n in node.input if n]
        graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(
            a.dtype), list(a.shape)) for n, a in zip(names, arrays)]
        outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(helper.make_graph([node], "node", graph_inputs, outputs),
                                  opset_imports=[helper.make_opsetid("", opset)])
        inferred = onnx.shape_inference.infer_shapes(model)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
        return cls.run_model(model, arrays, device)


prepare = GraphKernelBackend.prepare
run_model = GraphKernelBackend.run_model
supports_device = GraphKernelBackend.supports_device

__all__ = ["GraphKernelBackend", "GraphKernelRep", "prepare", "run_model", "supports_device"]
