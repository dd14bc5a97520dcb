"""One fusion stage at a time, on graphs built directly with the IR: each test runs a single
stage's function and compares its result with a hand-built expected graph, structurally (ops,
attributes, types, edges, constants, composite subgraphs and outputs; not uids or names).

The stages: hwopt_1 expansion, hwopt_2/hwopt_3 clustering, hwopt_4 simplification (see
graphkernel/graph_kernel/pipeline.py). No tracing, no C, no cache.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from graphkernel.graph_kernel.flags import GraphKernelFlags
from graphkernel.graph_kernel.pipeline import BackendState, CompileOptions, backend_stages
from graphkernel.graph_kernel.reasons import FuseRule
from graphkernel.ir.graph import Constant, Graph, Input, Node, Value
from graphkernel.ir.opset import get_op
from graphkernel.ir.printer import print_graph
from graphkernel.ir.types import TensorType, TupleType
from graphkernel.ir.verifier import verify
from graphkernel.passes import stage_names

F32 = np.dtype(np.float32)


# -- building graphs -------------------------------------------------------------------------------
class Build:
    """Appends nodes to a graph; Python numbers become 0-d constants of the first tensor
    operand's dtype, as the frontend and the expanders make them."""

    def __init__(self, name: str, *types: TensorType) -> None:
        self.graph = Graph(name, [Input(t, f"x{i}") for i, t in enumerate(types)])

    @property
    def inputs(self) -> list[Input]:
        return self.graph.inputs

    def __call__(self, op: str, *operands: Value | float, **attrs: Any) -> Node:
        like = next(v for v in operands if isinstance(v, Value))
        values = [v if isinstance(v, Value) else Constant(np.asarray(v, like.dtype))
                  for v in operands]
        opdef = get_op(op)
        type_ = opdef.infer(tuple(v.tensor_type for v in values), {**opdef.attr_defaults, **attrs})
        node = Node(op, values, attrs, type_)
        self.graph.nodes.append(node)
        return node

    def composite(self, operands: list[Value], body: Callable[..., Value | tuple[Value, ...]]
                  ) -> Node:
        """A composite node over `operands` whose subgraph is what `body` builds."""
        inner = Build("composite", *(v.tensor_type for v in operands))
        result = body(inner, *inner.inputs)
        outs = list(result) if isinstance(result, tuple) else [result]
        inner.graph.outputs = outs
        type_ = outs[0].type if len(outs) == 1 else TupleType(tuple(o.tensor_type for o in outs))
        node = Node("Composite", operands, {}, type_, subgraph=inner.graph)
        self.graph.nodes.append(node)
        return node

    def returns(self, *values: Value) -> Graph:
        self.graph.outputs = list(values)
        verify(self.graph)
        return self.graph


def t(*shape: int, dtype: Any = F32) -> TensorType:
    return TensorType(shape, np.dtype(dtype))


# -- comparing graphs ------------------------------------------------------------------------------
def canonical(graph: Graph, indent: str = "") -> list[str]:
    """The graph as lines that name values by position: %iN inputs, %N nodes, constants by
    dtype and value. Equal lists mean equal structure."""
    ref: dict[int, str] = {v.uid: f"%i{i}" for i, v in enumerate(graph.inputs)}
    ref.update({n.uid: f"%{k}" for k, n in enumerate(graph.nodes)})

    def name(v: Value) -> str:
        if isinstance(v, Constant):
            return f"{v.dtype.name}{list(v.shape)}={v.value.tolist()!r}"
        return ref.get(v.uid, f"<outside: {type(v).__name__}>")

    lines = [f"{indent}inputs {', '.join(str(i.type) for i in graph.inputs)}"]
    for k, node in enumerate(graph.nodes):
        attrs = ", ".join(f"{key}={_attr(val)}" for key, val in sorted(node.attrs.items()))
        args = ", ".join(name(v) for v in node.inputs)
        lines.append(f"{indent}%{k} = {node.op}({args}){{{attrs}}} : {node.type}")
        if node.subgraph is not None:
            lines += canonical(node.subgraph, indent + "    ")
    lines.append(f"{indent}return {', '.join(name(v) for v in graph.outputs)}")
    return lines


def _attr(value: Any) -> str:
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, list):
        value = tuple(value)
    return repr(value)


def assert_same_graph(actual: Graph, expected: Graph) -> None:
    verify(actual)
    assert canonical(actual) == canonical(expected), \
        "stage result:\n" + print_graph(actual) + "\nexpected:\n" + print_graph(expected)


# -- running one stage -----------------------------------------------------------------------------
def run_stage(name: str, graph: Graph, **flags: Any) -> tuple[Graph, BackendState]:
    options = CompileOptions(enable_graph_kernel=True, flags=GraphKernelFlags(**flags))
    state = BackendState()
    stages = {s.name: s for s in backend_stages(options, state)}
    return stages[name].run(graph), state


EXPAND, BASIC, COMPOSITE, SIMPLIFY = (stage_names.EXPAND, stage_names.BASIC_FUSION,
                                      stage_names.COMPOSITE_FUSION, stage_names.SIMPLIFY)


# -- the helper itself tells graphs apart ----------------------------------------------------------
def test_structural_comparison_sees_ops_constants_edges_and_subgraphs() -> None:
    def chain(op: str = "Mul", k: float = 2.0, swap: bool = False) -> Graph:
        b = Build("g", t(4))
        x = b.inputs[0]
        y = b(op, x, k)
        return b.returns(b("Add", x, y) if swap else b("Add", y, x))

    same = canonical(chain())
    assert canonical(chain()) == same  # fresh uids and names do not matter
    assert canonical(chain(op="Sub")) != same
    assert canonical(chain(k=3.0)) != same
    assert canonical(chain(swap=True)) != same
    b = Build("g", t(4))
    outer = b.composite(b.inputs, lambda c, x: c("Mul", x, 2.0))
    with_sub = canonical(b.returns(outer))
    b = Build("g", t(4))
    outer = b.composite(b.inputs, lambda c, x: c("Mul", x, 3.0))
    assert canonical(b.returns(outer)) != with_sub


# -- clustering ------------------------------------------------------------------------------------
def test_basic_fusion_puts_an_elementwise_chain_into_one_composite() -> None:
    b = Build("net", t(4, 4))
    (x,) = b.inputs
    graph = b.returns(b("Mul", b("Add", b("Mul", x, 2.0), 1.0), 3.0))

    result, state = run_stage(BASIC, graph)

    e = Build("net", t(4, 4))
    fused = e.composite(e.inputs, lambda c, x: c("Mul", c("Add", c("Mul", x, 2.0), 1.0), 3.0))
    assert_same_graph(result, e.returns(fused))
    assert state.reasons == []


def test_basic_fusion_takes_a_row_reduction_with_its_epilogue() -> None:
    # x - mean(x) over the last axis: the reduction, its scaling and the subtraction that reads
    # the row again are one kernel.
    b = Build("net", t(8, 16))
    (x,) = b.inputs
    mean = b("Mul", b("ReduceSum", x, axis=(1,), keep_dims=True), 1 / 16)
    graph = b.returns(b("Sub", x, mean))

    result, _ = run_stage(BASIC, graph)

    e = Build("net", t(8, 16))
    fused = e.composite(e.inputs, lambda c, x: c(
        "Sub", x, c("Mul", c("ReduceSum", x, axis=(1,), keep_dims=True), 1 / 16)))
    assert_same_graph(result, e.returns(fused))


def test_matmul_stays_a_library_kernel_and_the_elementwise_after_it_fuses() -> None:
    b = Build("net", t(4, 8), t(8, 16), t(16))
    a, w, bias = b.inputs
    mm = b("MatMul", a, w)
    graph = b.returns(b("Maximum", b("Add", mm, bias), 0.0))

    result, state = run_stage(BASIC, graph)

    e = Build("net", t(4, 8), t(8, 16), t(16))
    a, w, bias = e.inputs
    mm = e("MatMul", a, w)
    fused = e.composite([mm, bias], lambda c, m, b: c("Maximum", c("Add", m, b), 0.0))
    expected = e.returns(fused)
    assert_same_graph(result, expected)
    # hwopt_3 clusters basic ops the same way and keeps its reasons for the executable.
    result, state = run_stage(COMPOSITE, result)
    assert_same_graph(result, expected)
    [reason] = state.reasons
    assert (reason.stage, reason.producer, reason.consumer, reason.rule) == \
        (COMPOSITE, "MatMul", result.nodes[1].name, FuseRule.PATTERN)
    assert "MatMul is opaque" in reason.detail


def test_a_refused_merge_records_its_reason_and_keeps_the_groups_apart() -> None:
    # Four elementwise ops with --composite_op_limit_size=2: two kernels of two, and the edge
    # between them explains itself.
    b = Build("net", t(4))
    (x,) = b.inputs
    first = b("Add", b("Mul", x, 2.0), 1.0)
    graph = b.returns(b("Sub", b("Mul", first, 3.0), 4.0))

    result, state = run_stage(COMPOSITE, graph, composite_op_limit_size=2)

    e = Build("net", t(4))
    one = e.composite(e.inputs, lambda c, x: c("Add", c("Mul", x, 2.0), 1.0))
    two = e.composite([one], lambda c, y: c("Sub", c("Mul", y, 3.0), 4.0))
    assert_same_graph(result, e.returns(two))
    [reason] = state.reasons
    assert (reason.stage, reason.producer, reason.consumer, reason.rule) == \
        (COMPOSITE, "Add", "Mul", FuseRule.LIMIT)
    # Mul+Add formed first; adding the next Mul would make 3.
    assert reason.detail == "together they would hold 3 ops (--composite_op_limit_size=2)"


def test_composite_fusion_grows_an_expanded_op_over_its_neighbour() -> None:
    # hwopt_2 leaves an expanded Softmax alone (recording why); hwopt_3 merges it with the
    # Mul after it into one composite of basic ops.
    def softmax_then_scale() -> Graph:
        b = Build("net", t(4, 32))
        (x,) = b.inputs
        soft = b.composite([x], _softmax_body)
        return b.returns(b("Mul", soft, 2.0))

    after_basic, state = run_stage(BASIC, softmax_then_scale())
    assert_same_graph(after_basic, softmax_then_scale())
    assert [r.rule for r in state.reasons] == [FuseRule.PATTERN]
    assert "joins other ops in the composite-op fusion stage" in state.reasons[0].detail

    result, state = run_stage(COMPOSITE, softmax_then_scale())
    e = Build("net", t(4, 32))
    fused = e.composite(e.inputs, lambda c, x: c("Mul", _softmax_body(c, x), 2.0))
    assert_same_graph(result, e.returns(fused))
    assert state.reasons == []


# -- expansion -------------------------------------------------------------------------------------
def _softmax_body(c: Build, x: Value) -> Value:
    exp = c("Exp", c("Sub", x, c("ReduceMax", x, axis=-1, keep_dims=True)))
    return c("Mul", exp, c("Reciprocal", c("ReduceSum", exp, axis=-1, keep_dims=True)))


def test_expansion_turns_softmax_into_a_composite_of_its_basic_ops() -> None:
    b = Build("net", t(4, 32))
    (x,) = b.inputs
    graph = b.returns(b("Add", b("Softmax", x, axis=-1), x))

    result, _ = run_stage(EXPAND, graph)

    e = Build("net", t(4, 32))
    (x,) = e.inputs
    soft = e.composite([x], _softmax_body)
    assert_same_graph(result, e.returns(e("Add", soft, x)))


def test_expansion_turns_gelu_into_its_stable_tanh_form() -> None:
    # 0.5 x (1 + tanh(z)) as x sigmoid(2z) in one division, from e = exp(-|2z|): x / (1 + e)
    # or x e / (1 + e), x clamped finite in x e so -inf gives -0.0 (docs/perf-notes.md,
    # Numerics).
    b = Build("net", t(16))
    graph = b.returns(b("GeLU", b.inputs[0]))

    result, _ = run_stage(EXPAND, graph)

    def gelu(c: Build, x: Value) -> Value:
        k = 2 * float(np.sqrt(2 / np.pi))
        two_z = c("Mul", x, c("Add", c("Mul", c("Mul", x, x), 0.044715 * k), k))
        e = c("Exp", c("Neg", c("Abs", two_z)))
        lowest = Constant(np.asarray(-np.finfo(np.float32).max, np.float32))
        finite = c("Select", c("Less", x, lowest), lowest, x)
        numerator = c("Select", c("GreaterEqual", two_z, 0.0), x, c("Mul", finite, e))
        return c("RealDiv", numerator, c("Add", e, 1.0))

    e = Build("net", t(16))
    assert_same_graph(result, e.returns(e.composite(e.inputs, gelu)))


def test_expansion_leaves_a_disabled_op_whole() -> None:
    def graph() -> Graph:
        b = Build("net", t(4, 32))
        return b.returns(b("Softmax", b.inputs[0], axis=-1))

    result, _ = run_stage(EXPAND, graph(), disable_expand_ops=frozenset({"Softmax"}))
    assert_same_graph(result, graph())


# -- simplification --------------------------------------------------------------------------------
def test_simplification_folds_identities_inside_composites_only() -> None:
    def graph() -> Graph:
        b = Build("net", t(4), t(4, dtype=np.int32))
        x, n = b.inputs
        # The user's own top-level x * 1 stays as written (the dumps map to construct).
        top = b("Mul", x, 1.0)

        def float_body(c: Build, x: Value) -> Value:
            y = c("Sub", c("Mul", x, 1.0), 0.0)      # x * 1 - 0  ->  x
            y = c("Neg", c("Neg", c("RealDiv", y, 1.0)))  # --(y / 1)  ->  y
            return c("Add", c("Add", y, -0.0), 0.0)   # y + -0.0 -> y; y + 0.0 stays (-0.0 + 0)

        def int_body(c: Build, n: Value) -> Value:
            return c("Mul", c("Add", n, 0), 3)        # n + 0 -> n for integers

        return b.returns(b.composite([top], float_body), b.composite([n], int_body))

    result, _ = run_stage(SIMPLIFY, graph())

    e = Build("net", t(4), t(4, dtype=np.int32))
    x, n = e.inputs
    top = e("Mul", x, 1.0)
    expected = e.returns(e.composite([top], lambda c, x: c("Add", x, 0.0)),
                         e.composite([n], lambda c, n: c("Mul", n, 3)))
    assert_same_graph(result, expected)


@pytest.mark.parametrize("stage", [BASIC, COMPOSITE, SIMPLIFY])
def test_a_stage_with_nothing_to_do_leaves_the_graph_as_it_was(stage: str) -> None:
    def graph() -> Graph:
        b = Build("net", t(4, 8), t(8, 2))
        return b.returns(b("MatMul", *b.inputs))

    result, _ = run_stage(stage, graph())
    assert_same_graph(result, graph())
