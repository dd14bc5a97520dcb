"""Attention as one step: the scores product, the fused group that scales, masks and softmaxes
it, and the context product, computed head by head with each block of scores kept in cache
(backends/c/c_attention.py), instead of three steps that write the scores and probabilities
to memory and read them back.

Lowering takes it only where the scores and the probabilities have no other reader: a training
step keeps the probabilities for SoftmaxGrad, so it keeps the three steps and its gradients are
unchanged. Each candidate context product gets a note (`NOTE`) saying which way it went, and a
refused one's lowering reason says why (graph_kernel/lower.py)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from graphkernel.graph_kernel.index_maps import MAPPABLE, IndexMap, apply, dense
from graphkernel.graph_kernel.library_views import LibraryViews, StridedView
from graphkernel.ir.graph import Constant, Graph, Node, Value
from graphkernel.ir.opset import OPS, PatternKind, get_op
from graphkernel.ir.types import is_static

NOTE = "attention"  # Node.notes key on a context product: fused with what, or why not
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# One head's packed K^T and V, and a block of rows of scores, live on the stack of the thread
# that computes the head (a worker thread's stack is a few MiB): above this, three steps.
MAX_HEAD_BYTES = 512 * 1024
ROWS = 8  # query rows per block of scores (backends/c/c_attention.py's register tile)
# q, k or v computed by a fused group of layout ops and one Add (a head split with its bias)
# is added up by the attention step as it loads (`_sum_of_views`); False: those groups keep
# steps of their own (an A/B switch: bench/codegen_ab.py, the tests).
FOLD_SUMS = True


def static_shape(value: Value) -> tuple[int, ...]:
    """The shape of a value `attention_blocks` checked static."""
    shape = tuple(value.tensor_type.shape)
    assert all(isinstance(d, int) for d in shape), f"{value.name}: a dynamic size"
    return shape  # type: ignore[return-value]  # every size an int: asserted


@dataclass(frozen=True)
class Operand:
    """q, k, v or the context as read (written) by the step: a dense value, or the buffer a
    library view reads (writes) in place, with the element strides of its axes."""

    value: Value
    offset: int
    strides: tuple[int, ...]
    # Read as value + addend, element by element: q, k or v computed by a fused group of
    # layout ops and one Add (the head split of a projection with its bias) that the step
    # computes as it loads (`_sum_of_views`).
    addend: Operand | None = None


@dataclass(frozen=True)
class AttentionBlock:
    """context = softmax(scale * (q @ k^T) [+ mask]) @ v over the last axis, per batch x head
    (`q @ k^T / scale` where `divides`: ONNX exports divide by sqrt(d), and a division is kept
    a division so the step rounds as the three steps do)."""

    scores: Node  # BatchMatMul(q, k), or a MatMul of rank 3 or more
    softmax: Node  # the fused group: Mul by a scalar, Add of the mask, Softmax on the last axis
    context: Node  # BatchMatMul(probabilities, v), or a MatMul of rank 3 or more
    scale: float | None
    mask: Value | None  # a value broadcast to the scores' shape
    q: Operand
    k: Operand
    v: Operand
    out: Operand
    transpose: tuple[bool, bool, bool]  # q, k, v as stored: transposed last two axes
    divides: bool = False  # the scores are divided by `scale`, not multiplied
    folded: tuple[Node, ...] = ()  # the groups whose sums q, k or v are (Operand.addend)

    @property
    def members(self) -> tuple[Node, ...]:
        return self.folded + (self.scores, self.softmax, self.context)

    def added_text(self) -> str:
        """What the step adds up as it loads q, k and v, for its notes ("" when nothing)."""
        return "" if not self.folded else \
            f"; q, k, v added up as loaded ({', '.join(g.name for g in self.folded)})"

    @property
    def addends(self) -> list[Operand]:
        return [op.addend for op in (self.q, self.k, self.v) if op.addend is not None]

    @property
    def reads(self) -> list[Value]:
        """The step's inputs, in argv order: q, k, v, the mask if any, then the addends of
        q, k and v that have one."""
        return [self.q.value, self.k.value, self.v.value] + \
            ([self.mask] if self.mask is not None else []) + [a.value for a in self.addends]

    @property
    def sizes(self) -> tuple[int, int, int, int, int]:
        """(batch x heads, query rows S, keys T, head size D, value size Dv)."""
        shape = static_shape(self.scores)
        dv = static_shape(self.context)[-1]
        d = static_shape(self.scores.inputs[0])[-2 if self.transpose[0] else -1]
        return (math.prod(shape[:-2]), shape[-2], shape[-1], d, dv)


def _dense(value: Value) -> Operand:
    strides, acc = [], 1
    for dim in reversed(static_shape(value)):
        strides.append(acc)
        acc *= dim
    return Operand(value, 0, tuple(reversed(strides)))


def _viewed(value: Value, view: StridedView | None) -> Operand:
    return _dense(value) if view is None else Operand(view.buffer, view.offset, view.strides)


def _chain_to_input(value: Value, sub: Graph, inside: set[int]) -> tuple[list[Node], Value] | None:
    """The layout ops (single-input, mappable) from an input of `sub` to `value`, and that
    input; None when `value` is anything else. The nodes passed are added to `inside`."""
    chain: list[Node] = []
    current = value
    while not any(current is x for x in sub.inputs):
        if not isinstance(current, Node) or current.subgraph is not None or \
                current.op not in MAPPABLE:
            return None
        chain.insert(0, current)
        inside.add(current.uid)
        current = current.inputs[0]
    return chain, current


def _sum_of_views(value: Value, reader: Node, users: dict[int, list[Node]],
                  results: set[int]) -> tuple[Operand, Node] | None:
    """`value` as the sum of two strided reads, where a fused group read by `reader` alone
    computes it as Add(layout ops of one input, layout ops of another): a projection's head
    split with its bias (Reshape, Transpose; BroadcastTo, Reshape, Transpose; Add). The step
    then adds the two as it loads q, k or v, and the group runs no step. None otherwise."""
    if not isinstance(value, Node) or value.subgraph is None or \
            _only_reader(value, users, results) is not reader:
        return None
    sub = value.subgraph
    out = sub.outputs[0] if len(sub.outputs) == 1 else None
    if not isinstance(out, Node) or out.op != "Add" or len(out.inputs) != 2 or \
            out.subgraph is not None:
        return None
    inside = {out.uid}
    operands: list[Operand] = []
    for side in out.inputs:
        found = _chain_to_input(side, sub, inside)
        if found is None:
            return None
        chain, source = found
        outer = value.inputs[next(i for i, x in enumerate(sub.inputs) if x is source)]
        if not is_static(tuple(source.shape)) or tuple(side.shape) != tuple(out.shape) or \
                source.dtype != out.dtype or isinstance(outer, Constant) and outer.is_scalar:
            return None
        mapped: IndexMap | None = dense(source)
        for node in chain:
            mapped = apply(node, mapped) if mapped is not None else None
        if mapped is None:
            return None
        operands.append(Operand(outer, mapped.offset, mapped.strides))
    if inside != {n.uid for n in sub.nodes}:
        return None  # the group computes something else besides
    first, second = operands
    return Operand(first.value, first.offset, first.strides, second), value


def _only_reader(value: Node, users: dict[int, list[Node]], results: set[int]) -> Node | None:
    readers = users.get(value.uid, [])
    if value.uid in results or len(readers) != 1 or readers[0].inputs.count(value) != 1:
        return None
    return readers[0]


def _last_axis(node: Node, x: Value) -> bool:
    attrs = {**get_op(node.op).attr_defaults, **node.attrs}
    axis = attrs.get("axis")
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    return len(axes) == 1 and axes[0] is not None and \
        int(axes[0]) % x.tensor_type.rank == x.tensor_type.rank - 1


def _is_softmax(nodes: list[Node], x: Value, result: Value) -> bool:
    """Whether `nodes` compute softmax(x) along the last axis into `result`: one Softmax, or
    its expansion (graph_kernel/expanders.py): e = exp(x - max(x)), e * (1 / sum(e))."""
    if len(nodes) == 1:
        node = nodes[0]
        return node.op == "Softmax" and node.inputs[0] is x and node is result and \
            _last_axis(node, x)
    if [n.op for n in nodes] != ["ReduceMax", "Sub", "Exp", "ReduceSum", "Reciprocal", "Mul"]:
        return False
    top, shifted, e, total, inverse, out = nodes
    keep = all({**get_op(n.op).attr_defaults, **n.attrs}.get("keep_dims") for n in (top, total))
    return keep and top.inputs[0] is x and _last_axis(top, x) and \
        list(shifted.inputs) == [x, top] and e.inputs[0] is shifted and \
        total.inputs[0] is e and _last_axis(total, x) and inverse.inputs[0] is total and \
        set(out.inputs) == {e, inverse} and len(out.inputs) == 2 and out is result


def _softmax_pattern(group: Node) -> tuple[float | None, bool, int | None] | str:
    """(scale, whether it divides, mask input position) of a group `Softmax(x [* c | / c]
    [+ mask])` on the last axis over its input 0, or why it is not one."""
    sub = group.subgraph
    assert sub is not None
    if len(sub.outputs) != 1 or not sub.inputs:
        return "the softmax group has several results"
    current: Value = sub.inputs[0]
    scale: float | None = None
    divides = False
    mask: int | None = None
    nodes = list(sub.nodes)
    if nodes and nodes[0].op == "Mul" and current in nodes[0].inputs:
        other = [v for v in nodes[0].inputs if v is not current]
        if len(other) != 1 or not isinstance(other[0], Constant) or not other[0].is_scalar:
            return "the scores are multiplied by something other than a scalar constant"
        scale = float(np.asarray(other[0].value))
        current = nodes.pop(0)
    elif nodes and nodes[0].op == "RealDiv" and nodes[0].inputs[0] is current:
        divisor = nodes[0].inputs[1]
        if not isinstance(divisor, Constant) or not divisor.is_scalar:
            return "the scores are divided by something other than a scalar constant"
        scale, divides = float(np.asarray(divisor.value)), True
        current = nodes.pop(0)
    if nodes and nodes[0].op == "Add" and current in nodes[0].inputs:
        other = [v for v in nodes[0].inputs if v is not current]
        if len(other) != 1 or other[0] not in sub.inputs[1:]:
            return "the scores are added to something other than a mask input"
        mask = sub.inputs.index(other[0])
        current = nodes.pop(0)
    if not _is_softmax(nodes, current, sub.outputs[0]):
        return "the group is not softmax(scores [* or / scale] [+ mask]) along the keys"
    if len(sub.inputs) != 1 + (mask is not None):
        return "the group reads other inputs"
    return scale, divides, mask


def _batched_product(node: Node) -> bool:
    """A product over batch (x heads) axes: BatchMatMul, or a MatMul of rank 3 or more (an
    ONNX MatMul imports as one; both ops share their inference and reference)."""
    op = OPS.get(node.op)  # a fused group ("Composite") has no declaration
    return node.subgraph is None and op is not None and op.gemm and node.tensor_type.rank >= 3


def _block(context: Node, users: dict[int, list[Node]], results: set[int],
           views: Mapping[int, LibraryViews]) -> AttentionBlock | str | None:
    """The block ending at `context`, why not (a candidate refused), or None (no candidate)."""
    if not _batched_product(context):
        return None
    probs = context.inputs[0]
    if not isinstance(probs, Node) or probs.subgraph is None or \
            not {"Softmax", "Exp"} & {n.op for n in probs.subgraph.nodes}:
        return None
    scores = probs.inputs[0]
    if not isinstance(scores, Node) or not _batched_product(scores):
        return None
    if _only_reader(scores, users, results) is not probs:
        return f"the scores ({scores.name}) have another reader"
    if _only_reader(probs, users, results) is not context:
        return f"the probabilities ({probs.name}) have another reader (a gradient keeps them)"
    pattern = _softmax_pattern(probs)
    if isinstance(pattern, str):
        return pattern
    scale, divides, mask_at = pattern
    s_attrs = {**get_op(scores.op).attr_defaults, **scores.attrs}
    c_attrs = {**get_op(context.op).attr_defaults, **context.attrs}
    if c_attrs["transpose_a"]:
        return "the context product reads the probabilities transposed"
    values = [*scores.inputs, *context.inputs, context]
    if not all(is_static(v.tensor_type.shape) for v in values):
        return "a dynamic size"
    dtype = scores.tensor_type.dtype
    if dtype not in DTYPES or any(v.tensor_type.dtype != dtype for v in values):
        return f"{dtype.name}: float32 and float64 only"
    batch = tuple(scores.tensor_type.shape[:-2])
    if len(batch) < 1 or any(tuple(v.tensor_type.shape[:-2]) != batch
                             for v in (*scores.inputs, context.inputs[1], context)):
        return "q, k and v do not share the batch x heads axes"
    mask = probs.inputs[mask_at] if mask_at is not None else None
    if mask is not None:
        m_shape = tuple(mask.tensor_type.shape)
        full = tuple(scores.tensor_type.shape)
        if len(m_shape) > len(full) or any(
                d not in (1, f) for d, f in zip(reversed(m_shape), reversed(full))):
            return "the mask does not broadcast to the scores"
    s_views = views.get(scores.uid)
    c_views = views.get(context.uid)
    s_ops = getattr(s_views, "operands", {})
    c_ops = getattr(c_views, "operands", {})
    if 0 in c_ops:
        return "the probabilities are read through a view"
    result_view = getattr(c_views, "result", None)
    operands: list[Operand] = []
    folded: list[Node] = []
    for reader, at, mine in ((scores, 0, s_ops), (scores, 1, s_ops), (context, 1, c_ops)):
        value = reader.inputs[at]
        summed = None if not FOLD_SUMS or at in mine else \
            _sum_of_views(value, reader, users, results)
        if summed is None:
            operands.append(_viewed(value, mine.get(at)))
        else:
            operands.append(summed[0])
            folded.append(summed[1])
    q_op, k_op, v_op = operands
    block = AttentionBlock(
        scores, probs, context, scale, mask, q_op, k_op, v_op, _viewed(context, result_view),
        (bool(s_attrs["transpose_a"]), not s_attrs["transpose_b"], bool(c_attrs["transpose_b"])),
        divides, tuple(folded))
    _, rows, keys, d, dv = block.sizes
    if (d * keys + ROWS * keys + keys * dv + ROWS * d) * dtype.itemsize > MAX_HEAD_BYTES:
        return f"one head's keys, values and a block of scores exceed {MAX_HEAD_BYTES >> 10} KiB"
    return block


# Elementwise steps from a scores product to its softmax that `score_products` follows (a
# scale, a mask's add or select): more is not attention's shape.
_SCORE_CHAIN_MAX = 4
# Clustering keeps a mask's group out of the softmax group over attention's scores
# (`score_products`, cluster.py); False: it may merge (an A/B switch, the tests).
KEEP_MASKS_APART = True


def score_products(graph: Graph) -> set[int]:
    """The uids of batched products whose result reaches a Softmax on the last axis through
    at most _SCORE_CHAIN_MAX elementwise ops (or groups of them), each the only reader of the
    one before, where a batched product reads that softmax as its first operand: attention's
    scores, as the graph stands before clustering. Clustering keeps other values' groups (a
    mask computed from the inputs) out of the group that reads such scores (cluster.py), so
    that the group is the `softmax(scores [* scale] [+ mask])` an attention step takes."""
    found: set[int] = set()
    if not KEEP_MASKS_APART:
        return found
    users = graph.users()
    results = {v.uid for v in graph.results()}
    for node in graph.nodes:
        if not _batched_product(node):
            continue
        current: Node = node
        for _ in range(_SCORE_CHAIN_MAX + 1):
            reader = _only_reader(current, users, results)
            if reader is None:
                break
            # Softmax, or a composite that computes it (a Softmax cell, an expansion)
            if reader.op == "Softmax" and _last_axis(reader, current) or \
                    reader.subgraph is not None and len(reader.inputs) == 1 and \
                    not isinstance(_softmax_pattern(reader), str):
                context = _only_reader(reader, users, results)
                if context is not None and _batched_product(context) and \
                        context.inputs[0] is reader:
                    found.add(node.uid)
                break
            inner = reader.subgraph.nodes if reader.subgraph is not None else [reader]
            if any(n.subgraph is not None or get_op(n.op).kind != PatternKind.ELEMWISE
                   for n in inner):  # (a group fused in an earlier stage: elementwise ops)
                break
            current = reader
    return found


def attention_blocks(graph: Graph, views: Mapping[int, LibraryViews]
                     ) -> tuple[dict[int, AttentionBlock], dict[int, str]]:
    """(context product uid -> its block, context product uid -> why it stays three steps), for
    every batched product that reads a softmax group over a batched product. Notes each such
    node. `views`: the graph's library views, as lowering computed them (library_views)."""
    users = graph.users()
    results = {v.uid for v in graph.results()}
    found: dict[int, AttentionBlock] = {}
    refused: dict[int, str] = {}
    for node in graph.nodes:
        block = _block(node, users, results, views)
        if block is None:
            continue
        if isinstance(block, str):
            refused[node.uid] = f"three steps, not one attention step: {block}"
            node.notes[NOTE] = refused[node.uid]
            continue
        found[node.uid] = block
        node.notes[NOTE] = (f"one attention step with {block.scores.name} and "
                            f"{block.softmax.name}: head by head, scores kept in cache"
                            f"{block.added_text()}")
    return found, refused
