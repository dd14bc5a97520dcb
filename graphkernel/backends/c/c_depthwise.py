"""A depthwise-style convolution's per-image pieces (c_window.py's pixel path): a group of
fewer than c_window.PIXEL_PATH_CHANNELS output channels turns its vectors along pixels, over a
scratch split into the stride's phases (PhasePlanes), so that every tap reads a run of
consecutive elements. c_window.conv_parts assembles them with the weights' repack and the
image loop."""
from __future__ import annotations

from dataclasses import dataclass

# A depthwise convolution's row goes in chunks of this many pixels (4 AVX-512 accumulators).
PIXEL_CHUNK = 64
# Elements past a depthwise convolution's scratch plane that its last vector load may read.
SCRATCH_SLACK = 16
# clang's spelling of the fp-contract=fast that gcc's push_options gives a convolution's code.
CLANG_CONTRACT = ("#if defined(__clang__)", "#pragma clang fp contract(fast)", "#endif")


@dataclass(frozen=True)
class PhasePlanes:
    """A depthwise-style convolution's zero-bordered scratch, each input channel split into its
    stride's phases: plane (pa, pb) holds the padded input's rows pa, pa + sh, ... and columns
    pb, pb + sw, ... So the taps of a strided convolution read consecutive elements, as a
    stride of 1 does, where they read every sh-th before (a gather of one lane at a time: a
    576-channel 3x3 stride-2 depthwise convolution at 14x14 ran at a tenth of ONNX Runtime's
    speed), and a row block of a narrow output is one run across rows (`rows` in
    c_conv_units.conv_units). With a stride of 1 there is one plane, the padded image itself."""

    hp: int  # the padded input's height and width
    wp: int
    sh: int
    sw: int

    @property
    def hq(self) -> int:  # a phase plane's rows and columns
        return -(-self.hp // self.sh)

    @property
    def wq(self) -> int:
        return -(-self.wp // self.sw)

    @property
    def per_channel(self) -> int:
        return self.sh * self.sw * self.hq * self.wq

    def offset(self, ci: int, r: int, q: int) -> int:
        """Where padded row r, column q of input channel ci sits; output (i, j)'s tap at
        (r, q) of its window then sits at offset(ci, r, q) + i * wq + j."""
        phase = (r % self.sh) * self.sw + q % self.sw
        return (ci * self.sh * self.sw + phase) * self.hq * self.wq + \
            (r // self.sh) * self.wq + q // self.sw


def pixel_units(name: str, fill: str, unit: str, vt: str, ct: str, st: str,
                 planes: PhasePlanes, *, h: int, wd: int, pt: int, pl: int, cg: int, og: int,
                 o: int, taps: int, oh: int, ow: int) -> list[str]:
    """`fill` and `unit` (as c_conv_units.conv_units's) for a group of few output channels
    (depthwise):
    vector lanes along pixels, a unit is one output channel. The scratch is in stride phases
    (PhasePlanes), so output pixel (i, j) of a tap reads element i * wq + j past the tap's
    offset: a block of pixels reads one run per tap, whatever the stride. Rows of at most
    PIXEL_CHUNK phase-plane columns go several at a time as one run across rows (lanes past a
    row's ow read the next row's border and are dropped at the store): a 7-wide output fills
    55 of 64 lanes where a row at a time filled 7 of 16. Wider rows go in chunks of a row.
    The accumulators go through a buffer on the stack to the output's rows."""
    sh, sw, hq, wq = planes.sh, planes.sw, planes.hq, planes.wq
    plane = hq * wq
    lines = [
        # Input row i is padded row i + pt, in phase row (i + pt) % sh; its column j goes to
        # the phase of column (j + pl) % sw. One loop per column phase with constant bounds
        # and offset, which gcc vectorises as strided loads (vpermt2ps at a stride of 2).
        f"static inline void {fill}(const {st} *restrict xn, {ct} *restrict xp, int64_t ci) {{",
        f"  for (int64_t i = 0; i < {h}; ++i) {{",
        f"    const int64_t r = i + {pt};",
        f"    {ct} *row = xp + ((ci * {sh * sw} + (r % {sh}) * {sw}) * {hq} + r / {sh}) * "
        f"{wq}LL;",
        f"    const {st} *src = xn + (ci * {h} + i) * {wd};"]
    for pb in range(sw):
        # phase-plane columns q whose input column q * sw + pb - pl lies in [0, wd)
        lo, hi = max(0, -(-(pl - pb) // sw)), (wd - 1 + pl - pb) // sw
        if hi >= lo:
            lines.append(f"    for (int64_t q = {lo}; q <= {hi}; ++q) row[{pb * plane} + q] = "
                         f"({ct})src[q * {sw} + {pb - pl}];")
    lines += ["  }", "}"]
    if wq <= PIXEL_CHUNK:  # blocks of whole rows, one run each
        most = min(oh, PIXEL_CHUNK // wq)
        count = -(-oh // most)
        rows = -(-oh // count)  # equal blocks, the last one maybe shorter
        full, tail = divmod(oh, rows)
        # (rows a block, first column, pixels a row, first row, rows in all)
        spans = [(rows, 0, ow, 0, full * rows)] + \
            ([(tail, 0, ow, full * rows, tail)] if tail else [])
    else:  # each row alone, in chunks of at most PIXEL_CHUNK pixels
        spans = [(1, j0, min(PIXEL_CHUNK, ow - j0), 0, oh) for j0 in range(0, ow, PIXEL_CHUNK)]
    body = [f"enum {{ {name}_NU = {o} }};",
            f"static void {unit}(const {ct} *restrict xp, const {vt} *restrict wt, "
            f"{st} *restrict on, int64_t gi, int64_t ch) {{",
            *CLANG_CONTRACT,
            f"  enum {{ VL = {name}_VL }};",
            "  (void)gi;",
            f"  const {ct} *restrict ws = (const {ct} *)wt + ch * {taps}LL;",
            f"  const {ct} *restrict xg = xp + (ch / {og}) * {cg * planes.per_channel}LL;",
            f"  {st} *restrict oc = on + ch * {oh * ow}LL;"]
    for nrows, j0, width, i0, total in spans:
        lanes = (nrows - 1) * wq + width
        body += [f"  /* rows {i0}..{i0 + total - 1}, {nrows} a block, pixels {j0}.."
                 f"{j0 + width - 1} */",
                 f"  for (int64_t i = {i0}; i < {i0 + total}; i += {nrows}) {{",
                 f"    enum {{ NV = ({lanes} + VL - 1) / VL }};",
                 f"    {vt} a[NV];",
                 "    for (int64_t v = 0; v < NV; ++v) a[v] = (" + vt + "){0};",
                 f"    const {ct} *restrict xb = xg + i * {wq}LL + {j0};",
                 f"    for (int64_t t = 0; t < {taps}; ++t) {{",
                 f"      const {vt} wv = ({vt}){{0}} + ws[t];",
                 # unaligned vector loads; the scratch has a vector of slack past its end
                 f"      const {ct} *restrict xt = xb + {name}_taps[t];",
                 f"      for (int64_t v = 0; v < NV; ++v) a[v] += *(const {vt} *)(xt + v * VL)"
                 " * wv;",
                 "    }",
                 f"    {ct} buf[NV * VL] __attribute__((aligned(64)));",
                 f"    for (int64_t v = 0; v < NV; ++v) *({vt} *)(buf + v * VL) = a[v];",
                 *rows_from_buffer(st, ct, nrows, width, ow, j0, wq),
                 "  }"]
    return lines + body + ["}"]


def rows_from_buffer(st: str, ct: str, nrows: int, width: int, ow: int, j0: int,
                      wq: int) -> list[str]:
    """Rows r < nrows of a pixel block's buffer (row r at r * wq) to the output's rows. Where
    no conversion is needed, one memcpy a row: GCC 12's SLP vectoriser, given the element
    loop, merges the rows' reads into one permute of the 8-lane double vector just stored and
    picks a wrong lane (a depthwise 5x5 stride-3 float64 convolution gave a wrong pixel at
    -O2 and -O3 with AVX-512; right at -O0, with AVX2 and with this copy)."""
    if st == ct:
        return [f"    for (int64_t r = 0; r < {nrows}; ++r)",
                f"      memcpy(oc + (i + r) * {ow}LL + {j0}, buf + r * {wq}, "
                f"{width} * sizeof({st}));"]
    return [f"    for (int64_t r = 0; r < {nrows}; ++r)",
            f"      for (int64_t j = 0; j < {width}; ++j)",
            f"        oc[(i + r) * {ow}LL + {j0} + j] = ({st})buf[r * {wq} + j];"]
