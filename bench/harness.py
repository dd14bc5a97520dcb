"""The measurement: check every system against float64 numpy, warm up, then time all systems
round by round in one process (order rotated each round), with a same-size copy in every round.
Each sample follows one untimed call of the same system (on another input set): a sample then
measures a system after itself, as its users run it, not after another framework whose thread
pool may still be spinning on the cores (OpenBLAS's workers spin ~0.1 s after a product).
"""
from __future__ import annotations

import gc
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench import machine
from bench.native import copy_variants
from bench.net_workloads import NET_KINDS
from bench.systems import FRESH, Runner, System, version_of
from bench.training import reference
from bench.units import parallel_text
from bench.workloads import SUITES, Workload, check, input_sets

COPY = "copy"
# A check that fails by at most this much (max |error| / max |reference|) is an accuracy
# shortfall: timed, and flagged "inaccurate". Beyond it the answer is wrong and not timed.
INACCURATE_LIMIT = 1e-3


@dataclass
class Config:
    suite: str = "full"
    rounds: int = 25
    overhead_rounds: int = 60
    min_rounds: int = 11
    round_budget_s: float = 75.0  # per workload: fewer rounds (not below min_rounds) past it
    min_sample_s: float = 0.01
    warmup_s: float = 0.3
    max_sets: int = 4
    machine_copy_bytes: int = 256 << 20
    systems: list[str] | None = None  # keys; None = all
    workloads: list[str] | None = None  # keys; None = the whole suite
    compile_probes: str = "all"  # "all", "graphkernel", "none"
    parallel_iterations: int = 8000
    log: Callable[[str], None] = field(default=lambda msg: print(msg, file=sys.stderr,
                                                                  flush=True))

    @classmethod
    def quick(cls, **kw: Any) -> Config:
        base = dict(suite="quick", rounds=5, overhead_rounds=7, min_rounds=3,
                    round_budget_s=10.0, min_sample_s=0.002,
                    warmup_s=0.05, max_sets=2, machine_copy_bytes=32 << 20,
                    compile_probes="graphkernel", parallel_iterations=2000)
        base.update(kw)
        return cls(**base)  # type: ignore[arg-type]


def _stats(samples: list[float]) -> dict[str, Any]:
    a = np.asarray(samples)
    return {"median_s": float(np.median(a)), "p10_s": float(np.percentile(a, 10)),
            "p90_s": float(np.percentile(a, 90)), "mean_s": float(a.mean()), "n": len(samples),
            "samples_us": [round(s * 1e6, 3) for s in samples]}


def _error_text(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename.split('site-packages/')[-1]}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {str(exc).strip()[:1500]}{where}"


def n_input_sets(w: Workload, l3: int, max_sets: int) -> int:
    """Rotate through enough input sets that a call does not find its inputs in the last-level
    cache (tiny workloads, which measure call overhead, use one)."""
    if w.is_overhead:
        return 1
    per_set = sum(4 * math.prod(s) for s in w.input_shapes().values())
    return max(1, min(max_sets, math.ceil(2 * l3 / per_set)))


def _copy_runner(w: Workload, n_sets: int, min_s: float) -> tuple[Runner, str]:
    """A copy moving the workload's bytes (read + written), through rotating sources, with the
    fastest copy this machine has at that size."""
    n = max(1, w.nbytes()["total"] // 8)
    srcs = [np.random.default_rng(100 + i).standard_normal(n).astype(np.float32)
            for i in range(n_sets)]
    dst = np.zeros(n, np.float32)
    best, best_t = None, float("inf")
    for name, fn in copy_variants().items():
        reps = max(3, min(2000, int(min_s / 1e-6)))
        fn(dst, srcs[0])
        ts = []
        for j in range(3):
            k = 1 if n > 1 << 18 else reps
            t0 = time.perf_counter()
            for _ in range(k):
                fn(dst, srcs[j % n_sets])
            ts.append((time.perf_counter() - t0) / k)
        t = float(np.median(ts))
        if t < best_t:
            best, best_t = name, t
    fn = copy_variants()[best]  # type: ignore[index]
    return Runner(COPY, "preallocated", lambda i: fn(dst, srcs[i]), n_sets=n_sets), str(best)


def _calibrate(runner: Runner, warmup_s: float, min_sample_s: float) -> tuple[int, float]:
    """Warm up, then pick how many calls one sample holds (at least min_sample_s long)."""
    t_end = time.perf_counter() + warmup_s
    times, i = [], 0
    while True:
        times.append(runner.time(1, i))
        i += 1
        if (time.perf_counter() >= t_end and i >= 3) or i >= 2000:
            break
    per_call = float(np.median(times[len(times) // 2:]))
    return int(max(1, min(200_000, math.ceil(min_sample_s / max(per_call, 1e-8))))), per_call


def run_workload(w: Workload, systems: list[System], cfg: Config, l3: int,
                 copy_gbps: float, crashed: dict[str, str] | None = None) -> dict[str, Any]:
    """Check, warm up and time every system on one workload. `crashed`: systems whose compile
    probe (a separate process) died on this workload: not run here, where a crash would end
    the whole benchmark."""
    log = cfg.log
    n_sets = n_input_sets(w, l3, cfg.max_sets)
    seeds = list(range(n_sets))
    sets, params = input_sets(w, seeds)
    ref = reference(w, sets[0], params)
    nbytes = w.nbytes()
    out: dict[str, Any] = {"key": w.key, "kind": w.kind, "title": w.title, "dims": w.dims,
                           "bytes": nbytes, "matmul_flops": w.matmul_flops(),
                           "input_sets": n_sets, "overhead": w.is_overhead,
                           "tolerance": {"rtol": w.rtol, "atol_times_max_ref": w.atol},
                           "systems": {}}
    entries: list[tuple[str, Runner]] = []
    for system in systems:
        rec: dict[str, Any] = {"label": system.label}
        out["systems"][system.key] = rec
        why = system.supports(w)
        if not why and system.kind == "peer" and w.kind in NET_KINDS and \
                not getattr(system, "runs_example_nets", False):
            why = "this peer's version of the example network is not written yet"
        if why:
            rec["status"], rec["note"] = "not applicable", why
            continue
        if crashed and system.key in crashed:
            rec["status"], rec["error"] = "crashed", crashed[system.key]
            log(f"  {system.key}: CRASHED in its compile probe, not run: {rec['error'][:300]}")
            continue
        t0 = time.perf_counter()
        try:
            prep = system.prepare(w, sets, params, seeds)
        except Exception as exc:
            rec["status"], rec["error"] = "failed to compile", _error_text(exc)
            log(f"  {system.key}: FAILED TO COMPILE: {rec['error'][:300]}")
            continue
        rec["prepare_s"] = time.perf_counter() - t0
        rec["info"] = prep.info
        rec["modes"] = {}
        for runner in prep.runners:
            mrec: dict[str, Any] = {}
            rec["modes"][runner.mode] = mrec
            try:
                result = runner.run_once(0)
                mrec["check"] = check(w, result, ref)
            except Exception as exc:
                mrec["status"], mrec["error"] = "failed to run", _error_text(exc)
                log(f"  {system.key}/{runner.mode}: FAILED TO RUN: {mrec['error'][:300]}")
                continue
            c = mrec["check"]
            if not c["ok"]:
                close = c.get("max_err_over_max_ref", np.inf) <= INACCURATE_LIMIT
                mrec["status"] = "inaccurate" if close else "wrong answer"
                mrec["error"] = c["error"]
                log(f"  {system.key}/{runner.mode}: {mrec['status'].upper()}: "
                    f"{mrec['error'][:300]}")
                if not close:
                    continue
            else:
                mrec["status"] = "ok"
            entries.append((f"{system.key}/{runner.mode}", runner))
        modes = rec["modes"]
        fresh = modes.get(FRESH, {})
        rec["status"] = fresh.get("status", "failed to run") if modes else "no runner"
    copy_runner, copy_name = _copy_runner(w, n_sets, cfg.min_sample_s)
    out["copy_variant"] = copy_name
    entries.append((COPY, copy_runner))

    # Warm-up and calibration (each entry on its own), then the interleaved rounds.
    ks: dict[str, int] = {}
    failed: dict[str, str] = {}
    round_s = 0.0
    for name, runner in entries:
        try:
            ks[name], per_call = _calibrate(runner, cfg.warmup_s, cfg.min_sample_s)
            round_s += (ks[name] + 1) * per_call  # the sample and its settling call
        except Exception as exc:
            failed[name] = _error_text(exc)
    live = [(n, r) for n, r in entries if n not in failed]
    samples: dict[str, list[float]] = {n: [] for n, _ in live}
    rounds = cfg.overhead_rounds if w.is_overhead else cfg.rounds
    if round_s * rounds > cfg.round_budget_s:
        rounds = max(min(cfg.min_rounds, rounds), int(cfg.round_budget_s / round_s))
    out["estimated_round_s"] = round_s
    t_rounds = time.perf_counter()
    for r in range(rounds):
        shift = r % len(live)
        for name, runner in live[shift:] + live[:shift]:
            if name in failed:
                continue
            k = ks[name]
            try:
                runner.time(1, r * k + k)  # settle: the system after itself (module doc)
                samples[name].append(runner.time(k, r * k) / k)
            except Exception as exc:
                failed[name] = _error_text(exc)
    out["rounds"] = rounds
    out["rounds_s"] = time.perf_counter() - t_rounds

    copy_stats = _stats(samples[COPY]) if COPY not in failed else None
    out["copy"] = copy_stats
    if copy_stats:
        copy_stats["k"] = ks[COPY]
        copy_stats["gbps"] = nbytes["total"] / copy_stats["median_s"] / 1e9
    for name, _ in entries:
        if name == COPY:
            continue
        key, mode = name.split("/")
        mrec = out["systems"][key]["modes"][mode]
        if name in failed:
            mrec["status"], mrec["error"] = "failed while timed", failed[name]
            continue
        st = _stats(samples[name])
        st["k"] = ks[name]
        st["gbps"] = nbytes["total"] / st["median_s"] / 1e9
        st["fraction_of_copy_bw"] = st["gbps"] / copy_gbps if copy_gbps else None
        if copy_stats:
            st["over_copy"] = st["median_s"] / copy_stats["median_s"]
        if w.matmul_flops():
            st["matmul_gflops"] = w.matmul_flops() / st["median_s"] / 1e9
        mrec["timing"] = st
    del entries, live, sets, params, ref
    gc.collect()
    return out


def run(cfg: Config, systems: list[System] | None = None) -> dict[str, Any]:
    """The whole benchmark; returns the results document (see bench/report.py)."""
    from bench.peers import all_systems
    log = cfg.log
    started = time.time()
    results: dict[str, Any] = {"schema": 1, "suite": cfg.suite, "config": {
        k: v for k, v in vars(cfg).items() if k != "log"}}
    results["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    results["machine"] = machine.machine_info()
    results["environment"] = machine.environment()
    log("checking whether the cores run in parallel ...")
    results["parallel_start"] = machine.parallel_check(cfg.parallel_iterations)
    log(f"  {parallel_text(results['parallel_start'])}")
    log("measuring copy bandwidth ...")
    bw = machine.copy_bandwidth(cfg.machine_copy_bytes)
    results["copy_bandwidth"] = bw
    log(f"  {bw['gbps']:.1f} GB/s ({bw['best']})")

    systems = systems if systems is not None else all_systems()
    if cfg.systems:
        systems = [s for s in systems if s.key in cfg.systems]
    usable, skipped = [], {}
    for system in systems:
        try:
            why = system.probe()
        except Exception as exc:
            why = f"probe failed: {_error_text(exc)}"
        if why:
            skipped[system.key] = {"label": system.label, "note": why}
            log(f"skipping {system.label}: {why}")
        else:
            usable.append(system)
    results["systems"] = {s.key: {"label": s.label, "kind": s.kind, "versions": s.versions()}
                          for s in usable}
    results["skipped_systems"] = skipped
    results["versions"] = {"numpy": version_of("numpy"), "graphkernel": version_of("graphkernel")}

    suite = SUITES[cfg.suite]()
    if cfg.workloads:
        suite = [w for w in suite if w.key in cfg.workloads or w.kind in cfg.workloads]
    # Compile probes first, each in its own process: they measure cold and warm compile times
    # and show which system crashes on which workload before it can take this process down.
    crashes: dict[str, dict[str, str]] = {}
    if cfg.compile_probes != "none":
        from bench.probe import compile_times, crashes_in
        keys = [s.key for s in usable]
        if cfg.compile_probes == "graphkernel":
            keys = [k for k in keys if k.startswith("gk_")]
        log("compile times, cold and warm, each in a new process ...")
        results["compile_times"] = compile_times(cfg.suite, suite, keys, log)
        crashes = crashes_in(results["compile_times"])
    l3 = machine.l3_bytes()
    results["l3_bytes"] = l3
    results["workloads"] = []
    for w in suite:
        log(f"[{w.key}] {w.title}")
        t0 = time.perf_counter()
        res = run_workload(w, usable, cfg, l3, bw["gbps"], crashes.get(w.key))
        res["wall_s"] = time.perf_counter() - t0
        results["workloads"].append(res)
        log("  " + _one_line(res))

    threads: dict[str, Any] = {}
    for system in usable:
        try:
            threads[system.key] = system.threads()
        except Exception as exc:
            threads[system.key] = {"error": _error_text(exc)}
    results["threads"] = threads
    results["blas"] = machine.blas_info()
    for system in usable:
        system.close()
    log("checking whether the cores run in parallel (end) ...")
    results["parallel_end"] = machine.parallel_check(cfg.parallel_iterations)
    log(f"  {parallel_text(results['parallel_end'])}")
    log("measuring copy bandwidth (end) ...")
    bw_end = machine.copy_bandwidth(cfg.machine_copy_bytes)
    log(f"  {bw_end['gbps']:.1f} GB/s ({bw_end['best']})")
    # The limit is the best the machine showed: the start or the end measurement.
    results["copy_bandwidth_start"], results["copy_bandwidth_end"] = bw, bw_end
    best = max(bw, bw_end, key=lambda b: b["gbps"])
    results["copy_bandwidth"] = dict(best, measured="start" if best is bw else "end")
    set_fractions(results, best["gbps"])
    results["wall_s"] = time.time() - started
    return results


def set_fractions(results: dict[str, Any], copy_gbps: float) -> None:
    """Each timing's fraction of the machine's copy bandwidth."""
    for w in results["workloads"]:
        for rec in w["systems"].values():
            for m in rec.get("modes", {}).values():
                t = m.get("timing")
                if t:
                    t["fraction_of_copy_bw"] = t["gbps"] / copy_gbps if copy_gbps else None


def _one_line(res: dict[str, Any]) -> str:
    parts = []
    for key, rec in res["systems"].items():
        t = rec.get("modes", {}).get(FRESH, {}).get("timing")
        parts.append(f"{key}={t['median_s'] * 1e3:.3g}ms" if t else f"{key}:{rec['status']}")
    if res.get("copy"):
        parts.append(f"copy={res['copy']['median_s'] * 1e3:.3g}ms")
    return " ".join(parts)
