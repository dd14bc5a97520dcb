"""One CPython entry point per compiled graph.

When every kernel of a graph is generated C, the graph's translation unit also becomes a
CPython extension module whose `run(*arrays)` checks its inputs, takes output buffers from a
small pool, and calls the kernels in order: one call from Python per graph, ~1 us instead of a
Python loop over ctypes calls. Any input it does not accept as is (a Tensor, another dtype or
shape, a non-contiguous array) makes it return NotImplemented, and the Python path takes over
with its conversions and clear errors.

The pool: an output or intermediate buffer is reused only when the pool holds its only
reference (the caller dropped it, and no view of it lives), so a caller never sees two results
share memory; it saves the page faults of fresh large arrays.
"""
from __future__ import annotations

from dataclasses import dataclass, field

POOL_DEPTH = 2


@dataclass
class EntryValue:
    typenum: int
    shape: tuple[int, ...]


@dataclass
class EntryCall:
    kernel: str
    operands: list[int]  # value ids, in the kernel's argv order (inputs then constants)
    outputs: list[int]


@dataclass
class EntryPlan:
    """Values 0..len(args)-1 are the call's arguments; kernel outputs get ids after them."""

    args: list[EntryValue]
    values: dict[int, EntryValue] = field(default_factory=dict)
    calls: list[EntryCall] = field(default_factory=list)
    results: list[int] = field(default_factory=list)
    returns_tuple: bool = False


def emit_entry(plan: EntryPlan, module: str) -> str:
    nargs = len(plan.args)
    produced = sorted(plan.values)
    lines = [
        "#define PY_SSIZE_T_CLEAN",
        "#include <Python.h>",
        "#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION",
        "#include <numpy/arrayobject.h>",
        "",
        f"static PyObject *gk_pool[{max(len(produced), 1)}][{POOL_DEPTH}];",
        "",
        "static PyArrayObject *gk_take(int slot, int nd, const npy_intp *dims, int type) {",
        f"  for (int k = 0; k < {POOL_DEPTH}; ++k) {{",
        "    PyObject *p = gk_pool[slot][k];",
        "    if (p != NULL && Py_REFCNT(p) == 1) { Py_INCREF(p); return (PyArrayObject *)p; }",
        "  }",
        "  PyObject *p = PyArray_EMPTY(nd, (npy_intp *)dims, type, 0);",
        "  if (p == NULL) return NULL;",
        f"  for (int k = 0; k < {POOL_DEPTH}; ++k) {{",
        "    if (gk_pool[slot][k] == NULL) { Py_INCREF(p); gk_pool[slot][k] = p; break; }",
        "  }",
        "  return (PyArrayObject *)p;",
        "}",
        "",
        "static int gk_accept(PyObject *o, int type, int nd, const npy_intp *dims) {",
        "  if (!PyArray_Check(o)) return 0;",
        "  PyArrayObject *a = (PyArrayObject *)o;",
        "  if (PyArray_TYPE(a) != type || PyArray_NDIM(a) != nd) return 0;",
        "  if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a)) return 0;",
        "  const npy_intp *have = PyArray_DIMS(a);",
        "  for (int i = 0; i < nd; ++i) if (have[i] != dims[i]) return 0;",
        "  return 1;",
        "}",
        "",
    ]
    for vid, value in list(enumerate(plan.args)) + [(v, plan.values[v]) for v in produced]:
        dims = ", ".join(str(d) for d in value.shape) or "0"
        lines.append(f"static const npy_intp gk_dims{vid}[] = {{{dims}}};")
    lines += [
        "",
        "static PyObject *gk_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {",
        f"  if (nargs != {nargs}) Py_RETURN_NOTIMPLEMENTED;",
    ]
    for vid, value in enumerate(plan.args):
        lines.append(f"  if (!gk_accept(args[{vid}], {value.typenum}, {len(value.shape)}, "
                     f"gk_dims{vid})) Py_RETURN_NOTIMPLEMENTED;")
    slot_of = {vid: i for i, vid in enumerate(produced)}
    lines.append(f"  PyArrayObject *v[{max(len(produced), 1)}] = {{0}};")

    def data(vid: int) -> str:
        if vid < nargs:
            return f"PyArray_DATA((PyArrayObject *)args[{vid}])"
        return f"PyArray_DATA(v[{slot_of[vid]}])"

    for call in plan.calls:
        for out in call.outputs:
            value = plan.values[out]
            s = slot_of[out]
            lines.append(f"  v[{s}] = gk_take({s}, {len(value.shape)}, gk_dims{out}, "
                         f"{value.typenum});")
            lines.append(f"  if (v[{s}] == NULL) goto fail;")
        argv = ", ".join(data(o) for o in call.operands + call.outputs)
        lines.append(f"  {{ void *argv[] = {{{argv}}}; {call.kernel}(argv); }}")
    results = plan.results
    if plan.returns_tuple or len(results) != 1:
        lines.append(f"  PyObject *result = PyTuple_New({len(results)});")
        lines.append("  if (result == NULL) goto fail;")
        for i, vid in enumerate(results):
            lines.append(f"  Py_INCREF(v[{slot_of[vid]}]);")
            lines.append(f"  PyTuple_SET_ITEM(result, {i}, (PyObject *)v[{slot_of[vid]}]);")
    else:
        lines.append(f"  PyObject *result = (PyObject *)v[{slot_of[results[0]]}];")
        lines.append("  Py_INCREF(result);")
    lines += [
        f"  for (int i = 0; i < {len(produced)}; ++i) Py_XDECREF(v[i]);",
        "  return result;",
        "fail:",
        f"  for (int i = 0; i < {len(produced)}; ++i) Py_XDECREF(v[i]);",
        "  return NULL;",
        "}",
        "",
        "static PyMethodDef gk_methods[] = {",
        '  {"run", (PyCFunction)(void (*)(void))gk_run, METH_FASTCALL, "run the graph"},',
        "  {NULL, NULL, 0, NULL}};",
        f'static struct PyModuleDef gk_module = {{PyModuleDef_HEAD_INIT, "{module}", NULL, -1, '
        "gk_methods};",
        f"PyMODINIT_FUNC PyInit_{module}(void) {{",
        "  import_array();",
        "  return PyModule_Create(&gk_module);",
        "}",
    ]
    return "\n".join(lines) + "\n"
