"""`graphkernel.dataset.config`, MindSpore's `dataset.config`: the seed that orders shuffles
and the number of rows the background thread prepares ahead of the consumer."""
from __future__ import annotations

import numpy as np

from graphkernel.errors import InputError

_seed: int | None = None
_prefetch_size = 16


def set_seed(seed: int) -> None:
    """Shuffles made after this draw the same orders on every run."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"dataset.config.set_seed takes an int >= 0, got {seed!r}")
    global _seed
    _seed = int(seed)


def get_seed() -> int | None:
    """The seed set by set_seed, None when shuffles are seeded from the OS."""
    return _seed


def set_prefetch_size(size: int) -> None:
    """How many rows (or batches) an iterator's thread prepares ahead (MindSpore's default 16)."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise InputError(f"dataset.config.set_prefetch_size takes an int >= 1, got {size!r}")
    global _prefetch_size
    _prefetch_size = int(size)


def get_prefetch_size() -> int:
    return _prefetch_size


def new_rng() -> np.random.Generator:
    """A generator for one shuffling node: from the seed when one is set."""
    return np.random.default_rng(_seed)
