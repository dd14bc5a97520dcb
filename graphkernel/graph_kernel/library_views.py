"""Layout ops folded into the library calls next to them: a MatMul or BatchMatMul reads its
operands through index maps (x[:, 0], a Flatten, a transposed weight) and writes its result
through the inverse of the Reshape/Transpose chain that follows it (a head merge), so those
layout ops launch nothing and copy nothing.

BLAS takes a matrix with any row stride (and a transposed one), and numpy's matmul walks the
batch axes with any strides, so a strided view costs nothing where its two inner axes keep
BLAS's layout; anywhere else (a reversed slice, a merge of non-contiguous axes) the layout op
stays a step of its own. The decision is made in the last backend stage with fusion on
(`mark_library_views`, a note on the library node the dumps show); the plan builder then
reads `library_views` and the runner builds the strided views (runtime/runner.py)."""
from __future__ import annotations

from dataclasses import dataclass

from graphkernel.graph_kernel.index_maps import MAPPABLE, IndexMap, _reshape, apply, dense
from graphkernel.ir.graph import Constant, Graph, Node, Value
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import is_static

NOTE = "layout_folded"  # Node.notes key on a library node that reads or writes through views
INVERTIBLE = ("Reshape", "ExpandDims", "Squeeze", "Transpose")  # one-to-one relabellings


@dataclass(frozen=True)
class StridedView:
    """A library call's operand (or result) as a strided view of a dense buffer: element i
    lives at `offset + sum(i_k * strides_k)` (elements) of `buffer`'s value."""

    buffer: Value  # operands: the dense value read; results: the layout op's value written
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    folded: tuple[Node, ...]  # the graph's layout nodes that run no step

    def text(self) -> str:
        ops = "+".join(n.name for n in self.folded)
        return f"{ops} (offset {self.offset}, strides {self.strides})"


@dataclass(frozen=True)
class LibraryViews:
    operands: dict[int, StridedView]  # input position -> view
    result: StridedView | None

    @property
    def folded(self) -> list[Node]:
        views = list(self.operands.values()) + ([self.result] if self.result else [])
        return [n for v in views for n in v.folded]


def layout_chain(node: Node) -> list[Node] | None:
    """The basic layout ops `node` computes, in order: itself, or the chain a composite of
    layout ops only holds (a fused Transpose + Reshape)."""
    if node.subgraph is None:
        return [node] if node.op in MAPPABLE else None
    sub = node.subgraph
    if len(sub.inputs) != 1 or len(sub.outputs) != 1 or not sub.nodes:
        return None
    previous: Value = sub.inputs[0]
    for inner in sub.nodes:
        if inner.op not in MAPPABLE or inner.subgraph is not None or \
                inner.inputs[0] is not previous:
            return None
        previous = inner
    return list(sub.nodes) if sub.outputs[0] is previous else None


def _unit_axes(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """The strides with a size-1 inner axis given the stride of a dense matrix (its stride is
    never used to move, and numpy hands BLAS only matrices whose strides look dense)."""
    if len(shape) < 2:
        return strides
    row, col = strides[-2:]
    if shape[-1] == 1:
        col = 1
    if shape[-2] == 1:
        row = shape[-1] * col
    return strides[:-2] + (row, col)


def _blas_layout(shape: tuple[int, ...], strides: tuple[int, ...], result: bool) -> bool:
    """Whether numpy hands this matrix stack to BLAS as is: the two inner axes row-major with
    any row stride (operands may also be column-major), positive strides, nothing empty."""
    if len(shape) < 2 or 0 in shape or any(s < 0 for s in strides):
        return False
    (rows, cols), (row_stride, col_stride) = shape[-2:], strides[-2:]
    if col_stride == 1 and row_stride >= cols:
        return True
    return not result and row_stride == 1 and col_stride >= rows


def _map_through(chain: list[Node], base: IndexMap) -> IndexMap | None:
    for node in chain:
        mapped = apply(node, base)
        if mapped is None:
            return None
        base = mapped
    return base


def _operand_view(value: Value, users: dict[int, list[Node]], results: set[int],
                  taken: set[int]) -> StridedView | None:
    """The longest chain of single-use layout nodes ending in `value` that is one strided read
    of a dense value; None when there is none."""
    outer: list[Node] = []
    current = value
    while isinstance(current, Node) and current.uid not in results and \
            current.uid not in taken and len(users.get(current.uid, [])) == 1 and \
            layout_chain(current) is not None:
        outer.insert(0, current)
        current = current.inputs[0]
    for start in range(len(outer)):
        source = outer[start].inputs[0]
        if isinstance(source, Constant) and source.is_scalar:
            continue
        chain = [n for node in outer[start:] for n in layout_chain(node) or []]
        mapped = _map_through(chain, dense(source))
        if mapped is None or 0 in source.shape or not is_static(tuple(source.shape)):
            continue
        strides = _unit_axes(tuple(value.shape), mapped.strides)
        if _blas_layout(tuple(value.shape), strides, result=False):
            return StridedView(source, mapped.offset, tuple(value.shape), strides,
                               tuple(outer[start:]))
    return None


def _result_view(node: Node, users: dict[int, list[Node]], results: set[int]
                 ) -> StridedView | None:
    """The chain of Reshape/Transpose after `node` whose inverse, applied to the chain's dense
    result, is a strided view BLAS writes into."""
    outer: list[Node] = []
    current: Node = node
    while current.uid not in results and len(users.get(current.uid, [])) == 1:
        user = users[current.uid][0]
        chain = layout_chain(user)
        if chain is None or any(n.op not in INVERTIBLE for n in chain):
            break
        outer.append(user)
        current = user
    if not outer:
        return None
    target = outer[-1]
    inverse: IndexMap | None = dense(target)
    for inner in reversed([n for o in outer for n in layout_chain(o) or []]):
        assert inverse is not None
        before = tuple(inner.inputs[0].shape)
        if inner.op == "Transpose":
            perm = inner.attrs["perm"]
            back = [0] * len(perm)
            for axis, p in enumerate(perm):
                back[p] = axis
            inverse = IndexMap(target, 0, tuple(inverse.strides[b] for b in back))
        else:
            inverse = _reshape(inverse, tuple(inner.shape), before)
        if inverse is None:
            return None
    assert inverse is not None
    strides = _unit_axes(tuple(node.shape), inverse.strides)
    if not _blas_layout(tuple(node.shape), strides, result=True):
        return None
    return StridedView(target, 0, tuple(node.shape), strides, tuple(outer))


def library_views(graph: Graph, marked_only: bool = True) -> dict[int, LibraryViews]:
    """Per library node (uid): the operands it reads and the result it writes through views.
    `marked_only`: only nodes the last backend stage marked (fusion on)."""
    users = graph.users()
    results = {v.uid for v in graph.results()}
    taken: set[int] = set()  # layout nodes already folded into another call
    found: dict[int, LibraryViews] = {}
    for node in graph.nodes:
        if node.subgraph is not None or not get_op(node.op).gemm or \
                (marked_only and NOTE not in node.notes) or \
                any(v.dtype != node.dtype for v in node.inputs) or \
                not all(is_static(tuple(v.shape)) for v in [*node.inputs, node]):
            continue  # numpy writes in place; views have static strides (not dynamic shapes)
        operands = {}
        for position, value in enumerate(node.inputs):
            view = _operand_view(value, users, results, taken)
            if view is not None:
                operands[position] = view
                taken |= {n.uid for n in view.folded}
        result = _result_view(node, users, results)
        if result is not None:
            taken |= {n.uid for n in result.folded}
        if operands or result is not None:
            found[node.uid] = LibraryViews(operands, result)
    return found


def mark_library_views(graph: Graph) -> Graph:
    """Record on each library node the layout ops it reads or writes through (fusion on)."""
    for uid, views in library_views(graph, marked_only=False).items():
        node = next(n for n in graph.nodes if n.uid == uid)
        parts = [f"reads input {i} as {v.text()}" for i, v in sorted(views.operands.items())]
        if views.result is not None:
            parts.append(f"writes {views.result.buffer.name} through the inverse of "
                         f"{views.result.text()}")
        node.notes[NOTE] = "; ".join(parts)
    return graph


def folded_names(graph: Graph) -> dict[str, list[str]]:
    """Library node name -> the names of the layout nodes it reads or writes in place."""
    by_uid = {n.uid: n for n in graph.nodes}
    return {by_uid[uid].name: [n.name for n in views.folded]
            for uid, views in library_views(graph).items()}
