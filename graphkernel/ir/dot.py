"""DOT export of a graph. A small writer of our own that quotes every id and label, so names
from user code (quotes, backslashes, braces, newlines) cannot break the file.

Composite nodes become clusters holding their member ops; edges carry shapes and dtypes.
"""
from __future__ import annotations

import re

from graphkernel.ir.graph import USER_GRAPH_KERNEL, Constant, Graph, Node, Value

# Fill colours for fused kernels, picked in turn.
PALETTE = ("#fde2b4", "#c9e7f8", "#d5f0c8", "#f6cde0", "#e3d7f6", "#fff4a8", "#cdeee8")


def node_label(node: Node) -> str:
    """The same label for a node in every stage, inside a kernel or not: its name when that
    says the op (`Mul`, `Mul_1`), else the name over the op."""
    if node.name == node.op or re.fullmatch(re.escape(node.op) + r"_\d+", node.name):
        return node.name
    return f"{node.name}\n{node.op}"


def cluster_label(node: Node) -> str:
    """A user's GraphKernel says so; a fused or expanded composite is named after its ops."""
    if USER_GRAPH_KERNEL in node.notes:
        return f"user GraphKernel: {node.notes[USER_GRAPH_KERNEL]}"
    return node.name


def quote(text: str) -> str:
    """A DOT double-quoted string: escapes backslash, quote and line breaks."""
    escaped = (text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "")
               .replace("\n", "\\n"))
    return f'"{escaped}"'


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        # Edges go after all nodes at the top level: an edge written inside a cluster block
        # would pull its source node into that cluster.
        self.edges: list[str] = []
        self.ids: dict[int, str] = {}
        self.cluster_index = 0
        self.const_count = 0
        # uid of a multi-output composite -> ids of the inner producers of its outputs
        self.multi_outputs: dict[int, list[str]] = {}

    def node_id(self, value: Value) -> str:
        if value.uid not in self.ids:
            self.ids[value.uid] = f"n{len(self.ids)}"
        return self.ids[value.uid]


def to_dot(graph: Graph, title: str = "") -> str:
    """The graph as DOT text."""
    w = _Writer()
    w.lines.append(f"digraph {quote(graph.name)} {{")
    w.lines.append('  graph [rankdir=TB, fontname="Helvetica", fontsize=11, '
                   f'label={quote(title or graph.name)}, labelloc=t];')
    w.lines.append('  node [fontname="Helvetica", fontsize=10];')
    w.lines.append('  edge [fontname="Helvetica", fontsize=9, color="#555555"];')
    for inp in graph.inputs:
        shape = "box3d" if inp.kind == "weight" else "ellipse"
        w.lines.append(f"  {w.node_id(inp)} [label={quote(inp.name + chr(10) + str(inp.type))}, "
                       f'shape={shape}, style=filled, fillcolor="#eeeeee"];')
    _emit_nodes(graph, w, indent="  ", outer_map={})
    ret = '"return"'
    w.lines.append(f'  {ret} [label="return", shape=doublecircle, style=filled, '
                   'fillcolor="#dddddd"];')
    for value in graph.outputs:
        _edge(w, value, ret, "  ", {})
    for index, (weight, value) in enumerate(graph.assigns):
        target = quote(f"assign{index}")
        w.lines.append(f"  {target} [label={quote('assign ' + weight.name)}, shape=box3d, "
                       'style="filled,dashed", fillcolor="#eeeeee"];')
        _edge(w, value, target, "  ", {})
    w.lines.extend(w.edges)
    w.lines.append("}")
    return "\n".join(w.lines) + "\n"


def _edge(w: _Writer, src: Value, dst: str, indent: str, outer_map: dict[int, str]) -> None:
    if isinstance(src, Constant) and src.is_scalar:
        w.const_count += 1
        cid = f"c{w.const_count}"
        w.lines.append(f"{indent}{cid} [label={quote(src.literal())}, shape=plaintext, "
                       "fontsize=9];")
        w.edges.append(f"  {cid} -> {dst};")
        return
    source = outer_map.get(src.uid) or w.node_id(src)
    w.edges.append(f"  {source} -> {dst} [label={quote(str(src.type))}];")


def _emit_nodes(graph: Graph, w: _Writer, indent: str, outer_map: dict[int, str]) -> None:
    for const in graph.constants():
        if not const.is_scalar:
            label = quote(f"{const.name}\n{const.type}")
            w.lines.append(f"{indent}{w.node_id(const)} [label={label}, shape=note];")
    for node in graph.nodes:
        if node.subgraph is None:
            w.lines.append(f"{indent}{w.node_id(node)} [label={quote(node_label(node))}, "
                           'shape=box, style="rounded,filled", fillcolor="#ffffff"];')
            for value in node.inputs:
                if node.op == "GetItem" and value.uid in w.multi_outputs:
                    src = w.multi_outputs[value.uid][node.attrs["index"]]
                    w.edges.append(f"  {src} -> {w.node_id(node)} "
                                   f"[label={quote(str(node.type))}];")
                    continue
                _edge(w, value, w.node_id(node), indent, outer_map)
            continue
        _emit_cluster(node, w, indent, outer_map)


def _emit_cluster(node: Node, w: _Writer, indent: str, outer_map: dict[int, str]) -> None:
    """A composite: its inner ops inside a coloured cluster named after the kernel."""
    assert node.subgraph is not None
    cluster = f"cluster_{w.node_id(node)}"
    w.lines.append(f"{indent}subgraph {cluster} {{")
    if USER_GRAPH_KERNEL in node.notes:  # the user's own composite: dashed, no kernel colour
        w.lines.append(f"{indent}  label={quote(cluster_label(node))}; style=\"dashed,filled\"; "
                       'fillcolor="#f2f4f7"; color="#344054"; penwidth=1.5;')
    else:
        colour = PALETTE[w.cluster_index % len(PALETTE)]
        w.cluster_index += 1
        w.lines.append(f"{indent}  label={quote(cluster_label(node))}; style=filled; "
                       f'fillcolor={quote(colour)}; color="#888888";')
    inner_map = dict(outer_map)
    # Inner inputs are drawn as the outer values feeding the composite.
    for outer, inner_input in zip(node.inputs, node.subgraph.inputs):
        inner_map[inner_input.uid] = outer_map.get(outer.uid) or w.node_id(outer)
    scalar_inputs = {inner_input.uid: outer
                     for outer, inner_input in zip(node.inputs, node.subgraph.inputs)
                     if isinstance(outer, Constant) and outer.is_scalar}
    for inner in node.subgraph.nodes:
        if inner.subgraph is not None:
            _emit_cluster(inner, w, indent + "  ", inner_map)
            continue
        w.lines.append(f"{indent}  {w.node_id(inner)} [label={quote(node_label(inner))}, "
                       "shape=box, "
                       'style="rounded,filled", fillcolor="#ffffff"];')
        for value in inner.inputs:
            if value.uid in scalar_inputs:
                _edge(w, scalar_inputs[value.uid], w.node_id(inner), indent + "  ", {})
            else:
                _edge(w, value, w.node_id(inner), indent + "  ", inner_map)
    w.lines.append(f"{indent}}}")
    # The composite's outputs: later nodes refer to the composite; point them at the inner
    # producer so edges leave the cluster from the right op.
    outs = node.subgraph.outputs
    if len(outs) == 1:
        w.ids[node.uid] = inner_map.get(outs[0].uid) or w.node_id(outs[0])
    else:
        w.ids[node.uid] = w.node_id(outs[0])
        w.multi_outputs[node.uid] = [inner_map.get(o.uid) or w.node_id(o) for o in outs]


