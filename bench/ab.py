"""Before/after: time the bench's workloads on two checkouts of graphkernel, side by side.

    python -m bench.ab BEFORE_DIR AFTER_DIR [--rounds N] [--budget-min M] [--suite full]
                       [--all-cores] [--out bench/results/DATE-ab-NAME.md] [--json RUN.json]
    python -m bench.ab --report RUN.json [OUT.md]

BEFORE_DIR and AFTER_DIR are checkouts (worktrees) of the repository, each with its own `bench/`
and `graphkernel/`. Every round runs, workload by workload, one fresh Python process per side
(the side that goes first alternates from one workload and one round to the next), with that
side's checkout first on PYTHONPATH and its own kernel-cache folder. The process prepares the
graphkernel systems (fused, shape-generic, unfused) and numpy eager, checks each answer against
the float64 reference, warms up, then times samples of k calls of every system, the systems'
order rotated from sample to sample, each sample after one untimed call of the same system (as
bench/harness.py does). It records each sample's wall time and the process's CPU time, per call.

numpy eager runs the same code on both sides: its after/before ratio is the control, ~1.00 when
the host was steady; a row is flagged only when every round's after/before ratio lies on the
same side of 1 and its median ratio is further from 1 than the noise bound (the larger of
--noise and the control's largest deviation). By default one BLAS/OpenMP thread
(OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1, MKL_NUM_THREADS=1), where the CPU time of a loaded
host is least disturbed by other processes; --all-cores leaves the thread counts unset.

A first, untimed round compiles every workload on both sides (it fills each side's kernel and
compile caches), so the timed rounds measure calls, not compiles.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bench.machine import cpu_model

SIDES = ("before", "after")
DEFAULT_SYSTEMS = ("gk_fused", "gk_generic", "gk_unfused", "numpy")
CONTROL = "numpy"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# As `python -m bench` runs (bench/cli.py): passive OpenMP waits, no old-OpenBLAS overrides.
REMOVED_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


@dataclass
class Side:
    name: str  # "before" or "after"
    root: str  # the checkout: PYTHONPATH's first entry and the working folder
    commit: str
    cache_dir: str


@dataclass
class WorkerConfig:
    systems: tuple[str, ...] = DEFAULT_SYSTEMS
    samples: int = 5  # timed samples per system in one process
    min_sample_s: float = 0.02  # a sample holds enough calls to last this long
    warmup_s: float = 0.2


# ---------------------------------------------------------------------------------------------
# The worker: one side, one workload, in its own process (imports the side's bench/graphkernel)

def _make_system(key: str) -> Any:
    from bench.systems import GraphKernel, NumpyEager
    makers: dict[str, Callable[[], Any]] = {
        "gk_fused": lambda: GraphKernel(fused=True),
        "gk_generic": lambda: GraphKernel(fused=True, generic=True),
        "gk_unfused": lambda: GraphKernel(fused=False),
        "numpy": NumpyEager}
    if key not in makers:
        raise ValueError(f"unknown system {key!r}; known: {', '.join(makers)}")
    return makers[key]()


def _time_calls(runner: Any, k: int, start: int) -> tuple[float, float]:
    """Wall and process CPU seconds for k calls, rotating input sets from `start`."""
    call, n = runner._call, runner.n_sets
    indices = [(start + j) % n for j in range(k)]
    w0, c0 = time.perf_counter(), time.process_time()
    for i in indices:
        call(i)
    return time.perf_counter() - w0, time.process_time() - c0


def worker(suite: str, workload_key: str, cfg: WorkerConfig) -> dict[str, Any]:
    """Prepare, check and time every system on one workload (run in the side's process)."""
    from bench.harness import n_input_sets
    from bench.machine import l3_bytes
    from bench.training import reference
    from bench.workloads import SUITES, check, input_sets

    found = [w for w in SUITES[suite]() if w.key == workload_key]
    if not found:
        raise ValueError(f"no workload {workload_key!r} in the {suite} suite")
    w = found[0]
    n_sets = n_input_sets(w, l3_bytes(), 4)
    seeds = list(range(n_sets))
    sets, params = input_sets(w, seeds)
    ref = reference(w, sets[0], params)
    out: dict[str, Any] = {"workload": w.key, "systems": {}}
    live: list[tuple[str, Any]] = []
    for key in cfg.systems:
        system = _make_system(key)
        rec: dict[str, Any] = {}
        out["systems"][key] = rec
        why = system.supports(w)
        if why:
            rec["status"], rec["note"] = "not applicable", why
            continue
        t0 = time.perf_counter()
        prepared = system.prepare(w, sets, params, seeds)
        rec["prepare_s"] = time.perf_counter() - t0
        runner = prepared.runners[0]  # "fresh": a new output per call, as a user gets it
        result = check(w, runner.run_once(0), ref)
        rec["check_ok"] = bool(result["ok"])
        if not result["ok"]:
            rec["status"], rec["note"] = "wrong answer", str(result.get("error", ""))[:300]
            continue
        rec["status"] = "ok"
        for kernel_fact in ("kernel_count", "from_cache", "compile_cache"):
            if kernel_fact in prepared.info:
                rec[kernel_fact] = prepared.info[kernel_fact]
        live.append((key, runner))
    ks: dict[str, int] = {}
    for key, runner in live:
        t_end, times, i = time.perf_counter() + cfg.warmup_s, [], 0
        while (time.perf_counter() < t_end or i < 2) and i < 2000:
            times.append(_time_calls(runner, 1, i)[0])
            i += 1
        per_call = sorted(times[len(times) // 2:])[len(times[len(times) // 2:]) // 2]
        ks[key] = max(1, min(100_000, math.ceil(cfg.min_sample_s / max(per_call, 1e-8))))
        out["systems"][key].update(k=ks[key], wall_s=[], cpu_s=[])
    for s in range(cfg.samples):
        shift = s % max(1, len(live))
        for key, runner in live[shift:] + live[:shift]:
            k = ks[key]
            _time_calls(runner, 1, s * k + k)  # settle: the system after itself
            wall, cpu = _time_calls(runner, k, s * k)
            out["systems"][key]["wall_s"].append(wall / k)
            out["systems"][key]["cpu_s"].append(cpu / k)
    return out


def _worker_main(spec_path: str, out_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    cfg = WorkerConfig(systems=tuple(spec["systems"]), samples=spec["samples"],
                       min_sample_s=spec["min_sample_s"], warmup_s=spec["warmup_s"])
    result = worker(spec["suite"], spec["workload"], cfg)
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


# ---------------------------------------------------------------------------------------------
# The driver

def side_env(side: Side, all_cores: bool, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one side's worker process."""
    env = dict(os.environ if base is None else base)
    for name in REMOVED_VARIABLES:
        env.pop(name, None)
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    for name in THREAD_VARIABLES:
        if all_cores:
            env.pop(name, None)
        else:
            env[name] = "1"
    env["PYTHONPATH"] = side.root
    env["GRAPHKERNEL_CACHE_DIR"] = side.cache_dir
    return env


def run_worker(side: Side, suite: str, workload: str, cfg: WorkerConfig, all_cores: bool,
               timeout_s: float) -> dict[str, Any]:
    """One fresh process of `side` on one workload; its record, or its failure as a record."""
    with tempfile.TemporaryDirectory(prefix="gk-ab-") as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_path, "w") as f:
            json.dump({"suite": suite, "workload": workload, "systems": list(cfg.systems),
                       "samples": cfg.samples, "min_sample_s": cfg.min_sample_s,
                       "warmup_s": cfg.warmup_s}, f)
        # -P: this file's folder (bench/ of the after side) must not shadow the side's modules.
        cmd = [sys.executable, "-P", os.path.abspath(__file__), "--worker", spec_path, out_path]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=side.root, env=side_env(side, all_cores),
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"workload": workload, "error": f"timed out after {timeout_s:.0f} s",
                    "process_s": time.perf_counter() - t0}
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0 or not os.path.exists(out_path):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"workload": workload, "process_s": elapsed,
                    "error": f"exit {proc.returncode}: " + " | ".join(tail)[:600]}
        with open(out_path) as f:
            record: dict[str, Any] = json.load(f)
        record["process_s"] = elapsed
        return record


def side_first(round_index: int, workload_index: int) -> tuple[str, str]:
    """Which side runs first: alternates by workload within a round and by round."""
    return SIDES if (round_index + workload_index) % 2 == 0 else SIDES[::-1]


def collect(sides: dict[str, Side], suite: str, workloads: list[str], rounds: int,
            cfg: WorkerConfig, all_cores: bool, timeout_s: float,
            log: Callable[[str], None], budget_s: float = math.inf,
            save: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The untimed compile round, then up to `rounds` timed rounds, no round started that
    the last round's length says would end past `budget_s`; every worker record, tagged.
    `save` is given the run so far after each round."""
    started = time.perf_counter()
    records: list[dict[str, Any]] = []
    warm = WorkerConfig(systems=cfg.systems, samples=1, min_sample_s=0.0, warmup_s=0.0)
    for i, workload in enumerate(workloads):
        for name in side_first(0, i):
            rec = run_worker(sides[name], suite, workload, warm, all_cores, timeout_s)
            log(f"compile round {name:6s} {workload}: {rec['process_s']:.1f} s"
                + (f" ERROR {rec['error']}" if "error" in rec else ""))
    last_round_s = 0.0
    for r in range(1, rounds + 1):
        t_round = time.perf_counter()
        if r > 2 and t_round - started + last_round_s > budget_s:
            log(f"stopping after {r - 1} rounds: another would end past the "
                f"{budget_s / 60:.0f} min budget")
            break
        for i, workload in enumerate(workloads):
            for name in side_first(r, i):
                rec = run_worker(sides[name], suite, workload, cfg, all_cores, timeout_s)
                rec.update(side=name, round=r)
                records.append(rec)
                if "error" in rec:
                    log(f"round {r} {name} {workload}: ERROR {rec['error']}")
        last_round_s = time.perf_counter() - t_round
        log(f"round {r}/{rounds}: {last_round_s:.0f} s")
        if save is not None:
            save({"records": records, "rounds": r})
    return {"records": records, "rounds": max((rec["round"] for rec in records), default=0)}


# ---------------------------------------------------------------------------------------------
# The summary (pure: tests/test_bench_ab.py feeds it a fake run)

def median(values: Iterable[float]) -> float:
    v = sorted(values)
    if not v:
        return math.nan
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2


def percentile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    v = sorted(values)
    if not v:
        return math.nan
    pos = (len(v) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass
class Row:
    workload: str
    system: str
    before_cpu_s: float  # median per-call CPU time over every sample of every round
    after_cpu_s: float
    before_spread: float  # (p90 - p10) / median of the per-call CPU samples
    after_spread: float
    cpu_ratio: float  # median over rounds of after/before (each round's median sample)
    cpu_ratio_low: float  # the lowest and highest round's ratio
    cpu_ratio_high: float
    wall_ratio: float
    rounds: int
    note: str = ""
    flagged: bool = False


def _round_medians(records: list[dict[str, Any]], workload: str, system: str, side: str,
                   field: str) -> dict[int, float]:
    out = {}
    for rec in records:
        if rec.get("workload") != workload or rec.get("side") != side or "error" in rec:
            continue
        s = rec.get("systems", {}).get(system, {})
        if s.get("status") == "ok" and s.get(field):
            out[rec["round"]] = median(s[field])
    return out


def _samples(records: list[dict[str, Any]], workload: str, system: str, side: str,
             field: str) -> list[float]:
    return [v for rec in records if rec.get("workload") == workload and
            rec.get("side") == side and "error" not in rec
            for v in rec.get("systems", {}).get(system, {}).get(field, [])]


def _status_note(records: list[dict[str, Any]], workload: str, system: str) -> str:
    """Why a row has no timing: the first error or status other than ok, per side."""
    notes = []
    for side in SIDES:
        for rec in records:
            if rec.get("workload") != workload or rec.get("side") != side:
                continue
            if "error" in rec:
                notes.append(f"{side}: {rec['error']}")
                break
            s = rec.get("systems", {}).get(system, {})
            if s.get("status") not in (None, "ok"):
                notes.append(f"{side}: {s['status']}" + (f" ({s['note']})" if s.get("note")
                                                          else ""))
                break
    return "; ".join(notes)


def summarise(records: list[dict[str, Any]], workloads: list[str], systems: Iterable[str],
              noise: float) -> tuple[list[Row], dict[str, Any]]:
    """One row per workload and system, and the control's verdict; flags the rows outside
    noise (see the module doc)."""
    rows: list[Row] = []
    for workload in workloads:
        for system in systems:
            per_side = {side: _round_medians(records, workload, system, side, "cpu_s")
                        for side in SIDES}
            wall = {side: _round_medians(records, workload, system, side, "wall_s")
                    for side in SIDES}
            paired = sorted(set(per_side["before"]) & set(per_side["after"]))
            if not paired:
                note = _status_note(records, workload, system)
                if note:
                    nan = math.nan
                    rows.append(Row(workload, system, nan, nan, nan, nan, nan, nan, nan, nan,
                                    rounds=0, note=note))
                continue
            ratios = [per_side["after"][r] / per_side["before"][r] for r in paired]
            wall_paired = sorted(set(wall["before"]) & set(wall["after"]))
            samples = {side: _samples(records, workload, system, side, "cpu_s")
                       for side in SIDES}
            spread = {side: (percentile(v, 90) - percentile(v, 10)) / median(v)
                      for side, v in samples.items()}
            rows.append(Row(workload, system, median(samples["before"]),
                            median(samples["after"]), spread["before"], spread["after"],
                            median(ratios), min(ratios), max(ratios),
                            median(wall["after"][r] / wall["before"][r] for r in wall_paired),
                            len(paired)))
    control = [r for r in rows if r.system == CONTROL and r.rounds]
    deviation = max((abs(r.cpu_ratio - 1) for r in control), default=math.nan)
    bound = max(noise, deviation) if control else noise
    for r in rows:
        if r.system == CONTROL or not r.rounds:
            continue
        one_sided = r.cpu_ratio_low > 1 or r.cpu_ratio_high < 1
        r.flagged = one_sided and abs(r.cpu_ratio - 1) > bound
    verdict = {"control_rows": len(control),
               "control_median_ratio": median(r.cpu_ratio for r in control),
               "control_largest_deviation": deviation, "noise_bound": bound}
    return rows, verdict


def _ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms >= 0.01 else f"{ms:.2g}"


def markdown(rows: list[Row], verdict: dict[str, Any], header: list[str]) -> str:
    """The side-by-side table, the control's line and the flagged rows."""
    lines = list(header)
    lines += ["", f"Control (numpy eager, the same code on both sides): median after/before "
              f"CPU ratio {verdict['control_median_ratio']:.3f} over "
              f"{verdict['control_rows']} workloads, largest deviation from 1 "
              f"{verdict['control_largest_deviation']:.3f}. Noise bound used for the flags: "
              f"{verdict['noise_bound']:.3f}.", "",
              "CPU = process CPU time per call (median of every sample of every round); "
              "spread = (p90 - p10) / median of those samples; ratio = median over rounds of "
              "after/before, each round's median sample, [lowest, highest round]; wall = the "
              "same ratio in wall time. `!` marks a row outside noise.", "",
              "| workload | system | before CPU ms | after CPU ms | spread b / a | "
              "after/before CPU [range] | wall | |",
              "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if not r.rounds:
            lines.append(f"| {r.workload} | {r.system} | - | - | - | - | - | {r.note} |")
            continue
        lines.append(
            f"| {r.workload} | {r.system} | {_ms(r.before_cpu_s)} | {_ms(r.after_cpu_s)} | "
            f"{r.before_spread:.0%} / {r.after_spread:.0%} | {r.cpu_ratio:.3f} "
            f"[{r.cpu_ratio_low:.2f}, {r.cpu_ratio_high:.2f}] | {r.wall_ratio:.3f} | "
            f"{'!' if r.flagged else ''} |")
    flagged = [r for r in rows if r.flagged]
    lines += ["", f"Rows outside noise: {len(flagged)}" + (": " + ", ".join(
        f"{r.workload}/{r.system} ({r.cpu_ratio:.3f})" for r in flagged) if flagged else "."),
        ""]
    return "\n".join(lines)


def _git_commit(root: str) -> str:
    out = subprocess.run(["git", "-C", root, "log", "-1", "--format=%h %s"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "(not a git checkout)"



def report_main(json_path: str, out_path: str | None = None) -> int:
    """The markdown again from a run's --json file (after changing the summary, say)."""
    with open(json_path) as f:
        run = json.load(f)
    rows, verdict = summarise(run["records"], run["workloads"], run["systems"], run["noise"])
    text = markdown(rows, verdict, run["header"])
    if out_path:
        with open(out_path, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", help="the before checkout (its root folder)")
    p.add_argument("after", help="the after checkout (its root folder)")
    p.add_argument("--suite", choices=("full", "quick", "tiny"), default="full")
    p.add_argument("--workloads", default=None,
                   help="comma-separated workload keys (default: the whole suite)")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                   help="comma-separated systems among gk_fused, gk_generic, gk_unfused, numpy "
                        "(numpy is the control)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    p.add_argument("--budget-min", type=float, default=math.inf,
                   help="start no round that would end past this many minutes (the compile "
                        "round included; at least two timed rounds run)")
    p.add_argument("--samples", type=int, default=5,
                   help="timed samples per system in each process (default 5)")
    p.add_argument("--min-sample-s", type=float, default=0.02,
                   help="a sample holds enough calls to last this long (default 0.02 s)")
    p.add_argument("--all-cores", action="store_true",
                   help="leave the BLAS/OpenMP thread counts unset (default: one thread)")
    p.add_argument("--noise", type=float, default=0.03,
                   help="smallest deviation from 1 flagged (default 0.03)")
    p.add_argument("--timeout-s", type=float, default=600, help="per worker process")
    p.add_argument("--cache-dir", default=None,
                   help="folder for the two sides' kernel caches (default: a folder under "
                        "the system's temporary folder, kept between runs)")
    p.add_argument("--out", default=None, help="the markdown file (default: stdout)")
    p.add_argument("--json", default=None, help="also write every worker record here")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        if len(argv) != 3:
            print("usage: ab.py --worker SPEC.json OUT.json", file=sys.stderr)
            return 2
        return _worker_main(argv[1], argv[2])
    if argv[:1] == ["--report"]:
        if len(argv) not in (2, 3):
            print("usage: python -m bench.ab --report RUN.json [OUT.md]", file=sys.stderr)
            return 2
        return report_main(*argv[1:])
    args = _parser().parse_args(argv)
    for root in (args.before, args.after):
        if not os.path.isdir(os.path.join(root, "graphkernel")) or \
                not os.path.isdir(os.path.join(root, "bench")):
            print(f"bench.ab: {root} is not a graphkernel checkout (no graphkernel/ and bench/)",
                  file=sys.stderr)
            return 2
    cache_root = args.cache_dir or os.path.join(tempfile.gettempdir(), "gk-ab-cache")
    sides = {name: Side(name, os.path.abspath(root), _git_commit(root),
                        f"{cache_root}-{name}")
             for name, root in zip(SIDES, (args.before, args.after))}
    sys.path.insert(0, sides["after"].root)
    from bench.workloads import SUITES
    workloads = [w.key for w in SUITES[args.suite]()]
    if args.workloads:
        wanted = args.workloads.split(",")
        unknown = sorted(set(wanted) - set(workloads))
        if unknown:
            print(f"bench.ab: no workload {', '.join(unknown)} in the {args.suite} suite",
                  file=sys.stderr)
            return 2
        workloads = [w for w in workloads if w in wanted]
    systems = tuple(s for s in args.systems.split(",") if s)
    unknown = sorted(set(systems) - set(DEFAULT_SYSTEMS))
    if unknown:
        print(f"bench.ab: unknown system {', '.join(unknown)}", file=sys.stderr)
        return 2
    cfg = WorkerConfig(systems=systems, samples=args.samples, min_sample_s=args.min_sample_s)
    started = time.time()
    load_start = os.getloadavg()

    def log(msg: str) -> None:
        print(f"[{time.time() - started:6.0f} s] {msg}", file=sys.stderr, flush=True)

    command = "python -m bench.ab " + " ".join(shlex.quote(a) for a in argv)
    threads = "all cores (thread counts unset)" if args.all_cores else \
        "one BLAS/OpenMP thread (" + ", ".join(f"{v}=1" for v in THREAD_VARIABLES) + ")"

    def header(run: dict[str, Any]) -> list[str]:
        return [
            f"# Before/after: {args.suite} suite, "
            f"{time.strftime('%Y-%m-%d', time.gmtime(started))}",
            "", f"Command: `{command}`", "",
            f"- before: `{sides['before'].root}` at {sides['before'].commit}",
            f"- after: `{sides['after'].root}` at {sides['after'].commit}",
            f"- host: {os.cpu_count()} logical CPUs, {cpu_model()}; load average "
            f"{load_start[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
            f"- {threads}; {run['rounds']} timed rounds after one untimed compile round; each "
            f"round one fresh process per side and workload, the first side alternating; "
            f"{args.samples} samples per system in each process, each >= "
            f"{args.min_sample_s} s",
            f"- started {time.strftime('%H:%M:%S', time.gmtime(started))} UTC, took "
            f"{(time.time() - started) / 60:.1f} min"]

    def save(run: dict[str, Any]) -> None:
        """The records so far (after every round: a run cut short keeps its rounds)."""
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"command": command, "header": header(run), "workloads": workloads,
                           "systems": systems, "noise": args.noise,
                           "sides": {k: vars(v) for k, v in sides.items()}, **run}, f)

    run = collect(sides, args.suite, workloads, args.rounds, cfg, args.all_cores,
                  args.timeout_s, log, args.budget_min * 60, save)
    save(run)
    rows, verdict = summarise(run["records"], workloads, systems, args.noise)
    text = markdown(rows, verdict, header(run))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
