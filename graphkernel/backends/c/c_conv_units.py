"""A convolution's channel-vector units as generated C (c_window.conv_parts assembles them
with the weights' repack and the image loop; the depthwise pixel path is c_depthwise.py), and
the layout its input and output lie in (graph_kernel/conv_layout.py decides which)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphkernel.backends.c.c_depthwise import CLANG_CONTRACT
from graphkernel.backends.c.c_text import C_COMPUTE
from graphkernel.backends.c.conv_tile import ConvTile

# An output of at most this many pixels goes in equal blocks over the whole image, each block
# its own code with constant offsets (a 7x7 or 14x14 output fills every block; whole rows of 7
# left 5 of 12 accumulators idle; larger images would make too much code for the compiler).
FLAT_PIXELS = 64
# Row segments of a convolution with at most this many taps store pixel by pixel (a transpose in
# registers), more taps channel by channel. MobileNetV2's 1x1 convolutions at batch 8, one
# thread, conv + BN + ReLU6, 3 alternating rounds, by pixel / by channel: 32->16 at 112x112
# (16 taps) 0.70, 16->96 at 112 0.85, 32->144 at 56 0.67, 144->32 at 56 0.86, 96->576 at 14
# (96 taps, 7-pixel segments) 1.10; 3x3 64ch at 56x56 (576 taps) was 1.03-1.06 (s5-digits).
SEGMENT_BY_PIXEL_TAPS = 64
# A convolution with at least PREFETCH_MIN_BYTES of weights prefetches each unit's weight
# vectors PREFETCH_TAPS taps ahead. At batch 1 those weights (9.4 MB for a 512->512 3x3) stream
# from memory once per call (ResNet-18's 46 MB exceed the caches), and with the hardware
# prefetcher alone the 7x7 layers ran at ~77% of the 56x56 layers' rate. One thread, calls
# alternated in one process (bench/codegen_ab.py), 32 taps ahead against none, every conv:
# ResNet-18 b1 0.969x (the other order: none 1.041x), its 7x7 steps 0.84-0.97x, 28x28 0.97-0.99x,
# 56x56 (147 KB of weights) 0.99-1.03x; ResNet-50 b1 0.978x (none 1.010x median); the digits
# CNN (18 KB a unit) 1.03x, hence the floor. Past a unit's last tap the prefetches read nothing
# useful, and a prefetch never faults.
PREFETCH_TAPS = 32
PREFETCH_MIN_BYTES = 512 << 10
# Units leave out the taps that read a padded convolution's zero border (BorderTaps); False
# sums them as every other tap (bench/codegen_ab.py compares the two). ONNX ResNet-18 b8, one
# thread, per kernel, against summing them: 3x3s at 7x7 0.83x, 14x14 0.91x, 28x28 0.955x,
# 56x56 0.988x (the multiply-adds left: 0.819, 0.907, 0.953, 0.976), the call 0.937x.
SKIP_BORDER_TAPS = True
# ... for kernels of at most this many taps a channel: ResNet's 7x7 stem (3 channels of 49
# taps, each kernel row's 7 unrolled) took 1.015-1.061x leaving them out.
SKIP_MAX_KERNEL_TAPS = 9


def tap_chunk(taps: int, bytes_per_tap: int, block: int, budget: int) -> int:
    """How many taps a 1x1 unit sums over its whole piece before it turns to the next ones: all
    of them, or (when its weights take at least twice `budget` bytes, ConvTile.chunk_bytes)
    equal chunks of whole channel blocks (`block` taps) whose weights stay in L1 across the
    piece's pixel blocks. Unchunked, a 1x1 of many input channels streamed both its weights and
    its input through L1 at every pixel block: 512->128 at 28x28, batch 8, one thread (Zen 5,
    48 KiB L1d), 149 GFLOP/s where 256->128 ran at 236; in chunks of a third of L1d 218
    (a half 192, a quarter 200), 1024->256 at 14x14 173 -> 223, 256->64 at 56x56 176 -> 201;
    2048->512 at 7x7 (4 pixel blocks an image) the same. The 3x3s, whose input rows stay in
    L1, lost 1-2%: they are not chunked. The sums of a chunk go to the output and come back,
    in tap order: the results do not change."""
    most = budget // bytes_per_tap // block * block
    if most <= 0 or taps < 2 * most:  # a short last chunk cost more than it saved
        return taps
    chunks = -(-taps // most)
    return -(-taps // chunks // block) * block  # equal chunks of whole channel blocks


@dataclass(frozen=True)
class ConvLayout:
    """How a convolution kernel's input and output lie (graph_kernel/conv_layout.py decides):
    NCHW, or blocked, (N, C / block, H, W, block) with `block` channels of a pixel adjacent, one
    vector of the 512-bit code (channel_block)."""

    input_blocked: bool = False
    output_blocked: bool = False
    block: int = 16


NCHW = ConvLayout()


@dataclass(frozen=True)
class BorderTaps:
    """A zero-padded convolution's geometry, for which taps of an output pixel read the
    zero border rather than the image (`valid`): a unit skips those multiply-adds (each adds
    an exact zero), as oneDNN's convolutions leave out the kernel rows that fall in the
    padding. A 3x3 with padding 1 at 7x7 sums 81.9% of its 9 taps a pixel over the image
    (14x14 90.7%, 56x56 97.6%)."""

    kh: int
    kw: int
    dh: int
    dw: int
    sh: int
    sw: int
    pt: int
    pl: int
    h: int
    wd: int

    def rows_valid(self, r: int) -> tuple[bool, ...]:
        """Per kernel row i, whether output row r reads an image row with it."""
        return tuple(0 <= r * self.sh + i * self.dh - self.pt < self.h for i in range(self.kh))

    def cols_valid(self, c: int) -> tuple[bool, ...]:
        """Per kernel column j, whether output column c reads an image column with it."""
        return tuple(0 <= c * self.sw + j * self.dw - self.pl < self.wd for j in range(self.kw))

    def valid(self, r: int, c: int) -> tuple[bool, ...]:
        """Per tap (i, j), row by row, whether output pixel (r, c) reads the image."""
        return tuple(i and j for i in self.rows_valid(r) for j in self.cols_valid(c))

    def row_range(self, k: str) -> list[str]:
        """C lines that set [i0, i1), the kernel rows with which output row `k` (a C
        expression) reads image rows."""
        return [f"  const int64_t r0 = ({k}) * {self.sh} - {self.pt};",
                f"  const int64_t i0 = r0 >= 0 ? 0 : (-r0 + {self.dh - 1}) / {self.dh};",
                f"  const int64_t below = {self.h - 1} - r0;",
                f"  const int64_t i1 = below < 0 ? 0 : below / {self.dh} + 1 < {self.kh} ? "
                f"below / {self.dh} + 1 : {self.kh};"]

    def inner_rows(self, oh: int) -> range:
        """The output rows whose every tap reads image rows (a contiguous run, maybe empty)."""
        return _run([r for r in range(oh) if all(self.rows_valid(r))])

    def inner_cols(self, ow: int) -> range:
        """The output columns whose every tap reads image columns."""
        return _run([c for c in range(ow) if all(self.cols_valid(c))])


def _run(ascending: list[int]) -> range:
    return range(ascending[0], ascending[-1] + 1) if ascending else range(0)


@dataclass(frozen=True)
class StoreEpilogue:
    """A conv block's epilogue (c_conv_block.py) applied to each output value in registers as
    its unit stores it, where a second pass would read back what the unit just wrote. A unit
    sums all its taps (every input channel) before it stores, so what it stores is final.

    `params`: the unit's extra C parameters; `args`: the arguments a call passes for them;
    `decls`: the unit's first lines (its residual inputs bound, the sizes the expressions
    use); `element(value, dest, o, p, idx)`: the lines that store the epilogue of `value`
    (output channel `o`, pixel `p` of the image, blocked index `idx`, C expressions) to
    `dest`."""

    params: str
    args: str
    decls: tuple[str, ...]
    element: Callable[[str, str, str, str, str], list[str]]


def channel_block(dtype: np.dtype) -> int:
    """The blocked layout's channels per block: one 512-bit vector of the compute type (the
    256-bit code's vectors cover half a block)."""
    return 8 if C_COMPUTE[dtype] == "double" else 16


def row_steps(oh: int, ow: int, most: int) -> int:
    """How many row steps a unit of at most `most` pixels a block walks: a piece of a unit
    (its rows split over threads, c_window's b1 split) is a range of them. A small image
    (FLAT_PIXELS) is one step, whole rows oh / r, row segments oh; each step is the same
    number of output pixels (`{name}_RP` in the source: oh * ow / steps), a unit's channel
    vectors `{name}_UV`."""
    if oh * ow <= FLAT_PIXELS:
        return 1
    if ow <= most:
        return oh // max(d for d in range(1, min(most // ow, oh) + 1) if oh % d == 0)
    return oh


def planes_by_whole_vector(step: int, nb: int, st: str, og: int, plane: int, out: str
                           ) -> list[str]:
    """The NCHW stores of a pixel block's `step` accumulators (acc{u}[b], VL lanes of channels
    (oc + u) * VL on) where the group's `og` channels are not whole vectors: a vector whose
    lanes are all channels goes pixel by pixel (the transpose in registers, as where every
    vector is whole), the one that holds the last channels channel by channel with a lane
    bound. The test is per vector, outside the lane loops (a lane test inside them made gcc's
    compile time minutes). Against every vector channel by channel (each lane extracted alone),
    1x1 + bias + ReLU, one thread, 7 alternating rounds (Zen 5): 16->72 at 56x56 0.89x (batch
    1) and 0.89x (batch 8), 24->88 at 28x28 0.87x / 0.84x, 32->24 at 30x30 0.90x."""
    lines: list[str] = []
    for u in range(step):
        lines += [f"  if ((oc + {u} + 1) * VL <= {og}) {{",
                  f"    for (int64_t b = 0; b < {nb}; ++b) {{",
                  f"      {st} *restrict at = on + (gi * {og} + (oc + {u}) * VL) * {plane}LL"
                  f" + {out} + b;",
                  f"      for (int64_t l = 0; l < VL; ++l) at[l * {plane}LL] = "
                  f"({st})acc{u}[b][l];",
                  "    }",
                  "  } else {",
                  "    #pragma GCC unroll 1",
                  "    for (int64_t l = 0; l < VL; ++l) {",
                  f"      const int64_t oi = (oc + {u}) * VL + l;",
                  f"      if (oi >= {og}) break;",
                  f"      {st} *restrict orow = on + (gi * {og} + oi) * {plane}LL + {out};",
                  f"      for (int64_t b = 0; b < {nb}; ++b) orow[b] = ({st})acc{u}[b][l];",
                  "    }",
                  "  }"]
    return lines


def conv_units(name: str, fill: str, unit: str, vt: str, ct: str, st: str, tile: ConvTile,
                fill_kind: str, layout: ConvLayout, *, store: StoreEpilogue | None = None,
                border: BorderTaps | None = None, c: int, h: int, wd: int, hp: int,
                wp: int, pt: int, pl: int, cg: int, og: int, o: int, taps: int, oh: int,
                ow: int, sh: int, sw: int, fsh: int, fsw: int) -> list[str]:
    """The per-image pieces a convolution's image function calls: `fill` copies input channel
    ci into the zero-bordered plane, `unit` computes piece `piece` of `pieces` of one unit of
    the output (`{name}_NU` units per group, each `{name}_RS` row steps that pieces split), so
    that threads can share an image's units when a batch is too small to share out by images.

    `fill_kind` (conv_parts): "pad" copies the input into a zero-bordered plane of hp x wp,
    "sample" copies pixels (i * fsh, j * fsw) of a 1x1 convolution into a stride-1 plane of
    hp x wp = oh x ow, "none" has no fill (the units read the input). `sh`, `sw`: the strides
    the units read the scratch with. `layout`: blocked input makes the scratch blocked (`fill`
    then copies channel block ci, every offset scales by the block); blocked output stores
    each accumulator's lanes as one run of a pixel's channels.

    A unit is one channel block of VL channels (one vector lane per output channel), or with
    AVX-512's 32 registers the tile's channel vectors (conv_tile.py; each broadcast pixel then
    feeds that many multiply-adds), fewer in a group's last unit. Its pixels
    go in blocks whose offsets in the scratch plane are constants of the source (each
    multiply-add reads its broadcast pixel at a fixed displacement: one load, where a computed
    offset table costs a second): whole rows when a row fits the accumulators (r rows, the
    most that divide oh), else equal segments of a row. Every output sums its taps in tap
    order on each path (here and in c_depthwise.pixel_units), so results do not depend on the
    path."""
    border = border if SKIP_BORDER_TAPS and border is not None and \
        border.kh * border.kw <= SKIP_MAX_KERNEL_TAPS else None
    rows_read_border = border is not None and len(border.inner_rows(oh)) < oh
    if fill_kind == "pad":
        rows, cols, row_step, col_step = h, wd, 1, 1
    else:  # "sample" (and "none", which never calls it)
        rows, cols, row_step, col_step, pt, pl = oh, ow, fsh, fsw, 0, 0
    px = layout.block if layout.input_blocked else 1
    bk = layout.block
    # Stored through the epilogue only where the output is blocked: each accumulator's lanes
    # are then one run of channels, so per-channel values and a residual are vector loads
    # (to NCHW planes the lane-by-lane stores with the epilogue took the stem 3.4x the time).
    assert store is None or layout.output_blocked, "a store epilogue needs blocked output"
    lines = [] if fill_kind == "none" else [
        f"static inline void {fill}(const {st} *restrict xn, {ct} *restrict xp, int64_t ci) {{",
        f"  for (int64_t i = 0; i < {rows}; ++i) {{",
        f"    {ct} *row = xp + ((ci * {hp} + i + {pt}) * {wp} + {pl}) * {px};",
        f"    const {st} *src = xn + (ci * {h} + i * {row_step}) * {wd * px}LL;",
        f"    for (int64_t j = 0; j < {cols}; ++j)",
        f"      for (int64_t l = 0; l < {px}; ++l) row[j * {px} + l] = "
        f"({ct})src[j * {col_step * px} + l];",
        "  }",
        "}"]

    def output_index(step: int, out: str) -> list[str]:
        # Where the unit's channel vector u of pixel `out` + b lies in the blocked output
        # (`i{u}`; its first channel `ch{u}`).
        return [line for u in range(step) for line in (
            f"    const int64_t ch{u} = (oc + {u}) * VL;",
            f"    const int64_t i{u} = ((ch{u} / {bk}) * {oh * ow}LL + {out} + b)"
            f" * {bk} + ch{u} % {bk};")]

    def taps_of_channels(step: int, ahead: int) -> list[str]:
        # The head of a border-aware block's loop over input channels: the channel's weights
        # `wc` (its kernel's taps in order, `step` vectors each) and its plane's first tap `xc`.
        assert border is not None
        kk = border.kh * border.kw
        return [f"  for (int64_t ci = 0; ci < {cg}; ++ci) {{",
                f"    const {vt} *restrict wc = wg + ci * {kk * step}LL;",
                f"    const {ct} *xc = xt0 + {name}_taps[ci * {kk}];",
                *([f"    __builtin_prefetch(&wc[{(k + ahead) * step + u}], 0, 2);"
                   for k in range(kk) for u in range(step)] if ahead else [])]

    def one_tap(step: int, x: str, w: str, pixels: list[int], offsets: list[int],
                pad: str) -> list[str]:
        # One tap's multiply-adds over `pixels`, its input at `x` (+ each pixel's offset),
        # its weight vectors at `w`. The empty asm hides from gcc that two taps read the same
        # input (pixel b's tap (i, j + 1) is pixel b + 1's (i, j)): it kept those broadcasts in
        # registers from tap to tap and spilled accumulators to the stack.
        return [f"{pad}{{", f"{pad}  const {ct} *xk = {x};", f'{pad}  __asm__("" : "+r"(xk));',
                *[f"{pad}  const {vt} w{u} = {w}[{u}];" for u in range(step)],
                *[f"{pad}  acc{u}[{b}] += xk[{offsets[b]}] * w{u};"
                  for b in pixels for u in range(step)], f"{pad}}}"]

    def border_taps(step: int, offsets: list[int], valid: list[tuple[bool, ...]],
                    ahead: int) -> list[str]:
        # A block's taps channel by channel, each of the kernel's taps unrolled over just the
        # pixels that read the image with it (`valid`: per pixel, per tap; constant
        # displacements from the channel's plane); in tap order, as the table loop, so the
        # sums are the table loop's.
        assert border is not None
        lines = taps_of_channels(step, ahead)
        for k in range(border.kh * border.kw):
            pixels = [b for b, v in enumerate(valid) if v[k]]
            i, j = divmod(k, border.kw)
            if pixels:
                lines += one_tap(step, f"xc + {(i * border.dh * wp + j * border.dw) * px}",
                                 f"(wc + {k * step})", pixels, offsets, "    ")
        return lines + ["  }"]

    def border_rows(step: int, offsets: list[int], valid: list[tuple[bool, ...]],
                    ahead: int) -> list[str]:
        # A block of one output row `k` (a C variable): the kernel rows that read image rows
        # (BorderTaps.row_range) in a loop, each row's taps unrolled over the pixels whose
        # columns read the image with it (`valid`: per pixel, per kernel column).
        assert border is not None
        lines = [*border.row_range("k"), *taps_of_channels(step, ahead),
                 "    for (int64_t i = i0; i < i1; ++i) {",
                 f"      const {vt} *restrict wi = wc + i * {border.kw * step};",
                 f"      const {ct} *xi = xc + i * {border.dh * wp * px};"]
        for j in range(border.kw):
            pixels = [b for b, v in enumerate(valid) if v[j]]
            if pixels:
                lines += one_tap(step, f"xi + {j * border.dw * px}", f"(wi + {j * step})",
                                 pixels, offsets, "      ")
        return lines + ["    }", "  }"]

    def pixel_block(step: int, nb: int, base: str, offsets: list[int], out: str,
                    by_pixel: bool, chunked: bool = False,
                    coords: list[tuple[int | None, int]] | None = None) -> list[str]:
        # `coords`: each pixel's (row, column) in the output, the row None where it is C's
        # `k` (a block of one row): where `border` makes some of its taps read the zero
        # border, the block skips them (border_taps; border_rows for a row at run time).
        accs = [f"acc{u}" for u in range(step)]
        ahead = PREFETCH_TAPS if o * taps * (8 if ct == "double" else 4) >= PREFETCH_MIN_BYTES \
            else 0
        table = ", ".join(str(v) for v in offsets)
        zero = [f"  for (int64_t b = 0; b < {nb}; ++b) {{ "
                + " ".join(f"{a}[b] = ({vt}){{0}};" for a in accs) + " }"]
        if chunked:  # the sums of the earlier chunks of taps, where the unit left them
            zero = ["  if (kc == 0) {", *zero, "  } else {",
                    f"  #pragma GCC unroll {nb}", f"  for (int64_t b = 0; b < {nb}; ++b) {{",
                    *output_index(step, out),
                    *[f"    __builtin_memcpy(&acc{u}[b], on + i{u}, sizeof({vt}));"
                      for u in range(step)], "  }", "  }"]
        at_run = coords is not None and coords[0][0] is None  # the block's row: C's `k`
        valid = [] if border is None or coords is None else \
            [border.cols_valid(q) for _, q in coords] if at_run else \
            [border.valid(r, q) for r, q in coords if r is not None]
        if any(not all(v) for v in valid) or (at_run and rows_read_border):
            assert not chunked, "a padded convolution's units are not chunked"
            block = [f"{{  /* {nb} pixels, border taps left out */",
                     f"  const {ct} *xt0 = {base};",
                     f"  {vt} {', '.join(f'{a}[{nb}]' for a in accs)};", *zero,
                     *(border_rows(step, offsets, valid, ahead) if at_run else
                       border_taps(step, offsets, valid, ahead))]
        else:
            block = [f"{{  /* {nb} pixels */",
                     f"  static const int32_t po[{nb}] = {{{table}}};",
                     f"  const {ct} *xt0 = {base};",
                     f"  {vt} {', '.join(f'{a}[{nb}]' for a in accs)};",
                     *zero,
                     "  for (int64_t t = t0; t < t1; ++t) {" if chunked else
                     f"  for (int64_t t = 0; t < {taps}; ++t) {{",
                     *[f"    const {vt} w{u} = wg[t * {step} + {u}];" for u in range(step)],
                     *([f"    __builtin_prefetch(&wg[(t + {ahead}) * {step} + {u}], 0, 2);"
                        for u in range(step)] if ahead else []),
                     f"    const {ct} *xt = xt0 + {name}_taps[t];",
                     f"    for (int64_t b = 0; b < {nb}; ++b) {{",
                     f"      const {ct} v = xt[po[b]];",
                     *[f"      acc{u}[b] += v * w{u};" for u in range(step)],
                     "    }",
                     "  }"]
        by_channel = []
        if layout.output_blocked:  # each pixel's lanes are one run of the output (o % B == 0)
            # Unrolled, so that each accumulator stays a register (a loop over b indexes the
            # accumulator arrays, which then live on the stack).
            by_blocks = [f"  #pragma GCC unroll {nb}", f"  for (int64_t b = 0; b < {nb}; ++b) {{",
                         *output_index(step, out)]
            for u in range(step):
                by_blocks.append(f"    {st} *restrict at{u} = on + i{u};")
                if store is None:
                    by_blocks.append(
                        f"    for (int64_t l = 0; l < VL; ++l) at{u}[l] = ({st})acc{u}[b][l];")
                else:  # the lanes are one run of channels: vectors of `pre` and residuals
                    # (the accumulator copied out first: indexed lane by lane in the loop,
                    # gcc kept every accumulator of the block on the stack)
                    by_blocks += [f"    const {vt} a{u} = acc{u}[b];",
                                  "    #pragma omp simd", "    for (int64_t l = 0; l < VL; ++l)",
                                  *["      " + x for x in store.element(
                                      f"a{u}[l]", f"at{u}[l]", f"ch{u} + l",
                                      f"{out} + b", f"i{u} + l")]]
            by_blocks.append("  }")
            if chunked:  # sums of a chunk but the last go back to the output unfinished
                by_blocks = [
                    "  if (kc + 1 < KC) {", f"  #pragma GCC unroll {nb}",
                    f"  for (int64_t b = 0; b < {nb}; ++b) {{", *output_index(step, out),
                    *[f"    __builtin_memcpy(on + i{u}, &acc{u}[b], sizeof({vt}));"
                      for u in range(step)], "  }", "  } else {", *by_blocks, "  }"]
            return ["      " + line for line in block + by_blocks + ["}"]]
        for u in range(step):
            # Channel by channel, a contiguous run of the output per channel (3-6% faster than
            # by pixel for 3x3 64ch at 56x56). Rolled: unrolled, each block's 16 lanes x
            # pixels of stores tripled compile time.
            by_channel += ["  #pragma GCC unroll 1", "  for (int64_t l = 0; l < VL; ++l) {",
                           f"    const int64_t oi = (oc + {u}) * VL + l;",
                           f"    if (oi >= {og}) break;",
                           f"    {st} *restrict orow = on + (gi * {og} + oi) * {oh * ow}LL"
                           f" + {out};",
                           f"    for (int64_t b = 0; b < {nb}; ++b)"
                           f" orow[b] = ({st})acc{u}[b][l];",
                           "  }"]
        if not by_pixel:
            return ["      " + line for line in block + by_channel + ["}"]]
        # Pixel by pixel, each accumulator's lanes across the channel planes: gcc vectorises
        # this as a transpose in registers (vpermt2ps), where channel by channel with a
        # variable lane it extracts every element alone (valignd + vmovss): that cost the digits
        # CNN's 8x8 convolutions (9 to 144 taps) a third of their time. Only when every lane
        # is a channel: with a lane test gcc's compile time went from 2 s to minutes.
        by_pixel_lines = [f"  for (int64_t b = 0; b < {nb}; ++b) {{"]
        for u in range(step):
            by_pixel_lines += [
                f"    {st} *restrict at{u} = on + (gi * {og} + (oc + {u}) * VL) * {oh * ow}LL"
                f" + {out} + b;",
                f"    for (int64_t l = 0; l < VL; ++l)"
                f" at{u}[l * {oh * ow}LL] = ({st})acc{u}[b][l];"]
        by_pixel_lines.append("  }")
        return ["      " + line for line in block + [
            f"#if {og} % {vl} == 0", *by_pixel_lines,
            "#else", *planes_by_whole_vector(step, nb, st, og, oh * ow, out), "#endif", "}"]]

    def blocks(step: int, most: int, vector_bytes: int) -> list[str]:
        # Piece `piece` of `pieces` takes row steps [s0, s1) (row_steps: all of a small image
        # in piece 0).
        steps = row_steps(oh, ow, most)
        head = [f"    const {vt} *wg = wt + {name}_wi(gi, oc, 0);",
                f"    const int64_t s0 = {steps}LL * piece / pieces, "
                f"s1 = {steps}LL * (piece + 1) / pieces;"]
        if oh * ow <= FLAT_PIXELS:
            head.append("    if (s0 == s1) return;")
        chunk = tap_chunk(taps, step * vector_bytes, px, tile.chunk_bytes) \
            if fill_kind != "pad" and layout.output_blocked and st == ct else taps
        chunked = chunk < taps
        body: list[str] = []
        if oh * ow <= FLAT_PIXELS:  # a small image: equal blocks of the whole image, unrolled
            blocks_n = -(-(oh * ow) // most)
            size, extra = divmod(oh * ow, blocks_n)
            q0 = 0
            for i in range(blocks_n):
                nb = size + (i < extra)
                offsets = [(((q0 + b) // ow) * sh * wp + ((q0 + b) % ow) * sw) * px
                           for b in range(nb)]
                body += pixel_block(step, nb, "xg", offsets, str(q0), True, chunked,
                                    [divmod(q0 + b, ow) for b in range(nb)])
                q0 += nb
        elif ow <= most:  # whole rows
            r = max(d for d in range(1, min(most // ow, oh) + 1) if oh % d == 0)
            nb = r * ow
            offsets = [((b // ow) * sh * wp + (b % ow) * sw) * px for b in range(nb)]
            body += [f"    for (int64_t k = s0 * {r}; k < s1 * {r}; k += {r})",
                     *pixel_block(step, nb, f"xg + k * {sh * wp * px}LL", offsets, f"k * {ow}",
                                  True, chunked, [(None, b) for b in range(nb)] if r == 1
                                  else None)]
        else:  # equal segments of a row, then the remainder
            # Few taps a pixel (1x1 convolutions of few input channels) leave the stores a
            # large share: there the transpose in registers wins.
            by_pixel = taps <= SEGMENT_BY_PIXEL_TAPS
            segments = -(-ow // most)
            nb = -(-ow // segments)
            full, tail = divmod(ow, nb)
            inner = border.inner_cols(ow) if border is not None else range(ow)
            ok = [q for q in range(full) if q * nb in inner and q * nb + nb - 1 in inner]
            ja, jb = (ok[0], ok[-1] + 1) if ok else (0, 0)

            def segment(j0: str, q0: int, nb: int) -> list[str]:
                return pixel_block(step, nb, f"xg + k * {sh * wp * px}LL + {j0} * {sw * px}",
                                   [b * sw * px for b in range(nb)], f"k * {ow} + {j0}",
                                   by_pixel, chunked, [(None, q0 + b) for b in range(nb)])
            # The segments whose columns read the border one by one, the others in a loop.
            body += ["    for (int64_t k = s0; k < s1; ++k) {",
                     *[line for q in range(full) if not ja <= q < jb
                       for line in segment(str(q * nb), q * nb, nb)]]
            if ja < jb:
                body += [f"      for (int64_t j0 = {ja * nb}; j0 < {jb * nb}; j0 += {nb})",
                         *segment("j0", ja * nb, nb)]
            if tail:
                body += segment(str(full * nb), full * nb, tail)
            body.append("    }")
        if not chunked:
            return head + body
        # Chunks of taps whose weights stay in L1 (tap_chunk), each over the whole piece.
        kc = -(-taps // chunk)
        return head + [f"    enum {{ KC = {kc} }};",
                       "    for (int64_t kc = 0; kc < KC; ++kc) {",
                       f"    const int64_t t0 = kc * {chunk}LL, "
                       f"t1 = t0 + {chunk} < {taps} ? t0 + {chunk} : {taps};",
                       *body, "    }"]

    vl = f"(GK_VBYTES / {8 if ct == 'double' else 4})"  # {name}_VL for the preprocessor
    # The 512-bit code's units: the tile's channel vectors, the group's last unit the rest.
    vectors, pixels = tile.resolved()
    blocks_512 = -(-og // (64 // (8 if ct == "double" else 4)))
    rest = blocks_512 % vectors
    if blocks_512 >= vectors and rest:
        units_512 = [f"  if (oc + {vectors} <= OC) {{", *blocks(vectors, pixels, 64),
                     "  } else {", *blocks(rest, tile.partial(rest), 64), "  }"]
    elif rest:
        units_512 = ["  {", *blocks(rest, tile.partial(rest), 64), "  }"]
    else:
        units_512 = ["  {", *blocks(vectors, pixels, 64), "  }"]
    return lines + [
        "#if GK_PB == 16",
        f"enum {{ {name}_NU = ({name}_OC + {vectors - 1}) / {vectors}, {name}_UV = {vectors}, "
        f"{name}_RS = {row_steps(oh, ow, pixels)}, "
        f"{name}_RP = {oh * ow // row_steps(oh, ow, pixels)} }};",
        "#else",
        f"enum {{ {name}_NU = {name}_OC, {name}_UV = 1, {name}_RS = {row_steps(oh, ow, 8)}, "
        f"{name}_RP = {oh * ow // row_steps(oh, ow, 8)} }};",
        "#endif",
        f"static void {unit}(const {ct} *restrict xp, const {vt} *restrict wt, "
        f"{st} *restrict on, int64_t gi, int64_t u, int64_t piece, int64_t pieces"
        f"{'' if store is None else store.params}) {{",
        *CLANG_CONTRACT,
        *(store.decls if store is not None else ()),
        f"  enum {{ VL = {name}_VL, OC = {name}_OC }};",
        f"  const {ct} *restrict xg = xp + gi * {cg * hp * wp}LL;",
        "#if GK_PB == 16",
        f"  const int64_t oc = {vectors} * u;",
        *units_512,
        "#else",
        "  const int64_t oc = u;",
        "  {",
        *blocks(1, 8, 32),
        "  }",
        "#endif",
        "}"]
