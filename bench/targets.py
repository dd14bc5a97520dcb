"""The performance targets of the "faster than every peer" issue, checked against one run of the
harness: `python -m bench.targets bench/results/results.json > bench/results/targets.md`.

Every figure comes from the results file; nothing here measures. A target whose figures are
missing from the run (a peer not installed, compile probes skipped) is marked "not measured".
"""
from __future__ import annotations

import json
import sys
from typing import Any

GK = "gk_fused"
OURS = {"gk_fused", "gk_unfused", "gk_generic"}  # graphkernel itself, never a peer


def _median(w: dict[str, Any], system: str, mode: str = "fresh") -> float | None:
    entry = w["systems"].get(system, {})
    if entry.get("status") != "ok":
        return None
    m = entry.get("modes", {}).get(mode, {})
    if m.get("status") != "ok" or not m.get("check", {}).get("ok", False):
        return None
    return m["timing"]["median_s"]


def _over_copy(w: dict[str, Any], system: str = GK) -> float | None:
    entry = w["systems"].get(system, {})
    m = entry.get("modes", {}).get("fresh", {})
    return m.get("timing", {}).get("over_copy") if m.get("status") == "ok" else None


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _mark(ok: bool | None) -> str:
    return "not measured" if ok is None else ("**met**" if ok else "**not met**")


def evaluate(results: dict[str, Any]) -> list[tuple[str, str, bool | None, str]]:
    """Rows of (target, scope, met?, figures)."""
    rows: list[tuple[str, str, bool | None, str]] = []
    workloads = results["workloads"]
    for w in workloads:
        ours = _median(w, GK)
        peers = {s: _median(w, s) for s in w["systems"] if s not in OURS}
        peers = {s: t for s, t in peers.items() if t is not None}
        if ours is None or not peers:
            rows.append(("1. fused <= best peer", w["key"], None, "no timing"))
            continue
        best = min(peers, key=lambda s: peers[s])
        ratio = ours / peers[best]
        rows.append(("1. fused <= best peer", w["key"], ratio <= 1.0,
                     f"graphkernel {_fmt(ours)}, best peer {best} {_fmt(peers[best])} "
                     f"(ratio {ratio:.2f})"))
    for w in workloads:
        big = w.get("dims", {}).get("rows") == 4096 and w.get("dims", {}).get("cols") == 4096
        if w["kind"] in ("basic", "composite", "chain", "bias_gelu") and big:
            limit = 1.3 if w["kind"] == "basic" else 1.5
            over = _over_copy(w)
            rows.append((f"2. pointwise <= {limit}x copy", w["key"],
                         None if over is None else over <= limit,
                         "-" if over is None else f"{over:.2f}x the copy of the same bytes"))
    for w in workloads:
        if w["kind"] in ("layernorm", "softmax"):
            ours, ort = _median(w, GK), _median(w, "onnxruntime")
            rows.append(("3. <= ONNX Runtime", w["key"],
                         None if ours is None or ort is None else ours <= ort,
                         f"graphkernel {_fmt(ours)}, ONNX Runtime {_fmt(ort)}"))
            over = _over_copy(w)
            # Issue #15, item 1: within 1.5x the copy floor (an earlier issue asked 2x).
            rows.append(("3. <= 1.5x copy", w["key"], None if over is None else over <= 1.5,
                         "-" if over is None else f"{over:.2f}x"))
    for w in workloads:
        if w.get("overhead"):
            ours, npy = _median(w, GK), _median(w, "numpy")
            rows.append(("4. per call, net(Tensor(x)), <= numpy eager", w["key"],
                         None if ours is None or npy is None else ours <= npy,
                         f"graphkernel {_fmt(ours)}, numpy {_fmt(npy)}"))
    for w in workloads:
        if w["kind"].endswith("_train"):  # forward + backward + Adam in one graph
            counts = {s: w["systems"].get(s, {}).get("info", {}).get("kernel_count")
                      for s in ("gk_fused", "gk_unfused")}
            known = None not in counts.values()
            rows.append(("6. training step: fusion launches fewer kernels", w["key"],
                         None if not known else counts["gk_fused"] < counts["gk_unfused"],
                         f"{counts['gk_fused']} kernels fused, {counts['gk_unfused']} unfused"))
    for w in workloads:
        # Shape-generic kernels (sizes passed at run time) against the static ones, same run.
        if w["kind"] in ("basic", "composite", "layernorm", "softmax"):
            static, generic = _median(w, GK), _median(w, "gk_generic")
            known = static is not None and generic is not None
            rows.append(("7. shape-generic <= 1.1x static", w["key"],
                         None if not known else generic <= 1.1 * static,
                         "-" if not known else f"generic {_fmt(generic)}, static {_fmt(static)} "
                         f"(ratio {generic / static:.2f})"))
    for w in workloads:
        # Fusion off runs one kernel per op: no op slower than numpy eager runs it (issue #15
        # item 4), so fused-vs-unfused shows what fusion alone buys.
        unfused, npy = _median(w, "gk_unfused"), _median(w, "numpy")
        if unfused is not None and npy is not None:
            rows.append(("8. unfused <= 1.2x numpy eager", w["key"], unfused <= 1.2 * npy,
                         f"unfused {_fmt(unfused)}, numpy {_fmt(npy)} "
                         f"(ratio {unfused / npy:.2f})"))
    compiles = results.get("compile_times", {}).get("workloads", {})
    by_key = {w["key"]: w for w in workloads}
    for key, per_system in compiles.items():
        probe = per_system.get(GK, {})
        cold, warm = probe.get("cold", {}), probe.get("warm", {})
        c, wm = cold.get("first_result_s"), warm.get("first_result_s")
        # The first result includes one call: say what a steady call takes, which no compile
        # speed can remove.
        steady = _median(by_key[key], GK) if key in by_key else None
        call = "" if steady is None else f"; a steady call takes {_fmt(steady)}"
        if steady is not None and steady > 0.05:
            call += ", more than the target by itself"
        rows.append(("5. cold compile <= 1 s", key, None if c is None else c <= 1.0,
                     f"first result {_fmt(c)} "
                     f"(compile {_fmt(_compile_s(cold))}, "
                     f"first call {_fmt(cold.get('first_call_s'))}{_rest(cold)})"))
        rows.append(("5. warm <= 50 ms to first result", key,
                     None if wm is None else wm <= 0.05,
                     f"first result {_fmt(wm)} "
                     f"(compile {_fmt(_compile_s(warm))},"
                     f" from cache: {warm.get('from_cache')}"
                     + (f", compile cache: {warm['compile_cache']}" if "compile_cache" in warm
                        else "") + "; "
                     f"first call {_fmt(warm.get('first_call_s'))}{_rest(warm)}{call})"))
        first = warm.get("first_call_s")
        dims = by_key[key].get("dims", {}) if key in by_key else {}
        if steady is not None and first is not None and dims.get("rows") == 4096 and \
                dims.get("cols") == 4096:
            rows.append(("9. warm first call <= 2x a steady call", key, first <= 2 * steady,
                         f"first call {_fmt(first)}, steady {_fmt(steady)} "
                         f"(ratio {first / steady:.2f})"))
    if not compiles:
        rows.append(("5. compile times", "all", None, "the run skipped the compile probes"))
    return rows


def _compile_s(probe: dict[str, Any]) -> float | None:
    """The compile's own time: as the compiled graph reports it, else as the bench timed it."""
    reported = probe.get("compile_seconds_reported")
    return reported if reported is not None else probe.get("compile_s")


def _rest(probe: dict[str, Any]) -> str:
    """What the first result took besides the compile and the first call (building the
    network from its weights; for a training step, the bench's copy of the initial state)."""
    total, compile_s, first = (probe.get("first_result_s"), probe.get("compile_s"),
                               probe.get("first_call_s"))
    if total is None or compile_s is None or first is None:
        return ""
    return f", the rest {_fmt(max(0.0, total - compile_s - first))}"


def render(results: dict[str, Any]) -> str:
    rows = evaluate(results)
    met = sum(1 for r in rows if r[2] is True)
    missed = sum(1 for r in rows if r[2] is False)
    lines = [
        "# Performance targets, checked against one run",
        "",
        f"Run: `{results.get('command', '?')}` ({results.get('started_utc', '?')}). "
        f"Copy bandwidth {results.get('copy_bandwidth', {}).get('gbps', 0):.1f} GB/s. Cores in "
        f"parallel at start: {results.get('parallel_start', {}).get('verdict', '?')}, at end: "
        f"{results.get('parallel_end', {}).get('verdict', '?')}.",
        "",
        f"{met} met, {missed} not met, {len(rows) - met - missed} not measured. Times are "
        "medians with fresh outputs per call, as users get them.",
        "",
        "| target | workload | result | figures |",
        "|---|---|---|---|",
    ]
    lines += [f"| {t} | {k} | {_mark(ok)} | {fig} |" for t, k, ok, fig in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else "bench/results/results.json"
    with open(path, encoding="utf-8") as fh:
        results = json.load(fh)
    sys.stdout.write(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
