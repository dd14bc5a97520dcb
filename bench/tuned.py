"""Tuned against untuned, side by side in one run (issue 30, item 1): each workload compiled
with fusion on three times, twice with the defaults (calibrated on this machine) and once with
`--online_tuning=LEVEL` (every knob of backends/c/tuning.py: threads, streaming stores,
prefetch and its distance, vector width, the pointwise chunk, row pipelining and the row and
column block sizes), then called in alternating rounds (untuned, tuned, untuned again, ...) so
that the load of the machine falls on all alike. Wall time per call (the choices include
threads, so one-thread CPU time would hide them). What to read: the ratio untuned/tuned and the
spread of its per-round values, beside the same ratio between the two untuned executables
(identical kernels: this host's noise at this load). Where no kernel's C differs, the tuned
side is the untuned one and its ratio is noise too.

    python -m bench.tuned [--suite quick|full] [--only KEY,...] [--level N] [--rounds N]
                          [--out FILE.md]

The kernel cache (and its tuning records) is a fresh temporary folder, so the untuned side has
no records and this run stores none of the user's.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from bench.workloads import SUITES, TRAIN_KINDS, Workload, make_arrays

ROUNDS = 15  # alternating rounds; each times CALLS calls of each side
CALLS = 5
SIDES = ("untuned", "tuned", "untuned again")


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else \
        [values[0]] * 3
    return q[0], q[1], q[2]


@dataclass
class Row:
    key: str
    kernels: int  # generated kernels
    differ: int  # of them, those whose C the tuning changed
    changed: list[str]  # "kernel: knob=value, ..." per kernel away from the defaults
    untuned_ms: float
    tuned_ms: float
    ratio: tuple[float, float, float]  # untuned/tuned per round: quartiles
    control: tuple[float, float, float]  # untuned/untuned again per round: quartiles
    tuning_s: float
    same: bool  # tuned results equal the untuned ones within the workload's tolerances
    load: tuple[float, float]  # 1-minute load average before and after


def _row(w: Workload, level: int, rounds: int, calls: int) -> Row:
    import graphkernel
    from bench.gk_cells import make_cell
    from graphkernel.graph_kernel.flags import parse_flags
    from graphkernel.graph_kernel.pipeline import CompileOptions
    inputs, params = make_arrays(w)
    arrays = list(inputs.values())
    load_before = os.getloadavg()[0]
    plain = graphkernel.compile(make_cell(w, params), *arrays,
                                options=CompileOptions(enable_graph_kernel=True))
    again = graphkernel.compile(make_cell(w, params), *arrays,
                                options=CompileOptions(enable_graph_kernel=True))
    start = time.perf_counter()
    tuned = graphkernel.compile(make_cell(w, params), *arrays,
                                options=CompileOptions(enable_graph_kernel=True, flags=parse_flags(
                                    f"--online_tuning={level}")))
    tuning_s = time.perf_counter() - start
    want, got = plain.run_arrays(*arrays)[0], tuned.run_arrays(*arrays)[0]
    scale = float(np.max(np.abs(want))) or 1.0
    same = bool(np.allclose(got, want, rtol=w.rtol, atol=w.atol * scale))
    samples: dict[str, list[float]] = {side: [] for side in SIDES}
    for _ in range(rounds):
        for side, exe in zip(SIDES, (plain, tuned, again)):
            t = time.perf_counter()
            for _ in range(calls):
                exe.run_arrays(*arrays)
            samples[side].append((time.perf_counter() - t) / calls)
    notes = tuned.executable.plan.schedule_notes
    chosen = {k: v.split(" (")[0].removeprefix("tuned here: ").removeprefix("tuned: ")
              for k, v in notes.items()}
    changed = [f"{k}: {v}" for k, v in chosen.items() if v != "defaults"]
    plain_c = {k.name: k.source for k in plain.kernels if k.source}
    differ = sum(plain_c.get(k.name) != k.source for k in tuned.kernels if k.source)
    ratios = [u / t for u, t in zip(samples["untuned"], samples["tuned"])]
    control = [u / a for u, a in zip(samples["untuned"], samples["untuned again"])]
    untuned_ms = statistics.median(samples["untuned"]) * 1e3
    tuned_ms = statistics.median(samples["tuned"]) * 1e3
    return Row(w.key, len(plain_c), differ, changed, untuned_ms, tuned_ms, _quartiles(ratios),
               _quartiles(control), tuning_s, same, (load_before, os.getloadavg()[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tuned", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), default="quick",
                        help="workload sizes (default quick)")
    parser.add_argument("--only", default="", help="comma-separated workload keys")
    parser.add_argument("--level", type=int, default=1, choices=(1, 2, 3),
                        help="--online_tuning level of the tuned side (default 1)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"alternating rounds per workload (default {ROUNDS})")
    parser.add_argument("--calls", type=int, default=CALLS,
                        help=f"calls of each side per round (default {CALLS})")
    parser.add_argument("--out", default=None, help="markdown file to write")
    args = parser.parse_args(argv)
    os.environ["GRAPHKERNEL_CACHE_DIR"] = tempfile.mkdtemp(prefix="gk-bench-tuned-")
    from graphkernel.backends.c.tuning import cpu_model
    only = {k for k in args.only.split(",") if k}
    workloads = [w for w in SUITES[args.suite]() if w.kind not in TRAIN_KINDS and
                 (not only or w.key in only)]
    rows = []
    for w in workloads:
        rows.append(_row(w, args.level, args.rounds, args.calls))
        r = rows[-1]
        print(f"{w.key:<28} untuned {r.untuned_ms:8.3f} ms  tuned {r.tuned_ms:8.3f} ms  "
              f"{r.ratio[1]:.2f}x [{r.ratio[0]:.2f}-{r.ratio[2]:.2f}]  untuned/again "
              f"{r.control[1]:.2f}x  C differs in {r.differ} of {r.kernels}  "
              f"({r.tuning_s:.1f} s tuning, load {r.load[0]:.1f}-{r.load[1]:.1f})",
              flush=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Tuned against untuned, one run ({when})",
             "", f"`python -m bench.tuned {' '.join(argv if argv is not None else sys.argv[1:])}`"
             f" on {cpu_model()} ({os.cpu_count()} CPUs), Python {platform.python_version()}; "
             f"`--online_tuning={args.level}`; wall time per call, median of {args.rounds} "
             f"alternating rounds (untuned, tuned, untuned again) of {args.calls} calls each. "
             "Ratios: the median of the per-round ratios [their quartiles]; untuned/again "
             "compares two executables with identical kernels (this host's noise). Load: the "
             "1-minute load average before and after the row.", "",
             "| workload | load | kernels (C differs) | untuned ms | tuned ms | untuned/tuned "
             "| untuned/again | tuning s | same results | choices away from the defaults |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]

    def ratio(q: tuple[float, float, float]) -> str:
        return f"{q[1]:.2f}x [{q[0]:.2f}-{q[2]:.2f}]"
    for r in rows:
        lines.append(f"| {r.key} | {r.load[0]:.1f}-{r.load[1]:.1f} | {r.kernels} "
                     f"({r.differ}) | {r.untuned_ms:.3f} | {r.tuned_ms:.3f} | "
                     f"{ratio(r.ratio)} | {ratio(r.control)} | {r.tuning_s:.1f} | "
                     f"{'yes' if r.same else 'NO'} | {'; '.join(r.changed) or '-'} |")
    text = "\n".join(lines) + "\n"
    out = args.out or os.path.join(os.path.dirname(__file__), "results",
                                   time.strftime("%Y-%m-%d-tuned.md", time.gmtime()))
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"written: {out}")
    return 0 if all(r.same for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
