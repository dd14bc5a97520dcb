"""`python -m bench [--quick] [...]`: run the benchmark, write results.json, results.md and
chart.png.

The benchmark process runs with OMP_WAIT_POLICY=PASSIVE and without OPENBLAS_CORETYPE /
OPENBLAS_L2_SIZE (set on some machines for old OpenBLAS builds; they slow a current numpy) and
without PYTHONDONTWRITEBYTECODE (set in some sandboxes: a user's warm process finds Python's
bytecode cache written, and the compile probes' warm processes must too): it re-executes itself
with that environment, and records what it removed. `--keep-env` runs in the environment as
given (what CI does).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any

# PYTHONDONTWRITEBYTECODE: without the bytecode cache every warm compile probe compiled
# graphkernel's modules from source (148-165 ms warm first result of the digits CNN, 83-86 ms
# with it), a cost no user's second process pays.
REMOVE = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "PYTHONDONTWRITEBYTECODE")
SET = {"OMP_WAIT_POLICY": "PASSIVE"}
MARKER = "GK_BENCH_REEXEC"
# The name usage lines give this program: `graphkernel bench` sets it for the child it starts.
PROG_VARIABLE = "GK_BENCH_PROG"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=os.environ.get(PROG_VARIABLE, "python -m bench"),
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="small sizes, few rounds, graphkernel compile probes only (a smoke run "
                        "of correctness; its times mean little)")
    p.add_argument("--suite", choices=("full", "quick", "tiny"), default=None,
                   help="the workload sizes: full (the committed run), quick (what --quick "
                        "runs), tiny (the tests' sizes); default full, or quick with --quick")
    p.add_argument("--rounds", type=int, default=None, help="rounds per workload")
    p.add_argument("--systems", default=None,
                   help="comma-separated system keys (gk_fused, gk_unfused, numpy, numexpr, "
                        "torch, inductor, jax, onnxruntime, openvino, mindspore); default all "
                        "installed")
    p.add_argument("--workloads", default=None,
                   help="comma-separated workload keys or kinds (basic, composite, chain, "
                        "bias_gelu, layernorm, softmax, mlp, encoder, cnn, bert)")
    p.add_argument("--compile-probes", choices=("all", "graphkernel", "none"), default=None,
                   help="cold/warm compile times in new processes (default: all for the full "
                        "suite, graphkernel for --quick)")
    p.add_argument("--out", default=None,
                   help="output folder (default bench/results, or bench/results/quick)")
    p.add_argument("--real", action="store_true",
                   help="the real-size rows instead of the suite (bench/real.py: BERT-base, "
                        "ResNet-18/50, MobileNetV2, ONNX exports from PyTorch, imported vs "
                        "hand-written, the compile-time table); slow, never part of --quick")
    p.add_argument("--only", default=None,
                   help="with --real: comma-separated row names or groups (real, onnx, "
                        "imported, compile_table)")
    p.add_argument("--compile-table", action="store_true",
                   help="print the compile-time table alone: cold and warm first result of "
                        "1, 2, 4 and 12 of the bench's encoder layers")
    p.add_argument("--keep-env", action="store_true",
                   help="do not re-execute with OMP_WAIT_POLICY=PASSIVE and without "
                        "OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE/PYTHONDONTWRITEBYTECODE")
    return p


def _reexec(argv: list[str]) -> None:
    """Replace this process with one whose environment is the benchmark's."""
    if os.environ.get(MARKER) is not None:
        return
    env = dict(os.environ)
    changes = {k: env.pop(k) for k in REMOVE if k in env}
    for k, v in SET.items():
        if env.get(k) != v:
            changes[k] = env.get(k, "(unset)")
            env[k] = v
    if not changes:
        return
    env[MARKER] = json.dumps(changes)
    env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT] + [p for p in env.get("PYTHONPATH", "")
                                                       .split(os.pathsep) if p])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "bench", *argv], env)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if not args.keep_env:
        _reexec(argv)
    if args.real or args.compile_table or args.only:
        return _real(args, argv)
    from bench.harness import Config, run
    from bench.report import write_all

    suite = args.suite or ("quick" if args.quick else "full")
    overrides: dict[str, Any] = {}
    if args.rounds:
        overrides["rounds"] = args.rounds
        overrides["overhead_rounds"] = max(args.rounds, 3)
    if args.systems:
        overrides["systems"] = [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.workloads:
        overrides["workloads"] = [s.strip() for s in args.workloads.split(",") if s.strip()]
    if args.compile_probes:
        overrides["compile_probes"] = args.compile_probes
    cfg = Config.quick(suite=suite, **overrides) if args.quick or suite != "full" else \
        Config(suite=suite, **overrides)
    results = run(cfg)
    removed = os.environ.get(MARKER)
    results["removed_environment"] = json.loads(removed) if removed else {}
    out_dir = args.out or os.path.join(REPO_ROOT, "bench", "results",
                                       "" if suite == "full" else suite)
    command = "python -m bench" + ("" if not argv else " " + shlex.join(argv))
    paths = write_all(results, os.path.abspath(out_dir), command)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    bad = failures(results)
    for line in bad:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if bad else 0


def _real(args: argparse.Namespace, argv: list[str]) -> int:
    """--real / --only / --compile-table (bench/real.py)."""
    from bench import real, real_report

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)
    if args.compile_table and not args.real and not args.only:
        table = real.compile_table(log)
        print("\n".join(real_report.compile_table_lines(table)))
        return 0 if all("error" not in r.get(c, {}) for r in table["rows"]
                        for c in ("cold", "warm")) else 1
    only = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else None
    if args.compile_table and only is not None:
        only.append("compile_table")
    removed = os.environ.get(MARKER)
    command = "python -m bench" + ("" if not argv else " " + shlex.join(argv))
    out_dir = os.path.abspath(args.out or os.path.join(REPO_ROOT, "bench", "results"))

    def save(results: dict[str, Any]) -> dict[str, str]:  # after every row: a long run
        results["removed_environment"] = json.loads(removed) if removed else {}  # keeps rows
        return real_report.write(results, out_dir, command)
    results = real.run(only, args.rounds or 5, log, on_row=save)
    paths = save(results)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    bad = [f"{r['name']} {k}: {s['status']}: {s.get('error', '')[:300]}"
           for r in results["rows"] for k, s in r["systems"].items()
           if s["status"] not in ("ok", "skipped")]
    bad += [f"{r['name']}: {r['error'][:300]}" for r in results["rows"] if "error" in r]
    for line in bad:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if bad else 0


def failures(results: dict[str, Any]) -> list[str]:
    """Every system output that failed to compile, run or check (not-applicable excluded)."""
    out = []
    for w in results["workloads"]:
        for key, rec in w["systems"].items():
            if rec.get("status") in ("failed to compile", "no runner", "crashed"):
                out.append(f"{w['key']} {key}: {rec['status']}: {rec.get('error', '')[:300]}")
            for mode, m in rec.get("modes", {}).items():
                if m.get("status") != "ok":
                    out.append(f"{w['key']} {key}/{mode}: {m.get('status')}: "
                               f"{m.get('error', '')[:300]}")
    for wk, row in results.get("compile_times", {}).get("workloads", {}).items():
        for key, r in row.items():
            for c in ("cold", "warm"):
                p = r.get(c) or {}
                if "error" in p or p.get("ok") is False:
                    why = p.get("error") or p.get("check_error") or "wrong answer"
                    out.append(f"compile probe {wk} {key} {c}: {why[:300]}")
    return out


if __name__ == "__main__":
    sys.exit(main())
