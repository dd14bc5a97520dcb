"""One section of the report per compiled graph: from an executable (timed, with its unfused
baseline) or from a save_graphs folder (pictures, C and stages only)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from graphkernel.frontend.compiled import CompiledCell as Executable
from graphkernel.ir.dot import to_dot
from graphkernel.ir.graph import Graph
from graphkernel.ir.printer import print_graph
from graphkernel.passes import stage_names
from graphkernel.tools import report_parts as parts_
from graphkernel.tools.render import render_svg_text
from graphkernel.tools.report_page import esc, inline_svg
from graphkernel.tools.report_parts import FINAL, INITIAL, us, us_spread
from graphkernel.tools.report_roofline import Ceilings, points_of, roofline_html
from graphkernel.tools.report_timing import (
    Timing,
    compile_timeline_html,
    dispatch_bound,
    measure,
    random_inputs,
    speedup_range,
)

FUSION_STAGE = stage_names.BASIC_FUSION  # present only when fusion was on
FUSION_STAGES = (FUSION_STAGE, stage_names.COMPOSITE_FUSION)


@dataclass
class ReportEntry:
    """One compiled graph in a report; `baseline` is the same graph compiled with fusion off."""

    title: str
    executable: Executable
    baseline: Executable | None = None
    note: str = ""


@dataclass
class DumpEntry:
    """A graph known only from a save_graphs folder: pictures and text, nothing to time."""

    title: str
    folder: str


def fusion_was_on(exe: Executable) -> bool:
    return any(stage in exe.stages for stage in FUSION_STAGES)


def svg_of_graph(graph: Graph, stage: str, prefix: str) -> str:
    dot = to_dot(graph, f"{graph.name} - {stage}")
    return inline_svg(render_svg_text(dot), prefix, f"{graph.name} after {stage}")


@dataclass
class EntryView:
    entry: ReportEntry
    prefix: str
    initial_svg: str
    final_svg: str
    timing: Timing
    baseline_timing: Timing | None
    fusion_on: bool
    ceilings: Ceilings

    @classmethod
    def build(cls, entry: ReportEntry, prefix: str, rng: np.random.Generator,
              repeats: int, timings: dict[int, Timing], ceilings: Ceilings) -> EntryView:
        exe = entry.executable
        inputs = random_inputs(exe, rng)

        def timed(e: Executable) -> Timing:
            # An executable can appear twice (the lab's fusion-off run is also the baseline of
            # the fused one): measure it once so the page shows one number for it.
            if id(e) not in timings:
                timings[id(e)] = measure(e, inputs, repeats)
            return timings[id(e)]

        timing = timed(exe)
        base = timed(entry.baseline) if entry.baseline else None
        return cls(entry, prefix,
                   svg_of_graph(exe.stages[INITIAL], INITIAL, f"{prefix}-initial-"),
                   svg_of_graph(exe.stages[FINAL], FINAL, f"{prefix}-final-"),
                   timing, base, fusion_was_on(exe), ceilings)

    @property
    def title(self) -> str:
        return self.entry.title

    def speedup(self) -> tuple[float, float, float] | None:
        if self.baseline_timing is None or self.timing.per_call <= 0:
            return None
        return speedup_range(self.timing.whole, self.baseline_timing.whole)

    def overhead_bound(self) -> bool:
        """Whether a call of the graph is mostly overhead (report_timing.dispatch_bound): then
        a ratio of times says nothing about what fusion saves in work."""
        exe = self.entry.executable
        bound, _ = dispatch_bound(sum(k.bytes_moved for k in exe.kernels),
                                  self.timing.per_call, len(exe.kernels))
        return bound

    def overview_row(self) -> str:
        exe, base = self.entry.executable, self.entry.baseline
        ratio = self.speedup()
        base_time = us_spread(self.baseline_timing.whole) if self.baseline_timing else "&ndash;"
        what, shown = "", "&ndash;"
        if ratio:
            bound = self.overhead_bound()
            saved = ("a call is overhead at this size: the ratio is dispatch, not fusion's "
                     "work" if bound else "mostly the kernels' own work saved")
            what = f'<div class="muted small">{saved}</div>'
            shown = parts_.speed(*ratio, neutral=bound)
        return (f'<tr><td><a href="#{self.prefix}">{esc(self.title)}</a></td>'
                f"<td>{'on' if self.fusion_on else 'off'}</td>"
                f"<td class=\"num\">{len(exe.kernels)}</td>"
                f"<td class=\"num\">{us_spread(self.timing.whole)}</td>"
                f"<td class=\"num\">{len(base.kernels) if base else '&ndash;'}</td>"
                f"<td class=\"num\">{base_time}</td>"
                f"<td class=\"num\">{shown}{what}</td></tr>")

    def verdict(self) -> str:
        """The speedup, and what it measures at this size: dispatch or compute."""
        exe, base = self.entry.executable, self.entry.baseline
        ratio = self.speedup()
        if base is None or self.baseline_timing is None or ratio is None:
            return ""
        fused_bytes = sum(k.bytes_moved for k in exe.kernels)
        base_bytes = sum(k.bytes_moved for k in base.kernels)
        bound, data_s = dispatch_bound(fused_bytes, self.timing.per_call, len(exe.kernels))
        if bound:
            meaning = (f"At this size a call is mostly overhead, not arithmetic: its "
                       f"{parts_.size(fused_bytes)} could move in {_short(data_s)} at this "
                       f"machine's copy bandwidth, a small part of the "
                       f"{us(self.timing.per_call)} call. "
                       f"So this ratio counts overhead (launches, dispatch, the call itself; "
                       f"{len(base.kernels)} &rarr; {len(exe.kernels)} kernels), not fusion's "
                       "work, and it moves from run to run; time a larger input "
                       "(<code>graphkernel report FILE.py:Net --input float32[2048,2048]</code>) "
                       "to measure compute.")
        else:
            meaning = (f"At this size the kernels' own work dominates, not dispatch: the fused "
                       f"kernels move {parts_.size(fused_bytes)} per call where the unfused ones "
                       f"move {parts_.size(base_bytes)}, so the speedup measures the memory "
                       "traffic fusion saves by keeping intermediate values in registers.")
        return (f'<p class="verdict">{len(base.kernels)} &rarr; {len(exe.kernels)} kernel '
                f"launches per call; {us(self.baseline_timing.per_call)} &rarr; "
                f"{us(self.timing.per_call)} per call (medians of the call as you run it): "
                f"<b>{parts_.speed(*ratio, neutral=bound)}</b>"
                f' <span class="muted small">(range from the interquartile ranges)</span></p>'
                f'<p class="meaning">{meaning}</p>')

    def html(self) -> str:
        exe, base = self.entry.executable, self.entry.baseline
        fused = [k for k in exe.kernels if k.backend != "library"]
        caption = (f"{len(exe.kernels)} kernel{'s' if len(exe.kernels) != 1 else ''} per call"
                   + (f", {len(fused)} fused" if self.fusion_on else ""))
        out = [f'<section class="graph" id="{self.prefix}" data-graph="{esc(exe.name)}">',
               f"<h2>{esc(self.title)}</h2>"]
        facts = [f"graph <code>{esc(exe.name)}</code>"]
        for kind, label in (("input", "inputs"), ("weight", "weights")):
            values = [i for i in exe.graph.inputs if i.kind == kind]
            if values:
                facts.append(label + " " + ", ".join(f"<code>{esc(i.name)}: {esc(i.type)}</code>"
                                                     for i in values))
        facts += [f"fusion {'on' if self.fusion_on else 'off'}",
                  f"compiled in {exe.compile_seconds * 1000:.0f}&nbsp;ms"]
        out.append(f'<p class="facts">{" &middot; ".join(facts)}</p>')
        if self.entry.note:
            out.append(f'<p class="note">{esc(self.entry.note)}</p>')
        out.append(parts_.figures(self.initial_svg, self.final_svg, caption))
        out.append("<h3>Kernels one call launches</h3>")
        out.append(self.verdict())
        # The swatch (a fused kernel's cluster colour) marks the table of the fused graph.
        t = self.timing
        out.append(parts_.kernel_table(exe.kernels, t.breakdown, t.whole, t.through_entry,
                                       "With fusion" if self.fusion_on else "As compiled",
                                       "fused swatch" if self.fusion_on else "fused",
                                       self.ceilings))
        points = points_of(exe.kernels, t.fastest_per_kernel)
        if base is not None and self.baseline_timing is not None:
            b = self.baseline_timing
            out.append(parts_.kernel_table(
                base.kernels, b.breakdown, b.whole, b.through_entry,
                "Without fusion (same graph, enable_graph_kernel=False)", "unfused",
                self.ceilings))
            points += points_of(base.kernels, b.fastest_per_kernel, baseline=True)
        out.append(roofline_html(points, self.ceilings, f"roofline of {exe.name}"))
        out.append(parts_.reasons_html(exe.reasons, self.fusion_on))
        rewrites = getattr(getattr(exe, "report", None), "rewrites", [])
        if rewrites:  # e.g. an inference BatchNorm folded into a convolution's weights
            out.append("<h3>Rewrites</h3><ul>" + "".join(f"<li>{esc(line)}</li>"
                                                         for line in rewrites) + "</ul>")
        out.append(parts_.sources_html([(k.name, " + ".join(k.op_names), k.source, k.note)
                                        for k in exe.kernels]))
        out.append(compile_timeline_html(exe))
        out.append(parts_.stages_html([(name, exe.stage_docs.get(name, ""),
                                        print_graph(graph, f"stage {name}"))
                                       for name, graph in exe.stages.items()]))
        out.append("</section>")
        return "".join(out)


def _short(seconds: float) -> str:
    return us(seconds) if seconds >= 1e-6 else f"{seconds * 1e9:,.0f}&nbsp;ns"


_C_HEADER = re.compile(r"^/\* (gk_\w+): (.*?) \*/$", re.M)


@dataclass
class DumpView:
    entry: DumpEntry
    prefix: str
    initial_svg: str
    final_svg: str
    kernels: list[tuple[str, str, str | None, str]]
    stages: list[tuple[str, str, str]]
    summary: str

    @classmethod
    def build(cls, entry: DumpEntry, prefix: str) -> DumpView:
        folder = entry.folder

        def read(name: str) -> str:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                return fh.read()

        svgs = [inline_svg(render_svg_text(read(stage + ".dot")), f"{prefix}-{tag}-",
                           f"{entry.title} after {stage}")
                for stage, tag in ((INITIAL, "initial"), (FINAL, "final"))]
        stages = []
        for name in sorted((f[:-3] for f in os.listdir(folder) if f.endswith(".ir")),
                           key=_stage_order):
            text = read(name + ".ir")
            first = text.split("\n", 1)[0]
            doc = first.split(": ", 1)[1] if first.startswith("# stage ") and ": " in first else ""
            stages.append((name, doc, text))
        kernels: list[tuple[str, str, str | None, str]] = []
        meta = os.path.join(folder, "kernel_meta")
        if os.path.isdir(meta):
            for c_file in sorted(f for f in os.listdir(meta) if f.endswith(".c")):
                kernels.extend(_split_c_file(read(os.path.join("kernel_meta", c_file))))
        summary_path = os.path.join(folder, "graph_kernel_summary.txt")
        summary = read("graph_kernel_summary.txt") if os.path.isfile(summary_path) else ""
        return cls(entry, prefix, svgs[0], svgs[1], kernels, stages, summary)

    @property
    def title(self) -> str:
        return self.entry.title

    def overview_row(self) -> str:
        return (f'<tr><td><a href="#{self.prefix}">{esc(self.title)}</a></td><td>&ndash;</td>'
                f'<td class="num">{len(self.kernels) or "&ndash;"}</td><td class="num">&ndash;</td>'
                '<td class="num">&ndash;</td><td class="num">&ndash;</td>'
                '<td class="num">&ndash;</td></tr>')

    def html(self) -> str:
        out = [f'<section class="graph" id="{self.prefix}">', f"<h2>{esc(self.title)}</h2>",
               f'<p class="facts">from the dumps in <code>{esc(self.entry.folder)}</code></p>',
               '<p class="note">Made from dump files: nothing to run, so no timings. Report an '
               "executable (<code>graphkernel.tools.report.write_report(exe, ...)</code>) or a "
               "cell (<code>graphkernel report FILE.py:Cell --input float32[4,4]</code>) to time "
               "its kernels.</p>",
               parts_.figures(self.initial_svg, self.final_svg,
                              f"{len(self.kernels)} generated kernel"
                              f"{'' if len(self.kernels) == 1 else 's'}")]
        if self.summary:
            out.append(f"<h3>Summary</h3><pre>{esc(self.summary)}</pre>")
        out.append(parts_.sources_html(self.kernels))
        out.append(parts_.stages_html(self.stages))
        out.append("</section>")
        return "".join(out)


def _stage_order(name: str) -> tuple[int, int, str]:
    """Frontend stages by number, then backend stages, hwopt_d_end last."""
    head = name.split("_", 1)[0]
    if head.isdigit():
        return (0, int(head), name)
    return (2, 0, name) if name == FINAL else (1, 0, name)


def _split_c_file(text: str) -> list[tuple[str, str, str | None, str]]:
    """The kernels of a kernel_meta/*.c file, by the `/* gk_NAME: ops */` line opening each."""
    heads = list(_C_HEADER.finditer(text))
    out: list[tuple[str, str, str | None, str]] = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        out.append((head.group(1).removeprefix("gk_"), head.group(2),
                    text[head.start():end].strip() + "\n", ""))
    return out

