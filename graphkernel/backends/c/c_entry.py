"""The plan's C runner: one CPython entry point per compiled graph.

When every step of a plan is a generated kernel, the graph's translation unit also becomes a
CPython extension module whose `run(*arrays)` checks its inputs, takes result buffers from its
pool, and calls the kernels in order: one call from Python per graph, ~1 us instead of a Python
loop over ctypes calls. Any argument it does not accept as is (another dtype or shape, a
non-contiguous array) makes it return NotImplemented, and the Python runner takes over with its
conversions and clear errors.

It follows the plan's memory decisions exactly as the Python runner does: a result takes the
buffer id the plan gave it; a pooled array is reused only when the pool holds its only reference
(the caller dropped it, and no view of it lives), so a caller never sees two results share
memory; a value the plan releases is dropped right after its last reader when a later step
takes the same buffer.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from graphkernel.backends.c import cblas as numpys_blas
from graphkernel.backends.c.c_entry_text import (
    CALL_SOURCE,
    POOL_DEPTH,
    PROFILE_METHOD,
    PROFILE_SOURCE,
    SEED_SOURCE,
)
from graphkernel.backends.c.c_entry_threads import (  # noqa: F401  # two names tests import here
    AWAKE_BEGIN,
    AWAKE_END,
    AWAKE_LOCAL,
    AWAKE_TIMED,
    PASSIVE_CALLS_AFTER_PREEMPTION,
    THREADS_STATS_METHOD,
    awake_between_kernels,
    awake_definitions,
    entry_step_kinds,
)
from graphkernel.backends.c.c_gather import GatherCall, emit_check, emit_gather, gather_call
from graphkernel.backends.c.c_gemm import GemmCall, emit_gemm, gemm_call, prelude, with_library
from graphkernel.backends.c.c_range import RangeCall, emit_range, range_call
from graphkernel.backends.c.cblas import CBlas
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import SymSize, TensorType
from graphkernel.runtime.memory import VECTOR_ALIGNMENT
from graphkernel.runtime.plan import ExecutionPlan, Step, StepKind, entry_arguments


def entry_source(plan: ExecutionPlan) -> Callable[[str], str] | None:
    """The entry module's C, given its module name; None when some step is neither a kernel
    nor a product BLAS takes as is (backends/c/c_gemm.py), or a result would alias an argument
    (the Python runner handles those)."""
    if not entry_step_kinds(plan):
        return None
    calls = {i: gemm_call(plan, step) or gather_call(plan, step) or range_call(plan, step) or
             reshape_view(plan, step)
             for i, step in enumerate(plan.steps)
             if step.kind in (StepKind.LIBRARY, StepKind.VIEW)}
    if any(call is None for call in calls.values()):
        return None
    gemms = any(isinstance(call, GemmCall) for call in calls.values())
    # looked up on the module: the one answer the plan key (backends/c/backend.py) reads too
    blas = numpys_blas.cblas() if gemms else None
    if gemms and blas is None:
        return None
    for i, call in calls.items():  # each product's library, by measurement where MKL is here
        if isinstance(call, GemmCall):
            calls[i] = with_library(call, plan.steps[i])
    return lambda module: _emit(plan, module, calls, blas)  # type: ignore[arg-type]  # no None left in `calls` (checked above)


@dataclass(frozen=True)
class ReshapeView:
    """A VIEW step the entry makes itself: a reshaped view of an argument or a result."""

    source: int
    target: int


def reshape_view(plan: ExecutionPlan, step: Step) -> ReshapeView | None:
    """The entry's view for a reshape (an input flattened for a Dense, a network's last
    Reshape), or None (another shape op: the Python runner's numpy views). The entry takes
    C-contiguous arguments and its own results are, so the view shares their memory."""
    if step.kind is not StepKind.VIEW or not get_op(step.op).view or \
            len(step.reads) != 1 or len(step.writes) != 1:
        return None
    (source,), (target,) = step.reads, step.writes
    if plan.slots[source].type.dtype != plan.slots[target].type.dtype:
        return None
    if any(v == source for st in plan.steps for v, _ in st.in_place):
        return None  # written into a weight's own array: no array of the entry's to reshape
    return ReshapeView(source, target)


def _emit(plan: ExecutionPlan, module: str,
          calls: dict[int, GemmCall | GatherCall | RangeCall | ReshapeView],
          blas: CBlas | None) -> str:
    args = entry_arguments(plan)
    nargs = len(args)
    vid = {s: i for i, s in enumerate(args)}  # the entry numbers values: arguments first
    produced = [s for step in plan.steps for s in step.writes]
    for s in produced:
        vid[s] = len(vid)
    nbuffers = max(len(plan.buffers), 1)
    lines = [
        "#define PY_SSIZE_T_CLEAN",
        "#include <Python.h>",
        "#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION",
        "#include <numpy/arrayobject.h>",
        "",
        f"static PyObject *gk_pool[{nbuffers}][{POOL_DEPTH}];",
        "",
        *_EMPTY_ALIGNED,
        "static PyArrayObject *gk_take(int slot, int nd, const npy_intp *dims, int type) {",
        f"  for (int k = 0; k < {POOL_DEPTH}; ++k) {{",
        "    PyObject *p = gk_pool[slot][k];",
        *(_TAKE_SHAPED if plan.symbols else _TAKE_STATIC),
        "  }",
        "  PyObject *p = gk_empty_aligned(nd, dims, type);",
        "  if (p == NULL) return NULL;",
        f"  for (int k = 0; k < {POOL_DEPTH}; ++k) {{",
        "    if (gk_pool[slot][k] == NULL) { Py_INCREF(p); gk_pool[slot][k] = p; break; }",
        "  }",
        "  return (PyArrayObject *)p;",
        "}",
        "",
        *(_ACCEPT_ANY if plan.symbols else []),
        *(_OVERLAP if plan.written_weights and plan.inputs else []),
        "static int gk_accept(PyObject *o, int type, int nd, const npy_intp *dims) {",
        "  if (!PyArray_Check(o)) return 0;",
        "  PyArrayObject *a = (PyArrayObject *)o;",
        "  if (PyArray_TYPE(a) != type || PyArray_NDIM(a) != nd) return 0;",
        "  if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a)) return 0;",
        "  if (!PyArray_ISNOTSWAPPED(a)) return 0;  /* kernels read native byte order */",
        "  const npy_intp *have = PyArray_DIMS(a);",
        "  for (int i = 0; i < nd; ++i) if (have[i] != dims[i]) return 0;",
        "  return 1;",
        "}",
        "",
    ]
    if blas is not None:
        lines += [*prelude(blas.int64, any(isinstance(c, GemmCall) and c.library == "graphkernel"
                                           for c in calls.values())), ""]
    if any(plan.slots[s].type.dtype == np.bool_ for s in args):
        lines += [
            "/* bool arguments hold 0 or 1 in each byte; any other byte (a uint8 view) goes to the",
            "   Python runner, which reads it as numpy's truth value */",
            "static int gk_bool01(PyObject *o) {",
            "  const unsigned char *p = PyArray_DATA((PyArrayObject *)o);",
            "  npy_intp n = PyArray_SIZE((PyArrayObject *)o);",
            "  unsigned char any = 0;",
            "  for (npy_intp i = 0; i < n; ++i) any |= p[i];",
            "  return any <= 1;",
            "}",
            "",
        ]
    symbol = {name: j for j, (name, _, _) in enumerate(plan.symbols)}
    dynamic = [s for s in args + produced if not plan.slots[s].type.is_static]
    assigned = {step.reads[1] for step in plan.steps if step.kind is StepKind.ASSIGN}
    # results a kernel writes into a weight's own array (Step.in_place): that array is the value
    into = {v: w for step in plan.steps for v, w in step.in_place}
    assigned |= set(into.values())

    def ref(s: int) -> int:  # the entry's array that holds the value's data
        return vid[into.get(s, s)]

    static_dims: list[int] = []
    dims_at: dict[int, int] = {}  # value -> its dimensions' offset in gk_dims, or -1 - in gk_dyn
    for s in args + produced:
        if s not in dynamic:
            dims_at[s] = len(static_dims)
            static_dims += [int(d) for d in plan.slots[s].type.shape]
    dyn_dims: list[str] = []  # this call's dimensions of results with dynamic sizes, as C
    for s in produced:
        if s in dynamic:
            dims_at[s] = -1 - len(dyn_dims)
            dyn_dims += [f"(npy_intp)({_c_size(d, symbol)})" for d in plan.slots[s].type.shape]
    # Static arguments: (value, dtype, rank, dims offset, must be writeable, bool) each; an
    # argument written in place after the kernels must be writeable.
    static_args = [(vid[s], plan.slots[s].type.dtype.num, len(plan.slots[s].type.shape),
                    dims_at[s], int(s in assigned), int(plan.slots[s].type.dtype == np.bool_))
                   for s in args if s not in dynamic]
    # An input sharing memory with a weight the call writes (`Tensor(w.asnumpy())`) would
    # change under a later read: the Python runner takes a copy (Executable._unaliased).
    overlaps = [vid[v] for i in plan.inputs for w in plan.written_weights for v in (i, w)]

    program = _Program()
    # A released value is dropped early only when a later step takes its buffer again.
    taken_after: list[set[int]] = []
    later: set[int] = set()
    for step in reversed(plan.steps):
        taken_after.append(set(later))
        later |= {plan.buffer_of[s] for s in step.writes if s in plan.buffer_of}
    taken_after.reverse()
    for i, (step, dead, later_buffers) in enumerate(zip(plan.steps, plan.release, taken_after)):
        if step.kind is StepKind.ASSIGN:  # the value into the weight's own array
            source, target = step.reads
            program.op(_OP_MEMMOVE, ref(target), ref(source), plan.slots[target].type.nbytes)
            continue
        call = calls.get(i)
        for s in step.writes:
            if s in into or isinstance(call, ReshapeView):
                continue
            t = plan.slots[s].type
            program.op(_OP_TAKE, vid[s], plan.buffer_of[s], len(t.shape), dims_at[s],
                       t.dtype.num)
        operands = step.reads + step.writes
        if isinstance(call, ReshapeView):  # the same memory in the result's shape
            program.op(_OP_VIEW, vid[call.target], vid[call.source],
                       len(plan.slots[call.target].type.shape), dims_at[call.target])
        elif isinstance(call, GemmCall):  # a matrix product: numpy's BLAS, called from here
            program.call(_size_locals(call.symbols, len(operands)) +
                         emit_gemm(call, _operand_data(operands)),
                         [ref(s) for s in operands], [symbol[n] for n in call.symbols])
        elif isinstance(call, GatherCall):
            program.call(_size_locals(call.symbols, len(operands)) +
                         emit_gather(call, _operand_data(operands)),
                         [ref(s) for s in operands], [symbol[n] for n in call.symbols])
        elif isinstance(call, RangeCall):
            program.call(_size_locals(call.symbols, len(operands)) +
                         emit_range(call, _operand_data(operands)),
                         [ref(s) for s in operands], [symbol[n] for n in call.symbols])
        else:
            assert step.kernel is not None
            program.kernel(step.kernel.name, [ref(s) for s in operands],
                           [symbol[n] for n in step.sizes])
        for s in dead:
            if plan.buffer_of.get(s) in later_buffers:
                program.op(_OP_CLEAR, vid[s])
    lines += [
        f"static const npy_intp gk_dims[] = {{{_c_list(static_dims)}}};",
        f"static const int gk_args[] = {{{_c_list(x for a in static_args for x in a)}}};",
        f"static const int gk_overlaps[] = {{{_c_list(overlaps)}}};",
        *program.definitions(),
        "",
        # the choice is a constant beside the tables, so gk_run is the same C for every plan
        # (a deeper stack's entry compiles the same code: tests/test_compile_depth.py)
        *awake_definitions(plan),
        *PROFILE_SOURCE.split("\n"),
        "static PyObject *gk_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {",
        f"  if (nargs != {nargs}) Py_RETURN_NOTIMPLEMENTED;",
        AWAKE_LOCAL,
    ]
    if blas is not None:  # the Python runner until the loader hands over numpy's BLAS
        lines.append("  if (gk_sgemm == NULL) Py_RETURN_NOTIMPLEMENTED;")
    for double in (False, True):  # MKL's, for products chosen for it: gone, the Python runner
        if any(isinstance(c, GemmCall) and c.library == "mkl" and c.double == double
               for c in calls.values()):
            lines.append(f"  if (gk_mkl_{'d' if double else 's'}gemm == NULL) "
                         "Py_RETURN_NOTIMPLEMENTED;")
    lines.append(f"  int64_t gk_size[{max(len(plan.symbols), 1)}] = {{0}};")
    lines += [
        f"  for (int i = 0; i < {6 * len(static_args)}; i += 6) {{",
        "    PyObject *a = args[gk_args[i]];",
        "    if (!gk_accept(a, gk_args[i + 1], gk_args[i + 2], gk_dims + gk_args[i + 3]))",
        "      Py_RETURN_NOTIMPLEMENTED;",
        "    if (gk_args[i + 4] && !PyArray_ISWRITEABLE((PyArrayObject *)a)) "
        "Py_RETURN_NOTIMPLEMENTED;",
        *(["    if (gk_args[i + 5] && !gk_bool01(a)) Py_RETURN_NOTIMPLEMENTED;"]
          if any(a[5] for a in static_args) else []),
        "  }",
    ]
    bound: set[str] = set()
    for s in args:
        if s in dynamic:
            t = plan.slots[s].type
            lines += _accept_dynamic(vid[s], t, symbol, bound)
            if s in assigned:
                lines.append(f"  if (!PyArray_ISWRITEABLE((PyArrayObject *)args[{vid[s]}])) "
                             "Py_RETURN_NOTIMPLEMENTED;")
            if t.dtype == np.bool_:
                lines.append(f"  if (!gk_bool01(args[{vid[s]}])) Py_RETURN_NOTIMPLEMENTED;")
    lines += [f"  for (int i = 0; i < {len(overlaps)}; i += 2)",
              "    if (gk_overlap(args[gk_overlaps[i]], args[gk_overlaps[i + 1]])) "
              "Py_RETURN_NOTIMPLEMENTED;"] if overlaps else []
    for gather in calls.values():  # every argument's index in range before anything runs
        if isinstance(gather, GatherCall) and not gather.computed:
            lines += emit_check(gather,
                                f"PyArray_DATA((PyArrayObject *)args[{vid[gather.indices]}])",
                                lambda d: _c_size(d, symbol))
    lines.append(f"  npy_intp gk_dyn[{max(len(dyn_dims), 1)}];")
    lines += [f"  gk_dyn[{k}] = {dim};" for k, dim in enumerate(dyn_dims)]
    total = nargs + len(produced)
    lines += [
        f"  PyArrayObject *v[{max(total, 1)}] = {{0}};  /* arguments (borrowed), then results */",
        f"  for (int i = 0; i < {nargs}; ++i) v[i] = (PyArrayObject *)args[i];",
        AWAKE_BEGIN,
        *([BLAS_HELD_BEGIN] if KERNELS_KEEP_THREADS_BESIDE_PRODUCTS else []),
        *_RUN_PROGRAM,
        BLAS_HELD_END,
        AWAKE_END,
        AWAKE_TIMED,
    ]
    results = [vid[s] for s in plan.outputs]
    if plan.returns_tuple or len(results) != 1:
        lines.append(f"  PyObject *result = PyTuple_New({len(results)});")
        lines.append("  if (result == NULL) goto fail;")
        for i, r in enumerate(results):
            lines.append(f"  Py_INCREF(v[{r}]);")
            lines.append(f"  PyTuple_SET_ITEM(result, {i}, (PyObject *)v[{r}]);")
    else:
        lines.append(f"  PyObject *result = (PyObject *)v[{results[0]}];")
        lines.append("  Py_INCREF(result);")
    lines += [
        f"  for (int i = {nargs}; i < {total}; ++i) Py_XDECREF(v[i]);",
        "  return result;",
        "refuse: __attribute__((unused));  /* the Python runner runs the call again */",
        BLAS_HELD_END,
        AWAKE_END,
        f"  for (int i = {nargs}; i < {total}; ++i) Py_XDECREF(v[i]);",
        "  Py_RETURN_NOTIMPLEMENTED;",
        "fail:",
        BLAS_HELD_END,
        AWAKE_END,
        f"  for (int i = {nargs}; i < {total}; ++i) Py_XDECREF(v[i]);",
        "  return NULL;",
        "}",
    ]
    lines += [
        "",
        *SEED_SOURCE.replace("NBUFFERS", str(nbuffers)).split("\n"),
        *CALL_SOURCE.replace("NARGS", str(nargs)).replace("ARRAYS", str(max(nargs, 1))).split("\n"),
        "static PyMethodDef gk_methods[] = {",
        '  {"run", (PyCFunction)(void (*)(void))gk_run, METH_FASTCALL, "run the graph"},',
        '  {"call", (PyCFunction)(void (*)(void))gk_call, METH_FASTCALL,',
        '   "call(fixed, *inputs): Tensors or arrays in, Tensors out; fixed: Parameters, '
        'constants, guards"},',
        '  {"set_tensor_type", gk_set_tensor_type, METH_O, "the class `call` reads and makes"},',
        THREADS_STATS_METHOD,
        PROFILE_METHOD,
        '  {"seed", (PyCFunction)(void (*)(void))gk_seed, METH_FASTCALL,',
        '   "seed(buffer, array): an array (prefaulted) for the pool; False when it is full"},',
        *(['  {"set_blas", (PyCFunction)(void (*)(void))gk_set_blas, METH_FASTCALL,',
           '   "set_blas(sgemm, dgemm, get_threads, set_threads, mkl_sgemm, mkl_dgemm): '
           'numpy\'s BLAS by address"},']
          if blas is not None else []),
        "  {NULL, NULL, 0, NULL}};",
        f'static struct PyModuleDef gk_module = {{PyModuleDef_HEAD_INIT, "{module}", NULL, -1, '
        "gk_methods};",
        f"PyMODINIT_FUNC PyInit_{module}(void) {{",
        "  import_array();",
        '  gk_array_name = PyUnicode_InternFromString("_array");',
        "  if (gk_array_name == NULL) return NULL;",
        "  return PyModule_Create(&gk_module);",
        "}",
    ]
    return "\n".join(lines) + "\n"


# The entry's steps are data, read by one loop (`_RUN_PROGRAM`): its C does not grow with the
# plan's steps, so a deep model's entry compiles as fast as a shallow one's. Written as one
# statement per step, the entry of 12 encoder layers took 0.77 s of gcc's CPU against 0.26 for
# one layer. Each operation is its code followed by its operands (value numbers index `v`:
# the arguments, then the results):
_OP_TAKE = 0  # value, buffer, rank, dims (offset in gk_dims, or -1 - offset in gk_dyn), dtype
_OP_VIEW = 1  # target, source, rank, dims: a reshaped view of the source
_OP_KERNEL = 2  # function (in gk_kernels), n, n values, m, m sizes (in gk_size)
_OP_CALL = 3  # function (in gk_steps: a product or a gather), n, n values, m, m sizes
_OP_MEMMOVE = 4  # target, source, bytes
_OP_CLEAR = 5  # value: dropped, its buffer taken again later


class _Program:
    """The entry's operations as numbers, the kernels they call, and the product and gather
    steps as C functions, one per distinct text (a stack of identical layers runs the same
    products on other buffers, and their data pointers are operands)."""

    def __init__(self) -> None:
        self.code: list[int] = []
        self.last_kernel = -1  # where the last kernel's operation starts in `code`
        self.kernels: dict[str, int] = {}
        self.steps: dict[str, int] = {}
        self.most_operands = 1

    def op(self, *numbers: int) -> None:
        self.code += numbers

    def kernel(self, name: str, values: list[int], sizes: list[int]) -> None:
        fn = self.kernels.setdefault(name, len(self.kernels))
        self.last_kernel = len(self.code)
        self.code += [_OP_KERNEL, fn, len(values), *values, len(sizes), *sizes]
        self.most_operands = max(self.most_operands, len(values) + len(sizes))

    def call(self, body: list[str], values: list[int], sizes: Sequence[int] = ()) -> None:
        text = "\n".join(body)
        fn = self.steps.setdefault(text, len(self.steps))
        self.code += [_OP_CALL, fn, len(values), *values, len(sizes), *sizes]
        self.most_operands = max(self.most_operands, len(values) + len(sizes))

    def definitions(self) -> list[str]:
        """The program's tables and the step functions, before `gk_run`."""
        lines = []
        for text, k in self.steps.items():
            lines += [f"static int gk_step{k}(void *const *d) {{", text, "  return 0;",
                      "fail: __attribute__((unused));", "  return -1;", "}"]
        kernels = ", ".join(self.kernels) or "NULL"
        steps = ", ".join(f"gk_step{k}" for k in range(len(self.steps))) or "NULL"
        return lines + [
            f"static void (*const gk_kernels[])(void *const *) = {{{kernels}}};",
            f"static int (*const gk_steps[])(void *const *) = {{{steps}}};",
            f"static const int64_t gk_program[] = {{{_c_list(self.code)}}};",
            f"#define GK_PROGRAM_LENGTH {len(self.code)}",
            f"#define GK_LAST_KERNEL {self.last_kernel}",
            f"#define GK_MOST_OPERANDS {self.most_operands}",
        ]


# Within a call every product runs on OpenMP's threads with BLAS held to one (c_gemm.py), so
# no BLAS worker spins beside the kernels: the kernels planned after a product keep their
# threads on two cores too (c_text.py `gk_parallel_beside_blas`, set on the calling thread for
# the call). Off, they ran on one thread there: ONNX BERT-small b8's GeLU and LayerNorm kernels
# took 7.5% of the call's CPU on the caller while the other thread waited.
KERNELS_KEEP_THREADS_BESIDE_PRODUCTS = True
BLAS_HELD_BEGIN = "  gk_blas_held = 1;"
BLAS_HELD_END = "  gk_blas_held = 0;"

_RUN_PROGRAM = f"""  void *gk_argv[GK_MOST_OPERANDS];
  Py_ssize_t gk_step = 0;  /* the plan's steps but its ASSIGNs: profile_into's index */
  for (int pc = 0; pc < GK_PROGRAM_LENGTH;) {{
    const int64_t *op = gk_program + pc;
    switch (op[0]) {{
    case {_OP_TAKE}: {{
      const npy_intp *dims = op[4] >= 0 ? gk_dims + op[4] : gk_dyn + (-1 - op[4]);
      v[op[1]] = gk_take((int)op[2], (int)op[3], dims, (int)op[5]);
      if (v[op[1]] == NULL) goto fail;
      pc += 6;
      break;
    }}
    case {_OP_VIEW}: {{
      GK_STEP_BEGIN;
      const npy_intp *dims = op[4] >= 0 ? gk_dims + op[4] : gk_dyn + (-1 - op[4]);
      PyArray_Dims gk_shape = {{(npy_intp *)dims, (int)op[3]}};
      v[op[1]] = (PyArrayObject *)PyArray_Newshape(v[op[2]], &gk_shape, NPY_CORDER);
      if (v[op[1]] == NULL) goto fail;
      GK_STEP_END;
      pc += 5;
      break;
    }}
    case {_OP_KERNEL}: {{
      GK_BEFORE_KERNEL(pc);
      GK_STEP_BEGIN;
      const int64_t n = op[2], m = op[3 + n];
      for (int64_t i = 0; i < n; ++i) gk_argv[i] = PyArray_DATA(v[op[3 + i]]);
      for (int64_t j = 0; j < m; ++j) gk_argv[n + j] = &gk_size[op[4 + n + j]];
      gk_kernels[op[1]](gk_argv);
      GK_STEP_END;
      pc += 4 + n + m;
      break;
    }}
    case {_OP_CALL}: {{
      GK_STEP_BEGIN;
      const int64_t n = op[2], m = op[3 + n];
      for (int64_t i = 0; i < n; ++i) gk_argv[i] = PyArray_DATA(v[op[3 + i]]);
      for (int64_t j = 0; j < m; ++j) gk_argv[n + j] = &gk_size[op[4 + n + j]];
      const int gk_status = gk_steps[op[1]](gk_argv);
      if (gk_status < 0) goto fail;
      if (gk_status > 0) goto refuse;  /* computed indices out of range (c_gather.py) */
      GK_STEP_END;
      pc += 4 + n + m;
      break;
    }}
    case {_OP_MEMMOVE}:
      memmove(PyArray_DATA(v[op[1]]), PyArray_DATA(v[op[2]]), (size_t)op[3]);
      pc += 4;
      break;
    case {_OP_CLEAR}:
      Py_CLEAR(v[op[1]]);
      pc += 2;
      break;
    default:
      PyErr_SetString(PyExc_SystemError, "graphkernel entry: unknown step");
      goto fail;
    }}
  }}""".split("\n")


def _c_list(numbers: Iterable[int]) -> str:
    """A C initializer's items; 0 for none (C has no empty initializer)."""
    return ", ".join(map(str, numbers)) or "0"


def _size_locals(symbols: Sequence[str], operands: int) -> list[str]:
    """A step function's dynamic sizes as locals of their names (SymSize's text is its C):
    their values follow the data pointers, as a kernel's do."""
    return [f"  const int64_t {name} = *(const int64_t *)d[{operands + j}];"
            for j, name in enumerate(symbols)]


def _operand_data(operands: Sequence[int]) -> dict[int, str]:
    """A product's or gather's operands as its step function's data pointers."""
    return {s: f"d[{j}]" for j, s in enumerate(operands)}


_ACCEPT_ANY = [
    "static int gk_accept_any(PyObject *o, int type, int nd) {",
    "  if (!PyArray_Check(o)) return 0;",
    "  PyArrayObject *a = (PyArrayObject *)o;",
    "  if (PyArray_TYPE(a) != type || PyArray_NDIM(a) != nd) return 0;",
    "  return PyArray_IS_C_CONTIGUOUS(a) && PyArray_ISALIGNED(a);",
    "}",
    "",
]
# Two accepted (C-contiguous) arrays whose bytes overlap.
_OVERLAP = [
    "static int gk_overlap(PyObject *a, PyObject *b) {",
    "  const char *p = PyArray_BYTES((PyArrayObject *)a), *q = PyArray_BYTES((PyArrayObject *)b);",
    "  return p < q + PyArray_NBYTES((PyArrayObject *)b) &&",
    "         q < p + PyArray_NBYTES((PyArrayObject *)a);",
    "}",
    "",
]
# A pooled array starts on a vector's boundary (memory.VECTOR_ALIGNMENT bytes): numpy's own
# start 16 bytes into a line, so that each 64-byte vector a kernel loads or stores there spans
# two cache lines (a 1x1 convolution + residual at 56x56 ran 2.4-3.7% slower so). Its memory is
# a byte array the array keeps as its base, which views of it then refer to (`gk_free`).
_EMPTY_ALIGNED = [
    "static PyObject *gk_empty_aligned(int nd, const npy_intp *dims, int type) {",
    "  PyArray_Descr *d = PyArray_DescrFromType(type);",
    "  if (d == NULL) return NULL;",
    "#if NPY_ABI_VERSION >= 0x02000000",
    "  npy_intp n = PyDataType_ELSIZE(d);",
    "#else",
    "  npy_intp n = d->elsize;",
    "#endif",
    "  for (int i = 0; i < nd; ++i) n *= dims[i];",
    f"  npy_intp raw_n[1] = {{n + {VECTOR_ALIGNMENT}}};",
    "  PyObject *raw = PyArray_EMPTY(1, raw_n, NPY_UINT8, 0);",
    "  if (raw == NULL) { Py_DECREF(d); return NULL; }",
    "  char *start = PyArray_BYTES((PyArrayObject *)raw);",
    f"  start += (size_t)(-(uintptr_t)start) % {VECTOR_ALIGNMENT};",
    "  PyObject *a = PyArray_NewFromDescr(&PyArray_Type, d, nd, (npy_intp *)dims, NULL, start,",
    "                                     NPY_ARRAY_CARRAY, NULL);  /* takes d */",
    "  if (a == NULL) { Py_DECREF(raw); return NULL; }",
    "  if (PyArray_SetBaseObject((PyArrayObject *)a, raw) < 0) { Py_DECREF(a); return NULL; }",
    "  return a;",
    "}",
    "/* Whether only the pool holds a pooled array: nothing else refers to it, nor to its",
    "   memory's owner (numpy makes a view's base the array that owns the memory, so a view",
    "   of an aligned array refers to the byte array, not to it). */",
    "static int gk_free(PyObject *p) {",
    "  PyObject *base = PyArray_BASE((PyArrayObject *)p);",
    "  return Py_REFCNT(p) == 1 && (base == NULL || Py_REFCNT(base) == 1);",
    "}",
    "",
]
_TAKE_STATIC = [
    "    if (p != NULL && gk_free(p)) { Py_INCREF(p); return (PyArrayObject *)p; }",
]
# Dynamic sizes: a free pooled array of another shape is dropped to make room.
_TAKE_SHAPED = [
    "    if (p == NULL || !gk_free(p)) continue;",
    "    if (PyArray_NDIM((PyArrayObject *)p) == nd && memcmp(PyArray_DIMS((PyArrayObject *)p),",
    "        dims, nd * sizeof(npy_intp)) == 0) { Py_INCREF(p); return (PyArrayObject *)p; }",
    "    Py_DECREF(p); gk_pool[slot][k] = NULL;",
]


def _c_size(dim: object, symbol: dict[str, int]) -> str:
    """A dimension as C: a number, or the product of this call's sizes."""
    if not isinstance(dim, SymSize):
        return str(dim)
    return " * ".join([str(dim.coef)] + [f"gk_size[{symbol[n]}]" for n in dim.names])


def _accept_dynamic(arg: int, t: TensorType, symbol: dict[str, int], bound: set[str]
                    ) -> list[str]:
    """The checks of an argument with dynamic sizes: dtype, rank and layout, each static
    dimension, and each dynamic one read (its first appearance) or compared with that."""
    lines = [f"  if (!gk_accept_any(args[{arg}], {t.dtype.num}, {len(t.shape)})) "
             "Py_RETURN_NOTIMPLEMENTED;",
             f"  {{ const npy_intp *have = PyArray_DIMS((PyArrayObject *)args[{arg}]);"]
    for axis, dim in enumerate(t.shape):
        if isinstance(dim, SymSize) and dim.names[0] not in bound:
            bound.add(dim.names[0])
            if dim.coef != 1:  # 2*N: a multiple of 2, N its half
                lines.append(f"    if (have[{axis}] % {dim.coef}) Py_RETURN_NOTIMPLEMENTED;")
            lines.append(f"    gk_size[{symbol[dim.names[0]]}] = have[{axis}] / {dim.coef};")
        else:
            lines.append(f"    if (have[{axis}] != {_c_size(dim, symbol)}) "
                         "Py_RETURN_NOTIMPLEMENTED;")
    return lines + ["  }"]
