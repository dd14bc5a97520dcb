"""Which fused groups one generated loop nest can compute, and how: the iteration space.

A group is schedulable when every value in it maps onto one iteration space `space`:
- pointwise: `space` is the shape of the group's outputs; every value broadcasts into it;
- row reduction: every reduction has the same input shape (`space`) and the same axes; values
  that do not vary along the reduced axes ("outer" values: reduction results and what is computed
  from them) are computed once per outer point; the others ("inner") inside the loops over the
  reduced axes. Reductions run in phases: a reduction whose input depends on another reduction
  (Softmax's sum of exp(x - max)) runs in a later pass over the same row.

Clustering asks `analyze` whether a candidate group is legal; codegen builds loops from the
returned Schedule.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from graphkernel.errors import ShapeError
from graphkernel.graph_kernel.index_maps import MAPPABLE, IndexMap, group_maps
from graphkernel.ir.graph import Constant, Node, Value
from graphkernel.ir.opset import PatternKind, get_op
from graphkernel.ir.types import normalize_axes


class NotSchedulable(Exception):
    """The group cannot be one loop nest; the message says why (shown as a fusion reason)."""


@dataclass
class Schedule:
    space: tuple[int, ...]
    reduce_axes: tuple[int, ...]
    # Every value's shape right-aligned to len(space) (reductions: reduced axes set to 1).
    aligned: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # uid -> 0 for values computed per element (inner), or 1 + phase after which an outer value
    # can be computed (0 phase = before any reduction).
    outer_phase: dict[int, int] = field(default_factory=dict)
    # Reductions grouped by phase (phase 1 first).
    phases: list[list[Node]] = field(default_factory=list)
    # Layout ops the kernel reads through index maps from an input's buffer (index_maps.py).
    maps: dict[int, IndexMap] = field(default_factory=dict)
    # Concats of the kernel's inputs, read in place: uid -> (the space axis they join along,
    # ((piece, first index along that axis), ...)); each element is loaded from its piece.
    concats: dict[int, tuple[int, tuple[tuple[Value, int], ...]]] = \
        field(default_factory=dict)
    # Tiles of the kernel's inputs, read in place: uid -> (the input, its shape aligned to the
    # space); along a repeated axis the index wraps modulo the input's length.
    tiles: dict[int, tuple[Value, tuple[int, ...]]] = field(default_factory=dict)

    def barrier_axes(self) -> set[int]:
        """Space axes that keep a loop of their own (a Concat's axis, a Tile's repeated axes):
        loads there need the index along that axis alone."""
        axes = {axis for axis, _ in self.concats.values()}
        for uid, (_, shape) in self.tiles.items():
            axes |= {i for i, (d, t) in enumerate(zip(shape, self.aligned[uid])) if 1 < d < t}
        return axes

    @property
    def is_reduction(self) -> bool:
        return bool(self.reduce_axes)

    def is_outer(self, value: Value) -> bool:
        return value.uid in self.outer_phase


def fusible_op(op: str) -> bool:
    """Basic ops the loop-nest generator computes."""
    opdef = get_op(op)
    if opdef.kind == PatternKind.REDUCE:
        return opdef.reduction is not None
    if opdef.kind == PatternKind.INJECTIVE:
        return op in MAPPABLE or op in ("Concat", "Tile")
    # Every elementwise and broadcasting op has an expression in each backend's op table
    # (tests/test_backends.py checks the C backend's).
    return opdef.kind in (PatternKind.ELEMWISE, PatternKind.BROADCAST)


def _strip_leading_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    start = 0
    while start < len(shape) and shape[start] == 1:
        start += 1
    return tuple(shape[start:])


def _align(shape: tuple[int, ...], rank: int, what: str) -> tuple[int, ...]:
    if len(shape) > rank:
        raise NotSchedulable(f"{what} has rank {len(shape)}, more than the kernel's {rank}")
    return (1,) * (rank - len(shape)) + tuple(shape)


def analyze(nodes: list[Node], outputs: list[Value]) -> Schedule:
    """The schedule of a group of basic ops (in topological order) with the given outputs."""
    try:
        return _analyze(nodes, outputs)
    except ShapeError as exc:  # a dynamic size where this needs a number (ir.types.SymSize)
        raise NotSchedulable(str(exc).splitlines()[0]) from None


def _analyze(nodes: list[Node], outputs: list[Value]) -> Schedule:
    for node in nodes:
        if node.subgraph is not None or not fusible_op(node.op):
            raise NotSchedulable(f"{node.op} has no loop-nest code template")
    leaves, hidden = group_maps(nodes, outputs)
    trailing = _trailing_views(nodes, outputs)
    for node in nodes:
        if node.op in MAPPABLE and node.uid not in leaves and node.uid not in hidden and \
                node.uid not in trailing and \
                node.op != "BroadcastTo" and (not get_op(node.op).view or _strip_leading_ones(
                    node.inputs[0].shape) != _strip_leading_ones(node.shape)):
            raise NotSchedulable(f"{node.op} from {node.inputs[0].shape} to {node.shape} moves "
                                 "data between axes inside the kernel (only layout ops of the "
                                 "kernel's inputs are read through index maps)")
    reductions = [n for n in nodes if get_op(n.op).kind == PatternKind.REDUCE]
    _check_concats(nodes, bool(reductions))
    if reductions:
        first = reductions[0].inputs[0]
        space = tuple(first.shape)
        axes = normalize_axes(reductions[0].attrs.get("axis", ()), len(space))
        if not axes:  # a 0-d input: the loop nest would have no reduction to run
            raise NotSchedulable(f"{reductions[0].op} of a 0-d tensor reduces no axis")
        for red in reductions[1:]:
            shape = tuple(red.inputs[0].shape)
            red_axes = normalize_axes(red.attrs.get("axis", ()), len(shape))
            if shape != space or red_axes != axes:
                raise NotSchedulable(f"reductions over different spaces: {space} axes {axes} vs "
                                     f"{shape} axes {red_axes}")
    else:
        space = ()
        for out in outputs:
            shape = tuple(trailing[out.uid].inputs[0].shape if out.uid in trailing else out.shape)
            if len(shape) > len(space) or shape != space:
                space = _broadcast_or_fail(space, shape)
        axes = ()
        # Values inside may carry leading unit dims the outputs dropped (a Squeeze at the end).
        deepest = max((len(v.shape) for n in nodes for v in [n, *n.inputs]), default=0)
        space = (1,) * (deepest - len(space)) + space
    rank = len(space)
    sched = Schedule(space, axes, maps=leaves)
    in_group = {n.uid for n in nodes}
    reduce_phase: dict[int, int] = {}
    depends_phase: dict[int, int] = {}  # uid -> highest reduction phase it depends on
    for node in nodes:
        if node.uid in hidden:
            continue
        if node.uid in leaves:  # read like an input, from its source through the map
            sched.aligned[node.uid] = _check_fits(_align(node.shape, rank, node.name), space,
                                                  node.name)
            continue
        if node.op == "Tile":  # read like an input, the index wrapping along repeated axes
            sched.aligned[node.uid] = _check_fits(_align(node.shape, rank, node.name), space,
                                                  node.name)
            sched.tiles[node.uid] = (node.inputs[0], _align(node.inputs[0].shape, rank,
                                                            node.inputs[0].name))
            continue
        if node.op == "Concat":  # read like an input, each element from its piece
            sched.aligned[node.uid] = _check_fits(_align(node.shape, rank, node.name), space,
                                                  node.name)
            sched.concats[node.uid] = _pieces(node, rank)
            continue
        if node.uid in trailing and (not axes or (
                sched.aligned[node.inputs[0].uid] == space and
                node.inputs[0].uid not in sched.outer_phase)):
            # written in its input's order, the same memory: in a reduction kernel, of a value
            # computed per element of the whole space (a LayerNorm's result merged to rows)
            sched.aligned[node.uid] = sched.aligned[node.inputs[0].uid]
            depends_phase[node.uid] = depends_phase.get(node.inputs[0].uid, 0)
            continue
        for value in node.inputs:
            if value.uid not in in_group and value.uid not in sched.aligned:
                sched.aligned[value.uid] = _check_fits(_align(value.shape, rank, value.name),
                                                       space, value.name)
        dep = max((depends_phase.get(v.uid, 0) for v in node.inputs), default=0)
        if get_op(node.op).kind == PatternKind.REDUCE:
            if sched.aligned[node.inputs[0].uid] != space:
                raise NotSchedulable(f"{node.op} input {node.inputs[0].name} does not span the "
                                     f"whole iteration space {space}")
            phase = dep + 1
            reduce_phase[node.uid] = phase
            depends_phase[node.uid] = phase
            while len(sched.phases) < phase:
                sched.phases.append([])
            sched.phases[phase - 1].append(node)
            sched.aligned[node.uid] = tuple(1 if i in axes else d for i, d in enumerate(space))
            sched.outer_phase[node.uid] = phase
            continue
        aligned = _check_fits(_align(node.shape, rank, node.name), space, node.name)
        for value in node.inputs:
            if value.uid in reduce_phase and not value_keeps_dims(value) and \
                    axes != tuple(range(len(axes))):
                raise NotSchedulable(f"{value.name} (a reduction without keep_dims) is used by "
                                     f"{node.op} inside the kernel")
        sched.aligned[node.uid] = aligned
        depends_phase[node.uid] = dep
        if axes and all(aligned[a] == 1 for a in axes) and all(
                v.uid not in in_group or v.uid in sched.outer_phase or isinstance(v, Constant)
                for v in node.inputs):
            sched.outer_phase[node.uid] = dep
    # An inner value that depends on a reduction may only be used after that reduction's phase:
    # guaranteed because phases follow dependencies. Outputs must be writable once per element.
    for out in outputs:
        if out.uid not in in_group:
            raise NotSchedulable(f"output {out.name} is not computed by the group")
        aligned = sched.aligned[out.uid]
        if out.uid in sched.outer_phase and axes:
            expected = tuple(1 if i in axes else d for i, d in enumerate(space))
            if aligned != expected:
                raise NotSchedulable(f"output {out.name} of shape {out.shape} is neither the "
                                     f"iteration space {space} nor its reduction")
        elif aligned != space:
            raise NotSchedulable(f"output {out.name} of shape {out.shape} would be written more "
                                 f"than once in the iteration space {space}")
    return sched


def _check_concats(nodes: list[Node], reduces: bool) -> None:
    """A Concat or Tile fuses as a read of the kernel's inputs, in a pointwise kernel."""
    in_group = {n.uid for n in nodes}
    for node in nodes:
        if node.op not in ("Concat", "Tile"):
            continue
        if reduces:
            raise NotSchedulable(f"{node.op} is read in place only by pointwise kernels")
        if any(v.uid in in_group for v in node.inputs):
            raise NotSchedulable(f"{node.op} of values computed in the kernel (only the "
                                 "kernel's inputs are read in place)")


def _pieces(node: Node, rank: int) -> tuple[int, tuple[tuple[Value, int], ...]]:
    axis = {**get_op("Concat").attr_defaults, **node.attrs}["axis"] % len(node.shape)
    start, pieces = 0, []
    for value in node.inputs:
        if value.shape[axis]:  # an empty piece holds no element
            pieces.append((value, start))
        start += value.shape[axis]
    return axis + rank - len(node.shape), tuple(pieces)


def _trailing_views(nodes: list[Node], outputs: list[Value]) -> dict[int, Node]:
    """Reshapes (ExpandDims, Squeeze) of a value computed in the group that only leave it as
    an output: the kernel iterates over the value's shape and writes the dense buffer the
    reshaped output is (a merge of attention heads after their Transpose; in a reduction
    kernel, of a value computed per element, a LayerNorm's result merged to rows)."""
    out_uids = {v.uid for v in outputs}
    in_group = {n.uid for n in nodes}
    read = {v.uid for n in nodes for v in n.inputs}
    return {n.uid: n for n in nodes if get_op(n.op).view and n.uid in out_uids and
            n.uid not in read and n.inputs[0].uid in in_group}


# A reduction over the leading axes only (a bias gradient's axis 0, a sum of everything) needs
# no keep_dims inside a kernel: under right-aligned broadcasting its result already lines up
# with the kept axes.


def value_keeps_dims(value: Value) -> bool:
    return bool(getattr(value, "attrs", {}).get("keep_dims", False))


def _broadcast_or_fail(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    from graphkernel.ir.types import broadcast_shapes
    try:
        return broadcast_shapes(a, b)
    except Exception as exc:
        raise NotSchedulable(f"outputs of shapes {a} and {b} share no iteration space") from exc


def _check_fits(aligned: tuple[int, ...], space: tuple[int, ...], what: str) -> tuple[int, ...]:
    for dim, size in zip(aligned, space):
        if dim not in (1, size):
            raise NotSchedulable(f"{what} of shape {aligned} does not fit the iteration space "
                                 f"{space}")
    return aligned
