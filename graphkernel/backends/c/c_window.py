"""Window ops as generated C: Conv2D (and the compiler's Conv2DFoldedBN), MaxPool and AvgPool,
NCHW, with their geometry (kernel, stride, dilation, padding, groups) and sizes in the source.

A convolution is a direct one, no im2col matrix: per image, the input is copied once into a
zero-bordered scratch plane (so no tap tests bounds), and each block of GK_PB output pixels
keeps GK_PB vector accumulators of output channels (one lane per channel, gcc's vector
extension: 16 float lanes with AVX-512) while it walks the taps (channel, kh, kw): one weight
vector load and GK_PB broadcast multiply-adds per tap, in registers (an output at most 8 wide
goes in blocks of whole rows, its pixel offsets constants of the source: `_row_blocks`). The
weights are repacked per call into [group][tap][channel] vectors (with Conv2DFoldedBN's scale
gamma / sqrt(var + eps) applied: parameters may change between calls). Images share out over
OpenMP threads when the call is large enough. float16 computes in float32 and rounds once, as
the numpy reference does. Sums run in tap order, not BLAS's: results differ from the reference
by rounding only.

A pool walks each output element's window with bounds tests ('same' padding: MaxPool's
padding is -inf, AvgPool divides by the elements it covers). NaN propagates as in numpy.

Only the batch axis may be dynamic (its size is an argument, backends/c/shape_args.py); anything
else stays the op's numpy reference (`why_not_window_kernel` says why)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.backends.c.c_loops import Buffer, KernelSource
from graphkernel.backends.c.c_text import C_COMPUTE, C_STORAGE, c_comment, literal
from graphkernel.backends.c.shape_args import kernel_symbols, read_sizes
from graphkernel.ir import types as T
from graphkernel.ir.graph import Node
from graphkernel.ir.opdefs.nn import conv_geometry, pool_geometry
from graphkernel.ir.opset import Window, get_op
from graphkernel.ir.types import SymSize, TensorType

# Shared by every window kernel of a translation unit: the vector width and pixel block (16
# accumulators of 16 floats fill half of AVX-512's registers; AVX2 has 16 registers of 8).
WINDOW_TYPES = """\
#ifndef GK_WINDOW_TYPES
#define GK_WINDOW_TYPES
#include <stdlib.h>
#if defined(__AVX512F__)
#define GK_VBYTES 64
#define GK_PB 16
#else
#define GK_VBYTES 32
#define GK_PB 8
#endif
typedef float gk_vfloat __attribute__((vector_size(GK_VBYTES), aligned(4)));
typedef double gk_vdouble __attribute__((vector_size(GK_VBYTES), aligned(8)));
#endif
"""


def why_not_window_kernel(node: Node) -> str | None:
    """Why `node` runs as its numpy reference rather than a generated window kernel (None:
    it gets one)."""
    if node.subgraph is not None or get_op(node.op).window is None:
        return "not a window op"
    x = node.inputs[0].tensor_type
    out = node.tensor_type
    if x.dtype not in (T.float16, T.float32, T.float64):
        return f"{x.dtype.name} input"
    if node.op == "Conv2DFoldedBN" and x.dtype == T.float16:
        return "a float16 folded convolution"  # its reference folds in float16 arithmetic
    if any(isinstance(d, SymSize) for d in (*x.shape[1:], *out.shape[1:])):
        return "a dynamic size other than the batch"
    if any(isinstance(d, SymSize) for v in node.inputs[1:] for d in v.shape):
        return "dynamic weights"
    if 0 in [d for d in (*x.shape, *out.shape) if isinstance(d, int)]:
        return "an empty tensor"
    return None


def emit_window_kernel(node: Node, name: str, threshold: int) -> KernelSource:
    """The C of `node` (a window op `why_not_window_kernel` accepts) as kernel `name`; its
    argv: the node's inputs, its output, then the batch size when it is dynamic. Images run on
    OpenMP threads when their multiply-adds reach `threshold`."""
    attrs = {**get_op(node.op).attr_defaults, **node.attrs}
    if get_op(node.op).window is Window.CONVOLUTION:
        lines = _conv(node, name, attrs, threshold)
    else:
        lines = _pool(node, name, attrs, threshold)
    buffers = [Buffer(v, tuple(v.shape), False, i) for i, v in enumerate(node.inputs)]
    buffers.append(Buffer(node, tuple(node.shape), True, 0))
    return KernelSource(name, WINDOW_TYPES + "\n".join(lines) + "\n", buffers)


def _batch(node: Node) -> tuple[str, list[str]]:
    """The batch size's C expression and the lines that read it (after the buffers)."""
    n = node.inputs[0].shape[0]
    symbols = kernel_symbols((n,))
    return str(n), read_sizes(symbols, len(node.inputs) + 1)


def image_loop(call: str, batch: str, per_image: int, threshold: int,
            scratch: list[str], free: list[str]) -> list[str]:
    """The loop over images: on threads (each with its own scratch) above `threshold`
    multiply-adds, else on the calling thread (an OpenMP `if` clause still enters the runtime)."""
    body = ["    for (int64_t n = 0; n < nb; ++n) " + call]
    lines = [f"  const int64_t nb = {batch};",
             f"  if (nb > 1 && nb * (int64_t){per_image} >= (int64_t){threshold}) {{",
             "    #pragma omp parallel",
             "    {"]
    lines += ["  " + s for s in scratch]
    lines += ["      #pragma omp for schedule(static)", "  " + body[0]]
    lines += ["  " + s for s in free]
    lines += ["    }", "  } else {"]
    lines += scratch + body + free + ["  }"]
    return lines


# -- convolution ----------------------------------------------------------------------------

@dataclass
class ConvParts:
    """A convolution's C in pieces, for its own kernel and for a block (c_conv_block.py)."""

    statics: list[str]  # the taps table, the per-image functions
    reads: list[str]  # binding x, w (scale, var) from args[0..]
    repack: list[str]  # filling `wt` (vector type `vt`, `wt_count` vectors) from w
    wt_count: str
    vt: str
    ct: str
    st: str
    image: str  # the per-image call, {xn} and {on} to fill; needs wt and xp
    direct: str  # the slow per-image loop, {xn} and {on} to fill; needs nothing
    scratch: int  # elements of the zero-bordered copy xp
    macs: int  # multiply-adds per image
    in_size: int  # elements per input image
    out_size: int  # elements per output image


def _conv(node: Node, name: str, attrs: dict[str, Any], threshold: int) -> list[str]:
    parts = conv_parts(node, name, attrs)
    batch, sizes = _batch(node)
    vt, st = parts.vt, parts.st
    xn, on = f"x + n * {parts.in_size}LL", f"out + n * {parts.out_size}LL"
    lines = parts.statics + ["", f"void {name}(void *const *args) {{", *parts.reads,
                             f"  {st} *restrict out = ({st} *)args[{len(node.inputs)}];",
                             *sizes,
                             f"  {vt} *wt = ({vt} *)malloc(sizeof({vt}) * {parts.wt_count});",
                             "  if (wt == NULL) {",
                             f"    for (int64_t n = 0; n < {batch}; ++n) "
                             f"{parts.direct.format(xn=xn, on=on)}",
                             "    return;",
                             "  }", *parts.repack]
    scratch = [f"  {parts.ct} *xp = ({parts.ct} *)calloc({parts.scratch}, sizeof({parts.ct}));"]
    call = f"if (xp != NULL) {parts.image.format(xn=xn, on=on)} else " \
        f"{parts.direct.format(xn=xn, on=on)}"
    lines += image_loop(call, batch, parts.macs, threshold, scratch, ["  free(xp);"])
    lines += ["  free(wt);", "}"]
    return lines


def conv_parts(node: Node, name: str, attrs: dict[str, Any]) -> ConvParts:
    x, w = node.inputs[0].tensor_type, node.inputs[1].tensor_type
    geo = conv_geometry(TensorType(x.shape, x.dtype), TensorType(w.shape, w.dtype), attrs)
    st, ct = C_STORAGE[x.dtype], C_COMPUTE[x.dtype]
    vt = "gk_vdouble" if ct == "double" else "gk_vfloat"
    _, c, h, wd = x.shape
    o = node.shape[1]
    (kh, kw), (sh, sw), (dh, dw) = geo["kernel"], geo["stride"], geo["dilation"]
    (pt, pb), (pl, pr) = geo["pads"]
    oh, ow = geo["out"]
    g = geo["group"]
    cg, og = c // g, o // g
    hp, wp = h + pt + pb, wd + pl + pr
    taps = cg * kh * kw
    p = oh * ow
    folded = node.op == "Conv2DFoldedBN"
    params = "w, scale, var" if folded else "w"
    param_decl = f"const {st} *restrict w" + (
        f", const {st} *restrict scale, const {st} *restrict var" if folded else "")
    if folded:
        eps = literal(np.asarray(attrs["epsilon"], x.dtype))
        sqrt = "sqrt" if ct == "double" else "sqrtf"
        # As the reference folds: s = gamma / sqrt(var + eps), then weight * s, in the dtype.
        scale = f"(scale[ch] / {sqrt}(var[ch] + {eps}))"
    else:
        scale = "1"
    tap_offsets = ", ".join(str((ci * hp + i * dh) * wp + j * dw)
                            for ci in range(cg) for i in range(kh) for j in range(kw))
    ops = f"{node.op} {list(x.shape)} * {list(w.shape)} -> {list(node.shape)}, stride " \
          f"{(sh, sw)}, dilation {(dh, dw)}, pads {geo['pads']}, group {g}"
    image, direct = f"{name}_image", f"{name}_direct"
    lines = [
        f"/* {c_comment(name)}: {c_comment(ops)} */",
        f"enum {{ {name}_VL = GK_VBYTES / (int)sizeof({ct}), "
        f"{name}_OC = ({og} + {name}_VL - 1) / {name}_VL }};",
        f"static const int32_t {name}_taps[{taps}] = {{{tap_offsets}}};",
        # The slow loop for an image whose scratch plane could not be allocated.
        f"static void {direct}(const {st} *restrict xn, {param_decl}, {st} *restrict on) {{",
        f"  for (int64_t ch = 0; ch < {o}; ++ch) {{",
        f"    const int64_t gi = ch / {og};",
        f"    const {ct} s = {scale};",
        f"    for (int64_t i = 0; i < {oh}; ++i)",
        f"      for (int64_t j = 0; j < {ow}; ++j) {{",
        f"        {ct} acc = 0;",
        f"        for (int64_t ci = 0; ci < {cg}; ++ci)",
        f"          for (int64_t a = 0; a < {kh}; ++a)",
        f"            for (int64_t b = 0; b < {kw}; ++b) {{",
        f"              const int64_t r = i * {sh} + a * {dh} - {pt}, q = j * {sw} + b * {dw}"
        f" - {pl};",
        f"              if (r < 0 || r >= {h} || q < 0 || q >= {wd}) continue;",
        f"              acc += ({ct})xn[((gi * {cg} + ci) * {h} + r) * {wd} + q] *",
        f"                     (({ct})w[((ch * {cg} + ci) * {kh} + a) * {kw} + b] * s);",
        "            }",
        f"        on[(ch * {oh} + i) * {ow} + j] = ({st})acc;",
        "      }",
        "  }",
        "}",
        # Fused multiply-adds here (the translation unit is built with -ffp-contract=off so
        # that elementwise kernels round as numpy does; a sum of products rounds its own way).
        "#if defined(__GNUC__) && !defined(__clang__)",
        "#pragma GCC push_options",
        '#pragma GCC optimize("fp-contract=fast")',
        "#endif",
        f"static void {image}(const {st} *restrict xn, const {vt} *restrict wt, "
        f"{st} *restrict on, {ct} *restrict xp) {{",
        "#if defined(__clang__)",
        "#pragma clang fp contract(fast)",
        "#endif",
        f"  enum {{ VL = {name}_VL, OC = {name}_OC, PB = GK_PB }};",
        f"  for (int64_t ci = 0; ci < {c}; ++ci)",
        f"    for (int64_t i = 0; i < {h}; ++i) {{",
        f"      {ct} *row = xp + (ci * {hp} + i + {pt}) * {wp} + {pl};",
        f"      const {st} *src = xn + (ci * {h} + i) * {wd};",
        f"      for (int64_t j = 0; j < {wd}; ++j) row[j] = ({ct})src[j];",
        "    }",
        f"  for (int64_t gi = 0; gi < {g}; ++gi) {{",
        f"    const {ct} *xg = xp + gi * {cg * hp * wp}LL;",
        *(_row_blocks(name, vt, ct, st, og, taps, oh, ow, sh, sw, wp) if ow <= 8 else [
            "    for (int64_t oc = 0; oc < OC; ++oc) {",
            f"      const {vt} *wg = wt + gi * {taps}LL * OC + oc;",
            f"      for (int64_t p0 = 0; p0 < {p}; p0 += PB) {{",
            f"        const int64_t nb = {p} - p0 < PB ? {p} - p0 : PB;",
            "        int64_t po[PB];",
            "        for (int64_t b = 0; b < PB; ++b) {",
            "          const int64_t q = p0 + (b < nb ? b : 0);  /* a short block repeats "
            "pixel 0 */",
            f"          po[b] = (q / {ow}) * {sh * wp} + (q % {ow}) * {sw};",
            "        }",
            f"        {vt} acc[PB];",
            f"        for (int64_t b = 0; b < PB; ++b) acc[b] = ({vt}){{0}};",
            f"        for (int64_t t = 0; t < {taps}; ++t) {{",
            f"          const {vt} wv = wg[t * OC];",
            f"          const {ct} *xt = xg + {name}_taps[t];",
            "          for (int64_t b = 0; b < PB; ++b) acc[b] += xt[po[b]] * wv;",
            "        }",
            "        for (int64_t b = 0; b < nb; ++b)",
            "          for (int64_t l = 0; l < VL; ++l) {",
            "            const int64_t oi = oc * VL + l;",
            f"            if (oi < {og}) on[(gi * {og} + oi) * {p} + p0 + b] = ({st})acc[b][l];",
            "          }",
            "      }",
            "    }"]),
        "  }",
        "}",
        "#if defined(__GNUC__) && !defined(__clang__)",
        "#pragma GCC pop_options",
        "#endif",
    ]
    reads = [f"  const {st} *restrict x = (const {st} *)args[0];",
             f"  const {st} *restrict w = (const {st} *)args[1];"]
    if folded:
        reads += [f"  const {st} *restrict scale = (const {st} *)args[2];",
                  f"  const {st} *restrict var = (const {st} *)args[3];"]
    # Repacked weights: [group][tap][channel block], lanes past the group's channels zero.
    repack = [
        f"  for (int64_t gi = 0; gi < {g}; ++gi)",
        f"    for (int64_t oc = 0; oc < {name}_OC; ++oc)",
        f"      for (int64_t l = 0; l < {name}_VL; ++l) {{",
        f"        const int64_t oi = oc * {name}_VL + l, ch = gi * {og} + oi;",
        f"        const {ct} s = oi < {og} ? {scale} : 0;",
        f"        for (int64_t t = 0; t < {taps}; ++t)",
        f"          wt[(gi * {taps} + t) * {name}_OC + oc][l] =",
        f"              oi < {og} ? ({ct})w[ch * {taps}LL + t] * s : 0;",
        "      }"]
    return ConvParts(lines, reads, repack, f"{g * taps}LL * {name}_OC", vt, ct, st,
                     f"{image}({{xn}}, wt, {{on}}, xp);", f"{direct}({{xn}}, {params}, {{on}});",
                     c * hp * wp, o * p * taps, c * h * wd, o * p)


def _row_blocks(name: str, vt: str, ct: str, st: str, og: int, taps: int, oh: int, ow: int,
                sh: int, sw: int, wp: int) -> list[str]:
    """The channel blocks' pixel blocks of a narrow output (ow <= 8, so a block holds whole
    rows with either GK_PB), inside the loop over groups. Each pixel block is r whole rows (the
    most that divide oh and fit the accumulators), so its pixels' offsets in the scratch plane
    are constants of the source and each multiply-add reads its broadcast pixel at a fixed
    displacement, one load, where a computed offset table cost a second load per multiply-add.
    With AVX-512's 32 registers two channel blocks go together (up to 2 x 12 accumulators):
    each broadcast pixel feeds two multiply-adds. Every output sums its taps in the same order
    on each path, so results do not depend on the path."""
    def blocks(step: int, limit: str, pb: int) -> list[str]:
        r = max(d for d in range(1, min(pb // ow, oh) + 1) if oh % d == 0)
        nb = r * ow
        offsets = ", ".join(str((b // ow) * sh * wp + (b % ow) * sw) for b in range(nb))
        accs = [f"acc{u}" for u in range(step)]
        lines = [f"    for (; oc {limit}; oc += {step}) {{",
                 f"      const {vt} *wg = wt + gi * {taps}LL * OC + oc;",
                 f"      static const int32_t po[{nb}] = {{{offsets}}};",
                 f"      for (int64_t k = 0; k < {oh}; k += {r}) {{",
                 f"        const {ct} *xt0 = xg + k * {sh * wp};",
                 f"        {vt} {', '.join(f'{a}[{nb}]' for a in accs)};",
                 f"        for (int64_t b = 0; b < {nb}; ++b) {{ "
                 + " ".join(f"{a}[b] = ({vt}){{0}};" for a in accs) + " }",
                 f"        for (int64_t t = 0; t < {taps}; ++t) {{",
                 *[f"          const {vt} w{u} = wg[t * OC + {u}];" for u in range(step)],
                 f"          const {ct} *xt = xt0 + {name}_taps[t];",
                 f"          for (int64_t b = 0; b < {nb}; ++b) {{",
                 f"            const {ct} v = xt[po[b]];",
                 *[f"            acc{u}[b] += v * w{u};" for u in range(step)],
                 "          }",
                 "        }"]
        for u in range(step):
            lines += [f"        for (int64_t b = 0; b < {nb}; ++b)",
                      "          for (int64_t l = 0; l < VL; ++l) {",
                      f"            const int64_t oi = (oc + {u}) * VL + l;",
                      f"            if (oi < {og}) on[(gi * {og} + oi) * {oh * ow} + k * {ow} + b]"
                      f" = ({st})acc{u}[b][l];",
                      "          }"]
        return lines + ["      }", "    }"]
    return ["    int64_t oc = 0;", "#if GK_PB == 16", *blocks(2, "+ 1 < OC", 12),
            *blocks(1, "< OC", 16), "#else", *blocks(1, "< OC", 8), "#endif"]


# -- pools ------------------------------------------------------------------------------------

def _pool(node: Node, name: str, attrs: dict[str, Any], threshold: int) -> list[str]:
    statics, image, in_size, out_size, reads = pool_parts(node, name, attrs)
    batch, sizes = _batch(node)
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
    inf = "((double)INFINITY)" if ct == "double" else "INFINITY"
    start = f"{ct} m = -{inf};" if is_max else f"{ct} m = 0; int64_t count = 0;"
    # NaN wins as in numpy's max: once m is NaN no comparison replaces it.
    take = "if (v > m || v != v) m = v;" if is_max else "m += v; ++count;"
    result = "m" if is_max else f"m / ({ct})count"
    ops = f"{node.op} {list(x.shape)} -> {list(node.shape)}, window {(kh, kw)}, stride " \
          f"{(sh, sw)}, pads {geo['pads']}"
    image = f"{name}_image"
    lines = [
        f"/* {c_comment(name)}: {c_comment(ops)} */",
        f"static void {image}(const {st} *restrict xn, {st} *restrict on) {{",
        f"  for (int64_t ci = 0; ci < {c}; ++ci) {{",
        f"    const {st} *plane = xn + ci * {h * wd}LL;",
        f"    {st} *o = on + ci * {oh * ow}LL;",
        f"    for (int64_t i = 0; i < {oh}; ++i)",
        f"      for (int64_t j = 0; j < {ow}; ++j) {{",
        f"        {start}",
        f"        for (int64_t a = 0; a < {kh}; ++a) {{",
        f"          const int64_t r = i * {sh} + a - {pt};",
        f"          if (r < 0 || r >= {h}) continue;",
        f"          for (int64_t b = 0; b < {kw}; ++b) {{",
        f"            const int64_t q = j * {sw} + b - {pl};",
        f"            if (q < 0 || q >= {wd}) continue;",
        f"            const {ct} v = ({ct})plane[r * {wd} + q];",
        f"            {take}",
        "          }",
        "        }",
        f"        o[i * {ow} + j] = ({st})({result});",
        "      }",
        "  }",
        "}",
    ]
    return lines, f"{image}({{xn}}, {{on}});", c * h * wd, c * oh * ow, c * oh * ow * kh * kw
