"""The report's HTML pieces: figures, kernel tables, reasons, generated C, stages, overview and
the lab's conclusions. Each takes plain data and returns HTML."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from graphkernel.graph_kernel.reasons import RULES
from graphkernel.passes import stage_names
from graphkernel.runtime.executable import KernelInfo
from graphkernel.tools.report_page import esc
from graphkernel.tools.report_roofline import (
    Ceilings,
    flops_text,
    giga,
    is_training,
    phase_label,
    points_of,
    share_text,
)
from graphkernel.tools.report_timing import Breakdown, Spread

INITIAL, FINAL = stage_names.INITIAL, stage_names.FINAL

# What each refusal rule means, for the grouped reasons table.
RULE_TITLES = {
    "flag": "a graph_kernel_flags setting keeps them apart",
    "limit": "together they would pass --composite_op_limit_size",
    "cycle": "fusing them would make a cycle through another op",
    "shape": "their loops do not share one iteration space",
    "cost": "the cost model says fusing would not pay",
}


def us(seconds: float | None) -> str:
    """Microseconds to 0.1, or to 0.01 below one (a kernel timed inside the compiled entry can
    take a few tens of nanoseconds)."""
    if seconds is None:
        return "&ndash;"
    return f"{seconds * 1e6:,.{2 if seconds < 1e-6 else 1}f}&nbsp;&micro;s"


def us_spread(spread: Spread | None) -> str:
    """`0.6 µs (IQR 0.6–0.7)`: the median and the interquartile range."""
    if spread is None:
        return "&ndash;"
    return (f"{us(spread.median)} <span class=\"muted small\">(IQR {spread.q1 * 1e6:,.1f}"
            f"&ndash;{spread.q3 * 1e6:,.1f})</span>")


def size(n: int) -> str:
    return f"{n:,}&nbsp;B" if n < 10_000 else f"{n / 1024:,.1f}&nbsp;KiB"


def speed(ratio: float | None, low: float | None = None, high: float | None = None,
          neutral: bool = False) -> str:
    """`3.10x faster (2.9-3.3x)`; when the range from the interquartile ranges holds 1 the
    two are not told apart by this measurement, and it says so rather than name a winner
    that the next run could flip. `neutral`: the ratio is not fusion's effect (a call that is
    overhead at its size), shown without the colour of a result."""
    if ratio is None:
        return "&ndash;"
    if low is not None and high is not None and low <= 1.0 <= high:
        return (f'<span class="even">within noise</span> <span class="muted small">'
                f"({low:.2f}&ndash;{high:.2f}&times;)</span>")
    word = "faster" if ratio >= 1 else "slower"
    factor = ratio if ratio >= 1 else 1 / ratio
    css = "even" if neutral else "good" if ratio >= 1 else "bad"
    text = f'<span class="{css}">{factor:.2f}&times; {word}</span>'
    if low is not None and high is not None:
        lo, hi = (low, high) if ratio >= 1 else (1 / high, 1 / low)
        text += f' <span class="muted small">({lo:.2f}&ndash;{hi:.2f}&times;)</span>'
    return text


def figures(initial_svg: str, final_svg: str, final_caption: str) -> str:
    legend = ('<p class="legend muted small"><span class="key fusedkey"></span> a kernel made by '
              'fusion &nbsp; <span class="key userkey"></span> your <code>GraphKernel</code> '
              "composite (dashed) &nbsp; plain text on an edge: a constant</p>")
    return (
        '<div class="figs">'
        f'<figure class="fig"><figcaption><b>Initial graph</b> <code>{INITIAL}</code>'
        f"</figcaption>{initial_svg}</figure>"
        f'<figure class="fig"><figcaption><b>Graph that runs</b> <code>{FINAL}</code> '
        f"&middot; {final_caption}</figcaption>{final_svg}</figure></div>{legend}")


def stages_html(stages: Sequence[tuple[str, str, str]]) -> str:
    """(name, doc, ir text) per stage, each folded in a <details>."""
    parts = [f'<h3>Stages <span class="muted">({len(stages)})</span></h3><div class="stages">']
    for name, doc, text in stages:
        parts.append(f'<details class="stage"><summary><code>{esc(name)}</code>'
                     f'{" &mdash; " + esc(doc) if doc else ""}</summary>'
                     f"<pre>{esc(text)}</pre></details>")
    parts.append("</div>")
    return "".join(parts)


def sources_html(kernels: Sequence[tuple[str, str, str | None, str]]) -> str:
    """(name, ops, source or None, note) per kernel."""
    with_code = [k for k in kernels if k[2]]
    parts = [f'<h3>Generated C <span class="muted">({len(with_code)} kernel'
             f'{"" if len(with_code) == 1 else "s"})</span></h3>']
    if not with_code:
        parts.append('<p class="muted">No generated kernels: every op runs as a numpy '
                     "library call.</p>")
    for name, ops, source, _ in with_code:
        parts.append(f'<details class="source" open><summary><code>{esc(name)}</code> '
                     f'<span class="muted">{esc(ops)}</span></summary>'
                     f"<pre><code>{esc(source)}</code></pre></details>")
    for name, _, source, note in kernels:
        if not source and note:
            parts.append(f'<p class="muted"><code>{esc(name)}</code> has no generated code: '
                         f"{esc(note)}</p>")
    return "".join(parts)


def reasons_html(reasons: Sequence[Any], fusion_on: bool) -> str:
    """Pairs that were candidates for fusion, grouped by the rule that kept them apart; pairs
    next to an op that never fuses (rule "pattern") counted in one line."""
    parts = ["<h3>Ops kept apart</h3>"]
    if not fusion_on:
        parts.append('<p class="muted">Fusion was off: no pair of ops was considered.</p>')
        return "".join(parts)
    candidates = [r for r in reasons if r.rule != "pattern"]
    never = [r for r in reasons if r.rule == "pattern"]
    if not reasons:
        parts.append('<p class="muted">None: every pair of adjacent fusible ops was fused.</p>')
    if candidates:
        parts.append('<table class="reasons"><thead><tr><th>producer</th><th>consumer</th>'
                     "<th>rule</th><th>why</th><th>stage</th></tr></thead><tbody>")
        order = list(RULES)
        for rule in sorted({r.rule for r in candidates}, key=order.index):
            group = [r for r in candidates if r.rule == rule]
            parts.append(f'<tr class="rulegroup"><td colspan="5"><span class="rule">{esc(rule)}'
                         f"</span> {esc(RULE_TITLES.get(rule, ''))} "
                         f'<span class="muted">({len(group)})</span></td></tr>')
            for r in group:
                parts.append(f"<tr><td><code>{esc(r.producer)}</code></td><td><code>"
                             f"{esc(r.consumer)}</code></td><td><span class=\"rule\">"
                             f"{esc(r.rule)}</span></td><td>{esc(r.detail)}</td><td><code>"
                             f"{esc(r.stage)}</code></td></tr>")
        parts.append("</tbody></table>")
    elif reasons:
        parts.append('<p class="muted">No pair of fusible ops was kept apart.</p>')
    if never:
        why = Counter(r.detail.split(":", 1)[0] for r in never)
        listed = "; ".join(f"{esc(text)}" + (f" (&times;{n})" if n > 1 else "")
                           for text, n in why.most_common())
        parts.append(f'<p class="never muted">{len(never)} more pair'
                     f'{"s were" if len(never) > 1 else " was"} never a candidate, next to an op '
                     f"that does not fuse: {listed}.</p>")
    return "".join(parts)


def kernel_table(kernels: Sequence[KernelInfo], split: Breakdown | None, whole: Spread | None,
                 through_entry: bool, caption: str, css: str, ceilings: Ceilings | None = None
                 ) -> str:
    """The kernels of one call with their times inside a step-by-step call; the rows and the
    dispatch row add up to that call (see report_timing.Breakdown). Each row also has its
    bytes moved and flops from the plan, the rates they give at its time and its share of the
    roof at its intensity (report_roofline)."""
    points = points_of(kernels, split.fastest) if split else []
    training = is_training(points_of(kernels, [0.0] * len(kernels)))
    rows = []
    for i, k in enumerate(kernels):
        t = split.per_kernel[i] if split else None
        p = points[i] if points else None
        part = (f'<td class="part">{esc(phase_label(k.phases))}</td>' if training else "")
        share = p.share_of_roof(ceilings) if p is not None and ceilings is not None else None
        rows.append(f"<tr><td class=\"num\">{i}</td><td><code>{esc(k.name)}</code></td>"
                    f"<td>{esc(' + '.join(k.op_names))}</td><td><code>{esc(k.output)}</code></td>"
                    f"<td><span class=\"backend {esc(k.backend)}\">{esc(k.backend)}</span></td>"
                    f"{part}<td class=\"num bytes\">{size(k.bytes_moved)}</td>"
                    f'<td class="num flops">{flops_text(k.flops)}</td>'
                    f'<td class="num fastest">{us(p.seconds if p else None)}</td>'
                    f'<td class="num gbs">{giga(p.bytes_per_s if p else None, "GB/s")}</td>'
                    f'<td class="num gflops">{giga(p.flops_per_s if p else None, "GFLOP/s")}</td>'
                    f'<td class="num roofshare">{share_text(share)}</td>'
                    f"<td class=\"num time\">{us(t)}</td></tr>")
    columns = 12 if training else 11
    if split is not None:
        gaps = ("the entry's argument checks, buffer takes and views, the timing"
                if split.in_entry else
                "Python dispatch, input checks, timing")
        rows.append(f'<tr class="between"><td></td><td colspan="{columns - 1}">between the '
                    f"kernels: {gaps}</td>"
                    f'<td class="num">{us(split.between)}</td></tr>')
    total_bytes = sum(k.bytes_moved for k in kernels)
    flops = [k.flops for k in kernels]
    total_flops = None if None in flops else sum(f or 0 for f in flops)
    foot = (f"<tfoot><tr><td></td><td>{len(kernels)} kernel{'' if len(kernels) == 1 else 's'}"
            f"</td><td>{sum(len(k.op_names) for k in kernels)} ops</td><td></td>"
            f"<td>one call, step by step</td>{'<td></td>' if training else ''}"
            f"<td class=\"num\">{size(total_bytes)}</td><td class=\"num\">"
            f"{flops_text(total_flops)}</td><td></td><td></td><td></td><td></td>"
            f"<td class=\"num call\">{us(split.call if split else None)}</td></tr></tfoot>")
    note = ""
    if split is not None and whole is not None:
        how = ("through the graph's compiled entry, one C call that launches every kernel "
               "with no Python in between (and no per-kernel timing inside it)"
               if through_entry else "as <code>run_arrays</code> runs it")
        steps = ("calls of the compiled entry, each step timed in C inside the call (products "
                 "on the kernels a call runs)" if split.in_entry else
                 "step-by-step calls, each kernel dispatched from Python and timed inside the "
                 "call")
        note = (f'<p class="timenote muted small">Kernel times are means over the middle half '
                f"of {split.calls} {steps}, so the rows add up to that call. The call as you run "
                f"it goes {how}: {us_spread(whole)} (median and interquartile range), the time "
                "the overview and speedup use. Bytes moved: the buffers a kernel reads and "
                "writes; flops: counted from its ops (a ? where an op has no count); GB/s and "
                "GFLOP/s: those over its fastest time in these calls (other work on the "
                "machine only adds time, and the roof is a best-of measurement too); of roof: "
                "its rate over the roofline's at its flops per byte.</p>")
    return (f'<table class="kernels {css}"><caption>{caption}</caption><thead><tr>'
            "<th class=\"num\">#</th><th>kernel</th><th>member ops</th><th>output</th>"
            "<th>backend</th>" + ("<th>part</th>" if training else "") +
            "<th class=\"num\">bytes moved</th><th class=\"num\">flops</th>"
            "<th class=\"num\">fastest</th>"
            "<th class=\"num\">GB/s</th><th class=\"num\">GFLOP/s</th>"
            "<th class=\"num\">of roof</th><th class=\"num\">time in a "
            f"step-by-step call</th></tr></thead><tbody>{''.join(rows)}</tbody>{foot}</table>"
            + note)


def overview_html(rows: Sequence[str]) -> str:
    return ('<section class="overview"><h2>Overview</h2><table class="overview-table"><thead><tr>'
            "<th>graph</th><th>fusion</th><th class=\"num\">kernels per call</th>"
            "<th class=\"num\">time per call</th><th class=\"num\">kernels without fusion</th>"
            "<th class=\"num\">time without fusion</th><th class=\"num\">speedup</th>"
            f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            '<p class="muted small">Times: median over batches of calls on random inputs '
            "(interquartile range in brackets), measured when this page was made.</p></section>")


def conclusions_html(found: Sequence[Any]) -> str:
    items = []
    for i, c in enumerate(found, 1):
        badge = ('<span class="badge holds">holds</span>' if c.holds
                 else '<span class="badge fails">does not hold</span>')
        items.append(f'<li class="conclusion {"holds" if c.holds else "fails"}">{badge} '
                     f'<span class="ctext">{i}. {esc(c.text)}</span>'
                     f'<div class="evidence">{esc(c.evidence)}</div></li>')
    held = sum(1 for c in found if c.holds)
    return (f'<section class="conclusions"><h2>The lab\'s conclusions <span class="muted">'
            f"({held} of {len(found)} hold)</span></h2><ol>{''.join(items)}</ol></section>")


def _mib(n: int) -> str:
    return size(n) if n < 1 << 20 else f"{n / (1 << 20):,.1f}&nbsp;MiB"


def savings_html(savings: Sequence[Any]) -> str:
    """The lab's headline: what fusion saves (lab.Saving per size: kernels, bytes from the
    plans, time measured in alternating samples), the largest size first in words. A time
    difference the measurement cannot tell apart is said to be so, never a winner."""
    big = max(savings, key=lambda s: s.bytes_off)
    dims = "&times;".join(map(str, big.shape))
    ratio = big.ratio
    array = _mib(math.prod(big.shape) * 4)
    sentence = (f'<p class="big">At {dims} float32 ({array} an array, past the caches) '
                "fusion runs ((x &times; 2) + 1) &times; 3 as "
                f"<b>{big.kernels_on} kernel instead of {big.kernels_off}</b>, moves "
                f"<b>{_mib(big.bytes_on)} instead of {_mib(big.bytes_off)}</b> a call, and a "
                f"call takes <b>{us(big.time_on.median)} instead of {us(big.time_off.median)}"
                f"</b>: {speed(*ratio)}.</p>")
    rows = []
    for s in savings:
        rows.append(f'<tr><td><code>float32[{",".join(map(str, s.shape))}]</code></td>'
                    f'<td class="num">{s.kernels_off} &rarr; {s.kernels_on}</td>'
                    f'<td class="num">{_mib(s.bytes_off)} &rarr; {_mib(s.bytes_on)}</td>'
                    f'<td class="num">{us_spread(s.time_off)}</td>'
                    f'<td class="num">{us_spread(s.time_on)}</td>'
                    f'<td class="num">{speed(*s.ratio)}</td></tr>')
    small = min(savings, key=lambda s: s.bytes_off)
    return ('<section class="headline"><h2>What fusion saves</h2>' + sentence +
            '<table class="savings"><thead><tr><th>input</th><th class="num">kernels off '
            '&rarr; on</th><th class="num">bytes moved off &rarr; on</th><th class="num">'
            'time off</th><th class="num">time on</th><th class="num">fusion</th></tr>'
            f"</thead><tbody>{''.join(rows)}</tbody></table>"
            f'<p class="muted small">Bytes moved: the buffers each kernel reads and writes, '
            f"from the plans. Times: median and interquartile range of {small.time_on.samples}"
            " samples each, fusion off and on in turns, measured when this page was made; "
            "the ratio is the median of each pair's off/on, with the quartiles of those "
            "ratios after it: when they hold 1 the difference is noise, not a result. At "
            "the lab's "
            f"{'&times;'.join(map(str, small.shape))} both versions are one C call over "
            f"{_mib(small.bytes_off)} or less: nothing is left to save but a few loads, "
            "so the lesson shows where memory traffic dominates.</p></section>")
