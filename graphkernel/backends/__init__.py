"""Backends: the targets graphkernel builds kernels for, behind one protocol.

The rest of the compiler sees only `Backend` and `get_backend(name)`: lowering
(graph_kernel/lower.py) asks a backend what it can build (`LoweringTarget`), the plan holds
backend-neutral kernel specs (runtime/plan.py `KernelSpec`), and the backend builds and loads
them. Each backend is a subpackage: `c` (generated C, the default) and `numpy` (every kernel
spec run as vectorised numpy).
"""
from __future__ import annotations

import importlib
from typing import Any, Protocol

from graphkernel.errors import ContextError
from graphkernel.graph_kernel.cost_model import CostModel
from graphkernel.graph_kernel.lower import LoweringTarget
from graphkernel.ir.graph import Graph
from graphkernel.runtime.executable import Executable
from graphkernel.runtime.plan import KernelSpec


class Backend(LoweringTarget, Protocol):
    """A target: what it supports (the `LoweringTarget` questions), how it emits one kernel
    spec, and how it builds and loads a plan into an Executable."""

    name: str

    def emit(self, spec: KernelSpec, cost: CostModel) -> Any:
        """The kernel `spec` in this backend's form (C source, a numpy function)."""

    def build_executable(self, graph: Graph, name: str, cost: CostModel,
                         prebuilt: tuple[str, bytes] | None = None) -> Executable:
        """Lower `graph` (a final graph) for this backend unless it is already, plan it, build
        and load its kernels. `prebuilt`: a library built elsewhere, by its cache key."""


# name -> the module whose BACKEND is that backend (imported on first use)
_MODULES = {"c": "graphkernel.backends.c.backend",
            "numpy": "graphkernel.backends.numpy.backend"}
NAMES = tuple(_MODULES)


def get_backend(name: str) -> Backend:
    """The backend called `name` ("c" or "numpy")."""
    module = _MODULES.get(name)
    if module is None:
        raise ContextError(f"unknown backend {name!r}: graphkernel has {', '.join(NAMES)}")
    backend: Backend = importlib.import_module(module).BACKEND
    return backend
