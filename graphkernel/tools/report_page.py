"""The report page's frame: HTML escaping, inlining Graphviz SVG, the stylesheet and the page
(header with when and where it was made)."""
from __future__ import annotations

import datetime
import html
import platform
import re

from graphkernel.errors import GraphKernelError


class ReportError(GraphKernelError):
    """A report target that cannot be read (missing dumps, a bad cell spec)."""


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
.meaning { font-size:13.5px; margin:2px 0 8px; color:#344054; }
.timenote { margin:-6px 0 12px; }
tr.between td { color:var(--muted); font-style:italic; }
tr.rulegroup td { background:#fcfcfd; font-weight:600; }
.never { margin:6px 0; }
.legend { margin:6px 0 0; }
.key { display:inline-block; width:14px; height:10px; vertical-align:middle; margin-right:3px;
  border-radius:2px; }
.key.fusedkey { background:#fde2b4; border:1px solid #888; }
.key.userkey { background:#f2f4f7; border:1.5px dashed #344054; }
.even { color:#344054; }
figure.roof { margin:6px 0 4px; overflow-x:auto; }
svg.roofline { max-width:100%; height:auto; }
svg.roofline circle.point { cursor:help; }
table.phases { width:auto; }
.headline .big { font-size:17px; margin:4px 0 8px; }
@media (max-width: 900px) { .figs { grid-template-columns:1fr; } }
"""


class Page:
    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []

    def add(self, part: str) -> None:
        self.parts.append(part)

    def html(self) -> str:
        from graphkernel import __version__
        from graphkernel.backends.c import toolchain
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
