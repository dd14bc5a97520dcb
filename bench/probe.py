"""Compile time, cold and warm: each measured in a new process.

cold: an empty cache folder (GRAPHKERNEL_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, jax's persistent
compilation cache, MindSpore's compiler cache and kernel folder; graphkernel's holds only this
machine's calibration record, measured once per machine, not per compile); warm: a second new
process given the same folder. The time is from the start of compiling (graphkernel.compile,
torch.compile, jax.jit, creating the ONNX Runtime session, building the MindSpore cell) to the
first result in hand, less the bench's own bookkeeping a system reports as `untimed_s` (a
training step's weight copy and its report's pass replay); imports (what a user imports before
compiling) are timed apart. Each
process writes Python's bytecode cache as a user's does (PYTHONDONTWRITEBYTECODE, set in some
sandboxes, is dropped and recorded), so a warm process does not compile modules from source. For
torch.compile the first compile in a process also imports dynamo and inductor: counted, as a
user pays it.

Run by the benchmark as `python -m bench.probe SUITE WORKLOAD SYSTEM`; prints one JSON line.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.units import probe_text

PROBED = ("gk_fused", "gk_unfused", "inductor", "jax", "onnxruntime", "openvino", "mindspore")
MARK = "BENCH-PROBE "
NOTES = {
    "onnxruntime": "no kernel cache by default: warm is a second cold start",
    "openvino": "no model cache configured (CACHE_DIR unset): warm is a second cold start",
    "jax": "warm uses jax's persistent compilation cache (off unless configured)",
    "mindspore": "warm reuses the compiler cache (MS_COMPILER_CACHE_ENABLE=1) and the "
                 "kernel folder in the working directory",
    "inductor": "warm reuses TORCHINDUCTOR_CACHE_DIR (FX graph cache)",
    "gk_fused": "warm reuses GRAPHKERNEL_CACHE_DIR",
    "gk_unfused": "warm reuses GRAPHKERNEL_CACHE_DIR",
}


def _probe(suite: str, key: str, system: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    from bench.training import reference
    from bench.workloads import SUITES, check, input_sets
    w = next(w for w in SUITES[suite]() if w.key == key)
    sets, params = input_sets(w, [0])
    result: dict[str, Any] = {}
    if system == "mindspore":
        import mindspore  # noqa: F401

        from bench import ms_worker
        result["import_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        ms_worker.prepare(w, [0])
        result["first_result_s"] = time.perf_counter() - t1
        out = ms_worker.output("fresh", 0)
    else:
        from bench.peers import all_systems
        sys_obj = next(s for s in all_systems() if s.key == system)
        why = sys_obj.probe()
        if why:
            return {"skipped": why}
        if system == "jax" and os.environ.get("BENCH_JAX_CACHE"):
            import jax
            jax.config.update("jax_compilation_cache_dir", os.environ["BENCH_JAX_CACHE"])
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        sys_obj.preload()
        result["import_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        prep = sys_obj.prepare(w, sets, params, [0])
        result["first_result_s"] = time.perf_counter() - t1
        if "untimed_s" in prep.info:  # the bench's bookkeeping within prepare, no user's
            result["untimed_s"] = prep.info["untimed_s"]
            result["first_result_s"] -= prep.info["untimed_s"]
        out = prep.runners[0].run_once(0)
        for k in ("from_cache", "compile_cache", "kernel_count", "compile_seconds_reported",
                  "compile_s", "first_call_s", "session_s"):
            if k in prep.info:
                result[k] = prep.info[k]
    c = check(w, out, reference(w, sets[0], params))
    result["ok"] = c["ok"]
    result["max_err_over_max_ref"] = c.get("max_err_over_max_ref")
    if not c["ok"]:
        result["check_error"] = c.get("error")
    return result


# Variables a probe process runs without: a user's second process finds the bytecode cache
# written; under PYTHONDONTWRITEBYTECODE=1 every warm probe compiled graphkernel's modules from
# source (the digits CNN's warm first result 148-165 ms, 83-86 ms with the cache).
PROBE_REMOVE = ("PYTHONDONTWRITEBYTECODE",)


def probe_environ(folder: str) -> tuple[dict[str, str], dict[str, str]]:
    """The environment of a probe process given its cache folder, and {variable: value} of what
    it removed from this process's."""
    env = dict(os.environ)
    removed = {k: env.pop(k) for k in PROBE_REMOVE if k in env}
    env["GRAPHKERNEL_CACHE_DIR"] = os.path.join(folder, "graphkernel")
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(folder, "inductor")
    env["BENCH_JAX_CACHE"] = os.path.join(folder, "jax")
    env["MS_COMPILER_CACHE_ENABLE"] = "1"
    env["MS_COMPILER_CACHE_PATH"] = os.path.join(folder, "mindspore")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "")
                                                  .split(os.pathsep) if p])
    return env, removed


def _run_probe(suite: str, key: str, system: str, folder: str, timeout: float
               ) -> dict[str, Any]:
    env, _ = probe_environ(folder)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "bench.probe", suite, key, system],
                              cwd=folder, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "crashed": True}
    wall = time.perf_counter() - t0
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            res = json.loads(line[len(MARK):])
            res["process_wall_s"] = wall
            return res
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
    return {"error": f"probe process died (exit code {proc.returncode}): "
            + " | ".join(tail)[-1200:], "crashed": True}


def compile_times(suite: str, workloads: list[Any], systems: list[str],
                  log: Callable[[str], None], timeout: float = 600) -> dict[str, Any]:
    """{workload: {system: {cold: ..., warm: ...}}} for the systems where it is meaningful."""
    out: dict[str, Any] = {"notes": {k: v for k, v in NOTES.items() if k in systems},
                           "removed_environment": probe_environ("")[1], "workloads": {}}
    for w in workloads:
        row: dict[str, Any] = {}
        out["workloads"][w.key] = row
        for system in systems:
            if system not in PROBED:
                continue
            if w.kind == "composite" and not system.startswith("gk_"):
                continue  # the same program as NetBasicFuse for every other system
            folder = tempfile.mkdtemp(prefix="gk-bench-probe-")
            if system.startswith("gk_"):  # cold kernels, not an uncalibrated machine
                from graphkernel.backends.c import calibration
                calibration.seed(os.path.join(folder, "graphkernel"))
            try:
                cold = _run_probe(suite, w.key, system, folder, timeout)
                warm = _run_probe(suite, w.key, system, folder, timeout) \
                    if "error" not in cold and "skipped" not in cold else None
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            row[system] = {"cold": cold, "warm": warm}
            log(f"  compile {w.key} {system}: cold {probe_text(cold)}, warm {probe_text(warm)}")
    return out


def crashes_in(compile_results: dict[str, Any]) -> dict[str, dict[str, str]]:
    """{workload: {system: error}} for probes whose process died or hung."""
    out: dict[str, dict[str, str]] = {}
    for wk, row in compile_results.get("workloads", {}).items():
        for system, r in row.items():
            for probe in (r.get("cold"), r.get("warm")):
                if probe and probe.get("crashed"):
                    out.setdefault(wk, {})[system] = probe["error"]
    return out


if __name__ == "__main__":
    try:
        res = _probe(sys.argv[1], sys.argv[2], sys.argv[3])
    except Exception as exc:
        res = {"error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
    print(MARK + json.dumps(res, default=str), flush=True)
