"""nn.GraphCell: runs a graph loaded from an export (graphkernel.load), MindSpore's GraphCell."""
from __future__ import annotations

from typing import Any

from graphkernel.errors import GraphModeError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.compiled import CompiledCell
from graphkernel.frontend.export import LoadedGraph, check_signature, compile_loaded
from graphkernel.frontend.tensor import Parameter
from graphkernel.frontend.tracing import current_tracer


class GraphCell(Cell):
    """Runs `graph` (from `graphkernel.load`) on Tensors or arrays of its exported signature:
    every size its dynamic dimensions (and their rules) allow, or the exported shapes when it
    has none. Its weights are Parameters this cell owns (`parameters_and_names()`,
    `set_data`); the graph is compiled once, on first use, through the kernel cache."""

    def __init__(self, graph: LoadedGraph) -> None:
        super().__init__()
        if not isinstance(graph, LoadedGraph):
            raise TypeError(f"GraphCell takes what graphkernel.load returns, got "
                            f"{type(graph).__name__}")
        self._loaded = graph
        self._graph = graph.graph.clone()  # its own weight bindings
        params = []
        for inp in self._graph.inputs:
            if inp.kind == "weight":
                param = Parameter(graph.weights[inp.name].copy(), inp.name)
                inp.binding = param
                self._params[inp.name] = param
                params.append(param)
        self._param_list = params
        self._compiled_graph: CompiledCell | None = None
        # Builds of the graph so far: one serves every shape the signature allows (a loaded
        # shape-generic graph is compiled once, whatever sizes its calls bring).
        self.compile_count = 0

    @property
    def compiled(self) -> CompiledCell:
        """The compiled graph (compiled now if it was not yet)."""
        if self._compiled_graph is None and self._loaded.compiled is not None and \
                not self._param_list:
            self._compiled_graph = self._loaded.compiled
        if self._compiled_graph is None:
            self._compiled_graph = compile_loaded(self._loaded, self._graph, self._param_list)
            self.compile_count += 1
        return self._compiled_graph

    def __call__(self, *inputs: Any) -> Any:
        if current_tracer() is not None:
            raise GraphModeError(f"GraphCell {self._loaded.name} cannot be called inside "
                                 "another cell's construct; call it on Tensors or arrays")
        check_signature(self._loaded, list(inputs))
        return self.compiled(*inputs)

    def construct(self, *inputs: Any) -> Any:
        return self(*inputs)

    def __repr__(self) -> str:
        return f"GraphCell({self._loaded!r})"
