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
from graphkernel.graph_kernel.lower import LoweringTarget
from graphkernel.ir.graph import Graph
from graphkernel.runtime.executable import Executable
from graphkernel.runtime.plan import KernelSpec


class Backend(LoweringTarget, Protocol):
    """A target: what it supports (the `LoweringTarget` questions), how it emits one kernel
    spec, and how it builds and loads a plan into an Executable."""

    name: str
    # The type of this backend's own settings (`CompileOptions.backend_config`): a frozen
    # dataclass whose fields are ints, None, bools or such dataclasses, so that the compile
    # cache keys on them and a GKIR export records them (frontend/export.py checks them back).
    config_type: type

    def default_config(self) -> Any:
        """The settings a compile without `backend_config` uses (a `config_type`): the C
        backend's come from this machine's calibration (backends/c/calibration.py)."""

    def emit(self, spec: KernelSpec, config: Any) -> Any:
        """The kernel `spec` in this backend's form (C source, a numpy function), built with
        `config` (a `config_type`)."""

    def build_executable(self, graph: Graph, name: str, config: Any,
                         prebuilt: tuple[str, bytes] | None = None,
                         tuning_level: int = 0, code_digest: str | None = None) -> Executable:
        """Lower `graph` (a final graph) for this backend unless it is already, plan it, build
        and load its kernels with `config` (a `config_type`). `prebuilt`: a library built
        elsewhere, by its cache key. `tuning_level` (`--online_tuning`): how hard to measure
        the kernels' schedule choices on this machine; a backend without choices ignores it.
        `code_digest`: a hash of `graph`'s data the compile cache made as it wrote or read it
        (`backends/c/backend.graph_code_digest`), for a backend that finds earlier builds by
        the graph; one that does not ignores it."""


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


def backend_config(backend: Backend, config: object | None) -> Any:
    """`config` (`CompileOptions.backend_config`) as `backend`'s settings: its defaults on this
    machine for None; one of another type (another backend's settings) is refused."""
    if config is None:
        return backend.default_config()
    if type(config) is not backend.config_type:
        raise ContextError(f"backend_config is a {type(config).__name__}; the {backend.name} "
                           f"backend takes a {backend.config_type.__name__} (or None: its "
                           "defaults)")
    return config
