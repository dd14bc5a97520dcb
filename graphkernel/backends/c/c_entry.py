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

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphkernel.backends.c.c_gather import GatherCall, emit_check, emit_gather, gather_call
from graphkernel.backends.c.c_gemm import GemmCall, emit_gemm, gemm_call, prelude, with_library
from graphkernel.backends.c.cblas import CBlas, cblas
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import SymSize, TensorType
from graphkernel.runtime.plan import ExecutionPlan, Step, StepKind, entry_arguments

POOL_DEPTH = 2


def entry_source(plan: ExecutionPlan) -> Callable[[str], str] | None:
    """The entry module's C, given its module name; None when some step is neither a kernel
    nor a product BLAS takes as is (backends/c/c_gemm.py), or a result would alias an argument
    (the Python runner handles those)."""
    kinds = {s.kind for s in plan.steps}
    if StepKind.KERNEL not in kinds or any(plan.copy_out):
        return None
    if not kinds <= {StepKind.KERNEL, StepKind.ASSIGN, StepKind.LIBRARY, StepKind.VIEW}:
        return None
    calls = {i: gemm_call(plan, step) or gather_call(plan, step) or reshape_view(plan, step)
             for i, step in enumerate(plan.steps)
             if step.kind in (StepKind.LIBRARY, StepKind.VIEW)}
    if any(call is None for call in calls.values()):
        return None
    gemms = any(isinstance(call, GemmCall) for call in calls.values())
    blas = cblas() if gemms else None
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
          calls: dict[int, GemmCall | GatherCall | ReshapeView],
          blas: CBlas | None) -> str:
    args = entry_arguments(plan)
    nargs = len(args)
    vid = {s: i for i, s in enumerate(args)}  # the entry numbers values: arguments first
    produced = [s for step in plan.steps for s in step.writes]
    for s in produced:
        vid[s] = len(vid)
    nvalues = max(len(produced), 1)
    local = {s: i for i, s in enumerate(produced)}  # index into v[]
    nbuffers = max(len(plan.buffers), 1)
    lines = [
        "#define PY_SSIZE_T_CLEAN",
        "#include <Python.h>",
        "#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION",
        "#include <numpy/arrayobject.h>",
        "",
        f"static PyObject *gk_pool[{nbuffers}][{POOL_DEPTH}];",
        "",
        "static PyArrayObject *gk_take(int slot, int nd, const npy_intp *dims, int type) {",
        f"  for (int k = 0; k < {POOL_DEPTH}; ++k) {{",
        "    PyObject *p = gk_pool[slot][k];",
        *(_TAKE_SHAPED if plan.symbols else _TAKE_STATIC),
        "  }",
        "  PyObject *p = PyArray_EMPTY(nd, (npy_intp *)dims, type, 0);",
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
        lines += [*prelude(blas.int64), ""]
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
    for s in args + produced:
        if s not in dynamic:
            dims = ", ".join(str(d) for d in plan.slots[s].type.shape) or "0"
            lines.append(f"static const npy_intp gk_dims{vid[s]}[] = {{{dims}}};")
    lines += [
        "",
        "static PyObject *gk_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {",
        f"  if (nargs != {nargs}) Py_RETURN_NOTIMPLEMENTED;",
    ]
    if blas is not None:  # the Python runner until the loader hands over numpy's BLAS
        lines.append("  if (gk_sgemm == NULL) Py_RETURN_NOTIMPLEMENTED;")
    for double in (False, True):  # MKL's, for products chosen for it: gone, the Python runner
        if any(isinstance(c, GemmCall) and c.library == "mkl" and c.double == double
               for c in calls.values()):
            lines.append(f"  if (gk_mkl_{'d' if double else 's'}gemm == NULL) "
                         "Py_RETURN_NOTIMPLEMENTED;")
    assigned = {step.reads[1] for step in plan.steps if step.kind is StepKind.ASSIGN}
    # results a kernel writes into a weight's own array (Step.in_place): that array is the value
    into = {v: w for step in plan.steps for v, w in step.in_place}
    assigned |= set(into.values())
    if plan.symbols:
        lines.append(f"  int64_t gk_size[{len(plan.symbols)}] = {{0}};")
    bound: set[str] = set()
    for s in args:
        t = plan.slots[s].type
        if s in dynamic:
            lines += _accept_dynamic(vid[s], t, symbol, bound)
        else:
            lines.append(f"  if (!gk_accept(args[{vid[s]}], {t.dtype.num}, {len(t.shape)}, "
                         f"gk_dims{vid[s]})) Py_RETURN_NOTIMPLEMENTED;")
        if s in assigned:  # written in place after the kernels: must be writeable
            lines.append(f"  if (!PyArray_ISWRITEABLE((PyArrayObject *)args[{vid[s]}])) "
                         "Py_RETURN_NOTIMPLEMENTED;")
        if t.dtype == np.bool_:
            lines.append(f"  if (!gk_bool01(args[{vid[s]}])) Py_RETURN_NOTIMPLEMENTED;")
    # An input sharing memory with a weight the call writes (`Tensor(w.asnumpy())`) would
    # change under a later read: the Python runner takes a copy (Executable._unaliased).
    for i in plan.inputs:
        for w in plan.written_weights:
            lines.append(f"  if (gk_overlap(args[{vid[i]}], args[{vid[w]}])) "
                         "Py_RETURN_NOTIMPLEMENTED;")
    for gather in calls.values():  # every index in range before anything runs
        if isinstance(gather, GatherCall):
            lines += emit_check(gather,
                                f"PyArray_DATA((PyArrayObject *)args[{vid[gather.indices]}])")
    for s in produced:  # this call's shapes of values with dynamic sizes
        if s in dynamic:
            dims = ", ".join(f"(npy_intp)({_c_size(d, symbol)})"
                             for d in plan.slots[s].type.shape)
            lines.append(f"  const npy_intp gk_dims{vid[s]}[] = {{{dims}}};")
    lines.append(f"  PyArrayObject *v[{nvalues}] = {{0}};")

    def data(s: int) -> str:
        s = into.get(s, s)
        if vid[s] < nargs:
            return f"PyArray_DATA((PyArrayObject *)args[{vid[s]}])"
        return f"PyArray_DATA(v[{local[s]}])"

    def array(s: int) -> str:
        if vid[s] < nargs:
            return f"(PyArrayObject *)args[{vid[s]}]"
        return f"v[{local[s]}]"

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
            nbytes = plan.slots[target].type.nbytes
            lines.append(f"  memmove({data(target)}, {data(source)}, {nbytes});")
            continue
        call = calls.get(i)
        for s in step.writes:
            if s in into or isinstance(call, ReshapeView):
                continue
            t = plan.slots[s].type
            lines.append(f"  v[{local[s]}] = gk_take({plan.buffer_of[s]}, {len(t.shape)}, "
                         f"gk_dims{vid[s]}, {t.dtype.num});")
            lines.append(f"  if (v[{local[s]}] == NULL) goto fail;")
        if isinstance(call, ReshapeView):  # the same memory in the result's shape
            t = plan.slots[call.target].type
            lines += [f"  {{ PyArray_Dims gk_shape = {{(npy_intp *)gk_dims{vid[call.target]}, "
                      f"{len(t.shape)}}};",
                      f"    v[{local[call.target]}] = (PyArrayObject *)PyArray_Newshape("
                      f"{array(call.source)}, &gk_shape, NPY_CORDER); }}",
                      f"  if (v[{local[call.target]}] == NULL) goto fail;"]
        elif isinstance(call, GemmCall):  # a matrix product: numpy's BLAS, called from here
            lines += emit_gemm(call, {s: data(s) for s in step.reads + step.writes})
        elif isinstance(call, GatherCall):
            lines += emit_gather(call, {s: data(s) for s in step.reads + step.writes})
        else:
            assert step.kernel is not None
            argv = ", ".join([data(s) for s in step.reads + step.writes] +
                             [f"&gk_size[{symbol[n]}]" for n in step.sizes])
            lines.append(f"  {{ void *argv[] = {{{argv}}}; {step.kernel.name}(argv); }}")
        for s in dead:
            if plan.buffer_of.get(s) in later_buffers:
                lines.append(f"  Py_CLEAR(v[{local[s]}]);")
    results = [local[s] for s in plan.outputs]
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
        f"  for (int i = 0; i < {len(produced)}; ++i) Py_XDECREF(v[i]);",
        "  return result;",
        "fail:",
        f"  for (int i = 0; i < {len(produced)}; ++i) Py_XDECREF(v[i]);",
        "  return NULL;",
        "}",
        "",
        *_SEED.replace("NBUFFERS", str(nbuffers)).split("\n"),
        *_CALL.replace("NARGS", str(nargs)).replace("ARRAYS", str(max(nargs, 1))).split("\n"),
        "static PyMethodDef gk_methods[] = {",
        '  {"run", (PyCFunction)(void (*)(void))gk_run, METH_FASTCALL, "run the graph"},',
        '  {"call", (PyCFunction)(void (*)(void))gk_call, METH_FASTCALL,',
        '   "call(fixed, *inputs): Tensors or arrays in, Tensors out; fixed: Parameters, '
        'constants, guards"},',
        '  {"set_tensor_type", gk_set_tensor_type, METH_O, "the class `call` reads and makes"},',
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


# `seed(buffer, array)`: the runner hands the arrays its prefault thread touched to the pool
# (runtime/runner.py `finish_prefault`), so the first call writes into warm pages. The runner
# checks the array's shape and dtype against the plan's buffer.
_SEED = """static PyObject *gk_seed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyLong_Check(args[0]) || !PyArray_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "seed takes a buffer number and an array");
    return NULL;
  }
  long slot = PyLong_AsLong(args[0]);
  if (slot < 0 || slot >= NBUFFERS) {
    PyErr_SetString(PyExc_ValueError, "seed: no such buffer");
    return NULL;
  }
  for (int k = 0; k < POOL_DEPTH_; ++k) {
    if (gk_pool[slot][k] == NULL) {
      Py_INCREF(args[1]);
      gk_pool[slot][k] = args[1];
      Py_RETURN_TRUE;
    }
  }
  Py_RETURN_FALSE;
}
""".replace("POOL_DEPTH_", str(POOL_DEPTH))

# `call(fixed, *inputs)`: a Cell's per-call path with no Python frame between the user's call
# and the kernels. Inputs are Tensors (their `_array` is read here) or arrays; `fixed` is the
# tuple of the cell's Parameters (read on every call: set_data replaces an array), the graph's
# constants, and last the guards' table (frontend/guards.py `Guards.table`); results come back
# as Tensors. A guard that moved, or anything `run` would not take as is, makes it return
# NotImplemented, and the caller takes the full path.
_CALL = """static PyTypeObject *gk_tensor_type = NULL;

/* The guards: (dicts, names, expected, missing), three lists of one length; they hold when
   dicts[i].get(names[i], missing) is expected[i] for every i (a cell's attribute still the
   object the trace read). */
static int gk_guards_hold(PyObject *table) {
  if (!PyTuple_CheckExact(table) || PyTuple_GET_SIZE(table) != 4) return 0;
  PyObject *dicts = PyTuple_GET_ITEM(table, 0), *names = PyTuple_GET_ITEM(table, 1);
  PyObject *expected = PyTuple_GET_ITEM(table, 2), *missing = PyTuple_GET_ITEM(table, 3);
  if (!PyList_CheckExact(dicts) || !PyList_CheckExact(names) || !PyList_CheckExact(expected))
    return 0;
  Py_ssize_t n = PyList_GET_SIZE(dicts);
  if (PyList_GET_SIZE(names) != n || PyList_GET_SIZE(expected) != n) return 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *d = PyList_GET_ITEM(dicts, i), *name = PyList_GET_ITEM(names, i);
    if (!PyDict_CheckExact(d) || !PyUnicode_CheckExact(name)) return 0;
    PyObject *v = PyDict_GetItemWithError(d, name);  /* borrowed; str keys: no Python code */
    if (v == NULL) {
      if (PyErr_Occurred()) { PyErr_Clear(); return 0; }
      v = missing;
    }
    if (v != PyList_GET_ITEM(expected, i)) return 0;
  }
  return 1;
}
static PyObject *gk_array_name = NULL;

static PyObject *gk_set_tensor_type(PyObject *self, PyObject *type) {
  if (!PyType_Check(type)) {
    PyErr_SetString(PyExc_TypeError, "set_tensor_type takes a class");
    return NULL;
  }
  Py_INCREF(type);
  Py_XDECREF((PyObject *)gk_tensor_type);
  gk_tensor_type = (PyTypeObject *)type;
  Py_RETURN_NONE;
}

/* A new reference to the array behind `o`, or NULL when `o` is neither an array nor a Tensor
   holding one (a symbolic Tensor being traced, a number, ...). */
static PyObject *gk_unwrap(PyObject *o) {
  if (PyArray_Check(o)) { Py_INCREF(o); return o; }
  if (!PyObject_TypeCheck(o, gk_tensor_type)) return NULL;
  PyObject *a = PyObject_GetAttr(o, gk_array_name);
  if (a == NULL) { PyErr_Clear(); return NULL; }
  if (!PyArray_Check(a)) { Py_DECREF(a); return NULL; }
  return a;
}

/* A Tensor holding `array` (a reference stolen), as Tensor._wrap makes one. */
static PyObject *gk_wrap(PyObject *array) {
  PyObject *t = gk_tensor_type->tp_alloc(gk_tensor_type, 0);
  if (t == NULL || PyObject_GenericSetAttr(t, gk_array_name, array) < 0) {
    Py_XDECREF(t);
    Py_DECREF(array);
    return NULL;
  }
  Py_DECREF(array);
  return t;
}

static PyObject *gk_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 1 || !PyTuple_CheckExact(args[0]) || gk_tensor_type == NULL)
    Py_RETURN_NOTIMPLEMENTED;
  Py_ssize_t ninputs = nargs - 1, nfixed = PyTuple_GET_SIZE(args[0]) - 1;
  if (nfixed < 0 || ninputs + nfixed != NARGS) Py_RETURN_NOTIMPLEMENTED;
  if (!gk_guards_hold(PyTuple_GET_ITEM(args[0], nfixed))) Py_RETURN_NOTIMPLEMENTED;
  PyObject *arrays[ARRAYS];
  PyObject *result = NULL;
  Py_ssize_t n = 0;
  for (; n < NARGS; ++n) {
    PyObject *o = n < ninputs ? args[1 + n] : PyTuple_GET_ITEM(args[0], n - ninputs);
    arrays[n] = gk_unwrap(o);
    if (arrays[n] == NULL) { Py_INCREF(Py_NotImplemented); result = Py_NotImplemented; goto done; }
  }
  result = gk_run(self, arrays, NARGS);
  if (result == NULL || result == Py_NotImplemented) goto done;
  if (PyTuple_CheckExact(result)) {
    Py_ssize_t k = PyTuple_GET_SIZE(result);
    PyObject *wrapped = PyTuple_New(k);
    for (Py_ssize_t i = 0; wrapped != NULL && i < k; ++i) {
      PyObject *item = PyTuple_GET_ITEM(result, i);
      Py_INCREF(item);
      PyObject *t = gk_wrap(item);
      if (t == NULL) { Py_CLEAR(wrapped); break; }
      PyTuple_SET_ITEM(wrapped, i, t);
    }
    Py_DECREF(result);
    result = wrapped;
  } else {
    result = gk_wrap(result);
  }
done:
  for (Py_ssize_t i = 0; i < n; ++i) Py_DECREF(arrays[i]);
  return result;
}
"""

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
_TAKE_STATIC = [
    "    if (p != NULL && Py_REFCNT(p) == 1) { Py_INCREF(p); return (PyArrayObject *)p; }",
]
# Dynamic sizes: a free pooled array of another shape is dropped to make room.
_TAKE_SHAPED = [
    "    if (p == NULL || Py_REFCNT(p) != 1) continue;",
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
