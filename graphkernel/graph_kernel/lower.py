"""Lowering, the last named stage: for each node of the final graph, the kind of kernel it
runs as and why, recorded on the node (`Node.lowering`), backend-neutral.

The stages before it decide what is fused; this one decides how each result is computed: a
fused group as one loop nest (pointwise or reduction schedule) or several (a parallel kernel),
a convolution with the pointwise group (and pool) after it as one block, a window op
(convolution, pool) or an Argmax as a kernel of its own, a lone op as a one-op loop nest, or
the op's numpy reference (a library call, BLAS for a product, a view). The backend that runs
the graph answers what it can build (`LoweringTarget`); the choice and its reason show in the
dumps (`hwopt_e_lower`), the plan's `describe()` and the report. The backends obey it: they
build the kernel named here, or say why not.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Protocol

from graphkernel.graph_kernel.attention import AttentionBlock, attention_blocks
from graphkernel.graph_kernel.conv_layout import LayoutTarget, choose_layouts
from graphkernel.graph_kernel.library_views import library_views
from graphkernel.graph_kernel.parallel_fusion import ParallelSchedule
from graphkernel.graph_kernel.single_op import runs_as_kernel, single_op_group
from graphkernel.ir.graph import Graph, Node, Value


class KernelKind(Enum):
    LOOP_NEST = "loop nest"  # a fused group (or a composite op): one pointwise/reduction nest
    PARALLEL = "parallel"  # independent groups (ParallelSchedule): one kernel, several nests
    SINGLE_OP = "single op"  # one op outside any group, as a one-op loop nest
    CONV_BLOCK = "conv block"  # a convolution, its pointwise epilogue (and pool): one kernel
    IN_CONV_BLOCK = "in conv block"  # computed by the conv block of another node
    WINDOW = "window"  # a convolution or a pool as a kernel of its own
    ARGMAX = "argmax"  # an Argmax as a kernel of its own
    LIBRARY = "library"  # the op's numpy reference (BLAS for a product)
    LIBRARY_VIEW = "library view"  # a product reading or writing layout ops as strided views
    IN_LIBRARY_VIEW = "in library view"  # a layout op a product reads or writes in place
    INTERPRETED = "interpreted"  # a fused group run op by op on numpy
    ALIAS = "alias"  # an Assign whose result is its value (the write is the graph's assign)
    ITEM = "item"  # a GetItem: the slot of a result of a node with several
    ATTENTION = "attention"  # scores product, softmax group, context product: one kernel
    IN_ATTENTION = "in attention"  # computed by the attention step of a context product


@dataclass(frozen=True)
class ConvBlock:
    """A convolution, the fused pointwise group that alone reads it, and the pool that alone
    reads that group (if any): one kernel, image by image in cache."""

    conv: Node
    epilogue: Node  # a fused pointwise group: its subgraph reads the convolution's result
    pool: Node | None

    @property
    def last(self) -> Node:
        return self.pool if self.pool is not None else self.epilogue

    @property
    def members(self) -> tuple[Node, ...]:
        return (self.conv, self.epilogue) + ((self.pool,) if self.pool is not None else ())

    @property
    def reads(self) -> list[Value]:
        """The step's inputs: the convolution's, then the epilogue's other inputs."""
        return list(self.conv.inputs) + [v for v in self.epilogue.inputs if v is not self.conv]


@dataclass(frozen=True)
class Lowering:
    """What a node runs as, and why (shown in dumps and plans)."""

    kind: KernelKind
    reason: str
    # SINGLE_OP: the one-op group and its schedule (graph_kernel/single_op.py)
    group: tuple[Graph, Any] | None = field(default=None, compare=False, repr=False)
    block: ConvBlock | None = field(default=None, compare=False, repr=False)  # CONV_BLOCK
    attention: AttentionBlock | None = field(default=None, compare=False, repr=False)  # ATTENTION
    warn: bool = False  # the user is told: a group the backend could not make one kernel
    # WINDOW, CONV_BLOCK: the uids of its reads and result in the blocked channel layout
    # (graph_kernel/conv_layout.py), blocks of `channel_block` channels
    blocked: frozenset[int] = frozenset()
    channel_block: int = 0

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.reason}"


class LoweringTarget(LayoutTarget, Protocol):
    """What lowering asks the backend that will run the graph (backends/: each backend is
    one). Each `why_not_*` returns the reason it builds no such kernel, None when it does;
    LayoutTarget's, which layouts its convolution kernels read and write."""

    name: str

    def why_not_kernels(self) -> str | None:
        """Why this backend generates no kernels at all here (no C compiler, say)."""

    def why_not_window_kernel(self, node: Node) -> str | None:
        """Why a convolution or pool runs as its numpy reference."""

    def why_not_argmax_kernel(self, node: Node) -> str | None:
        """Why an Argmax runs as numpy's argmax."""

    def conv_blocks(self, graph: Graph) -> dict[int, ConvBlock]:
        """Convolution uid -> its block, for every convolution this backend fuses with the
        group after it."""


# The note a backend's conv_blocks leaves on each convolution (backends/c/c_conv_block.py NOTE).
CONV_BLOCK_NOTE = "conv_block"
# The note an expander leaves on a node where it chose one form of its op among several (a 1x1
# input gradient as a product, not a window kernel: graph_kernel/grad_expanders.py), and why;
# the node's lowering reason carries it into the plan's describe().
FORM_NOTE = "form"


def lower(graph: Graph, target: LoweringTarget) -> Graph:
    """Record on each node of `graph` (a final graph, its composites scheduled) the kernel it
    runs as on `target`; returns `graph`."""
    generates = target.why_not_kernels()
    views = library_views(graph)
    folded = {n.uid: lib for lib, v in views.items() for n in v.folded}
    blocks = target.conv_blocks(graph) if generates is None else {}
    # Two convolutions may offer one epilogue (a residual block's main and shortcut
    # convolutions both feed its Add): one block per epilogue, the later convolution's; the
    # other convolution keeps a kernel of its own, and its note says so.
    last_of_block: dict[int, ConvBlock] = {}
    for block in blocks.values():
        last_of_block[block.last.uid] = block
    for block in blocks.values():
        winner = last_of_block[block.last.uid]
        if winner is not block:
            block.conv.notes[CONV_BLOCK_NOTE] = (
                f"a kernel of its own: {block.epilogue.name} joins {winner.conv.name}'s block")
    in_block = {m.uid: block for block in last_of_block.values() for m in block.members[:-1]}
    names = {n.uid: n.name for n in graph.nodes}
    # Attention as one step where the backend generates kernels (graph_kernel/attention.py).
    attention, refused = attention_blocks(graph, views) if generates is None else ({}, {})
    in_attention = {m.uid: block for block in attention.values() for m in block.members[:-1]}
    for node in graph.nodes:
        if node.uid in attention:
            block_ = attention[node.uid]
            node.lowering = Lowering(
                KernelKind.ATTENTION, f"{block_.scores.name}, {block_.softmax.name}, "
                f"{node.name}: head by head, scores kept in cache{block_.added_text()}",
                attention=block_)
        elif node.uid in in_attention:
            node.lowering = Lowering(KernelKind.IN_ATTENTION,
                                     f"computed in {in_attention[node.uid].context.name}'s "
                                     "attention step")
        else:
            node.lowering = _choose(node, generates, target, folded, names, in_block,
                                    last_of_block, views)
            if node.uid in refused:  # a candidate kept as three steps: why, in the plan
                node.lowering = replace(node.lowering,
                                        reason=f"{node.lowering.reason}; {refused[node.uid]}")
    if generates is None:
        choose_layouts(graph, target, KernelKind.WINDOW, KernelKind.CONV_BLOCK)
    graph.lowered_for = target.name
    return graph


def _choose(node: Node, generates: str | None, target: LoweringTarget, folded: dict[int, int],
            names: dict[int, str], in_block: dict[int, ConvBlock],
            last_of_block: dict[int, ConvBlock], views: Mapping[int, object]) -> Lowering:
    if node.op == "GetItem":
        return Lowering(KernelKind.ITEM, "a result of a node with several")
    if node.uid in folded:
        return Lowering(KernelKind.IN_LIBRARY_VIEW,
                        f"read or written in place by {names[folded[node.uid]]}")
    if node.op == "Assign" and node.subgraph is None and \
            node.inputs[1].tensor_type == node.tensor_type:
        return Lowering(KernelKind.ALIAS, "its result is its value")
    block = last_of_block.get(node.uid)
    if block is not None:
        pool = f", {block.pool.name}" if block.pool is not None else ""
        return Lowering(KernelKind.CONV_BLOCK,
                        f"{block.conv.name}, {block.epilogue.name}{pool}: image by image",
                        block=block)
    block = in_block.get(node.uid)
    if block is not None:
        return Lowering(KernelKind.IN_CONV_BLOCK, f"computed in {block.last.name}'s block")
    if node.uid in views:
        return Lowering(KernelKind.LIBRARY_VIEW,
                        _with_form(node, "reads or writes layout ops as strided views"))
    if node.subgraph is None:
        return _lone_op(node, generates, target)
    if generates is not None:
        return Lowering(KernelKind.INTERPRETED, generates)
    if node.schedule is None:
        return Lowering(KernelKind.INTERPRETED,
                        str(node.notes.get("not_one_kernel", "no loop-nest schedule")), warn=True)
    if isinstance(node.schedule, ParallelSchedule):
        return Lowering(KernelKind.PARALLEL, f"{len(node.schedule.nests)} loop nests")
    shape = "reduction" if node.schedule.is_reduction else "pointwise"
    return Lowering(KernelKind.LOOP_NEST, f"a {shape} schedule")


def _lone_op(node: Node, generates: str | None, target: LoweringTarget) -> Lowering:
    """An op outside any fused group."""
    if generates is not None:
        return Lowering(KernelKind.LIBRARY, generates)
    why_window = target.why_not_window_kernel(node)
    if why_window is None:
        return Lowering(KernelKind.WINDOW, "a generated window kernel")
    why_argmax = target.why_not_argmax_kernel(node)
    if why_argmax is None:
        return Lowering(KernelKind.ARGMAX, "a generated argmax kernel")
    if runs_as_kernel(node):
        group = single_op_group(node)
        if group is not None:
            return Lowering(KernelKind.SINGLE_OP, "one op as one loop nest", group=group)
        return Lowering(KernelKind.LIBRARY, _with_form(node, "not one loop nest"))
    return Lowering(KernelKind.LIBRARY, _with_form(node, "its numpy reference"))


def _with_form(node: Node, reason: str) -> str:
    """`reason`, then the form an expander chose for the node and why (FORM_NOTE), if any."""
    form = node.notes.get(FORM_NOTE)
    return reason if form is None else f"{reason}; {form}"
