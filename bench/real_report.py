"""A `--real` run's results as markdown and json files (bench/real.py writes them)."""
from __future__ import annotations

import json
import os
import statistics
from typing import Any

from bench.real_systems import LABELS, STEP_CHANGE_RTOL


def compile_table_lines(table: dict[str, Any]) -> list[str]:
    lines = ["| layers | kernels | cold first result (s) | cold / 1 layer | warm first result "
             "(s) | warm: compile cache | steady call (s) |",
             "|---:|---:|---:|---:|---:|---|---:|"]
    for r in table["rows"]:
        c, w = r.get("cold", {}), r.get("warm", {})
        if "error" in c or "error" in w:
            lines.append(f"| {r['layers']} | error: {(c.get('error') or w.get('error'))[-200:]}"
                         " | | | | | |")
            continue
        lines.append(f"| {r['layers']} | {c['kernel_count']} | {c['first_result_s']:.2f} | "
                     f"{r.get('cold_over_one_layer', float('nan')):.2f}x | "
                     f"{w['first_result_s']:.3f} | {w['compile_cache']} | "
                     f"{c['steady_call_s']:.4f} |")
    return lines


def _ms(s: float | None) -> str:
    if s is None:
        return ""
    return f"{s * 1e3:.0f}" if s >= 1 else f"{s * 1e3:.4g}"


def _ratio(v: float | None, systems: dict[str, Any], key: str) -> str:
    if v is not None:
        return f"{v:.2f}x"
    return systems.get(key, {}).get("status", "not run")


def _per_round(ratios: list[float] | None) -> str:
    """`1.01x (0.97-1.06), 3/7 at or below`: the paired ratios' median, range and count."""
    if not ratios:
        return ""
    at_or_below = sum(x <= 1 for x in ratios)
    return (f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}), "
            f"{at_or_below}/{len(ratios)} at or below")


def _roof(r: dict[str, Any], peak: dict[str, Any]) -> str:
    """`221 / 219 (94% / 93%)`: GFLOP/s of fused and of the best peer on the model's arithmetic,
    and each as a share of the machine's FMA peak (when the run measured it)."""
    rates = r.get("gflop_per_s")
    if not rates:
        return ""
    fused, best = rates.get("gk_fused"), rates.get(r["best_peer"])
    if fused is None or best is None:
        return ""
    text = f"{fused:.0f} / {best:.0f}"
    if peak.get("gflops"):
        text += f" ({fused / peak['gflops']:.0%} / {best / peak['gflops']:.0%})"
    return text


def _peak_text(peak: dict[str, Any] | None) -> str:
    if not peak:
        return ""
    if "error" in peak:
        return f" FMA peak unknown ({peak['error']})."
    return (f" FMA peak {peak['gflops']:.1f} GFLOP/s ({peak['gflops_core']:.1f} a core x "
            f"{peak['cores']}; {peak['how']}).")


def markdown(results: dict[str, Any], command: str) -> str:
    m = results["machine"]
    v = results["versions"]
    lines = [f"# Real-size bench run, {results['started_utc']}", "",
             f"`{command}` — {results['rounds']} interleaved steady rounds per row (9 for the "
             "imported rows), a sample one call or as many as make 50 ms, after one untimed call "
             "of the same system on rows whose calls all take under 1 s; first result "
             "(compile or session + first call, graphkernel into an empty kernel cache) apart.",
             "", f"Machine: {m.get('cpu_model')}, {m.get('cpu_count')} logical "
             f"CPUs; copy bandwidth {results['copy_bandwidth']['gbps']:.1f} GB/s; load average "
             f"(1, 5, 15 min) at start {_load(results.get('load_average_start'))}, at end "
             f"{_load(results.get('load_average_end'))}. Versions: " +
             ", ".join(f"{k} {x}" for k, x in v.items() if x) + ". OpenVINO: "
             f"{results['openvino_config']}, all cores." + _peak_text(results.get("fma_peak")),
             ""]
    rows = results.get("rows", [])
    summary = ["## Summary: graphkernel against the best peer (steady median; < 1 is faster)",
               "", "Per round: fused over the best peer in each round (the two timed side by "
               "side, the machine's drift between rounds cancelled): the median, the range, and "
               "the rounds in which fused was at or below the peer. GFLOP/s: the model's "
               "arithmetic (graphkernel's count: 2 per multiply-add) over the steady median of "
               "fused and of the best peer, with each one's share of the FMA peak.", "",
               "| row | best peer | best peer ms | gk fused ms | fused / best | per round | "
               "gk shape-generic / best | gk unfused ms | GFLOP/s fused / best (of peak) |",
               "|---|---|---:|---:|---:|---|---:|---:|---:|"]
    peak = results.get("fma_peak") or {}
    for r in rows:
        if r["group"] == "imported" or "best_peer" not in r:
            continue
        s = r["systems"]
        gen = r.get("gk_generic_over_best_peer")
        summary.append(
            f"| {r['name']} | {LABELS[r['best_peer']]} | {_ms(r['best_peer_s'])} | "
            f"{_ms(s.get('gk_fused', {}).get('steady_median_s'))} | "
            f"{_ratio(r.get('gk_fused_over_best_peer'), s, 'gk_fused')} | "
            f"{_per_round(r.get('gk_fused_over_best_peer_rounds'))} | "
            f"{_ratio(gen, s, 'gk_generic') if 'gk_generic' in s else ''} | "
            f"{_ms(s.get('gk_unfused', {}).get('steady_median_s'))} | {_roof(r, peak)} |")
    lines += summary + [""]
    imported = [r for r in rows if r["group"] == "imported"]
    if imported:
        lines += ["## Imported (graphkernel.load of the bench's ONNX graph) vs hand-written cell",
                  "", "| workload | hand-written ms | imported ms | imported / hand-written | "
                  "kernels hand-written | kernels imported |", "|---|---:|---:|---:|---:|---:|"]
        for r in imported:
            s = r["systems"]
            h, i = s.get("gk_handwritten", {}), s.get("gk_imported", {})
            ratio = r.get("imported_over_handwritten")
            lines.append(f"| {r['name'].removeprefix('imported_')} | "
                         f"{_ms(h.get('steady_median_s'))} | {_ms(i.get('steady_median_s'))} | "
                         f"{'' if ratio is None else f'{ratio:.3f}'} | "
                         f"{h.get('kernel_count', h.get('status'))} | "
                         f"{i.get('kernel_count', i.get('status'))} |")
        lines.append("")
    if "compile_table" in results:
        lines += ["## Compile time: the bench's encoder layer (full-suite size), stacked", "",
                  "Cold: a new process, an empty kernel cache; warm: a new process, the cache "
                  "the cold one filled. First result: cell construction, compile and first "
                  "call (imports before the clock).", ""]
        lines += compile_table_lines(results["compile_table"]) + [""]
    lines += ["## Every row", ""]
    for r in rows:
        lines += [f"### {r['name']}: {r['title']}", ""]
        if "error" in r:
            lines += [f"FAILED to build: {r['error']}", ""]
            continue
        if r.get("checked_against"):
            lines.append(f"Checked against {LABELS[r['checked_against']]} (max |error| / max "
                         "|reference|" + ("; a training step's check is the first two losses, "
                                          "and the loss change of one step, within "
                                          f"{STEP_CHANGE_RTOL:.0%} of the reference's)."
                                          if "train" in r["name"] else ")."))
            changes = {k: s["loss_change"] for k, s in r["systems"].items()
                       if "loss_change" in s}
            if changes:
                lines.append("Loss change of one step: " + ", ".join(
                    f"{LABELS[k]} {v:.6g}" for k, v in changes.items()) + ".")
        lines += ["", "| system | status | first result s | prepare s | steady median ms | "
                  "steady min ms | kernels | error vs ref |", "|---|---|---:|---:|---:|---:|"
                  "---:|---:|"]
        for s in r["systems"].values():
            err = s.get("max_err_over_max_ref")
            status = s["status"] if s["status"] == "ok" else \
                f"{s['status']}: {s.get('note') or s.get('error', '')}"[:300]
            lines.append(
                f"| {s['label']} | {status} | {_s(s.get('first_result_s'))} | "
                f"{_s(s.get('prepare_s'))} | {_ms(s.get('steady_median_s'))} | "
                f"{_ms(s.get('steady_min_s'))} | {s.get('kernel_count', '')}"
                f"{' (one C call)' if s.get('c_entry') else ''} | "
                f"{'' if err is None else f'{err:.1e}'} |")
        lines.append("")
        if r.get("no_warm_call"):  # real.py Contender.warm_rule
            lines += [", ".join(LABELS[k] for k in r["no_warm_call"]) + ": no untimed call "
                      "before each sample (its calls take seconds; the others' rule: "
                      f"{'an untimed call first' if r.get('warm_call_before_sample') else 'none'}"
                      ").", ""]
        for s in r["systems"].values():
            modes = s.get("threads_stats")
            if modes:  # the entry's thread modes over the row's calls (c_entry_threads.py)
                lines += [f"{s['label']}'s entry: {modes.get('calls_alone', 0)} calls on one "
                          f"thread, {modes.get('probes', 0)} probes "
                          f"({modes.get('probes_skipped', 0)} skipped), "
                          f"{modes.get('switches', 0)} switches.", ""]
    return "\n".join(lines) + "\n"


def _load(v: Any) -> str:
    return "not recorded" if not v else "/".join(f"{x:.1f}" for x in v)


def _s(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def write(results: dict[str, Any], out_dir: str, command: str) -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    only = results.get("only")
    stem = os.path.join(out_dir, results["started_utc"][:10] + "-real" +
                        ("-" + "-".join(only)[:60] if only else ""))
    results["command"] = command
    with open(stem + ".json", "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    with open(stem + ".md", "w") as fh:
        fh.write(markdown(results, command))
    return {"json": stem + ".json", "markdown": stem + ".md"}
