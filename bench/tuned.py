"""Tuned against untuned, side by side in one run (issue 30, item 1): each workload compiled
with fusion on twice, with the defaults and with `--online_tuning=LEVEL`, then called in
alternating rounds (untuned, tuned, untuned, ...) so that the load of the machine falls on both
alike. Wall time per call (the choices include threads, so one-thread CPU time would hide
them); the ratio is what to read.

    python -m bench.tuned [--suite quick|full] [--only KEY,...] [--level N] [--out FILE.md]

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

import numpy as np

from bench.workloads import SUITES, TRAIN_KINDS, Workload, make_arrays

ROUNDS = 15  # alternating rounds; each times CALLS calls of each side
CALLS = 5


def _row(w: Workload, level: int) -> dict[str, object]:
    import graphkernel
    from bench.gk_cells import make_cell
    from graphkernel.graph_kernel.flags import parse_flags
    from graphkernel.graph_kernel.pipeline import CompileOptions
    inputs, params = make_arrays(w)
    arrays = list(inputs.values())
    plain = graphkernel.compile(make_cell(w, params), *arrays,
                                options=CompileOptions(enable_graph_kernel=True))
    start = time.perf_counter()
    tuned = graphkernel.compile(make_cell(w, params), *arrays,
                                options=CompileOptions(enable_graph_kernel=True, flags=parse_flags(
                                    f"--online_tuning={level}")))
    tuning_s = time.perf_counter() - start
    want, got = plain.run_arrays(*arrays)[0], tuned.run_arrays(*arrays)[0]
    scale = float(np.max(np.abs(want))) or 1.0
    same = bool(np.allclose(got, want, rtol=w.rtol, atol=w.atol * scale))
    samples: dict[str, list[float]] = {"untuned": [], "tuned": []}
    for _ in range(ROUNDS):
        for side, exe in (("untuned", plain), ("tuned", tuned)):
            t = time.perf_counter()
            for _ in range(CALLS):
                exe.run_arrays(*arrays)
            samples[side].append((time.perf_counter() - t) / CALLS)
    notes = tuned.executable.plan.schedule_notes
    chosen = {k: v.split(" (")[0].removeprefix("tuned here: ").removeprefix("tuned: ")
              for k, v in notes.items()}
    changed = [f"{k}: {v}" for k, v in chosen.items() if v != "defaults"]
    untuned_ms = statistics.median(samples["untuned"]) * 1e3
    tuned_ms = statistics.median(samples["tuned"]) * 1e3
    return {"key": w.key, "kernels": len([k for k in tuned.kernels if k.backend == "native"]),
            "measured": len(notes), "changed": changed, "untuned_ms": untuned_ms,
            "tuned_ms": tuned_ms, "ratio": untuned_ms / tuned_ms, "tuning_s": tuning_s,
            "same": same}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tuned", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), default="quick",
                        help="workload sizes (default quick)")
    parser.add_argument("--only", default="", help="comma-separated workload keys")
    parser.add_argument("--level", type=int, default=1, choices=(1, 2, 3),
                        help="--online_tuning level of the tuned side (default 1)")
    parser.add_argument("--out", default=None, help="markdown file to write")
    args = parser.parse_args(argv)
    os.environ["GRAPHKERNEL_CACHE_DIR"] = tempfile.mkdtemp(prefix="gk-bench-tuned-")
    from graphkernel.backends.c.tuning import cpu_model
    only = {k for k in args.only.split(",") if k}
    workloads = [w for w in SUITES[args.suite]() if w.kind not in TRAIN_KINDS and
                 (not only or w.key in only)]
    rows = []
    for w in workloads:
        rows.append(_row(w, args.level))
        r = rows[-1]
        print(f"{w.key:<28} untuned {r['untuned_ms']:8.3f} ms  tuned {r['tuned_ms']:8.3f} ms  "
              f"{r['ratio']:.2f}x  ({r['tuning_s']:.1f} s tuning)", flush=True)
    load = os.getloadavg()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Tuned against untuned, one run ({when})",
             "", f"`python -m bench.tuned {' '.join(argv if argv is not None else sys.argv[1:])}`"
             f" on {cpu_model()} ({os.cpu_count()} CPUs, load {load[0]:.1f}), Python "
             f"{platform.python_version()}; `--online_tuning={args.level}`, wall time per call, "
             f"median of {ROUNDS} alternating rounds of {CALLS} calls.", "",
             "| workload | kernels | measured | untuned ms | tuned ms | untuned/tuned | tuning s "
             "| same results | choices away from the defaults |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['key']} | {r['kernels']} | {r['measured']} | {r['untuned_ms']:.3f} | "
                     f"{r['tuned_ms']:.3f} | {r['ratio']:.2f}x | {r['tuning_s']:.1f} | "
                     f"{'yes' if r['same'] else 'NO'} | {'; '.join(r['changed']) or '-'} |")
    text = "\n".join(lines) + "\n"
    out = args.out or os.path.join(os.path.dirname(__file__), "results",
                                   time.strftime("%Y-%m-%d-tuned.md", time.gmtime()))
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"written: {out}")
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
