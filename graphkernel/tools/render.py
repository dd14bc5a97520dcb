"""Pictures from DOT: graphviz-pure's self-contained `dot`, else a `dot` on PATH."""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess

from graphkernel.errors import RendererError

FORMATS = ("png", "svg")


def find_renderer() -> str | None:
    """Path of a Graphviz-compatible executable, or None."""
    try:
        files = importlib.metadata.files("graphviz-pure") or []
        for f in files:
            if os.path.basename(str(f)) == "graphviz-pure":
                path = str(f.locate())
                if os.access(path, os.X_OK):
                    return path
    except importlib.metadata.PackageNotFoundError:
        pass
    return shutil.which("graphviz-pure") or shutil.which("dot")


def render(dot_path: str, out_path: str | None = None, fmt: str | None = None) -> str:
    """Render `dot_path` to PNG or SVG (by `out_path`'s suffix, or `fmt`); return the output."""
    if not os.path.isfile(dot_path):
        raise RendererError(f"no such DOT file: {dot_path}")
    if out_path is None:
        out_path = os.path.splitext(dot_path)[0] + "." + (fmt or "png")
    fmt = fmt or os.path.splitext(out_path)[1].lstrip(".").lower()
    if fmt not in FORMATS:
        raise RendererError(f"cannot render to {fmt!r}; formats: {', '.join(FORMATS)}")
    exe = find_renderer()
    if exe is None:
        raise RendererError("no Graphviz renderer found: `pip install graphviz-pure==0.2.2` "
                            "(self-contained) or install Graphviz so `dot` is on PATH")
    args = [exe, f"-T{fmt}", dot_path, "-o", out_path]
    if fmt == "png":
        args.insert(2, "-Gdpi=96")
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RendererError(f"{os.path.basename(exe)} failed on {dot_path}: "
                            f"{result.stderr.strip()[-2000:]}")
    return out_path


def render_svg_text(dot_text: str) -> str:
    """SVG markup of DOT text (for pages that inline their pictures)."""
    exe = find_renderer()
    if exe is None:
        raise RendererError("no Graphviz renderer found: `pip install graphviz-pure==0.2.2`")
    result = subprocess.run([exe, "-Tsvg"], input=dot_text, capture_output=True, text=True,
                            timeout=120)
    if result.returncode != 0:
        raise RendererError(f"renderer failed: {result.stderr.strip()[-2000:]}")
    return result.stdout
