"""C source for one fused group: a loop nest over the group's iteration space.

Pointwise groups are one loop nest whose innermost loop is `#pragma omp simd`; reduction groups
loop over the kept axes outside (OpenMP-parallel above a size threshold) and over the reduced
axes inside, once per reduction phase, then once more for the epilogue. Transcendentals are
declared `omp declare simd` so gcc calls glibc's vector math library (libmvec); float exp is
graphkernel's own `gkm_expf`, inlined. The C text every kernel shares, and how names and values
are spelled in C, are in `backends/c/c_text.py`.
"""
from __future__ import annotations

import math

from graphkernel.backends.c import shape_args as dyn  # sizes known only at run time
from graphkernel.backends.c.c_loops import (
    DEFAULT_BLOCKING,
    Buffer,
    KernelSource,
    LoopBlocking,
    LoopDim,
    contiguous_strides,
)
from graphkernel.backends.c.c_reduce import ReductionEmitter
from graphkernel.backends.c.c_text import C_COMPUTE, C_STORAGE, c_comment, literal
from graphkernel.backends.c.c_views import concat_buffers, tile_buffers, view_buffers
from graphkernel.backends.c.ops import CExpression, code_for_op, is_number, power_by_products
from graphkernel.errors import CompileError
from graphkernel.graph_kernel.schedule import Schedule
from graphkernel.ir import types as T
from graphkernel.ir.graph import Constant, Graph, Node, Value
from graphkernel.ir.opset import get_op

__all__ = ["Buffer", "KernelSource", "LoopDim", "emit_kernel"]

# Elements a streaming pointwise kernel computes into an L1 block before copying it out with
# non-temporal stores; and the longest row a streaming row reduction keeps on the stack.
STREAM_BLOCK = 1024
# A cache line: what one non-temporal store of a pointwise kernel writes (gk_stream_line).
LINE_BYTES = 64
STREAM_ROW_BYTES = 64 << 10


def emit_kernel(graph: Graph, name: str, sched: Schedule, parallel_threshold: int,
                stream_min_bytes: int | None = None,
                prefetch_min_bytes: int | None = None,
                beside_blas: bool = False,
                blocking: LoopBlocking = DEFAULT_BLOCKING) -> KernelSource:
    """C source for one fused group. Loops over more than `parallel_threshold` elements run
    on OpenMP threads; outputs of at least `stream_min_bytes` in all are written with
    non-temporal stores (None: never); a pointwise group calling vector math prefetches its
    inputs of at least `prefetch_min_bytes` ahead of its loads (None: never). `beside_blas`:
    the kernel runs after a multi-threaded BLAS product of its call, and its parallel regions
    keep their threads only on more than two cores (`gk_parallel_beside_blas`, c_text.py).
    `blocking`: the block sizes its loops walk in (c_loops.py)."""
    return _Emitter(graph, name, sched, parallel_threshold, stream_min_bytes,
                    prefetch_min_bytes, beside_blas, blocking).emit()


class _Emitter(ReductionEmitter):
    def __init__(self, graph: Graph, name: str, sched: Schedule, threshold: int,
                 stream_min_bytes: int | None = None,
                 prefetch_min_bytes: int | None = None, beside_blas: bool = False,
                 blocking: LoopBlocking = DEFAULT_BLOCKING) -> None:
        self.graph = graph
        self.blocking = blocking
        self.name = name
        self.sched = sched
        self.threshold = threshold
        self.stream_min_bytes = stream_min_bytes
        self.prefetch_min_bytes = prefetch_min_bytes
        # Appended to every `omp parallel` directive (see emit_kernel).
        self.parallel_if = " if(parallel: gk_parallel_beside_blas())" if beside_blas else ""
        self.stream_bytes: str | None = None  # see KernelSource.stream_bytes
        self.lines: list[str] = []
        self.var: dict[int, str] = {}
        self.buffers: list[Buffer] = []
        self.buffer_of: dict[int, Buffer] = {}
        # C names number nodes by position, not by their process-wide uid: the same kernel then
        # has the same source (and compilation cache key) in every graph and process.
        self.local = {node.uid: i for i, node in enumerate(graph.nodes)}
        # Loop index -> the C name a load uses for it, where not `i<k>` (a pipelined row
        # reduction reads the next row's elements at `rn`: backends/c/c_reduce.py).
        self.index_names: dict[int, str] = {}

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
        self.concat_loads, pieces = concat_buffers(self.sched, self.buffer_of, Buffer)
        self.views += pieces + tile_buffers(self.sched, self.buffer_of, Buffer)

    def _loop_dims(self, column: bool = False) -> list[LoopDim]:
        """Loop dimensions, adjacent compatible ones merged. Row order: kept dims outside,
        reduced inside. Column order (the innermost axis is kept): other kept dims, then the
        reduced ones, then the innermost kept run, so the innermost loop walks memory."""
        space, axes = self.sched.space, self.sched.reduce_axes
        per_buffer = {id(b): b.space_strides or contiguous_strides(b.aligned)  # not sources
                      for b in self.buffers + self.views if b.value.uid in self.sched.aligned
                      or b.space_strides or b.is_output}  # read only through index maps
        order = list(range(len(space))) if column else \
            [d for d in range(len(space)) if d not in axes] + list(axes)
        dims = [LoopDim(space[d], d in axes, {k: s[d] for k, s in per_buffer.items()}, d)
                for d in order if space[d] != 1]
        # A Concat's axis keeps a loop of its own (its index picks the piece to load from), and
        # so does a Tile's repeated axis (its index wraps).
        barriers = self.sched.barrier_axes()
        merged: list[LoopDim] = []
        for dim in dims:
            if merged and merged[-1].reduced == dim.reduced and \
                    dim.axis not in barriers and merged[-1].axis not in barriers and all(
                    merged[-1].strides[k] == dim.strides[k] * dim.size for k in dim.strides):
                prev = merged[-1]
                merged[-1] = LoopDim(prev.size * dim.size, dim.reduced, dict(dim.strides), -2)
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
            index = self.index_names.get(i, f"i{i}")
            if buf.modulo and dim.axis in buf.modulo:  # a Tile's repeated axis
                index = f"({index} % {buf.modulo[dim.axis]})"
            if stride:
                terms.append(index if stride == 1 else f"{index} * {stride}")
        return " + ".join(terms + [str(buf.offset)] * bool(buf.offset)) or "0"

    def _operand(self, value: Value, dims: list[LoopDim], inner: bool) -> str:
        if isinstance(value, Constant) and value.is_scalar:
            return literal(value.value)
        if value.uid in self.var:
            return self.var[value.uid]
        if value.uid in self.concat_loads:
            return self._concat_load(value, dims, inner)
        buf = self.buffer_of[value.uid]
        load = f"{buf.name}[{self._offset(buf, dims, inner)}]"
        if value.dtype == T.float16:
            return f"((float){load})"
        return load

    def _concat_load(self, value: Value, dims: list[LoopDim], inner: bool) -> str:
        """The element of a Concat: from the piece whose range holds the loop index along the
        Concat's axis (a chain of conditionals; only the chosen piece is read)."""
        axis, _ = self.sched.concats[value.uid]
        pieces = self.concat_loads[value.uid]
        at = next((self.index_names.get(i, f"i{i}") for i, d in enumerate(dims)
                   if d.axis == axis), "0")
        cast = "(float)" if value.dtype == T.float16 else ""
        loads = [f"{cast}{buf.name}[{self._offset(buf, dims, inner)}]" for buf, _ in pieces]
        expr = loads[-1]
        for (_, end), load in zip(reversed(pieces[:-1]), reversed(loads[:-1])):
            expr = f"({at} < {end} ? {load} : {expr})"
        return expr

    def _expr(self, node: Node, dims: list[LoopDim], inner: bool) -> str:
        in_dtypes = [v.dtype for v in node.inputs]
        out_ct = C_COMPUTE[node.dtype]
        if node.op == "Cast":
            operand_dtypes = in_dtypes
        elif node.op == "Select":
            operand_dtypes = [T.bool_, node.dtype, node.dtype]
        else:
            operand_dtypes = [T.promote(*in_dtypes)] * len(in_dtypes)
        operands = []
        for value, want in zip(node.inputs, operand_dtypes):
            text = self._operand(value, dims, inner)
            if C_COMPUTE[value.dtype] != C_COMPUTE[want]:
                text = f"(({C_COMPUTE[want]}){text})"
            operands.append(text)
        compute = C_COMPUTE[operand_dtypes[-1]] if operand_dtypes else out_ct
        expression = _expression(node.op)
        exponent = node.inputs[1] if node.op == "Pow" else None
        if isinstance(exponent, Constant) and exponent.is_scalar:
            expression = power_by_products(exponent.value.item()) or expression
        template = expression.for_operands(T.is_float(operand_dtypes[-1]),
                                           [is_number(v) for v in node.inputs])
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
            self.lines.append(f"{indent}const {C_COMPUTE[node.dtype]} {var} = "
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
                    uid in self.sched.maps or \
                    uid in self.sched.concats or \
                    uid in self.sched.tiles:  # loaded through its index map, not computed
                continue
            needed.add(uid)
            stack.extend(v.uid for v in node.inputs)
        return [n for n in self.graph.nodes if n.uid in needed]

    def _invariant(self, nodes: list[Node], dims: list[LoopDim], dim: int) -> list[Node]:
        """The nodes (in order) whose value does not change along loop `dim`: each input a
        scalar, a buffer read with stride 0 along it, or such a node."""
        fixed: set[int] = set()
        for node in nodes:
            if all(self._fixed_along(v, dims[dim], fixed) for v in node.inputs):
                fixed.add(node.uid)
        return [n for n in nodes if n.uid in fixed]

    def _fixed_along(self, value: Value, dim: LoopDim, fixed: set[int]) -> bool:
        if isinstance(value, Constant) and value.is_scalar or value.uid in fixed:
            return True
        buf = self.buffer_of.get(value.uid)
        return buf is not None and value.uid not in self.concat_loads and not buf.modulo and \
            dim.strides.get(id(buf)) == 0

    def _store(self, buf: Buffer, dims: list[LoopDim], inner: bool, indent: str,
               into: str | None = None) -> None:
        """Store an output's value at its offset, or at `into` (a block or row buffer)."""
        value = self.var[buf.value.uid] if buf.value.uid in self.var else \
            self._operand(buf.value, dims, inner)
        storage = C_STORAGE[buf.value.dtype]
        target = into or f"{buf.name}[{self._offset(buf, dims, inner)}]"
        self.lines.append(f"{indent}{target} = ({storage}){value};")

    # -- non-temporal stores ------------------------------------------------------------------
    def _streams(self, buffers: list[Buffer], dim: LoopDim, row: bool) -> bool:
        """Whether these outputs are written through an L1 buffer and non-temporal stores:
        large in all (they will not be read back from cache), each contiguous along `dim`,
        the innermost loop (a row of a row reduction: short enough for the stack)."""
        if self.stream_min_bytes is None or not buffers or \
                (not dyn.is_dynamic(dim.size) and dim.size < 64):
            return False
        # Only bandwidth-bound kernels gain: in one that calls vector math (exp, tanh, ...),
        # the streaming stores stall the arithmetic (Softmax ran 15% slower with them here).
        if self._calls_vector_math():
            return False
        if any(dim.strides[id(b)] != 1 for b in buffers):
            return False
        if row and (dyn.is_dynamic(dim.size) or any(
                dim.size * b.value.dtype.itemsize > STREAM_ROW_BYTES for b in buffers)):
            return False  # a row of run-time length is not put on the stack
        sizes = [math.prod(b.value.shape) * b.value.dtype.itemsize for b in buffers]
        if any(dyn.is_dynamic(s) for s in sizes):  # decided per call (generic_kernel.py)
            self.stream_bytes = " + ".join(f"(int64_t)({s})" for s in sizes)
            return True
        return sum(sizes) >= self.stream_min_bytes

    def _calls_vector_math(self) -> bool:
        return any(get_op(node.op).vector_math for node in self.graph.nodes)

    # -- software prefetch --------------------------------------------------------------------
    def _prefetched(self, dim: LoopDim) -> list[Buffer]:
        """The inputs a pointwise loop calling vector math prefetches ahead of its loads: those
        read contiguously along the innermost loop `dim` and large enough (a dynamic size is
        taken as large) not to be in cache already. A bandwidth-bound loop of cheap arithmetic
        is fed by the hardware prefetcher; a long computation per element stalls on its loads."""
        if self.prefetch_min_bytes is None or not self._calls_vector_math():
            return []
        ahead = []
        for buf in self.buffers:
            if buf.is_output or dim.strides.get(id(buf)) != 1:
                continue
            size = math.prod(buf.value.shape) * buf.value.dtype.itemsize
            if dyn.is_dynamic(size) or size >= self.prefetch_min_bytes:
                ahead.append(buf)
        return ahead

    def _open_prefetching_loop(self, dims: list[LoopDim], last: int, ahead: list[Buffer],
                               indent: str, parallel: bool) -> str:
        """Open the innermost loop `last` as chunks of `pointwise_chunk` elements, each chunk
        prefetching the lines `prefetch_distance_bytes` past its start in every buffer of
        `ahead`, then an `omp simd` loop over the chunk; two braces to close. The address is
        formed as an integer from an element inside the buffer (a prefetch past the end does
        not fault)."""
        size = dims[last].size
        chunk, distance = self.blocking.pointwise_chunk, self.blocking.prefetch_distance_bytes
        work = math.prod(self.sched.space) if self.sched.space else 1
        if parallel and dyn.runs_threaded(work, self.threshold):
            self.lines.append(f"{indent}#pragma omp parallel for schedule(static)"
                              f"{self.parallel_if}")
        self.lines.append(f"{indent}for (int64_t kc = 0; kc < {size}; kc += {chunk}) {{")
        indent += "  "
        self.index_names[last] = "kc"
        for buf in ahead:
            lines = max(1, chunk * buf.value.dtype.itemsize // LINE_BYTES)
            start = f"(uintptr_t)&{buf.name}[{self._offset(buf, dims, True)}] + {distance}"
            self.lines.append(f"{indent}for (int q = 0; q < {lines}; ++q) __builtin_prefetch("
                              f"(const void *)({start} + q * {LINE_BYTES}));")
        del self.index_names[last]
        self.lines.append(f"{indent}const int64_t ke = {size} - kc < {chunk} ? {size} "
                          f": kc + {chunk};")
        self.lines.append(f"{indent}#pragma omp simd")
        self.lines.append(f"{indent}for (int64_t i{last} = kc; i{last} < ke; ++i{last}) {{")
        return indent + "  "

    def _declare_blocks(self, buffers: list[Buffer], prefix: str, size: int,
                        indent: str) -> None:
        for buf in buffers:
            self.lines.append(f"{indent}{C_STORAGE[buf.value.dtype]} {prefix}{buf.index}"
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
            self.lines.append(f"{indent}#pragma omp parallel{self.parallel_if}")
            self.lines.append(f"{indent}{{")
            indent += "  "
        return indent

    def _close_region(self, threads: bool, indent: str) -> None:
        self.lines.append(f"{indent}gk_stream_fence();")
        if threads:
            self.lines.append(f"{indent[:-2]}}}")

    def _compute_outputs(self, outputs: list[Buffer], dims: list[LoopDim], indent: str,
                         local: str | None = None) -> None:
        """Compute every output's value at the innermost index and store it: into the output,
        or into element j of the line or block `local`<index> it is assembled in."""
        self._compute(self._inner_closure([b.value for b in outputs]), dims, True, indent)
        for buf in outputs:
            into = None if local is None else f"{local}{buf.index}[j]"
            self._store(buf, dims, True, indent, into=into)

    def _emit_pointwise_streaming(self, dims: list[LoopDim], kept: list[int],
                                  outputs: list[Buffer]) -> None:
        """A pointwise loop nest whose innermost loop runs in blocks of STREAM_BLOCK: each
        block is computed into L1 buffers (vectorised), then streamed to the outputs."""
        last, outer = kept[-1], kept[:-1]
        threads = dyn.runs_threaded(math.prod(self.sched.space), self.threshold)
        size = dims[last].size
        block = dyn.block_size(STREAM_BLOCK, size)
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
        self._compute_outputs(outputs, dims, inner, "blk")
        self.lines.append(f"{indent}  }}")
        self._stream_out(outputs, dims, last, "kb", "blk", "nb", indent + "  ")
        self.lines.append(f"{indent}}}")
        indent = self._close_loops(len(outer), indent)
        self._close_region(threads, indent)

    def _emit_pointwise_lines(self, dims: list[LoopDim], kept: list[int],
                              outputs: list[Buffer]) -> None:
        """A streaming pointwise loop nest whose innermost loop runs over whole 64-byte lines of
        the first output: each line computed in registers (an unrolled simd loop) and stored
        with one non-temporal store per output, with nothing written to L1 in between (the
        block scheme measured 4.3 ms on ((x*2)+1)*3 over 4096x4096 floats, this one 2.4 ms, a
        streaming copy 2.3 ms). The elements before the first line boundary and after the last
        whole line (per row) take ordinary stores; an output not aligned as the first is (two
        outputs at other offsets within their lines) stores its lines ordinarily too."""
        last, outer = kept[-1], kept[:-1]
        threads = dyn.runs_threaded(math.prod(self.sched.space), self.threshold)
        size = dims[last].size
        itemsize = outputs[0].value.dtype.itemsize
        lanes = LINE_BYTES // itemsize
        indent = self._open_region(threads, "  ")
        indent = self._open_loops(dims, outer, indent, None, threads, worksharing=True)
        # Where this row of each output starts, and how many elements precede its first line.
        self.index_names[last] = "0"
        starts = {b.index: f"&{b.name}[{self._offset(b, dims, True)}]" for b in outputs}
        del self.index_names[last]
        first = outputs[0]
        self.lines.append(f"{indent}const int64_t hd = gk_line_head({starts[first.index]}, "
                          f"{size}, {itemsize});")
        self.lines.append(f"{indent}const int64_t nl = ({size} - hd) / {lanes};")
        for buf in outputs[1:]:
            self.lines.append(f"{indent}const bool al{buf.index} = (((uintptr_t)("
                              f"{starts[buf.index]} + hd)) & {LINE_BYTES - 1}) == 0;")
        if threads and not outer:
            self.lines.append(f"{indent}#pragma omp for schedule(static) nowait")
        self.lines.append(f"{indent}for (int64_t c = 0; c < nl; ++c) {{")
        body = indent + "  "
        self.lines.append(f"{body}const int64_t kb = hd + c * {lanes};")
        for buf in outputs:
            self.lines.append(f"{body}{C_STORAGE[buf.value.dtype]} ln{buf.index}[{lanes}] "
                              f"__attribute__((aligned({LINE_BYTES})));")
        self.lines.append(f"{body}#pragma omp simd")
        self.lines.append(f"{body}for (int64_t j = 0; j < {lanes}; ++j) {{")
        inner = body + "  "
        self.lines.append(f"{inner}const int64_t i{last} = kb + j;")
        computed = dict(self.var)
        self._compute_outputs(outputs, dims, inner, "ln")
        self.lines.append(f"{body}}}")
        self.lines.append(f"{body}{{")
        self.lines.append(f"{body}  const int64_t i{last} = kb;")
        for buf in outputs:
            aligned = "true" if buf is first else f"al{buf.index}"
            self.lines.append(f"{body}  gk_stream_line(&{buf.name}[{self._offset(buf, dims, True)}"
                              f"], ln{buf.index}, {aligned});")
        self.lines.append(f"{body}}}")
        self.lines.append(f"{indent}}}")
        # The head and the tail: a single thread's when the lines were shared out.
        if threads and not outer:
            self.lines.append(f"{indent}#pragma omp single nowait")
        self.lines.append(f"{indent}for (int p = 0; p < 2; ++p) {{")
        self.lines.append(f"{indent}  const int64_t lo = p ? hd + nl * {lanes} : 0, "
                          f"hi = p ? {size} : hd;")
        self.lines.append(f"{indent}  #pragma omp simd")
        self.lines.append(f"{indent}  for (int64_t i{last} = lo; i{last} < hi; ++i{last}) {{")
        self.var = computed  # the values are computed again, in this loop
        self._compute_outputs(outputs, dims, indent + "    ")
        self.lines.append(f"{indent}  }}")
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
            threads = parallel and n == 0 and dyn.runs_threaded(work, self.threshold)
            vector = simd is not None and n == len(which) - 1
            if threads and worksharing:
                self.lines.append(f"{indent}#pragma omp for{' simd' if vector else ''}"
                                  f"{simd if vector else ''} schedule(static)")
            elif threads and vector:
                self.lines.append(f"{indent}#pragma omp parallel for simd{simd} schedule(static)"
                                  f"{self.parallel_if}")
            elif threads:
                self.lines.append(f"{indent}#pragma omp parallel for schedule(static)"
                                  f"{self.parallel_if}")
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
            storage = C_STORAGE[buf.value.dtype]
            const = "" if buf.is_output else "const "
            self.lines.append(f"  {const}{storage} *restrict {buf.name} = "
                              f"({const}{storage} *)args[{k}];")
        outputs = [b for b in self.buffers if b.is_output]
        if not self.sched.is_reduction and kept and self._streams(outputs, dims[kept[-1]],
                                                                   row=False):
            if len({b.value.dtype.itemsize for b in outputs}) == 1:
                self._emit_pointwise_lines(dims, kept, outputs)
            else:  # outputs of two widths have no common line: blocks copied out
                self._emit_pointwise_streaming(dims, kept, outputs)
        elif not self.sched.is_reduction:
            nodes = self._inner_closure([b.value for b in outputs])
            # Values the innermost loop does not change (a per-channel scale over H*W) are
            # computed once outside it: gcc does not hoist them out of an `omp simd` loop.
            hoisted = self._invariant(nodes, dims, kept[-1]) if len(kept) > 1 else []
            ahead = self._prefetched(dims[kept[-1]]) if kept else []
            indent = self._open_loops(dims, kept[:-1], "  ", None, parallel=True)
            self._compute(hoisted, dims, True, indent)
            if ahead:
                indent = self._open_prefetching_loop(dims, kept[-1], ahead, indent,
                                                     parallel=len(kept) == 1)
            else:
                indent = self._open_loops(dims, kept[-1:], indent, "" if kept else None,
                                          parallel=len(kept) == 1)
            self._compute([n for n in nodes if n not in hoisted], dims, True, indent)
            for buf in outputs:
                self._store(buf, dims, True, indent)
            self._close_loops(len(kept) + bool(ahead), indent)
        elif column:
            self._emit_column_reduction(dims, outputs)
        else:
            self._emit_reduction(dims, kept, reduced, outputs)
        self.lines.append("}")
        return KernelSource(self.name, "\n".join(self.lines) + "\n", self.buffers,
                            self.stream_bytes)


def _expression(op: str) -> CExpression:
    expression = code_for_op(op)
    if expression is None:
        # fusible_op takes every pointwise op; tests/test_backends.py checks each has an entry
        raise CompileError(f"the C backend's op table (backends/c/ops.py) has no {op}")
    return expression
