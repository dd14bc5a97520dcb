"""The IR verifier: checks that a graph is well formed after every pass."""
from __future__ import annotations

from graphkernel.errors import VerifyError
from graphkernel.ir.graph import Constant, Graph, Input, Node, Value
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import TensorType, TupleType, ValueType


def infer_node_type(node: Node) -> ValueType:
    """Re-infer a node's type from its inputs (composites: from their subgraph)."""
    if node.subgraph is not None:
        outs = node.subgraph.outputs
        if len(outs) == 1:
            return outs[0].type
        return TupleType(tuple(o.tensor_type for o in outs))
    if node.op == "GetItem":
        source = node.inputs[0].type
        index = node.attrs.get("index")
        if not isinstance(source, TupleType) or type(index) is not int or \
                not 0 <= index < len(source.items):
            raise VerifyError(f"GetItem {node.name} takes item {index!r:.20} of {source}")
        return source.items[index]
    opdef = get_op(node.op)
    types = tuple(v.tensor_type for v in node.inputs)
    return opdef.infer(types, {**opdef.attr_defaults, **node.attrs})


def _check_arity(node: Node, where: str) -> None:
    """A basic op takes the inputs its declaration names (any number, at least one, where it
    is variadic): a node read from a file could have lost one, and code generation indexes
    its operands by the declaration."""
    opdef = get_op(node.op)
    want, have = len(opdef.inputs), len(node.inputs)  # variadic Print may have none
    if have != want and not (opdef.variadic and have >= 1):
        raise VerifyError(f"{where}: node {node.name} ({node.op}) has {have} inputs; "
                          f"{node.op} takes {want} ({', '.join(opdef.inputs) or 'none'})")


def verify(graph: Graph, where: str = "") -> None:
    """Raise VerifyError naming the first problem found."""
    _verify(graph, where or graph.name)


def _verify(graph: Graph, where: str) -> None:
    defined: set[int] = {inp.uid for inp in graph.inputs}
    for inp in graph.inputs:
        if not isinstance(inp, Input) or not isinstance(inp.type, TensorType):
            raise VerifyError(f"{where}: graph input {inp.name} is malformed")
    for node in graph.nodes:
        if node.uid in defined:
            raise VerifyError(f"{where}: node {node.name} appears twice")
        for value in node.inputs:
            _check_operand(value, defined, node, where)
        if node.subgraph is not None:
            sub = node.subgraph
            if len(sub.inputs) != len(node.inputs):
                raise VerifyError(f"{where}: composite {node.name} has {len(node.inputs)} inputs "
                                  f"but its subgraph takes {len(sub.inputs)}")
            for outer, inner in zip(node.inputs, sub.inputs):
                if outer.type != inner.type:
                    raise VerifyError(f"{where}: composite {node.name} input {inner.name} is "
                                      f"{inner.type} inside but {outer.type} outside")
            _verify(sub, f"{where}/{node.name}")
        elif node.op != "GetItem":
            _check_arity(node, where)
        try:
            expected = infer_node_type(node)
        except Exception as exc:  # inference errors are verifier findings here
            raise VerifyError(f"{where}: node {node.name} ({node.op}) fails type inference: "
                              f"{exc}") from exc
        if expected != node.type:
            raise VerifyError(f"{where}: node {node.name} ({node.op}) has type {node.type} "
                              f"but its inputs give {expected}")
        defined.add(node.uid)
    if not graph.outputs:
        raise VerifyError(f"{where}: graph has no outputs")
    for value in graph.outputs:
        _check_operand(value, defined, None, where)
    for value in graph.effects:
        _check_operand(value, defined, None, where)
    assigned: set[int] = set()
    for weight, value in graph.assigns:
        if weight not in graph.inputs or weight.kind != "weight":
            raise VerifyError(f"{where}: assigns to {weight.name}, which is not a weight of "
                              "this graph")
        if weight.uid in assigned:
            raise VerifyError(f"{where}: assigns to weight {weight.name} twice")
        assigned.add(weight.uid)
        if value.type != weight.type:
            raise VerifyError(f"{where}: assigns a {value.type} to weight {weight.name} of type "
                              f"{weight.type}")
        _check_operand(value, defined, None, where)


def _check_operand(value: Value, defined: set[int], node: Node | None, where: str) -> None:
    # The message is formatted only on failure: an operand is checked at every use.
    if isinstance(value, Constant) or value.uid in defined:
        return
    user = f"node {node.name}" if node is not None else "return"
    raise VerifyError(f"{where}: {user} uses {value.name} before it is defined "
                      "(or from another graph)")
