"""C for reductions: row reductions (the innermost axis is reduced) and column reductions (it is
kept), as a mixin of the loop-nest emitter in `backends/c/c_emitter.py`.

Float sums are blocked so that their error does not grow with the row (docs/perf-notes.md,
"Numerics"): a row longer than a row block (`row_block`, default ROW_BLOCK in c_loops.py) is
summed in blocks of that many elements, each block vectorised with one float accumulator per
vector lane (at most row_block/lanes additions per lane, then a tree over the lanes), and the
block sums are combined pairwise in double (`gk_pairwise` in backends/c/c_text.py's PRELUDE).
A column reduction adds each lane's COLUMN_RUN-row block sums into a double total per lane.
The row block, the column-block width and the rows per pipelined chunk are the kernel's
`LoopBlocking` (backends/c/c_loops.py: the defaults, or a tuned kernel's own). Integer sums
wrap and are exact; max and min are exact; float products multiply in numpy's order, one
accumulator and no vector lanes (the same infinities, zeros and NaN as numpy's sequential
product; one rounding per factor).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphkernel.backends.c import shape_args as dyn  # sizes known only at run time
from graphkernel.backends.c.c_loops import Buffer, LoopBlocking, LoopDim
from graphkernel.backends.c.c_text import C_COMPUTE, C_STORAGE
from graphkernel.backends.c.ops import C_REDUCTIONS, CReduction, c_identity
from graphkernel.graph_kernel.schedule import Schedule
from graphkernel.ir import types as T
from graphkernel.ir.graph import Graph, Node
from graphkernel.ir.opset import PatternKind, Reduction, ReductionKind, get_op

# Reduced rows a column reduction's lanes sum in float before adding them to a double total.
COLUMN_RUN = 64
# The longest row a reduction keeps its stash in on the stack (see _choose_stash).
STASH_ROW_BYTES = 64 << 10


class ReductionEmitter:
    """Reduction loop nests; the loop, expression and store helpers are the emitter's."""

    graph: Graph
    sched: Schedule
    lines: list[str]
    var: dict[int, str]
    local: dict[int, int]
    threshold: int
    index_names: dict[int, str]
    parallel_if: str
    blocking: LoopBlocking
    _pipelined_row: int
    _next_row_blocked: bool

    def _choose_stash(self, outputs: list[Buffer]) -> tuple[Node, Buffer | None] | None:
        """A value the last reduction pass computes and the epilogue needs again (Softmax's
        exp(x - max)): the pass stores it in an output buffer of its dtype, and the epilogue
        loads it instead of recomputing it. Each element is stored and reloaded by the same
        iteration before the epilogue overwrites it, so the buffer is free scratch. When no
        output has its dtype (float16 Softmax computes exp in float32), a row of up to
        STASH_ROW_BYTES goes on the stack instead (buffer None)."""
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
        if not shared:
            return None
        row = math.prod(self.sched.space[a] for a in self.sched.reduce_axes)
        itemsize = 8 if C_COMPUTE[shared[-1].dtype] == "double" else 4
        if not dyn.is_dynamic(row) and row * itemsize <= STASH_ROW_BYTES:
            return shared[-1], None
        return None  # a row of run-time length has no stack stash: the epilogue recomputes

    def _emit_reduction(self, dims: list[LoopDim], kept: list[int], reduced: list[int],
                        outputs: list[Buffer]) -> None:
        stash = self._choose_stash(outputs)
        if stash is not None and stash[1] is None and len(reduced) != 1:
            stash = None  # a stack row is indexed by the one reduced loop
        inner_outputs = [b for b in outputs if not self.sched.is_outer(b.value)]
        # Rows are built in stack buffers (the stash too) and streamed out once finished.
        stream = len(reduced) == 1 and self._streams(inner_outputs, dims[reduced[0]], row=True)
        threads = bool(kept) and dyn.runs_threaded(math.prod(self.sched.space), self.threshold)
        pipelined = self._pipelines(kept, reduced)
        indent = "  "
        if stream:
            indent = self._open_region(threads, indent)
        if pipelined:
            indent = self._open_pipelined_rows(dims, kept[0], reduced, indent, threads, stream)
        else:
            indent = self._open_loops(dims, kept, indent, None, parallel=True,
                                      worksharing=stream)
        if stream:
            self._declare_blocks(inner_outputs, "row", dims[reduced[0]].size, indent)

        if stash is not None and stash[1] is None:
            self.lines.append(f"{indent}{C_COMPUTE[stash[0].dtype]} srow"
                              f"[{dims[reduced[0]].size}] __attribute__((aligned(64)));")

        def stash_at(buf: Buffer | None) -> str:
            if buf is None:
                return f"srow[i{reduced[0]}]"
            return f"row{buf.index}[i{reduced[0]}]" if stream else \
                f"{buf.name}[{self._offset(buf, dims, True)}]"
        outer_nodes = [n for n in self.graph.nodes if self.sched.is_outer(n) and
                       get_op(n.op).kind != PatternKind.REDUCE]
        before_row = dict(self.var)
        if not pipelined:  # a pipelined pass also reads the next row's: its loads stay inline
            self._hoist_row_invariant_loads(dims, reduced, outputs, indent)
        self._compute([n for n in outer_nodes if self.sched.outer_phase[n.uid] == 0], dims,
                      False, indent)
        last_phase = len(self.sched.phases)
        for phase, reductions in enumerate(self.sched.phases, start=1):
            if pipelined and phase == 1:  # summed while the row before was in its last pass
                for red in reductions:
                    k = self.local[red.uid]
                    self.lines.append(f"{indent}{C_COMPUTE[red.dtype]} acc{k} = nacc{k};")
                    if self._tracks_nan(red):
                        self.lines.append(f"{indent}int nan{k} = nnan{k};")
                self._finish_phase(reductions, dims, indent, outer_nodes, phase)
                continue
            clauses = []
            for red in reductions:
                acc = f"acc{self.local[red.uid]}"
                ct = C_COMPUTE[red.dtype]
                self.lines.append(f"{indent}{ct} {acc} = {self._reduce_init(red)};")
                operator = _c_reduction(red).omp_operator
                clauses.append(f" reduction({operator}:{acc})")
                if self._tracks_nan(red):
                    self.lines.append(f"{indent}int nan{self.local[red.uid]} = 0;")
                    clauses.append(f" reduction(|:nan{self.local[red.uid]})")
            if pipelined and phase == last_phase:
                clauses += self._next_row_start(indent)
            blocked = [_Sum(f"acc{self.local[r.uid]}", f"pw{self.local[r.uid]}", r.dtype)
                       for r in self._blocked_row_sums(dims, reduced, reductions)]
            for acc_sum in blocked:
                self.lines.append(f"{indent}gk_pairwise {acc_sum.pairwise};")
                self.lines.append(f"{indent}{acc_sum.pairwise}.count = 0;")
            if pipelined and phase == last_phase:
                blocked += self._next_row_sums(dims, reduced)
            # A float product multiplies in numpy's order, one factor after the other: vector
            # lanes would round their own partial products (subnormals to 0, then 0 * inf =
            # NaN where numpy's product is inf), so its pass is not a simd loop.
            in_order = any(_is_float_product(r) for r in reductions)
            inner_indent = self._open_row_pass(dims, reduced, indent,
                                               None if in_order else "".join(clauses), blocked,
                                               phase)
            saved = dict(self.var)
            self._compute(self._inner_closure([r.inputs[0] for r in reductions]), dims, True,
                          inner_indent)
            if stash is not None and phase == len(self.sched.phases):
                node, buf = stash
                self.lines.append(f"{inner_indent}{stash_at(buf)} "
                                  f"= ({C_STORAGE[node.dtype]}){self.var[node.uid]};")
            for red in reductions:
                acc = f"acc{self.local[red.uid]}"
                v = self._operand(red.inputs[0], dims, True)
                self.lines.append(f"{inner_indent}{acc} = {self._combine(red, acc, v)};")
                if self._tracks_nan(red):
                    self.lines.append(f"{inner_indent}nan{self.local[red.uid]} |= ({v} != {v});")
            self.var = saved
            if pipelined and phase == last_phase:
                self._next_row_body(dims, inner_indent)
            self._close_row_pass(dims, reduced, inner_indent, blocked, phase)
            self._finish_phase(reductions, dims, indent, outer_nodes, phase)
        if inner_outputs:
            inner_indent = self._open_loops(dims, reduced, indent, "", False)
            saved = dict(self.var)
            known: set[int] = set()
            if stash is not None:
                node, buf = stash
                load = stash_at(buf)
                ct, name = C_COMPUTE[node.dtype], f"stash{self.local[node.uid]}"
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
        self.var = before_row  # the hoisted loads' names end with the row's scope
        indent = self._close_loops(2 if pipelined else len(kept), indent)
        if stream:
            self._close_region(threads, indent)

    def _hoist_row_invariant_loads(self, dims: list[LoopDim], reduced: list[int],
                                   outputs: list[Buffer], indent: str) -> None:
        """Inputs the row's passes read at one element per row (BatchNorm's per-channel mean
        and scale inside its gradient's passes over N, H, W) loaded once per row, before the
        passes. Read inside a pass that also stores (the pass computing dx), gcc must assume
        the store may change them, reloads them each element, and its redundancy elimination
        then leaves control flow that the vectoriser rejects: BatchNorm's gradient at 28x28
        ran scalar, 9x slower than with the loads hoisted."""
        closure = self._inner_closure([r.inputs[0] for phase in self.sched.phases
                                       for r in phase] +
                                      [b.value for b in outputs
                                       if not self.sched.is_outer(b.value)])
        wanted = {v.uid: v for n in closure for v in n.inputs}
        for uid, value in wanted.items():
            buf = self.buffer_of.get(uid)
            if buf is None or buf.is_output or uid in self.var or \
                    uid in self.concat_loads or buf.modulo or \
                    any(dims[i].strides[id(buf)] for i in reduced):
                continue
            name = f"row_in{buf.index}"
            self.lines.append(f"{indent}const {C_COMPUTE[value.dtype]} {name} = "
                              f"{self._operand(value, dims, False)};")
            self.var[uid] = name

    def _finish_phase(self, reductions: list[Node], dims: list[LoopDim], indent: str,
                      outer_nodes: list[Node], phase: int) -> None:
        """After a phase's pass: NaN and float16 rounding of its accumulators, then the outer
        values computed from them."""
        for red in reductions:
            acc = f"acc{self.local[red.uid]}"
            if self._tracks_nan(red):
                self.lines.append(f"{indent}if (nan{self.local[red.uid]}) {acc} = NAN;")
            if red.dtype == T.float16:
                self.lines.append(f"{indent}{acc} = (float)(_Float16){acc};")
            self.var[red.uid] = acc
        self._compute([n for n in outer_nodes if self.sched.outer_phase[n.uid] == phase],
                      dims, False, indent)

    # -- pipelined rows ---------------------------------------------------------------------
    def _pipelines(self, kept: list[int], reduced: list[int]) -> bool:
        """Whether the row reduction is pipelined: the first pass over row i+1 (the one that
        reads it from memory: Softmax's max) runs inside the last reduction pass over row i
        (Softmax's exp and sum, on a row already in L1), so the loads of one row overlap the
        arithmetic of the other. The next row's first-pass accumulators are carried to it
        (float sums in blocks and pairwise totals of their own where its row is blocked). Not
        for float products (their pass is not a simd loop), nor where a value per row is
        computed before the first pass."""
        phases = self.sched.phases
        if not self.blocking.row_pipeline_rows or len(phases) < 2 or len(kept) != 1 or \
                len(reduced) != 1:
            return False
        if any(_is_float_product(r) for r in phases[0]):
            return False
        if any(_is_float_product(r) for r in phases[-1]):
            return False  # its pass is not a simd loop
        return not any(self.sched.outer_phase[n.uid] == 0 for n in self.graph.nodes
                       if self.sched.is_outer(n) and get_op(n.op).kind != PatternKind.REDUCE)

    def _open_pipelined_rows(self, dims: list[LoopDim], row: int, reduced: list[int],
                             indent: str, threads: bool, worksharing: bool) -> str:
        """The kept loop as chunks of `row_pipeline_rows` rows (shared out among the threads); each
        chunk runs the first pass of its first row into the carried accumulators `nacc`, then
        its rows, and the row loop is left open."""
        self._pipelined_row = row
        size, rows = dims[row].size, self.blocking.row_pipeline_rows
        chunks = f"(({size}) + {rows - 1}) / {rows}" if dyn.is_dynamic(size) \
            else str(-(-size // rows))
        if threads:
            self.lines.append(f"{indent}#pragma omp {'for' if worksharing else 'parallel for'}"
                              f" schedule(static){'' if worksharing else self.parallel_if}")
        self.lines.append(f"{indent}for (int64_t rc = 0; rc < {chunks}; ++rc) {{")
        indent += "  "
        self.lines.append(f"{indent}const int64_t rlo = rc * {rows}, rhi = rlo + "
                          f"{rows} < {size} ? rlo + {rows} : {size};")
        for red in self.sched.phases[0]:
            k = self.local[red.uid]
            self.lines.append(f"{indent}{C_COMPUTE[red.dtype]} nacc{k};")
            if self._tracks_nan(red):
                self.lines.append(f"{indent}int nnan{k};")
        sums = self._next_row_sums(dims, reduced)
        for acc_sum in sums:
            self.lines.append(f"{indent}gk_pairwise {acc_sum.pairwise};")
        self.lines.append(f"{indent}{{")
        self.lines.append(f"{indent}  const int64_t rn = rlo;")
        clauses = self._next_row_start(indent + "  ")
        inner = self._open_row_pass(dims, reduced, indent + "  ", "".join(clauses), sums, 0)
        self._next_row_body(dims, inner)
        self._close_row_pass(dims, reduced, inner, sums, 0)
        self.lines.append(f"{indent}}}")
        self.lines.append(f"{indent}for (int64_t i{row} = rlo; i{row} < rhi; ++i{row}) {{")
        indent += "  "
        # The last row of a chunk reads itself again (from L1) as its "next" row.
        self.lines.append(f"{indent}const int64_t rn = i{row} + 1 < rhi ? i{row} + 1 : i{row};")
        return indent

    def _next_row_start(self, indent: str) -> list[str]:
        """Reset the next row's first-pass accumulators; their reduction clauses."""
        clauses = []
        for red in self.sched.phases[0]:
            k = self.local[red.uid]
            self.lines.append(f"{indent}nacc{k} = {self._reduce_init(red)};")
            clauses.append(f" reduction({_c_reduction(red).omp_operator}:nacc{k})")
            if self._tracks_nan(red):
                self.lines.append(f"{indent}nnan{k} = 0;")
                clauses.append(f" reduction(|:nnan{k})")
            if _is_float_sum(red) and self._next_row_blocked:
                self.lines.append(f"{indent}npw{k}.count = 0;")
        return clauses

    def _next_row_sums(self, dims: list[LoopDim], reduced: list[int]) -> list[_Sum]:
        """The next row's float sums where its row sums in blocks (longer than `row_block`, or
        of run-time length): their block sums go to pairwise totals `npw` as a row's own."""
        self._next_row_blocked = _in_blocks(dims[reduced[-1]].size, self.blocking.row_block)
        if not self._next_row_blocked:
            return []
        return [_Sum(f"nacc{self.local[r.uid]}", f"npw{self.local[r.uid]}", r.dtype)
                for r in self.sched.phases[0] if _is_float_sum(r)]

    def _next_row_body(self, dims: list[LoopDim], indent: str) -> None:
        """One element of the next row's first pass (row `rn`), in a block of its own: its
        values never mix with the current row's."""
        saved = dict(self.var)
        self.index_names = {self._pipelined_row: "rn"}
        self.lines.append(f"{indent}{{")
        inner = indent + "  "
        reductions = self.sched.phases[0]
        self._compute(self._inner_closure([r.inputs[0] for r in reductions]), dims, True, inner)
        for red in reductions:
            k = self.local[red.uid]
            v = self._operand(red.inputs[0], dims, True)
            self.lines.append(f"{inner}nacc{k} = {self._combine(red, f'nacc{k}', v)};")
            if self._tracks_nan(red):
                self.lines.append(f"{inner}nnan{k} |= ({v} != {v});")
        self.lines.append(f"{indent}}}")
        self.index_names = {}
        self.var = saved

    # -- blocked float sums of a row pass ---------------------------------------------------
    def _blocked_row_sums(self, dims: list[LoopDim], reduced: list[int],
                          reductions: list[Node]) -> list[Node]:
        """The float sums of a pass over more than `row_block` elements: they sum in blocks."""
        row = math.prod(dims[i].size for i in reduced)
        if not dyn.is_dynamic(row) and row <= self.blocking.row_block:
            return []
        return [r for r in reductions if _is_float_sum(r)]

    def _open_row_pass(self, dims: list[LoopDim], reduced: list[int], indent: str,
                       clauses: str | None, blocked: list[_Sum], phase: int) -> str:
        """Open the loops of one pass over the reduced axes (the innermost a simd loop with
        `clauses`, a plain one when None); with blocked sums, the innermost reduced loop runs
        in blocks of `row_block` (or whole, when shorter, a block then being several runs of
        it)."""
        if not blocked:
            return self._open_loops(dims, reduced, indent, clauses, False)
        last, size, block = reduced[-1], dims[reduced[-1]].size, self.blocking.row_block
        if _runs_per_block(size, block) > 1:
            self.lines.append(f"{indent}int64_t run{phase} = 0;")
        indent = self._open_loops(dims, reduced[:-1], indent, None, False)
        start, end = "0", str(size)
        if _in_blocks(size, block):
            self.lines.append(f"{indent}for (int64_t kb = 0; kb < {size}; kb += {block}) {{")
            indent += "  "
            self.lines.append(f"{indent}const int64_t ke = kb + {block} < {size} ? "
                              f"kb + {block} : {size};")
            start, end = "kb", "ke"
        if clauses is not None:
            self.lines.append(f"{indent}#pragma omp simd{clauses}")
        self.lines.append(f"{indent}for (int64_t i{last} = {start}; i{last} < {end}; ++i{last}) {{")
        return indent + "  "

    def _close_row_pass(self, dims: list[LoopDim], reduced: list[int], indent: str,
                        blocked: list[_Sum], phase: int) -> None:
        """Close what `_open_row_pass` opened; each finished block's sums go to their pairwise
        totals, and after the last block the totals become the accumulators."""
        if not blocked:
            self._close_loops(len(reduced), indent)
            return
        indent = self._close_loops(1, indent)
        size, block = dims[reduced[-1]].size, self.blocking.row_block
        runs = _runs_per_block(size, block)
        flush = " ".join(f"gk_pairwise_push(&{b.pairwise}, {b.acc}); {b.acc} = 0;"
                         for b in blocked)
        # A row of run-time length: its last block stays in the accumulator, so a row of one
        # block (up to `row_block`) is summed as a static short row is, with no pairwise total.
        one_block_rows = dyn.is_dynamic(size) and len(reduced) == 1
        if one_block_rows:
            self.lines.append(f"{indent}if (ke < {size}) {{ {flush} }}")
        elif runs > 1:
            self.lines.append(f"{indent}if (++run{phase} == {runs}) {{ {flush} run{phase} = 0; }}")
        else:
            self.lines.append(f"{indent}{flush}")
        if _in_blocks(size, block):
            indent = self._close_loops(1, indent)
        indent = self._close_loops(len(reduced) - 1, indent)
        if runs > 1:
            self.lines.append(f"{indent}{flush}")  # the last, partial block
        for b in blocked:
            total = f"{b.acc} = ({C_COMPUTE[b.dtype]})gk_pairwise_total(&{b.pairwise});"
            if one_block_rows:
                total = f"if ({b.pairwise}.count) {{ gk_pairwise_push(&{b.pairwise}, {b.acc}); " \
                    f"{total} }}"
            self.lines.append(f"{indent}{total}")

    # -- column reductions ------------------------------------------------------------------
    def _emit_column_reduction(self, dims: list[LoopDim], outputs: list[Buffer]) -> None:
        """Reductions over axes that are not innermost (axis 0 of a matrix, the middle axis of
        a 3-d tensor): the innermost kept axis is walked in blocks of `column_block` lanes, each
        lane with its own accumulator, so every load is contiguous and the lanes vectorise."""
        kin = len(dims) - 1
        kout = [i for i, d in enumerate(dims[:-1]) if not d.reduced]
        red = [i for i, d in enumerate(dims) if d.reduced]
        block = dyn.block_size(self.blocking.column_block, dims[kin].size)
        work = math.prod(self.sched.space)
        threads = dyn.runs_threaded(work, self.threshold)
        indent = self._open_loops(dims, kout, "  ", None, parallel=threads and bool(kout))
        if threads and not kout:
            self.lines.append(f"{indent}#pragma omp parallel for schedule(static)"
                              f"{self.parallel_if}")
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
                ct = C_COMPUTE[node.dtype]
                self.lines.append(f"{indent}{ct} ov{self.local[node.uid]}[{block}];")
                body.append(f"ov{self.local[node.uid]}[j] = {self._expr(node, dims, False)};")
                self.var[node.uid] = f"ov{self.local[node.uid]}[j]"
            lanes(body, indent)

        outer_values(0)
        # Full-space results that need no reduction (GeLUGrad's dz beside BiasAddGrad's sum of
        # it) are stored by the first pass, which computes them anyway: an epilogue pass would
        # read the inputs again and recompute them (tanh and all).
        inner_outputs = [b for b in outputs if not self.sched.is_outer(b.value)]
        after = self._reduction_dependent()
        early = [b for b in inner_outputs if b.value.uid not in after]
        for phase, reductions in enumerate(self.sched.phases, start=1):
            init_body = []
            for red_node in reductions:
                ct = C_COMPUTE[red_node.dtype]
                acc = f"acc{self.local[red_node.uid]}"
                self.lines.append(f"{indent}{ct} {acc}[{block}];")
                init_body.append(f"{acc}[j] = {self._reduce_init(red_node)};")
                if self._tracks_nan(red_node):
                    self.lines.append(f"{indent}int nan{self.local[red_node.uid]}[{block}];")
                    init_body.append(f"nan{self.local[red_node.uid]}[j] = 0;")
            rows = math.prod(dims[i].size for i in red)  # dynamic: blocked for any count
            blocked = [r for r in reductions if _is_float_sum(r)] \
                if dyn.is_dynamic(rows) or rows > COLUMN_RUN else []
            for red_node in blocked:
                self.lines.append(f"{indent}double tot{self.local[red_node.uid]}[{block}];")
                init_body.append(f"tot{self.local[red_node.uid]}[j] = 0;")
            lanes(init_body, indent)
            if blocked:
                self.lines.append(f"{indent}int64_t run{phase} = 0;")
            inner_indent = self._open_loops(dims, red, indent, None, False)
            saved = dict(self.var)
            mark = len(self.lines)
            stored = early if phase == 1 else []
            self._compute(self._inner_closure([r.inputs[0] for r in reductions] +
                                              [b.value for b in stored]), dims, True,
                          inner_indent + "  ")
            for buf in stored:
                self._store(buf, dims, True, inner_indent)
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
            if blocked:  # every COLUMN_RUN rows, each lane's float sum joins its double total
                self.lines.append(f"{inner_indent}if (++run{phase} == {COLUMN_RUN}) {{")
                lanes([f"tot{k}[j] += acc{k}[j]; acc{k}[j] = 0;"
                       for k in (self.local[r.uid] for r in blocked)], inner_indent + "  ")
                self.lines.append(f"{inner_indent}  run{phase} = 0;")
                self.lines.append(f"{inner_indent}}}")
            self._close_loops(len(red), inner_indent)
            final_body = [f"acc{k}[j] = ({C_COMPUTE[r.dtype]})(tot{k}[j] + acc{k}[j]);"
                          for r, k in ((r, self.local[r.uid]) for r in blocked)]
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
        inner_outputs = [b for b in inner_outputs if b not in early]
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

    def _reduction_dependent(self) -> set[int]:
        """uids of the group's nodes that read a reduction's result, directly or not."""
        dependent: set[int] = set()
        for node in self.graph.nodes:
            if get_op(node.op).kind == PatternKind.REDUCE or \
                    any(v.uid in dependent for v in node.inputs):
                dependent.add(node.uid)
        return dependent

    def _reduce_init(self, red: Node) -> str:
        return c_identity(_reduction(red), red.dtype)

    @staticmethod
    def _tracks_nan(red: Node) -> bool:
        return _reduction(red).propagates_nan and T.is_float(red.dtype)

    @staticmethod
    def _combine(red: Node, acc: str, v: str) -> str:
        return _c_reduction(red).combine.format(acc=acc, v=v)


@dataclass
class _Sum:
    """A float sum of a row pass that sums in blocks: its accumulator and pairwise total."""

    acc: str
    pairwise: str
    dtype: np.dtype


def _reduction(red: Node) -> Reduction:
    reduction = get_op(red.op).reduction
    assert reduction is not None, f"{red.op} is not a reduction"
    return reduction


def _c_reduction(red: Node) -> CReduction:
    return C_REDUCTIONS[_reduction(red).kind]


def _is_float_sum(red: Node) -> bool:
    return _reduction(red).kind == ReductionKind.SUM and T.is_float(red.dtype)


def _is_float_product(red: Node) -> bool:
    return _reduction(red).kind == ReductionKind.PRODUCT and T.is_float(red.dtype)


def _in_blocks(size: T.Dim, block: int) -> bool:
    """Whether a row pass over `size` elements walks them in blocks of `block`. A row length
    known only at run time always does (a shorter row is one partial block)."""
    return dyn.is_dynamic(size) or size > block


def _runs_per_block(size: T.Dim, block: int) -> int:
    """How many whole runs of a short static row one block sum covers (1: every run or block
    is pushed to the pairwise total)."""
    return 1 if _in_blocks(size, block) else block // size
