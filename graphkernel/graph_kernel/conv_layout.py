"""The layout of each tensor between convolution kernels: NCHW, or a blocked channel layout
(N, C / B, H, W, B: the B channels of a pixel adjacent, one vector of the backend's code), as
ONNX Runtime's NCHWc and oneDNN's nChw16c keep it from one convolution to the next.

A convolution kernel vectorises over output channels: each accumulator holds one pixel's B
channels. Written to NCHW, every accumulator is taken apart lane by lane into B planes (a
transpose in registers, or one element at a time), and the next convolution broadcasts its
taps from planes a plane apart. Blocked, an accumulator is one run of the output, and the next
convolution's taps of one channel block are adjacent. MobileNetV2 at batch 8 spent 8% of its
time in those stores (/work/briefs/out/s8-nchwc.md).

Run by lowering (graph_kernel/lower.py) once every node's kernel is chosen. A tensor is blocked
when the kernel that writes it is a convolution's (its own kernel, or a conv block without a
pool) that can write the layout, or a pool's own kernel that reads its input blocked, it is not
a graph output (graph inputs and outputs stay NCHW), and every kernel that reads it can read
the layout: a convolution reading it as its input (a depthwise one too: its kernel then runs
its vectors along a block's channels, so MobileNetV2's 1x1 expand -> depthwise -> 1x1 project
chain stays blocked), a conv block's epilogue reading it element by element (a residual), or
a pool's own kernel that can keep the layout (it reads and writes blocked together, so
ResNet's stem -> MaxPool -> first block stays blocked: written to planes, the stem's 7x7 took
each accumulator apart lane by lane, 7% of its time). Anything else (a pool inside a conv
block, the head, a grouped convolution of several channels a group) keeps the tensor NCHW,
and the decision's reason is a note (`layout`) on the node that writes it. The backend says
which convolutions and pools read or write the layout (`LoweringTarget.why_not_blocked`), its
block (`channel_block`), and where its kernel for a convolution takes one of several forms by
layout and size, which and why (`conv_form`, added to the kernel's lowering reason)."""
from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Protocol

from graphkernel.ir.graph import Graph, Node, Value
from graphkernel.ir.opset import Window, get_op


class LayoutTarget(Protocol):
    """What the pass asks the backend (lower.py's LoweringTarget includes it)."""

    def why_not_blocked(self, conv: Node, side: str) -> str | None:
        """Why this convolution's (or pool's) kernel cannot read (`side` "input") or write
        ("output") the blocked channel layout; None when it can."""

    def channel_block(self, conv: Node) -> int:
        """Channels per block of the blocked layout this convolution's kernel reads or writes."""

    def conv_form(self, conv: Node, input_blocked: bool, output_blocked: bool) -> str | None:
        """The form this convolution's kernel takes reading and writing these layouts, and
        why, where the backend chooses among several (None: no choice)."""


LAYOUT_NOTE = "layout"  # on each convolution kernel's result: its layout and why


def choose_layouts(graph: Graph, target: LayoutTarget, window: Enum, conv_block: Enum
                   ) -> dict[int, int]:
    """Value uid -> its channel block, for every tensor kept blocked; records each decision
    (a `layout` note on the writing node) and the layouts each kernel reads and writes (its
    `Lowering.blocked`). Nodes must carry their lowering (graph_kernel/lower.py, which passes
    its kinds of a convolution's own kernel, `window`, and of a conv block)."""
    kinds = _Kinds(window, conv_block)
    users = graph.users()
    results = {v.uid for v in graph.results()}
    kernel_of: dict[int, Node] = {}  # node uid -> the node whose lowering is its kernel's
    for node in graph.nodes:
        lowering = node.lowering
        if lowering is not None and lowering.kind is kinds.CONV_BLOCK:
            assert lowering.block is not None
            for member in lowering.block.members:
                kernel_of[member.uid] = node
    chosen: dict[int, int] = {}
    for node in graph.nodes:
        writer = _conv_writing(node, kinds)
        pool = writer is None and _own_pool(node, kinds)
        if pool:
            writer = node
            if node.inputs[0].uid not in chosen:  # a pool keeps its input's layout
                node.notes[LAYOUT_NOTE] = "NCHW: a pool writes the layout it reads, NCHW here"
                continue
        if writer is None:
            continue
        why = _why_nchw(node, writer, users, results, kernel_of, target, kinds)
        if why is None:
            block = chosen.get(node.inputs[0].uid) if pool else target.channel_block(writer)
            assert block is not None
            chosen[node.uid] = block
            node.notes[LAYOUT_NOTE] = f"blocked, {block} channels a pixel: every reader is a " \
                                      "convolution or pool kernel that reads the layout"
        else:
            node.notes[LAYOUT_NOTE] = f"NCHW: {why}"
    for node in graph.nodes:
        lowering = node.lowering
        if lowering is None or lowering.kind not in (kinds.WINDOW, kinds.CONV_BLOCK):
            continue
        values = list(lowering.block.reads) if lowering.block is not None else \
            list(node.inputs)
        blocked = frozenset(v.uid for v in [*values, node] if v.uid in chosen)
        conv = _conv_writing(node, kinds)
        form = None if conv is None else target.conv_form(
            conv, conv.inputs[0].uid in chosen, node.uid in chosen)
        if form is not None:
            lowering = dataclasses.replace(lowering, reason=f"{lowering.reason}; {form}")
            node.lowering = lowering
        if not blocked:
            continue
        block = next(chosen[uid] for uid in blocked)
        names = [v.name for v in values if v.uid in chosen]
        said = (f"reads {', '.join(names)} blocked" if names else "reads NCHW") + \
            (", writes blocked" if node.uid in chosen else ", writes NCHW")
        node.lowering = dataclasses.replace(
            lowering, blocked=blocked, channel_block=block,
            reason=f"{lowering.reason}; {said} ({block} channels)")
    return chosen


@dataclasses.dataclass(frozen=True)
class _Kinds:
    WINDOW: Enum
    CONV_BLOCK: Enum


def _conv_writing(node: Node, kinds: _Kinds) -> Node | None:
    """The convolution whose kernel writes `node`'s result (a conv's own kernel, or the conv
    block whose last node it is), or None."""
    lowering = node.lowering
    if lowering is None:
        return None
    if lowering.kind is kinds.CONV_BLOCK:
        assert lowering.block is not None
        return lowering.block.conv
    if lowering.kind is kinds.WINDOW and node.op in ("Conv2D", "Conv2DFoldedBN"):
        return node
    return None


def _own_pool(node: Node, kinds: _Kinds) -> bool:
    """Whether `node` is a pool that runs as its own kernel (not inside a conv block)."""
    lowering = node.lowering
    return lowering is not None and lowering.kind is kinds.WINDOW and \
        get_op(node.op).window is Window.POOL


def _why_nchw(node: Node, writer: Node, users: dict[int, list[Node]], results: set[int],
              kernel_of: dict[int, Node], target: LayoutTarget, kinds: _Kinds) -> str | None:
    """Why `node`'s result (written by `writer`'s kernel: a convolution's, or a pool's own)
    stays NCHW; None: it goes blocked."""
    lowering = node.lowering
    assert lowering is not None
    if node.uid in results:
        return "a graph output"
    if lowering.block is not None and lowering.block.pool is not None:
        return f"written by {lowering.block.pool.name}, a pool (it writes planes)"
    why = target.why_not_blocked(writer, "output")
    if why is not None:
        return f"{writer.name} writes planes: {why}"
    readers = users.get(node.uid, [])
    if not readers:
        return "no reader"
    for reader in readers:
        why = _why_reader_cannot(node, reader, users, results, kernel_of, target, kinds)
        if why is not None:
            return why
    return None


def _why_reader_cannot(value: Value, reader: Node, users: dict[int, list[Node]],
                       results: set[int], kernel_of: dict[int, Node], target: LayoutTarget,
                       kinds: _Kinds) -> str | None:
    """Why `reader` cannot read `value` blocked; None when it can."""
    owner = kernel_of.get(reader.uid)
    lowering = reader.lowering
    if owner is not None:  # a member of a conv block
        block = owner.lowering.block if owner.lowering is not None else None
        assert block is not None
        if reader is block.conv:
            return _as_conv_input(value, reader, target)
        if reader is block.epilogue:
            if tuple(value.shape) != tuple(block.conv.shape):
                return f"{reader.name} reads it broadcast (not element by element)"
            return None
        return f"read by {reader.name}, a pool (it reads planes)"
    if lowering is not None and lowering.kind is kinds.WINDOW and \
            reader.op in ("Conv2D", "Conv2DFoldedBN"):
        return _as_conv_input(value, reader, target)
    if _own_pool(reader, kinds):  # it reads blocked only where it can write blocked too
        why = target.why_not_blocked(reader, "input") or \
            _why_nchw(reader, reader, users, results, kernel_of, target, kinds)
        return None if why is None else f"read by {reader.name}, a pool that keeps it NCHW " \
            f"({why})"
    kind = lowering.kind.value if lowering is not None else "no kernel"
    return f"read by {reader.name} ({kind}), which reads NCHW"


def _as_conv_input(value: Value, conv: Node, target: LayoutTarget) -> str | None:
    if conv.inputs[0] is not value or conv.inputs.count(value) != 1:
        return f"{conv.name} reads it as weights"
    why = target.why_not_blocked(conv, "input")
    return None if why is None else f"{conv.name} reads planes: {why}"
