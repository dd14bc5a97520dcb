"""Window ops as generated C: Conv2D (and the compiler's Conv2DFoldedBN), MaxPool and AvgPool,
NCHW, with their geometry (kernel, stride, dilation, padding, groups) and sizes in the source.

A convolution is a direct one, no im2col matrix: per image, the input is copied once into a
zero-bordered scratch plane (so no tap tests bounds). Each block of output pixels keeps one
vector accumulator of output channels per pixel (one lane per channel, gcc's vector extension:
16 float lanes with AVX-512) while it walks the taps (channel, kh, kw): one weight vector load
and a broadcast multiply-add per pixel per tap, in registers; the pixels' offsets are constants
of the source (whole rows of a narrow output, equal segments of a wide row). With AVX-512 two
channel blocks go together. A group of few output channels (a depthwise convolution) turns the
vectors along pixels instead, over a scratch split into the stride's phases (c_depthwise.py) so
that every tap reads runs of consecutive elements. The weights are repacked, each unit of
work's in one run (with Conv2DFoldedBN's scale gamma / sqrt(var + eps) applied), into the
plan's workspace (runtime/plan.py Workspace), and again only when a weight's version or array
changed since. Images share out over OpenMP threads when the call is large enough; a batch too
small for that shares one image's units of work instead. float16 computes in float32 and rounds
once, as the numpy reference does. Sums run in tap order, not BLAS's: results differ from the
reference by rounding only.

The channel-vector units and the blocked layout are in c_conv_units.py. Pools and their
gradients are in c_pool.py, a grouped convolution's filter gradient in c_filter_grad.py; the
loop over images both share is in c_images.py.

Only the batch axis may be dynamic (its size is an argument, backends/c/shape_args.py); anything
else stays the op's numpy reference (`why_not_window_kernel` says why)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.backends.c import onednn_choice
from graphkernel.backends.c.c_conv_units import (
    NCHW,
    BorderTaps,
    ConvLayout,
    StoreEpilogue,
    channel_block,
    conv_units,
    row_steps,
)
from graphkernel.backends.c.c_depthwise import SCRATCH_SLACK, PhasePlanes, pixel_units
from graphkernel.backends.c.c_depthwise_blocked import (
    DepthwiseGeometry,
    depthwise_channel_parts,
    depthwise_form,
    is_plain_depthwise,
)
from graphkernel.backends.c.c_filter_grad import filter_grad_kernel
from graphkernel.backends.c.c_images import batch_after, channel_image, image_loop
from graphkernel.backends.c.c_loops import Buffer, KernelSource
from graphkernel.backends.c.c_pool import (
    POOL_GRAD_STACK_BYTES,
    pool_grad_kernel,
    pool_grad_scratch_bytes,
    pool_kernel,
    why_not_blocked_pool,
)
from graphkernel.backends.c.c_text import (
    C_COMPUTE,
    C_STORAGE,
    c_comment,
    index_kernel_options,
    literal,
)
from graphkernel.backends.c.config import CConfig
from graphkernel.backends.c.conv_tile import RULE_TILE, ConvTile
from graphkernel.backends.c.onednn_choice import ONEDNN_DECLS, ConvChoice, onednn_lines
from graphkernel.ir import types as T
from graphkernel.ir.graph import Node
from graphkernel.ir.opdefs.nn import conv_geometry
from graphkernel.ir.opset import Window, get_op
from graphkernel.ir.types import SymSize, TensorType
from graphkernel.runtime.plan import WORKSPACE_HEADER_BYTES

# Weights of at least this many elements repack on the OpenMP threads.
REPACK_PARALLEL_MIN = 1 << 16
# Below this many output channels per group a convolution vectorises along pixels (c_depthwise).
PIXEL_PATH_CHANNELS = 4

# Shared by every window kernel of a translation unit: the vector width and pixel block (16
# accumulators of 16 floats fill half of AVX-512's registers; AVX2 has 16 registers of 8).
WINDOW_TYPES = """\
#ifndef GK_WINDOW_TYPES
#define GK_WINDOW_TYPES
#include <stdlib.h>
int omp_get_num_threads(void);
#if defined(__AVX512F__)
#define GK_VBYTES 64
#define GK_PB 16
#else
#define GK_VBYTES 32
#define GK_PB 8
#endif
typedef float gk_vfloat __attribute__((vector_size(GK_VBYTES), aligned(4)));
typedef double gk_vdouble __attribute__((vector_size(GK_VBYTES), aligned(8)));
/* A workspace's header (runtime/plan.py WORKSPACE_HEADER_BYTES, the runner fills `version`):
   its contents are current when computed from these same sources at these same versions. */
typedef struct {
  int64_t *version[3];
  int64_t packed[3];
  const void *source[3];
  int64_t valid;
} gk_pack_header;
#define GK_PACK_HEADER @HEADER@
_Static_assert(sizeof(gk_pack_header) <= GK_PACK_HEADER, "the workspace header's size");
static inline int gk_pack_fresh(const gk_pack_header *h, const void *const *src, int n,
                                int64_t *seen) {
  int fresh = h->valid != 0;
  for (int i = 0; i < n; ++i) {
    seen[i] = h->version[i] != NULL ? *h->version[i] : 0;
    if (h->version[i] == NULL || h->source[i] != src[i] || h->packed[i] != seen[i]) fresh = 0;
  }
  return fresh;
}
static inline void gk_pack_done(gk_pack_header *h, const void *const *src, int n,
                                const int64_t *seen) {
  for (int i = 0; i < n; ++i) { h->packed[i] = seen[i]; h->source[i] = src[i]; }
  h->valid = 1;
}
#endif
""".replace("@HEADER@", str(WORKSPACE_HEADER_BYTES))


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
    window = get_op(node.op).window
    if window is Window.CONVOLUTION and \
            any(isinstance(d, SymSize) for v in node.inputs[1:] for d in v.shape):
        return "dynamic weights"
    if 0 in [d for d in (*x.shape, *out.shape) if isinstance(d, int)]:
        return "an empty tensor"
    if window is Window.FILTER_GRAD:
        if any(isinstance(d, SymSize) for v in node.inputs for d in v.shape):
            return "a dynamic size"
        if node.attrs.get("group", 1) == 1:  # expanded with fusion on (grad_expanders.py)
            return "an ungrouped filter gradient"
    if window is Window.POOL_GRAD and pool_grad_scratch_bytes(x) > POOL_GRAD_STACK_BYTES:
        return f"a float16 plane's sums exceed {POOL_GRAD_STACK_BYTES >> 10} KiB of stack"
    return None


def why_not_blocked(conv: Node, side: str) -> str | None:
    """Why this convolution's kernel cannot read (`side` "input") or write ("output") the
    blocked channel layout; None when it can."""
    why = why_not_window_kernel(conv)
    if why is None and get_op(conv.op).window is Window.POOL:
        return why_not_blocked_pool(conv, channel_block(conv.dtype))
    if why is not None or get_op(conv.op).window is not Window.CONVOLUTION:
        return why or "not a convolution or pool"
    x, w = conv.inputs[0].shape, conv.inputs[1].shape
    g = x[1] // w[1]
    depthwise = is_plain_depthwise(x[1], conv.shape[1], g)
    if conv.shape[1] // g < PIXEL_PATH_CHANNELS and not depthwise:
        # The pixel path's vectors run along a plane's pixels; only a plain depthwise
        # convolution (one channel a group) has channel-vectored units (c_depthwise_blocked).
        return f"{g} groups of {conv.shape[1] // g} output channels from {w[1]} (its kernel " \
               "reads and writes channel planes)"
    if g != 1 and not depthwise:  # a group's channel vectors would start inside a block
        return f"{g} groups (its kernel reads and writes channel planes)"
    channels = x[1] if side == "input" else conv.shape[1]
    block = channel_block(conv.dtype)
    if channels % block:
        return f"{channels} {side} channels, not a multiple of the block ({block})"
    if conv_library(conv).onednn is not None:
        return "oneDNN runs it (its own layouts)"
    return None


def conv_form(conv: Node, input_blocked: bool, output_blocked: bool) -> str | None:
    """Which units a plain depthwise convolution's kernel runs in these layouts, and why
    (c_depthwise_blocked.depthwise_form); None for any other convolution (one form)."""
    if why_not_window_kernel(conv) is not None or \
            get_op(conv.op).window is not Window.CONVOLUTION:
        return None
    x, w = conv.inputs[0].shape, conv.inputs[1].shape
    if not is_plain_depthwise(x[1], conv.shape[1], x[1] // w[1]):
        return None
    xt, wt = conv.inputs[0].tensor_type, conv.inputs[1].tensor_type
    geo = conv_geometry(TensorType(xt.shape, xt.dtype), TensorType(wt.shape, wt.dtype),
                        {**get_op(conv.op).attr_defaults, **conv.attrs})
    return depthwise_form(conv.shape[2] * conv.shape[3], w[2] * w[3],
                          tuple(geo["stride"]) != (1, 1), input_blocked, output_blocked)[1]


def emit_window_kernel(node: Node, name: str, threshold: int, workspace: bool = False,
                       library_choice: bool = True, tile: ConvTile = RULE_TILE,
                       layout: ConvLayout = NCHW) -> KernelSource:
    """The C of `node` (a window op `why_not_window_kernel` accepts) as kernel `name`; its
    argv: the node's inputs, a convolution's workspace (`workspace`, which a convolution
    needs: `workspace_bytes`), its output, then the batch size when it is dynamic. Images run
    on OpenMP threads when their multiply-adds reach `threshold`. A convolution runs on
    oneDNN where `conv_library` chose it (`library_choice`; else our code alone). `tile`: the
    register tile of its units (conv_tile.py); `layout`: its input's and output's (NCHW or
    blocked, which oneDNN never gets)."""
    attrs = {**get_op(node.op).attr_defaults, **node.attrs}
    head = WINDOW_TYPES
    if get_op(node.op).window is Window.CONVOLUTION:
        assert workspace, "a convolution kernel keeps its repacked weights in a workspace"
        choice = conv_library(node) if library_choice and layout == NCHW else None
        lines = _conv(node, name, attrs, threshold, choice, tile, layout)
        head += ONEDNN_DECLS if choice is not None and choice.onednn is not None else ""
    elif get_op(node.op).window is Window.FILTER_GRAD:
        lines = filter_grad_kernel(node, name, attrs, threshold)
    elif get_op(node.op).window is Window.POOL_GRAD:
        lines = pool_grad_kernel(node, name, attrs, threshold)
    else:  # a pool reads and writes one layout (conv_layout.py)
        assert layout.input_blocked == layout.output_blocked, layout
        lines = pool_kernel(node, name, attrs, threshold,
                            layout.block if layout.input_blocked else 0)
    buffers = [Buffer(v, tuple(v.shape), False, i) for i, v in enumerate(node.inputs)]
    buffers.append(Buffer(node, tuple(node.shape), True, 0))
    return KernelSource(name, head + "\n".join(lines) + "\n", buffers)


def conv_library(conv: Node) -> ConvChoice:
    """Which library runs this convolution kernel: oneDNN where it is installed and was timed
    faster for the shape on this CPU (by `tune_conv_libraries`), else our code
    (backends/c/onednn_choice.py). Nothing is timed here."""
    return onednn_choice.choose(conv)


def tune_conv_libraries(convs: list[Node], level: int) -> None:
    """Time these convolution kernels on our code and on oneDNN where no timing is stored
    (`--online_tuning=level`), for `conv_library` (onednn_choice.tune)."""
    onednn_choice.tune(convs, _own_kernel, level)


def _own_kernel(conv: Node, name: str) -> tuple[KernelSource, int]:
    """Our convolution alone, for timing against oneDNN's."""
    return (emit_window_kernel(conv, name, CConfig().window_parallel_min_macs, True, False),
            _own_workspace_bytes(conv))


def workspace_bytes(conv: Node, library_choice: bool = True) -> int:
    """Bytes of a convolution kernel's workspace: the header, then its repacked weights (ours
    or, with `library_choice`, oneDNN's where it runs the kernel)."""
    own = _own_workspace_bytes(conv)
    chosen = conv_library(conv).onednn if library_choice else None
    return own if chosen is None else max(own, WORKSPACE_HEADER_BYTES + chosen.weights_bytes)


def _own_workspace_bytes(conv: Node) -> int:
    """Our kernel's workspace: the header, then its repacked weights at the widest vector
    (64 bytes; a narrower one never needs more)."""
    (o, cg, kh, kw), x = conv.inputs[1].shape, conv.inputs[0].shape
    g = x[1] // cg
    size = 8 if C_COMPUTE[conv.dtype] == "double" else 4  # float16 computes in float
    taps = cg * kh * kw
    if o // g < PIXEL_PATH_CHANNELS:  # scalars [channel][tap], in whole vectors
        packed = o * taps * size + 64
        if is_plain_depthwise(x[1], o, g):  # or channel-vectored: [block][tap][64 bytes]
            packed = max(packed, -(-o // channel_block(conv.dtype)) * taps * 64)
    else:
        packed = g * taps * -(-(o // g) // (64 // size)) * 64
    return WORKSPACE_HEADER_BYTES + packed


def prepack(parts: ConvParts, workspace: str, sources: list[str], weights: int) -> list[str]:
    """The lines binding `wt` to the repacked weights in `workspace` (an argv entry), repacked
    only when `sources` (C pointers) or their versions changed since they were packed. Large
    weights repack on the OpenMP threads: the pragma only where there are that many (a small
    convolution would enter the OpenMP runtime for a serial region)."""
    threads = ["  #pragma omp parallel for schedule(static)"] \
        if weights >= REPACK_PARALLEL_MIN else []
    return [f"  {parts.vt} *restrict wt = ({parts.vt} *)((char *){workspace} + GK_PACK_HEADER);",
            f"  gk_pack_header *pack = (gk_pack_header *){workspace};",
            f"  const void *pack_sources[] = {{{', '.join(sources)}}};",
            f"  int64_t pack_seen[{len(sources)}];",
            f"  if (!gk_pack_fresh(pack, pack_sources, {len(sources)}, pack_seen)) {{",
            *threads, *parts.repack,
            f"    gk_pack_done(pack, pack_sources, {len(sources)}, pack_seen);",
            "  }"]


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
    params: str  # the C names of the weights (w, or w, scale, var): the repack's sources
    scratch: int  # elements of the zero-bordered copy xp (0: none, the input is read)
    macs: int  # multiply-adds per image
    in_size: int  # elements per input image
    out_size: int  # elements per output image
    epilogue_inside: bool = False  # `image` runs conv_parts' `epilogue` after each unit


def _conv(node: Node, name: str, attrs: dict[str, Any], threshold: int,
          library: ConvChoice | None = None, tile: ConvTile = RULE_TILE,
          layout: ConvLayout = NCHW) -> list[str]:
    """The kernel: weights repacked into the workspace (args after the inputs) when they
    changed, then image by image. Each thread's zero-bordered scratch plane lives in a buffer
    of the calling (or OpenMP) thread that outlasts the call, allocated on its first call: at
    ResNet sizes a fresh malloc per call page-faulted megabytes each time. The scratch's border
    is zero from its calloc and only its interior is ever written, so it is reused as is. Per
    thread, so calls from several threads never share."""
    parts = conv_parts(node, name, attrs, tile, layout)
    batch, sizes = batch_after(node, len(node.inputs) + 2)
    ct = parts.ct
    xn, on = f"x + n * {parts.in_size}LL", f"out + n * {parts.out_size}LL"
    weights = math.prod(node.inputs[1].shape)
    nin = len(node.inputs)
    lines = parts.statics + ["", f"void {name}(void *const *args) {{", *parts.reads,
                             f"  {parts.st} *restrict out = ({parts.st} *)args[{nin + 1}];",
                             *sizes,
                             *(onednn_lines(node, name, f"args[{nin}]", library.blocked)
                               if library is not None and library.onednn is not None else []),
                             *prepack(parts, f"args[{nin}]", parts.params.split(", "),
                                      weights)]
    scratch = [f"  static __thread {ct} *xp_kept = NULL;",
               f"  if (xp_kept == NULL) xp_kept = ({ct} *)calloc({parts.scratch}, sizeof({ct}));",
               f"  {ct} *xp = xp_kept;"] if parts.scratch else []
    call = f"if (xp != NULL) {parts.image.format(xn=xn, on=on)} else " \
        f"{parts.direct.format(xn=xn, on=on)}" if parts.scratch else \
        parts.image.format(xn=xn, on=on)
    lines += image_loop(call, batch, parts.macs, threshold, scratch, [])
    lines += ["}"]
    return lines


def image_split_note(conv: Node, block: bool, tile: ConvTile = RULE_TILE,
                     in_stores: bool = False) -> str:
    """How a batch of one shares `conv`'s image over the threads (channel_image), for the
    plan's schedule notes; `block`: its kernel is a conv block (the epilogue runs per unit),
    `in_stores`: in the units' stores (c_conv_block.epilogue_in_stores)."""
    x, w = conv.inputs[0].shape, conv.inputs[1].shape
    g, og = x[1] // w[1], conv.shape[1] // (x[1] // w[1])
    if og < PIXEL_PATH_CHANNELS:
        return "a batch of one: the image's channel planes shared over the threads"
    xt, wt = conv.inputs[0].tensor_type, conv.inputs[1].tensor_type
    geo = conv_geometry(TensorType(xt.shape, xt.dtype), TensorType(wt.shape, wt.dtype),
                        {**get_op(conv.op).attr_defaults, **conv.attrs})
    vectors, pixels = unit_tile(tile, geo, og, conv.dtype, math.prod(w[1:])).resolved()
    units = g * -(-og // (channel_block(conv.dtype) * vectors))
    steps = row_steps(conv.shape[2], conv.shape[3], pixels)
    return (f"a batch of one: one parallel region per image, the fill then {units} units of "
            f"{vectors} channel vectors x row pieces (team / gcd(units, team), at most {steps} "
            "row steps: equal work per thread)"
            + ("; the epilogue in each unit's stores" if block and in_stores else
               "; the epilogue in each unit's work item" if block else ""))


def reads_in_place(geo: dict[str, Any], og: int, dtype: np.dtype) -> bool:
    """Whether a convolution's units read its input itself, no scratch (conv_parts): a stride-1
    1x1 without padding, of at least PIXEL_PATH_CHANNELS output channels a group, stored as
    computed."""
    (pt, pb), (pl, pr) = geo["pads"]
    return tuple(geo["kernel"]) == (1, 1) and tuple(geo["stride"]) == (1, 1) and \
        pt == pb == pl == pr == 0 and og >= PIXEL_PATH_CHANNELS and \
        C_STORAGE[dtype] == C_COMPUTE[dtype]


def unit_tile(tile: ConvTile, geo: dict[str, Any], og: int, dtype: np.dtype,
              taps: int) -> ConvTile:
    """`tile` with the rule's channel vectors resolved (ConvTile.for_convolution) for a
    convolution of geometry `geo` (conv_geometry), `og` output channels a group and `taps`
    taps: whether it reads its input in place, its output channel vectors and rows."""
    row = geo["out"][1]
    return tile.for_convolution(reads_in_place(geo, og, dtype), -(-og // channel_block(dtype)),
                                row if isinstance(row, int) else 0, taps)


def conv_parts(node: Node, name: str, attrs: dict[str, Any], tile: ConvTile = RULE_TILE,
               layout: ConvLayout = NCHW, epilogue: str | None = None,
               store: StoreEpilogue | None = None) -> ConvParts:
    """The pieces of `node`'s convolution kernel `name` (a block's too), its channel-vector
    units with register tile `tile`, reading and writing `layout` (why_not_blocked holds).
    `epilogue`: a block's epilogue (c_conv_block.py), a C function over output channels
    [c0, c1) and pixels [p0, p1) of an image, that the channel path's image function calls
    after each unit of work (ConvParts.epilogue_inside); the image call then passes the
    block's `n`, `args` and `pre` on. `store`: the same epilogue applied in the units' registers
    as they store (c_conv_units.StoreEpilogue), not after them; `epilogue` (the C function)
    then serves the slow loop alone."""
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
    # A group of fewer than PIXEL_PATH_CHANNELS output channels (depthwise convolutions) would
    # leave most vector lanes idle with one lane per channel: its vectors run along a row's
    # pixels instead, one output channel at a time.
    pixels_per_lane = og < PIXEL_PATH_CHANNELS
    # Blocked input: the scratch is blocked too, channel ci of pixel q at
    # (ci / B * planes + q) * B + ci % B; every pixel offset scales by B (`px`).
    px = layout.block if layout.input_blocked else 1
    channel_vectored = pixels_per_lane and is_plain_depthwise(c, o, g) and \
        depthwise_form(oh * ow, kh * kw, (sh, sw) != (1, 1), layout.input_blocked,
                       layout.output_blocked)[0]
    assert layout == NCHW or (g == 1 and not pixels_per_lane) or channel_vectored
    # A 1x1 convolution without padding reads input pixels (i * sh, j * sw) alone: its scratch
    # holds just those, as a stride-1 image (a strided one copied the whole input and read every
    # sh-th row of it), or is the input itself where it already is one (stride 1, stored as
    # computed: the copy was a pass over the whole input per image, 12% of a 256->64 1x1 at
    # 56x56). `grid`: the scratch's rows, columns and strides the units read with.
    pointwise = kh == kw == 1 and pt == pb == pl == pr == 0 and not pixels_per_lane
    in_place = reads_in_place(geo, og, x.dtype)
    tile = unit_tile(tile, geo, og, x.dtype, taps)
    fill_kind = "none" if in_place else "sample" if pointwise else "pad"
    gh, gw, gsh, gsw = (oh, ow, 1, 1) if pointwise else (hp, wp, sh, sw)
    p = oh * ow
    epilogue = None if pixels_per_lane else epilogue  # the pixel path's units are channels
    store = store if epilogue is not None else None
    image_extra = f", int64_t n, void *const *args, const {ct} *restrict pre" \
        if epilogue is not None else ""
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
    ops = f"{node.op} {list(x.shape)} * {list(w.shape)} -> {list(node.shape)}, stride " \
          f"{(sh, sw)}, dilation {(dh, dw)}, pads {geo['pads']}, group {g}"
    image, direct = f"{name}_image", f"{name}_direct"
    bk = layout.block
    in_index = f"((((gi * {cg} + ci) / {bk}) * {h} + r) * {wd} + q) * {bk} + " \
        f"(gi * {cg} + ci) % {bk}" \
        if layout.input_blocked else f"((gi * {cg} + ci) * {h} + r) * {wd} + q"
    out_index = f"(((ch / {bk}) * {oh} + i) * {ow} + j) * {bk} + ch % {bk}" \
        if layout.output_blocked else f"(ch * {oh} + i) * {ow} + j"
    fill, unit = f"{name}_fill", f"{name}_unit"
    if channel_vectored:
        return ConvParts(*depthwise_channel_parts(
            name, ops, DepthwiseGeometry(c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow),
            layout if layout != NCHW else ConvLayout(block=channel_block(x.dtype)),
            direct, param_decl, params, scale, in_index, out_index, folded, vt, ct, st))
    units_groups = 1 if pixels_per_lane else g
    if pixels_per_lane:  # scratch in stride phases (PhasePlanes): every tap reads a run
        planes = PhasePlanes(hp, wp, sh, sw)
        tap_offsets = ", ".join(str(planes.offset(ci, i * dh, j * dw))
                                for ci in range(cg) for i in range(kh) for j in range(kw))
    else:
        tap_offsets = ", ".join(str(((ci // px * gh + i * dh) * gw + j * dw) * px + ci % px)
                                for ci in range(cg) for i in range(kh) for j in range(kw))
    lines = [
        f"/* {c_comment(name)}: {c_comment(ops)} */",
        f"enum {{ {name}_VL = GK_VBYTES / (int)sizeof({ct}), "
        f"{name}_OC = ({og} + {name}_VL - 1) / {name}_VL }};",
        f"static const int32_t {name}_taps[{taps}] = {{{tap_offsets}}};",
        # Where channel block oc's weight vector for tap t sits in `wt`: with AVX-512 a unit
        # is the tile's channel vectors (fewer in a group's last), interleaved tap by tap.
        f"static inline int64_t {name}_wi(int64_t gi, int64_t oc, int64_t t) {{",
        "#if GK_PB == 16",
        f"  const int64_t u0 = oc / {tile.resolved()[0]} * {tile.resolved()[0]};",
        f"  const int64_t nv = {name}_OC - u0 < {tile.resolved()[0]} ? {name}_OC - u0 : "
        f"{tile.resolved()[0]};",
        f"  return (gi * {name}_OC + u0) * {taps}LL + t * nv + (oc - u0);",
        "#else",
        f"  return (gi * {name}_OC + oc) * {taps}LL + t;",
        "#endif",
        "}",
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
        f"              acc += ({ct})xn[{in_index}] *",
        f"                     (({ct})w[((ch * {cg} + ci) * {kh} + a) * {kw} + b] * s);",
        "            }",
        f"        on[{out_index}] = ({st})acc;",
        "      }",
        "  }",
        "}",
        # Fused multiply-adds here (the translation unit is built with -ffp-contract=off so
        # that elementwise kernels round as numpy does; a sum of products rounds its own way).
        *index_kernel_options("fp-contract=fast"),
        *(pixel_units(name, fill, unit, vt, ct, st, planes, h=h, wd=wd, pt=pt, pl=pl, cg=cg,
                       og=og, o=o, taps=taps, oh=oh, ow=ow) if pixels_per_lane else
          conv_units(name, fill, unit, vt, ct, st, tile, fill_kind, layout, store=store, c=c,
                      border=BorderTaps(kh, kw, dh, dw, sh, sw, pt, pl, h, wd)
                      if fill_kind == "pad" else None, h=h, wd=wd, hp=gh, wp=gw, pt=pt, pl=pl,
                      cg=cg, og=og, o=o, taps=taps, oh=oh, ow=ow, sh=gsh, sw=gsw, fsh=sh, fsw=sw)),
        *([f"static void {epilogue}({ct} *restrict tile, int64_t n, void *const *args, "
           f"const {ct} *restrict pre, int64_t c0, int64_t c1, int64_t p0, int64_t p1);"]
          if epilogue is not None else []),
        f"static void {image}(const {st} *restrict xn, const {vt} *restrict wt, "
        f"{st} *restrict on, {ct} *restrict xp, int par{image_extra}) {{",
        "#if defined(__clang__)",
        "#pragma clang fp contract(fast)",
        "#endif",
        # The zero-bordered copy (none: the input itself), then the output in units of work
        # that threads share when the caller runs one image at a time (`par`: a batch too
        # small to share out).
        *(["  (void)xp;", f"  const {ct} *restrict xs = (const {ct} *)xn;"]
          if fill_kind == "none" else [f"  const {ct} *restrict xs = xp;"]
          if not pixels_per_lane else [
              "  if (par) {",
              "    #pragma omp parallel for schedule(static)",
              f"    for (int64_t ci = 0; ci < {c // px}; ++ci) {fill}(xn, xp, ci);",
              "  } else {",
              f"    for (int64_t ci = 0; ci < {c // px}; ++ci) {fill}(xn, xp, ci);",
              "  }",
              f"  const {ct} *restrict xs = xp;"]),
        *(channel_image(name, None if fill_kind == "none" else fill, unit, c // px,
                        units_groups, og, epilogue, store and store.args)
          if not pixels_per_lane else [
            f"  for (int64_t gi = 0; gi < {units_groups}; ++gi) {{",
            "    if (par) {",
            "      #pragma omp parallel for schedule(static)",
            f"      for (int64_t u = 0; u < {name}_NU; ++u) {unit}(xs, wt, on, gi, u);",
            "    } else {",
            f"      for (int64_t u = 0; u < {name}_NU; ++u) {unit}(xs, wt, on, gi, u);",
            "    }",
            "  }"]),
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
    if pixels_per_lane:  # scalars [channel][tap]
        repack = [f"  for (int64_t ch = 0; ch < {o}; ++ch) {{",
                  f"    const {ct} s = {scale};",
                  f"    for (int64_t t = 0; t < {taps}; ++t)",
                  f"      (({ct} *)wt)[ch * {taps}LL + t] = ({ct})w[ch * {taps}LL + t] * s;",
                  "  }"]
        wt_count = f"({o * taps}LL + {name}_VL - 1) / {name}_VL"
        return ConvParts(lines, reads, repack, wt_count, vt, ct, st,
                         f"{image}({{xn}}, wt, {{on}}, xp, gk_par);",
                         f"{direct}({{xn}}, {params}, {{on}});", params,
                         c * planes.per_channel + SCRATCH_SLACK, o * p * taps, c * h * wd,
                         o * p)
    # Repacked weights: [group][unit][tap][channel block of the unit] (`{name}_wi`), lanes
    # past the group's channels zero: a unit reads its weights in one contiguous run (a stride
    # of all the channel blocks between taps mapped every tap to a few cache sets).
    repack = [
        # Tap by tap, a whole vector at a time: the reads are VL streams along the weights'
        # rows and the writes contiguous (lane by lane over all taps wrote one element per
        # cache line, VL times over).
        f"  for (int64_t go = 0; go < {g} * (int64_t){name}_OC; ++go) {{",
        f"    const int64_t gi = go / {name}_OC, oc = go % {name}_OC;",
        f"    {ct} s[{name}_VL];",
        f"    const {st} *rows[{name}_VL];",
        f"    for (int64_t l = 0; l < {name}_VL; ++l) {{",
        f"      const int64_t oi = oc * {name}_VL + l, ch = gi * {og} + (oi < {og} ? oi : 0);",
        f"      s[l] = oi < {og} ? {scale} : 0;",
        f"      rows[l] = w + ch * {taps}LL;",
        "    }",
        f"    for (int64_t t = 0; t < {taps}; ++t) {{",
        f"      {vt} v;",
        f"      for (int64_t l = 0; l < {name}_VL; ++l) v[l] = ({ct})rows[l][t] * s[l];",
        f"      wt[{name}_wi(gi, oc, t)] = v;",
        "    }",
        "  }"]
    extra = ", n, args, pre" if epilogue is not None else ""
    return ConvParts(lines, reads, repack, f"{g * taps}LL * {name}_OC", vt, ct, st,
                     f"{image}({{xn}}, wt, {{on}}, {'NULL' if in_place else 'xp'}, gk_par"
                     f"{extra});",
                     f"{direct}({{xn}}, {params}, {{on}});", params,
                     0 if in_place else c * gh * gw, o * p * taps, c * h * wd, o * p,
                     epilogue is not None)
