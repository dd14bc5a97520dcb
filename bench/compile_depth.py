"""Compile time against depth: a stack of 1, 2, 4 and 12 of the bench's encoder layers
(bench/real_models.py `gk_encoder`, the full-suite size: hidden 256, 4 heads, inner 1024,
batch 8, seq 128), cold and warm, printed as a markdown table. Each figure is a fresh process:
cold with an empty kernel cache, warm with the cache the cold run filled. The compile (cell
construction to a runnable graph) is timed apart from the first call: that call computes the
whole stack, so it grows with depth whatever the compiler does. CPU is the process's and its
compilers' (what waiting on a loaded machine does not inflate), and of it the Python process's
own (the passes, C emission; not the C compiler). The compiler probe runs before
the clock starts (it is saved once per machine, not per model).

    python bench/compile_depth.py                        # this checkout
    python bench/compile_depth.py --tree before=/path/to/old/checkout --tree after=.

Several trees are measured in turn for each depth, so a loaded machine's swings fall on all of
them alike; quote ratios from one run. `--rounds N` repeats each measurement and keeps the
median.
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

# Run in the measured tree: one JSON line of seconds.
_WORKER = """
import json, os, sys, time
import numpy as np
sys.path.insert(0, os.getcwd())
import graphkernel
from bench.gk_cells import EncoderLayer  # noqa: F401  (imports before the clock)
from bench.real_models import encoder_params, gk_encoder
from bench.workloads import full_suite
from graphkernel.backends.c import toolchain
from graphkernel.graph_kernel.pipeline import CompileOptions
toolchain.detect()
d = next(w for w in full_suite() if w.kind == "encoder").dims
params = encoder_params({depth}, d["hidden"], d["inner"])
x = np.random.default_rng(0).standard_normal((d["batch"], d["seq"], d["hidden"])).astype(
    np.float32)


def cpu():
    t = os.times()
    return t[0] + t[1] + t[2] + t[3]  # this process (all threads) and its compilers


def own_cpu():
    t = os.times()
    return t[0] + t[1]  # this process alone: Python (and numpy), not the C compiler


c0, p0, t0 = cpu(), own_cpu(), time.perf_counter()
cell = gk_encoder(params, d["batch"], d["seq"], d["hidden"], d["heads"])
exe = graphkernel.compile(cell, x, options=CompileOptions(enable_graph_kernel=True))
c1, p1, t1 = cpu(), own_cpu(), time.perf_counter()
exe(graphkernel.Tensor(x)).asnumpy()
c2, t2 = cpu(), time.perf_counter()
exe(graphkernel.Tensor(x)).asnumpy()
t3 = time.perf_counter()
timeline = getattr(exe.report, "timeline", [])
print(json.dumps({{"compile_s": t1 - t0, "compile_cpu_s": c1 - c0,
                  "compile_python_cpu_s": p1 - p0, "first_call_s": t2 - t1,
                  "first_call_cpu_s": c2 - c1, "steady_s": t3 - t2,
                  "kernels": len(exe.kernels), "cache": exe.report.compile_cache.split(":")[0],
                  "timeline": timeline}}))
"""


def measure(tree: str, depth: int, cache: str) -> dict:
    """One fresh process of `tree` compiling and calling a `depth`-layer stack with the kernel
    cache `cache`: its seconds (see _WORKER)."""
    env = dict(os.environ, PYTHONPATH=tree, GRAPHKERNEL_CACHE_DIR=cache)
    done = subprocess.run([sys.executable, "-c", _WORKER.format(depth=depth)], env=env,
                          cwd=tree, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{tree}, {depth} layers failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(runs: list[dict]) -> dict:
    out = dict(runs[0])
    for key in ("compile_s", "compile_cpu_s", "compile_python_cpu_s", "first_call_s",
                "first_call_cpu_s", "steady_s"):
        out[key] = statistics.median(r[key] for r in runs)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[],
                        help="LABEL=PATH of a graphkernel checkout (default: this one)")
    parser.add_argument("--depths", default=",".join(map(str, DEPTHS)))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args(argv)
    trees = [t.split("=", 1) for t in args.tree] or [["this", ROOT]]
    depths = [int(d) for d in args.depths.split(",")]
    runs: dict[tuple[str, str, int], list[dict]] = {}
    for _ in range(args.rounds):
        for depth in depths:
            for label, path in trees:
                with tempfile.TemporaryDirectory(prefix="gk-depth-") as cache:
                    os.chmod(cache, 0o700)
                    for phase in ("cold", "warm"):
                        r = measure(os.path.abspath(path), depth, cache)
                        runs.setdefault((label, phase, depth), []).append(r)
                        print(f"  {label}: {depth} layers {phase}: compile {r['compile_s']:.3f} s"
                              f" (CPU {r['compile_cpu_s']:.2f}), first call "
                              f"{r['first_call_s']:.3f} s, {r['cache']}", file=sys.stderr)
    res = {k: _median(v) for k, v in runs.items()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"tree": k[0], "phase": k[1], "layers": k[2], "runs": v}
                       for k, v in runs.items()], f, indent=1)
    one = depths[0]
    for label, _ in trees:
        if len(trees) > 1:
            print(f"\n### {label}\n")
        head = ["layers", "kernels", "cold compile (s)", f"/ {one} layer", "cold compile CPU (s)",
                f"/ {one} layer", "of which Python (s)", f"/ {one} layer",
                "cold first call (s)", "warm compile (s)",
                "warm compile CPU (s)", "warm first call (s)", "steady call (s)",
                "warm first result - steady (s)"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---:|" * len(head))
        for depth in depths:
            c, w, c1 = res[label, "cold", depth], res[label, "warm", depth], res[label, "cold", one]
            print(f"| {depth} | {c['kernels']} | {c['compile_s']:.2f} | "
                  f"{c['compile_s'] / c1['compile_s']:.2f}x | {c['compile_cpu_s']:.2f} | "
                  f"{c['compile_cpu_s'] / c1['compile_cpu_s']:.2f}x | "
                  f"{c['compile_python_cpu_s']:.2f} | "
                  f"{c['compile_python_cpu_s'] / c1['compile_python_cpu_s']:.2f}x | "
                  f"{c['first_call_s']:.3f} | "
                  f"{w['compile_s']:.3f} | {w['compile_cpu_s']:.3f} | {w['first_call_s']:.3f} | "
                  f"{w['steady_s']:.3f} | "
                  f"{w['compile_s'] + w['first_call_s'] - w['steady_s']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
