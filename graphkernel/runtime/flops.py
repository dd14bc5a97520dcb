"""Floating-point operations one step of a plan performs, counted from the op table's facts
(ir/opset.py OpDef) and the values' static shapes, for reports (a roofline puts each kernel's
flops per byte moved against the machine's rates).

The count, per op:
- a matrix product (`OpDef.gemm`): 2 M N K per GEMM (a multiply and an add), times the batch;
- a convolution (`Window.CONVOLUTION`): 2 per output element per weight it reads
  (in channels of its group x kernel height x width);
- a pool (`Window.POOL`): one per output element per window element;
- a reduction (`OpDef.reduction`): one per input element it folds;
- any other elementwise op: one per output element, a vector-math function (exp, tanh) too,
  though it costs tens of instructions: the count says what is computed, not how;
- a shape op (broadcast, injective, a view) or a structural item: none;
- an op with an expander (a composite: LayerNorm, Softmax, an optimizer's update): the sum over
  the basic ops it expands into;
- anything else (a gradient kernel with no expander, a collective): unknown (None).
A dynamic size makes the count unknown too.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from graphkernel.errors import GraphKernelError
from graphkernel.graph_kernel.expanders import expand_node, has_expansion
from graphkernel.ir.graph import Constant, Node, Value, output_types
from graphkernel.ir.opset import PatternKind, Window, get_op
from graphkernel.ir.types import TensorType


def _product(dims: Iterable[object]) -> int | None:
    """The product of sizes, None when one is dynamic (not a number yet)."""
    sizes = list(dims)
    if not all(isinstance(d, int) for d in sizes):
        return None
    return math.prod(d for d in sizes if isinstance(d, int))


def _elements(t: TensorType) -> int | None:
    return _product(t.shape)


def gemm_mnk(node: Node) -> int | None:
    """Multiply-adds of one GEMM of a MatMul/BatchMatMul (per batch entry; an N-d operand
    times a matrix is one GEMM over all its rows, ir/opdefs/matmul.py `matmul_into`); None
    when a size is not a number."""
    a = node.inputs[0].tensor_type.shape
    k = a[-2] if node.attrs.get("transpose_a") else a[-1]
    out = output_types(node)[0].shape
    merged = node.inputs[1].tensor_type.rank == 2 and not node.attrs.get("transpose_a")
    rows = out[:-1] if merged else out[-2:-1]
    return _product((*rows, out[-1], k))


def _gemm_flops(node: Node) -> int | None:
    mnk = gemm_mnk(node)
    out = output_types(node)[0].shape
    merged = node.inputs[1].tensor_type.rank == 2 and not node.attrs.get("transpose_a")
    batch = _product(() if merged else out[:-2])
    return None if mnk is None or batch is None else 2 * mnk * batch


def _window_size(kernel_size: object) -> int | None:
    """Elements of a pool's window from its kernel_size (an int, a pair, or MindSpore's
    4-tuple whose last two are the window)."""
    if isinstance(kernel_size, int):
        return kernel_size * kernel_size
    if isinstance(kernel_size, (tuple, list)) and len(kernel_size) in (2, 4) and \
            all(isinstance(k, int) for k in kernel_size):
        return math.prod(kernel_size[-2:])
    return None


def node_flops(node: Node) -> int | None:
    """Flops of one node (see the module's doc); None when unknown."""
    if node.subgraph is not None:
        return graph_flops(node.subgraph.nodes)
    opdef = get_op(node.op)
    outs = output_types(node)
    if opdef.structural and opdef.window is None or opdef.view:
        return 0
    if opdef.gemm:
        return _gemm_flops(node)
    if opdef.window is Window.CONVOLUTION:
        out, taps = _elements(outs[0]), _product(node.inputs[1].tensor_type.shape[1:])
        return None if out is None or taps is None else 2 * out * taps
    if opdef.window is Window.POOL:
        out, window = _elements(outs[0]), _window_size(
            {**opdef.attr_defaults, **node.attrs}.get("kernel_size"))
        return None if out is None or window is None else out * window
    if opdef.reduction is not None:
        return _elements(node.inputs[0].tensor_type)
    if opdef.kind in (PatternKind.BROADCAST, PatternKind.INJECTIVE):
        return 0
    if opdef.kind == PatternKind.ELEMWISE:
        counts = [_elements(t) for t in outs]
        return None if None in counts else sum(c for c in counts if c is not None)
    if has_expansion(node):
        try:
            expanded = expand_node(node)
        except GraphKernelError:  # an expansion refused (a size it needs is dynamic): no count
            return None
        assert expanded.subgraph is not None
        return graph_flops(expanded.subgraph.nodes)
    return None


def graph_flops(nodes: Iterable[Value]) -> int | None:
    """The sum over `nodes` (None when any is unknown); constants count nothing."""
    total = 0
    for node in nodes:
        if isinstance(node, Constant) or not isinstance(node, Node):
            continue
        count = node_flops(node)
        if count is None:
            return None
        total += count
    return total
