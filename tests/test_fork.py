"""Fork safety: a process that ran parallel (OpenMP) kernels can fork, and the child runs kernels
too, directly after os.fork() and in multiprocessing pools with the fork and spawn start methods.

Every scenario runs in its own interpreter under a timeout, so a hang fails the test instead of
blocking the suite."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from cells import needs_openmp

from graphkernel.backends.c import toolchain

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# 1024 x 512 elements is above CostModel.parallel_threshold (2**17): the kernel's outer loop is
# an OpenMP parallel region.
_PRELUDE = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    import numpy as np
    import graphkernel
    from graphkernel import nn
    from graphkernel.graph_kernel.pipeline import CompileOptions
    from graphkernel.ops import operations as P

    class Net(nn.Cell):
        def construct(self, x):
            return P.Tanh()(x * 0.5 + 0.25) * x + P.ReduceSum(keep_dims=True)(x, -1)

    def want(x):
        return np.tanh(x * 0.5 + 0.25) * x + x.sum(-1, keepdims=True)

    def run(seed):
        x = np.random.default_rng(seed).standard_normal((1024, 512)).astype(np.float32)
        out = EXE.run_arrays(x)[0]
        return float(np.abs(out - want(x)).max())

    x0 = np.zeros((1024, 512), np.float32)
    EXE = graphkernel.compile(Net(), x0, options=CompileOptions(enable_graph_kernel=True))
    assert any(k.backend == "native" and "omp parallel" in k.source for k in EXE.kernels), \\
        [k.source for k in EXE.kernels]
""")


def _mapped_runtimes() -> str:
    return ("mapped = {n for n in ('libomp.so', 'libgomp.so') "
            "if n in open('/proc/self/maps').read()}")


RUNTIMES = [pytest.param("llvm", marks=pytest.mark.skipif(
                toolchain.find_libomp() is None, reason="LLVM libomp is not installed")),
            "gnu"]


def _run(body: str, tmp_path: Any, runtime: str, timeout: float = 120) -> tuple[str, str]:
    script = tmp_path / "scenario.py"
    script.write_text(_PRELUDE.format(root=ROOT) + textwrap.dedent(body))
    env = dict(os.environ, GRAPHKERNEL_OPENMP=runtime,
               GRAPHKERNEL_CACHE_DIR=str(tmp_path / "cache"))
    # Its own session, so that a hung forked child is killed with it.
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the scenario hung (no answer in {timeout} s): {out!r} {err[-2000:]!r}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # any child left behind
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, out + err
    return out, err


def _check_runtime(out: str, err: str, runtime: str, forked: bool) -> None:
    # Kernels really link to the runtime asked for, and only to it.
    want = "libomp.so" if runtime == "llvm" else "libgomp.so"
    assert out.splitlines()[-1] == f"mapped {[want]}", out
    # With libgomp a forked child runs kernels on one thread, and says so.
    said = err.count("kernels here run on one thread")
    assert (said > 0) == (runtime == "gnu" and forked), err


@needs_openmp
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_forked_child_runs_parallel_kernels(tmp_path: Any, runtime: str) -> None:
    out, err = _run("""
        assert run(1) < 1e-4           # the parent's OpenMP threads exist now
        pid = os.fork()
        if pid == 0:                   # the child: its first parallel region must not hang
            try:
                err = run(2)
                os._exit(0 if err < 1e-4 else 3)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert run(3) < 1e-4           # and the parent still works
        print("ok")
        """ + _mapped_runtimes() + """
        print("mapped", sorted(mapped))
    """, tmp_path, runtime, timeout=60)
    assert out.splitlines()[0] == "ok"
    _check_runtime(out, err, runtime, forked=True)


@needs_openmp
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_multiprocessing_pool_runs_parallel_kernels(tmp_path: Any, method: str,
                                                      runtime: str) -> None:
    # With spawn, each worker imports the scenario afresh (compiling, or hitting the cache).
    out, err = _run(f"""
        import multiprocessing as mp
        if __name__ == "__main__":
            assert run(1) < 1e-4
            with mp.get_context({method!r}).Pool(2) as pool:
                errors = pool.map(run, range(10, 16))
            assert max(errors) < 1e-4, errors
            assert run(2) < 1e-4
            print("ok", len(errors))
            {_mapped_runtimes()}
            print("mapped", sorted(mapped))
    """, tmp_path, runtime, timeout=120)
    assert out.splitlines()[0] == "ok 6"
    _check_runtime(out, err, runtime, forked=method == "fork")


@needs_openmp
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_doctor_names_the_openmp_runtime(runtime: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from graphkernel.tools.doctor import doctor
    monkeypatch.setenv("GRAPHKERNEL_OPENMP", runtime)
    toolchain.detect.cache_clear()
    try:
        text, _ = doctor()
    finally:
        toolchain.detect.cache_clear()
    line = next(t for t in text.splitlines() if t.startswith("openmp   : "))
    if runtime == "llvm":
        assert line == f"openmp   : yes, LLVM libomp ({toolchain.find_libomp()}; fork-safe)"
        assert "-lomp" in text
    else:
        assert line.startswith("openmp   : yes, GNU libgomp (not fork-safe")
        assert "apt-get install libomp-dev" in text.splitlines()[-1]


def test_an_unknown_openmp_runtime_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphkernel.errors import ToolchainError
    monkeypatch.setenv("GRAPHKERNEL_OPENMP", "intel")
    toolchain.detect.cache_clear()
    try:
        with pytest.raises(ToolchainError, match="GRAPHKERNEL_OPENMP='intel' is not an OpenMP"):
            toolchain.detect()
    finally:
        toolchain.detect.cache_clear()


@needs_openmp
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_child_forked_between_the_compile_and_the_first_call_runs_kernels(
        tmp_path: Any, runtime: str) -> None:
    # The compile started the OpenMP runtime (backends/c/library.py start_openmp); no parallel
    # region ran before the fork.
    out, err = _run("""
        from graphkernel.backends.c import library
        assert library._openmp_started
        pid = os.fork()
        if pid == 0:
            try:
                os._exit(0 if run(2) < 1e-4 else 3)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert run(3) < 1e-4
        print("ok")
        """ + _mapped_runtimes() + """
        print("mapped", sorted(mapped))
    """, tmp_path, runtime, timeout=60)
    assert out.splitlines()[0] == "ok"
    _check_runtime(out, err, runtime, forked=True)
