"""A grouped convolution's filter gradient (Conv2DBackpropFilter with group > 1: depthwise
ones in MobileNet) as generated C. An ungrouped one is expanded into a forward convolution or
a product (graph_kernel/grad_expanders.py); a grouped one had no such form and ran its numpy
reference (im2col and one small product per group) on the Python runner.

dw[o, i, a, b] = sum over images n and output pixels (p, q) of dout[n, o, p, q] times
x[n, k*C/g + i, p*sh + a*dh - pt, q*sw + b*dw - pl] (k = o's group), the input read as zero
outside the image. Each output channel is one unit of work (units on OpenMP threads above the
window kernels' threshold); per tap, the rows and columns whose input lies inside the image are
constants of the source, so the inner loop over a row's pixels has no tests and vectorises
(a reduction: sums in another order than the reference's BLAS, rounding only). float16 sums in
float and rounds once, as the reference."""
from __future__ import annotations

from typing import Any

from graphkernel.backends.c.c_text import C_COMPUTE, C_STORAGE, c_comment
from graphkernel.ir.graph import Node
from graphkernel.ir.opdefs.nn import conv_geometry
from graphkernel.ir.types import TensorType


def _inside(size: int, out: int, stride: int, offset: int) -> tuple[int, int]:
    """The outputs [lo, hi) whose input index out*stride + offset lies in [0, size)."""
    lo = -(offset // stride) if offset < 0 else 0  # ceil(-offset / stride)
    hi = min(out, (size - 1 - offset) // stride + 1) if size - 1 - offset >= 0 else 0
    return lo, max(lo, hi)


def filter_grad_kernel(node: Node, name: str, attrs: dict[str, Any], threshold: int
                       ) -> list[str]:
    """The C lines of a grouped Conv2DBackpropFilter as kernel `name`: argv dout, x, dw. Output
    channels on threads when the multiply-adds reach `threshold`."""
    x = node.inputs[1].tensor_type
    shape = tuple(int(d) for d in node.shape)
    geo = conv_geometry(TensorType(x.shape, x.dtype), TensorType(shape, x.dtype), attrs)
    st, ct = C_STORAGE[x.dtype], C_COMPUTE[x.dtype]
    n, c, h, wd = (int(d) for d in x.shape)
    o, cg, kh, kw = shape
    og = o // geo["group"]
    (pt, _), (pl, _) = geo["pads"]
    (sh, sw), (dh, dw) = geo["stride"], geo["dilation"]
    oh, ow = geo["out"]
    ops = f"Conv2DBackpropFilter {list(x.shape)} -> {list(shape)}, group {geo['group']}, " \
          f"stride {(sh, sw)}, dilation {(dh, dw)}, pads {geo['pads']}"
    taps = []
    for a in range(kh):
        plo, phi = _inside(h, oh, sh, a * dh - pt)
        for b in range(kw):
            qlo, qhi = _inside(wd, ow, sw, b * dw - pl)
            if plo >= phi or qlo >= qhi:
                taps.append(f"      wo[{a * kw + b}] = 0;  /* the tap reads only padding */")
                continue
            taps += [
                "      {",
                f"        {ct} acc = 0;",
                f"        for (int64_t nn = 0; nn < {n}; ++nn) {{",
                f"          const {st} *restrict dp = dout + (nn * {o} + oc) * {oh * ow}LL;",
                f"          const {st} *restrict xp = x + (nn * {c} + xc) * {h * wd}LL;",
                f"          for (int64_t p = {plo}; p < {phi}; ++p) {{",
                f"            const {st} *restrict drow = dp + p * {ow};",
                f"            const {st} *restrict xrow = xp + (p * {sh} + {a * dh - pt}) * "
                f"{wd}LL + {b * dw - pl};",
                "            #pragma omp simd reduction(+:acc)",
                f"            for (int64_t q = {qlo}; q < {qhi}; ++q)",
                f"              acc += ({ct})drow[q] * ({ct})xrow[q * {sw}];",
                "          }",
                "        }",
                f"        wo[{a * kw + b}] = ({st})acc;",
                "      }",
            ]
    unit = f"{name}_channel"
    macs = n * oh * ow * cg * kh * kw
    return [
        f"/* {c_comment(name)}: {c_comment(ops)} */",
        f"static void {unit}(const {st} *restrict dout, const {st} *restrict x, "
        f"{st} *restrict dw, int64_t oc) {{",
        f"  for (int64_t i = 0; i < {cg}; ++i) {{",
        f"    const int64_t xc = (oc / {og}) * {cg} + i;",
        f"    {st} *restrict wo = dw + (oc * {cg} + i) * {kh * kw}LL;",
        *taps,
        "  }",
        "}",
        "",
        f"void {name}(void *const *args) {{",
        f"  const {st} *restrict dout = (const {st} *)args[0];",
        f"  const {st} *restrict x = (const {st} *)args[1];",
        f"  {st} *restrict dw = ({st} *)args[2];",
        f"  if ({o} > 1 && (int64_t){o} * {macs}LL >= (int64_t){threshold}) {{",
        "    #pragma omp parallel for schedule(static)",
        f"    for (int64_t oc = 0; oc < {o}; ++oc) {unit}(dout, x, dw, oc);",
        "  } else {",
        f"    for (int64_t oc = 0; oc < {o}; ++oc) {unit}(dout, x, dw, oc);",
        "  }",
        "}",
    ]
