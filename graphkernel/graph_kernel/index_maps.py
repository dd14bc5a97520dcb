"""Layout ops read through index maps: a fused kernel reads Reshape, ExpandDims, Squeeze,
Transpose, Slice and StridedSlice of its inputs straight from the producer's dense buffer at
`offset + sum(i_k * stride_k)`, instead of a copy made between kernels (TVM's injective
fusion). `sink_views` moves such ops above the elementwise ops that produce their input
(Transpose(Add(a, b)) -> Add(Transpose(a), Transpose(b))), so that a head split after a bias
add is read by one kernel from the matmul's result."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from graphkernel.ir.graph import Constant, Graph, Node, Value
from graphkernel.ir.opdefs.array import strided_slice_index
from graphkernel.ir.opset import PatternKind, get_op
from graphkernel.ir.types import TensorType

MAPPABLE = ("Reshape", "ExpandDims", "Squeeze", "Transpose", "Slice", "StridedSlice",
            "BroadcastTo")
# Ops sink_views moves below: pure shape relabels and permutations (slices only above an op of
# one tensor operand: above several, each operand would need its own index arithmetic).
SINKABLE = ("Reshape", "ExpandDims", "Squeeze", "Transpose")
SLICES = ("Slice", "StridedSlice")  # moved too, above an op of one tensor operand


@dataclass(frozen=True)
class IndexMap:
    """Where element (i_0, ..., i_n) of a view lives in its source's dense buffer."""

    source: Value
    offset: int
    strides: tuple[int, ...]  # per axis of the view, in elements; 0 where it broadcasts


def dense(value: Value) -> IndexMap:
    strides, acc = [], 1
    for dim in reversed(value.shape):
        strides.append(acc)
        acc *= dim
    return IndexMap(value, 0, tuple(reversed(strides)))


def _reshape(m: IndexMap, old: tuple[int, ...], new: tuple[int, ...]) -> IndexMap | None:
    """The strides of `new` over the same memory, when they exist (numpy's no-copy reshape):
    runs of old axes are merged or split only where they are contiguous with each other."""
    if math.prod(old) == 0:
        return IndexMap(m.source, m.offset, (0,) * len(new))
    olds = [(d, s) for d, s in zip(old, m.strides) if d != 1]
    out: list[int] = []
    i = 0
    news = [d for d in new if d != 1]
    j = 0
    strides_new: list[int] = []
    while i < len(olds) and j < len(news):
        # grow a group of old and new axes with equal element counts
        oi, nj = i + 1, j + 1
        po, pn = olds[i][0], news[j]
        while po != pn:
            if po < pn:
                po *= olds[oi][0]
                oi += 1
            else:
                pn *= news[nj]
                nj += 1
        for k in range(i, oi - 1):  # the old axes of the group must be one contiguous run
            if olds[k][1] != olds[k + 1][1] * olds[k + 1][0]:
                return None
        stride = olds[oi - 1][1]
        group: list[int] = []
        for d in reversed(news[j:nj]):
            group.append(stride)
            stride *= d
        strides_new += reversed(group)
        i, j = oi, nj
    it = iter(strides_new)
    for d in new:
        out.append(0 if d == 1 else next(it))
    return IndexMap(m.source, m.offset, tuple(out))


def _index(m: IndexMap, shape: tuple[int, ...], index: tuple[Any, ...]) -> IndexMap:
    """The map of `view[index]` (ints, slices, None, one Ellipsis), numpy's basic indexing."""
    items = list(index)
    if Ellipsis in items:
        at = items.index(Ellipsis)
        fill = len(shape) - sum(1 for x in items if x is not None and x is not Ellipsis)
        items[at:at + 1] = [slice(None)] * fill
    items += [slice(None)] * (len(shape) - sum(1 for x in items if x is not None))
    offset, strides, axis = m.offset, [], 0
    for item in items:
        if item is None:
            strides.append(0)
            continue
        dim, stride = shape[axis], m.strides[axis]
        axis += 1
        if isinstance(item, slice):
            # the whole axis needs no length: a dynamic one (Slice) is only ever taken whole
            whole = item.start in (None, 0) and item.stop is None and item.step in (None, 1)
            start, _, step = (0, None, 1) if whole else item.indices(dim)
            offset += start * stride
            strides.append(step * stride)
        else:
            offset += (item % dim) * stride
    return IndexMap(m.source, offset, tuple(strides))


def apply(node: Node, m: IndexMap) -> IndexMap | None:
    """The map of `node`'s result given its input's map (None: not an affine view)."""
    x = node.inputs[0].shape
    if node.op in ("Reshape", "ExpandDims", "Squeeze"):
        return _reshape(m, x, node.shape)
    if node.op == "BroadcastTo":  # new leading axes and stretched unit axes read stride 0
        pad = len(node.shape) - len(x)
        return IndexMap(m.source, m.offset, (0,) * pad + tuple(
            0 if d == 1 else s for d, s in zip(x, m.strides)))
    if node.op == "Transpose":
        return IndexMap(m.source, m.offset, tuple(m.strides[p] for p in node.attrs["perm"]))
    if node.op == "Slice":
        begin, size = node.attrs["begin"], node.attrs["size"]
        return _index(m, x, tuple(slice(b, None if s == -1 else b + s)
                                  for b, s in zip(begin, size)))
    if node.op == "StridedSlice":
        attrs = {**get_op("StridedSlice").attr_defaults, **node.attrs}
        masks = {k: attrs[k] for k in ("begin_mask", "end_mask", "ellipsis_mask",
                                       "new_axis_mask", "shrink_axis_mask")}
        return _index(m, x, strided_slice_index(x, attrs["begin"], attrs["end"],
                                                attrs["strides"], **masks))
    return None


def view_maps(nodes: list[Node], in_group: set[int]) -> dict[int, IndexMap]:
    """The index map of every mappable node of a group that reads, through a chain of such
    nodes, a value from outside the group."""
    maps: dict[int, IndexMap] = {}
    for node in nodes:
        if node.op not in MAPPABLE:
            continue
        src = node.inputs[0]
        base = maps.get(src.uid) if src.uid in in_group else \
            None if isinstance(src, Constant) and src.is_scalar else dense(src)
        if base is None:
            continue
        mapped = apply(node, base)
        if mapped is not None:
            maps[node.uid] = mapped
    return maps


def group_maps(nodes: list[Node], outputs: list[Value]) -> tuple[dict[int, IndexMap], set[int]]:
    """(the maps a kernel loads through, by node; the mapped nodes only other maps read)."""
    in_group = {n.uid for n in nodes}
    maps = view_maps(nodes, in_group)
    leaves = leaf_maps(nodes, outputs, maps)
    read = {v.uid for n in nodes if n.uid not in maps for v in n.inputs}
    read |= {v.uid for v in outputs}
    return leaves, {uid for uid in maps if uid not in read}


def leaf_maps(nodes: list[Node], outputs: list[Value], maps: dict[int, IndexMap]
              ) -> dict[int, IndexMap]:
    """The maps a kernel loads through: of nodes some non-view op (or the output) reads.
    A BroadcastTo, or a view that only adds or drops leading unit axes, read directly by the
    kernel keeps the plain broadcasting read (no map)."""
    read = {v.uid for n in nodes if n.uid not in maps for v in n.inputs}
    read |= {v.uid for v in outputs}
    by_uid = {n.uid: n for n in nodes}
    return {uid: m for uid, m in maps.items() if uid in read and not _plain(by_uid[uid], maps)}


def _plain(node: Node, maps: dict[int, IndexMap]) -> bool:
    if node.inputs[0].uid in maps:
        return False
    return node.op == "BroadcastTo" or get_op(node.op).view and \
        _strip_ones(node.inputs[0].shape) == _strip_ones(node.shape)


def _strip_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    start = 0
    while start < len(shape) and shape[start] == 1:
        start += 1
    return tuple(shape[start:])


# -- moving views above elementwise ops ---------------------------------------------------------

def sink_views(graph: Graph) -> Graph:
    """Rewrite V(E(x, y, ...)) as E(V(x'), V(y'), ...) for a layout op V whose input is an
    elementwise op E used only by V (x' is x broadcast to E's shape where it is smaller), until
    no more apply: the views end on the inputs of the elementwise work, where kernels read them
    through index maps.

    One scan in graph order, with the users computed once and kept up to date by each rewrite
    (a rescan and a users walk per rewrite was quadratic in depth). After a rewrite the scan
    goes back to E's place, where the moved views now stand: nodes before it cannot have become
    rewritable (a rewrite only moves E's uses to the new views and V's uses to the new E), so
    this applies the same rewrites in the same order as rescanning from the start."""
    users = graph.users()
    outputs = {v.uid for v in graph.outputs}
    at = 0
    while at < len(graph.nodes):
        view = graph.nodes[at]
        src = view.inputs[0] if view.subgraph is None and (
            view.op in SINKABLE or view.op in SLICES and _unary(view.inputs[0])) else None
        if not isinstance(src, Node) or not _pointwise(src) or src.uid in outputs or \
                _strip_ones(src.shape) == _strip_ones(view.shape):  # free where it is
            at += 1
            continue
        if len(users[src.uid]) != 1:
            kept = _merge_copies(graph, src, users, outputs)
            if kept is None:
                at += 1
            else:
                at = graph.nodes.index(kept)
            continue
        at = _sink(graph, at, src, users, outputs)
    return graph


def _same_view(a: Node, b: Node) -> bool:
    return a.subgraph is None and b.subgraph is None and a.op == b.op and \
        a.attrs == b.attrs and a.type == b.type and list(a.inputs) == list(b.inputs)


def _merge_copies(graph: Graph, src: Node, users: dict[int, list[Node]],
                  outputs: set[int]) -> Node | None:
    """Where every reader of `src` is the same view of it, one view instead (the earliest;
    the others' readers read it), returned; else None. Sinking one view through several
    readers of a value leaves a copy of it on each path (GPT-2's GeLU reads its input three
    times): merged, the value has one reader again and the view sinks on above it, so the
    op that computes it joins the readers' kernel."""
    readers = list(dict.fromkeys(users[src.uid]))
    first = readers[0]
    if len(readers) < 2 or first.op not in SINKABLE or \
            not all(_same_view(first, r) for r in readers[1:]):
        return None
    place = {node.uid: i for i, node in enumerate(graph.nodes)}
    readers.sort(key=lambda r: place[r.uid])
    kept, copies = readers[0], readers[1:]
    gone = {c.uid for c in copies}
    for copy in copies:
        for reader in dict.fromkeys(users.pop(copy.uid, [])):
            reader.inputs = [kept if v is copy else v for v in reader.inputs]
            users.setdefault(kept.uid, []).append(reader)
        if copy.uid in outputs:
            outputs.add(kept.uid)
    graph.remap_results({uid: kept for uid in gone})
    graph.nodes = [n for n in graph.nodes if n.uid not in gone]
    users[src.uid] = [kept]
    return kept


def _sink(graph: Graph, view_at: int, src: Node, users: dict[int, list[Node]],
          outputs: set[int]) -> int:
    """Move the view at `view_at` above its input `src`, keeping `users` and `outputs` up to
    date; returns the place the moved views start (src's old place)."""
    view = graph.nodes[view_at]
    at = view_at - 1
    while graph.nodes[at] is not src:  # src comes before its user, usually just before
        at -= 1
    new_inputs: list[Value] = []
    added: list[Node] = []
    for operand in src.inputs:
        element = _broadcast_element(operand)
        if element is not None:  # any view of one element is that element, inlined as a scalar
            new_inputs.append(element if element.is_scalar else
                              Constant(element.value.reshape(()), element.name))
            continue
        value = operand
        if tuple(operand.shape) != tuple(src.shape):
            value = Node("BroadcastTo", [operand], {"shape": tuple(src.shape)},
                         _typed(operand, src.shape), f"{view.name}_broadcast", view.loc)
            added.append(value)
        elif view.op == "Reshape" and _is_reshape(operand):
            # A reshape of a reshape is one reshape of the first's input; back to that
            # input's shape it is the input itself (a view sunk twice through a value read
            # several times: 3-D to 2-D and back).
            value = operand.inputs[0]
            if tuple(value.shape) == tuple(view.shape):
                new_inputs.append(value)
                continue
        moved = Node(view.op, [value], view.attrs, _typed(operand, view.shape), view.name,
                     view.loc)
        added.append(moved)
        new_inputs.append(moved)
    if all(isinstance(v, Constant) for v in new_inputs):
        # Only elements (constant folding leaves these where a size is dynamic): one of them
        # broadcast, so the op keeps its shape.
        broadcast = Node("BroadcastTo", [new_inputs[0]], {"shape": tuple(view.shape)},
                         _typed(new_inputs[0], view.shape), f"{view.name}_broadcast", view.loc)
        new_inputs[0] = broadcast
        added.append(broadcast)
    sub = _retyped(src.subgraph, new_inputs) if src.subgraph is not None else None
    compute = Node(src.op, new_inputs, src.attrs, view.type, src.name, src.loc, sub)
    compute.notes = dict(src.notes)
    graph.nodes[at:at + 1] = added
    graph.nodes[view_at + len(added) - 1] = compute
    # users: src's operands lose src (once per use) and gain the new nodes reading them;
    # V's readers read the new E instead
    for operand in src.inputs:
        readers = users[operand.uid]
        readers.remove(src)
    for node in added + [compute]:
        for value in node.inputs:
            users.setdefault(value.uid, []).append(node)
    # a reshape read through (above) that nothing reads any more goes
    for operand in dict.fromkeys(src.inputs):
        if isinstance(operand, Node) and _is_reshape(operand) and not users[operand.uid] and \
                operand.uid not in outputs:
            gone = graph.nodes.index(operand)
            del graph.nodes[gone]
            at -= gone < at
            users.get(operand.inputs[0].uid, [operand]).remove(operand)
            del users[operand.uid]
    del users[src.uid]
    readers = users.pop(view.uid, [])
    for reader in dict.fromkeys(readers):
        reader.inputs = [compute if v is view else v for v in reader.inputs]
    users[compute.uid] = readers
    graph.remap_results({view.uid: compute})
    if view.uid in outputs:
        outputs.add(compute.uid)
    return at


def _is_reshape(value: Value) -> TypeGuard[Node]:
    return isinstance(value, Node) and value.subgraph is None and value.op == "Reshape"


def _broadcast_element(value: Value) -> Constant | None:
    """The one-element constant `value` is (a scalar, or shaped (1, 1, ...)) or broadcasts (a
    loss's seed gradient), or None. Any layout op of it is the same element everywhere, so a
    sunk view need not read it through a map (a reshape of the broadcast does not fit the
    kernel's iteration space)."""
    if isinstance(value, Node) and value.subgraph is None and value.op == "BroadcastTo":
        value = value.inputs[0]
    return value if isinstance(value, Constant) and value.tensor_type.size == 1 else None


def _unary(value: Value) -> bool:
    """An op with one tensor operand of its own shape (a Cast, a Neg): a slice of its result
    is the op on a slice of its operand, which computes less and reads through one map."""
    if not isinstance(value, Node) or not isinstance(value.type, TensorType) or \
            not _pointwise(value):
        return False
    tensors = [v for v in value.inputs if not (isinstance(v, Constant) and v.is_scalar)]
    return len(tensors) == 1 and tuple(tensors[0].shape) == tuple(value.shape)


def _pointwise(node: Node) -> bool:
    """An elementwise op, or a composite of them with one output (an expanded BiasAdd)."""
    if node.subgraph is None:
        return get_op(node.op).kind == PatternKind.ELEMWISE
    return isinstance(node.type, TensorType) and all(
        n.subgraph is None and get_op(n.op).kind == PatternKind.ELEMWISE
        for n in node.subgraph.nodes)


def _retyped(sub: Graph, operands: list[Value]) -> Graph:
    """A composite's subgraph for new operand shapes: inputs retyped, every op re-inferred."""
    new = sub.clone()
    for inp, operand in zip(new.inputs, operands):
        inp.type = operand.type
    for node in new.nodes:
        opdef = get_op(node.op)
        node.type = opdef.infer(tuple(v.tensor_type for v in node.inputs),
                                {**opdef.attr_defaults, **node.attrs})
    return new


def _typed(like: Value, shape: tuple[int, ...]) -> Any:
    return TensorType(tuple(shape), like.dtype)
