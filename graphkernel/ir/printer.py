"""Text form of a graph: the `.ir` files a user reads."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.ir.graph import Constant, Graph, Node, Value


def _attr_text(value: Any) -> str:
    if isinstance(value, np.generic):  # shortest text for its dtype: 1e-05, not np.float32(...)
        return str(value)
    if isinstance(value, tuple | list):
        items = ", ".join(_attr_text(v) for v in value)
        return f"({items},)" if isinstance(value, tuple) and len(value) == 1 else \
            (f"({items})" if isinstance(value, tuple) else f"[{items}]")
    if hasattr(value, "name") and not isinstance(value, str):
        return str(value.name)
    return repr(value)


class _Namer:
    def __init__(self) -> None:
        self.names: dict[int, str] = {}

    def name(self, value: Value) -> str:
        if isinstance(value, Constant):
            return value.literal() if value.is_scalar else f"%{value.name}"
        return self.names.get(value.uid, f"%?{value.name}")


def print_graph(graph: Graph, header: str = "") -> str:
    """The whole graph as text, composites with their inner graphs indented."""
    lines: list[str] = []
    if header:
        lines.append(f"# {header}")
    lines.append(f"# graph {graph.name}: {len(graph.inputs)} inputs, {len(graph.nodes)} nodes")
    _print_into(graph, lines, _Namer(), indent="")
    return "\n".join(lines) + "\n"


def _print_into(graph: Graph, lines: list[str], namer: _Namer, indent: str) -> None:
    for i, inp in enumerate(graph.inputs):
        namer.names[inp.uid] = f"%para{i + 1}_{inp.name}"
        kind = "" if inp.kind == "input" else f"  # {inp.kind}"
        lines.append(f"{indent}{namer.names[inp.uid]} : {inp.type}{kind}")
    for const in graph.constants():
        if not const.is_scalar:
            lines.append(f"{indent}%{const.name} = Constant : {const.type}")
    for index, node in enumerate(graph.nodes):
        namer.names[node.uid] = f"%{index + 1}"
        lines.append(indent + _node_line(node, namer))
        if node.subgraph is not None:
            lines.append(f"{indent}  {{  # subgraph {node.subgraph.name}")
            _print_into(node.subgraph, lines, namer, indent + "    ")
            lines.append(f"{indent}  }}")
    for weight, value in graph.assigns:
        lines.append(f"{indent}assign {namer.name(weight)} <- {namer.name(value)}")
    for value in graph.effects:
        lines.append(f"{indent}effect {namer.name(value)}")
    outs = ", ".join(namer.name(v) for v in graph.outputs)
    lines.append(f"{indent}return ({outs})" if len(graph.outputs) != 1 or graph.returns_tuple
                 else f"{indent}return {outs}")


def _node_line(node: Node, namer: _Namer) -> str:
    args = ", ".join(namer.name(v) for v in node.inputs)
    attrs = ""
    if node.attrs:
        attrs = " {" + ", ".join(f"{k}={_attr_text(v)}" for k, v in sorted(node.attrs.items())) \
            + "}"
    label = node.op if node.name == node.op else f"{node.op}[{node.name}]"
    text = f"{namer.names[node.uid]} = {label}({args}){attrs} : {node.type}"
    notes = []
    if node.loc is not None:
        notes.append(f"{node.loc.filename.rsplit('/', 1)[-1]}:{node.loc.lineno} "
                     f"{node.loc.text.strip()}")
    for key, value in node.notes.items():
        text_value = " ".join(map(str, value)) if isinstance(value, list) else value
        notes.append(f"{key}: {text_value}")
    if node.lowering is not None:
        notes.append(f"lowering: {node.lowering}")
    if notes:
        text += "    # " + "; ".join(notes)
    return text

