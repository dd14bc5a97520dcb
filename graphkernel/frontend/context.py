"""Global compile context, MindSpore style: `context.set_context(mode=..., ...)`."""
from __future__ import annotations

import os
from typing import Any

from graphkernel.errors import ContextError

GRAPH_MODE = 0
PYNATIVE_MODE = 1

# The targets this machine offers. Only the CPU backend exists; naming others in an error helps
# users porting MindSpore scripts written for Ascend or GPU.
AVAILABLE_TARGETS = ("CPU",)
KNOWN_TARGETS = ("CPU", "GPU", "Ascend")

_DEFAULTS: dict[str, Any] = {
    "mode": GRAPH_MODE,
    "device_target": "CPU",
    "save_graphs": False,
    "save_graphs_path": ".",
    "enable_graph_kernel": False,
    "graph_kernel_flags": "",
}
_settings: dict[str, Any] = dict(_DEFAULTS)
# Bumped on every change so compiled-graph caches keyed on the context stay exact.
_generation = 0


def _validate(key: str, value: Any) -> Any:
    if key == "mode":
        if value not in (GRAPH_MODE, PYNATIVE_MODE) or isinstance(value, bool):
            raise ContextError(f"mode must be context.GRAPH_MODE ({GRAPH_MODE}) or "
                               f"context.PYNATIVE_MODE ({PYNATIVE_MODE}), got {value!r}")
        return value
    if key == "device_target":
        if not isinstance(value, str):
            raise ContextError(f"device_target must be a string, got {value!r}")
        match = {t.lower(): t for t in KNOWN_TARGETS}.get(value.lower(), value)
        if match not in AVAILABLE_TARGETS:
            raise ContextError(f"device_target {value!r} is not available on this machine; "
                               f"available targets: {', '.join(AVAILABLE_TARGETS)}")
        return match
    if key in ("save_graphs", "enable_graph_kernel"):
        if isinstance(value, bool):
            return value
        if key == "save_graphs" and isinstance(value, int) and 0 <= value <= 3:
            return bool(value)  # MindSpore's levels 0-3; every level writes all stages here
        raise ContextError(f"{key} must be True or False, got {value!r}")
    if key == "save_graphs_path":
        if not isinstance(value, (str, os.PathLike)):
            raise ContextError(f"save_graphs_path must be a path, got {value!r}")
        return os.fspath(value)
    if key == "graph_kernel_flags":
        if not isinstance(value, str):
            raise ContextError(f"graph_kernel_flags must be a string, got {value!r}")
        from graphkernel.graph_kernel.flags import parse_flags
        parse_flags(value)  # raises FlagError naming the known flags
        return value
    raise AssertionError(key)


def set_context(**kwargs: Any) -> None:
    """Set compile options; unknown keys or values raise ContextError naming the allowed ones."""
    global _generation
    unknown = [k for k in kwargs if k not in _DEFAULTS]
    if unknown:
        raise ContextError(f"unknown context key(s) {', '.join(map(repr, unknown))}; known keys: "
                           f"{', '.join(_DEFAULTS)}")
    validated = {k: _validate(k, v) for k, v in kwargs.items()}
    _settings.update(validated)
    _generation += 1


def get_context(key: str) -> Any:
    if key not in _settings:
        raise ContextError(f"unknown context key {key!r}; known keys: {', '.join(_DEFAULTS)}")
    return _settings[key]


def reset_context() -> None:
    """Back to the defaults (used by tests and the lab runner)."""
    global _generation
    _settings.clear()
    _settings.update(_DEFAULTS)
    _generation += 1


def snapshot() -> dict[str, Any]:
    return dict(_settings)
