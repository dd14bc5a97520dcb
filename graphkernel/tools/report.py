"""An HTML report of what fusion did: one self-contained file (no network, no scripts, no
fonts to fetch) with, per compiled graph, the initial graph (6_validate) and the graph that runs
(hwopt_d_end) side by side as inline SVG, the kernels one call launches timed against the same
graph without fusion, the reasons ops were kept apart, the generated C and every stage's text.

    import graphkernel.tools.report
    graphkernel.tools.report.write_report(exe, "report.html")   # an executable, or a list of
                                                                 # them, entries, dump folders
    graphkernel.tools.report.write_lab_report("lab_output", "lab_output/report.html")

The parts: report_timing.py (what is measured and how), report_views.py (one section per
graph), report_parts.py (tables and figures), report_page.py (the frame and its CSS),
cellspec.py (FILE.py:Cell and --input from the command line).
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from graphkernel.frontend.compiled import CompiledCell as Executable
from graphkernel.tools.cellspec import load_cell_spec, parse_input_spec
from graphkernel.tools.report_page import Page, ReportError, esc, inline_svg
from graphkernel.tools.report_parts import (
    FINAL,
    INITIAL,
    conclusions_html,
    overview_html,
    savings_html,
)
from graphkernel.tools.report_roofline import Ceilings, measured_ceilings
from graphkernel.tools.report_timing import Timing, measure, random_inputs
from graphkernel.tools.report_views import (
    DumpEntry,
    DumpView,
    EntryView,
    ReportEntry,
    fusion_was_on,
)

__all__ = ["Ceilings", "DumpEntry", "ReportEntry", "ReportError", "Source", "Timing", "compare",
           "entries_from_folder", "inline_svg", "load_cell_spec", "measure",
           "parse_input_spec", "random_inputs", "unfused_baseline", "write_lab_report",
           "write_report"]

Source = Executable | ReportEntry | DumpEntry | str | os.PathLike


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
    if not fusion_was_on(exe) or INITIAL not in exe.stages:
        return None
    from graphkernel.frontend.compile import compile_graph
    return compile_graph(exe.stages[INITIAL], exe.name)


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
        elif isinstance(source, str | os.PathLike):
            entries.extend(entries_from_folder(os.fspath(source)))
        else:
            raise ReportError(f"cannot report a {type(source).__name__}: give an executable "
                              "(graphkernel.compile(cell, *inputs)), a ReportEntry or a "
                              "save_graphs folder")
    return entries


def write_report(sources: Source | Iterable[Source], out_html: str, *,
                 title: str = "graphkernel: what fusion did", repeats: int = 50,
                 conclusions: Sequence[Any] = (), intro: str = "", seed: int = 0,
                 ceilings: Ceilings | None = None, headline: str = "") -> str:
    """Write the report of `sources` (executables, entries, save_graphs folders) to
    `out_html`; return its path. Times every executable on random inputs of its signature,
    `repeats` samples each (see report_timing.measure), and draws each kernel on a roofline
    under `ceilings` (default: this machine's rates, measured as `graphkernel doctor` does).
    `intro` and `headline` are HTML put in as is (the caller's own text, the headline in a
    section of its own); `conclusions` are the lab's (anything with .text, .holds,
    .evidence)."""
    entries = _as_entries(sources)
    if ceilings is None and any(isinstance(e, ReportEntry) for e in entries):
        ceilings = measured_ceilings()
    rng = np.random.default_rng(seed)
    page = Page(title)
    if intro:
        page.add(f'<p class="intro">{intro}</p>')
    if headline:
        page.add(headline)
    if conclusions:
        page.add(conclusions_html(conclusions))
    views: list[EntryView | DumpView] = []
    timings: dict[int, Timing] = {}
    for index, entry in enumerate(entries):
        if isinstance(entry, ReportEntry):
            assert ceilings is not None
            views.append(EntryView.build(entry, f"g{index}", rng, repeats, timings, ceilings))
        else:
            views.append(DumpView.build(entry, f"g{index}"))
    page.add(overview_html([v.overview_row() for v in views]))
    for view in views:
        page.add(view.html())
    folder = os.path.dirname(os.path.abspath(out_html))
    os.makedirs(folder, exist_ok=True)
    tmp = out_html + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(page.html())
    os.replace(tmp, out_html)
    return out_html


def write_lab_report(lab_out_dir: str, out_html: str, lab: tuple[Any, Any] | None = None, *,
                     seed: int = 0, repeats: int = 50, savings: Sequence[Any] | None = None,
                     ceilings: Ceilings | None = None) -> str:
    """The lab's report: what fusion saves (lab.fusion_savings, measured here unless
    `savings` is given), the eight figures (initial and processed graph x basic/composite x
    fusion off/on), kernels timed, and the lab's three conclusions. Runs the lab into
    `lab_out_dir` unless `lab` (what run_lab returned) is given."""
    from graphkernel.tools.lab import fusion_savings, run_lab
    results, found = lab if lab is not None else run_lab(lab_out_dir, seed=seed, echo=False)
    if savings is None:
        savings = fusion_savings(results, seed)
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
                        repeats=repeats, conclusions=found, intro=intro, seed=seed,
                        ceilings=ceilings, headline=savings_html(savings))
