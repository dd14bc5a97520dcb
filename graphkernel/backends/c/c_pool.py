"""MaxPool and AvgPool over NCHW images as generated C, as their own kernel or as a
convolution block's epilogue (c_conv_block.py). Each channel's plane is one function: rows of
at least POOL_ROW_MIN_OUTPUTS outputs vectorise along the row (no bounds tests inside the image),
narrower ones walk each output's window with bounds tests. Padding: MaxPool's is -inf, AvgPool
divides by the elements it covers (by the window's size with count_include_pad); NaN propagates
as in numpy."""
from __future__ import annotations

from typing import Any

from graphkernel.backends.c.c_images import batch_after, image_loop
from graphkernel.backends.c.c_text import C_COMPUTE, C_STORAGE, c_comment
from graphkernel.ir.graph import Node
from graphkernel.ir.opdefs.nn import pool_geometry
from graphkernel.ir.types import TensorType


def pool_kernel(node: Node, name: str, attrs: dict[str, Any], threshold: int) -> list[str]:
    """The C lines of a pool's own kernel `name`: argv x, out, then the batch size when it is
    dynamic; images on threads above `threshold` reads."""
    statics, image, in_size, out_size, reads = pool_parts(node, name, attrs)
    batch, sizes = batch_after(node, len(node.inputs) + 1)
    st = C_STORAGE[node.dtype]
    lines = statics + ["", f"void {name}(void *const *args) {{",
                       f"  const {st} *restrict x = (const {st} *)args[0];",
                       f"  {st} *restrict out = ({st} *)args[1];", *sizes]
    call = image.format(xn=f"x + n * {in_size}LL", on=f"out + n * {out_size}LL")
    lines += image_loop(call, batch, reads, threshold, [], [])
    lines.append("}")
    return lines


def pool_parts(node: Node, name: str, attrs: dict[str, Any]
               ) -> tuple[list[str], str, int, int, int]:
    """A pool's per-image function, its call ({xn}, {on} to fill), the elements of an input
    and an output image, and the reads per image."""
    x = node.inputs[0].tensor_type
    geo = pool_geometry(TensorType(x.shape, x.dtype), attrs, node.op)
    st, ct = C_STORAGE[x.dtype], C_COMPUTE[x.dtype]
    _, c, h, wd = x.shape
    (kh, kw), (sh, sw) = geo["kernel"], geo["stride"]
    (pt, _), (pl, _) = geo["pads"]
    oh, ow = geo["out"]
    is_max = node.op == "MaxPool"
    # count_include_pad: every window lies inside the padded image, so divides by its size
    full = None if is_max or not attrs.get("count_include_pad") else kh * kw
    inf = "((double)INFINITY)" if ct == "double" else "INFINITY"
    # NaN wins as in numpy's max: once a maximum is NaN no comparison replaces it.
    ops = f"{node.op} {list(x.shape)} -> {list(node.shape)}, window {(kh, kw)}, stride " \
          f"{(sh, sw)}, pads {geo['pads']}"
    image, plane = f"{name}_image", f"{name}_plane"
    if ow < POOL_ROW_MIN_OUTPUTS:
        body = _pool_plane_by_output(plane, st, ct, is_max, inf, geo, h, wd, full)
    else:
        body = _pool_plane_by_row(plane, st, ct, is_max, inf, geo, h, wd, full)
    lines = [
        f"/* {c_comment(name)}: {c_comment(ops)} */",
        *body,
        f"static void {image}(const {st} *restrict xn, {st} *restrict on, int par) {{",
        "  if (par) {",
        "    #pragma omp parallel for schedule(static)",
        f"    for (int64_t ci = 0; ci < {c}; ++ci) "
        f"{plane}(xn + ci * {h * wd}LL, on + ci * {oh * ow}LL);",
        "  } else {",
        f"    for (int64_t ci = 0; ci < {c}; ++ci) "
        f"{plane}(xn + ci * {h * wd}LL, on + ci * {oh * ow}LL);",
        "  }",
        "}",
    ]
    return lines, f"{image}({{xn}}, {{on}}, gk_par);", c * h * wd, c * oh * ow, \
        c * oh * ow * kh * kw


# Outputs in a pool's row below which it walks each output's window instead of vectorising
# along the row: a row of a few outputs fills a fraction of a vector, and the row form's
# accumulator arrays and strided loads then cost more than the tests they save (the digits
# CNN's 2x2 pools over 8x8 and 4x4 images ran 1.6x slower in the row form, bench/ab.py).
POOL_ROW_MIN_OUTPUTS = 16


def _pool_plane_by_output(plane: str, st: str, ct: str, is_max: bool, inf: str,
                          geo: dict[str, Any], h: int, wd: int, full: int | None) -> list[str]:
    """One channel's plane, output by output: each walks its window, skipping what falls in
    the padding. `full`: an average's divisor when it counts the padding."""
    (kh, kw), (sh, sw) = geo["kernel"], geo["stride"]
    (pt, _), (pl, _) = geo["pads"]
    oh, ow = geo["out"]
    start = f"{ct} m = -{inf};" if is_max else f"{ct} m = 0; int64_t count = 0;"
    take = "if (v > m || v != v) m = v;" if is_max else "m += v; ++count;"
    result = "m" if is_max else f"m / ({ct})count" if full is None else f"m / ({ct}){full}"
    return [
        f"static void {plane}(const {st} *restrict xc, {st} *restrict o) {{",
        f"  for (int64_t i = 0; i < {oh}; ++i)",
        f"    for (int64_t j = 0; j < {ow}; ++j) {{",
        f"      {start}",
        f"      for (int64_t a = 0; a < {kh}; ++a) {{",
        f"        const int64_t r = i * {sh} + a - {pt};",
        f"        if (r < 0 || r >= {h}) continue;",
        f"        for (int64_t b = 0; b < {kw}; ++b) {{",
        f"          const int64_t q = j * {sw} + b - {pl};",
        f"          if (q < 0 || q >= {wd}) continue;",
        f"          const {ct} v = ({ct})xc[r * {wd} + q];",
        f"          {take}",
        "        }",
        "      }",
        f"      o[i * {ow} + j] = ({st})({result});",
        "    }",
        "}",
    ]


def _pool_plane_by_row(plane: str, st: str, ct: str, is_max: bool, inf: str,
                       geo: dict[str, Any], h: int, wd: int, full: int | None) -> list[str]:
    """One channel's plane, row by row (ResNet's stem pool: 5.0 to 0.57 ms)."""
    (kh, kw), (sh, sw) = geo["kernel"], geo["stride"]
    (pt, _), (pl, _) = geo["pads"]
    oh, ow = geo["out"]
    # Row by row: the window's rows inside the image, and per window column the range of
    # outputs whose column is inside (constants), so the loop over a row's outputs has no
    # tests and vectorises. Each output still takes its window's elements in row-major order.
    # An average divides by the elements its window covers: the rows inside (counted per
    # output row) times the columns inside (a constant per output column), so the passes over
    # the window add values only (a count array beside the sums doubled their loads and
    # stores). The divisor is the same whole number the count reached: the same quotient.
    init = f"acc[j] = -{inf};" if is_max else "acc[j] = 0;"
    take = "acc[j] = (v > acc[j] || v != v) ? v : acc[j];" if is_max else "acc[j] += v;"
    result = "acc[j]" if is_max else f"acc[j] / (({ct})rows * cols[j])" if full is None \
        else f"acc[j] / ({ct}){full}"
    columns = []
    inside = [0] * ow
    for bb in range(kw):
        lo = max(0, -(-(pl - bb) // sw))
        hi = min(ow, (wd - 1 - bb + pl) // sw + 1)
        if lo < hi:
            columns += ["      #pragma omp simd",
                        f"      for (int64_t j = {lo}; j < {hi}; ++j) {{",
                        f"        const {ct} v = ({ct})row[j * {sw} + {bb - pl}];",
                        f"        {take}",
                        "      }"]
            for j in range(lo, hi):
                inside[j] += 1
    counted = not is_max and full is None
    counts = [] if not counted else [
        f"  static const {ct} cols[{ow}] = {{{', '.join(str(n) for n in inside)}}};"]
    return [
        f"static void {plane}(const {st} *restrict xc, {st} *restrict o) {{",
        f"  {ct} acc[{ow}];",
        *counts,
        f"  for (int64_t i = 0; i < {oh}; ++i) {{",
        f"    for (int64_t j = 0; j < {ow}; ++j) {{ {init} }}",
        *(["    int64_t rows = 0;"] if counted else []),
        f"    for (int64_t a = 0; a < {kh}; ++a) {{",
        f"      const int64_t r = i * {sh} + a - {pt};",
        f"      if (r < 0 || r >= {h}) continue;",
        *(["      ++rows;"] if counted else []),
        f"      const {st} *restrict row = xc + r * {wd}LL;",
        *columns,
        "    }",
        f"    for (int64_t j = 0; j < {ow}; ++j) o[i * {ow} + j] = ({st})({result});",
        "  }",
        "}",
    ]
