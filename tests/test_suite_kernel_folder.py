"""The test suite's own kernel folder (tests/conftest.py): its kernels keep out of the user's
cache, and every pytest-xdist worker of a run compiles into the one folder of that run."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import graphkernel
from graphkernel import nn
from graphkernel.backends.c import cache, toolchain
from graphkernel.graph_kernel.pipeline import CompileOptions

needs_cc = pytest.mark.skipif(toolchain.detect() is None, reason="needs a C compiler")


def _compile(x: np.ndarray, cell: nn.Cell) -> Any:
    return graphkernel.compile(cell, x, options=CompileOptions(enable_graph_kernel=True))


@needs_cc
def test_the_suite_compiles_into_its_own_folder_not_the_users(user_cache_dir: str) -> None:
    # Kernels no one has compiled before (constants drawn now), one built in this process and
    # one in a child process started as the tests start theirs, land in the session's folder
    # and not in the folder the user's own runs use.
    import secrets
    session = cache.cache_dir()
    assert session == os.environ["GRAPHKERNEL_CACHE_DIR"] and session != user_cache_dir

    def libraries(folder: str) -> set[str]:
        return {f for f in os.listdir(folder) if f.endswith(".so")} \
            if os.path.isdir(folder) else set()

    # Other pytest-xdist workers add libraries to the same folder meanwhile: the two kernels
    # are told apart by the paths their builds report.
    before = libraries(session)
    k1, k2 = (1 + secrets.randbelow(10**9) / 1e12 for _ in range(2))
    parent = _compile(np.ones((3, 4), np.float32), ScaleShift(k1)).library_path
    code = textwrap.dedent(f"""
        import numpy as np
        import graphkernel
        from graphkernel import nn
        from graphkernel.graph_kernel.pipeline import CompileOptions

        class ScaleShift(nn.Cell):
            def construct(self, x):
                return x * {k2!r} + 1.0

        exe = graphkernel.compile(ScaleShift(), np.ones((3, 4), np.float32),
                                  options=CompileOptions(enable_graph_kernel=True))
        print(exe.library_path)
    """)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr
    built = {parent, child.stdout.strip().splitlines()[-1]}
    assert {os.path.dirname(path) for path in built} == {session}, built
    new = {os.path.basename(path) for path in built}
    assert len(new) == 2 and new <= libraries(session) - before, (new, before)
    assert not new & libraries(user_cache_dir)


def test_pytest_xdist_workers_compile_into_one_folder(tmp_path: Any) -> None:
    # The test command runs on pytest-xdist workers (pyproject's addopts): each worker imports
    # tests/conftest.py, and all must take the one kernel folder of the run, or each compiles
    # every kernel again. Every worker of a two-worker run (--dist each) writes down its folder.
    tests = os.path.dirname(os.path.abspath(__file__))
    (tmp_path / "test_folder.py").write_text(textwrap.dedent(f"""
        import os

        def test_write_the_folder():
            with open(os.path.join({str(tmp_path)!r}, os.environ["PYTEST_XDIST_WORKER"] + ".txt"),
                      "w") as fh:
                fh.write(os.environ["GRAPHKERNEL_CACHE_DIR"])
    """))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "GRAPHKERNEL_TEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([tests, os.path.dirname(tests)])
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                          "conftest", "-n", "2", "--dist", "each", "-o", "addopts=",
                          str(tmp_path / "test_folder.py")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    folders = {open(tmp_path / f"gw{i}.txt").read() for i in range(2)}
    assert len(folders) == 1, folders


class ScaleShift(nn.Cell):
    def __init__(self, k: float) -> None:
        super().__init__()
        self.k = k

    def construct(self, x: Any) -> Any:
        return x * self.k + 1.0
