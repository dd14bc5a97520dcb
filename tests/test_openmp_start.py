"""The OpenMP runtime is started when a library with a parallel kernel is loaded on the main
thread (backends/c/library.py `start_openmp`), not inside the graph's first call; a library with
no parallel region, or a compile on another thread, leaves it to the first call. Each case runs
in a new interpreter: the runtime starts once per process."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

from cells import needs_openmp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PRELUDE = textwrap.dedent("""
    import sys, threading
    sys.path.insert(0, {root!r})
    import numpy as np
    import graphkernel
    from graphkernel import nn
    from graphkernel.backends.c import library
    from graphkernel.graph_kernel.pipeline import CompileOptions
    from graphkernel.ops import operations as P

    class Net(nn.Cell):
        def construct(self, x):
            return P.Tanh()(x * 0.5) + x

    def compile_for(rows):
        x = np.random.default_rng(rows).standard_normal((rows, 512)).astype(np.float32)
        exe = graphkernel.compile(Net(), x, options=CompileOptions(enable_graph_kernel=True))
        threaded = any("omp parallel" in (k.source or "") for k in exe.kernels)
        return exe, x, threaded
""")


def _run(body: str, tmp_path: Any) -> list[str]:
    script = tmp_path / "case.py"
    script.write_text(_PRELUDE.format(root=ROOT) + textwrap.dedent(body))
    env = dict(os.environ, GRAPHKERNEL_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split()


@needs_openmp
def test_a_parallel_kernel_starts_the_runtime_at_compile(tmp_path: Any) -> None:
    # 1024 x 512 elements is above CostModel.parallel_threshold; 4 x 512 is below it.
    out = _run("""
        exe, x, threaded = compile_for(4)
        print(threaded, library._openmp_started)
        exe, x, threaded = compile_for(1024)
        print(threaded, library._openmp_started)
        got = exe.run_arrays(x)[0]
        print(bool(np.allclose(got, np.tanh(x * 0.5) + x, rtol=1e-5, atol=1e-6)))
    """, tmp_path)
    assert out == ["False", "False", "True", "True", "True"]


@needs_openmp
def test_a_compile_on_another_thread_leaves_the_runtime_to_the_first_call(
        tmp_path: Any) -> None:
    out = _run("""
        box = {}
        def work():
            box["exe"], box["x"], box["threaded"] = compile_for(1024)
            box["started"] = library._openmp_started
            out = box["exe"].run_arrays(box["x"])[0]
            box["ok"] = bool(np.allclose(out, np.tanh(box["x"] * 0.5) + box["x"],
                                         rtol=1e-5, atol=1e-6))
        t = threading.Thread(target=work)
        t.start()
        t.join()
        print(box["threaded"], box["started"], box["ok"])
        # The main thread's own compile of the same graph starts it (the library is cached).
        exe, x, threaded = compile_for(1024)
        print(library._openmp_started)
    """, tmp_path)
    assert out == ["True", "False", "True", "True"]
