"""Process groups for data-parallel training, MindSpore's `mindspore.communication`:

    from graphkernel import communication, context
    communication.init()                      # under `mpirun -n N python train.py`
    context.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
    rank, size = communication.get_rank(), communication.get_group_size()

The group is MPI's world communicator through mpi4py (Open MPI); TrainOneStepCell then sums its
gradients over the group (ops AllReduce, nn.DistributedGradReducer) before the optimizer.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.errors import CommunicationError
from graphkernel.ir.opdefs.collective import set_collectives

_state: dict[str, Any] = {}


class MPIGroup:
    """MPI's world communicator as AllReduce's group."""

    def __init__(self, comm: Any, mpi: Any) -> None:
        self.comm = comm
        self._sum = mpi.SUM
        self._in_place = mpi.IN_PLACE

    @property
    def size(self) -> int:
        return int(self.comm.Get_size())

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    def allreduce_sum(self, buffer: np.ndarray) -> None:
        self.comm.Allreduce(self._in_place, buffer, op=self._sum)


def init(backend_name: str | None = None) -> None:
    """Join the process group of this run (MPI's world: every process mpirun started)."""
    if backend_name not in (None, "mpi"):
        raise CommunicationError(f"backend_name={backend_name!r}: graphkernel communicates "
                                 "through MPI only (backend_name='mpi' or None); MindSpore's "
                                 "hccl and nccl are for Ascend and GPU devices")
    if "group" in _state:
        return
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise CommunicationError(f"communication.init() needs mpi4py and an MPI library "
                                 f"(apt-get install openmpi-bin libopenmpi-dev; pip install "
                                 f"mpi4py): {exc}") from None
    group = MPIGroup(MPI.COMM_WORLD, MPI)
    _state["group"] = group
    set_collectives(group)


def use_group(group: Any) -> None:
    """Install a process group other than MPI's: an object with `size`, `rank` and
    `allreduce_sum(buffer)` (in place). Tests use one that stands for several ranks."""
    _state["group"] = group
    set_collectives(group)


def _group() -> Any:
    if "group" not in _state:
        raise CommunicationError("call graphkernel.communication.init() first")
    return _state["group"]


def get_rank() -> int:
    """This process's rank in the group, 0 .. get_group_size() - 1."""
    return _group().rank


def get_group_size() -> int:
    """How many processes train together."""
    return _group().size


def release() -> None:
    """Leave the group (MPI itself finalizes when the process exits)."""
    _state.pop("group", None)
    set_collectives(None)


__all__ = ["init", "get_rank", "get_group_size", "release", "use_group", "MPIGroup"]
