"""MatMul and BatchMatMul steps as BLAS calls from the compiled entry (backends/c/c_entry.py).

A plan whose only non-kernel steps are matrix products still runs as one C call: the entry calls
numpy's own OpenBLAS (backends/c/cblas.py `cblas`) through function pointers handed to the module
once it is loaded (`set_blas`), instead of a Python step per product. Each product is decided
here, at plan time, from the step's static layout: its operands and result as strided matrices
of their slots' dense buffers (the read and write views of folded layout ops,
graph_kernel/library_views.py, as the Python runner makes them), batch axes broadcast by zero
strides, and an N-d operand times a matrix merged into one GEMM over all its rows where the
rows merge in place (as ir/opdefs/matmul.py `matmul_into` does). A product BLAS cannot take as
strided matrices (no unit stride on either axis, a result not row-major), an empty one, another
dtype or a dynamic size is None, and the plan keeps the Python runner.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphkernel.ir.opdefs.matmul import merged_row_stride
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import is_static
from graphkernel.runtime.plan import ExecutionPlan, Step

# Multiply-adds of a batch of small products (each on one BLAS thread) from which the batch runs
# on several threads (BLAS's batch GEMM, or split over OpenMP's): ~0.1 ms of one core's work,
# well above waking a sleeping thread.
PARALLEL_BATCH_MIN_MNK = 1 << 22
# OpenBLAS's batch GEMM sends products of at most 100^3 multiply-adds to its small-matrix
# kernels through a table that holds offsets, not addresses, in DYNAMIC_ARCH builds (numpy's
# wheels): those calls crash (0.3.31: 32 of 64x64x40 segfault). Larger products take its
# ordinary kernels; smaller batches keep the OpenMP split below.
BATCH_MIN_MNK = 100 ** 3 + 1
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
    m: int
    n: int
    k: int
    batch: tuple[int, ...]  # the result's batch axes (a GEMM per index)
    a: Matrix
    b: Matrix
    c: Matrix
    double: bool
    one_thread: bool  # Step.blas_threads == 1


def _layout(strides: tuple[int, ...], rows: int, cols: int) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of a rows x cols matrix with these element strides, as
    BLAS takes it, or None."""
    rs, cs = strides[-2], strides[-1]
    if cs == 1 or cols == 1:
        ld = rs if rows > 1 else cols
        if ld >= max(1, cols):
            return False, ld
    if rs == 1 or rows == 1:
        ld = cs if cols > 1 else rows
        if ld >= max(1, rows):
            return True, ld
    return None


def _batch_strides(shape: tuple[int, ...], strides: tuple[int, ...], batch: tuple[int, ...]
                   ) -> tuple[int, ...]:
    """The strides of a matrix stack's batch axes, right-aligned to the result's batch axes;
    a missing or size-1 axis is broadcast (stride 0)."""
    own = len(shape) - 2
    out = []
    for i in range(len(batch)):
        j = i - (len(batch) - own)
        out.append(strides[j] if j >= 0 and shape[j] != 1 else 0)
    return tuple(out)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for dim in reversed(shape):
        strides.append(acc)
        acc *= dim
    return tuple(reversed(strides))


def gemm_call(plan: ExecutionPlan, step: Step) -> GemmCall | None:
    """The BLAS call of a MatMul/BatchMatMul step, or None when BLAS cannot take it as is."""
    if not get_op(step.op).gemm or not step.pooled:
        return None
    dtype = step.out_types[0].dtype
    if dtype not in (np.float32, np.float64):
        return None
    types = [plan.slots[s].type for s in (*step.reads, *step.writes)]
    if not all(is_static(t.shape) for t in types) or any(t.dtype != dtype for t in types):
        return None
    views = dict(step.attrs.get("read_views", {}))

    def operand(k: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        slot = step.reads[k]
        if k in views:
            offset, shape, strides = views[k]
        else:
            offset, shape = 0, tuple(plan.slots[slot].type.shape)
            strides = _contiguous(shape)
        shape, strides = tuple(shape), tuple(strides)
        if step.attrs.get(("transpose_a", "transpose_b")[k]):
            shape = shape[:-2] + (shape[-1], shape[-2])
            strides = strides[:-2] + (strides[-1], strides[-2])
        return offset, shape, strides

    (a_off, a_shape, a_strides), (b_off, b_shape, b_strides) = operand(0), operand(1)
    (target,) = step.writes
    write_view = step.attrs.get("write_view")
    if write_view is None:
        c_shape = tuple(plan.slots[target].type.shape)
        c_strides = _contiguous(c_shape)
    else:
        c_shape, c_strides = tuple(write_view[0]), tuple(write_view[1])
    batch, (m, n), k = c_shape[:-2], c_shape[-2:], a_shape[-1]
    if 0 in (m, n, k) or 0 in batch:
        return None
    a_batch = _batch_strides(a_shape, a_strides, batch)
    b_batch = _batch_strides(b_shape, b_strides, batch)
    c_batch = c_strides[:-2]
    a_rows, c_rows = a_strides[-2], c_strides[-2]
    if batch and not any(b_batch):  # a stack times one matrix: one GEMM over all rows?
        a_merged = merged_row_stride(batch + (m,), a_batch + (a_rows,), a_rows)
        c_merged = merged_row_stride(batch + (m,), c_batch + (c_rows,), c_rows)
        if a_merged is not None and c_merged is not None:
            m, a_rows, c_rows = m * math.prod(batch), a_merged, c_merged
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
                    dtype == np.float64, step.blas_threads == 1)


# The entry's BLAS: function pointers set once the module is loaded (`set_blas`). BLASINT is
# the library's integer (int64_t for numpy's ILP64 OpenBLAS).
PRELUDE = """typedef BLASINT gk_blasint;
typedef void (*gk_sgemm_t)(int, int, int, BLASINT, BLASINT, BLASINT, float,
  const float *, BLASINT, const float *, BLASINT, float, float *, BLASINT);
typedef void (*gk_dgemm_t)(int, int, int, BLASINT, BLASINT, BLASINT, double,
  const double *, BLASINT, const double *, BLASINT, double, double *, BLASINT);
typedef void (*gk_sgemm_batch_t)(int, const int *, const int *, const BLASINT *,
  const BLASINT *, const BLASINT *, const float *, const float **, const BLASINT *,
  const float **, const BLASINT *, const float *, float **, const BLASINT *, BLASINT,
  const BLASINT *);
typedef void (*gk_dgemm_batch_t)(int, const int *, const int *, const BLASINT *,
  const BLASINT *, const BLASINT *, const double *, const double **, const BLASINT *,
  const double **, const BLASINT *, const double *, double **, const BLASINT *, BLASINT,
  const BLASINT *);
static gk_sgemm_t gk_sgemm = NULL;
static gk_dgemm_t gk_dgemm = NULL;
static int (*gk_blas_get_threads)(void) = NULL;
static void (*gk_blas_set_threads)(int) = NULL;
static gk_sgemm_batch_t gk_sgemm_batch = NULL;
static gk_dgemm_batch_t gk_dgemm_batch = NULL;

/* set_blas(sgemm, dgemm, get_threads, set_threads, sgemm_batch, dgemm_batch): numpy's
   OpenBLAS functions by address (backends/c/cblas.py `cblas`; the batch functions 0 where it has
   none, and then no product calls them); until then `run` returns NotImplemented. */
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
  gk_sgemm_batch = (gk_sgemm_batch_t)p[4];
  gk_dgemm_batch = (gk_dgemm_batch_t)p[5];
  Py_RETURN_NONE;
}
"""


def prelude(int64: bool) -> list[str]:
    return PRELUDE.replace("BLASINT", "int64_t" if int64 else "int").split("\n")


def _batch_indices(call: GemmCall, indent: str) -> list[str]:
    """C lines turning the flat batch index gk_b into one index per batch axis."""
    lines = [f"{indent}int64_t gk_r = gk_b;"]
    for axis in reversed(range(len(call.batch))):
        size = call.batch[axis]
        rest = f"gk_r % {size}; gk_r /= {size};" if axis else "gk_r;"
        lines.append(f"{indent}const int64_t gk_i{axis} = {rest}")
    return lines


def parallel_batch(call: GemmCall) -> bool:
    """Many small products (attention's heads) worth running on several threads at once."""
    return bool(call.batch) and call.one_thread and \
        math.prod(call.batch) * call.m * call.n * call.k >= PARALLEL_BATCH_MIN_MNK


def emit_gemm(call: GemmCall, data: dict[int, str], batch_api: bool = False) -> list[str]:
    """The C lines of one product inside the entry's `gk_run`; `data` gives each slot's
    pointer expression; `batch_api`: BLAS has cblas_?gemm_batch (set_blas)."""
    ctype, fn = ("double", "gk_dgemm") if call.double else ("float", "gk_sgemm")
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
    total = math.prod(call.batch)
    if parallel_batch(call) and batch_api and call.m * call.n * call.k >= BATCH_MIN_MNK:
        # Small products, many of them (attention's heads): one call of BLAS's batch GEMM,
        # which runs whole products on its threads at once. The same products as one-thread
        # calls split over OpenMP's threads ran no faster than one after the other (OpenBLAS
        # ran them in turn: 32 of 128x128x64 took 560 us split, 596 us in turn, 320 us as a
        # batch, bit-identical).
        lines += [f"    {ctype} **gk_ptrs = malloc(sizeof({ctype} *) * 3 * {total});",
                  "    if (gk_ptrs == NULL) { PyErr_NoMemory(); goto fail; }",
                  f"    for (int64_t gk_b = 0; gk_b < {total}; ++gk_b) {{",
                  *_batch_indices(call, "      "),
                  f"      gk_ptrs[gk_b] = ({ctype} *)({a});",
                  f"      gk_ptrs[{total} + gk_b] = ({ctype} *)({b});",
                  f"      gk_ptrs[{2 * total} + gk_b] = {c};",
                  "    }",
                  f"    const int gk_ta = {trans[call.a.trans]}, gk_tb = {trans[call.b.trans]};",
                  f"    const gk_blasint gk_m = {call.m}, gk_n = {call.n}, gk_k = {call.k};",
                  f"    const gk_blasint gk_lda = {call.a.ld}, gk_ldb = {call.b.ld}, "
                  f"gk_ldc = {call.c.ld}, gk_size = {total};",
                  f"    const {ctype} gk_one = 1, gk_zero = 0;",
                  f"    {fn}_batch({_ROW_MAJOR}, &gk_ta, &gk_tb, &gk_m, &gk_n, &gk_k, &gk_one, "
                  f"(const {ctype} **)gk_ptrs, &gk_lda, (const {ctype} **)gk_ptrs + {total}, "
                  f"&gk_ldb, &gk_zero, gk_ptrs + {2 * total}, &gk_ldc, 1, &gk_size);",
                  "    free(gk_ptrs);",
                  "  }"]
        return lines
    if call.one_thread:  # a small product: BLAS on one thread, put back after it
        lines += ["    int gk_threads = gk_blas_get_threads();",
                  "    if (gk_threads != 1) gk_blas_set_threads(1);"]
    gemm = (f"{fn}({_ROW_MAJOR}, {trans[call.a.trans]}, {trans[call.b.trans]}, {call.m}, "
            f"{call.n}, {call.k}, 1, {a}, {call.a.ld}, {b}, {call.b.ld}, 0, {c}, {call.c.ld});")
    if parallel_batch(call):
        # Without a batch GEMM: one BLAS thread each, the batch split over OpenMP's threads
        # (BLAS on one thread runs on its caller).
        lines += ["    #pragma omp parallel for schedule(static)",
                  f"    for (int64_t gk_b = 0; gk_b < {total}; ++gk_b) {{",
                  *_batch_indices(call, "      "),
                  f"      {gemm}", "    }"]
    else:
        indent = "    "
        for axis, size in enumerate(call.batch):
            lines.append(f"{indent}for (int64_t gk_i{axis} = 0; gk_i{axis} < {size}; "
                         f"++gk_i{axis}) {{")
            indent += "  "
        lines.append(indent + gemm)
        for _ in call.batch:
            indent = indent[:-2]
            lines.append(f"{indent}}}")
    if call.one_thread:
        lines.append("    if (gk_threads != 1) gk_blas_set_threads(gk_threads);")
    lines.append("  }")
    return lines
