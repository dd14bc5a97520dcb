"""MatMul and BatchMatMul steps as BLAS calls from the compiled entry (backends/c/c_entry.py).

A plan whose only non-kernel steps are matrix products still runs as one C call: the entry calls
numpy's own OpenBLAS (backends/c/cblas.py `cblas`) through function pointers handed to the module
once it is loaded (`set_blas`), instead of a Python step per product. Each product is decided
here, at plan time, from the step's static layout: its operands and result as strided matrices
of their slots' dense buffers (the read and write views of folded layout ops,
graph_kernel/library_views.py, as the Python runner makes them), batch axes broadcast by zero
strides, and an N-d operand times a matrix merged into one GEMM over all its rows where the
rows merge in place (as ir/opdefs/matmul.py `matmul_into` does). A product BLAS cannot take as
strided matrices (no unit stride on either axis, a result not row-major), an empty one or another
dtype is None, and the plan keeps the Python runner.

A dynamic size (an ONNX export's batch, `Cell.set_inputs`) is taken on the leading axis of the
operands and the result: the batch axis of a stack of products, or the rows of one GEMM (a batch
of sequences times a weight matrix, merged). Every stride and leading dimension stays a number;
the sizes are C expressions of the symbols the entry hands the product (`symbols`), and such a
product keeps numpy's OpenBLAS (the library choice times static shapes).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from graphkernel.backends.c.c_gemm_packed import (
    PACKED_COPIED_A_LABEL,
    PACKED_PRODUCT_LABEL,
    copies_a,
    emit_packed,
    packed_product,
    packed_source,
)
from graphkernel.backends.c.c_gemm_row import (
    ROW_PRODUCT,
    ROW_PRODUCT_LABEL,
    emit_row_product,
    row_product,
)
from graphkernel.backends.c.c_text import index_kernel_options
from graphkernel.ir.opdefs.matmul import merged_row_stride
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import Dim, SymSize
from graphkernel.runtime.plan import ExecutionPlan, Slot, SlotRole, Step

if TYPE_CHECKING:  # blas_choice imports the tuner: loaded where a product is written
    from graphkernel.backends.c.blas_choice import GemmShape

# Multiply-adds of a batch of small products (each on one BLAS thread) from which the batch is
# split over OpenMP's threads: ~0.1 ms of one core's work, well above waking a sleeping thread.
PARALLEL_BATCH_MIN_MNK = 1 << 22
# A product split over several OpenMP threads is cut into this many chunks per thread (whole
# 16-row panels), handed out as threads come free (`schedule(dynamic, 1)`): a thread that is
# descheduled or slower leaves its second chunk to the others instead of stalling the step. Each
# chunk is one BLAS call that packs B again (1.5-4% more CPU for 2 chunks than 1, 4-9% for 4, in
# BERT-base's products on one AMD EPYC thread), so the count stays small; one thread runs one
# call. 1 is the old one-block-per-thread split.
PRODUCT_CHUNKS_PER_THREAD = 2
# A stack of products with every side at most this and B at most SMALL_PRODUCT_MAX_B elements
# runs on graphkernel's small-product kernel (`SMALL_PRODUCT`), not BLAS: attention's per-head
# scores and context (seq 128, head 64) and their gradients. BLAS packs both operands on every
# call, which at such sizes costs about as much as the multiply-adds: 96 heads of 128x128x64 took
# 5.4-6.1 ms on one AMD EPYC thread in OpenBLAS and MKL alike (33-37 GFLOP/s, against 87 for the
# layer's 1024x768x3072 product), 3.1-4.4 ms on this kernel. 0 turns it off.
SMALL_PRODUCT_MAX_SIDE = 256
SMALL_PRODUCT_MAX_B = 1 << 14  # 64 KiB of float32: B^T is packed on the stack, stays in L2
SMALL_PRODUCT_LABEL = "graphkernel small-product kernel"
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112  # the CBLAS enum values


@dataclass(frozen=True)
class Matrix:
    """One operand or the result of a GEMM call, in elements of its slot's dense buffer."""

    slot: int
    offset: int
    batch_strides: tuple[int, ...]  # one per batch axis of the result (0: broadcast)
    trans: bool  # BLAS reads it transposed (its columns are contiguous)
    ld: int  # leading dimension


@dataclass(frozen=True)
class GemmCall:
    m: Dim  # a dynamic size (SymSize) only here and in `batch`, never in a stride
    n: int
    k: int
    batch: tuple[Dim, ...]  # the result's batch axes (a GEMM per index)
    a: Matrix
    b: Matrix
    c: Matrix
    double: bool
    one_thread: bool  # Step.blas_threads == 1
    # whose cblas_?gemm runs it (blas_choice.py): "openblas", "mkl"; or "graphkernel", the
    # entry's own small-product kernel (`small_product`)
    library: str = "openblas"
    # The WORKSPACE slot holding B packed once for the packed-B kernel (c_gemm_packed.py
    # `prepacked_bytes`), kept between calls while B (a constant or a weight) is unchanged
    prepacked: int | None = None

    @property
    def symbols(self) -> tuple[str, ...]:
        """The dynamic sizes' names its sizes read, sorted (none for a static product)."""
        return tuple(sorted({n for d in (self.m, *self.batch) if isinstance(d, SymSize)
                             for n in d.names}))


def _c(size: Dim) -> str:
    """A size as a C operand: a dynamic one parenthesised (`gk_r % (4*N)`)."""
    return f"({size})" if isinstance(size, SymSize) else str(size)


def _least(size: Dim) -> int:
    """A size's least non-empty value: a dynamic one's factor (each symbol 1)."""
    return size.coef if isinstance(size, SymSize) else size


def _layout(strides: tuple[int, ...], rows: Dim, cols: int) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of a rows x cols matrix with these element strides, as
    BLAS takes it, or None. Dynamic rows are read row-major only: a transposed matrix's leading
    dimension would have to cover them."""
    rs, cs = strides[-2], strides[-1]
    if cs == 1 or cols == 1:
        ld = rs if rows != 1 else cols  # a dynamic row count may be 1: rs still bounds cols
        if ld >= max(1, cols):
            return False, ld
    if isinstance(rows, SymSize):
        return None
    if rs == 1 or rows == 1:
        ld = cs if cols > 1 else rows
        if ld >= max(1, rows):
            return True, ld
    return None


def _batch_strides(shape: tuple[Dim, ...], strides: tuple[int, ...], batch: tuple[Dim, ...]
                   ) -> tuple[int, ...] | None:
    """The strides of a matrix stack's batch axes, right-aligned to the result's batch axes;
    a missing or size-1 axis is broadcast (stride 0). None where a dynamic axis is not the
    result's own (it could be a broadcast 1 at run time)."""
    own = len(shape) - 2
    out = []
    for i in range(len(batch)):
        j = i - (len(batch) - own)
        if j >= 0 and isinstance(shape[j], SymSize) and shape[j] != batch[i]:
            return None
        out.append(strides[j] if j >= 0 and shape[j] != 1 else 0)
    return tuple(out)


def _contiguous(shape: tuple[Dim, ...]) -> tuple[int, ...] | None:
    """Row-major element strides; None where one is dynamic (a dynamic axis not the first)."""
    strides: list[Dim] = []
    acc: Dim = 1
    for dim in reversed(shape):
        strides.append(acc)
        acc = acc * dim
    if any(isinstance(s, SymSize) for s in strides):
        return None
    return tuple(reversed(strides))  # type: ignore[arg-type]  # ints only (checked above)


def _numbers(*values: object) -> bool:
    """Whether offsets and strides are all numbers (a view over a dynamic size may not be)."""
    return all(isinstance(v, int) or isinstance(v, tuple) and _numbers(*v) for v in values)


def gemm_call(plan: ExecutionPlan, step: Step) -> GemmCall | None:
    """The BLAS call of a MatMul/BatchMatMul step, or None when BLAS cannot take it as is."""
    return gemm_call_of(plan.slots, step)


def gemm_call_of(slots: Sequence[Slot], step: Step) -> GemmCall | None:
    """`gemm_call` from the plan's slots (the plan builder asks before the plan is made:
    c_gemm_packed.py `prepacked_bytes`)."""
    if not get_op(step.op).gemm or not step.pooled:
        return None
    dtype = step.out_types[0].dtype
    if dtype not in (np.float32, np.float64):
        return None
    prepacked = step.reads[2] if len(step.reads) > 2 else None  # builder._add_workspaces
    if prepacked is not None and slots[prepacked].role is not SlotRole.WORKSPACE:
        return None
    types = [slots[s].type for s in (*step.reads[:2], *step.writes)]
    if any(t.dtype != dtype for t in types):
        return None
    views = dict(step.attrs.get("read_views", {}))

    def operand(k: int) -> tuple[int, tuple[Dim, ...], tuple[int, ...]] | None:
        slot = step.reads[k]
        if k in views:
            offset, shape, strides = views[k]
        else:
            offset, shape = 0, tuple(slots[slot].type.shape)
            strides = _contiguous(shape)
        if strides is None or not _numbers(offset, tuple(strides)):
            return None
        shape, strides = tuple(shape), tuple(strides)
        if step.attrs.get(("transpose_a", "transpose_b")[k]):
            shape = shape[:-2] + (shape[-1], shape[-2])
            strides = strides[:-2] + (strides[-1], strides[-2])
        return offset, shape, strides

    a_operand, b_operand = operand(0), operand(1)
    if a_operand is None or b_operand is None:
        return None
    (a_off, a_shape, a_strides), (b_off, b_shape, b_strides) = a_operand, b_operand
    (target,) = step.writes
    write_view = step.attrs.get("write_view")
    if write_view is None:
        c_shape = tuple(slots[target].type.shape)
        contiguous = _contiguous(c_shape)
        if contiguous is None:
            return None
        c_strides = contiguous
    else:
        c_shape, c_strides = tuple(write_view[0]), tuple(write_view[1])
        if not _numbers(c_strides):
            return None
    batch, (m, n), k = c_shape[:-2], c_shape[-2:], a_shape[-1]
    # A dynamic size only on the leading axis: the first batch axis, or the rows of one GEMM.
    if not isinstance(n, int) or not isinstance(k, int) or \
            any(isinstance(d, SymSize) for d in batch[1:]) or batch and isinstance(m, SymSize):
        return None
    if 0 in (m, n, k) or 0 in batch:  # a dynamic size is never 0 here (!= any number)
        return None
    a_batch = _batch_strides(a_shape, a_strides, batch)
    b_batch = _batch_strides(b_shape, b_strides, batch)
    if a_batch is None or b_batch is None or isinstance(b_shape[-2], SymSize) or \
            isinstance(a_shape[-2], SymSize) and a_shape[-2] != m:
        return None
    c_batch = c_strides[:-2]
    a_rows, c_rows = a_strides[-2], c_strides[-2]
    if batch and not any(b_batch):  # a stack times one matrix: one GEMM over all rows?
        a_merged = merged_row_stride(batch + (m,), a_batch + (a_rows,), a_rows)
        c_merged = merged_row_stride(batch + (m,), c_batch + (c_rows,), c_rows)
        if a_merged is not None and c_merged is not None:
            m, a_rows, c_rows = m * math.prod(batch), a_merged, c_merged  # type: ignore[operator]  # int or SymSize
            batch, a_batch, b_batch, c_batch = (), (), (), ()
    a_layout = _layout((a_rows, a_strides[-1]), m, k)
    b_layout = _layout(b_strides, k, n)
    c_layout = _layout((c_rows, c_strides[-1]), m, n)
    if a_layout is None or b_layout is None or c_layout is None or c_layout[0]:
        return None
    return GemmCall(m, n, k, batch,
                    Matrix(step.reads[0], a_off, a_batch, *a_layout),
                    Matrix(step.reads[1], b_off, b_batch, *b_layout),
                    Matrix(target, 0, tuple(c_batch), *c_layout),
                    dtype == np.float64, step.blas_threads == 1, prepacked=prepacked)


# The entry's BLAS: function pointers set once the module is loaded (`set_blas`). BLASINT is
# the library's integer (int64_t for numpy's ILP64 OpenBLAS).
PRELUDE = """typedef BLASINT gk_blasint;
typedef void (*gk_sgemm_t)(int, int, int, BLASINT, BLASINT, BLASINT, float,
  const float *, BLASINT, const float *, BLASINT, float, float *, BLASINT);
typedef void (*gk_dgemm_t)(int, int, int, BLASINT, BLASINT, BLASINT, double,
  const double *, BLASINT, const double *, BLASINT, double, double *, BLASINT);
static gk_sgemm_t gk_sgemm = NULL;
static gk_dgemm_t gk_dgemm = NULL;
static int (*gk_blas_get_threads)(void) = NULL;
static void (*gk_blas_set_threads)(int) = NULL;
/* MKL's, where products were chosen for it (backends/c/blas_choice.py): its LP64 interface on
   its sequential layer. */
typedef void (*gk_mkl_sgemm_t)(int, int, int, int, int, int, float, const float *, int,
  const float *, int, float, float *, int);
typedef void (*gk_mkl_dgemm_t)(int, int, int, int, int, int, double, const double *, int,
  const double *, int, double, double *, int);
static gk_mkl_sgemm_t gk_mkl_sgemm = NULL;
static gk_mkl_dgemm_t gk_mkl_dgemm = NULL;
#if defined(_OPENMP)
int omp_get_num_threads(void);
int omp_get_thread_num(void);
#endif

/* set_blas(sgemm, dgemm, get_threads, set_threads, mkl_sgemm, mkl_dgemm): numpy's OpenBLAS
   functions by address (backends/c/cblas.py `cblas`), then MKL's (0 where it is not installed:
   a product chosen for MKL then returns NotImplemented, as everything does until set_blas). */
static PyObject *gk_set_blas(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "set_blas takes six function addresses");
    return NULL;
  }
  void *p[6];
  for (int i = 0; i < 6; ++i) {
    p[i] = PyLong_AsVoidPtr(args[i]);
    if (p[i] == NULL && PyErr_Occurred()) return NULL;
    if (p[i] == NULL && i < 4) {
      PyErr_SetString(PyExc_ValueError, "set_blas: a NULL address");
      return NULL;
    }
  }
  gk_sgemm = (gk_sgemm_t)p[0];
  gk_dgemm = (gk_dgemm_t)p[1];
  gk_blas_get_threads = (int (*)(void))p[2];
  gk_blas_set_threads = (void (*)(int))p[3];
  gk_mkl_sgemm = (gk_mkl_sgemm_t)p[4];
  gk_mkl_dgemm = (gk_mkl_dgemm_t)p[5];
  Py_RETURN_NONE;
}
"""


# graphkernel's small-product kernel: C = A B for row-major C, A and B either way round (as the
# CBLAS flags say), float32, alpha 1, beta 0. Eight rows of A by two 16-float vectors of B's row
# accumulate in registers over k: A is read as broadcast scalars in place, B's rows in place, or
# packed once per call when B is transposed (its columns contiguous). Compiled at -O3 with
# contracted multiply-adds like BLAS's kernels, inside the entry's -Og glue (library.py).
SMALL_PRODUCT = """GK_INDEX_OPTIONS
typedef float gk_v16 __attribute__((vector_size(64)));
static inline __attribute__((always_inline)) void gk_small_tile(
    const int rows, const int vecs, const float *a, int64_t ra, int64_t da, const float *b,
    int64_t ldb, float *c, int64_t ldc, int64_t k) {
  gk_v16 acc[8][2];
  for (int r = 0; r < rows; ++r)
    for (int v = 0; v < vecs; ++v) acc[r][v] = (gk_v16){0};
  for (int64_t d = 0; d < k; ++d) {
    gk_v16 row[2];
    for (int v = 0; v < vecs; ++v) memcpy(&row[v], b + d * ldb + 16 * v, sizeof(gk_v16));
    for (int r = 0; r < rows; ++r) {
      const float x = a[r * ra + d * da];
      for (int v = 0; v < vecs; ++v) acc[r][v] += x * row[v];
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int v = 0; v < vecs; ++v) memcpy(c + r * ldc + 16 * v, &acc[r][v], sizeof(gk_v16));
}

static void gk_small_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A,
                           int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc) {
  float packed[tb ? k * n : 1];  /* k * n <= SMALL_MAX_B (c_gemm.py `small_product`) */
  if (tb) {
    /* Row by row of the packed copy: its writes run in order (B's k x n block, read across,
       stays in L1); column by column, each write of a row of 64 touched its own cache line
       (96 heads' 128x64 packs took 1.7x as long, a fifth of the scores product's time). */
    for (int64_t d = 0; d < k; ++d)
      for (int64_t j = 0; j < n; ++j) packed[d * n + j] = B[j * ldb + d];
    B = packed;
    ldb = n;
  }
  const int64_t ra = ta ? 1 : lda, da = ta ? lda : 1;  /* A(i, d) = A[i * ra + d * da] */
  const int64_t n32 = n / 32 * 32, n16 = n / 16 * 16;
  int64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    for (int64_t j = 0; j < n32; j += 32)
      gk_small_tile(8, 2, A + i * ra, ra, da, B + j, ldb, C + i * ldc + j, ldc, k);
    if (n16 > n32)
      gk_small_tile(8, 1, A + i * ra, ra, da, B + n32, ldb, C + i * ldc + n32, ldc, k);
  }
  for (; i < m; ++i) {
    for (int64_t j = 0; j < n32; j += 32)
      gk_small_tile(1, 2, A + i * ra, ra, da, B + j, ldb, C + i * ldc + j, ldc, k);
    if (n16 > n32)
      gk_small_tile(1, 1, A + i * ra, ra, da, B + n32, ldb, C + i * ldc + n32, ldc, k);
  }
  for (int64_t r = 0; r < m; ++r)  /* columns past the last whole vector */
    for (int64_t j = n16; j < n; ++j) {
      float sum = 0;
      for (int64_t d = 0; d < k; ++d) sum += A[r * ra + d * da] * B[d * ldb + j];
      C[r * ldc + j] = sum;
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
""".replace("SMALL_MAX_B", str(SMALL_PRODUCT_MAX_B))


def prelude(int64: bool, small_products: bool = False) -> list[str]:
    """The entry's BLAS declarations; with graphkernel's own product kernels where some
    product runs on one (library "graphkernel": `small_product`, c_gemm_packed.py)."""
    text = PRELUDE.replace("BLASINT", "int64_t" if int64 else "int")
    own = ("\n#include <string.h>\n" + SMALL_PRODUCT + packed_source() + ROW_PRODUCT).replace(
        "GK_INDEX_OPTIONS", "\n".join(index_kernel_options("O3", "fp-contract=fast")))
    return (text + (own if small_products else "")).split("\n")


def small_product(call: GemmCall) -> bool:
    """Whether a product runs on graphkernel's small-product kernel rather than BLAS: a float32
    stack of products of static sizes, each side at most SMALL_PRODUCT_MAX_SIDE, B at most
    SMALL_PRODUCT_MAX_B elements, and a row of the result at least one 16-float vector."""
    sides = (call.m, call.n, call.k)
    return bool(call.batch) and not call.double and not call.symbols and \
        all(isinstance(d, int) and d <= SMALL_PRODUCT_MAX_SIDE for d in sides) and \
        call.n >= 16 and call.k * call.n <= SMALL_PRODUCT_MAX_B


def _batch_indices(call: GemmCall, indent: str) -> list[str]:
    """C lines turning the flat batch index gk_b into one index per batch axis."""
    lines = [f"{indent}int64_t gk_r = gk_b;"]
    for axis in reversed(range(len(call.batch))):
        size = _c(call.batch[axis])
        rest = f"gk_r % {size}; gk_r /= {size};" if axis else "gk_r;"
        lines.append(f"{indent}const int64_t gk_i{axis} = {rest}")
    return lines


def parallel_batch(call: GemmCall) -> bool:
    """Many small products (attention's heads) worth running on several threads at once."""
    return bool(call.batch) and call.one_thread and math.prod(map(_least, call.batch)) * \
        _least(call.m) * call.n * call.k >= PARALLEL_BATCH_MIN_MNK


def _split_rows(call: GemmCall) -> bool:
    """Whether a product split over threads splits its rows (m) rather than its columns (n):
    the longer side, so each thread's part stays a well-shaped GEMM (dynamic rows: a batch of
    rows, the rows)."""
    return isinstance(call.m, SymSize) or call.m >= call.n


def emit_gemm(call: GemmCall, data: dict[int, str]) -> list[str]:
    """The C lines of one product inside the entry's `gk_run`; `data` gives each slot's
    pointer expression.

    Every product runs BLAS on one thread, on its caller; the threads are OpenMP's, the pool
    the kernels run on. A product not held to one thread (`GemmCall.one_thread`) is split
    into PRODUCT_CHUNKS_PER_THREAD chunks of rows (or columns) per OpenMP thread, handed out
    as threads come free; a batch of small ones (`parallel_batch`) into whole products,
    likewise. BLAS's own thread pool stays asleep: with two pools on two cores, OpenBLAS's
    idle workers spin (its exec_blas and the workers' wait loop) while the other pool's
    threads want the cores, and a loaded machine deschedules the worker the caller then
    spins on (docs/perf-notes.md, "One thread pool")."""
    if call.library == "graphkernel" and row_product(call):  # c_gemm_row.py
        return emit_row_product(
            call, f"((const float *){data[call.a.slot]} + {call.a.offset})",
            f"((const float *){data[call.b.slot]} + {call.b.offset})",
            f"((float *){data[call.c.slot]} + {call.c.offset})")
    if call.library == "graphkernel" and not small_product(call):  # c_gemm_packed.py
        import dataclasses
        blas = ["  " + line for line in emit_gemm(dataclasses.replace(call, library="openblas"),
                                                   data)]
        return ["  {",
                f"    const float *gk_A = (const float *){data[call.a.slot]} + {call.a.offset};",
                f"    const float *gk_B = (const float *){data[call.b.slot]} + {call.b.offset};",
                f"    float *gk_C = (float *){data[call.c.slot]} + {call.c.offset};",
                *emit_packed(call, "gk_A", "gk_B", "gk_C", _c(call.m), blas,
                             None if call.prepacked is None else data[call.prepacked]), "  }"]
    ctype, fn = ("double", "gk_dgemm") if call.double else ("float", "gk_sgemm")
    if call.library == "mkl":  # sequential: no threads of its own to hold
        fn = fn.replace("gk_", "gk_mkl_")
    lines = ["  {"]
    for name, mat, const in (("A", call.a, "const "), ("B", call.b, "const "),
                             ("C", call.c, "")):
        lines.append(f"    {const}{ctype} *gk_{name} = ({const}{ctype} *){data[mat.slot]} + "
                     f"{mat.offset};")
    offsets = {"A": [], "B": [], "C": []}  # type: dict[str, list[str]]
    for axis in range(len(call.batch)):
        for name, mat in (("A", call.a), ("B", call.b), ("C", call.c)):
            if mat.batch_strides[axis]:
                offsets[name].append(f" + gk_i{axis} * {mat.batch_strides[axis]}")
    a, b, c = ("gk_" + name + "".join(offsets[name]) for name in "ABC")
    trans = {False: _NO_TRANS, True: _TRANS}
    total = _c(math.prod(call.batch))
    split = not call.one_thread
    # OpenBLAS on one thread for the product, put back after it (MKL is sequential). Without
    # OpenMP a product not held to one thread keeps OpenBLAS's own threads: nothing else would
    # run it in parallel.
    hold = call.library == "openblas"
    if hold and split:
        lines.append("#if defined(_OPENMP)")
    if hold:
        lines += ["    int gk_threads = gk_blas_get_threads();",
                  "    if (gk_threads != 1) gk_blas_set_threads(1);"]
    if hold and split:
        lines.append("#endif")
    m, n = _c(call.m), str(call.n)
    if split:
        # Each thread's block: rows of A and C (columns of B and C), starting at gk_lo.
        if _split_rows(call):
            a += " + gk_lo" + ("" if call.a.trans else f" * {call.a.ld}")
            c += f" + gk_lo * {call.c.ld}"
            m = "gk_hi - gk_lo"
        else:
            b += " + gk_lo" + (f" * {call.b.ld}" if call.b.trans else "")
            c += " + gk_lo"
            n = "gk_hi - gk_lo"
    if call.library == "graphkernel":
        gemm = (f"gk_small_sgemm({int(call.a.trans)}, {int(call.b.trans)}, {m}, {n}, {call.k}, "
                f"{a}, {call.a.ld}, {b}, {call.b.ld}, {c}, {call.c.ld});")
    else:
        gemm = (f"{fn}({_ROW_MAJOR}, {trans[call.a.trans]}, {trans[call.b.trans]}, {m}, "
                f"{n}, {call.k}, 1, {a}, {call.a.ld}, {b}, {call.b.ld}, 0, {c}, {call.c.ld});")
    if parallel_batch(call):
        # Whole products handed out one at a time: a late thread leaves its share to the others
        # (each product is the same call either way, so results do not change).
        lines += ["    #pragma omp parallel for schedule(dynamic, 1)",
                  f"    for (int64_t gk_b = 0; gk_b < {total}; ++gk_b) {{",
                  *_batch_indices(call, "      "),
                  f"      {gemm}", "    }"]
    else:
        indent = "    "
        if split:
            side = _c(call.m) if _split_rows(call) else str(call.n)
            # Chunks of whole 16-row (column) panels (BLAS's kernels work in such panels),
            # PRODUCT_CHUNKS_PER_THREAD per thread, handed out one at a time.
            lines += ["    #pragma omp parallel",
                      "    {",
                      "#if defined(_OPENMP)",
                      "      const int64_t gk_parts = omp_get_num_threads();",
                      "#else",
                      "      const int64_t gk_parts = 1;",
                      "#endif",
                      "      const int64_t gk_chunks = gk_parts > 1 ? "
                      f"gk_parts * {PRODUCT_CHUNKS_PER_THREAD} : 1;",
                      f"      const int64_t gk_each = (({side} + gk_chunks - 1) / gk_chunks + 15) "
                      "/ 16 * 16;",
                      "      #pragma omp for schedule(dynamic, 1)",
                      "      for (int64_t gk_chunk = 0; gk_chunk < gk_chunks; ++gk_chunk) {",
                      f"        const int64_t gk_lo = gk_chunk * gk_each < {side} ? "
                      f"gk_chunk * gk_each : {side};",
                      f"        const int64_t gk_hi = gk_lo + gk_each < {side} ? "
                      f"gk_lo + gk_each : {side};"]
            indent = "        "
        for axis, size in enumerate(call.batch):
            lines.append(f"{indent}for (int64_t gk_i{axis} = 0; gk_i{axis} < {_c(size)}; "
                         f"++gk_i{axis}) {{")
            indent += "  "
        lines.append(indent + (f"if (gk_hi > gk_lo) {gemm}" if split else gemm))
        for _ in call.batch:
            indent = indent[:-2]
            lines.append(f"{indent}}}")
        if split:
            lines += ["      }", "    }"]
    if hold and split:
        lines.append("#if defined(_OPENMP)")
    if hold:
        lines.append("    if (gk_threads != 1) gk_blas_set_threads(gk_threads);")
    if hold and split:
        lines.append("#endif")
    lines.append("  }")
    return lines


def thread_shape(call: GemmCall, threads: int) -> tuple[int, int, int]:
    """(m, n, k) of one BLAS call of the product: a chunk of a split product (as `emit_gemm`
    cuts it for `threads` OpenMP threads), the whole of a product held to one thread."""
    assert not call.symbols, "a product of static sizes"
    m = int(call.m)  # type: ignore[arg-type]  # static (asserted)
    if call.one_thread or threads <= 1:
        return m, call.n, call.k
    side = m if _split_rows(call) else call.n
    chunks = threads * PRODUCT_CHUNKS_PER_THREAD
    each = min(side, (-(-side // chunks) + 15) // 16 * 16)
    return (each, call.n, call.k) if _split_rows(call) else (m, each, call.k)


def with_library(call: GemmCall, step: Step) -> GemmCall:
    """The call on the library chosen for its shape (backends/c/blas_choice.py: numpy's OpenBLAS
    unless MKL is installed and was timed faster for the shape here by the tuner). The choice
    is written into the step's attrs as `gemm_library` (ExecutionPlan.describe shows it)."""
    import dataclasses

    from graphkernel.backends.c import blas_choice
    if row_product(call):  # one row: the work is reading W (c_gemm_row.py)
        step.attrs["gemm_library"] = ROW_PRODUCT_LABEL
        return dataclasses.replace(call, library="graphkernel")
    if small_product(call):  # no library's call packs such sizes fast (SMALL_PRODUCT_MAX_SIDE)
        step.attrs["gemm_library"] = SMALL_PRODUCT_LABEL
        return dataclasses.replace(call, library="graphkernel")
    if packed_product(call):  # packs B once for all its threads (c_gemm_packed.py)
        step.attrs["gemm_library"] = PACKED_COPIED_A_LABEL if copies_a(call) else \
            PACKED_PRODUCT_LABEL
        return dataclasses.replace(call, library="graphkernel")
    shape = library_shape(call)
    if shape is None:  # its shape is known per call only: numpy's OpenBLAS, as without MKL
        return call
    # OpenBLAS is the default; only without it is MKL loaded to find the libraries here
    libs = None if blas_choice.openblas_library() is not None else blas_choice.libraries()
    if libs == []:
        return call
    choice = blas_choice.choose(shape, libs)
    step.attrs["gemm_library"] = choice.library.label
    return dataclasses.replace(call, library=choice.library.name)


def library_shape(call: GemmCall) -> GemmShape | None:
    """One OpenMP thread's product of the call, as a library runs it (the shape its library is
    chosen for); None for a product BLAS does not run (a small one, our own kernel's) or one
    whose shape is known per call only."""
    from graphkernel.backends.c.blas_choice import GemmShape, openmp_threads
    if small_product(call) or packed_product(call) or row_product(call) or call.symbols:
        return None
    m, n, k = thread_shape(call, openmp_threads())
    return GemmShape(call.double, m, n, k, call.a.trans, call.b.trans)
