"""Data-movement ops rewritten as the layout ops kernels read through index maps
(graph_kernel/index_maps.py), before clustering, with fusion on:

- Split and Unstack: each item read becomes a Slice of the input (Unstack: + a Reshape
  dropping the axis), so its consumer kernel reads its part of the input in place instead of
  a copy made by a library call (TVM's split as strided slices);
- Tile where every axis is either tiled or copied once from a size-1 axis (tiling a row, a
  column, a scalar): a BroadcastTo, read with stride 0;
- Gather whose indices are a constant run start, start + step, ... inside the axis (the
  positions 0..S-1 of a position embedding): a Slice or StridedSlice of the table.

A Gather whose indices are data stays a library call (its out-of-range check is Python's). A
Concat and a Tile of a longer axis need no rewrite: a pointwise kernel reads a Concat of its
inputs piece by piece and a Tile modulo its input's length (Schedule.concats, Schedule.tiles)."""
from __future__ import annotations

import numpy as np

from graphkernel.ir.graph import Constant, Graph, Node, Value
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
        # The views (StridedSlice, BroadcastTo) take static sizes, and Slice takes a dynamic
        # dimension (Cell.set_inputs, an ONNX dim_param) only whole: an op that would cut one
        # stays as it is.
        static = all(isinstance(v.type, TensorType) and v.tensor_type.is_static
                     for v in node.inputs)
        if node.op in ("Split", "Unstack") and node.subgraph is None and \
                _split_axis_static(node) and node.uid not in results and \
                all(u.op == "GetItem" for u in readers):
            nodes += _split_items(node, readers, replace)
            drop |= {u.uid for u in readers}
            continue
        if node.op == "Tile" and node.subgraph is None and static and _tile_broadcasts(node):
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
        run = _constant_run(node) if node.op == "Gather" and node.subgraph is None else None
        if run is not None:
            table = node.inputs[0]
            axis, start, count, step = run
            begin, end, strides = [0] * len(table.shape), list(table.shape), \
                [1] * len(table.shape)
            begin[axis], end[axis], strides[axis] = start, start + (count - 1) * step + 1, step
            rows = _node("StridedSlice", node, table, node.name, begin=tuple(begin),
                         end=tuple(end), strides=tuple(strides))
            nodes.append(rows)
            replace[node.uid] = rows
            continue
        nodes.append(node)
    graph.nodes = nodes
    for n in graph.nodes:
        n.inputs = [replace.get(v.uid, v) for v in n.inputs]
    graph.remap_results(dict(replace))
    return graph


def _split_axis_static(node: Node) -> bool:
    """Whether the axis a Split or Unstack cuts has a static length: its items are then Slices
    (their other axes, dynamic ones too, taken whole)."""
    x = node.inputs[0]
    if not isinstance(x.type, TensorType):
        return False
    attrs = {**get_op(node.op).attr_defaults, **node.attrs}
    return isinstance(x.shape[attrs["axis"] % len(x.shape)], (int, np.integer))


def _split_items(node: Node, items: list[Node], replace: dict[int, Node]) -> list[Node]:
    x = node.inputs[0]
    attrs = {**get_op(node.op).attr_defaults, **node.attrs}
    rank = len(x.shape)
    axis = attrs["axis"] % rank
    part = x.shape[axis] // attrs["output_num"] if node.op == "Split" else 1
    out: list[Node] = []
    for item in items:
        k = item.attrs["index"]
        # the other axes whole (-1): a dynamic batch is sliced whole (Slice's infer)
        begin, size = [0] * rank, [-1] * rank
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


def _constant_run(node: Node) -> tuple[int, int, int, int] | None:
    """(axis, start, count, step) when a Gather's indices are a constant 1-d run inside the
    axis, step >= 1."""
    table, indices = node.inputs
    if not isinstance(indices, Constant) or indices.value.ndim != 1 or \
            indices.value.size == 0 or indices.dtype.kind not in "iu":
        return None
    attrs = {**get_op("Gather").attr_defaults, **node.attrs}
    axis = attrs["axis"] % len(table.shape)
    size = table.shape[axis]
    if not isinstance(size, int):  # a dynamic axis: the Gather checks the indices when it runs
        return None
    values = indices.value.astype(np.int64)
    if attrs["negative_indices"]:  # -1 is the last row (out-of-range ones stay a Gather)
        values = np.where(values < 0, values + size, values)
    start = int(values[0])
    step = int(values[1] - values[0]) if values.size > 1 else 1
    if step < 1 or start < 0 or int(values[-1]) >= size or \
            not np.array_equal(values, start + step * np.arange(values.size)):
        return None
    return axis, start, int(values.size), step
