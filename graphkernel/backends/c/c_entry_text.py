"""The compiled entry's fixed C (backends/c/c_entry.py writes the rest per plan): `seed`, which
hands the pool prefaulted arrays, `call`, a Cell's per-call path from Tensors to Tensors, and
`profile_into`, the step timing Runner.profile reads. Each is text with the plan's numbers to
fill in (NBUFFERS; NARGS, ARRAYS)."""
from __future__ import annotations

POOL_DEPTH = 2  # arrays the pool keeps per buffer (c_entry.py reads it too)


# `seed(buffer, array)`: the runner hands the arrays its prefault thread touched to the pool
# (runtime/runner.py `finish_prefault`), so the first call writes into warm pages. The runner
# checks the array's shape and dtype against the plan's buffer.
SEED_SOURCE = """static PyObject *gk_seed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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

# `profile_into(vector)`: while a float64 vector is set, each call writes the seconds of each of
# its program's steps (a kernel, a product or gather, a view: the plan's steps but its ASSIGNs,
# in order) into it; None stops. Runner.profile times a call's steps so: the runner's own
# steps ran the products on numpy's BLAS, not on the packed or row kernels the entry runs, and
# the kernels after a product on one thread (beside BLAS's workers; figures in perf-notes,
# "`profile_kernels` timed other code than a call runs"). Off, a step costs one test of a
# pointer.
PROFILE_SOURCE = """#include <time.h>
static double *gk_profile = NULL;
static Py_ssize_t gk_profile_n = 0;
static PyObject *gk_profile_owner = NULL;
static PyObject *gk_profile_into(PyObject *self, PyObject *arg) {
  if (arg == Py_None) {
    gk_profile = NULL;
    gk_profile_n = 0;
    Py_CLEAR(gk_profile_owner);
    Py_RETURN_NONE;
  }
  if (!PyArray_Check(arg) || PyArray_TYPE((PyArrayObject *)arg) != NPY_FLOAT64 ||
      PyArray_NDIM((PyArrayObject *)arg) != 1 ||
      !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)arg) ||
      !PyArray_ISWRITEABLE((PyArrayObject *)arg)) {
    PyErr_SetString(PyExc_TypeError,
                    "profile_into takes a writable contiguous float64 vector or None");
    return NULL;
  }
  Py_INCREF(arg);
  Py_XSETREF(gk_profile_owner, arg);
  gk_profile = (double *)PyArray_DATA((PyArrayObject *)arg);
  gk_profile_n = PyArray_SIZE((PyArrayObject *)arg);
  Py_RETURN_NONE;
}
#define GK_STEP_BEGIN \\
  struct timespec gk_t0 = {0, 0}; \\
  if (gk_profile != NULL) clock_gettime(CLOCK_MONOTONIC, &gk_t0)
#define GK_STEP_END \\
  do { \\
    if (gk_profile != NULL && gk_step < gk_profile_n) { \\
      struct timespec gk_t1; \\
      clock_gettime(CLOCK_MONOTONIC, &gk_t1); \\
      gk_profile[gk_step] = (double)(gk_t1.tv_sec - gk_t0.tv_sec) + \\
                            1e-9 * (double)(gk_t1.tv_nsec - gk_t0.tv_nsec); \\
    } \\
    ++gk_step; \\
  } while (0)
"""
PROFILE_METHOD = ('  {"profile_into", gk_profile_into, METH_O, '
                  '"profile_into(vector or None): each call writes its steps\' seconds there"},')

# `call(fixed, *inputs)`: a Cell's per-call path with no Python frame between the user's call
# and the kernels. Inputs are Tensors (their `_array` is read here) or arrays; `fixed` is the
# tuple of the cell's Parameters (read on every call: set_data replaces an array), the graph's
# constants, and last the guards' table (frontend/guards.py `Guards.table`); results come back
# as Tensors. A guard that moved, or anything `run` would not take as is, makes it return
# NotImplemented, and the caller takes the full path.
CALL_SOURCE = """static PyTypeObject *gk_tensor_type = NULL;

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
