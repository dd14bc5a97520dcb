"""Warm first result (issue #30 item 5: at most 50 ms plus one steady call): for each of the
bench's workloads and a stack of 1, 2, 4 and 12 encoder layers, a new process with warm caches
(compile cache and kernels, filled by a cold process first) times the first `net(Tensor(x))`
from call to result, then one steady call; the figure is the first minus the steady call, and
the compile's own CPU within the first call (graphkernel.compile: trace, compile cache,
build, load), which the call's page faults and BLAS swings on a loaded machine do not reach.
Times are the process's CPU time (`time.process_time`: one thread, so waiting on a loaded
machine does not count) and wall time. Training steps: compile and the first step, then one.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python bench/warm_first.py \\
        --tree before=/path/to/old/checkout --tree after=. --rounds 3

Python's bytecode cache is written as a user's would be (PYTHONDONTWRITEBYTECODE is dropped).
Trees are measured in turn for each workload and round, so a loaded machine's swings fall on
all of them alike; quote ratios from one run. `--profile` adds a cProfile of one warm first
call per workload and tree (the top functions by cumulative time).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPTHS = (1, 2, 4, 12)

# Run in the measured tree: one JSON line.
_WORKER = """
import cProfile, io, json, os, pstats, sys, time
import numpy as np
sys.path.insert(0, os.getcwd())
import graphkernel
from bench.gk_cells import make_cell  # noqa: F401  (imports before the clock)
from bench.workloads import SUITES, input_sets
from graphkernel.backends.c import toolchain
from graphkernel.graph_kernel.pipeline import CompileOptions
toolchain.detect()
key, profile = {key!r}, {profile!r}
if key.startswith("encoder_layers_"):
    from bench.real_models import encoder_params, gk_encoder
    from bench.workloads import full_suite
    d = next(w for w in full_suite() if w.kind == "encoder").dims
    params = encoder_params(int(key.rsplit("_", 1)[1]), d["hidden"], d["inner"])
    x = np.random.default_rng(0).standard_normal((d["batch"], d["seq"], d["hidden"])).astype(
        np.float32)
    cell, arrays, train = gk_encoder(params, d["batch"], d["seq"], d["hidden"], d["heads"]), \\
        [x], False
else:
    from bench.systems import TRAIN_KINDS
    w = next(w for s in SUITES.values() for w in s() if w.key == key)
    sets, params = input_sets(w, [0])
    arrays = list(sets[0].values())
    train = w.kind in TRAIN_KINDS
    if train:
        from bench.training import gk_step_cell
        cell = gk_step_cell(w, params)
    else:
        cell = make_cell(w, params)
tensors = [graphkernel.Tensor(a) for a in arrays]
# The compile's share of the first call (CPU): the figure a loaded machine's page faults and
# BLAS swings in the call itself do not reach.
from graphkernel.frontend import compile as compile_module
compile_cpu = [0.0]
_compile = compile_module.compile
def timed_compile(*a, **k):
    c = time.process_time()
    try:
        return _compile(*a, **k)
    finally:
        compile_cpu[0] += time.process_time() - c
compile_module.compile = graphkernel.compile = timed_compile
if train:
    def first():
        exe = graphkernel.compile(cell, *arrays, options=CompileOptions(enable_graph_kernel=True))
        exe.run_arrays(*arrays)
        return exe
    def steady(exe):
        exe.run_arrays(*arrays)
else:
    graphkernel.context.set_context(mode=graphkernel.context.GRAPH_MODE, device_target="CPU",
                                    enable_graph_kernel=True)
    def result(out):
        return (out[0] if isinstance(out, tuple) else out).asnumpy()
    def first():
        return result(cell(*tensors))
    def steady(_):
        result(cell(*tensors))
prof = cProfile.Profile() if profile else None
c0, t0 = time.process_time(), time.perf_counter()
if prof:
    prof.enable()
made = first()
if prof:
    prof.disable()
c1, t1 = time.process_time(), time.perf_counter()
steady(made)
c2, t2 = time.process_time(), time.perf_counter()
out = {{"first_cpu_s": c1 - c0, "first_s": t1 - t0, "steady_cpu_s": c2 - c1,
        "steady_s": t2 - t1, "compile_cpu_s": compile_cpu[0]}}
if prof:
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
    out["profile"] = text.getvalue()
print(json.dumps(out))
"""


def measure(tree: str, key: str, cache: str, profile: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, GRAPHKERNEL_CACHE_DIR=cache)
    # A user's warm start finds Python's bytecode cache filled too: without it each process
    # compiles graphkernel's modules from source (~0.5 s), which is not graphkernel's work.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    done = subprocess.run([sys.executable, "-c", _WORKER.format(key=key, profile=profile)],
                          env=env, cwd=tree, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{tree}, {key} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[],
                        help="LABEL=PATH of a graphkernel checkout (default: this one)")
    parser.add_argument("--suite", default="full")
    parser.add_argument("--workloads", default="",
                        help="comma-separated workload keys (default: the suite's, then the "
                        "encoder stacks)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args(argv)
    from bench.workloads import SUITES
    trees = [t.split("=", 1) for t in args.tree] or [["this", ROOT]]
    keys = args.workloads.split(",") if args.workloads else \
        [w.key for w in SUITES[args.suite]()] + [f"encoder_layers_{d}" for d in DEPTHS]
    runs: dict[tuple[str, str], list[dict]] = {}
    profiles: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory(prefix="gk-warm-") as top:
        for key in keys:
            caches = {}
            for label, path in trees:  # the cold process fills each tree's caches
                caches[label] = os.path.join(top, f"{label}-{key}")
                os.makedirs(caches[label], mode=0o700)
                measure(os.path.abspath(path), key, caches[label])
            for _ in range(args.rounds):
                for label, path in trees:
                    r = measure(os.path.abspath(path), key, caches[label])
                    runs.setdefault((label, key), []).append(r)
                    print(f"  {label} {key}: first {r['first_cpu_s'] * 1e3:.1f} ms CPU, steady "
                          f"{r['steady_cpu_s'] * 1e3:.1f}", file=sys.stderr)
            if args.profile:
                for label, path in trees:
                    profiles[label, key] = measure(os.path.abspath(path), key, caches[label],
                                                   True)["profile"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": [{"tree": k[0], "workload": k[1], "runs": v}
                                for k, v in runs.items()],
                       "profiles": {f"{k[0]} {k[1]}": v for k, v in profiles.items()}}, f,
                      indent=1)
    head = ["workload"] + [f"{label}: first - steady, ms CPU (wall)" for label, _ in trees] + \
        [f"{label}: steady, ms CPU" for label, _ in trees] + \
        [f"{label}: its compile, ms CPU" for label, _ in trees]
    if len(trees) > 1:
        head += [f"{trees[-1][0]} / {trees[0][0]}", "compile: ratio"]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for key in keys:
        cells, over = [key], []
        for label, _ in trees:
            rs = runs[label, key]
            cpu = statistics.median(r["first_cpu_s"] - r["steady_cpu_s"] for r in rs)
            wall = statistics.median(r["first_s"] - r["steady_s"] for r in rs)
            over.append(cpu)
            cells.append(f"{cpu * 1e3:.1f} ({wall * 1e3:.1f})")
        cells += [f"{statistics.median(r['steady_cpu_s'] for r in runs[label, key]) * 1e3:.1f}"
                  for label, _ in trees]
        compiles = [statistics.median(r["compile_cpu_s"] for r in runs[label, key])
                    for label, _ in trees]
        cells += [f"{c * 1e3:.1f}" for c in compiles]
        if len(trees) > 1:
            cells.append(f"{over[-1] / over[0]:.2f}x" if over[0] > 0 else "-")
            cells.append(f"{compiles[-1] / compiles[0]:.2f}x" if compiles[0] > 0 else "-")
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
