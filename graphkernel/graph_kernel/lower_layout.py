"""Data-movement ops rewritten as the layout ops kernels read through index maps
(graph_kernel/index_maps.py), before clustering, with fusion on:

- Split and Unstack: each item read becomes a Slice of the input (Unstack: + a Reshape
  dropping the axis), so its consumer kernel reads its part of the input in place instead of
  a copy made by a library call (TVM's split as strided slices);
- Tile where every axis is either tiled or copied once from a size-1 axis (tiling a row, a
  column, a scalar): a BroadcastTo, read with stride 0.

Tile of an axis longer than one repeats it modulo its length (no affine map), and Concat reads
one of several buffers depending on the index: both stay library calls, and so does Gather,
whose index is data and whose out-of-range check is Python's."""
from __future__ import annotations

from graphkernel.ir.graph import Graph, Node, Value
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import TensorType


def _node(op: str, source: Node, value: Value, name: str, **attrs: object) -> Node:
    opdef = get_op(op)
    type_ = opdef.infer((value.tensor_type,), {**opdef.attr_defaults, **attrs})
    return Node(op, [value], attrs, type_, name, source.loc)


def lower_to_views(graph: Graph) -> Graph:
    users = graph.users()
    results = {v.uid for v in graph.results()}
    replace: dict[int, Node] = {}  # GetItem or Tile uid -> the layout node computing it
    drop: set[int] = set()
    nodes: list[Node] = []
    for node in graph.nodes:
        if node.uid in drop:
            continue
        readers = users.get(node.uid, [])
        if node.op in ("Split", "Unstack") and node.subgraph is None and \
                node.uid not in results and all(u.op == "GetItem" for u in readers):
            nodes += _split_items(node, readers, replace)
            drop |= {u.uid for u in readers}
            continue
        if node.op == "Tile" and node.subgraph is None and _tile_broadcasts(node):
            x = node.inputs[0]
            padded = (1,) * (len(node.shape) - len(x.shape)) + tuple(x.shape)
            source = x
            if padded != tuple(x.shape):
                source = _node("Reshape", node, x, f"{node.name}_rank", shape=padded)
                nodes.append(source)
            broadcast = _node("BroadcastTo", node, source, node.name, shape=tuple(node.shape))
            nodes.append(broadcast)
            replace[node.uid] = broadcast
            continue
        nodes.append(node)
    graph.nodes = nodes
    for n in graph.nodes:
        n.inputs = [replace.get(v.uid, v) for v in n.inputs]
    graph.remap_results(dict(replace))
    return graph


def _split_items(node: Node, items: list[Node], replace: dict[int, Node]) -> list[Node]:
    x = node.inputs[0]
    attrs = {**get_op(node.op).attr_defaults, **node.attrs}
    rank = len(x.shape)
    axis = attrs["axis"] % rank
    part = x.shape[axis] // attrs["output_num"] if node.op == "Split" else 1
    out: list[Node] = []
    for item in items:
        k = item.attrs["index"]
        begin = [0] * rank
        size = list(x.shape)
        begin[axis], size[axis] = k * part, part
        piece = _node("Slice", node, x, f"{node.name}_{k}", begin=tuple(begin), size=tuple(size))
        out.append(piece)
        if node.op == "Unstack":
            shape = tuple(d for i, d in enumerate(x.shape) if i != axis)
            piece = _node("Reshape", node, piece, f"{node.name}_{k}_item", shape=shape)
            out.append(piece)
        assert isinstance(item.type, TensorType) and piece.type == item.type
        replace[item.uid] = piece
    return out


def _tile_broadcasts(node: Node) -> bool:
    x = node.inputs[0]
    mult = tuple(int(m) for m in {**get_op("Tile").attr_defaults, **node.attrs}["multiples"])
    padded = (1,) * (len(mult) - len(x.shape)) + tuple(x.shape)
    return 0 not in node.shape and all(m == 1 or d == 1 for m, d in zip(mult, padded))
