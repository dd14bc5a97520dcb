"""Running a test's snippet in a process of its own at a given OpenMP thread count (OpenMP reads
OMP_NUM_THREADS once per process), for tests that compare results across thread counts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_at_threads(code: str, threads: int, timeout: float = 600,
                   blas_threads: int | None = None, unset: tuple[str, ...] = ()) -> Any:
    """Run `code` (`python -c`, with the repository root as sys.argv[1] and on PYTHONPATH) with
    OMP_NUM_THREADS at `threads` and OPENBLAS_NUM_THREADS at `blas_threads` (default
    `threads`), without the variables named in `unset`; it must exit 0 and print one line
    `RESULT <json>`, whose value is returned."""
    blas = threads if blas_threads is None else blas_threads
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(blas),
               PYTHONPATH=ROOT)
    for name in unset:
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", code, ROOT], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])
