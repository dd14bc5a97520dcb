"""A system that runs in a helper process, driven round by round from the benchmark process.

The helper times its own calls (the same loop as local runners) and answers over a pipe; the
benchmark process sleeps in a blocking read meanwhile, so systems still run one at a time,
interleaved in the same rounds. Used for MindSpore, whose import changes process-wide settings
(OMP_NUM_THREADS=1, LD_LIBRARY_PATH) and writes kernel folders into the working directory.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from bench.systems import Runner

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RemoteError(RuntimeError):
    pass


class RemoteWorker:
    def __init__(self, module: str, env: dict[str, str] | None = None) -> None:
        self.folder = tempfile.mkdtemp(prefix="gk-bench-worker-")
        self.log_path = os.path.join(self.folder, "worker.log")
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        child_env = dict(os.environ if env is None else env)
        child_env["PYTHONPATH"] = os.pathsep.join(
            [REPO_ROOT] + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p])
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, str(to_child_r), str(to_parent_w)],
            cwd=self.folder, env=child_env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            pass_fds=(to_child_r, to_parent_w))
        log.close()
        os.close(to_child_r)
        os.close(to_parent_w)
        self.send = Connection(to_child_w, readable=False, writable=True)
        self.recv = Connection(to_parent_r, readable=True, writable=False)

    def request(self, cmd: str, **kwargs: Any) -> Any:
        if self.proc.poll() is not None:
            raise RemoteError(f"helper process exited with code {self.proc.returncode}; "
                              f"log: {self.log_tail()}")
        self.send.send((cmd, kwargs))
        try:
            status, value = self.recv.recv()
        except EOFError as exc:
            self.proc.wait(timeout=10)
            raise RemoteError(f"helper process died (code {self.proc.returncode}) during "
                              f"{cmd!r}; log: {self.log_tail()}") from exc
        if status != "ok":
            raise RemoteError(value)
        return value

    def log_tail(self, n: int = 1500) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                return fh.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def runner(self, system: str, mode: str, n_sets: int) -> Runner:
        return RemoteRunner(self, system, mode, n_sets)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send.send(("exit", {}))
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.send.close()
        self.recv.close()


class RemoteRunner(Runner):
    def __init__(self, worker: RemoteWorker, system: str, mode: str, n_sets: int) -> None:
        super().__init__(system, mode, lambda i: None, n_sets=n_sets)
        self.worker = worker

    def run_once(self, i: int = 0) -> np.ndarray:
        return self.worker.request("output", mode=self.mode, index=i % self.n_sets)

    def time(self, k: int, start: int) -> float:
        return float(self.worker.request("time", mode=self.mode, k=k, start=start))


def serve(handlers: dict[str, Callable[..., Any]]) -> None:
    """The helper side: answer requests until told to exit."""
    recv = Connection(int(sys.argv[1]), readable=True, writable=False)
    send = Connection(int(sys.argv[2]), readable=False, writable=True)
    while True:
        try:
            cmd, kwargs = recv.recv()
        except EOFError:
            return
        if cmd == "exit":
            send.send(("ok", None))
            return
        try:
            send.send(("ok", handlers[cmd](**kwargs)))
        except Exception as exc:  # reported to the benchmark process, which records it
            send.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))


def time_calls(call: Callable[[int], Any], k: int, start: int, n: int) -> float:
    indices = [(start + j) % n for j in range(k)]
    t0 = time.perf_counter()
    for i in indices:
        call(i)
    return time.perf_counter() - t0
