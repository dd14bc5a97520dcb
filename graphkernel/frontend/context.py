"""Global compile context, MindSpore style: `context.set_context(mode=..., ...)`."""
from __future__ import annotations

import difflib
import os
from typing import Any

from graphkernel.errors import ContextError, warn_no_effect

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
    # MindSpore keys that act here or whose value is already what graphkernel does.
    "jit_config": {},
    "deterministic": "OFF",
    "device_id": 0,
    "pynative_synchronize": False,
    # graphkernel's own: a dimension seen with a second value is compiled as a dynamic one
    # (frontend/dynamic.py), so further values reuse that graph. False: one graph per shape.
    "automatic_dynamic_shapes": True,
    # graphkernel's own: the backend that builds the kernels (backends/): "c", generated C,
    # or "numpy", every kernel run as vectorised numpy.
    "backend": "c",
}

# MindSpore 2.x set_context keys accepted so its scripts start, with one NoEffectWarning each
# time one is set: their value is checked for its kind and kept (get_context returns it).
NO_EFFECT_KEYS: dict[str, type] = {
    "max_call_depth": int, "memory_optimize_level": str, "max_device_memory": str,
    "variable_memory_max_size": str, "mempool_block_size": str, "runtime_num_threads": int,
    "inter_op_parallel_num": int, "op_timeout": int, "enable_reduce_precision": bool,
    "enable_auto_mixed_precision": bool, "check_bprop": bool, "enable_dump": bool,
    "save_dump_path": str, "enable_profiling": bool, "profiling_options": str,
    "print_file_path": str, "env_config_path": str, "precompile_only": bool,
    "reserve_class_name_in_scope": bool, "grad_for_scalar": bool,
    "enable_compile_cache": bool, "compile_cache_path": str, "disable_format_transform": bool,
    "support_binary": bool, "debug_level": int, "jit_syntax_level": int,
    "ascend_config": dict, "gpu_config": dict, "aoe_tune_mode": str, "aoe_config": dict,
    "auto_tune_mode": str, "graph_memory_max_size": str, "enable_sparse": bool,
    "memory_offload": str,
}
for _key in NO_EFFECT_KEYS:
    _DEFAULTS.setdefault(_key, None)
# jit_config's jit_level: O0 runs op by op (no fusion), O1 fuses (MindSpore 2.3+'s way to turn
# graph-kernel fusion on), O2 (whole-graph sink on Ascend) fuses as O1 does.
JIT_LEVELS = {"O0": False, "O1": True, "O2": True}
_settings: dict[str, Any] = dict(_DEFAULTS)
# Names the settings: compiled-graph caches key on it. Equal settings get the same number, so
# setting the context back (or to what it was) reuses graphs compiled under it.
_generation = 0
_generations: dict[str, int] = {}


def _settings_changed() -> None:
    global _generation
    _generation = _generations.setdefault(repr(sorted(_settings.items())), len(_generations))


_settings_changed()


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
    if key in ("save_graphs", "enable_graph_kernel", "automatic_dynamic_shapes"):
        if isinstance(value, bool):
            return value
        if key == "save_graphs" and isinstance(value, int) and 0 <= value <= 3:
            return bool(value)  # MindSpore's levels 0-3; every level writes all stages here
        raise ContextError(f"{key} must be True or False, got {value!r}")
    if key == "backend":
        from graphkernel.backends import NAMES
        if value not in NAMES:
            raise ContextError(f"backend must be one of {', '.join(map(repr, NAMES))}, got "
                               f"{value!r}")
        return value
    if key == "save_graphs_path":
        if not isinstance(value, (str, os.PathLike)):
            raise ContextError(f"save_graphs_path must be a path, got {value!r}")
        return os.fspath(value)
    if key == "graph_kernel_flags":
        if not isinstance(value, str):
            raise ContextError(f"graph_kernel_flags must be a string, got {value!r}")
        from graphkernel.graph_kernel.flags import parse_flags
        # Raises FlagError for an unknown flag; warns once about flags, op names and stage
        # names with no effect here.
        parse_flags(value, warn=True)
        return value
    if key == "deterministic":
        if value not in ("ON", "OFF"):
            raise ContextError(f"deterministic must be 'ON' or 'OFF', got {value!r}")
        # Kernels already give the same bits run to run: each output element (and each
        # reduction row) is computed by one thread in a fixed order.
        return value
    if key == "device_id":
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ContextError(f"device_id must be an integer >= 0, got {value!r}")
        if value != 0:
            _warn(f"device_id={value} has no effect: graphkernel runs on this machine's CPU")
        return value
    if key == "pynative_synchronize":
        if not isinstance(value, bool):
            raise ContextError(f"pynative_synchronize must be True or False, got {value!r}")
        return value  # every op already finishes before the next starts
    if key == "jit_config":
        return _jit_config(value)
    if key in NO_EFFECT_KEYS:
        if value is None:  # the default: unset
            return value
        kind = NO_EFFECT_KEYS[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            words = {int: "an integer", str: "a string", bool: "True or False", dict: "a dict"}
            raise ContextError(f"{key} must be {words[kind]} (as in MindSpore), got {value!r}")
        _warn(f"{key} has no effect in graphkernel (accepted for MindSpore scripts)")
        return value
    raise AssertionError(key)


def _warn(message: str) -> None:
    warn_no_effect(f"set_context: {message}")


def _jit_config(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ContextError(f"jit_config must be a dict such as {{'jit_level': 'O1'}}, got "
                           f"{value!r}")
    level = value.get("jit_level")
    if level is not None and level not in JIT_LEVELS:
        raise ContextError(f"jit_config jit_level must be one of {', '.join(JIT_LEVELS)}, got "
                           f"{level!r}")
    others = sorted(k for k in value if k != "jit_level")
    if others:
        _warn(f"jit_config {', '.join(others)} {'has' if len(others) == 1 else 'have'} no "
              "effect in graphkernel")
    return dict(value)


def set_context(**kwargs: Any) -> None:
    """Set compile options; unknown keys or values raise ContextError naming the allowed ones."""
    unknown = [k for k in kwargs if k not in _DEFAULTS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(_DEFAULTS), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ContextError(f"unknown context key(s) {', '.join(map(repr, unknown))}{hint}; "
                           f"known keys: {', '.join(_DEFAULTS)}")
    validated = {k: _validate(k, v) for k, v in kwargs.items()}
    level = validated.get("jit_config", {}).get("jit_level")
    if level is not None:
        fuse = JIT_LEVELS[level]
        if validated.get("enable_graph_kernel", fuse) != fuse:
            raise ContextError(f"jit_config jit_level={level!r} and enable_graph_kernel="
                               f"{validated['enable_graph_kernel']} disagree; set one of them")
        validated["enable_graph_kernel"] = fuse
    _settings.update(validated)
    _settings_changed()


def get_context(key: str) -> Any:
    if key not in _settings:
        raise ContextError(f"unknown context key {key!r}; known keys: {', '.join(_DEFAULTS)}")
    return _settings[key]


def reset_context() -> None:
    """Back to the defaults (used by tests and the lab runner)."""
    _settings.clear()
    _settings.update(_DEFAULTS)
    _settings_changed()


def snapshot() -> dict[str, Any]:
    return dict(_settings)


def restore(saved: dict[str, Any]) -> None:
    """Back to what `snapshot()` returned (already validated: no checks, no warnings again)."""
    _settings.clear()
    _settings.update(saved)
    _settings_changed()


# MindSpore's context also holds the auto-parallel settings (data parallel only here).
from graphkernel.frontend.parallel_context import (  # noqa: E402, F401  (re-exported)
    DATA_PARALLEL,
    STAND_ALONE,
    get_auto_parallel_context,
    reset_auto_parallel_context,
    set_auto_parallel_context,
)
