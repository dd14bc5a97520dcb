"""A convolution, the fused pointwise kernel after it and the pool after that, as one kernel
that works image by image in cache (fusion on).

A conv-BatchNorm-ReLU(-pool) block otherwise writes the convolution's result to memory, reads
it back in the fused kernel (per-channel shift, residual add, ReLU), writes that, and reads it
again in the pool: at batch 256 of a small CNN those are megabytes that leave the L2 cache
between the steps (each step ran at half its cache-hot speed in sequence). Here each image's
convolution goes to a tile on the thread's stack, the epilogue runs over the tile, the pool
reads the tile, and only the block's result reaches memory. The epilogue's per-channel values
(the folded BatchNorm's shift) are computed once per call. Without a pool the tile is the
output's image itself, so real sizes (ResNet's, MobileNetV2's) make blocks too: their scratch
plane is then the thread's kept heap copy, as a convolution's own kernel keeps it, and the
epilogue reads an image just written (in cache up to a few hundred KiB) where a kernel of its
own read the whole batch back from memory.

`conv_blocks` answers lowering (graph_kernel/lower.py, the one place that decides), from the
final graph: a Conv2D/Conv2DFoldedBN with a window kernel whose only reader is a fused
pointwise group of its shape, float32 or float64, whose ops are elementwise over the
convolution's result, tensors of its shape (a residual), per-channel values and scalars; then a
MaxPool/AvgPool that alone reads the group joins too, when an image's result fits the stack.
Each convolution's decision is a note on its node (`conv_block`, in the dumps)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from graphkernel.backends.c.c_conv_units import FLAT_PIXELS, NCHW, ConvLayout, StoreEpilogue
from graphkernel.backends.c.c_images import image_loop
from graphkernel.backends.c.c_loops import Buffer, KernelSource
from graphkernel.backends.c.c_pool import pool_parts
from graphkernel.backends.c.c_text import C_COMPUTE, C_STORAGE, c_comment, literal
from graphkernel.backends.c.c_window import (
    WINDOW_TYPES,
    conv_parts,
    prepack,
    why_not_window_kernel,
)
from graphkernel.backends.c.conv_tile import RULE_TILE, ConvTile
from graphkernel.backends.c.ops import code_for_op, is_number
from graphkernel.backends.c.shape_args import kernel_symbols, read_sizes
from graphkernel.graph_kernel.lower import CONV_BLOCK_NOTE, ConvBlock
from graphkernel.ir import types as T
from graphkernel.ir.graph import Constant, Graph, Node, Value
from graphkernel.ir.opset import PatternKind, Window, get_op

NOTE = CONV_BLOCK_NOTE  # on each convolution: what joined it, or why nothing did
STACK_BYTES = 48 << 10  # per scratch array on a thread's stack (OpenMP threads have >= 2 MiB)
# The epilogue runs on the accumulators as the convolution's units store them
# (c_conv_units.StoreEpilogue), not as a pass over what each unit wrote, for convolutions of
# at most this many taps (input channels x kernel pixels) a unit and more than FLAT_PIXELS
# output pixels (`store_epilogue_rule`); tuning may choose either way per kernel. The pass's
# cost per output is fixed and the convolution's grows with the taps: ResNet-50 b1 on Zen 5,
# one thread, conv steps in registers / second pass: 1x1s of 64 taps 0.90-0.95, of 128
# 0.94-0.97, of 256 0.96-1.04, of 512-1024 0.98-1.02, 3x3s (576+) 0.98-1.02, 1x1s at 7x7
# 1.02-1.05.
STORE_EPILOGUE_MAX_TAPS = 128


def conv_blocks(graph: Graph) -> dict[int, ConvBlock]:
    """Convolution uid -> its block, for every convolution that makes one; each convolution
    gets a note saying what joined it or why nothing did."""
    users = graph.users()
    results = {v.uid for v in graph.results()}
    found: dict[int, ConvBlock] = {}
    for conv in graph.nodes:
        if conv.subgraph is not None or get_op(conv.op).window is not Window.CONVOLUTION:
            continue
        block, why = _block(conv, users, results)
        if block is None:
            conv.notes[NOTE] = f"a kernel of its own: {why}"
            continue
        found[conv.uid] = block
        pool = f" and {block.pool.name}" if block.pool is not None else ""
        apart = f" ({why})" if why else ""
        conv.notes[NOTE] = f"one kernel with {block.epilogue.name}{pool}, image by image{apart}"
    return found


def _only_reader(node: Node, users: dict[int, list[Node]], results: set[int]) -> Node | None:
    readers = users.get(node.uid, [])
    if node.uid in results or len(readers) != 1 or readers[0].inputs.count(node) != 1:
        return None
    return readers[0]


def _block(conv: Node, users: dict[int, list[Node]], results: set[int]
           ) -> tuple[ConvBlock | None, str]:
    why = why_not_window_kernel(conv)
    if why is not None:
        return None, why
    if conv.dtype not in (T.float32, T.float64):
        return None, f"{conv.dtype.name} (the block computes float32 and float64)"
    epilogue = _only_reader(conv, users, results)
    # (a parallel kernel's ParallelSchedule, several loop nests, is no epilogue either)
    if epilogue is None or epilogue.subgraph is None or epilogue.schedule is None or \
            getattr(epilogue.schedule, "is_reduction", True) or \
            len(epilogue.subgraph.outputs) != 1 or epilogue.type != conv.type:
        return None, "its result is not read by one pointwise fused group of its shape alone"
    problem = _epilogue_plan(conv, epilogue)[1]
    if problem is not None:
        return None, problem
    pool = _only_reader(epilogue, users, results)
    if pool is None or pool.subgraph is not None or get_op(pool.op).window is not Window.POOL or \
            why_not_window_kernel(pool) is not None:
        return ConvBlock(conv, epilogue, None), ""
    # A pool reads the epilogue's image from a tile on the thread's stack.
    parts = conv_parts(conv, "probe", {**get_op(conv.op).attr_defaults, **conv.attrs})
    if parts.out_size * conv.dtype.itemsize > STACK_BYTES:
        return ConvBlock(conv, epilogue, None), \
            f"{pool.name} apart: an image's result exceeds {STACK_BYTES >> 10} KiB of stack"
    return ConvBlock(conv, epilogue, pool), ""


# -- the epilogue's expressions ------------------------------------------------------------

def _kind(value: Value, conv: Node) -> str | None:
    """How a value of the epilogue varies over the convolution's output (N, O, H, W): 'one'
    (a scalar), 'chan' (per output channel, shape (1, O, 1, 1) right-aligned), 'vec' (an
    (O,) vector, before its Reshape to a channel), 'full' (the output's shape); None otherwise."""
    shape = tuple(value.shape)
    o = conv.shape[1]
    if shape == tuple(conv.shape):
        return "full"
    if all(isinstance(d, int) for d in shape) and math.prod(shape) == 1:
        return "one"
    padded = (1,) * (4 - len(shape)) + shape if len(shape) <= 4 else shape
    if padded == (1, o, 1, 1):
        return "chan"
    return "vec" if shape == (o,) else None


@dataclass
class _Plan:
    """The epilogue as C definitions in order: per-channel ones ('pre': computed once per call
    for every channel o) and per-element ones ('full'), each a local named by `names`."""

    pre: list[tuple[str, str]]  # (name, expression in o and the inputs)
    full: list[tuple[str, str]]  # (name, expression in o, p, n, the tile and the pre names)
    result: str  # the name of the epilogue's result
    inputs: dict[int, int]  # subgraph input position -> its argument index


def _epilogue_plan(conv: Node, epilogue: Node, blocked: frozenset[int] = frozenset(),
                   block: int = 16, conv_ref: str | None = None
                   ) -> tuple[_Plan | None, str | None]:
    """The epilogue over a tile, or the reason it cannot run over one. `blocked`: the uids of
    the convolution and of the inputs of its shape that lie in the blocked channel layout
    (`block` channels to a pixel's run): element (o, p) at `idx`, else at o * P + p.
    `conv_ref`: the C name of the convolution's value (default: its element of `tile`)."""
    sub = epilogue.subgraph
    assert sub is not None
    ct = C_COMPUTE[conv.dtype]
    others = [v for v in epilogue.inputs if v is not conv]
    plan = _Plan([], [], "", {})
    ref: dict[int, tuple[str, str]] = {}  # value uid -> (kind, C text)
    for k, (inner, outer) in enumerate(zip(sub.inputs, epilogue.inputs)):
        if outer is conv:
            ref[inner.uid] = ("full", conv_ref or (
                "tile[idx]" if conv.uid in blocked else "tile[o * P + p]"))
            continue
        plan.inputs[k] = len(conv.inputs) + others.index(outer)
        kind = _kind(inner, conv)
        if kind is None or inner.dtype != conv.dtype:
            return None, f"{epilogue.name} reads {outer.name} ({inner.tensor_type}) along " \
                         "axes other than the channel"
        if kind == "full":
            at = "idx" if outer.uid in blocked else "o * P + p"
            ref[inner.uid] = ("full", f"(({ct})in{k}[n * (O * P) + {at}])")
        else:
            ref[inner.uid] = (kind, f"(({ct})in{k}[{'0' if kind == 'one' else 'o'}])")
    for node in sub.nodes:
        kind = _kind(node, conv)
        operands = []
        for v in node.inputs:
            if isinstance(v, Constant) and v.is_scalar:
                operands.append(("one", literal(v.value.astype(conv.dtype))))
            elif v.uid in ref:
                operands.append(ref[v.uid])
            else:
                return None, f"{epilogue.name} reads a constant array"
        if kind is None or node.dtype != conv.dtype:
            return None, f"{node.name} ({node.op}) is not per element or per channel"
        kinds = {k for k, _ in operands} - {"one"}
        if get_op(node.op).view and kind != "full" and kinds <= {"chan", "vec"}:
            ref[node.uid] = (kind, operands[0][1])  # the same o-th element
            continue
        opdef = get_op(node.op)
        expression = code_for_op(node.op)
        if opdef.kind != PatternKind.ELEMWISE or expression is None or \
                any(v.dtype != conv.dtype for v in node.inputs):
            return None, f"{node.name} ({node.op}) is not an elementwise op of the dtype"
        if kind == "full" and not kinds <= {"chan", "full"} or \
                kind != "full" and not kinds <= {kind}:
            return None, f"{node.name} broadcasts other than per channel"
        template = expression.for_operands(True, [is_number(v) for v in node.inputs])
        suffix = "f" if ct == "float" else ""
        text = f"(({ct}){template.format(*[e for _, e in operands], f=suffix)})"
        defs = plan.full if kind == "full" else plan.pre
        local = f"{'v' if kind == 'full' else 'c'}{len(defs)}"
        defs.append((local, text))
        ref[node.uid] = (kind, local)
    kind, plan.result = ref.get(sub.outputs[0].uid, ("", ""))
    if kind != "full":
        return None, f"{epilogue.name}'s result does not read the convolution"
    return plan, None


# -- the kernel ------------------------------------------------------------------------------

def store_epilogue_rule(conv: Node) -> bool:
    """Whether the untuned block of `conv` applies its epilogue in the units' stores (where its
    output is blocked): STORE_EPILOGUE_MAX_TAPS."""
    taps = math.prod(conv.inputs[1].shape[1:])
    return taps <= STORE_EPILOGUE_MAX_TAPS and math.prod(conv.shape[2:]) > FLAT_PIXELS


def epilogue_in_stores(block: ConvBlock, blocked: frozenset[int],
                       store_epilogue: bool | None) -> bool:
    """Whether `block`'s kernel applies its epilogue in the units' stores: its result lies
    blocked (in `blocked`, no pool), and `store_epilogue` (None: `store_epilogue_rule`)."""
    out_blocked = block.last.uid in blocked and block.pool is None
    return out_blocked and (store_epilogue_rule(block.conv) if store_epilogue is None
                            else store_epilogue)


def _store_epilogue(conv: Node, block: ConvBlock, blocked: frozenset[int], channel_block: int,
                    inputs: list[str]) -> StoreEpilogue:
    """The block's epilogue on each value a unit stores, in registers: the per-channel
    values from `pre` ([j][o]: a run of channels is a vector), a residual read where the value
    goes. Against a second pass over each unit's output (in cache, just written) it saves a
    load and a store per element; ResNet-18 b1's blocks spent ~5% of their time there."""
    plan, problem = _epilogue_plan(conv, block.epilogue, blocked, channel_block, "gk_acc")
    assert plan is not None, problem
    ct, st = C_COMPUTE[conv.dtype], C_STORAGE[conv.dtype]
    o, p = conv.shape[1], conv.shape[2] * conv.shape[3]

    def element(value: str, dest: str, oe: str, pe: str, idx: str) -> list[str]:
        return ["{", f"  const int64_t o = {oe}, p = {pe}, idx = {idx};",
                "  (void)o; (void)p; (void)idx;", f"  const {ct} gk_acc = {value};",
                *[f"  const {ct} {local} = pre[{j} * O + o];"
                  for j, (local, _) in enumerate(plan.pre)],
                *[f"  const {ct} {local} = {text};" for local, text in plan.full],
                f"  {dest} = ({st}){plan.result};", "}"]
    return StoreEpilogue(f", int64_t n, void *const *args, const {ct} *restrict pre",
                         ", n, args, pre",
                         (f"  enum {{ O = {o}, P = {p} }};", *inputs,
                          "  (void)n; (void)args; (void)pre;"), element)


def emit_conv_block(block: ConvBlock, name: str, threshold: int, tile: ConvTile = RULE_TILE,
                    blocked: frozenset[int] = frozenset(), channel_block: int = 16,
                    store_epilogue: bool | None = None) -> KernelSource:
    """One kernel for the block; argv: `block.reads`, the workspace of its repacked weights
    (c_window.workspace_bytes), the result, then the batch size when it is dynamic. `tile`:
    the register tile of the convolution's units (conv_tile.py). `blocked`: the uids of its
    reads and result in the blocked channel layout (graph_kernel/conv_layout.py), blocks of
    `channel_block` channels; the convolution's own result is blocked when the block's is
    (a pool, which reads planes, keeps the tile NCHW). `store_epilogue`: whether blocked output
    gets the epilogue in the units' stores (None: `store_epilogue_rule`)."""
    conv, pool = block.conv, block.pool
    out_blocked = block.last.uid in blocked and pool is None
    tile_blocked = blocked | {conv.uid} if out_blocked else blocked - {conv.uid}
    plan, problem = _epilogue_plan(conv, block.epilogue, tile_blocked, channel_block)
    assert plan is not None, problem
    layout = ConvLayout(conv.inputs[0].uid in blocked, out_blocked, channel_block) \
        if blocked else NCHW
    o = conv.shape[1]
    ct, st = C_COMPUTE[conv.dtype], C_STORAGE[conv.dtype]
    inputs = [f"  const {st} *restrict in{k} = (const {st} *)args[{a}];"
              for k, a in plan.inputs.items()]
    # The channel path's image runs the epilogue in the units as they store (blocked output,
    # `store_epilogue` or the rule: c_conv_units.StoreEpilogue), else after each unit of work,
    # on the rows and channels it just wrote, in the units' parallel region
    # (c_images.channel_image).
    store = _store_epilogue(conv, block, tile_blocked, channel_block, inputs) \
        if epilogue_in_stores(block, blocked, store_epilogue) else None
    parts = conv_parts(conv, name, {**get_op(conv.op).attr_defaults, **conv.attrs}, tile,
                       layout, f"{name}_epilogue", store)
    reads = block.reads
    n = conv.inputs[0].shape[0]
    # argv: the reads, the workspace holding the repacked weights, the result, the sizes
    batch, sizes = str(n), read_sizes(kernel_symbols((n,)), len(reads) + 2)
    lines = [*parts.statics]
    out_size = parts.out_size
    if pool is not None:
        pool_attrs = {**get_op(pool.op).attr_defaults, **pool.attrs}
        statics, pool_call, _, out_size, _ = pool_parts(pool, f"{name}_pool", pool_attrs)
        lines += statics
    npre = max(len(plan.pre), 1)
    epilogue_after = "" if parts.epilogue_inside else \
        f" {name}_epilogue_image(tile, n, args, pre, gk_par);"
    # The epilogue over channels [c0, c1) and pixels [p0, p1) of one image's tile, in place;
    # per-channel values from `pre`.
    lines += [f"/* {c_comment(name)}: {c_comment(block.epilogue.name)} over each image */",
              f"static void {name}_epilogue({ct} *restrict tile, int64_t n, "
              f"void *const *args, const {ct} *restrict pre, int64_t c0, int64_t c1, "
              "int64_t p0, int64_t p1) {",
              f"  enum {{ O = {o}, P = {parts.out_size // o} }};", *inputs,
              "  (void)n; (void)args; (void)pre;"]
    if out_blocked:
        # Channel block by block, pixel by pixel, the block's lanes as one vector (`o` is the
        # block's index `ob` times B plus the lane).
        # The block's per-channel values go to lane arrays first: read from `pre` ([o][j])
        # inside the pixel loop they were a gather per pixel (the epilogue took 6.6% of
        # ResNet-50 b1 against 3.4% over planes).
        # A unit of the 256-bit code covers half a block: lanes l0 to l1 of it.
        bk = channel_block

        def lanes_loop(l0: str, l1: str) -> list[str]:
            return ["    for (int64_t p = p0; p < p1; ++p) {", "      #pragma omp simd",
                    f"      for (int64_t l = {l0}; l < {l1}; ++l) {{",
                    f"        const int64_t o = ob * {bk} + l, idx = (ob * P + p) * {bk} + l;",
                    "        (void)o;",
                    *[f"        const {ct} {local} = lanes[{j}][l];"
                      for j, (local, _) in enumerate(plan.pre)],
                    *[f"        const {ct} {local} = {text};" for local, text in plan.full],
                    f"        tile[idx] = {plan.result};", "      }", "    }"]
        channel = [f"    {ct} lanes[{npre}][{bk}];",
                   f"    for (int64_t l = 0; l < {bk}; ++l)",
                   f"      for (int64_t j = 0; j < {npre}; ++j) "
                   f"lanes[j][l] = pre[j * O + ob * {bk} + l];",
                   f"    const int64_t l0 = c0 > ob * {bk} ? c0 - ob * {bk} : 0;",
                   f"    const int64_t l1 = c1 - ob * {bk} < {bk} ? c1 - ob * {bk} : {bk};",
                   f"    if (l0 == 0 && l1 == {bk}) {{",
                   *["  " + x for x in lanes_loop("0", str(bk))],
                   "    } else {",
                   *["  " + x for x in lanes_loop("l0", "l1")],
                   "    }"]
        loop = f"    for (int64_t ob = c0 / {bk}; ob * {bk} < c1; ++ob) {{"
    else:
        channel = [f"    const {ct} {local} = pre[{j} * O + o];"
                   for j, (local, _) in enumerate(plan.pre)]
        channel += ["    #pragma omp simd", "    for (int64_t p = p0; p < p1; ++p) {"]
        if any(v.uid in tile_blocked for v in block.epilogue.inputs):  # a blocked residual
            channel.append(f"      const int64_t idx = ((o / {channel_block}) * P + p) * "
                           f"{channel_block} + o % {channel_block};")
        channel += [f"      const {ct} {local} = {text};" for local, text in plan.full]
        channel += [f"      tile[o * P + p] = {plan.result};", "    }"]
        loop = "    for (int64_t o = c0; o < c1; ++o) {"
    lines += ["  {", loop, *["  " + c for c in channel], "    }", "  }", "}", ""]
    if not parts.epilogue_inside:
        # The pixel path's image (depthwise) has no units of channels: the epilogue after
        # it, by channel, on the threads when the image's units were (`par`: a batch too
        # small to share out).
        lines += [f"static void {name}_epilogue_image({ct} *restrict tile, int64_t n, "
                  f"void *const *args, const {ct} *restrict pre, int par) {{",
                  f"  enum {{ O = {o}, P = {parts.out_size // o} }};",
                  "  if (par) {",
                  "    #pragma omp parallel for schedule(static)",
                  f"    for (int64_t o = 0; o < O; ++o) {name}_epilogue(tile, n, args, pre, o, "
                  "o + 1, 0, P);",
                  "  } else {",
                  f"    {name}_epilogue(tile, n, args, pre, 0, O, 0, P);",
                  "  }", "}", ""]
    # The kernel: weights repacked when they changed, per-channel values computed once, then
    # image by image.
    lines += [f"void {name}(void *const *args) {{", *parts.reads,
              f"  {st} *restrict out = ({st} *)args[{len(reads) + 1}];", *sizes,
              *prepack(parts, f"args[{len(reads)}]", parts.params.split(", "),
                       math.prod(conv.inputs[1].shape)),
              f"  {ct} pre[{o * npre}];", *inputs,
              f"  enum {{ O = {o} }};",
              "  for (int64_t o = 0; o < O; ++o) {"]
    for j, (local, text) in enumerate(plan.pre):
        lines += [f"    const {ct} {local} = {text};", f"    pre[{j} * O + o] = {local};"]
    lines.append("  }")
    xn, dst = f"x + n * {parts.in_size}LL", f"out + n * {out_size}LL"
    image = parts.image + epilogue_after
    if parts.scratch == 0:  # the convolution reads its input in place
        scratch, conv_call = [], image
    elif parts.scratch * conv.dtype.itemsize <= STACK_BYTES:
        scratch = [f"  {ct} xp[{parts.scratch}] = {{0}};"]
        conv_call = image
    else:  # as a convolution's own kernel keeps it (c_window._conv): zeroed once, per thread
        scratch = [f"  static __thread {ct} *xp_kept = NULL;",
                   f"  if (xp_kept == NULL) xp_kept = ({ct} *)calloc({parts.scratch}, "
                   f"sizeof({ct}));",
                   f"  {ct} *xp = xp_kept;"]
        # Without its scratch the slow loop, then the epilogue over the whole image.
        conv_call = f"if (xp != NULL) {{{{ {image} }}}} else {{{{ {parts.direct} " \
            f"{name}_epilogue(tile, n, args, pre, 0, {o}, 0, {parts.out_size // o}); }}}}"
    if pool is not None:
        call = f"{{ {conv_call.format(xn=xn, on='tile')} " \
            f"{pool_call.format(xn='tile', on=dst)} }}"
        scratch.append(f"  {ct} tile[{parts.out_size}];")
    else:
        call = f"{{ {ct} *tile = {dst}; {conv_call.format(xn=xn, on='tile')} }}"
    lines += image_loop(call, batch, parts.macs, threshold, scratch, [])
    lines.append("}")
    buffers = [Buffer(v, tuple(v.shape), False, i) for i, v in enumerate(reads)]
    buffers.append(Buffer(block.last, tuple(block.last.shape), True, 0))
    return KernelSource(name, WINDOW_TYPES + "\n".join(lines) + "\n", buffers)
