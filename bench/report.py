"""Writing the results: JSON (everything), a markdown table, and a chart (PNG)."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

from bench.systems import FRESH, PREALLOCATED
from bench.units import fmt_bytes, fmt_time

BASE = "gk_fused"


def _timing(rec: dict[str, Any], mode: str) -> dict[str, Any] | None:
    return rec.get("modes", {}).get(mode, {}).get("timing")


def _status(rec: dict[str, Any], mode: str) -> str:
    m = rec.get("modes", {}).get(mode)
    if m is None:
        return rec.get("status", "—") if mode == FRESH or rec.get("status") != "ok" else "—"
    return m.get("status", "—")


def _cell(rec: dict[str, Any] | None, mode: str) -> str:
    if rec is None:
        return "—"
    t = _timing(rec, mode)
    if t is None:
        status = _status(rec, mode)
        if status in ("ok", "—"):
            return "—"
        return f"**{status}**" if status != "not applicable" else "n/a"
    line = f"{fmt_time(t['median_s'])} ({fmt_time(t['p10_s'])}–{fmt_time(t['p90_s'])})"
    if _status(rec, mode) == "inaccurate":
        line = "⚠ inaccurate: " + line
    extra = f"{t['gbps']:.3g} GB/s"
    if t.get("fraction_of_copy_bw") is not None:
        extra += f" · {t['fraction_of_copy_bw']:.2f} BW"
    if t.get("over_copy") is not None:
        extra += f" · {t['over_copy']:.3g}× copy"
    return f"{line}<br>{extra}"


def system_order(results: dict[str, Any]) -> list[str]:
    keys = list(results.get("systems", {}))
    return ([k for k in keys if k == BASE] + [k for k in keys if k != BASE])


def markdown(results: dict[str, Any], command: str | None = None) -> str:
    systems = system_order(results)
    labels = {k: v["label"] for k, v in results.get("systems", {}).items()}
    bw = results["copy_bandwidth"]
    m = results["machine"]
    lines = [f"# graphkernel benchmarks ({results['suite']} suite, {results['started_utc']})",
             ""]
    if command:
        lines += [f"Made by: `{command}`", ""]
    lines += [
        f"Machine: {m.get('cpu_model', '?')}, {m.get('cpu_count')} CPUs"
        f" ({', '.join(f'{k} {v}' for k, v in m.get('lscpu', {}).items() if 'cache' in k)}),"
        f" {m.get('mem_total_gib', '?')} GiB, {m.get('platform')}, Python {m.get('python')}.",
        f"Copy bandwidth (bytes read + written, {fmt_bytes(bw['bytes_copied'])} array, best of "
        f"{len(bw['variants'])} copies, measured at the start and the end of the run, the "
        f"better kept): **{bw['gbps']:.1f} GB/s** ({bw['best']}, at the "
        f"{bw.get('measured', 'start')}; "
        + ", ".join(f"{k} {results[f'copy_bandwidth_{k}']['gbps']:.1f}"
                    for k in ("start", "end") if f"copy_bandwidth_{k}" in results) + ").",
        f"Cores in parallel? start: {results['parallel_start']['verdict']} (2 processes take "
        f"{results['parallel_start']['ratio']}× one), end: "
        f"{results.get('parallel_end', {}).get('verdict', '?')} "
        f"({results.get('parallel_end', {}).get('ratio', '?')}×).",
        "",
        "Each cell: median time per call (p10–p90 over rounds); effective GB/s (inputs and "
        "weights read once + output written once, over the time); fraction of the machine's "
        "copy bandwidth (BW); time over a copy of the same bytes timed in the same rounds "
        "(× copy). Every output was checked against float64 numpy before timing; a failing "
        "system is named in bold instead of a time; ⚠ inaccurate: outside the tolerance but "
        "within 1e-3 of max |reference| (timed, see Accuracy). n/a: the system has no way to "
        "express the workload.",
        "",
        "## Headline",
        "",
    ]
    lines += _headline(results, systems, labels)
    lines += [
        "",
        "## Fresh output per call (as a user gets it)",
        "",
    ]
    lines += _table(results, systems, labels, FRESH, with_copy=True)
    lines += ["", "## Time relative to graphkernel fused (>1: graphkernel fused is faster)", ""]
    lines += _ratio_table(results, systems, labels)
    pre = [k for k in systems if any(_timing(w["systems"].get(k, {}), PREALLOCATED)
                                     for w in results["workloads"])]
    if pre:
        lines += ["", "## Output preallocated once (where the system offers it)", ""]
        lines += _table(results, pre, labels, PREALLOCATED, with_copy=True)
    lines += ["", "## Accuracy: max |error| / max |reference| against float64 numpy", ""]
    lines += _accuracy_table(results, systems, labels)
    if results.get("compile_times"):
        lines += ["", "## Compile time: seconds to the first result, cold / warm", ""]
        lines += _compile_table(results, labels)
    lines += ["", "## Failures, skips and notes", ""]
    lines += _notes(results, labels)
    lines += ["", "## Versions, threads, environment", ""]
    for key in systems:
        v = results["systems"][key]["versions"]
        lines.append(f"- {labels[key]}: " + ", ".join(f"{d} {ver}" for d, ver in v.items()))
    for key, t in results.get("threads", {}).items():
        if t:
            lines.append(f"- threads, {labels.get(key, key)}: "
                         + ", ".join(f"{k}={v}" for k, v in t.items()))
    blas = results.get("blas")
    if isinstance(blas, list):
        for b in blas:
            lines.append(f"- threadpool: {b.get('internal_api')} {b.get('version') or ''} "
                         f"({b.get('prefix')}), {b.get('num_threads')} threads"
                         + (f", kernel {b['architecture']}" if b.get("architecture") else ""))
    env = results.get("environment", {})
    lines.append("- environment: " + (", ".join(f"{k}={v}" for k, v in env.items()) or "—"))
    if isinstance(blas, str):
        lines.append(f"- threadpools: {blas}")
    removed = results.get("removed_environment")
    if removed:
        lines.append("- changed for the benchmark process (value before): " + ", ".join(
            f"{k}={v}" for k, v in removed.items()))
    lines.append(f"- wall time of the run: {results.get('wall_s', 0):.0f} s")
    return "\n".join(lines) + "\n"


def _table(results: dict[str, Any], systems: list[str], labels: dict[str, str], mode: str,
           with_copy: bool) -> list[str]:
    head = ["workload", "bytes moved"] + (["copy, same rounds"] if with_copy else []) + \
        [labels[k] for k in systems]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in results["workloads"]:
        cells = [f"{w['key']}", fmt_bytes(w["bytes"]["total"])]
        if with_copy:
            c = w.get("copy")
            cells.append(f"{fmt_time(c['median_s'])}<br>{c['gbps']:.3g} GB/s" if c else "—")
        cells += [_cell(w["systems"].get(k), mode) for k in systems]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _accuracy_table(results: dict[str, Any], systems: list[str], labels: dict[str, str]
                    ) -> list[str]:
    head = ["workload", "tolerance (rtol, atol × max\\|ref\\|)"] + [labels[k] for k in systems]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in results["workloads"]:
        tol = w["tolerance"]
        cells = [w["key"], f"{tol['rtol']:g}, {tol['atol_times_max_ref']:g}"]
        for k in systems:
            c = w["systems"].get(k, {}).get("modes", {}).get(FRESH, {}).get("check")
            if not c or "max_err_over_max_ref" not in c:
                cells.append("—")
            else:
                mark = "" if c["ok"] else " **fails**"
                cells.append(f"{c['max_err_over_max_ref']:.1e}{mark}")
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _headline(results: dict[str, Any], systems: list[str], labels: dict[str, str]
              ) -> list[str]:
    head = ["workload", "graphkernel fused", "GB/s · fraction of copy BW · × copy",
            "fastest other system", "graphkernel fused vs numpy eager"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in results["workloads"]:
        base_rec = w["systems"].get(BASE, {})
        base = _timing(base_rec, FRESH)
        if base:
            speed = f"{base['gbps']:.3g} GB/s"
            if base.get("fraction_of_copy_bw") is not None:
                speed += f" · {base['fraction_of_copy_bw']:.2f} · {base.get('over_copy', 0):.3g}×"
            cells = [w["key"], fmt_time(base["median_s"]), speed]
        else:
            cells = [w["key"], f"**{base_rec.get('status', '—')}**", "—"]
        others = [(t["median_s"], k) for k in systems if k not in (BASE, "gk_unfused")
                  for t in [_timing(w["systems"].get(k, {}), FRESH)] if t]
        if others:
            t_best, k_best = min(others)
            rel = f" ({t_best / base['median_s']:.2f}× graphkernel's time)" if base else ""
            warn = " ⚠ inaccurate" if _status(w["systems"][k_best], FRESH) == "inaccurate" \
                else ""
            cells.append(f"{labels[k_best]}{warn}: {fmt_time(t_best)}{rel}")
        else:
            cells.append("—")
        r = ratio(w, "numpy")
        cells.append(f"{r:.2f}× faster" if r and r >= 1 else
                     (f"{1 / r:.2f}× slower" if r else "—"))
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def ratio(w: dict[str, Any], key: str, mode: str = FRESH) -> float | None:
    base = _timing(w["systems"].get(BASE, {}), FRESH)
    t = _timing(w["systems"].get(key, {}), mode) if key != "copy" else w.get("copy")
    if not base or not t:
        return None
    return t["median_s"] / base["median_s"]


def _ratio_table(results: dict[str, Any], systems: list[str], labels: dict[str, str]
                 ) -> list[str]:
    others = [k for k in systems if k != BASE]
    head = ["workload", "graphkernel fused", "copy"] + [labels[k] for k in others]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in results["workloads"]:
        base = _timing(w["systems"].get(BASE, {}), FRESH)
        cells = [w["key"], fmt_time(base["median_s"]) if base else
                 f"**{w['systems'].get(BASE, {}).get('status', '—')}**"]
        for k in ["copy"] + others:
            r = ratio(w, k)
            cells.append(f"{r:.2f}×" if r is not None else "—")
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _compile_table(results: dict[str, Any], labels: dict[str, str]) -> list[str]:
    ct = results["compile_times"]
    systems: list[str] = []
    for row in ct["workloads"].values():
        systems += [k for k in row if k not in systems]
    head = ["workload"] + [labels.get(k, k) for k in systems]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def one(p: dict[str, Any] | None) -> str:
        if not p:
            return "—"
        if "error" in p:
            return "**error**"
        if "skipped" in p:
            return "skipped"
        s = f"{p['first_result_s']:.2f}"
        return s if p.get("ok", True) else s + " (check failed)"

    for key, row in ct["workloads"].items():
        cells = [key]
        for k in systems:
            r = row.get(k)
            cells.append(f"{one(r['cold'])} / {one(r['warm'])}" if r else "—")
        rows.append("| " + " | ".join(cells) + " |")
    rows.append("")
    rows.append("Imports not included. " + " ".join(
        f"{labels.get(k, k)}: {v}." for k, v in ct.get("notes", {}).items()))
    if ct.get("removed_environment"):
        rows.append("Probe processes ran without " + ", ".join(
            f"{k}={v}" for k, v in ct["removed_environment"].items()) + " (Python's bytecode "
            "cache written, as a user's process writes it).")
    errors = [(wk, k, r[c]["error"]) for wk, row in ct["workloads"].items()
              for k, r in row.items() for c in ("cold", "warm") if r.get(c) and
              "error" in r[c]]
    for wk, k, e in errors:
        rows.append(f"- compile probe {wk} / {labels.get(k, k)}: {e[:400]}")
    return rows


def _notes(results: dict[str, Any], labels: dict[str, str]) -> list[str]:
    out = []
    for s in results.get("skipped_systems", {}).values():
        out.append(f"- {s['label']} skipped: {s['note']}")
    seen_na = set()
    for w in results["workloads"]:
        for key, rec in w["systems"].items():
            if rec.get("status") == "not applicable":
                if (key, rec.get("note")) not in seen_na:
                    seen_na.add((key, rec.get("note")))
                    out.append(f"- {labels.get(key, key)} n/a: {rec.get('note')}")
                continue
            if rec.get("error"):
                out.append(f"- **{labels.get(key, key)}, {w['key']}: {rec['status']}**: "
                           f"{rec['error'][:600]}")
            for mode, m in rec.get("modes", {}).items():
                if m.get("status") not in (None, "ok"):
                    out.append(f"- **{labels.get(key, key)} ({mode}), {w['key']}: "
                               f"{m['status']}**: {m.get('error', '')[:600]}")
    for w in results["workloads"]:
        info = w["systems"].get(BASE, {}).get("info", {})
        if info.get("kernel_count") is not None:
            backends = ", ".join(f"{n} {b}" for b, n in info.get("backends", {}).items())
            out.append(f"- graphkernel fused, {w['key']}: {info['kernel_count']} kernel(s) per "
                       f"call ({backends})"
                       + ("; warnings: " + "; ".join(info["warnings"]) if info.get("warnings")
                          else ""))
    labels_all = {k: v["label"] for k, v in results.get("systems", {}).items()}
    for w in results["workloads"]:
        if not w.get("matmul_flops"):
            continue
        rates = []
        for key, rec in w["systems"].items():
            t = _timing(rec, FRESH)
            if t and t.get("matmul_gflops"):
                rates.append(f"{labels_all.get(key, key)} {t['matmul_gflops']:.0f}")
        out.append(f"- {w['key']} is bound by its matrix products ({w['matmul_flops'] / 1e9:.2f}"
                   f" GFLOP per call), not by memory: its fraction of copy bandwidth means "
                   f"little. GFLOP/s: " + ", ".join(rates) + ".")
    out.append("- Each sample follows one untimed call of the same system (on another input "
               "set), so no system is timed right after another framework's threads ran.")
    out.append("- Input sets rotated per call (so inputs are not found in the 'last-level "
               "cache'): " + ", ".join(f"{w['key']} {w['input_sets']}"
                                       for w in results["workloads"])
               + ". Tiny (overhead) workloads use one set and stay in cache.")
    return out


def chart(results: dict[str, Any], path: str) -> str | None:
    """Each system's time over graphkernel fused's, per workload, log scale."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        # Say so: a run that silently leaves no chart looks like a bug.
        print(f"bench: no chart written ({path}): matplotlib is not installed here; "
              "`pip install matplotlib` (or -r bench/requirements.txt) and rerender with "
              "`python -m bench.report RESULTS.json`", file=sys.stderr)
        return None
    systems = [k for k in system_order(results) if k != BASE]
    labels = {k: v["label"] for k, v in results["systems"].items()}
    series = ["copy"] + systems
    workloads = results["workloads"]
    fig, ax = plt.subplots(figsize=(max(10, 1.3 * len(workloads)), 6.5))
    width = 0.85 / max(1, len(series))
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#bcbd22", "#17becf", "#393b79", "#637939"]
    for j, key in enumerate(series):
        xs, ys = [], []
        for i, w in enumerate(workloads):
            r = ratio(w, key)
            if r is not None:
                xs.append(i + (j - (len(series) - 1) / 2) * width)
                ys.append(r)
        color = "0.75" if key == "copy" else palette[j % len(palette)]
        label = "copy of the same bytes (floor)" if key == "copy" else labels[key]
        ax.bar(xs, ys, width=width, color=color, label=label,
               hatch="//" if key == "copy" else None, edgecolor="0.4" if key == "copy" else None)
        for i, w in enumerate(workloads):  # mark failures and inaccurate answers
            rec = w["systems"].get(key) if key != "copy" else None
            x = i + (j - (len(series) - 1) / 2) * width
            r = ratio(w, key)
            if rec and rec.get("status") not in ("ok", "not applicable") and r is None:
                ax.text(x, 1.0, "✗", ha="center", va="bottom", color="red", fontsize=9)
            elif rec and _status(rec, FRESH) == "inaccurate" and r is not None:
                ax.text(x, r, "!", ha="center", va="bottom", color="red", fontsize=9)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_yscale("log")
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels([w["key"] for w in workloads], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("time / graphkernel fused time (log; >1: graphkernel fused faster)")
    ax.set_xlabel("✗: failed (see results.md)   !: outside the accuracy tolerance", fontsize=8)
    ax.set_title(f"graphkernel fused vs the alternatives ({results['suite']} suite, fresh "
                 f"output per call; {results['machine'].get('cpu_model', '')}, "
                 f"{results['machine'].get('cpu_count')} CPUs)", fontsize=10)
    ax.legend(fontsize=8, ncol=2, loc="best")
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(results: dict[str, Any], out_dir: str, command: str | None = None
              ) -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "results.json"),
             "markdown": os.path.join(out_dir, "results.md"),
             "chart": os.path.join(out_dir, "chart.png")}
    results = dict(results, command=command)
    with open(paths["json"], "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1, default=str)
        fh.write("\n")
    with open(paths["markdown"], "w", encoding="utf-8") as fh:
        fh.write(markdown(results, command))
    if chart(results, paths["chart"]) is None:
        del paths["chart"]
    return paths


def rerender(json_path: str) -> dict[str, str]:
    """Write results.md and chart.png again from a results.json (same folder)."""
    with open(json_path, encoding="utf-8") as fh:
        results = json.load(fh)
    out_dir = os.path.dirname(os.path.abspath(json_path))
    paths = {"markdown": os.path.join(out_dir, "results.md"),
             "chart": os.path.join(out_dir, "chart.png")}
    with open(paths["markdown"], "w", encoding="utf-8") as fh:
        fh.write(markdown(results, results.get("command")))
    if chart(results, paths["chart"]) is None:
        del paths["chart"]
    return paths


if __name__ == "__main__":
    import sys
    for path in rerender(sys.argv[1] if len(sys.argv) > 1 else "bench/results/results.json"
                         ).values():
        print(path)
