"""MindSpore's auto-parallel context, the data-parallel part: `set_auto_parallel_context(
parallel_mode="data_parallel", gradients_mean=True)` makes TrainOneStepCell sum (or average)
its gradients over the process group (graphkernel.communication) before the optimizer;
`grad_bucket_mb=25` sends them in buckets of at most 25 MB, each begun as soon as the backward
pass has made it (overlapping the rest of the backward pass), as PyTorch's DDP does."""
from __future__ import annotations

import math
from typing import Any

from graphkernel.errors import ContextError

STAND_ALONE, DATA_PARALLEL = "stand_alone", "data_parallel"
# MindSpore's other modes split operators across devices: not available here.
_OTHER_MODES = ("semi_auto_parallel", "auto_parallel", "hybrid_parallel")
_DEFAULTS: dict[str, Any] = {"parallel_mode": STAND_ALONE, "gradients_mean": False,
                             "device_num": None, "global_rank": None, "grad_bucket_mb": None}
_settings: dict[str, Any] = dict(_DEFAULTS)


def set_auto_parallel_context(**kwargs: Any) -> None:
    """parallel_mode ("stand_alone" or "data_parallel"), gradients_mean (average rather than
    sum the gradients), device_num and global_rank (checked against the group at init),
    grad_bucket_mb (None: one blocking AllReduce after the backward pass; a positive number:
    buckets of at most that many megabytes (10**6 bytes) of gradients, in the order the backward
    pass makes them, each sum begun as soon as its bucket is ready and waited for before the
    optimizer)."""
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
        elif key == "grad_bucket_mb" and value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            raise ContextError(f"grad_bucket_mb must be None or a positive number of "
                               f"megabytes, got {value!r}")
    _settings.update(kwargs)


def get_auto_parallel_context(key: str) -> Any:
    if key not in _settings:
        raise ContextError(f"unknown auto-parallel key {key!r}; known: {', '.join(_DEFAULTS)}")
    return _settings[key]


def reset_auto_parallel_context() -> None:
    _settings.clear()
    _settings.update(_DEFAULTS)
