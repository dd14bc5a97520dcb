"""Process groups for data-parallel training, MindSpore's `mindspore.communication`:

    from graphkernel import communication, context
    communication.init()                      # under `mpirun -n N python train.py`
    context.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
    rank, size = communication.get_rank(), communication.get_group_size()

The group is MPI's world communicator through mpi4py (Open MPI); TrainOneStepCell then sums its
gradients over the group (ops AllReduce, nn.DistributedGradReducer) before the optimizer.

A job whose rank fails ends, on every rank, with that rank's error (issue 31). Every rank waits
on the others in each collective, so one that stops would leave the others waiting forever (and
a rank that raises would itself hang in MPI_Finalize at exit). Hence, once the group has two
ranks or more:

- An uncaught exception (sys.excepthook) is printed as usual, then sent to every other rank as
  a failure notice (its rank, type and message) on a communicator of the group's own; the rank
  waits until each other rank has acknowledged it (or failed too), at most END_GRACE_S, and
  calls MPI_Abort, which ends the whole job.
- A watchdog thread on every rank tests, 20 times a second, for a failure notice and for a
  collective that has waited longer than `timeout` (default 600 s, $GRAPHKERNEL_COMM_TIMEOUT,
  or init(timeout=...)). A notice is reported on this rank as a CommunicationError naming the
  failed rank and its error, acknowledged, and the job aborted after the grace if the failed
  rank has not done it by then; a timeout is reported as a CommunicationError naming the
  collective and the limit, and ends the job as an uncaught exception does. A collective begun
  after either is a CommunicationError raised at once.
- A rank that leaves (sys.exit, which is no uncaught exception, or the end of its program)
  tells the others at exit, before MPI finalizes; a rank still waiting in a collective
  STRANDED_S after that ends the job as a timeout does, and one beginning a collective raises.
- An MPI error in a collective (MPI_ERR_TRUNCATE: ranks passing different sizes) is a
  CommunicationError, uncaught as a rule, so it ends the job too.

A collective is blocking (Allreduce, Allgather) unless gradients travel in buckets
(`set_auto_parallel_context(grad_bucket_mb=...)`): then each bucket's sum is begun with
MPI_Iallreduce as soon as its gradients are made and waited for before the optimizer, so the
exchange overlaps the rest of the backward pass. Either way the watchdog is why a wait need
not be polled; a wait blocked in MPI cannot raise, and MPI_Abort ends it. (Open MPI's
non-blocking collectives cost more per call on shared memory: docs/scaling.md.)
"""
from __future__ import annotations

import atexit
import hashlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import numpy as np

from graphkernel.errors import CommunicationError
from graphkernel.ir.opdefs.collective import set_collectives

_state: dict[str, Any] = {}

DEFAULT_TIMEOUT_S = 600.0
TIMEOUT_ENV = "GRAPHKERNEL_COMM_TIMEOUT"
# How long a failing rank waits for the others to report its error before aborting the job.
END_GRACE_S = 5.0
_WATCH_INTERVAL_S = 0.05  # how often the watchdog looks: a failure is seen within this
_NOTICE_BYTES = 4096  # a failure notice: "RuntimeError: message", cut to this many bytes
# A collective still waiting this long after another rank has left (exited: sys.exit, the end
# of its program) can never complete; one that was to complete does within microseconds.
STRANDED_S = 5.0
_NOTICE_TAG, _ACK_TAG, _LEFT_TAG = 1, 2, 3
_PROGRESS_TAG = 4  # never sent: probing it only makes MPI progress
# How often the progress thread enters MPI while non-blocking sums are pending: often enough
# to keep a 10 Gb/s link busy between Open MPI's 128 kB TCP fragments, rarely enough to leave
# the compute its cores.
PROGRESS_INTERVAL_S = 0.0002


class MPIGroup:
    """MPI's world communicator as AllReduce's group. With two ranks or more, a watchdog ends
    the job when another rank fails or a collective waits past `timeout` seconds."""

    def __init__(self, comm: Any, mpi: Any, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.comm = comm
        self.timeout = timeout
        self._mpi = mpi
        self._sum = mpi.SUM
        self._in_place = mpi.IN_PLACE
        # Why the group can no longer be used (a rank failed, a collective timed out); None
        # while it is healthy.
        self.broken: str | None = None
        # The collective this rank is in (its name, buffer and since when, time.monotonic());
        # None outside one.
        self._waiting: tuple[str, np.ndarray, float] | None = None
        # The ranks that have left the group, and when this one learned it (time.monotonic()).
        self._left: dict[int, float] = {}
        self._watchdog: threading.Thread | None = None
        self._started: list[Any] = []  # requests of the sums begun and not yet waited for
        self._progress: threading.Thread | None = None  # see start_allreduce_sum
        self._progress_lock = threading.Lock()
        self._sums_pending = threading.Event()
        self._progress_comm = comm  # a communicator to probe; the failure one once made
        self._stop_watching = threading.Event()
        if self.size > 1:
            # Failure notices and acknowledgements travel on a communicator of their own, so
            # they never meet the program's own messages on COMM_WORLD.
            self._failures = comm.Dup()
            self._progress_comm = self._failures
            self._notice = bytearray(_NOTICE_BYTES)
            self._notice_status = mpi.Status()
            self._notice_request = self._failures.Irecv(
                [self._notice, mpi.BYTE], source=mpi.ANY_SOURCE, tag=_NOTICE_TAG)
            self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                              name="graphkernel-mpi-watchdog")
            self._watchdog.start()

    @property
    def size(self) -> int:
        return int(self.comm.Get_size())

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    def allreduce_sum(self, buffer: np.ndarray) -> None:
        self._collective("AllReduce", buffer,
                         lambda: self.comm.Allreduce(self._in_place, buffer, op=self._sum))

    def start_allreduce_sum(self, buffer: np.ndarray) -> PendingMPISum:
        """Begin the in-place sum of `buffer` over the group (MPI_Iallreduce) and return at
        once; the buffer holds the sum after the returned object's `wait()`. Open MPI moves a
        non-blocking collective on (its next round, the next fragments over TCP) only inside
        MPI calls: while sums are pending, a progress thread enters MPI every
        PROGRESS_INTERVAL_S (an MPI_Iprobe that matches nothing), so they travel while this
        thread computes."""
        self._enter("AllReduce", buffer)
        try:
            request = self.comm.Iallreduce(self._in_place, buffer, op=self._sum)
        except self._mpi.Exception as exc:
            self.broken = f"{_collective('AllReduce', buffer)} failed"
            raise CommunicationError(
                f"{_collective('AllReduce', buffer)} on rank {self.rank} of {self.size} failed "
                f"to start in MPI: {exc.Get_error_string()}") from None
        finally:
            self._waiting = None
        with self._progress_lock:
            self._started.append(request)
            if self._progress is None:
                self._progress = threading.Thread(target=self._make_progress, daemon=True,
                                                  name="graphkernel-mpi-progress")
                self._progress.start()
            self._sums_pending.set()
        return PendingMPISum(self, buffer, request)

    def _finish(self, pending: PendingMPISum) -> None:
        def wait() -> None:
            try:
                pending.request.Wait()
            finally:
                with self._progress_lock:
                    self._started.remove(pending.request)
                    if not self._started:
                        self._sums_pending.clear()
        self._collective("AllReduce", pending.buffer, wait)

    def _make_progress(self) -> None:
        """While sums are pending: enter MPI every PROGRESS_INTERVAL_S. The probe touches no
        request (MPI forbids two threads completing one), only drives Open MPI's progress
        engine; it sleeps on an event otherwise, and ends with the group."""
        status = self._mpi.Status()
        while not self._stop_watching.is_set():
            if not self._sums_pending.wait(0.5):
                continue
            self._progress_comm.Iprobe(source=self._mpi.ANY_SOURCE, tag=_PROGRESS_TAG,
                                       status=status)
            time.sleep(PROGRESS_INTERVAL_S)

    def allgather(self, buffer: np.ndarray) -> np.ndarray:
        """Every rank's `buffer` (the same shape and dtype on all), stacked in rank order."""
        out = np.empty((self.size, *buffer.shape), buffer.dtype)
        self._collective("AllGather", buffer,
                         lambda: self.comm.Allgather(np.ascontiguousarray(buffer), out))
        return out

    def _collective(self, name: str, buffer: np.ndarray, call: Callable[[], None]) -> None:
        """Run the blocking MPI collective `call` in the watchdog's view; an MPI error (ranks
        that pass buffers of different sizes: MPI_ERR_TRUNCATE) is a CommunicationError."""
        self._enter(name, buffer)
        try:
            call()
        except self._mpi.Exception as exc:
            self.broken = f"{_collective(name, buffer)} failed"
            raise CommunicationError(
                f"{_collective(name, buffer)} on rank {self.rank} of {self.size} failed in "
                f"MPI: {exc.Get_error_string()} (do all ranks pass the same tensors?)") from None
        finally:
            self._waiting = None

    def _enter(self, name: str, buffer: np.ndarray) -> None:
        if self.broken is not None:
            raise CommunicationError(f"{_collective(name, buffer)} on rank {self.rank} of "
                                     f"{self.size}: the process group is unusable: "
                                     f"{self.broken}")
        if self._left:
            raise CommunicationError(f"{_collective(name, buffer)} on rank {self.rank} of "
                                     f"{self.size}: rank(s) {sorted(self._left)} have left the "
                                     "group (their program ended); this collective would wait "
                                     "for them forever")
        self._waiting = (name, buffer, time.monotonic())

    # The watchdog thread and the end of the job.

    def _watch(self) -> None:
        """Until stopped: end the job on a failure notice or a collective past its time."""
        while not self._stop_watching.wait(_WATCH_INTERVAL_S):
            if self._notice_request.Test(self._notice_status):
                self._end_on_notice(self._notice_status.Get_source())
            while self._failures.Iprobe(source=self._mpi.ANY_SOURCE, tag=_LEFT_TAG,
                                        status=self._notice_status):
                source = self._notice_status.Get_source()
                self._failures.Recv([bytearray(0), self._mpi.BYTE], source=source,
                                    tag=_LEFT_TAG)
                self._left[source] = time.monotonic()
            waiting = self._waiting
            if waiting is not None and self._left and time.monotonic() - max(
                    waiting[2], min(self._left.values())) > STRANDED_S:
                what = _collective(waiting[0], waiting[1])
                error = CommunicationError(
                    f"{what} on rank {self.rank} of {self.size}: rank(s) {sorted(self._left)} "
                    "left the group (sys.exit, or the end of their program) while this rank "
                    "waits for them")
                self.broken = f"rank(s) {sorted(self._left)} left"
                _report(error)
                self._end_as_origin(error)
            if waiting is not None and time.monotonic() - waiting[2] > self.timeout:
                what = _collective(waiting[0], waiting[1])
                error = CommunicationError(
                    f"{what} on rank {self.rank} of {self.size}: the other ranks did not all "
                    f"join within {self.timeout:g} s (a rank stuck or gone; "
                    f"communication.init(timeout=...) or ${TIMEOUT_ENV} sets the limit)")
                self.broken = f"{what} timed out"
                _report(error)
                self._end_as_origin(error)

    def _end_on_notice(self, origin: int) -> None:
        length = self._notice_status.Get_count(self._mpi.BYTE)
        text = bytes(self._notice[:length]).decode("utf-8", "replace")
        self.broken = f"rank {origin} failed"
        waiting = self._waiting
        where = "outside any collective" if waiting is None else \
            f"in {_collective(waiting[0], waiting[1])}"
        _report(CommunicationError(f"rank {origin} of {self.size} failed with {text} (seen by "
                                   f"rank {self.rank}, {where}); the MPI job ends"))
        try:
            self._failures.Send([b"", self._mpi.BYTE], dest=origin, tag=_ACK_TAG)
        finally:
            # The failed rank aborts the job once every rank has reported; if it does not
            # (it cannot reach this one, say), this rank does.
            time.sleep(END_GRACE_S)
            self._abort()

    def end_job(self, error: BaseException) -> None:
        """This rank ends on `error` (already printed): stop the watchdog (it may be ending
        the job already: then the abort comes while waiting for it), tell the other ranks,
        wait until each has reported it or the grace passes, and abort the MPI job."""
        if self._watchdog is not None:
            self._stop_watching.set()
            self._watchdog.join()
        self._end_as_origin(error)

    def _end_as_origin(self, error: BaseException) -> None:
        mpi = self._mpi
        try:
            text = f"{type(error).__name__}: {error}"
            print(f"graphkernel: rank {self.rank} of {self.size} failed "
                  f"({text.splitlines()[0] if text else ''}); telling the other ranks, ending "
                  "the MPI job", file=sys.stderr)
            _flush()  # before any other rank can learn of it and end the job
            payload = text.encode("utf-8", "replace")[:_NOTICE_BYTES - 1]
            peers = [r for r in range(self.size) if r != self.rank]
            sends = [self._failures.Isend([payload, mpi.BYTE], dest=r, tag=_NOTICE_TAG)
                     for r in peers]
            # A peer is done when it acknowledged the notice, sent one of its own (it failed
            # too) or left. The posted receive may already hold such a notice.
            done: set[int] = set(self._left)
            status = mpi.Status()
            self._notice_request.Cancel()
            self._notice_request.Wait(status)
            if not status.Is_cancelled():
                done.add(status.Get_source())
            deadline = time.monotonic() + END_GRACE_S
            scratch = bytearray(_NOTICE_BYTES)
            while len(done) < len(peers) and time.monotonic() < deadline:
                if self._failures.Iprobe(source=mpi.ANY_SOURCE, tag=mpi.ANY_TAG, status=status):
                    self._failures.Recv([scratch, mpi.BYTE], source=status.Get_source(),
                                        tag=status.Get_tag())
                    done.add(status.Get_source())
                else:
                    time.sleep(0.01)
            mpi.Request.Testall(sends)
        finally:
            self._abort()

    def _abort(self) -> None:
        _flush()
        self.comm.Abort(1)

    def close(self) -> None:
        """Leave the group (at exit, before MPI finalizes; or on release()): stop the watchdog,
        stop listening for failure notices, and tell the other ranks, so that one left waiting
        in a collective for this one ends the job (after STRANDED_S) instead of waiting for
        ever. (The failure communicator stays until MPI finalizes: freeing it would be one
        more step the ranks must take together.)"""
        self._stop_watching.set()
        if self._progress is not None:
            self._progress.join()
            self._progress = None
        if self._watchdog is None:
            return
        self._watchdog.join()
        self._watchdog = None
        if self._notice_request != self._mpi.REQUEST_NULL:
            self._notice_request.Cancel()
            self._notice_request.Wait()
        mpi = self._mpi
        mpi.Request.Waitall([self._failures.Isend([b"", mpi.BYTE], dest=r, tag=_LEFT_TAG)
                             for r in range(self.size) if r != self.rank])


class PendingMPISum:
    """A sum MPIGroup.start_allreduce_sum began: `wait()` returns once its buffer holds the
    sum, under the group's watchdog (a rank failing or a wait past the timeout ends the job)."""

    def __init__(self, group: MPIGroup, buffer: np.ndarray, request: Any) -> None:
        self.group, self.buffer, self.request = group, buffer, request

    def wait(self) -> None:
        self.group._finish(self)


def _collective(name: str, buffer: np.ndarray) -> str:
    return f"{name} of {buffer.size} {buffer.dtype} value(s)"


def _report(error: BaseException) -> None:
    """Print `error` as Python prints an uncaught one (without a traceback: the watchdog's own
    would say nothing of where the program was)."""
    print(f"{type(error).__module__}.{type(error).__qualname__}: {error}", file=sys.stderr)
    _flush()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream: nothing more to say there
            pass


def _timeout(timeout: float | None) -> float:
    where = "communication.init(timeout=...)"
    if timeout is None:
        text = os.environ.get(TIMEOUT_ENV, "").strip()
        if not text:
            return DEFAULT_TIMEOUT_S
        where = f"${TIMEOUT_ENV}"
        try:
            timeout = float(text)
        except ValueError:
            raise CommunicationError(f"{where}={text!r}: give the seconds a collective may wait "
                                     "for the other ranks, a positive number") from None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not math.isfinite(timeout) or timeout <= 0:
        raise CommunicationError(f"{where}={timeout!r}: give the seconds a collective may wait "
                                 "for the other ranks, a positive number")
    return float(timeout)


def init(backend_name: str | None = None, *, timeout: float | None = None) -> None:
    """Join the process group of this run (MPI's world: every process mpirun started).

    `timeout`: the seconds a collective waits for the other ranks before it raises
    CommunicationError (default $GRAPHKERNEL_COMM_TIMEOUT, else 600). From here on an uncaught
    exception on any rank ends the whole job, its error reported on every rank."""
    if backend_name not in (None, "mpi"):
        raise CommunicationError(f"backend_name={backend_name!r}: graphkernel communicates "
                                 "through MPI only (backend_name='mpi' or None); MindSpore's "
                                 "hccl and nccl are for Ascend and GPU devices")
    seconds = _timeout(timeout)
    if "group" in _state:
        return
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise CommunicationError(f"communication.init() needs mpi4py and an MPI library "
                                 f"(apt-get install openmpi-bin libopenmpi-dev; pip install "
                                 f"mpi4py): {exc}") from None
    group = MPIGroup(MPI.COMM_WORLD, MPI, seconds)
    _state["group"] = group
    set_collectives(group)
    if group.size > 1:
        _install_excepthook(group)
    # The watchdog and the progress thread must stop before MPI finalizes (mpi4py's own exit
    # handler, registered earlier, runs later).
    atexit.register(group.close)


def _install_excepthook(group: MPIGroup) -> None:
    previous = sys.excepthook

    def end_job_on_error(kind: type[BaseException], error: BaseException,
                         trace: TracebackType | None) -> None:
        previous(kind, error, trace)  # the traceback, as it would be printed anyway
        group.end_job(error)

    _state["excepthook"] = (end_job_on_error, previous)
    sys.excepthook = end_job_on_error


def use_group(group: Any) -> None:
    """Install a process group other than MPI's: an object with `size`, `rank`,
    `allreduce_sum(buffer)` (in place) and `allgather(buffer)` (every rank's buffer, stacked).
    Tests use one that stands for several ranks."""
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


def check_same_parameters(parameters: Sequence[tuple[str, tuple[int, ...], np.dtype]],
                          what: str = "the parameters") -> None:
    """Raise CommunicationError on every rank unless all ranks hold the same parameters: the
    same (name, shape, dtype), in the same order. One small collective (a digest of each
    rank's list); the lists themselves travel only when the digests differ, to name the first
    difference."""
    group = _group()
    if group.size == 1:
        return
    listed = [[str(name), [int(n) for n in shape], np.dtype(dtype).name]
              for name, shape, dtype in parameters]
    encoded = json.dumps(listed).encode()
    digests = group.allgather(np.frombuffer(hashlib.sha256(encoded).digest(), np.uint8))
    if (digests == digests[0]).all():
        return
    lengths = group.allgather(np.array([len(encoded)], np.int64))[:, 0]
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[:len(encoded)] = np.frombuffer(encoded, np.uint8)
    everyone = [json.loads(row[:n].tobytes()) for row, n in
                zip(group.allgather(padded), lengths)]
    other = next(r for r in range(1, group.size) if not (digests[r] == digests[0]).all())
    raise CommunicationError(f"the ranks disagree on {what}: "
                             f"{_first_difference(everyone[0], everyone[other], other)} "
                             f"(seen by rank {group.rank}; every rank must build the same "
                             "network with the same parameters before the first step)")


def _first_difference(first: list[list[Any]], other: list[list[Any]], rank: int) -> str:
    def shown(entry: list[Any] | None) -> str:
        if entry is None:
            return "no such parameter"
        return f"{entry[0]!r} of shape {tuple(entry[1])} and dtype {entry[2]}"

    for index in range(max(len(first), len(other))):
        mine = first[index] if index < len(first) else None
        theirs = other[index] if index < len(other) else None
        if mine != theirs:
            name = (mine or theirs or ["?"])[0]
            counts = "" if len(first) == len(other) else \
                f" (rank 0 has {len(first)} parameter(s), rank {rank} {len(other)})"
            return (f"parameter #{index} ({name!r}): rank 0 has {shown(mine)}, rank {rank} has "
                    f"{shown(theirs)}{counts}")
    return f"rank 0 and rank {rank} list the same parameters but their digests differ"


def release() -> None:
    """Leave the group (MPI itself finalizes when the process exits)."""
    group = _state.pop("group", None)
    set_collectives(None)
    hook = _state.pop("excepthook", None)
    if hook is not None and sys.excepthook is hook[0]:
        sys.excepthook = hook[1]
    if isinstance(group, MPIGroup):
        group.close()


__all__ = ["init", "get_rank", "get_group_size", "release", "use_group", "check_same_parameters",
           "MPIGroup", "DEFAULT_TIMEOUT_S"]
