"""Kernels linked to LLVM's OpenMP runtime (libomp, fork-safe) against GCC's (libgomp), side by
side in one run: `python -m bench.openmp_runtime [--rounds 3] [--suite full]`.

A process has one OpenMP runtime, so each runtime times the workloads in its own process; the
two alternate for `--rounds` rounds, and each workload's figure is the best of its rounds (the
2-vCPU machines are time-shared). Prints a table of times and libomp / libgomp ratios."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from bench.workloads import SUITES

# Workloads whose kernels take the OpenMP path (above CConfig.parallel_threshold) or measure
# the call overhead (4x4); the matmul networks mostly time BLAS.
KINDS = ("basic", "composite", "chain", "bias_gelu", "layernorm", "softmax", "encoder")


def _time_one(suite: str, key: str, min_s: float) -> dict[str, float]:
    import numpy as np

    import graphkernel
    from bench.gk_cells import make_cell
    from bench.workloads import make_arrays, reference
    from graphkernel.backends.c import toolchain
    from graphkernel.graph_kernel.pipeline import CompileOptions
    w = next(w for w in SUITES[suite]() if w.key == key)
    inputs, params = make_arrays(w)
    args = list(inputs.values())
    exe = graphkernel.compile(make_cell(w, params), *args,
                              options=CompileOptions(enable_graph_kernel=True))
    out = exe.run_arrays(*args)[0]
    ref = reference(w, inputs, params)
    assert np.allclose(out, ref, rtol=max(w.rtol, 2e-4), atol=1e-3 * float(np.abs(ref).max()))
    for _ in range(3):
        exe.run_arrays(*args)
    best, spent, calls = float("inf"), 0.0, 0
    while spent < min_s or calls < 5:
        start = time.perf_counter()
        exe.run_arrays(*args)
        took = time.perf_counter() - start
        best, spent, calls = min(best, took), spent + took, calls + 1
    return {"seconds": best, "runtime": toolchain.detect().openmp_runtime}


def _worker(suite: str, keys: list[str], min_s: float) -> None:
    results = {key: _time_one(suite, key, min_s) for key in keys}
    print(json.dumps(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--suite", default="full", choices=sorted(SUITES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=0.5)
    parser.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        _worker(args.suite, args.worker, args.min_seconds)
        return 0
    keys = [w.key for w in SUITES[args.suite]() if w.kind in KINDS]
    best: dict[str, dict[str, float]] = {"llvm": {}, "gnu": {}}
    names: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="gk-omp-bench-") as cache:
        for _ in range(args.rounds):
            for runtime in ("gnu", "llvm"):
                env = dict(os.environ, GRAPHKERNEL_OPENMP=runtime, GRAPHKERNEL_CACHE_DIR=cache)
                done = subprocess.run([sys.executable, "-m", "bench.openmp_runtime", "--suite",
                                       args.suite, "--min-seconds", str(args.min_seconds),
                                       "--worker", *keys], env=env, capture_output=True,
                                      text=True, check=True)
                for key, res in json.loads(done.stdout.splitlines()[-1]).items():
                    best[runtime][key] = min(best[runtime].get(key, float("inf")),
                                             res["seconds"])
                    names[runtime] = res["runtime"]
    print(f"gnu : {names['gnu']}\nllvm: {names['llvm']}\n")
    print("| workload | libgomp ms | libomp ms | libomp / libgomp |\n|---|---:|---:|---:|")
    for key in keys:
        g, llvm = best["gnu"][key], best["llvm"][key]
        print(f"| {key} | {g * 1e3:.3f} | {llvm * 1e3:.3f} | {llvm / g:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
