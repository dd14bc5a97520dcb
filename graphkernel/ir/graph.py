"""The graph IR: values (inputs, constants, op nodes) in a topologically ordered graph.

A composite node (a user's GraphKernel cell, an expanded op, or a fused group) holds its own
subgraph; its inputs map one to one onto the subgraph's inputs and its outputs onto the
subgraph's outputs. An op with several outputs has a TupleType; `GetItem` nodes pick items.

A graph may also assign values to its weights (`Graph.assigns`): after each call, the Parameter
bound to that weight holds the value, written into its own array (MindSpore's Assign on a
Parameter; optimizers and BatchNorm's moving statistics). Assigned values leave the graph like
outputs do: passes keep them alive and remap them through `remap_results`. So do the results of
nodes with an effect (`Graph.effects`: Print), which nothing may read: the node stays where
construct called it, in the order of its inputs, and runs on every call.
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from graphkernel.errors import SourceLocation
from graphkernel.ir.opset import PatternKind, get_op
from graphkernel.ir.types import TensorType, TupleType, ValueType

_ids = itertools.count()


class Value:
    """Anything a node can consume."""

    type: ValueType
    name: str

    def __init__(self, type_: ValueType, name: str) -> None:
        self.type = type_
        self.name = name
        self.uid = next(_ids)

    @property
    def tensor_type(self) -> TensorType:
        assert isinstance(self.type, TensorType), f"{self.name} is a tuple"
        return self.type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensor_type.shape

    @property
    def dtype(self) -> np.dtype:
        return self.tensor_type.dtype


class Input(Value):
    """A graph parameter: a call argument (`kind="input"`) or a Cell's Parameter (`"weight"`)."""

    def __init__(self, type_: TensorType, name: str, kind: str = "input",
                 binding: Any = None) -> None:
        super().__init__(type_, name)
        self.kind = kind
        self.binding = binding  # the Parameter object a weight reads at call time


class Constant(Value):
    """A constant array; a 0-d constant is a scalar that code generators inline."""

    def __init__(self, value: np.ndarray, name: str = "") -> None:
        value = np.array(value, copy=True)  # never alias (or freeze) a user's array
        super().__init__(TensorType(tuple(value.shape), value.dtype), name or "const")
        self.value = value
        self.value.setflags(write=False)

    @property
    def is_scalar(self) -> bool:
        return self.value.ndim == 0

    def literal(self) -> str:
        """Readable text of the constant (scalars; small arrays are summarised)."""
        if self.is_scalar:
            # numpy's shortest text that reads back as the same value of this dtype: a float32
            # 1e-05 prints 1e-05, not the float64 expansion 9.999999747378752e-06.
            return str(self.value[()])
        return f"array{self.type}"


# Node.notes key marking a composite the user declared (an nn.GraphKernel cell); its value is
# the cell's class name. Composites made by fusion carry "fused_from", expanded ops
# "expanded_from".
USER_GRAPH_KERNEL = "user_graph_kernel"

# The parts of a training step, in the order they run. A node of the backward carries
# GRAD_OF (the forward node it differentiates: passes/autodiff.py); an optimizer's update is
# noted PHASE (nn/optim/optimizer.py), as are nodes made from several parts (an expanded op, a
# fused group: the parts' names, space-separated). A node with neither is the forward's.
FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"
PHASES = (FORWARD, BACKWARD, OPTIMIZER)
PHASE = "phase"
GRAD_OF = "grad_of"


def node_phases(node: Value) -> tuple[str, ...]:
    """The parts of a training step `node` computes, in PHASES order: its PHASE note (only the
    words of PHASES count: a note read from a file is text, not trusted), else backward when it
    is a gradient's node, else the forward."""
    if not isinstance(node, Node):
        return (FORWARD,)
    noted = node.notes.get(PHASE)
    if isinstance(noted, str):
        words = set(noted.split())
        found = tuple(p for p in PHASES if p in words)
        if found:
            return found
    return (BACKWARD,) if GRAD_OF in node.notes else (FORWARD,)


def phases_of(nodes: Any) -> tuple[str, ...]:
    """The union of the nodes' parts, in PHASES order."""
    found = {p for n in nodes for p in node_phases(n)}
    return tuple(p for p in PHASES if p in found)


def note_phases(notes: dict[str, Any], phases: tuple[str, ...]) -> None:
    """Note in `notes` (of a node made from others: an expansion, a fused group; or a
    builder's, for every node it makes) the parts it computes; the forward needs no note."""
    if phases and phases != (FORWARD,):
        notes[PHASE] = " ".join(phases)


class Node(Value):
    """An op applied to values."""

    def __init__(self, op: str, inputs: list[Value], attrs: dict[str, Any], type_: ValueType,
                 name: str = "", loc: SourceLocation | None = None,
                 subgraph: Graph | None = None) -> None:
        super().__init__(type_, name or op)
        self.op = op
        self.inputs = list(inputs)
        self.attrs = dict(attrs)
        self.loc = loc
        self.subgraph = subgraph
        # Notes from passes (e.g. the origin of a fused node), shown in dumps.
        self.notes: dict[str, Any] = {}
        # A composite's loop-nest schedule (graph_kernel/schedule.py), planned once by the last
        # backend stage for code generation. Keyed by this graph's node ids, so a clone (a new
        # stage) starts without one.
        self.schedule: Any = None
        # What it runs as, and why (graph_kernel/lower.py `Lowering`), set by lowering, the
        # last stage; like the schedule, a clone starts without one.
        self.lowering: Any = None

    @property
    def is_composite(self) -> bool:
        return self.subgraph is not None

    @property
    def kind(self) -> PatternKind:
        if self.subgraph is not None:
            return max((n.kind for n in self.subgraph.nodes), default=PatternKind.ELEMWISE)
        return get_op(self.op).kind

    def __repr__(self) -> str:
        return f"<Node {self.name}: {self.op} -> {self.type}>"


class Graph:
    """A function: inputs, nodes in topological order, outputs."""

    def __init__(self, name: str, inputs: list[Input] | None = None,
                 nodes: list[Node] | None = None, outputs: list[Value] | None = None) -> None:
        self.name = name
        self.inputs: list[Input] = list(inputs or [])
        self.nodes: list[Node] = list(nodes or [])
        self.outputs: list[Value] = list(outputs or [])
        # Set by tracing: the output is a tuple (construct returned a tuple).
        self.returns_tuple = False
        # (weight input, value): after each call the weight's Parameter holds the value.
        self.assigns: list[tuple[Input, Value]] = []
        # Nodes kept for their effect (OpDef.effect: Print), not for a result anyone reads.
        self.effects: list[Value] = []
        # The backend whose kernels lowering chose for its nodes (Node.lowering); a clone
        # starts unlowered.
        self.lowered_for: str | None = None

    # -- queries --------------------------------------------------------------------------
    def users(self) -> dict[int, list[Node]]:
        """uid of a value -> nodes that consume it."""
        out: dict[int, list[Node]] = {}
        for node in self.nodes:
            for value in node.inputs:
                out.setdefault(value.uid, []).append(node)
        return out

    def results(self) -> list[Value]:
        """Every value that leaves the graph: its outputs, then the values it assigns."""
        return self.outputs + [value for _, value in self.assigns] + self.effects

    def constants(self) -> list[Constant]:
        seen: dict[int, Constant] = {}
        for node in self.nodes:
            for value in node.inputs:
                if isinstance(value, Constant):
                    seen.setdefault(value.uid, value)
        for value in self.results():
            if isinstance(value, Constant):
                seen.setdefault(value.uid, value)
        return list(seen.values())

    # -- edits ----------------------------------------------------------------------------
    def replace_uses(self, old: Value, new: Value) -> None:
        for node in self.nodes:
            node.inputs = [new if v is old else v for v in node.inputs]
        self.outputs = [new if v is old else v for v in self.outputs]
        self.assigns = [(w, new if v is old else v) for w, v in self.assigns]
        self.effects = [new if v is old else v for v in self.effects]

    def remap_results(self, mapping: dict[int, Value]) -> None:
        """Replace outputs and assigned values by uid (values not in `mapping` stay)."""
        self.outputs = [mapping.get(v.uid, v) for v in self.outputs]
        self.assigns = [(w, mapping.get(v.uid, v)) for w, v in self.assigns]
        self.effects = [mapping.get(v.uid, v) for v in self.effects]

    def clone(self) -> Graph:
        """A deep copy: new value objects, same structure (constants are shared, immutable)."""
        mapping: dict[int, Value] = {}
        inputs = []
        for inp in self.inputs:
            new_inp = Input(inp.tensor_type, inp.name, inp.kind, inp.binding)
            mapping[inp.uid] = new_inp
            inputs.append(new_inp)
        nodes = []
        for node in self.nodes:
            new_node = Node(node.op, [mapping.get(v.uid, v) for v in node.inputs], node.attrs,
                            node.type, node.name, node.loc,
                            node.subgraph.clone() if node.subgraph is not None else None)
            new_node.notes = dict(node.notes)
            mapping[node.uid] = new_node
            nodes.append(new_node)
        graph = Graph(self.name, inputs, nodes, [mapping.get(v.uid, v) for v in self.outputs])
        graph.returns_tuple = self.returns_tuple
        graph.assigns = [(mapping[w.uid], mapping.get(v.uid, v))  # type: ignore[misc]  # weights map to Inputs
                         for w, v in self.assigns]
        graph.effects = [mapping.get(v.uid, v) for v in self.effects]
        return graph


def output_types(node: Value) -> tuple[TensorType, ...]:
    if isinstance(node.type, TupleType):
        return node.type.items
    return (node.type,)
