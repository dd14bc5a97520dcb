"""Reverse-mode automatic differentiation over the IR: gradients of some values of a graph with
respect to others, appended to the same graph as ordinary nodes.

The backward nodes join the forward graph, so one graph goes through the pipeline: fusion,
dumps and the report see forward and backward together. Each op's gradient rule is declared with
the op (`OpDef.grad` in ir/opdefs/); this pass walks the graph backwards from the differentiated
outputs, calls the rules, and sums the contributions a value receives from its several users.

Kept or recomputed: a rule reads the forward values it needs (the op's inputs, its output) from
the forward graph: they are kept, one buffer each, as between any two kernels. What a composite
op computes inside (GeLU's tanh, Softmax's exponentials and row sum, LayerNorm's normalised x)
is never kept: its gradient composite (GeLUGrad, SoftmaxGrad, LayerNormGrad, in
ir/opdefs/grad.py) recomputes it inside the backward kernel from those inputs and outputs. A
user's GraphKernel cell differentiates the same way: its backward is one composite that
recomputes the cell's inner values from the cell's inputs.
"""
from __future__ import annotations

from typing import Any

from graphkernel.errors import GradientError
from graphkernel.ir import types as T
from graphkernel.ir.build import GraphBuilder
from graphkernel.ir.graph import Graph, Input, Node, Value
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import TensorType, TupleType
from graphkernel.passes.general import eliminate_dead_nodes


def differentiable(value: Value) -> bool:
    return isinstance(value.type, TensorType) and T.is_float(value.dtype)


def gradients(graph: Graph, outputs: list[Value], sens: list[Value], wrt: list[Value],
              builder: GraphBuilder | None = None) -> list[Value]:
    """The gradients of sum(sens[i] * outputs[i]) with respect to each value of `wrt` (inputs,
    constants or nodes of `graph`), built as nodes appended to `graph`. A value the outputs do
    not depend on gets a zero gradient."""
    b = builder or GraphBuilder(graph)
    for value, s in zip(outputs, sens):
        if s.type != value.type:
            raise GradientError(f"the sensitivity of {value.name} is {s.type}, its value is "
                                f"{value.type}")
    wanted = {v.uid for v in wrt}
    depends = set(wanted)
    for node in graph.nodes:
        if node.uid not in depends and any(v.uid in depends for v in node.inputs):
            depends.add(node.uid)
    needed = {v.uid for v in outputs}
    for node in reversed(graph.nodes):
        if node.uid in needed:
            needed.update(v.uid for v in node.inputs)
    active = [n for n in graph.nodes if n.uid in depends and n.uid in needed]

    adjoints: dict[int, list[Value]] = {}
    items: dict[int, dict[int, list[Value]]] = {}  # a tuple-valued node's items' gradients
    for value, s in zip(outputs, sens):
        if value.uid in depends and differentiable(value):
            adjoints.setdefault(value.uid, []).append(s)
    saved_loc, saved_notes = b.loc, b.notes
    try:
        for node in reversed(active):
            b.loc, b.notes = node.loc, {**saved_notes, "grad_of": node.name}
            if node.op == "GetItem":
                if node.uid in adjoints:
                    slot = items.setdefault(node.inputs[0].uid, {})
                    slot.setdefault(node.attrs["index"], []).append(_total(b, adjoints[node.uid]))
                continue
            if isinstance(node.type, TupleType):
                got = items.get(node.uid, {})
                if not got:
                    continue
                dout: object = tuple(_total(b, got[i]) if i in got and differentiable_type(t)
                                     else None for i, t in enumerate(node.type.items))
            else:
                if node.uid not in adjoints or not differentiable(node):
                    continue
                dout = _total(b, adjoints[node.uid])
            for inp, grad in zip(node.inputs, _rule(b, node, dout)):
                if grad is None or inp.uid not in depends or not differentiable(inp):
                    continue
                if grad.shape != inp.shape:
                    raise GradientError(f"the gradient rule of {node.op} gave {grad.type} for "
                                        f"its input {inp.name} of type {inp.type} (a "
                                        "graphkernel bug)", node.loc)
                adjoints.setdefault(inp.uid, []).append(b.cast(grad, inp.dtype))
        b.loc, b.notes = saved_loc, saved_notes
        return [_total(b, adjoints[v.uid]) if v.uid in adjoints else b.zeros(v.tensor_type)
                for v in wrt]
    finally:
        b.loc, b.notes = saved_loc, saved_notes


def differentiable_type(type_: TensorType) -> bool:
    return T.is_float(type_.dtype)


def _total(b: GraphBuilder, terms: list[Value]) -> Value:
    total = terms[0]
    for term in terms[1:]:
        total = b("Add", total, term)
    return total


def _rule(b: GraphBuilder, node: Node, dout: object) -> list[Value | None]:
    if node.subgraph is not None:
        return _composite_grad(b, node, dout)
    opdef = get_op(node.op)
    if opdef.grad is None:
        forward = _forward_of(b.graph, node)
        if forward is not None:  # an op a first-order rule wrote, not the user
            raise GradientError(f"second-order gradient of {forward.op} is not supported: the "
                                f"gradient of {forward.name} is computed by {node.op}, which "
                                "has no gradient rule of its own (differentiate once, or "
                                f"write the derivative of {forward.op} out of ops that have "
                                "one)", node.loc)
        raise GradientError(f"{node.op} has no gradient rule, so {node.name} cannot be "
                            "differentiated (compute the value it gives without it, or stop "
                            "the gradient before it)", node.loc)
    return list(opdef.grad(b, node, dout, {**opdef.attr_defaults, **node.attrs}))


def _forward_of(graph: Graph, node: Node) -> Node | None:
    """The user's node whose gradient rule built `node` (None for a node the user wrote)."""
    name = node.notes.get("grad_of")
    if name is None:
        return None
    found = next((n for n in graph.nodes if n.name == name and n is not node), None)
    if found is not None and found.notes.get("grad_of") is not None:
        return _forward_of(graph, found) or found
    return found


def _composite_grad(b: GraphBuilder, node: Node, dout: object) -> list[Value | None]:
    """A user's GraphKernel cell: its backward is one composite node whose subgraph recomputes
    the cell's forward from its inputs and runs the gradient rules of its inner ops."""
    assert node.subgraph is not None
    sub = node.subgraph.clone()
    douts: list[Any] = list(dout) if isinstance(dout, tuple) else [dout]  # Values or None
    seeds: list[tuple[Value, Value]] = []
    outer_douts: list[Value] = []
    for i, (out, d) in enumerate(zip(sub.outputs, douts)):
        if d is None:
            continue
        inner = Input(d.tensor_type, f"dout{i}")
        sub.inputs.append(inner)
        seeds.append((out, inner))
        outer_douts.append(d)
    wrt: list[Value] = [v for v in sub.inputs[:len(node.inputs)] if differentiable(v)]
    inner_b = GraphBuilder(sub)
    grads = gradients(sub, [o for o, _ in seeds], [s for _, s in seeds], wrt, inner_b)
    sub.outputs = grads
    sub.returns_tuple = len(grads) > 1
    sub.name = f"{sub.name}Grad"
    eliminate_dead_nodes(sub)
    type_ = grads[0].type if len(grads) == 1 else TupleType(tuple(g.tensor_type for g in grads))
    back = b.graph.nodes
    grad_node = Node("Composite", list(node.inputs) + outer_douts, {}, type_,
                     b.namer(f"{node.name}Grad"), node.loc, sub)
    grad_node.notes.update(b.notes)
    back.append(grad_node)
    by_input = iter([grad_node] if len(grads) == 1 else b.items(grad_node))
    return [next(by_input) if differentiable(v) else None for v in node.inputs]
