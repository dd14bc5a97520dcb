"""Before/after of a code-generation setting, in one process: a model compiled twice, once with
each setting, its calls alternated, each step's (and each whole call's) thread CPU time at one
thread, the minimum over the calls. On a shared, loaded host the minimum of interleaved calls
moves ~1% between runs where process-by-process means moved 10-30%.

    python -m bench.codegen_ab MODEL [--calls N] [--whole] [--threads T] [--swap] A B

A and B: comma-separated module settings, `module:NAME=python literal` (empty: as the code
is), applied while that side compiles, e.g.
`graphkernel.backends.c.conv_tile:DEFAULT_VECTORS=4`. Each side compiles cold, into a new kernel
cache folder of its own (removed after): a warm build finds its library from the plan record,
whose key knows graphkernel's files but not a setting changed in memory, so a reused folder
would run whatever that setting made there before. MODEL: as bench/thread_steps.py builds it
(resnet18_b1, resnet50_b1, suite:mlp, ...).
Per step or whole calls: the steps run one by one on the Python runner, as
`Runner.profile` does; --whole times the compiled call (the C entry) instead.

--swap compiles B first (to check that the order of the builds does not matter).
--threads T: T OpenMP threads, timed by the wall clock (a thread's CPU time leaves out the other
threads' work), a warm call before each timed one: with --whole each whole call, without it
each kernel within whole calls of the compiled entry, as its profile records them
(`profile_kernels`), the least over the calls.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # thread CPU time is the step's only at one thread


def apply(spec: str) -> list[tuple[Any, str, Any]]:
    """Set each `module:NAME=literal` of `spec`; returns what to put back."""
    old = []
    for item in filter(None, spec.split(",")):
        module, rest = item.split(":", 1)
        name, value = rest.split("=", 1)
        mod = importlib.import_module(module)
        old.append((mod, name, getattr(mod, name)))
        setattr(mod, name, ast.literal_eval(value))
    return old


def build(model: str, spec: str, tag: str) -> tuple[Any, list[Any]]:
    from bench import thread_steps
    root = os.environ.get("GRAPHKERNEL_CACHE_DIR")
    old = apply(spec)
    try:
        with tempfile.TemporaryDirectory() as tmp, \
                tempfile.TemporaryDirectory(prefix=f"codegen-ab-{tag}-") as cache:
            os.environ["GRAPHKERNEL_CACHE_DIR"] = cache  # cold: see the module's doc
            fn, args = thread_steps._build(model, tmp)
    finally:
        for mod, name, value in old:
            setattr(mod, name, value)
        if root is None:
            os.environ.pop("GRAPHKERNEL_CACHE_DIR", None)
        else:
            os.environ["GRAPHKERNEL_CACHE_DIR"] = root
    fn(*args)
    fn(*args)  # warm: pools, first-touch pages
    return fn, args


def step_runner(fn: Any, args: list[Any]) -> Callable[[dict[int, float]], None]:
    """One call, step by step, each step's thread CPU kept as the least seen so far."""
    executable = fn.executable
    runner, plan = executable.runner, executable.plan
    arrays = executable.check_inputs([a.asnumpy() for a in args])
    weights = fn._weights()

    def call(best: dict[int, float]) -> None:
        slots = list(runner._template)
        for s, a in zip(plan.inputs, arrays):
            slots[s] = a
        for s, a in zip(plan.weights, weights):
            slots[s] = a
        for i, (step_fn, dead) in enumerate(zip(runner.step_fns, plan.release)):
            t0 = time.thread_time()
            step_fn(slots)
            best[i] = min(best.get(i, 1e9), time.thread_time() - t0)
            for s in dead:
                slots[s] = None
    return call


def kernel_runner(fn: Any, args: list[Any]) -> Callable[[dict[int, float]], None]:
    """A warm call, then one whole call on the compiled entry, each kernel's wall time as its
    profile records it kept as the least seen so far."""
    def call(best: dict[int, float]) -> None:
        fn(*args)  # the other side's call just ran: its data left the caches
        for i, seconds in enumerate(fn.profile_kernels(*args, repeats=1)):
            best[i] = min(best.get(i, 1e9), seconds)
    return call


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--whole", action="store_true", help="whole compiled calls, not steps")
    ap.add_argument("--swap", action="store_true", help="compile B first (see the doc)")
    ap.add_argument("--threads", type=int, default=1,
                    help="OpenMP threads; above 1, whole calls (--whole) or each kernel "
                         "within them timed by the wall clock")
    args = ap.parse_args(argv)
    # Before anything loads an OpenMP runtime (the builds below): it reads this once.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    order = ("B", "A") if args.swap else ("A", "B")
    sides = {tag: build(args.model, args.a if tag == "A" else args.b, tag) for tag in order}
    print(f"# {args.model}, {args.threads} thread(s), {args.calls} calls a side alternating; "
          f"A [{args.a}] B [{args.b}]; compiled first: {order[0]}")
    if args.whole:
        times: dict[str, list[float]] = {"A": [], "B": []}
        for i in range(args.calls):
            for tag in ("A", "B") if i % 2 == 0 else ("B", "A"):
                fn, xs = sides[tag]
                if args.threads != 1:
                    fn(*xs)  # the other side's call just ran: its data left the caches
                t0 = clock()
                fn(*xs)
                times[tag].append(clock() - t0)
        for tag, ts in times.items():
            print(f"{tag}: min {min(ts) * 1e3:.2f} ms, median {statistics.median(ts) * 1e3:.2f}")
        print(f"B/A min {min(times['B']) / min(times['A']):.3f}, median "
              f"{statistics.median(times['B']) / statistics.median(times['A']):.3f}; "
              f"load {os.getloadavg()[0]:.1f}")
        return
    runner = step_runner if args.threads == 1 else kernel_runner
    calls = {tag: runner(*side) for tag, side in sides.items()}
    best: dict[str, dict[int, float]] = {"A": {}, "B": {}}
    for i in range(args.calls):
        for tag in ("A", "B") if i % 2 == 0 else ("B", "A"):
            calls[tag](best[tag])
    fn = sides["A"][0]
    rows = [step.op_names for step in fn.executable.plan.steps] if args.threads == 1 else \
        [kernel.op_names for kernel in fn.kernels]
    what = "step" if args.threads == 1 else "kernel #"
    print(f"| {what} | ops | A ms | B ms | B/A |\n|---|---|---|---|---|")
    for i, op_names in enumerate(rows):
        a, b = best["A"][i], best["B"].get(i, 0.0)
        if a >= 5e-5:
            label = "+".join(dict.fromkeys(op_names))[:40]
            print(f"| {i} | {label} | {a * 1e3:.3f} | {b * 1e3:.3f} | {b / a:.3f} |")
    sa, sb = sum(best["A"].values()), sum(best["B"].values())
    print(f"sum A {sa * 1e3:.2f} ms, B {sb * 1e3:.2f} ms, B/A {sb / sa:.3f}; "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
