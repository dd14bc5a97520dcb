"""MindSpore's auto-parallel context, the data-parallel part: `set_auto_parallel_context(
parallel_mode="data_parallel", gradients_mean=True)` makes TrainOneStepCell sum (or average)
its gradients over the process group (graphkernel.communication) before the optimizer."""
from __future__ import annotations

from typing import Any

from graphkernel.errors import ContextError

STAND_ALONE, DATA_PARALLEL = "stand_alone", "data_parallel"
# MindSpore's other modes split operators across devices: not available here.
_OTHER_MODES = ("semi_auto_parallel", "auto_parallel", "hybrid_parallel")
_DEFAULTS: dict[str, Any] = {"parallel_mode": STAND_ALONE, "gradients_mean": False,
                             "device_num": None, "global_rank": None}
_settings: dict[str, Any] = dict(_DEFAULTS)


def set_auto_parallel_context(**kwargs: Any) -> None:
    """parallel_mode ("stand_alone" or "data_parallel"), gradients_mean (average rather than
    sum the gradients), device_num and global_rank (checked against the group at init)."""
    for key, value in kwargs.items():
        if key not in _DEFAULTS:
            raise ContextError(f"unknown auto-parallel key {key!r}; known: "
                               f"{', '.join(_DEFAULTS)}")
        if key == "parallel_mode":
            if value in _OTHER_MODES:
                raise ContextError(f"parallel_mode={value!r} splits operators across devices, "
                                   "which graphkernel does not do; use 'data_parallel'")
            if value not in (STAND_ALONE, DATA_PARALLEL):
                raise ContextError(f"parallel_mode={value!r}: use 'stand_alone' or "
                                   "'data_parallel'")
        elif key == "gradients_mean" and not isinstance(value, bool):
            raise ContextError(f"gradients_mean must be True or False, got {value!r}")
        elif key in ("device_num", "global_rank") and value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ContextError(f"{key} must be a non-negative int, got {value!r}")
    _settings.update(kwargs)


def get_auto_parallel_context(key: str) -> Any:
    if key not in _settings:
        raise ContextError(f"unknown auto-parallel key {key!r}; known: {', '.join(_DEFAULTS)}")
    return _settings[key]


def reset_auto_parallel_context() -> None:
    _settings.clear()
    _settings.update(_DEFAULTS)
