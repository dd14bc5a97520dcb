"""A depthwise convolution's channel-vectored units (c_window.conv_parts assembles them): the
vectors run along a channel block's B channels (the blocked layout's run of a pixel), one
multiply-add per tap per output pixel, the weights repacked per block as [block][tap][lane].
Borders go by tap bounds (the taps of a row or column that fall outside the input are not
visited), so a blocked input is read in place with no zero-bordered scratch; an NCHW input is
first gathered into a blocked scratch of the image (no border either). An NCHW output goes
through an L1 tile of output rows, 16 pixels at a time transposed in registers into runs of
each channel's plane.

The pixel path (c_depthwise.py) runs its vectors along a plane's pixels instead; it cannot read
or write the blocked layout, and at small maps it fills few lanes (a 7-wide output's row block
fills 55 of 64). `depthwise_form` chooses between them for an NCHW convolution."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from graphkernel.backends.c.c_conv_units import ConvLayout
from graphkernel.backends.c.c_depthwise import CLANG_CONTRACT
from graphkernel.backends.c.c_text import c_comment, index_kernel_options

# An NCHW depthwise convolution of at most this many output pixels runs channel-vectored
# (its input gathered into blocks and its output back to planes, both through register
# transposes), any other on the pixel path. One thread, conv + ReLU6, batch 8, channel/pixel
# time (/work/briefs/out/s10-mbv3.md): 3x3 at 7x7 0.65, at 14x14 0.6-0.8, 3x3 stride 2 to
# 7x7 0.7-0.9, 5x5 stride 2 to 14x14 0.7-0.8, 3x3 at 20x20 0.7-1.0; 3x3 at 28x28 1.04, 3x3
# stride 2 to 28x28 0.9 at batch 8 but 1.0-1.2 at batch 1. (Before the transposes the taps
# and the stride decided too: s9-dwblock.md.)
CHANNEL_VECTOR_PIXELS = 196
# An NCHW depthwise convolution of at least this many taps runs channel-vectored at any map
# size. Zen 5, one thread, conv + ReLU6, 5 alternating rounds, channel/pixel time
# (/work/briefs/out/s11-mbv3se.md): 5x5 at 20x20 0.45, at 28x28 0.77 (batch 1) / 0.85 (batch
# 8), at 56x56 0.72, 5x5 stride 2 from 56x56 0.63, 7x7 at 28x28 0.55. 3x3 stays by size:
# 20x20 0.88 but 28x28 1.05 and stride 2 to 28x28 1.15.
CHANNEL_VECTOR_TAPS = 25
# Output pixels of a row's interior that go together (their accumulators in registers while
# the taps go by: one weight load feeds this many multiply-adds).
INTERIOR_PIXELS = 8
# Elements of a unit's output tile (whole output rows of a channel block) for an NCHW output:
# 32 KiB of float, within L1 beside the input's rows.
TILE_ELEMENTS = 8192


@dataclass(frozen=True)
class DepthwiseGeometry:
    """A depthwise convolution's sizes (one input channel per output channel)."""

    c: int  # channels
    h: int
    wd: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int
    oh: int
    ow: int

    @property
    def taps(self) -> int:
        return self.kh * self.kw

    def interior_columns(self) -> tuple[int, int]:
        """Output columns [jl, jr) whose every column tap lies inside the input."""
        jl = next((j for j in range(self.ow) if j * self.sw - self.pl >= 0), self.ow)
        jr = jl
        while jr < self.ow and jr * self.sw - self.pl + (self.kw - 1) * self.dw < self.wd:
            jr += 1
        return jl, jr


def is_plain_depthwise(c: int, o: int, group: int) -> bool:
    """One input and one output channel per group: what the channel-vectored units compute."""
    return group == c == o and group > 1


def depthwise_form(pixels: int, taps: int, strided: bool, input_blocked: bool,
                   output_blocked: bool) -> tuple[bool, str]:
    """Whether a plain depthwise convolution of `pixels` output pixels and `taps` taps runs
    channel-vectored, and why (the lowering's note)."""
    if input_blocked or output_blocked:
        return True, "depthwise channel-vectored (vectors along a channel block, taps bounded " \
                     "at the borders): it reads or writes the blocked layout"
    if pixels <= CHANNEL_VECTOR_PIXELS:
        return True, f"depthwise channel-vectored: {pixels} output pixels (at most " \
                     f"{CHANNEL_VECTOR_PIXELS}), {taps} taps, stride " \
                     f"{'over 1' if strided else '1'} (the pixel path fills few lanes there)"
    if taps >= CHANNEL_VECTOR_TAPS:
        return True, f"depthwise channel-vectored: {taps} taps (at least " \
                     f"{CHANNEL_VECTOR_TAPS}), {pixels} output pixels (the taps' multiply-adds " \
                     "outweigh the gather and transposes)"
    return False, f"depthwise pixel path (vectors along pixels over phase planes): {pixels} " \
                  f"output pixels, {taps} taps, stride {'over 1' if strided else '1'} (over " \
                  f"{CHANNEL_VECTOR_PIXELS} pixels and under {CHANNEL_VECTOR_TAPS} taps the " \
                  "channel-vectored form's gather and transposes cost more than the pixel " \
                  "path's partly filled vectors save)"


def channel_units(name: str, fill: str, unit: str, ct: str, st: str, geo: DepthwiseGeometry,
                  block: int, *, input_blocked: bool, output_blocked: bool, scale: str
                  ) -> tuple[list[str], list[str]]:
    """(statics, repack): `fill` (NCHW input, or a float16 blocked one: the image's channel
    block ci gathered into the blocked compute-type scratch xp), `unit` (channel block u of the
    output, `{name}_NU` of them), and the weights' repack into `wt` ([block][tap][lane], lanes
    past the channels zero; `scale` the C of channel `ch`'s factor). The scratch, when there
    is one, holds ceil(c / block) * block channels of h x wd, the lanes past c zero."""
    g = geo
    bk = block
    nb = -(-g.c // bk)
    plane = g.h * g.wd
    bv = f"{name}_bv"
    in_place = input_blocked and st == ct
    src_t = ct  # the units read compute-type blocks: the input itself or the scratch
    lines = [f"typedef {ct} {bv} __attribute__((vector_size({bk} * sizeof({ct})), "
             f"aligned(sizeof({ct}))));"]
    if not in_place:
        if input_blocked:  # float16 blocks to float blocks
            lines += [
                f"static inline void {fill}(const {st} *restrict xn, {ct} *restrict xp, "
                "int64_t ci) {",
                f"  for (int64_t k = 0; k < {plane * bk}; ++k) "
                f"xp[ci * {plane * bk}LL + k] = ({ct})xn[ci * {plane * bk}LL + k];",
                "}"]
        else:  # planes to blocks; the lanes past the channels stay zero (calloc'd)
            lines += [
                f"static inline void {fill}(const {st} *restrict xn, {ct} *restrict xp, "
                "int64_t ci) {",
                f"  const int64_t lanes = {g.c} - ci * {bk} < {bk} ? {g.c} - ci * {bk} : {bk};",
                f"  {ct} *restrict xb = xp + ci * {plane * bk}LL;",
                # bk pixels of bk planes at a time, transposed in registers (a lane-by-lane
                # gather stored one element per pixel); the last pixels lane by lane.
                *([_mask_type(name, ct, bk),
                   f"  const {st} *restrict planes = xn + ci * {bk * plane}LL;",
                   f"  for (int64_t q0 = 0; q0 < {plane // bk * bk}; q0 += {bk}) {{",
                   *[f"    {bv} r{p} = {p} < lanes ? *(const {bv} *)(planes + "
                     f"{p * plane}LL + q0) : ({bv}){{0}};" for p in range(bk)],
                   *_transpose(name, bv, bk),
                   *[f"    *({bv} *)(xb + (q0 + {p}) * {bk}LL) = r{p};" for p in range(bk)],
                   "  }"] if st == ct else []),
                "  for (int64_t l = 0; l < lanes; ++l) {",
                f"    const {st} *restrict src = xn + (ci * {bk} + l) * {plane}LL;",
                f"    for (int64_t q = {plane // bk * bk if st == ct else 0}; q < {plane}; ++q) "
                f"xb[q * {bk} + l] = ({ct})src[q];",
                "  }",
                "}"]
    # NCHW output: the unit's blocks go into a tile of `rows` output rows (the most that
    # divide the map and fit L1) and leave as one contiguous run per channel; storing each
    # pixel's lanes into B planes took the unit 1.5x its time with a blocked output (240
    # channels, 5x5, 14x14).
    rows = max((r for r in range(1, g.oh + 1)
                if g.oh % r == 0 and r * g.ow * bk <= TILE_ELEMENTS), default=0)
    tiled = not output_blocked and rows > 0 and st == ct
    if output_blocked:
        store = ([f"  *({bv} *)(on + ((u * {g.oh} + i) * {g.ow} + (j)) * {bk}LL) = (acc);"]
                 if st == ct else
                 [f"  for (int64_t l = 0; l < {bk}; ++l) "
                  f"on[((u * {g.oh} + i) * {g.ow} + (j)) * {bk}LL + l] = ({st})(acc)[l];"])
    elif tiled:  # blocks into the L1 tile; its planes leave after its last row
        store = [f"  *({bv} *)(tile + ((i - i0) * {g.ow} + (j)) * {bk}LL) = (acc);"]
    else:
        store = [f"  for (int64_t l = 0; l < lanes; ++l) "
                 f"on[(u * {bk} + l) * {g.oh * g.ow}LL + i * {g.ow} + (j)] = ({st})(acc)[l];"]
    # The bounds of a row's taps: a in [a0, a1) reads input row r0 + a * dh inside [0, h).
    row_bounds = [
        f"    const int64_t r0 = i * {g.sh} - {g.pt};",
        f"    const int64_t a0 = r0 < 0 ? (-r0 + {g.dh - 1}) / {g.dh} : 0;",
        f"    int64_t a1 = r0 >= {g.h} ? 0 : ({g.h} - r0 + {g.dh - 1}) / {g.dh};",
        f"    if (a1 > {g.kh}) a1 = {g.kh};"]
    jl, jr = g.interior_columns()
    px = INTERIOR_PIXELS
    full = (jr - jl) // px * px
    rest = jr - jl - full

    def group(j: str, count: int) -> list[str]:
        """`count` interior pixels from column `j`, their accumulators in registers while the
        taps go by (every column tap inside: no bounds)."""
        return [
            f"      {bv} acc[{count}];",
            f"      for (int64_t p = 0; p < {count}; ++p) acc[p] = ({bv}){{0}};",
            f"      const {src_t} *restrict xj = xb + ({j} * {g.sw} - {g.pl}) * {bk}LL;",
            "      for (int64_t a = a0; a < a1; ++a) {",
            f"        const {src_t} *restrict xr = xj + (r0 + a * {g.dh}) * {g.wd * bk}LL;",
            f"        for (int64_t b = 0; b < {g.kw}; ++b) {{",
            f"          const {bv} wv = wb[a * {g.kw} + b];",
            f"          for (int64_t p = 0; p < {count}; ++p)",
            f"            acc[p] += *(const {bv} *)(xr + (p * {g.sw} + b * {g.dw}) * {bk}LL) "
            "* wv;",
            "        }",
            "      }",
            f"      for (int64_t p = 0; p < {count}; ++p) {{",
            f"        const {bv} accp = acc[p];",
            *["      " + s.replace("(acc)", "accp").replace("(j)", f"({j} + p)")
              for s in store],
            "      }"]

    lines += [
        f"enum {{ {name}_NU = {nb} }};",
        # One pixel with both tap bounds (a border column); called with a constant column,
        # so its column bounds fold and its column loop unrolls (a dynamic one per pixel cost
        # 2-3x the multiply-adds' time at 14x14 and 7x7 maps).
        f"#define {name}_PIXEL(j) do {{ \\",
        f"  const int64_t q0 = (j) * {g.sw} - {g.pl}; \\",
        f"  const int64_t b0 = q0 < 0 ? (-q0 + {g.dw - 1}) / {g.dw} : 0; \\",
        f"  int64_t b1 = q0 >= {g.wd} ? 0 : ({g.wd} - q0 + {g.dw - 1}) / {g.dw}; \\",
        f"  if (b1 > {g.kw}) b1 = {g.kw}; \\",
        f"  {bv} acc = ({bv}){{0}}; \\",
        "  for (int64_t a = a0; a < a1; ++a) \\",
        "    for (int64_t b = b0; b < b1; ++b) \\",
        f"      acc += *(const {bv} *)(xb + ((r0 + a * {g.dh}) * {g.wd} + q0 + b * {g.dw}) * "
        f"{bk}LL) * wb[a * {g.kw} + b]; \\",
        *[s + " \\" for s in store],
        "} while (0)",
        f"static void {unit}(const {ct} *restrict xp, const {bv} *restrict wt, "
        f"{st} *restrict on, int64_t gi, int64_t u) {{",
        *CLANG_CONTRACT,
        "  (void)gi;",
        f"  const int64_t lanes = {g.c} - u * {bk} < {bk} ? {g.c} - u * {bk} : {bk};",
        "  (void)lanes;",
        f"  const {src_t} *restrict xb = xp + u * {plane * bk}LL;",
        f"  const {bv} *restrict wb = wt + u * {g.taps}LL;",
        *([f"  {ct} tile[{rows * g.ow * bk}] __attribute__((aligned(64)));",
           f"  for (int64_t i0 = 0; i0 < {g.oh}; i0 += {rows}) {{",
           f"  for (int64_t i = i0; i < i0 + {rows}; ++i) {{"] if tiled else
          ["  {", f"  for (int64_t i = 0; i < {g.oh}; ++i) {{"]),
        *row_bounds,
        *[f"    {name}_PIXEL({j});" for j in range(jl)],
        # The interior: every column tap inside, INTERIOR_PIXELS pixels a step, then the
        # remaining interior pixels as one smaller group.
        *([f"    for (int64_t j = {jl}; j < {jl + full}; j += {px}) {{", *group("j", px),
           "    }"] if full else []),
        *(["    {", *group(str(jl + full), rest), "    }"] if rest else []),
        *[f"    {name}_PIXEL({j});" for j in range(jr, g.ow)],
        "  }",
        *(_tile_out(name, bv, ct, st, bk, rows * g.ow, g.oh * g.ow,
                     f"i0 * {g.ow}LL") if tiled else []),
        "  }",
        "}",
        f"#undef {name}_PIXEL"]
    repack = [f"  for (int64_t cb = 0; cb < {nb}; ++cb)",
              f"    for (int64_t l = 0; l < {bk}; ++l) {{",
              f"      const int64_t ch = cb * {bk} + l < {g.c} ? cb * {bk} + l : 0;",
              f"      const {ct} s = cb * {bk} + l < {g.c} ? {scale} : 0;",
              f"      for (int64_t t = 0; t < {g.taps}; ++t)",
              f"        (({ct} *)wt)[(cb * {g.taps} + t) * {bk}LL + l] = "
              f"({ct})w[ch * {g.taps}LL + t] * s;",
              "    }"]
    return lines, repack


def _tile_out(name: str, bv: str, ct: str, st: str, bk: int, pixels: int, plane: int,
              base: str) -> list[str]:
    """The unit's tile (`pixels` x bk lanes, from pixel `base` of the plane) out to its
    lanes' planes (`plane` pixels apart): bk pixels at a time
    transposed in registers (a swap of row and lane bit h for each bit: log2(bk) rounds of
    two-vector shuffles), one vector store per lane; the last pixels lane by lane."""
    lines = [_mask_type(name, ct, bk),
             f"  for (int64_t q = 0; q < {pixels // bk * bk}; q += {bk}) {{",
             *[f"    {bv} r{p} = *({bv} *)(tile + (q + {p}) * {bk}LL);" for p in range(bk)],
             *_transpose(name, bv, bk)]
    lines += [f"    {st} *restrict o = on + u * {bk * plane}LL + {base} + q;",
              *[f"    if ({p} < lanes) *({bv} *)(o + {p * plane}LL) = r{p};"
                for p in range(bk)],
              "  }",
              "  for (int64_t l = 0; l < lanes; ++l)",
              f"    for (int64_t q = {pixels // bk * bk}; q < {pixels}; ++q)",
              f"      on[(u * {bk} + l) * {plane}LL + {base} + q] = ({st})tile[q * {bk} + l];"]
    return lines


class ChannelParts(NamedTuple):
    """A channel-vectored depthwise convolution's C pieces: c_window.ConvParts' leading
    fields, in order (that module imports this one, so it wraps them)."""

    statics: list[str]
    reads: list[str]
    repack: list[str]
    wt_count: str
    vt: str
    ct: str
    st: str
    image: str
    direct: str
    params: str
    scratch: int
    macs: int
    in_size: int
    out_size: int


def depthwise_channel_parts(name: str, ops: str, geo: DepthwiseGeometry, layout: ConvLayout,
                             direct: str, param_decl: str, params: str, scale: str,
                             in_index: str, out_index: str, folded: bool, vt: str, ct: str,
                             st: str) -> ChannelParts:
    """A plain depthwise convolution's parts with channel-vectored units (c_window.ConvParts'
    fields, in order, for conv_parts to wrap): the input read in place when it is blocked in
    the compute type, else gathered into a blocked scratch; the output written as `layout`
    says."""
    g, bk = geo, layout.block
    nb = -(-g.c // bk)
    in_place = layout.input_blocked and st == ct
    fill, unit, image = f"{name}_fill", f"{name}_unit", f"{name}_image"
    statics, repack = channel_units(name, fill, unit, ct, st, geo, bk,
                                    input_blocked=layout.input_blocked,
                                    output_blocked=layout.output_blocked, scale=scale)
    p = g.oh * g.ow
    lines = [
        f"/* {c_comment(name)}: {c_comment(ops)}, depthwise channel-vectored */",
        f"enum {{ {name}_VL = GK_VBYTES / (int)sizeof({ct}) }};",
        f"static void {direct}(const {st} *restrict xn, {param_decl}, {st} *restrict on) {{",
        f"  for (int64_t ch = 0; ch < {g.c}; ++ch) {{",
        "    const int64_t gi = ch, ci = 0;",
        f"    const {ct} s = {scale};",
        f"    for (int64_t i = 0; i < {g.oh}; ++i)",
        f"      for (int64_t j = 0; j < {g.ow}; ++j) {{",
        f"        {ct} acc = 0;",
        f"        for (int64_t a = 0; a < {g.kh}; ++a)",
        f"          for (int64_t b = 0; b < {g.kw}; ++b) {{",
        f"            const int64_t r = i * {g.sh} + a * {g.dh} - {g.pt}, "
        f"q = j * {g.sw} + b * {g.dw} - {g.pl};",
        f"            if (r < 0 || r >= {g.h} || q < 0 || q >= {g.wd}) continue;",
        f"            acc += ({ct})xn[{in_index}] *",
        f"                   (({ct})w[(ch * {g.kh} + a) * {g.kw} + b] * s);",
        "          }",
        f"        on[{out_index}] = ({st})acc;",
        "      }",
        "  }",
        "}",
        *index_kernel_options("fp-contract=fast"),
        *statics,
        f"static void {image}(const {st} *restrict xn, const {vt} *restrict wt, "
        f"{st} *restrict on, {ct} *restrict xp, int par) {{",
        *(["  (void)xp;", f"  const {ct} *restrict xs = (const {ct} *)xn;"] if in_place else [
            "  if (par) {",
            "    #pragma omp parallel for schedule(static)",
            f"    for (int64_t ci = 0; ci < {nb}; ++ci) {fill}(xn, xp, ci);",
            "  } else {",
            f"    for (int64_t ci = 0; ci < {nb}; ++ci) {fill}(xn, xp, ci);",
            "  }",
            f"  const {ct} *restrict xs = xp;"]),
        f"  const {name}_bv *restrict wb = (const {name}_bv *)wt;",
        "  if (par) {",
        "    #pragma omp parallel for schedule(static)",
        f"    for (int64_t u = 0; u < {name}_NU; ++u) {unit}(xs, wb, on, 0, u);",
        "  } else {",
        f"    for (int64_t u = 0; u < {name}_NU; ++u) {unit}(xs, wb, on, 0, u);",
        "  }",
        "}",
        "#if defined(__GNUC__) && !defined(__clang__)",
        "#pragma GCC pop_options",
        "#endif"]
    reads = [f"  const {st} *restrict x = (const {st} *)args[0];",
             f"  const {st} *restrict w = (const {st} *)args[1];"]
    if folded:
        reads += [f"  const {st} *restrict scale = (const {st} *)args[2];",
                  f"  const {st} *restrict var = (const {st} *)args[3];"]
    scratch = 0 if in_place else nb * bk * g.h * g.wd
    return ChannelParts(lines, reads, repack,
                     f"({nb * bk * g.taps}LL + {name}_VL - 1) / {name}_VL", vt, ct, st,
                     f"{image}({{xn}}, wt, {{on}}, {'NULL' if in_place else 'xp'}, gk_par);",
                     f"{direct}({{xn}}, {params}, {{on}});", params, scratch,
                     g.c * p * g.taps, g.c * g.h * g.wd, g.c * p)


def _mask_type(name: str, ct: str, bk: int) -> str:
    it = "int32_t" if ct == "float" else "int64_t"
    return f"  typedef {it} {name}_mask __attribute__((vector_size({bk} * sizeof({it}))));"


def _transpose(name: str, bv: str, bk: int) -> list[str]:
    """C transposing the bk x bk matrix in vectors r0..r{bk-1} (row p, lane l) in place: for
    each bit h of the index, the rows' and lanes' bit h swap (two-vector shuffles)."""
    lines: list[str] = []
    h = bk // 2
    while h:
        lo = ", ".join(str(bk + k - h if k & h else k) for k in range(bk))
        hi = ", ".join(str(bk + k if k & h else k + h) for k in range(bk))
        for i in range(bk):
            if i & h:
                continue
            lines += [f"    {{ const {bv} a = r{i}, b = r{i + h};",
                      f"      r{i} = __builtin_shuffle(a, b, ({name}_mask){{{lo}}});",
                      f"      r{i + h} = __builtin_shuffle(a, b, ({name}_mask){{{hi}}}); }}"]
        h //= 2
    return lines
