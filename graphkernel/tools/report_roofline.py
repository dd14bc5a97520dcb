"""The report's roofline: each timed kernel's achieved GB/s and GFLOP/s against this machine's
measured copy bandwidth and FMA rate (tools/machine_rates.py, what `graphkernel doctor`
prints), drawn as inline SVG, and a training step's time split into forward, backward and
optimizer.

Bytes and flops come from the plan (`KernelInfo.bytes_moved`: the buffers a kernel reads and
writes; `KernelInfo.flops`: runtime/flops.py, from the op table), times from the step-by-step
split (report_timing.Breakdown). A kernel's roof at its arithmetic intensity I (flops per
byte) is min(copy bandwidth x I, FMA rate): under the slope it is bound by memory, under the
flat part by arithmetic. Kernels with no flops counted (data movement, or an op with no count)
are drawn in a strip of their own by GB/s against the copy bandwidth.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from graphkernel.ir.graph import BACKWARD, FORWARD, OPTIMIZER, PHASES
from graphkernel.runtime.executable import KernelInfo
from graphkernel.tools.report_page import esc

_CEILINGS: list[Ceilings] = []  # measured once per process


@dataclass(frozen=True)
class Ceilings:
    """The machine's measured rates: bytes per second a copy moves (read plus written), and
    flops per second of fused multiply-adds (None: no C compiler to measure it)."""

    copy_bytes_per_s: float
    fma_flops_per_s: float | None
    how: str

    def roof(self, intensity: float) -> float:
        """Attainable flops per second at `intensity` flops per byte."""
        memory = self.copy_bytes_per_s * intensity
        return memory if self.fma_flops_per_s is None else min(memory, self.fma_flops_per_s)

    @property
    def ridge(self) -> float | None:
        """The intensity where the two roofs meet (flops per byte)."""
        return None if self.fma_flops_per_s is None else \
            self.fma_flops_per_s / self.copy_bytes_per_s


def measured_ceilings() -> Ceilings:
    """The rates `graphkernel doctor` prints, measured on this machine once per process."""
    if not _CEILINGS:
        from graphkernel.backends.c import toolchain
        from graphkernel.tools import machine_rates
        # The best of three: on a loaded machine one short run can catch a busy moment.
        copy = max((machine_rates.copy_bandwidth() for _ in range(3)), key=lambda r: r.value)
        fma = machine_rates.fma_rate(toolchain.detect())
        how = f"copy: {copy.how}; " + (f"FMA: {fma.how}" if isinstance(fma, machine_rates.Rate)
                                       else f"no FMA rate ({fma})")
        _CEILINGS.append(Ceilings(copy.value * 1e9, fma.value * 1e9
                                  if isinstance(fma, machine_rates.Rate) else None, how))
    return _CEILINGS[0]


@dataclass(frozen=True)
class KernelPoint:
    """One timed kernel: what the plan says it moves and computes, and its time."""

    name: str
    baseline: bool  # a kernel of the graph compiled without fusion
    bytes_moved: int
    flops: int | None
    seconds: float
    phases: tuple[str, ...]

    @property
    def bytes_per_s(self) -> float | None:
        return self.bytes_moved / self.seconds if self.seconds > 0 and self.bytes_moved else None

    @property
    def flops_per_s(self) -> float | None:
        return self.flops / self.seconds if self.seconds > 0 and self.flops else None

    @property
    def intensity(self) -> float | None:
        return self.flops / self.bytes_moved if self.flops and self.bytes_moved else None

    def share_of_roof(self, ceilings: Ceilings) -> float | None:
        """Achieved over attainable: flops per second over the roof at its intensity, or (no
        flops) bytes per second over the copy bandwidth."""
        if self.intensity is not None and self.flops_per_s is not None:
            return self.flops_per_s / ceilings.roof(self.intensity)
        if self.bytes_per_s is not None:
            return self.bytes_per_s / ceilings.copy_bytes_per_s
        return None


def points_of(kernels: Sequence[KernelInfo], seconds: Sequence[float], baseline: bool = False
              ) -> list[KernelPoint]:
    return [KernelPoint(k.name, baseline, k.bytes_moved, k.flops, t, k.phases or (FORWARD,))
            for k, t in zip(kernels, seconds)]


def phase_label(phases: Sequence[str]) -> str:
    return " + ".join(phases) if phases else FORWARD


def is_training(points: Sequence[KernelPoint]) -> bool:
    return any(p.phases != (FORWARD,) for p in points)


# -- numbers for tables -------------------------------------------------------------------------

def giga(per_second: float | None, unit: str) -> str:
    """`12.3 GB/s` from bytes (or flops) per second."""
    if per_second is None:
        return "&ndash;"
    value = per_second / 1e9
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:,.{digits}f}&nbsp;{unit}"


def flops_text(flops: int | None) -> str:
    if flops is None:
        return '<span class="muted" title="no count for this op">?</span>'
    return f"{flops:,}" if flops < 10_000 else f"{flops / 1e6:,.2f}&nbsp;M"


def share_text(share: float | None) -> str:
    return "&ndash;" if share is None else f"{share * 100:,.0f}%"


# -- the picture ---------------------------------------------------------------------------------

_W, _H = 760, 380
_STRIP = (58, 132)  # x range of the no-flops strip
_PLOT = (196, 740)  # x range of the roofline plot
_TOP, _BOTTOM = 24, 330
_COLOURS = {(FORWARD,): "#3559e0", (BACKWARD,): "#d9480f", (OPTIMIZER,): "#0f7b3f",
            (FORWARD, BACKWARD): "#c2255c", (BACKWARD, OPTIMIZER): "#7a3fb0"}
_MIXED = "#495057"  # any other mix


def _colour(phases: tuple[str, ...]) -> str:
    return _COLOURS.get(phases, _MIXED)


def _decades(low: float, high: float) -> tuple[int, int]:
    lo, hi = math.floor(math.log10(low)), math.ceil(math.log10(high))
    return lo, hi if hi > lo else lo + 1


def _fmt(x: float) -> str:
    return f"{x:g}"


def roofline_svg(points: Sequence[KernelPoint], ceilings: Ceilings, label: str) -> str:
    """The roofline of `points` against `ceilings`, as inline SVG: one circle per kernel (filled:
    as compiled; hollow: without fusion) with its name and figures in a <title> for hover."""
    bw, fma = ceilings.copy_bytes_per_s, ceilings.fma_flops_per_s
    plotted = [p for p in points if p.intensity is not None and p.flops_per_s is not None]
    strip = [p for p in points if p not in plotted]
    # Axes: flops per byte and GFLOP/s, whole decades around the points and both roofs.
    xs = [p.intensity for p in plotted if p.intensity] + [ceilings.ridge or 1.0, 0.1, 10.0]
    x_lo, x_hi = _decades(min(xs) / 2, max(xs) * 2)
    ys = [p.flops_per_s for p in plotted if p.flops_per_s] + [fma or bw * 10 ** x_hi]
    y_lo, y_hi = _decades(min(ys + [bw * 10 ** x_lo]) / 2, max(ys) * 1.5)

    def px(intensity: float) -> float:
        span = _PLOT[1] - _PLOT[0]
        return _PLOT[0] + (math.log10(intensity) - x_lo) / (x_hi - x_lo) * span

    def py(flops_per_s: float) -> float:
        span = _BOTTOM - _TOP
        return _BOTTOM - (math.log10(flops_per_s) - y_lo) / (y_hi - y_lo) * span

    out = [f'<svg class="roofline" role="img" aria-label="{esc(label)}" width="{_W}" '
           f'height="{_H}" viewBox="0 0 {_W} {_H}" data-copy-bytes-per-s="{bw!r}" '
           f'data-fma-flops-per-s="{fma!r}" font-size="11" font-family="sans-serif">']
    # grid and axis labels
    for d in range(x_lo, x_hi + 1):
        x = px(10.0 ** d)
        out.append(f'<line x1="{x:.1f}" y1="{_TOP}" x2="{x:.1f}" y2="{_BOTTOM}" '
                   'stroke="#eef0f3"/>'
                   f'<text x="{x:.1f}" y="{_BOTTOM + 14}" text-anchor="middle" fill="#667085">'
                   f"{_fmt(10.0 ** d)}</text>")
    for d in range(y_lo, y_hi + 1):
        y = py(10.0 ** d)
        out.append(f'<line x1="{_PLOT[0]}" y1="{y:.1f}" x2="{_PLOT[1]}" y2="{y:.1f}" '
                   'stroke="#eef0f3"/>'
                   f'<text x="{_PLOT[0] - 4}" y="{y + 4:.1f}" text-anchor="end" fill="#667085">'
                   f"{_fmt(10.0 ** d / 1e9)}</text>")
    out.append(f'<rect x="{_PLOT[0]}" y="{_TOP}" width="{_PLOT[1] - _PLOT[0]}" '
               f'height="{_BOTTOM - _TOP}" fill="none" stroke="#98a2b3"/>'
               f'<text x="{(_PLOT[0] + _PLOT[1]) / 2}" y="{_H - 18}" text-anchor="middle" '
               'fill="#344054">arithmetic intensity: flops per byte moved (log)</text>'
               f'<text x="{_PLOT[0] - 40}" y="{(_TOP + _BOTTOM) / 2}" text-anchor="middle" '
               f'fill="#344054" transform="rotate(-90 {_PLOT[0] - 40} '
               f'{(_TOP + _BOTTOM) / 2})">GFLOP/s (log)</text>')
    # the roofs: the copy bandwidth's slope, then the FMA rate's flat top
    x0, x1 = 10.0 ** x_lo, 10.0 ** x_hi
    start = max(x0, 10.0 ** y_lo / bw)
    ridge = ceilings.ridge if ceilings.ridge is not None else x1
    ridge = min(max(ridge, start), x1)
    out.append(f'<line class="ceiling bandwidth" x1="{px(start):.1f}" y1="{py(bw * start):.1f}" '
               f'x2="{px(ridge):.1f}" y2="{py(bw * ridge):.1f}" stroke="#1d2330" '
               f'stroke-width="2" data-bytes-per-s="{bw!r}"><title>copy bandwidth '
               f"{bw / 1e9:,.1f} GB/s (measured)</title></line>")
    out.append(f'<text x="{px(start) + 6:.1f}" y="{py(bw * start) - 6:.1f}" fill="#1d2330" '
               f'transform="rotate(-{_slope_degrees(px, py, start, ridge, bw):.1f} '
               f'{px(start) + 6:.1f} {py(bw * start) - 6:.1f})">copy {bw / 1e9:,.1f} GB/s'
               "</text>")
    if fma is not None:
        out.append(f'<line class="ceiling compute" x1="{px(ridge):.1f}" y1="{py(fma):.1f}" '
                   f'x2="{px(x1):.1f}" y2="{py(fma):.1f}" stroke="#1d2330" stroke-width="2" '
                   f'data-flops-per-s="{fma!r}"><title>FMA rate {fma / 1e9:,.1f} GFLOP/s, one '
                   "core (measured)</title></line>"
                   f'<text x="{px(x1) - 4:.1f}" y="{py(fma) - 6:.1f}" text-anchor="end" '
                   f'fill="#1d2330">FMA {fma / 1e9:,.1f} GFLOP/s (one core)</text>')
    # the strip: kernels with no flops counted, by GB/s on a linear axis up to the copy roof
    top_bw = max([bw] + [p.bytes_per_s or 0.0 for p in strip]) * 1.15

    def sy(bytes_per_s: float) -> float:
        return _BOTTOM - bytes_per_s / top_bw * (_BOTTOM - _TOP)

    out.append(f'<rect x="{_STRIP[0]}" y="{_TOP}" width="{_STRIP[1] - _STRIP[0]}" '
               f'height="{_BOTTOM - _TOP}" fill="#fcfcfd" stroke="#98a2b3"/>'
               f'<line class="ceiling strip-bandwidth" x1="{_STRIP[0]}" y1="{sy(bw):.1f}" '
               f'x2="{_STRIP[1]}" y2="{sy(bw):.1f}" stroke="#1d2330" stroke-width="2" '
               f'data-bytes-per-s="{bw!r}"/>'
               f'<text x="{(_STRIP[0] + _STRIP[1]) / 2}" y="{sy(bw) - 5:.1f}" '
               f'text-anchor="middle" fill="#1d2330">copy</text>'
               f'<text x="{_STRIP[0] - 4}" y="{_BOTTOM + 4}" text-anchor="end" '
               'fill="#667085">0</text>'
               f'<text x="{_STRIP[0] - 4}" y="{sy(bw) + 4:.1f}" text-anchor="end" '
               f'fill="#667085">{bw / 1e9:,.0f}</text>'
               f'<text x="{(_STRIP[0] + _STRIP[1]) / 2}" y="{_BOTTOM + 14}" '
               'text-anchor="middle" fill="#344054">no flops: GB/s</text>')
    for i, p in enumerate(points):
        colour = _colour(p.phases)
        fill = "#fff" if p.baseline else colour
        where = "without fusion" if p.baseline else "as compiled"
        title = (f"{p.name} ({where}; {phase_label(p.phases)}): {_short(p.bytes_per_s, 'GB/s')}"
                 f", {_short(p.flops_per_s, 'GFLOP/s')}, "
                 + (f"{p.intensity:.3g} flop/B, " if p.intensity is not None else
                    "no flops counted, ")
                 + f"{share_text(p.share_of_roof(ceilings))} of its roof, "
                 f"{p.seconds * 1e6:,.1f} \u00b5s")
        if p in plotted:
            assert p.intensity is not None and p.flops_per_s is not None
            cx, cy = px(p.intensity), py(p.flops_per_s)
        else:
            cx = _STRIP[0] + 12 + (i * 17) % (_STRIP[1] - _STRIP[0] - 24)
            cy = sy(p.bytes_per_s or 0.0)
        out.append(f'<circle class="point{" baseline" if p.baseline else ""}" cx="{cx:.1f}" '
                   f'cy="{cy:.1f}" r="5" fill="{fill}" stroke="{colour}" stroke-width="2" '
                   f'data-kernel="{esc(p.name)}" data-phases="{esc(" ".join(p.phases))}" '
                   f'data-bytes-per-s="{p.bytes_per_s or 0.0!r}" '
                   f'data-flops-per-s="{p.flops_per_s or 0.0!r}">'
                   f"<title>{esc(title)}</title></circle>")
    out.append("</svg>")
    return "".join(out)


def _slope_degrees(px: Callable[[float], float], py: Callable[[float], float], a: float,
                   b: float, bw: float) -> float:
    """The on-screen angle of the bandwidth roof (for its label)."""
    if b <= a:
        return 0.0
    return math.degrees(math.atan2(py(bw * a) - py(bw * b), px(b) - px(a)))


def _short(value: float | None, unit: str) -> str:
    return "no " + unit.split("/")[0] if value is None else f"{value / 1e9:,.3g} {unit}"


def legend_html(points: Sequence[KernelPoint]) -> str:
    seen = []
    for p in points:
        if p.phases not in seen:
            seen.append(p.phases)
    keys = "".join(f'<span class="key" style="background:{_colour(ph)}"></span>'
                   f"{esc(phase_label(ph))} &nbsp; " for ph in seen)
    hollow = ('<span class="key" style="border:2px solid #667085;background:#fff"></span>'
              "without fusion" if any(p.baseline for p in points) else "")
    return f'<p class="legend muted small">{keys}{hollow}</p>'


def phase_table(points: Sequence[KernelPoint]) -> str:
    """A training step's kernels by part (kernels that compute two parts, fused across them,
    in a row of their own): kernels, time, bytes and flops."""
    rows: dict[tuple[str, ...], list[KernelPoint]] = {}
    for p in points:
        rows.setdefault(p.phases, []).append(p)
    order = sorted(rows, key=lambda ph: (max(PHASES.index(x) for x in ph), len(ph)))
    total = sum(p.seconds for p in points) or 1.0
    body = []
    for ph in order:
        group = rows[ph]
        seconds = sum(p.seconds for p in group)
        flops = [p.flops for p in group]
        known = None if None in flops else sum(f or 0 for f in flops)
        body.append(f'<tr data-phases="{esc(" ".join(ph))}"><td>{esc(phase_label(ph))}</td>'
                    f'<td class="num count">{len(group)}</td>'
                    f'<td class="num">{seconds * 1e6:,.1f}&nbsp;&micro;s</td>'
                    f'<td class="num">{seconds / total * 100:,.0f}%</td>'
                    f'<td class="num">{sum(p.bytes_moved for p in group):,}&nbsp;B</td>'
                    f'<td class="num">{flops_text(known)}</td></tr>')
    return ('<table class="phases"><caption>The training step by part (kernels as compiled)'
            '</caption><thead><tr><th>part</th><th class="num">kernels</th>'
            '<th class="num">time in a step-by-step call</th><th class="num">share</th>'
            '<th class="num">bytes moved</th><th class="num">flops</th></tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def roofline_html(points: Sequence[KernelPoint], ceilings: Ceilings, label: str) -> str:
    """The section part: the picture, its legend and what it says, and (a training step) the
    split by part."""
    fused = [p for p in points if not p.baseline]
    at_roof = [p for p in fused if (p.share_of_roof(ceilings) or 0) >= 0.5]
    summary = (f"{len(at_roof)} of {len(fused)} kernel{'' if len(fused) == 1 else 's'} as "
               "compiled reach half their roof or more" + (
                   ": " + ", ".join(f"<code>{esc(p.name)}</code>" for p in at_roof)
                   if at_roof else "; far under it, a kernel's time is dispatch, "
                   "its own overhead or a schedule that does not stream"))
    fma = ceilings.fma_flops_per_s
    parts = ["<h3>Roofline</h3>",
             f'<p class="meaning">Each kernel at its flops per byte moved (both from the plan) '
             f"and the rate it reached in the step-by-step call, under this machine's measured "
             f"ceilings: copy bandwidth {ceilings.copy_bytes_per_s / 1e9:,.1f}&nbsp;GB/s and "
             + (f"FMA rate {fma / 1e9:,.1f}&nbsp;GFLOP/s (one core; a threaded kernel may pass "
                "it)" if fma is not None else "no FMA rate (no C compiler)")
             + f". {summary}. Hover a point for its figures. The copy roof is memory's: a "
             "kernel whose data stays in cache between calls can pass it, and one with "
             "streaming stores can too (up to 1.5&times;: a copy also reads the memory it "
             "writes, which it does not count).</p>",
             f'<figure class="roof">{roofline_svg(points, ceilings, label)}'
             f"{legend_html(points)}</figure>",
             f'<p class="muted small">Measured: {esc(ceilings.how)}.</p>']
    if is_training(fused):
        parts.append(phase_table(fused))
    return "".join(parts)
