"""An HTML report of what fusion did: one self-contained file (no network, no scripts, no
fonts to fetch) with, per compiled graph, the initial graph (6_validate) and the graph that runs
(hwopt_d_end) side by side as inline SVG, the kernels one call launches timed against the same
graph without fusion, the reasons ops were kept apart, the generated C and every stage's text.

    write_report([exe_or_entry_or_dump_folder, ...], "report.html")
    write_lab_report("lab_output", "lab_output/report.html")
"""
from __future__ import annotations

import datetime
import html
import importlib.util
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.errors import GraphKernelError
from graphkernel.frontend.compiled import CompiledCell as Executable
from graphkernel.ir.dot import to_dot
from graphkernel.ir.graph import Graph
from graphkernel.ir.printer import print_graph
from graphkernel.ir.types import TensorType, to_dtype
from graphkernel.runtime.executable import KernelInfo
from graphkernel.tools.render import render_svg_text

INITIAL, FINAL = "6_validate", "hwopt_d_end"
FUSION_STAGE = "hwopt_2_basic_op_fusion"  # present only when fusion was on


class ReportError(GraphKernelError):
    """A report target that cannot be read (missing dumps, a bad cell spec)."""


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


@dataclass
class Timing:
    """Median seconds of one call and of each kernel within a call (over `calls` calls)."""

    per_call: float
    per_kernel: list[float]
    calls: int


Source = Executable | ReportEntry | DumpEntry | str | os.PathLike


# -------------------------------------------------------------------------------------------
# Building entries

def compare(cell: Any, *inputs: Any, title: str | None = None) -> ReportEntry:
    """Compile `cell` with fusion on and off (explicit options, the context is not touched)."""
    from graphkernel import compile as gk_compile
    from graphkernel.graph_kernel.pipeline import CompileOptions
    fused = gk_compile(cell, *inputs, options=CompileOptions(enable_graph_kernel=True))
    plain = gk_compile(cell, *inputs, options=CompileOptions(enable_graph_kernel=False))
    return ReportEntry(title or type(cell).__name__, fused, plain)


def unfused_baseline(exe: Executable) -> Executable | None:
    """The executable compile would build with fusion off, or None when fusion was already off.

    With fusion off the backend only adds the identity stage hwopt_d_end, so building the initial
    graph one kernel per node is exactly what `compile(..., enable_graph_kernel=False)` runs; this
    gives a baseline for an executable whose cell is not at hand.
    """
    if FUSION_STAGE not in exe.stages or INITIAL not in exe.stages:
        return None
    from graphkernel.frontend.compile import compile_graph
    return compile_graph(exe.stages[INITIAL], exe.name)


def random_inputs(exe: Executable, rng: np.random.Generator) -> list[np.ndarray]:
    """Random arrays of the shapes and dtypes the executable was compiled for."""
    arrays = []
    for inp in exe.graph.inputs:
        if inp.kind != "input":
            continue
        t = inp.tensor_type
        if t.dtype == np.bool_:
            arrays.append(rng.random(t.shape) < 0.5)
        elif np.issubdtype(t.dtype, np.integer):
            arrays.append(rng.integers(-8, 9, size=t.shape).astype(t.dtype))
        else:
            arrays.append(rng.standard_normal(t.shape).astype(t.dtype))
    return arrays


def measure(exe: Executable, inputs: Sequence[np.ndarray], repeats: int = 50) -> Timing:
    """Time `exe` on `inputs`: median over `repeats` samples, after a few warm-up calls.

    A call takes microseconds, so each sample times a batch of calls (doubled until the batch
    lasts 0.2 ms) and divides: clock resolution and one-off hiccups then barely move the median.
    Per-kernel times come from Executable.profile_kernels, one step at a time.
    """
    for _ in range(3):  # first calls page in the kernel library and numpy's code paths
        exe.run_arrays(*inputs)
    batch = 1
    while True:
        start = time.perf_counter()
        for _ in range(batch):
            exe.run_arrays(*inputs)
        if time.perf_counter() - start >= 2e-4 or batch >= 1 << 14:
            break
        batch *= 2
    samples = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        for _ in range(batch):
            exe.run_arrays(*inputs)
        samples.append((time.perf_counter() - start) / batch)
    calls = min(max(1, repeats) * batch, 5000)  # bounded: profiling is step by step
    per_kernel = exe.profile_kernels(*inputs, repeats=calls)
    return Timing(statistics.median(samples), per_kernel, calls)


def load_cell_spec(spec: str) -> Any:
    """`path/to/file.py:CellClass` -> an instance (the class must take no arguments)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise ReportError(f"cell spec {spec!r} is not FILE.py:CellClass")
    if not os.path.isfile(path):
        raise ReportError(f"no such file: {path}")
    module_name = "_graphkernel_report_" + re.sub(r"\W", "_", os.path.abspath(path))
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    module_spec.loader.exec_module(module)
    cls = getattr(module, name, None)
    if cls is None:
        raise ReportError(f"{path} defines no {name}")
    return cls()


_TYPE_SPEC = re.compile(r"^\s*(\w+)\s*\[([\d,\s]*)\]\s*$")


def parse_input_spec(text: str) -> TensorType:
    """`float32[4,4]` (the form dumps print) -> a TensorType."""
    match = _TYPE_SPEC.match(text)
    if match is None:
        raise ReportError(f"input {text!r} is not DTYPE[D0,D1,...], e.g. float32[4,4]")
    try:
        dtype = to_dtype(match.group(1))
    except Exception as exc:  # to_dtype raises its own error types; say it in report terms
        raise ReportError(f"input {text!r}: unknown dtype {match.group(1)!r}") from exc
    dims = tuple(int(d) for d in match.group(2).split(",") if d.strip())
    return TensorType(dims, dtype)


def entries_from_folder(folder: str) -> list[DumpEntry]:
    """A save_graphs folder, or a folder of them (like the lab's output), as dump entries."""
    if not os.path.isdir(folder):
        raise ReportError(f"no such folder: {folder}")
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        if FINAL + ".dot" in files and INITIAL + ".dot" in files:
            rel = os.path.relpath(root, folder)
            found.append(DumpEntry(os.path.basename(os.path.abspath(root)) if rel == "." else rel,
                                   root))
    if not found:
        raise ReportError(f"{folder} holds no {INITIAL}.dot and {FINAL}.dot: compile with "
                          "context.set_context(save_graphs=True, save_graphs_path=...) first")
    return found


def _as_entries(sources: Source | Iterable[Source]) -> list[ReportEntry | DumpEntry]:
    if isinstance(sources, Executable | ReportEntry | DumpEntry | str | os.PathLike):
        sources = [sources]
    entries: list[ReportEntry | DumpEntry] = []
    for source in sources:
        if isinstance(source, Executable):
            entries.append(ReportEntry(source.name, source, unfused_baseline(source)))
        elif isinstance(source, ReportEntry | DumpEntry):
            entries.append(source)
        else:
            entries.extend(entries_from_folder(os.fspath(source)))
    return entries


# -------------------------------------------------------------------------------------------
# Writing

def write_report(sources: Source | Iterable[Source], out_html: str, *,
                 title: str = "graphkernel: what fusion did", repeats: int = 50,
                 conclusions: Sequence[Any] = (), intro: str = "", seed: int = 0) -> str:
    """Write the report of `sources` (executables, entries, save_graphs folders) to
    `out_html`; return its path. Times every executable on random inputs of its signature,
    `repeats` samples each (see `measure`). `intro` is HTML put in as is (the caller's own
    text); `conclusions` are the lab's (anything with .text, .holds, .evidence)."""
    entries = _as_entries(sources)
    rng = np.random.default_rng(seed)
    page = _Page(title)
    if intro:
        page.add(f'<p class="intro">{intro}</p>')
    if conclusions:
        page.add(_conclusions_html(conclusions))
    rendered: list[_EntryView | _DumpView] = []
    timings: dict[int, Timing] = {}
    for index, entry in enumerate(entries):
        if isinstance(entry, ReportEntry):
            rendered.append(_EntryView.build(entry, f"g{index}", rng, repeats, timings))
        else:
            rendered.append(_DumpView.build(entry, f"g{index}"))
    page.add(_overview_html(rendered))
    for view in rendered:
        page.add(view.html())
    folder = os.path.dirname(os.path.abspath(out_html))
    os.makedirs(folder, exist_ok=True)
    tmp = out_html + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(page.html())
    os.replace(tmp, out_html)
    return out_html


def write_lab_report(lab_out_dir: str, out_html: str, lab: tuple[Any, Any] | None = None, *,
                     seed: int = 0, repeats: int = 50) -> str:
    """The lab's report: the eight figures (initial and processed graph x basic/composite x
    fusion off/on), kernels timed, and the lab's three conclusions. Runs the lab into
    `lab_out_dir` unless `lab` (what run_lab returned) is given."""
    from graphkernel.tools.lab import run_lab
    results, found = lab if lab is not None else run_lab(lab_out_dir, seed=seed, echo=False)
    entries = []
    for on, off in (("test_basic_fuse", "test_basic_fuse_no"),
                    ("test_composite_fuse", "test_composite_fuse_no")):
        r_on, r_off = results[on], results[off]
        entries.append(ReportEntry(f"{r_on.net}, fusion on ({on})", r_on.executable,
                                   r_off.executable,
                                   note=f"Baseline: the lab's own fusion-off run ({off})."))
        entries.append(ReportEntry(f"{r_off.net}, fusion off ({off})", r_off.executable, None,
                                   note="Fusion off: the initial graph runs node for node."))
    intro = ("The seed lab: two nets computing ((x &times; 2) + 1) &times; 3, one from basic "
             "ops and one through a user-declared composite, each compiled with "
             "<code>enable_graph_kernel</code> on and off. Dumps: <code>"
             f"{esc(lab_out_dir)}</code>.")
    return write_report(entries, out_html, title="graphkernel lab: what fusion did",
                        repeats=repeats, conclusions=found, intro=intro, seed=seed)


# -------------------------------------------------------------------------------------------
# HTML pieces

def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


_ID_ATTR = re.compile(r'(?<=\s)id="([^"]*)"')
_URL_REF = re.compile(r"url\(#([^)]*)\)")
_HREF_REF = re.compile(r'\b((?:xlink:)?href)="#([^"]*)"')


def inline_svg(svg_text: str, prefix: str, label: str) -> str:
    """Graphviz SVG made fit for inlining: no XML prolog, comments or namespace URLs, and every
    id (and reference to one) prefixed, since each Graphviz SVG numbers graph0, node1, ...
    from scratch and ids must be unique in a page."""
    start = svg_text.find("<svg")
    if start < 0:
        raise ReportError("renderer output holds no <svg> element")
    body = re.sub(r"<!--.*?-->\n?", "", svg_text[start:], flags=re.S)
    # An HTML parser puts <svg> in the SVG namespace by itself; dropping the xmlns URLs keeps
    # the page free of any http:// reference.
    body = re.sub(r'\s+xmlns(?::\w+)?="[^"]*"', "", body)
    body = _ID_ATTR.sub(lambda m: f'id="{prefix}{m.group(1)}"', body)
    body = _URL_REF.sub(lambda m: f"url(#{prefix}{m.group(1)})", body)
    body = _HREF_REF.sub(lambda m: f'{m.group(1)}="#{prefix}{m.group(2)}"', body)
    return body.replace("<svg", f'<svg class="graph-svg" role="img" aria-label="{esc(label)}"',
                        1).strip()


def _svg_of_graph(graph: Graph, stage: str, prefix: str) -> str:
    dot = to_dot(graph, f"{graph.name} - {stage}")
    return inline_svg(render_svg_text(dot), prefix, f"{graph.name} after {stage}")


def _us(seconds: float | None) -> str:
    return "&ndash;" if seconds is None else f"{seconds * 1e6:,.1f}&nbsp;&micro;s"


def _bytes(n: int) -> str:
    return f"{n:,}&nbsp;B" if n < 10_000 else f"{n / 1024:,.1f}&nbsp;KiB"


def _figures(prefix: str, initial_svg: str, final_svg: str, final_caption: str) -> str:
    return (
        '<div class="figs">'
        f'<figure class="fig"><figcaption><b>Initial graph</b> <code>{INITIAL}</code>'
        f"</figcaption>{initial_svg}</figure>"
        f'<figure class="fig"><figcaption><b>Graph that runs</b> <code>{FINAL}</code> '
        f"&middot; {final_caption}</figcaption>{final_svg}</figure></div>")


def _stages_html(stages: Sequence[tuple[str, str, str]]) -> str:
    """(name, doc, ir text) per stage, each folded in a <details>."""
    parts = [f'<h3>Stages <span class="muted">({len(stages)})</span></h3><div class="stages">']
    for name, doc, text in stages:
        parts.append(f'<details class="stage"><summary><code>{esc(name)}</code>'
                     f'{" &mdash; " + esc(doc) if doc else ""}</summary>'
                     f"<pre>{esc(text)}</pre></details>")
    parts.append("</div>")
    return "".join(parts)


def _sources_html(kernels: Sequence[tuple[str, str, str | None, str]]) -> str:
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


def _reasons_html(reasons: Sequence[Any], fusion_on: bool) -> str:
    parts = ['<h3>Ops kept apart</h3>']
    if not fusion_on:
        parts.append('<p class="muted">Fusion was off: no pair of ops was considered.</p>')
    elif not reasons:
        parts.append('<p class="muted">None: every pair of adjacent fusible ops was fused.</p>')
    else:
        parts.append('<table class="reasons"><thead><tr><th>producer</th><th>consumer</th>'
                     "<th>rule</th><th>why</th><th>stage</th></tr></thead><tbody>")
        for r in reasons:
            parts.append(f"<tr><td><code>{esc(r.producer)}</code></td><td><code>"
                         f"{esc(r.consumer)}</code></td><td><span class=\"rule\">{esc(r.rule)}"
                         f"</span></td><td>{esc(r.detail)}</td><td><code>{esc(r.stage)}</code>"
                         "</td></tr>")
        parts.append("</tbody></table>")
    return "".join(parts)


def _kernel_table(kernels: Sequence[KernelInfo], timing: Timing | None, caption: str,
                  css: str, entry: bool = False) -> str:
    rows = []
    for i, k in enumerate(kernels):
        t = timing.per_kernel[i] if timing else None
        rows.append(f"<tr><td class=\"num\">{i}</td><td><code>{esc(k.name)}</code></td>"
                    f"<td>{esc(' + '.join(k.op_names))}</td><td><code>{esc(k.output)}</code></td>"
                    f"<td><span class=\"backend {esc(k.backend)}\">{esc(k.backend)}</span></td>"
                    f"<td class=\"num\">{_bytes(k.bytes_moved)}</td>"
                    f"<td class=\"num\">{_us(t)}</td></tr>")
    total_bytes = sum(k.bytes_moved for k in kernels)
    kernel_sum = sum(timing.per_kernel) if timing else None
    call = (f"{_us(timing.per_call)} per call" if timing else "not timed")
    if entry and timing:
        # The compiled entry runs all kernels in one C call, skipping the per-kernel Python
        # steps that profile_kernels times: the whole call can be shorter than the kernel sum.
        call += " through the graph's compiled entry"
    return (f'<table class="kernels {css}"><caption>{caption}</caption><thead><tr>'
            "<th class=\"num\">#</th><th>kernel</th><th>member ops</th><th>output</th>"
            "<th>backend</th><th class=\"num\">bytes moved</th><th class=\"num\">time per call"
            f"</th></tr></thead><tbody>{''.join(rows)}</tbody><tfoot><tr><td></td>"
            f"<td>{len(kernels)} kernel{'' if len(kernels) == 1 else 's'}</td>"
            f"<td>{sum(len(k.op_names) for k in kernels)} ops</td><td></td><td></td>"
            f"<td class=\"num\">{_bytes(total_bytes)}</td><td class=\"num\">{_us(kernel_sum)}"
            f"<div class=\"muted small\">whole call {call}</div></td></tr></tfoot></table>")


@dataclass
class _EntryView:
    entry: ReportEntry
    prefix: str
    initial_svg: str
    final_svg: str
    timing: Timing
    baseline_timing: Timing | None
    fusion_on: bool
    anchor: str = ""

    @classmethod
    def build(cls, entry: ReportEntry, prefix: str, rng: np.random.Generator,
              repeats: int, timings: dict[int, Timing]) -> _EntryView:
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
                   _svg_of_graph(exe.stages[INITIAL], INITIAL, f"{prefix}-initial-"),
                   _svg_of_graph(exe.stages[FINAL], FINAL, f"{prefix}-final-"),
                   timing, base, FUSION_STAGE in exe.stages, anchor=prefix)

    @property
    def title(self) -> str:
        return self.entry.title

    def speedup(self) -> float | None:
        if self.baseline_timing is None or self.timing.per_call <= 0:
            return None
        return self.baseline_timing.per_call / self.timing.per_call

    def overview_row(self) -> str:
        exe, base = self.entry.executable, self.entry.baseline
        speed = self.speedup()
        return (f'<tr><td><a href="#{self.anchor}">{esc(self.title)}</a></td>'
                f"<td>{'on' if self.fusion_on else 'off'}</td>"
                f"<td class=\"num\">{len(exe.kernels)}</td>"
                f"<td class=\"num\">{_us(self.timing.per_call)}</td>"
                f"<td class=\"num\">{len(base.kernels) if base else '&ndash;'}</td>"
                f"<td class=\"num\">{_us(self.baseline_timing.per_call) if self.baseline_timing else '&ndash;'}</td>"  # noqa: E501
                f"<td class=\"num\">{_speed(speed)}</td></tr>")

    def html(self) -> str:
        exe, base = self.entry.executable, self.entry.baseline
        fused = [k for k in exe.kernels if k.backend != "library"]
        caption = (f"{len(exe.kernels)} kernel{'s' if len(exe.kernels) != 1 else ''} per call"
                   + (f", {len(fused)} fused" if self.fusion_on else ""))
        parts = [f'<section class="graph" id="{self.anchor}" data-graph="{esc(exe.name)}">',
                 f"<h2>{esc(self.title)}</h2>"]
        facts = [f"graph <code>{esc(exe.name)}</code>"]
        for kind, label in (("input", "inputs"), ("weight", "weights")):
            values = [i for i in exe.graph.inputs if i.kind == kind]
            if values:
                facts.append(label + " " + ", ".join(f"<code>{esc(i.name)}: {esc(i.type)}</code>"
                                                     for i in values))
        facts += [f"fusion {'on' if self.fusion_on else 'off'}",
                 f"compiled in {exe.compile_seconds * 1000:.0f}&nbsp;ms"]
        parts.append(f'<p class="facts">{" &middot; ".join(facts)}</p>')
        if self.entry.note:
            parts.append(f'<p class="note">{esc(self.entry.note)}</p>')
        parts.append(_figures(self.prefix, self.initial_svg, self.final_svg, caption))
        parts.append("<h3>Kernels one call launches</h3>")
        speed = self.speedup()
        if base is not None and self.baseline_timing is not None:
            parts.append(
                f'<p class="verdict">{len(base.kernels)} &rarr; {len(exe.kernels)} kernel launches'
                f" per call; {_us(self.baseline_timing.per_call)} &rarr; "
                f"{_us(self.timing.per_call)} per call: <b>{_speed(speed)}</b> "
                '<span class="muted">(medians over batches of calls on random inputs, '
                "measured when this report was made; each kernel timed on its own, the whole "
                "call as <code>run_arrays</code> runs it)</span></p>")
        # The swatch (a fused kernel's cluster colour) marks the table of the fused graph.
        parts.append(_kernel_table(exe.kernels, self.timing,
                                   "With fusion" if self.fusion_on else "As compiled",
                                   "fused swatch" if self.fusion_on else "fused",
                                   getattr(exe, "entry", None) is not None))
        if base is not None:
            parts.append(_kernel_table(base.kernels, self.baseline_timing,
                                       "Without fusion (same graph, enable_graph_kernel=False)",
                                       "unfused", getattr(base, "entry", None) is not None))
        parts.append(_reasons_html(exe.reasons, self.fusion_on))
        parts.append(_sources_html([(k.name, " + ".join(k.op_names), k.source, k.note)
                                    for k in exe.kernels]))
        parts.append(_stages_html([(name, exe.stage_docs.get(name, ""),
                                    print_graph(graph, f"stage {name}"))
                                   for name, graph in exe.stages.items()]))
        parts.append("</section>")
        return "".join(parts)


def _speed(speed: float | None) -> str:
    if speed is None:
        return "&ndash;"
    word = "faster" if speed >= 1 else "slower"
    factor = speed if speed >= 1 else 1 / speed
    return f'<span class="{"good" if speed >= 1 else "bad"}">{factor:.2f}&times; {word}</span>'


_C_HEADER = re.compile(r"^/\* (gk_\w+): (.*?) \*/$", re.M)


@dataclass
class _DumpView:
    entry: DumpEntry
    prefix: str
    initial_svg: str
    final_svg: str
    kernels: list[tuple[str, str, str | None, str]]
    stages: list[tuple[str, str, str]]
    summary: str
    anchor: str = ""

    @classmethod
    def build(cls, entry: DumpEntry, prefix: str) -> _DumpView:
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
        return cls(entry, prefix, svgs[0], svgs[1], kernels, stages, summary, anchor=prefix)

    @property
    def title(self) -> str:
        return self.entry.title

    def overview_row(self) -> str:
        return (f'<tr><td><a href="#{self.anchor}">{esc(self.title)}</a></td><td>&ndash;</td>'
                f'<td class="num">{len(self.kernels) or "&ndash;"}</td><td class="num">&ndash;</td>'
                '<td class="num">&ndash;</td><td class="num">&ndash;</td>'
                '<td class="num">&ndash;</td></tr>')

    def html(self) -> str:
        parts = [f'<section class="graph" id="{self.anchor}">', f"<h2>{esc(self.title)}</h2>",
                 f'<p class="facts">from the dumps in <code>{esc(self.entry.folder)}</code></p>',
                 '<p class="note">Made from dump files: nothing to run, so no timings. Report an '
                 "executable (<code>write_report(exe, ...)</code>) or a cell "
                 "(<code>graphkernel report FILE.py:Cell --input float32[4,4]</code>) to time "
                 "its kernels.</p>",
                 _figures(self.prefix, self.initial_svg, self.final_svg,
                          f"{len(self.kernels)} generated kernel"
                          f"{'' if len(self.kernels) == 1 else 's'}")]
        if self.summary:
            parts.append(f"<h3>Summary</h3><pre>{esc(self.summary)}</pre>")
        parts.append(_sources_html(self.kernels))
        parts.append(_stages_html(self.stages))
        parts.append("</section>")
        return "".join(parts)


def _stage_order(name: str) -> tuple[int, int, str]:
    """Frontend stages by number, then backend stages, hwopt_d_end last."""
    head = name.split("_", 1)[0]
    if head.isdigit():
        return (0, int(head), name)
    return (2, 0, name) if name == FINAL else (1, 0, name)


def _split_c_file(text: str) -> list[tuple[str, str, str | None, str]]:
    """The kernels of a kernel_meta/*.c file, by the `/* gk_NAME: ops */` line opening each."""
    heads = list(_C_HEADER.finditer(text))
    out = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        out.append((head.group(1).removeprefix("gk_"), head.group(2),
                    text[head.start():end].strip() + "\n", ""))
    return out


def _overview_html(views: Sequence[_EntryView | _DumpView]) -> str:
    rows = "".join(v.overview_row() for v in views)
    return ('<section class="overview"><h2>Overview</h2><table class="overview-table"><thead><tr>'
            "<th>graph</th><th>fusion</th><th class=\"num\">kernels per call</th>"
            "<th class=\"num\">time per call</th><th class=\"num\">kernels without fusion</th>"
            "<th class=\"num\">time without fusion</th><th class=\"num\">speedup</th>"
            f"</tr></thead><tbody>{rows}</tbody></table></section>")


def _conclusions_html(found: Sequence[Any]) -> str:
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


_CSS = """
:root { --ink:#1d2330; --muted:#667085; --line:#e4e7ec; --bg:#f6f7f9; --card:#fff;
  --accent:#3559e0; --good:#0f7b3f; --bad:#b42318; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
header { background:#1d2330; color:#fff; padding:18px 32px; }
header h1 { margin:0; font-size:24px; font-weight:650; }
header p { margin:4px 0 0; color:#c8cfdc; font-size:13px; }
main { max-width:1400px; margin:0 auto; padding:20px 32px 48px; }
section { background:var(--card); border:1px solid var(--line); border-radius:10px;
  padding:16px 22px 20px; margin:0 0 20px; box-shadow:0 1px 2px rgba(16,24,40,.05); }
h2 { font-size:20px; margin:2px 0 8px; }
h3 { font-size:15px; margin:18px 0 8px; text-transform:uppercase; letter-spacing:.04em;
  color:#344054; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace;
  font-size:12.5px; }
pre { background:#f2f4f7; border:1px solid var(--line); border-radius:6px; padding:10px 12px;
  overflow:auto; margin:6px 0 0; }
.muted { color:var(--muted); font-weight:normal; text-transform:none; letter-spacing:0; }
.small { font-size:12px; }
.intro { margin:0 0 16px; }
.facts { color:var(--muted); margin:0 0 6px; font-size:13.5px; }
.note { margin:0 0 10px; font-size:13.5px; }
.figs { display:grid; grid-template-columns:1fr 1fr; gap:16px; }
.fig { margin:0; border:1px solid var(--line); border-radius:8px; padding:8px; background:#fff;
  display:flex; flex-direction:column; align-items:center; min-width:0; max-height:85vh;
  overflow:auto; }
.fig figcaption { align-self:stretch; position:sticky; top:-8px; background:#fff;
  font-size:13px; padding:2px 4px 8px; border-bottom:1px solid var(--line); margin-bottom:8px; }
.graph-svg { max-width:100%; height:auto; flex:none; }
table { border-collapse:collapse; width:100%; margin:8px 0 12px; font-size:13.5px; }
caption { text-align:left; font-weight:600; padding:4px 0; }
th, td { border-bottom:1px solid var(--line); padding:5px 10px; text-align:left;
  vertical-align:top; }
thead th { background:#f9fafb; color:#475467; font-weight:600; font-size:12.5px; }
tfoot td { font-weight:600; border-bottom:none; border-top:2px solid var(--line); }
.num { text-align:right; white-space:nowrap; font-variant-numeric:tabular-nums; }
table.swatch caption::before { content:""; display:inline-block; width:10px; height:10px;
  border-radius:2px; background:#fde2b4; border:1px solid #888; margin-right:6px; }
.backend { font-size:12px; padding:1px 7px; border-radius:10px; background:#eef2ff; }
.backend.native { background:#dcfae6; color:#085d3a; }
.backend.library { background:#f2f4f7; color:#344054; }
.backend.interpreted { background:#fef0c7; color:#93370d; }
.rule { font-size:12px; padding:1px 7px; border-radius:10px; background:#fee4e2; color:#912018; }
.verdict { font-size:14.5px; margin:4px 0; }
.good { color:var(--good); } .bad { color:var(--bad); }
.conclusions ol { list-style:none; padding:0; margin:0; }
.conclusion { padding:8px 0; border-bottom:1px solid var(--line); }
.conclusion:last-child { border-bottom:none; }
.badge { display:inline-block; min-width:96px; text-align:center; font-size:12px;
  font-weight:700; padding:2px 8px; border-radius:12px; margin-right:8px; }
.badge.holds { background:#dcfae6; color:#085d3a; }
.badge.fails { background:#fee4e2; color:#912018; }
.evidence { color:var(--muted); font-size:13px; margin:3px 0 0 112px; }
details { border:1px solid var(--line); border-radius:6px; margin:6px 0; padding:4px 10px; }
details > summary { cursor:pointer; font-size:13.5px; }
.overview-table a { color:var(--accent); text-decoration:none; }
@media (max-width: 900px) { .figs { grid-template-columns:1fr; } }
"""


class _Page:
    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []

    def add(self, part: str) -> None:
        self.parts.append(part)

    def html(self) -> str:
        from graphkernel import __version__
        from graphkernel.codegen import toolchain
        tc = toolchain.detect()
        made = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        machine = (f"{platform.machine()} &middot; Python {platform.python_version()} &middot; "
                   f"{esc(tc.version) if tc else 'no C compiler'} &middot; graphkernel "
                   f"{esc(__version__)}")
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                '<meta name="viewport" content="width=device-width, initial-scale=1">'
                f"<title>{esc(self.title)}</title><style>{_CSS}</style></head><body>"
                f"<header><h1>{esc(self.title)}</h1><p>made {made} &middot; {machine}</p>"
                f"</header><main>{''.join(self.parts)}</main></body></html>\n")
