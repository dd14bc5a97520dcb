"""C source for one fused group: a loop nest over the group's iteration space.

Pointwise groups are one loop nest whose innermost loop is `#pragma omp simd`; reduction groups
loop over the kept axes outside (OpenMP-parallel above a size threshold) and over the reduced
axes inside, once per reduction phase, then once more for the epilogue. Transcendentals are
declared `omp declare simd` so gcc calls glibc's vector math library (libmvec); the C text
every kernel shares, and how names and values are spelled in C, are in `codegen/c_text.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from graphkernel.codegen.c_text import c_comment, literal
from graphkernel.codegen.c_views import view_buffers
from graphkernel.graph_kernel.schedule import Schedule
from graphkernel.ir import types as T
from graphkernel.ir.graph import Constant, Graph, Node, Value
from graphkernel.ir.opset import PatternKind, Reduction, get_op

# Lanes of the innermost kept axis one column-reduction block handles: accumulators for a block
# stay in L1 (512 floats = 2 KiB per reduction).
COLUMN_BLOCK = 512

# Elements a streaming pointwise kernel computes into an L1 block before copying it out with
# non-temporal stores; and the longest row a streaming row reduction keeps on the stack.
STREAM_BLOCK = 1024
STREAM_ROW_BYTES = 64 << 10


@dataclass
class Buffer:
    """A kernel argument: an input, a non-scalar constant or an output."""

    value: Value
    aligned: tuple[int, ...]
    is_output: bool
    index: int
    strides: list[int] = field(default_factory=list)  # per loop dim, in elements
    offset: int = 0  # a view read through an index map (c_views.py): its first element's
    space_strides: list[int] | None = None  # offset and strides per iteration-space axis

    @property
    def name(self) -> str:
        return f"out{self.index}" if self.is_output else f"in{self.index}"


@dataclass
class LoopDim:
    size: int
    reduced: bool
    strides: dict[int, int]  # buffer id -> stride


@dataclass
class KernelSource:
    name: str
    source: str
    buffers: list[Buffer]  # in argument order: inputs, constants, outputs


def _contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    strides, acc = [], 1
    for dim in reversed(shape):
        strides.append(acc if dim != 1 else 0)
        acc *= dim
    return list(reversed(strides))


def emit_kernel(graph: Graph, name: str, sched: Schedule, parallel_threshold: int,
                stream_min_bytes: int | None = None) -> KernelSource:
    """C source for one fused group. Loops over more than `parallel_threshold` elements run
    on OpenMP threads; outputs of at least `stream_min_bytes` in all are written with
    non-temporal stores (None: never)."""
    return _Emitter(graph, name, sched, parallel_threshold, stream_min_bytes).emit()


class _Emitter:
    def __init__(self, graph: Graph, name: str, sched: Schedule, threshold: int,
                 stream_min_bytes: int | None = None) -> None:
        self.graph = graph
        self.name = name
        self.sched = sched
        self.threshold = threshold
        self.stream_min_bytes = stream_min_bytes
        self.lines: list[str] = []
        self.var: dict[int, str] = {}
        self.buffers: list[Buffer] = []
        self.buffer_of: dict[int, Buffer] = {}
        # C names number nodes by position, not by their process-wide uid: the same kernel then
        # has the same source (and compilation cache key) in every graph and process.
        self.local = {node.uid: i for i, node in enumerate(graph.nodes)}

    # -- buffers and loops ---------------------------------------------------------------
    def _collect_buffers(self) -> None:
        rank = len(self.sched.space)
        sources: list[Value] = list(self.graph.inputs)
        for const in self.graph.constants():
            if not const.is_scalar:
                sources.append(const)
        for i, value in enumerate(sources):
            aligned = self.sched.aligned.get(value.uid, (1,) * (rank - len(value.shape)) +
                                             tuple(value.shape))
            buf = Buffer(value, aligned, False, i)
            self.buffers.append(buf)
            self.buffer_of[value.uid] = buf
        for i, value in enumerate(self.graph.outputs):
            buf = Buffer(value, self.sched.aligned[value.uid], True, i)
            self.buffers.append(buf)
        self.views = view_buffers(self.sched, self.buffer_of, Buffer)  # not kernel arguments

    def _loop_dims(self, column: bool = False) -> list[LoopDim]:
        """Loop dimensions, adjacent compatible ones merged. Row order: kept dims outside,
        reduced inside. Column order (the innermost axis is kept): other kept dims, then the
        reduced ones, then the innermost kept run, so the innermost loop walks memory."""
        space, axes = self.sched.space, self.sched.reduce_axes
        per_buffer = {id(b): b.space_strides or _contiguous_strides(b.aligned)  # not sources
                      for b in self.buffers + self.views if b.value.uid in self.sched.aligned
                      or b.space_strides or b.is_output}  # read only through index maps
        order = list(range(len(space))) if column else \
            [d for d in range(len(space)) if d not in axes] + list(axes)
        dims = [LoopDim(space[d], d in axes, {k: s[d] for k, s in per_buffer.items()})
                for d in order if space[d] != 1]
        merged: list[LoopDim] = []
        for dim in dims:
            if merged and merged[-1].reduced == dim.reduced and all(
                    merged[-1].strides[k] == dim.strides[k] * dim.size for k in dim.strides):
                prev = merged[-1]
                merged[-1] = LoopDim(prev.size * dim.size, dim.reduced, dict(dim.strides))
            else:
                merged.append(dim)
        if column:
            inner = merged[-1]
            merged = [d for d in merged[:-1] if not d.reduced] + \
                [d for d in merged[:-1] if d.reduced] + [inner]
        return merged

    def _is_column_reduction(self) -> bool:
        space = self.sched.space
        live = [d for d in range(len(space)) if space[d] != 1]
        return self.sched.is_reduction and bool(live) and live[-1] not in self.sched.reduce_axes \
            and any(space[a] != 1 for a in self.sched.reduce_axes)

    # -- expressions --------------------------------------------------------------------------
    def _offset(self, buf: Buffer, dims: list[LoopDim], upto_reduced: bool) -> str:
        terms = []
        for i, dim in enumerate(dims):
            if dim.reduced and not upto_reduced:
                continue
            stride = dim.strides[id(buf)]
            if stride:
                terms.append(f"i{i}" if stride == 1 else f"i{i} * {stride}")
        return " + ".join(terms + [str(buf.offset)] * bool(buf.offset)) or "0"

    def _operand(self, value: Value, dims: list[LoopDim], inner: bool) -> str:
        if isinstance(value, Constant) and value.is_scalar:
            return literal(value.value)
        if value.uid in self.var:
            return self.var[value.uid]
        buf = self.buffer_of[value.uid]
        load = f"{buf.name}[{self._offset(buf, dims, inner)}]"
        if value.dtype == T.float16:
            return f"((float){load})"
        return load

    def _expr(self, node: Node, dims: list[LoopDim], inner: bool) -> str:
        opdef = get_op(node.op)
        in_dtypes = [v.dtype for v in node.inputs]
        out_ct = T.C_COMPUTE[node.dtype]
        if node.op == "Cast":
            operand_dtypes = in_dtypes
        elif node.op == "Select":
            operand_dtypes = [T.bool_, node.dtype, node.dtype]
        else:
            operand_dtypes = [T.promote(*in_dtypes)] * len(in_dtypes)
        operands = []
        for value, want in zip(node.inputs, operand_dtypes):
            text = self._operand(value, dims, inner)
            if T.C_COMPUTE[value.dtype] != T.C_COMPUTE[want]:
                text = f"(({T.C_COMPUTE[want]}){text})"
            operands.append(text)
        template = opdef.c_template or ""
        compute = T.C_COMPUTE[operand_dtypes[-1]] if operand_dtypes else out_ct
        if T.is_float(operand_dtypes[-1]) and opdef.c_float_template is not None:
            template = opdef.c_float_template
        expr = template.format(*operands, f="f" if compute == "float" else "")
        if node.dtype == T.float16 and compute == "double":
            # Cast float64 -> float16 straight from double: through float it rounds twice.
            return f"((float)(_Float16){expr})"
        expr = f"(({out_ct}){expr})"
        if node.dtype == T.float16:
            expr = f"((float)(_Float16){expr})"  # round every float16 op, as numpy does
        return expr

    def _compute(self, nodes: list[Node], dims: list[LoopDim], inner: bool, indent: str) -> None:
        for node in nodes:
            var = f"v{len(self.var)}"
            self.lines.append(f"{indent}const {T.C_COMPUTE[node.dtype]} {var} = "
                              f"{self._expr(node, dims, inner)};")
            self.var[node.uid] = var

    def _inner_closure(self, targets: list[Value], known: set[int] | None = None) -> list[Node]:
        """Inner (per-element) nodes needed for targets, in topological order (stopping at
        values in `known`, which are available already)."""
        needed: set[int] = set()
        by_uid = {n.uid: n for n in self.graph.nodes}
        stack = [t.uid for t in targets]
        known = known or set()
        while stack:
            uid = stack.pop()
            node = by_uid.get(uid)
            if node is None or uid in needed or uid in known or self.sched.is_outer(node) or \
                    uid in self.sched.maps:  # loaded through its index map, not computed
                continue
            needed.add(uid)
            stack.extend(v.uid for v in node.inputs)
        return [n for n in self.graph.nodes if n.uid in needed]

    def _store(self, buf: Buffer, dims: list[LoopDim], inner: bool, indent: str,
               into: str | None = None) -> None:
        """Store an output's value at its offset, or at `into` (a block or row buffer)."""
        value = self.var[buf.value.uid] if buf.value.uid in self.var else \
            self._operand(buf.value, dims, inner)
        storage = T.C_STORAGE[buf.value.dtype]
        target = into or f"{buf.name}[{self._offset(buf, dims, inner)}]"
        self.lines.append(f"{indent}{target} = ({storage}){value};")

    # -- non-temporal stores ------------------------------------------------------------------
    def _streams(self, buffers: list[Buffer], dim: LoopDim, row: bool) -> bool:
        """Whether these outputs are written through an L1 buffer and non-temporal stores:
        large in all (they will not be read back from cache), each contiguous along `dim`,
        the innermost loop (a row of a row reduction: short enough for the stack)."""
        if self.stream_min_bytes is None or not buffers or dim.size < 64:
            return False
        # Only bandwidth-bound kernels gain: in one that calls vector math (exp, tanh, ...),
        # the streaming stores stall the arithmetic (Softmax ran 15% slower with them here).
        if self._calls_vector_math():
            return False
        total = sum(math.prod(b.value.shape) * b.value.dtype.itemsize for b in buffers)
        if total < self.stream_min_bytes or any(dim.strides[id(b)] != 1 for b in buffers):
            return False
        return not row or all(dim.size * b.value.dtype.itemsize <= STREAM_ROW_BYTES
                              for b in buffers)

    def _calls_vector_math(self) -> bool:
        return any(get_op(node.op).vector_math for node in self.graph.nodes)

    def _declare_blocks(self, buffers: list[Buffer], prefix: str, size: int,
                        indent: str) -> None:
        for buf in buffers:
            self.lines.append(f"{indent}{T.C_STORAGE[buf.value.dtype]} {prefix}{buf.index}"
                              f"[{size}] __attribute__((aligned(64)));")

    def _stream_out(self, buffers: list[Buffer], dims: list[LoopDim], dim: int, start: str,
                    prefix: str, count: str, indent: str) -> None:
        """Copy each buffer's block (elements start .. start+count of loop `dim`) out."""
        self.lines.append(f"{indent}{{")
        self.lines.append(f"{indent}  const int64_t i{dim} = {start};")
        for buf in buffers:
            self.lines.append(f"{indent}  gk_stream(&{buf.name}[{self._offset(buf, dims, True)}],"
                              f" {prefix}{buf.index}, (size_t)({count}) * sizeof(*{buf.name}));")
        self.lines.append(f"{indent}}}")

    def _open_region(self, threads: bool, indent: str) -> str:
        """A parallel region whose loops share out with `omp for`, so that every thread can
        fence its non-temporal stores before the region's barrier."""
        if threads:
            self.lines.append(f"{indent}#pragma omp parallel")
            self.lines.append(f"{indent}{{")
            indent += "  "
        return indent

    def _close_region(self, threads: bool, indent: str) -> None:
        self.lines.append(f"{indent}gk_stream_fence();")
        if threads:
            self.lines.append(f"{indent[:-2]}}}")

    def _emit_pointwise_streaming(self, dims: list[LoopDim], kept: list[int],
                                  outputs: list[Buffer]) -> None:
        """A pointwise loop nest whose innermost loop runs in blocks of STREAM_BLOCK: each
        block is computed into L1 buffers (vectorised), then streamed to the outputs."""
        last, outer = kept[-1], kept[:-1]
        threads = math.prod(self.sched.space) >= self.threshold
        size = dims[last].size
        block = min(STREAM_BLOCK, size)
        indent = self._open_region(threads, "  ")
        self._declare_blocks(outputs, "blk", block, indent)
        indent = self._open_loops(dims, outer, indent, None, threads, worksharing=True)
        if threads and not outer:
            self.lines.append(f"{indent}#pragma omp for schedule(static)")
        self.lines.append(f"{indent}for (int64_t kb = 0; kb < {size}; kb += {block}) {{")
        self.lines.append(f"{indent}  const int64_t nb = {size} - kb < {block} ? {size} - kb : "
                          f"{block};")
        self.lines.append(f"{indent}  #pragma omp simd")
        self.lines.append(f"{indent}  for (int64_t j = 0; j < nb; ++j) {{")
        inner = indent + "    "
        self.lines.append(f"{inner}const int64_t i{last} = kb + j;")
        self._compute(self._inner_closure([b.value for b in outputs]), dims, True, inner)
        for buf in outputs:
            self._store(buf, dims, True, inner, into=f"blk{buf.index}[j]")
        self.lines.append(f"{indent}  }}")
        self._stream_out(outputs, dims, last, "kb", "blk", "nb", indent + "  ")
        self.lines.append(f"{indent}}}")
        indent = self._close_loops(len(outer), indent)
        self._close_region(threads, indent)

    # -- loop nests ---------------------------------------------------------------------------
    def _open_loops(self, dims: list[LoopDim], which: list[int], indent: str,
                    simd: str | None, parallel: bool, worksharing: bool = False) -> str:
        """Open loops `which`; the first runs on OpenMP threads when `parallel` and the space
        is large enough (`worksharing`: inside a parallel region already)."""
        work = math.prod(self.sched.space) if self.sched.space else 1
        for n, i in enumerate(which):
            threads = parallel and n == 0 and work >= self.threshold
            vector = simd is not None and n == len(which) - 1
            if threads and worksharing:
                self.lines.append(f"{indent}#pragma omp for{' simd' if vector else ''}"
                                  f"{simd if vector else ''} schedule(static)")
            elif threads and vector:
                self.lines.append(f"{indent}#pragma omp parallel for simd{simd} schedule(static)")
            elif threads:
                self.lines.append(f"{indent}#pragma omp parallel for schedule(static)")
            elif vector:
                self.lines.append(f"{indent}#pragma omp simd{simd}")
            self.lines.append(f"{indent}for (int64_t i{i} = 0; i{i} < {dims[i].size}; ++i{i}) {{")
            indent += "  "
        return indent

    def _close_loops(self, count: int, indent: str) -> str:
        for _ in range(count):
            indent = indent[:-2]
            self.lines.append(f"{indent}}}")
        return indent

    def emit(self) -> KernelSource:
        self._collect_buffers()
        column = self._is_column_reduction()
        dims = self._loop_dims(column)
        kept = [i for i, d in enumerate(dims) if not d.reduced]
        reduced = [i for i, d in enumerate(dims) if d.reduced]
        ops = ", ".join(n.op for n in self.graph.nodes)
        self.lines.append(f"/* {c_comment(self.name)}: {c_comment(ops)} */")
        self.lines.append(f"void {self.name}(void *const *args) {{")
        for k, buf in enumerate(self.buffers):
            storage = T.C_STORAGE[buf.value.dtype]
            const = "" if buf.is_output else "const "
            self.lines.append(f"  {const}{storage} *restrict {buf.name} = "
                              f"({const}{storage} *)args[{k}];")
        outputs = [b for b in self.buffers if b.is_output]
        if not self.sched.is_reduction and kept and self._streams(outputs, dims[kept[-1]],
                                                                   row=False):
            self._emit_pointwise_streaming(dims, kept, outputs)
        elif not self.sched.is_reduction:
            indent = self._open_loops(dims, kept, "  ", "" if kept else None, parallel=True)
            self._compute(self._inner_closure([b.value for b in outputs]), dims, True, indent)
            for buf in outputs:
                self._store(buf, dims, True, indent)
            self._close_loops(len(kept), indent)
        elif column:
            self._emit_column_reduction(dims, outputs)
        else:
            self._emit_reduction(dims, kept, reduced, outputs)
        self.lines.append("}")
        return KernelSource(self.name, "\n".join(self.lines) + "\n", self.buffers)

    def _choose_stash(self, outputs: list[Buffer]) -> tuple[Node, Buffer] | None:
        """A value the last reduction pass computes and the epilogue needs again (Softmax's
        exp(x - max)): the pass stores it in an output buffer of its dtype, and the epilogue
        loads it instead of recomputing it. Each element is stored and reloaded by the same
        iteration before the epilogue overwrites it, so the buffer is free scratch."""
        inner_outputs = [b for b in outputs if not self.sched.is_outer(b.value)]
        if not self.sched.phases or not inner_outputs:
            return None
        last = self.sched.phases[-1]
        in_pass = {n.uid for n in self._inner_closure([r.inputs[0] for r in last])}
        epilogue = self._inner_closure([b.value for b in inner_outputs])
        shared = [n for n in epilogue if n.uid in in_pass and get_op(n.op).expensive
                  and self.sched.aligned[n.uid] == self.sched.space]
        for node in reversed(shared):  # the latest shared value saves the most work
            for buf in inner_outputs:
                if buf.value.dtype == node.dtype:
                    return node, buf
        return None

    def _emit_reduction(self, dims: list[LoopDim], kept: list[int], reduced: list[int],
                        outputs: list[Buffer]) -> None:
        stash = self._choose_stash(outputs)
        inner_outputs = [b for b in outputs if not self.sched.is_outer(b.value)]
        # Rows are built in stack buffers (the stash too) and streamed out once finished.
        stream = len(reduced) == 1 and self._streams(inner_outputs, dims[reduced[0]], row=True)
        threads = bool(kept) and math.prod(self.sched.space) >= self.threshold
        indent = "  "
        if stream:
            indent = self._open_region(threads, indent)
            indent = self._open_loops(dims, kept, indent, None, parallel=True, worksharing=True)
            self._declare_blocks(inner_outputs, "row", dims[reduced[0]].size, indent)
        else:
            indent = self._open_loops(dims, kept, indent, None, parallel=True)

        def stash_at(buf: Buffer) -> str:
            return f"row{buf.index}[i{reduced[0]}]" if stream else \
                f"{buf.name}[{self._offset(buf, dims, True)}]"
        outer_nodes = [n for n in self.graph.nodes if self.sched.is_outer(n) and
                       get_op(n.op).kind != PatternKind.REDUCE]
        self._compute([n for n in outer_nodes if self.sched.outer_phase[n.uid] == 0], dims,
                      False, indent)
        for phase, reductions in enumerate(self.sched.phases, start=1):
            clauses = []
            for red in reductions:
                acc = f"acc{self.local[red.uid]}"
                ct = T.C_COMPUTE[red.dtype]
                self.lines.append(f"{indent}{ct} {acc} = {self._reduce_init(red)};")
                operator = _reduction(red).omp_operator
                clauses.append(f" reduction({operator}:{acc})")
                if self._tracks_nan(red):
                    self.lines.append(f"{indent}int nan{self.local[red.uid]} = 0;")
                    clauses.append(f" reduction(|:nan{self.local[red.uid]})")
            inner_indent = self._open_loops(dims, reduced, indent, "".join(clauses), False)
            saved = dict(self.var)
            self._compute(self._inner_closure([r.inputs[0] for r in reductions]), dims, True,
                          inner_indent)
            if stash is not None and phase == len(self.sched.phases):
                node, buf = stash
                self.lines.append(f"{inner_indent}{stash_at(buf)} "
                                  f"= ({T.C_STORAGE[node.dtype]}){self.var[node.uid]};")
            for red in reductions:
                acc = f"acc{self.local[red.uid]}"
                v = self._operand(red.inputs[0], dims, True)
                self.lines.append(f"{inner_indent}{acc} = {self._combine(red, acc, v)};")
                if self._tracks_nan(red):
                    self.lines.append(f"{inner_indent}nan{self.local[red.uid]} |= ({v} != {v});")
            self.var = saved
            self._close_loops(len(reduced), inner_indent)
            for red in reductions:
                acc = f"acc{self.local[red.uid]}"
                if self._tracks_nan(red):
                    self.lines.append(f"{indent}if (nan{self.local[red.uid]}) {acc} = NAN;")
                if red.dtype == T.float16:
                    self.lines.append(f"{indent}{acc} = (float)(_Float16){acc};")
                self.var[red.uid] = acc
            self._compute([n for n in outer_nodes if self.sched.outer_phase[n.uid] == phase],
                          dims, False, indent)
        if inner_outputs:
            inner_indent = self._open_loops(dims, reduced, indent, "", False)
            saved = dict(self.var)
            known: set[int] = set()
            if stash is not None:
                node, buf = stash
                load = stash_at(buf)
                ct, name = T.C_COMPUTE[node.dtype], f"stash{self.local[node.uid]}"
                self.lines.append(f"{inner_indent}const {ct} {name} = ({ct}){load};")
                self.var[node.uid] = name
                known.add(node.uid)
            self._compute(self._inner_closure([b.value for b in inner_outputs], known), dims,
                          True, inner_indent)
            for buf in inner_outputs:
                self._store(buf, dims, True, inner_indent,
                            into=f"row{buf.index}[i{reduced[0]}]" if stream else None)
            self.var = saved
            self._close_loops(len(reduced), inner_indent)
            if stream:
                self._stream_out(inner_outputs, dims, reduced[0], "0", "row",
                                 str(dims[reduced[0]].size), indent)
        for buf in outputs:
            if self.sched.is_outer(buf.value):
                self._store(buf, dims, False, indent)
        indent = self._close_loops(len(kept), indent)
        if stream:
            self._close_region(threads, indent)

    # -- column reductions ------------------------------------------------------------------
    def _emit_column_reduction(self, dims: list[LoopDim], outputs: list[Buffer]) -> None:
        """Reductions over axes that are not innermost (axis 0 of a matrix, the middle axis of
        a 3-d tensor): the innermost kept axis is walked in blocks of COLUMN_BLOCK lanes, each
        lane with its own accumulator, so every load is contiguous and the lanes vectorise."""
        kin = len(dims) - 1
        kout = [i for i, d in enumerate(dims[:-1]) if not d.reduced]
        red = [i for i, d in enumerate(dims) if d.reduced]
        block = min(COLUMN_BLOCK, dims[kin].size)
        work = math.prod(self.sched.space)
        threads = work >= self.threshold
        indent = self._open_loops(dims, kout, "  ", None, parallel=threads and bool(kout))
        if threads and not kout:
            self.lines.append(f"{indent}#pragma omp parallel for schedule(static)")
        size = dims[kin].size
        self.lines.append(f"{indent}for (int64_t kb = 0; kb < {size}; kb += {block}) {{")
        indent += "  "
        self.lines.append(f"{indent}const int64_t nb = {size} - kb < {block} ? {size} - kb : "
                          f"{block};")
        lane = f"const int64_t i{kin} = kb + j;"

        def lanes(body: list[str], at: str) -> None:
            self.lines.append(f"{at}#pragma omp simd")
            self.lines.append(f"{at}for (int64_t j = 0; j < nb; ++j) {{")
            self.lines.append(f"{at}  {lane}")
            self.lines.extend(f"{at}  {b}" for b in body)
            self.lines.append(f"{at}}}")

        outer_nodes = [n for n in self.graph.nodes if self.sched.is_outer(n) and
                       get_op(n.op).kind != PatternKind.REDUCE]

        def outer_values(phase: int) -> None:
            nodes = [n for n in outer_nodes if self.sched.outer_phase[n.uid] == phase]
            if not nodes:
                return
            body = []
            for node in nodes:
                ct = T.C_COMPUTE[node.dtype]
                self.lines.append(f"{indent}{ct} ov{self.local[node.uid]}[{block}];")
                body.append(f"ov{self.local[node.uid]}[j] = {self._expr(node, dims, False)};")
                self.var[node.uid] = f"ov{self.local[node.uid]}[j]"
            lanes(body, indent)

        outer_values(0)
        for phase, reductions in enumerate(self.sched.phases, start=1):
            init_body = []
            for red_node in reductions:
                ct = T.C_COMPUTE[red_node.dtype]
                acc = f"acc{self.local[red_node.uid]}"
                self.lines.append(f"{indent}{ct} {acc}[{block}];")
                init_body.append(f"{acc}[j] = {self._reduce_init(red_node)};")
                if self._tracks_nan(red_node):
                    self.lines.append(f"{indent}int nan{self.local[red_node.uid]}[{block}];")
                    init_body.append(f"nan{self.local[red_node.uid]}[j] = 0;")
            lanes(init_body, indent)
            inner_indent = self._open_loops(dims, red, indent, None, False)
            saved = dict(self.var)
            mark = len(self.lines)
            self._compute(self._inner_closure([r.inputs[0] for r in reductions]), dims, True,
                          inner_indent + "  ")
            body = [line.strip() for line in self.lines[mark:]]
            del self.lines[mark:]
            for red_node in reductions:
                acc = f"acc{self.local[red_node.uid]}[j]"
                v = self._operand(red_node.inputs[0], dims, True)
                body.append(f"{acc} = {self._combine(red_node, acc, v)};")
                if self._tracks_nan(red_node):
                    body.append(f"nan{self.local[red_node.uid]}[j] |= ({v} != {v});")
            self.var = saved
            lanes(body, inner_indent)
            self._close_loops(len(red), inner_indent)
            final_body = []
            for red_node in reductions:
                acc = f"acc{self.local[red_node.uid]}[j]"
                if self._tracks_nan(red_node):
                    final_body.append(f"if (nan{self.local[red_node.uid]}[j]) {acc} = NAN;")
                if red_node.dtype == T.float16:
                    final_body.append(f"{acc} = (float)(_Float16){acc};")
                self.var[red_node.uid] = acc
            if final_body:
                lanes(final_body, indent)
            outer_values(phase)
        inner_outputs = [b for b in outputs if not self.sched.is_outer(b.value)]
        if inner_outputs:
            inner_indent = self._open_loops(dims, red, indent, None, False)
            saved = dict(self.var)
            mark = len(self.lines)
            self._compute(self._inner_closure([b.value for b in inner_outputs]), dims, True,
                          inner_indent)
            for buf in inner_outputs:
                self._store(buf, dims, True, inner_indent)
            body = [line.strip() for line in self.lines[mark:]]
            del self.lines[mark:]
            self.var = saved
            lanes(body, inner_indent)
            self._close_loops(len(red), inner_indent)
        outer_outputs = [b for b in outputs if self.sched.is_outer(b.value)]
        if outer_outputs:
            mark = len(self.lines)
            for buf in outer_outputs:
                self._store(buf, dims, False, indent)
            body = [line.strip() for line in self.lines[mark:]]
            del self.lines[mark:]
            lanes(body, indent)
        indent = indent[:-2]
        self.lines.append(f"{indent}}}")
        self._close_loops(len(kout), indent)

    def _reduce_init(self, red: Node) -> str:
        init = _reduction(red).identity
        if init in ("INFINITY", "-INFINITY") and not T.is_float(red.dtype):
            bits = "INT64" if red.dtype == T.int64 else "INT32"
            init = f"{bits}_MAX" if init == "INFINITY" else f"{bits}_MIN"
        return init

    @staticmethod
    def _tracks_nan(red: Node) -> bool:
        return _reduction(red).propagates_nan and T.is_float(red.dtype)

    @staticmethod
    def _combine(red: Node, acc: str, v: str) -> str:
        return _reduction(red).combine.format(acc=acc, v=v)


def _reduction(red: Node) -> Reduction:
    reduction = get_op(red.op).reduction
    assert reduction is not None, f"{red.op} is not a reduction"
    return reduction
