"""Compile time against depth: cold and warm first result of a stack of 1, 2, 4 and 12
identical encoder layers (examples/bert_tiny.py's, hidden 128, batch 2, seq 32), printed as a
markdown table. Each figure is a fresh process: cold with an empty kernel cache, warm with the
cache the cold run filled. The compiler probe runs before the clock starts (it is saved once per
machine, not per model).

    python bench/compile_depth.py                        # this checkout
    python bench/compile_depth.py --tree before=/path/to/old/checkout --tree after=.

Several trees are measured in turn for each depth, so a loaded machine's swings fall on all of
them alike; quote ratios from one run.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPTHS = (1, 2, 4, 12)

# Run in the measured tree: the seconds from the call that compiles to its result.
_WORKER = """
import sys, time
import numpy as np
sys.path.insert(0, {examples!r})
import graphkernel as ms
from graphkernel import context
from graphkernel.backends.c import toolchain
import bert_tiny
toolchain.detect()
context.set_context(enable_graph_kernel=True)
net = bert_tiny.BertTiny(bert_tiny.Config(num_layers={depth}))
rng = np.random.default_rng(0)
ids = ms.Tensor(rng.integers(1, 1000, (2, 32)).astype(np.int32))
mask = ms.Tensor(np.ones((2, 32), np.int32))
import os
cpu0, start = os.times(), time.perf_counter()
out = net(ids, mask)
out[0].asnumpy()
wall, cpu1 = time.perf_counter() - start, os.times()
cpu = sum(cpu1[:4]) - sum(cpu0[:4])  # this process and its compilers
print(wall, cpu)
"""


def first_result(tree: str, depth: int, cache: str) -> tuple[float, float]:
    """Seconds to the first result of a `depth`-layer stack in a fresh process of `tree`, and
    the CPU seconds it took (the process's and its compilers': what a loaded machine's waiting
    does not inflate)."""
    env = dict(os.environ, PYTHONPATH=tree, GRAPHKERNEL_CACHE_DIR=cache)
    code = _WORKER.format(examples=os.path.join(ROOT, "examples"), depth=depth)
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{tree}, {depth} layers failed:\n{done.stderr[-3000:]}")
    wall, cpu = done.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[],
                        help="LABEL=PATH of a graphkernel checkout (default: this one)")
    parser.add_argument("--depths", default=",".join(map(str, DEPTHS)))
    args = parser.parse_args(argv)
    trees = [t.split("=", 1) for t in args.tree] or [["this", ROOT]]
    depths = [int(d) for d in args.depths.split(",")]
    cold: dict[tuple[str, int], tuple[float, float]] = {}
    warm: dict[tuple[str, int], tuple[float, float]] = {}
    for depth in depths:
        for label, path in trees:
            with tempfile.TemporaryDirectory(prefix="gk-depth-") as cache:
                os.chmod(cache, 0o700)
                cold[label, depth] = first_result(os.path.abspath(path), depth, cache)
                warm[label, depth] = first_result(os.path.abspath(path), depth, cache)
            print(f"  {label}: {depth} layers cold {cold[label, depth][0]:.2f} s, warm "
                  f"{warm[label, depth][0]:.3f} s", file=sys.stderr)
    labels = [label for label, _ in trees]
    head = ["layers"] + [f"cold {lb} (s)" for lb in labels] + \
        [f"cold {lb} / {depths[0]} layer" for lb in labels] + \
        [f"cold {lb} CPU (s)" for lb in labels] + \
        [f"cold {lb} CPU / {depths[0]} layer" for lb in labels] + \
        [f"warm {lb} (s)" for lb in labels]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for depth in depths:
        row = [str(depth)]
        for k in (0, 1):  # wall, then CPU
            row += [f"{cold[lb, depth][k]:.2f}" for lb in labels]
            row += [f"{cold[lb, depth][k] / cold[lb, depths[0]][k]:.2f}x" for lb in labels]
        row += [f"{warm[lb, depth][0]:.3f}" for lb in labels]
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
