"""Figures as text with their units, for the tables and the progress lines alike."""
from __future__ import annotations

from typing import Any


def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.3g} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def probe_text(probe: dict[str, Any] | None) -> str:
    """One compile probe's time to its first result (bench/probe.py), or what happened."""
    if probe is None:
        return "not run"
    if "error" in probe:
        return f"error ({str(probe['error'])[:200]})"
    if "skipped" in probe:
        return f"skipped ({probe['skipped']})"
    return fmt_time(probe["first_result_s"])


def parallel_text(check: dict[str, Any]) -> str:
    """machine.parallel_check's result as a sentence."""
    pairs = check["two_processes_s"]
    return (f"one process {fmt_time(check['one_process_s'])}, two at once "
            f"{fmt_time(sum(pairs) / len(pairs))} each (mean of {len(pairs)}): "
            f"ratio {check['ratio']:.2f}, {check['verdict']}")
