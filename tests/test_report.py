"""The HTML report (graphkernel/tools/report.py) and the DOT writer's quoting."""
from __future__ import annotations

import html
import re
import subprocess
import sys
from html.parser import HTMLParser

import numpy as np
import pytest

import graphkernel
from graphkernel import Parameter, Tensor
from graphkernel.frontend.cell import Cell
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ir.dot import quote, to_dot
from graphkernel.ir.printer import print_graph
from graphkernel.ops import operations as P
from graphkernel.tools.lab import NetBasicFuse, run_lab
from graphkernel.tools.render import render_svg_text
from graphkernel.tools.report import (
    ReportError,
    compare,
    inline_svg,
    measure,
    parse_input_spec,
    unfused_baseline,
    write_lab_report,
    write_report,
)


class MatMulNet(Cell):
    """MatMul is opaque, so fusion keeps it apart from the elementwise tail (a reason)."""

    def __init__(self) -> None:
        super().__init__()
        self.matmul = P.MatMul()
        self.add = P.Add()
        self.relu = P.ReLU()
        self.mul = P.Mul()

    def construct(self, x, w):
        return self.mul(self.relu(self.add(self.matmul(x, w), 1.0)), 2.0)


class Page(HTMLParser):
    """What the tests read from a report: sections with their SVG count, ids, table rows."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[dict] = []
        self.ids: list[str] = []
        self.svg_ids: list[tuple[int, str]] = []  # (section index, id)
        self.tags: list[str] = []
        self.svg_depth = 0
        self.rows: list[tuple[int, str, list[str]]] = []  # (section, table class, cell texts)
        self.table_class = ""
        self.cell: list[str] | None = None
        self.row: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.append(a["id"])
            if self.svg_depth:
                self.svg_ids.append((len(self.sections) - 1, a["id"]))
        if tag == "section" and "graph" in (a.get("class") or "").split():
            self.sections.append({"id": a.get("id"), "svgs": 0, "text": []})
        if tag == "svg":
            self.svg_depth += 1
            # A section's graph pictures; its roofline is an SVG of another class.
            if self.sections and "graph-svg" in (a.get("class") or "").split():
                self.sections[-1]["svgs"] += 1
        if tag == "table":
            self.table_class = a.get("class") or ""
        if tag == "tr":
            self.row = []
        if tag in ("td", "th") and self.row is not None:
            self.cell = []

    def handle_endtag(self, tag):
        if tag == "svg":
            self.svg_depth -= 1
        if tag in ("td", "th") and self.cell is not None and self.row is not None:
            self.row.append("".join(self.cell).strip())
            self.cell = None
        if tag == "tr" and self.row is not None:
            self.rows.append((len(self.sections) - 1, self.table_class, self.row))
            self.row = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)
        if self.sections:
            self.sections[-1]["text"].append(data)

    def section_text(self, i: int) -> str:
        return "".join(self.sections[i]["text"])

    def body_rows(self, section: int, table: str) -> list[list[str]]:
        return [r for s, cls, r in self.rows
                if s == section and table in cls.split() and r and r[0].isdigit()]


@pytest.fixture(scope="module")
def lab_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab")
    lab = run_lab(str(out), echo=False, render_pictures=False)
    path = write_lab_report(str(out), str(out / "report.html"), lab=lab, repeats=5)
    with open(path, encoding="utf-8") as fh:
        return fh.read(), lab


def test_lab_report_has_both_graphs_per_section(lab_report):
    text, (results, found) = lab_report
    page = Page(text)
    assert len(page.sections) == 4  # basic/composite x fusion on/off: eight figures
    assert [s["svgs"] for s in page.sections] == [2, 2, 2, 2]
    assert text.count('<svg class="graph-svg"') == 8
    assert "Initial graph" in text and "Graph that runs" in text


def test_lab_report_svg_ids_prefixed_and_unique(lab_report):
    text, _ = lab_report
    page = Page(text)
    assert len(page.ids) == len(set(page.ids))
    assert page.svg_ids
    for section, id_ in page.svg_ids:
        assert re.fullmatch(rf"g{section}-(initial|final)-\w+", id_), id_
    # Graphviz's own ids survive under the prefix (both SVGs of a section have a graph0).
    assert "g0-initial-graph0" in page.ids and "g0-final-graph0" in page.ids


def test_lab_report_is_self_contained(lab_report):
    text, _ = lab_report
    assert "http://" not in text and "https://" not in text
    assert "<script" not in text and "<link" not in text and "@import" not in text
    assert "<?xml" not in text and "<!DOCTYPE svg" not in text


def test_lab_report_kernel_tables(lab_report):
    text, (results, _) = lab_report
    page = Page(text)
    fused = page.body_rows(0, "fused")
    assert [r[1] for r in fused] == ["Fused_Mul_Add_Mul"]
    assert fused[0][2] == "Mul + Add + Mul" and fused[0][3] == "float32[4,4]"
    assert fused[0][5] == "128\xa0B"  # 4x4 float32 read once and written once
    assert fused[0][6] == "48"  # flops: three ops on 16 elements
    assert re.fullmatch(r"[\d,.]+\xa0µs", fused[0][-1]), fused[0][-1]  # measured, not a dash
    unfused = page.body_rows(0, "unfused")
    assert [r[2] for r in unfused] == ["Mul", "Add", "Mul"]
    assert [r[1] for r in unfused] == [k.name for k in
                                       results["test_basic_fuse_no"].executable.kernels]
    # The composite net without fusion runs the user's composite and one Mul.
    assert [r[1] for r in page.body_rows(3, "fused")] == ["Composite", "Mul"]
    assert "3 → 1 kernel launches per call" in page.section_text(0)
    assert re.search(r"\d\.\d\d× (faster|slower)|within noise", page.section_text(0))
    # At 4x4 the page says the speedup is dispatch saved, not faster arithmetic.
    assert "At this size a call is mostly overhead, not arithmetic" in page.section_text(0)
    assert "a call is overhead at this size" in text
    # ... and, overhead being no result, names no winner in a result's colour.
    overview = text[text.index('<section class="overview">'):text.index("</section>",
                                                                     text.index("overview"))]
    assert 'class="good"' not in overview and 'class="bad"' not in overview


def test_lab_report_conclusions_marked(lab_report):
    text, (_, found) = lab_report
    assert len(found) == 3
    for c in found:
        assert c.text.replace("'", "&#x27;") in text
    assert text.count('<span class="badge holds">holds</span>') == sum(c.holds for c in found)
    assert "(3 of 3 hold)" in text


def test_lab_report_sources_and_stages(lab_report):
    text, (results, _) = lab_report
    page = Page(text)
    exe = results["test_basic_fuse"].executable
    assert "void gk_Fused_Mul_Add_Mul(void *const *args)" in page.section_text(0)
    for name, graph in exe.stages.items():
        assert f"<code>{name}</code>" in text
        # The stage's whole text is in the page (HTML-escaped there, read back here).
        assert print_graph(graph, f"stage {name}") in page.section_text(0)
    assert page.section_text(0).count("# stage ") == len(exe.stages)
    assert "Fusion was off" in page.section_text(1)


def test_reasons_and_bare_executable_baseline(tmp_path, rng):
    x = Tensor(rng.standard_normal((8, 16)).astype(np.float32))
    w = Tensor(rng.standard_normal((16, 4)).astype(np.float32))
    exe = graphkernel.compile(MatMulNet(), x, w, options=CompileOptions(enable_graph_kernel=True))
    assert exe.reasons, "MatMul next to fusible ops should leave a reason"
    # A bare executable gets the fusion-off build of its initial graph as the baseline...
    base = unfused_baseline(exe)
    off = graphkernel.compile(MatMulNet(), x, w, options=CompileOptions(enable_graph_kernel=False))
    assert base is not None
    assert [k.op_names for k in base.kernels] == [k.op_names for k in off.kernels]
    np.testing.assert_allclose(base.run_arrays(x, w)[0], off.run_arrays(x, w)[0], rtol=1e-6)
    assert unfused_baseline(off) is None  # fusion already off: nothing to compare against
    path = write_report(exe, str(tmp_path / "r.html"), repeats=3)
    page = Page(open(path, encoding="utf-8").read())
    assert [s["svgs"] for s in page.sections] == [2]
    # MatMul never fuses: its pair is not a candidate, counted in one line, not a table row.
    assert [r.rule for r in exe.reasons] == ["pattern"]
    assert not [r for s, cls, r in page.rows if "reasons" in cls.split()]
    assert "1 more pair was never a candidate, next to an op that does not fuse: MatMul is " \
        "opaque." in page.section_text(0)
    assert len(page.body_rows(0, "unfused")) == len(off.kernels) == 4
    assert [r[1] for r in page.body_rows(0, "fused")] == [k.name for k in exe.kernels]


def test_reasons_grouped_by_rule_and_limited_to_candidates(tmp_path, rng):
    from graphkernel.graph_kernel.flags import parse_flags
    x = Tensor(rng.standard_normal((8, 16)).astype(np.float32))
    w = Tensor(rng.standard_normal((16, 4)).astype(np.float32))
    options = CompileOptions(enable_graph_kernel=True, flags=parse_flags(
        "--disable_cluster_ops=Add"))
    exe = graphkernel.compile(MatMulNet(), x, w, options=options)
    assert sorted(r.rule for r in exe.reasons) == ["flag", "pattern"]
    page = Page(open(write_report(exe, str(tmp_path / "r.html"), repeats=3),
                     encoding="utf-8").read())
    rows = [r for s, cls, r in page.rows if "reasons" in cls.split() and r[0] != "producer"]
    # One group heading for the rule, then its two pairs; the MatMul pair is not listed.
    assert rows[0][0].startswith("flag a graph_kernel_flags setting keeps them apart (1)")
    assert [(r[0], r[1], r[2]) for r in rows[1:]] == [
        (x.producer, x.consumer, x.rule) for x in exe.reasons if x.rule == "flag"]
    assert "1 more pair was never a candidate" in page.section_text(0)


def test_compare_and_measure(rng):
    x = rng.standard_normal((4, 4)).astype(np.float32)
    entry = compare(NetBasicFuse(), Tensor(x))
    assert len(entry.executable.kernels) == 1 and len(entry.baseline.kernels) == 3
    timing = measure(entry.baseline, [x], repeats=3)
    assert timing.per_call > 0 and len(timing.per_kernel) == 3
    assert all(t > 0 for t in timing.per_kernel)
    # The kernel table's rows are measured inside the call its footer shows: they add up to
    # it, so no kernel is shown slower than the call it belongs to.
    split = timing.breakdown
    assert all(t <= split.call for t in split.per_kernel)
    assert split.between >= 0
    assert sum(split.per_kernel) + split.between == pytest.approx(split.call, rel=1e-9)


def test_report_command_over_a_save_graphs_folder(tmp_path):
    from graphkernel.frontend import context
    dumps = tmp_path / "dumps"
    context.set_context(save_graphs=True, save_graphs_path=str(dumps), enable_graph_kernel=True)
    NetBasicFuse()(Tensor(np.ones((4, 4), np.float32)))
    context.reset_context()
    out = tmp_path / "folder.html"
    proc = subprocess.run([sys.executable, "-m", "graphkernel.tools.cli", "report", "--out",
                           str(out), str(dumps)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text(encoding="utf-8")
    page = Page(text)
    assert [s["svgs"] for s in page.sections] == [2]
    assert ">Fused_Mul_Add_Mul</text>" in text  # the cluster label in the processed SVG
    assert "void gk_Fused_Mul_Add_Mul" in text
    assert page.section_text(0).count("# stage ") == len(list(dumps.glob("*.ir")))
    assert "http://" not in text and "https://" not in text
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "graphkernel.tools.cli", "report", str(empty)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "save_graphs=True" in proc.stderr


def test_report_command_over_a_cell_spec(tmp_path):
    net = tmp_path / "mynet.py"
    net.write_text("from graphkernel.nn import Cell\n"
                   "from graphkernel.ops import operations as P\n\n\n"
                   "class Net(Cell):\n"
                   "    def __init__(self):\n"
                   "        super().__init__()\n"
                   "        self.mul = P.Mul()\n"
                   "        self.exp = P.Exp()\n\n"
                   "    def construct(self, x):\n"
                   "        return self.exp(self.mul(x, 0.5))\n")
    out = tmp_path / "cell.html"
    proc = subprocess.run([sys.executable, "-m", "graphkernel.tools.cli", "report", "--out",
                           str(out), "--repeats", "3", f"{net}:Net", "--input", "float64[3,5]"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    page = Page(out.read_text(encoding="utf-8"))
    assert [r[1] for r in page.body_rows(0, "fused")] == ["Fused_Mul_Exp"]
    assert [r[3] for r in page.body_rows(0, "unfused")] == ["float64[3,5]"] * 2
    proc = subprocess.run([sys.executable, "-m", "graphkernel.tools.cli", "report",
                           f"{net}:Missing"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "defines no Missing" in proc.stderr


def test_parse_input_spec():
    t = parse_input_spec("float32[4, 4]")
    assert t.shape == (4, 4) and t.dtype == np.float32
    assert parse_input_spec("int32[]").shape == ()
    with pytest.raises(ReportError, match="DTYPE"):
        parse_input_spec("4x4")


def test_lab_cli_report(tmp_path):
    report = tmp_path / "out" / "report.html"
    proc = subprocess.run([sys.executable, "-m", "graphkernel.tools.cli", "lab", "--out",
                           str(tmp_path / "out"), "--report", str(report)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"report: {report}" in proc.stdout
    assert report.read_text(encoding="utf-8").count('<svg class="graph-svg"') == 8


# -------------------------------------------------------------------------------------------
# DOT quoting: names from user code must not break the file.

NASTY = 'a"b\\c{d}e\nf;g->h'


def test_quote_escapes_quotes_backslashes_and_newlines():
    assert quote('say "hi"') == r'"say \"hi\""'
    assert quote("a\\b") == r'"a\\b"'
    assert quote("two\nlines") == r'"two\nlines"'
    assert quote("{braces}; -> [x]") == '"{braces}; -> [x]"'  # inert inside a quoted string
    assert quote("a\\Nb") == r'"a\\Nb"'  # not Graphviz's \N (node name) escape


def nasty_net():
    """A cell whose class name, weight name and input path carry quotes, backslashes, braces
    and a newline."""
    def __init__(self):
        Cell.__init__(self)
        self.mul = P.Mul()
        self.add = P.Add()
        self.w = Parameter(Tensor(np.full((2, 3), 0.5, np.float32)), name=NASTY)

    def construct(self, x):
        return self.add(self.mul(x, self.w), 1.0)

    return type(NASTY, (Cell,), {"__init__": __init__, "construct": construct})()


@pytest.mark.parametrize("fusion", [False, True])
def test_dot_with_nasty_names_renders(fusion):
    x = Tensor(np.ones((2, 3), np.float32))
    exe = graphkernel.compile(nasty_net(), x,
                              options=CompileOptions(enable_graph_kernel=fusion))
    for stage in ("6_validate", "hwopt_d_end"):
        dot = to_dot(exe.stages[stage], f"{NASTY} - {stage}")
        assert 'digraph "a\\"b\\\\c{d}e\\nf;g->h" {' in dot
        assert NASTY not in dot  # the raw newline and quote never reach the file
        svg = render_svg_text(dot)
        # Graphviz reads the weight's label back as the original text: the quote and the
        # backslash literal, the newline a line break.
        texts = [html.unescape(t) for t in re.findall(r">([^<]*)</text>", svg)]
        assert 'a"b\\c{d}e' in texts and "f;g->h" in texts, texts
        inlined = inline_svg(svg, "p-", NASTY)
        assert "http://" not in inlined and 'id="p-graph0"' in inlined


def test_report_with_nasty_names(tmp_path):
    x = Tensor(np.ones((2, 3), np.float32))
    exe = graphkernel.compile(nasty_net(), x, options=CompileOptions(enable_graph_kernel=True))
    text = open(write_report(exe, str(tmp_path / "n.html"), repeats=2), encoding="utf-8").read()
    page = Page(text)
    assert [s["svgs"] for s in page.sections] == [2]
    assert NASTY not in text  # escaped everywhere: no raw quote-newline sequence
    assert 'data-graph="a&quot;b\\c{d}e\nf;g-&gt;h"' in text
    assert f"weights {NASTY}: float32[2,3]" in page.section_text(0)
    assert page.sections[0]["text"] and NASTY in page.section_text(0)  # read back verbatim


def test_inline_svg_prefixes_references():
    svg = ('<?xml version="1.0"?>\n<!-- c -->\n<svg xmlns="http://www.w3.org/2000/svg" '
           'xmlns:xlink="http://www.w3.org/1999/xlink"><defs><linearGradient id="l_1"/></defs>'
           '<g id="graph0"><a xlink:href="#node1"><path fill="url(#l_1)"/></a>'
           '<g id="node1"/></g></svg>')
    out = inline_svg(svg, "x-", "t")
    assert out.startswith('<svg class="graph-svg" role="img" aria-label="t"')
    assert 'id="x-l_1"' in out and 'url(#x-l_1)' in out and 'xlink:href="#x-node1"' in out
    assert 'id="x-graph0"' in out and "http" not in out and "<!--" not in out
    with pytest.raises(ReportError):
        inline_svg("no svg here", "x-", "t")
