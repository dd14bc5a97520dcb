"""MatMul and BatchMatMul called from the compiled entry (backends/c/c_gemm.py), Gather copied by
it (backends/c/c_gather.py) and Argmax as a generated kernel (backends/c/c_argmax.py): a plan of
kernels, products and lookups is one C call. Each case runs through the entry and through the
Python runner (numpy) and both are compared with numpy on random inputs, fused and unfused;
layouts BLAS cannot take keep the Python runner."""
import numpy as np
import pytest
from cells import OFF, ON, Fn

import graphkernel
from graphkernel import Tensor
from graphkernel.backends.c import cblas
from graphkernel.backends.c.c_entry import reshape_view
from graphkernel.backends.c.c_gemm import gemm_call
from graphkernel.ops import operations as P


def relu(x):
    return P.ReLU()(x)  # a kernel after the product: the plan has a library to hold the entry


def run_both(exe, *arrays):
    """The results through the compiled entry and through the Python runner's steps."""
    ex = exe.executable
    by_entry = exe(*map(Tensor, arrays))
    by_entry = [t.asnumpy() for t in (by_entry if isinstance(by_entry, tuple) else (by_entry,))]
    by_steps = ex.runner.run(ex.check_inputs(list(arrays)), exe._weights())
    return by_entry, by_steps


CASES = {
    "2d": (lambda a, b: relu(P.MatMul()(a, b)), lambda a, b: np.maximum(a @ b, 0),
           [(7, 5), (5, 3)]),
    "transposes": (lambda a, b: relu(P.MatMul(transpose_a=True, transpose_b=True)(a, b)),
                   lambda a, b: np.maximum(a.T @ b.T, 0), [(5, 7), (3, 5)]),
    "dense over 3d": (lambda a, b: relu(P.MatMul(transpose_b=True)(a, b)),
                      lambda a, b: np.maximum(a @ b.T, 0), [(4, 6, 5), (3, 5)]),
    "3d transposed": (lambda a, b: relu(P.MatMul(transpose_a=True)(a, b)),
                      lambda a, b: np.maximum(np.swapaxes(a, -1, -2) @ b, 0),
                      [(4, 5, 6), (5, 3)]),
    "batch broadcast": (lambda a, b: relu(P.BatchMatMul(transpose_b=True)(a, b)),
                        lambda a, b: np.maximum(a @ np.swapaxes(b, -1, -2), 0),
                        [(2, 3, 4, 5), (3, 6, 5)]),
    "matrix times stack": (lambda a, b: relu(P.BatchMatMul()(a, b)),
                           lambda a, b: np.maximum(a @ b, 0), [(4, 5), (3, 5, 2)]),
    "attention heads": (lambda a, b: relu(P.BatchMatMul(transpose_b=True)(a, b)),
                        lambda a, b: np.maximum(a @ np.swapaxes(b, -1, -2), 0),
                        [(4, 8, 64, 40), (4, 8, 64, 40)]),
    "row of 3d": (lambda a, b: relu(P.MatMul(transpose_b=True)(a[:, 0], b)),
                  lambda a, b: np.maximum(a[:, 0] @ b.T, 0), [(3, 5, 7), (4, 7)]),
    "slice": (lambda a, b: relu(P.MatMul(transpose_a=True)(P.Slice()(a, (2, 1), (5, 6)), b)),
              lambda a, b: np.maximum(a[2:7, 1:7].T @ b, 0), [(9, 11), (5, 3)]),
    "head merge": (lambda a, b, c: relu(P.MatMul()(P.Reshape()(P.Transpose()(
        P.BatchMatMul()(a, b), (0, 2, 1, 3)), (2, 7, 15)), c)),
        lambda a, b, c: np.maximum((a @ b).transpose(0, 2, 1, 3).reshape(2, 7, 15) @ c, 0),
        [(2, 5, 7, 7), (2, 5, 7, 3), (15, 4)]),
}


LAYOUT_CASES = ("row of 3d", "slice", "head merge")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_products_run_from_the_entry_as_numpy_does(case, dtype, rng):
    fn, want, shapes = CASES[case]
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    expected = want(*arrays)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for options in (ON, OFF):
        exe = graphkernel.compile(Fn(fn), *arrays, options=options)
        products = [s for s in exe.plan.steps if s.op in ("MatMul", "BatchMatMul")]
        assert products and all(gemm_call(exe.plan, s) is not None for s in products)
        # Unfused, a layout op is a numpy view step of its own: that plan keeps the Python
        # runner; fused, the product reads and writes through it.
        views = any(s.kind.value == "view" for s in exe.plan.steps)
        assert views == (options is OFF and case in LAYOUT_CASES), exe.plan.describe()
        # A view the entry cannot make (numpy's strided ones; a lone Transpose is a kernel,
        # graph_kernel/single_op.py) keeps the Python runner; a Reshape view does not.
        numpy_views = any(s.kind.value == "view" and reshape_view(exe.plan, s) is None
                          for s in exe.plan.steps)
        assert (exe.executable.runner.entry is not None) == (not numpy_views), \
            exe.plan.describe()
        by_entry, by_steps = run_both(exe, *arrays)
        for got in (by_entry[0], by_steps[0]):
            assert got.dtype == dtype
            np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


def test_the_row_merge_and_the_blas_layouts_of_a_step(rng):
    a = rng.standard_normal((4, 6, 5)).astype(np.float32)
    b = rng.standard_normal((3, 5)).astype(np.float32)
    exe = graphkernel.compile(Fn(CASES["dense over 3d"][0]), a, b, options=ON)
    (step,) = [s for s in exe.plan.steps if s.op == "MatMul"]
    call = gemm_call(exe.plan, step)
    assert call is not None and (call.m, call.n, call.k, call.batch) == (24, 3, 5, ())
    assert (call.a.trans, call.a.ld, call.b.trans, call.b.ld, call.c.ld) == (False, 5, True, 5, 3)
    p = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    q = rng.standard_normal((3, 6, 5)).astype(np.float32)
    exe = graphkernel.compile(Fn(CASES["batch broadcast"][0]), p, q, options=ON)
    (step,) = [s for s in exe.plan.steps if s.op == "BatchMatMul"]
    call = gemm_call(exe.plan, step)
    assert call is not None and call.batch == (2, 3) and (call.m, call.n, call.k) == (4, 6, 5)
    assert call.b.batch_strides == (0, 30)  # q's one stack, read again for each p[i]


def test_many_small_products_split_their_batch_over_threads(rng):
    a, b = (rng.standard_normal((4, 8, 64, 40)).astype(np.float32) for _ in range(2))
    exe = graphkernel.compile(Fn(CASES["attention heads"][0]), a, b, options=ON)
    (step,) = [s for s in exe.plan.steps if s.op == "BatchMatMul"]
    call = gemm_call(exe.plan, step)
    assert call is not None and call.one_thread and call.batch == (4, 8)
    source = exe.executable.library.source
    assert "for (int64_t gk_b = 0; gk_b < 32; ++gk_b)" in source  # one loop, on threads
    small = graphkernel.compile(Fn(CASES["attention heads"][0]), a[:1], b[:1], options=ON)
    assert "gk_b = 0" not in small.executable.library.source  # 8 products: the calling thread


def test_layouts_blas_cannot_take_keep_the_python_runner(rng):
    x = rng.standard_normal((6, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    ints = graphkernel.compile(Fn(lambda t, v: relu(P.MatMul()(t, v))), x.astype(np.int32),
                               w.astype(np.int32), options=ON)
    assert ints.executable.runner.entry is None  # no integer GEMM in BLAS
    np.testing.assert_array_equal(ints(Tensor(x.astype(np.int32)), Tensor(w.astype(np.int32)))
                                  .asnumpy(), np.maximum(x.astype(np.int32) @
                                                         w.astype(np.int32), 0))


def test_without_numpys_openblas_the_python_runner_calls_numpy(monkeypatch, rng):
    monkeypatch.setattr(cblas, "cblas", lambda: None)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in [(7, 5), (5, 3)])
    exe = graphkernel.compile(Fn(CASES["2d"][0]), a, b, options=ON)
    assert exe.executable.runner.entry is None
    np.testing.assert_allclose(exe(Tensor(a), Tensor(b)).asnumpy(), np.maximum(a @ b, 0),
                               rtol=1e-5, atol=1e-5)


def test_a_small_product_from_the_entry_leaves_blas_threads_as_they_were(rng):
    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    a, b = (rng.standard_normal(s).astype(np.float32) for s in [(32, 64), (64, 16)])
    exe = graphkernel.compile(Fn(CASES["2d"][0]), a, b, options=ON)
    assert [s.blas_threads for s in exe.plan.steps if s.op == "MatMul"] == [1]
    assert exe.executable.runner.entry is not None
    before = blas_threads()
    exe(Tensor(a), Tensor(b))
    assert blas_threads() == before


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("shape,axis", [((7, 10), -1), ((3, 5, 4), 1), ((6,), 0),
                                        ((4, 3, 2), 0)])
def test_argmax_is_a_kernel_and_returns_numpys_index(shape, axis, dtype, rng):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    if x.dtype.kind == "f":  # the first NaN wins, as in numpy; ties go to the first maximum
        x.flat[::7] = np.nan
        x.flat[3::11] = np.inf
    else:
        x.flat[1::5] = x.max()
    for options in (ON, OFF):
        exe = graphkernel.compile(Fn(lambda v: P.Argmax(axis=axis)(v)), x, options=options)
        assert [s.kind.value for s in exe.plan.steps] == ["kernel"]
        got = exe(Tensor(x)).asnumpy()
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, np.argmax(x, axis=axis))


def test_a_large_argmax_stays_numpys(rng):
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    exe = graphkernel.compile(Fn(lambda v: P.Argmax()(v)), x, options=ON)
    assert [s.kind.value for s in exe.plan.steps] == ["library"]
    np.testing.assert_array_equal(exe(Tensor(x)).asnumpy(), np.argmax(x, axis=-1))


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("axis", [0, 1])
def test_a_gather_of_input_indices_runs_in_the_entry(axis, index_dtype, rng):
    table = rng.standard_normal((6, 5, 4)).astype(np.float32)
    ids = rng.integers(0, table.shape[axis], (3, 2)).astype(index_dtype)

    def fn(t, i):
        return relu(P.Gather()(t, i, axis))

    want = np.maximum(np.take(table, ids, axis=axis), 0)
    exe = graphkernel.compile(Fn(fn), table, ids, options=ON)
    (step,) = [s for s in exe.plan.steps if s.op == "Gather"]
    assert step.pooled and exe.executable.runner.entry is not None
    for got in run_both(exe, table, ids):
        np.testing.assert_array_equal(got[0], want)


def test_an_index_out_of_range_is_the_same_error_through_the_entry(rng):
    from graphkernel.errors import ShapeError

    table = rng.standard_normal((6, 4)).astype(np.float32)
    exe = graphkernel.compile(Fn(lambda t, i: relu(P.Gather()(t, i, 0))), table,
                              np.array([1, 2], np.int32), options=ON)
    assert exe.executable.runner.entry is not None
    for bad in (6, -1):
        with pytest.raises(ShapeError, match=f"index {bad} is out of range"):
            exe(Tensor(table), Tensor(np.array([1, bad], np.int32)))


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_negative_indices_of_a_gather_declared_so_run_in_the_entry(index_dtype, rng):
    """ONNX's Gather: -6..-1 are rows from the end, checked and wrapped by the entry itself."""
    from graphkernel.errors import ShapeError

    table = rng.standard_normal((6, 4)).astype(np.float32)
    ids = np.array([[-1, 2], [-6, 5]], index_dtype)
    exe = graphkernel.compile(Fn(lambda t, i: relu(P.Gather(negative_indices=True)(t, i, 0))),
                              table, ids, options=ON)
    runner = exe.executable.runner
    assert runner.entry is not None
    for got in run_both(exe, table, ids):
        np.testing.assert_array_equal(got[0], np.maximum(table[ids], 0))
    # the entry itself took them (it declines what it cannot check: NotImplemented)
    by_entry = runner.entry(table, ids, *exe._weights(), *runner.entry_constants)
    np.testing.assert_array_equal(by_entry, np.maximum(table[ids], 0))
    for bad in (6, -7):
        with pytest.raises(ShapeError, match=f"index {bad} is out of range"):
            exe(Tensor(table), Tensor(np.array([[1, bad], [0, 0]], index_dtype)))


def test_indices_computed_in_the_graph_are_checked_by_the_entrys_step(rng):
    """The step checks them before it copies; a bad one hands the call back (NotImplemented)
    after the steps before it ran, and the Python runner raises its error."""
    from graphkernel.errors import ShapeError

    table = rng.standard_normal((6, 4)).astype(np.float32)
    ids = np.array([[0, 2], [5, 1]], np.int32)
    exe = graphkernel.compile(Fn(lambda t, i: relu(P.Gather()(t, P.Add()(i, 0), 0))), table,
                              ids, options=ON)
    runner = exe.executable.runner
    assert runner.entry is not None
    for got in run_both(exe, table, ids):
        np.testing.assert_array_equal(got[0], np.maximum(table[ids], 0))
    bad = np.array([[0, 2], [6, 1]], np.int32)
    assert runner.entry(table, bad, *exe._weights(), *runner.entry_constants) is NotImplemented
    with pytest.raises(ShapeError, match="index 6 is out of range"):
        exe(Tensor(table), Tensor(bad))


def test_the_entry_calls_numpys_own_openblas_when_scipys_is_listed_first(monkeypatch):
    import ctypes

    import scipy.linalg  # noqa: F401  (scipy's wheel loads an OpenBLAS of its own)
    from threadpoolctl import ThreadpoolController

    from graphkernel.backends.c.cblas import cblas
    from graphkernel.runtime import blas
    loaded = ThreadpoolController().select(internal_api="openblas").lib_controllers
    numpys = [c for c in loaded if blas._numpys(c.filepath)]
    others = [c for c in loaded if not blas._numpys(c.filepath)]
    if not numpys or not others:
        pytest.skip("needs numpy's wheel OpenBLAS and another one loaded")
    # threadpoolctl lists libraries in load order; after dask's tests scipy's came first. The
    # lookup by numpy's own folder is set aside: this is the threadpoolctl way, as taken when
    # numpy's library cannot be opened there.
    monkeypatch.setattr(blas, "_state", {"blas": others + numpys})
    monkeypatch.setattr(blas, "_numpys_wheel_openblas", lambda: None)
    found = cblas()
    assert found is not None
    names = [n for n in ("scipy_cblas_sgemm64_", "cblas_sgemm") if hasattr(numpys[0].dynlib, n)]
    assert found.sgemm == ctypes.cast(getattr(numpys[0].dynlib, names[0]), ctypes.c_void_p).value


def test_numpys_wheel_openblas_is_found_without_scanning_every_library(monkeypatch):
    from graphkernel.backends.c.cblas import cblas
    from graphkernel.runtime import blas
    monkeypatch.setattr(blas, "_state", {})
    if blas._numpys_wheel_openblas() is None:
        pytest.skip("numpy's BLAS is not the OpenBLAS of its wheel")
    fast = cblas()
    assert fast is not None and "blas" not in blas._state  # no threadpoolctl scan
    monkeypatch.setattr(blas, "_numpys_wheel_openblas", lambda: None)
    monkeypatch.setattr(blas, "_state", {})
    assert cblas() == fast  # threadpoolctl's scan finds the same functions


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_sized_products_split_over_openmps_threads(dtype, rng, monkeypatch):
    """A batch of small products (attention's heads) runs one-thread BLAS calls split over
    OpenMP's threads, never BLAS's own pool or its batch GEMM; the scores (B transposed) and the
    context product written through the head merge's view, as numpy computes them. (Lowering's
    attention step, tests/test_fused_attention.py, is off: this is about the products.)"""
    from graphkernel.graph_kernel import lower
    monkeypatch.setattr(lower, "attention_blocks", lambda graph, views: ({}, {}))
    q, k, v = (rng.standard_normal((2, 4, 128, 64)).astype(dtype) for _ in range(3))

    def attention(q, k, v):
        scores = P.Softmax()(P.BatchMatMul(transpose_b=True)(q, k))
        return relu(P.Reshape()(P.Transpose()(P.BatchMatMul()(scores, v), (0, 2, 1, 3)),
                                (2, 128, 256)))

    def want(q, k, v):
        s = q @ np.swapaxes(k, -1, -2)
        e = np.exp(s - s.max(-1, keepdims=True))
        ctx = (e / e.sum(-1, keepdims=True)) @ v
        return np.maximum(ctx.transpose(0, 2, 1, 3).reshape(2, 128, 256), 0)

    exe = graphkernel.compile(Fn(attention), q, k, v, options=ON)
    products = [s for s in exe.plan.steps if s.op == "BatchMatMul"]
    assert len(products) == 2 and all(gemm_call(exe.plan, s).one_thread for s in products)
    source = exe.executable.library.source
    assert "gemm_batch" not in source and exe.executable.runner.entry is not None
    assert source.count("#pragma omp parallel for schedule(dynamic, 1)\n    for (int64_t gk_b") == 2
    tol = 1e-5 if dtype == np.float32 else 1e-12
    by_entry, by_steps = run_both(exe, q, k, v)
    for got in (by_entry[0], by_steps[0]):
        np.testing.assert_allclose(got, want(q, k, v), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(300, 256, 100), (24, 256, 1000)], ids=["rows", "columns"])
def test_a_large_product_is_split_over_openmps_threads(dtype, shape, rng, monkeypatch):
    """A product not held to one thread runs one-thread BLAS on OpenMP's threads, chunks of
    rows (or columns, the longer side) handed out as threads come free (tests/test_threads.py),
    BLAS's own threads put back after it: the same result as numpy's, and BLAS's thread count
    as it was. (graphkernel's packed-B kernel, which would take the float32 one, is off here:
    tests/test_packed_products.py.)"""
    from graphkernel.backends.c import c_gemm_packed
    from graphkernel.runtime import blas
    monkeypatch.setattr(c_gemm_packed, "PACKED_PRODUCT_MIN_MNK", 0)
    m, k, n = shape
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    exe = graphkernel.compile(Fn(lambda a, b: relu(P.MatMul()(a, b))), a, b, options=ON)
    (step,) = [s for s in exe.plan.steps if s.op == "MatMul"]
    call = gemm_call(exe.plan, step)
    assert step.blas_threads is None and not call.one_thread
    source = exe.executable.library.source
    assert "schedule(dynamic, 1)\n      for (int64_t gk_chunk" in source and \
        exe.executable.runner.entry is not None
    assert ("gk_hi - gk_lo, " + str(n) if m >= n else str(m) + ", gk_hi - gk_lo") in source
    before = blas.threads_now()
    tol = 1e-4 if dtype == np.float32 else 1e-12
    by_entry, by_steps = run_both(exe, a, b)
    assert blas.threads_now() == before
    for got in (by_entry[0], by_steps[0]):
        np.testing.assert_allclose(got, np.maximum(a @ b, 0), rtol=tol, atol=tol)


def test_reshapes_of_an_input_and_of_the_result_run_in_the_entry(rng):
    """An input flattened for a Dense and the result given its shape back (an encoder's first
    and last Reshape) are views the entry makes; the result is returned without a copy."""
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)
    w = rng.standard_normal((8, 8)).astype(np.float32)

    def net(x, w):
        flat = P.Reshape()(x, (24, 8))
        return P.Reshape()(relu(P.MatMul()(flat, w)), (4, 6, 8))

    for options in (ON, OFF):
        exe = graphkernel.compile(Fn(net), x, w, options=options)
        assert exe.executable.runner.entry is not None, exe.plan.describe()
        assert exe.plan.copy_out == (False,)
        by_entry, by_steps = run_both(exe, x, w)
        for got in (by_entry[0], by_steps[0]):
            assert got.shape == (4, 6, 8)
            np.testing.assert_allclose(got, np.maximum(x.reshape(24, 8) @ w, 0).reshape(4, 6, 8),
                                       rtol=1e-5, atol=1e-5)
        first = exe(Tensor(x), Tensor(w)).asnumpy()
        second = exe(Tensor(x * 2), Tensor(w)).asnumpy()  # the first result's memory is kept
        assert not np.shares_memory(first, second)
        np.testing.assert_allclose(first * 2, second, rtol=1e-5, atol=1e-5)


def test_views_of_inputs_or_of_other_results_are_still_copied(rng):
    x = rng.standard_normal((6, 4)).astype(np.float32)
    exe = graphkernel.compile(Fn(lambda t: (P.Reshape()(t, (24,)), relu(t))), x, options=ON)
    assert exe.plan.copy_out[0]  # a view of the caller's own input
    flat, _ = exe.run_arrays(x)
    assert not np.shares_memory(flat, x)
    both = graphkernel.compile(Fn(lambda t: (relu(t), P.Reshape()(relu(t), (24,)))), x,
                               options=ON)
    first, second = both.run_arrays(x)
    assert not np.shares_memory(first, second)  # one value returned twice, as two arrays
    np.testing.assert_array_equal(first.reshape(-1), second)


def test_graphs_with_the_same_kernels_keep_their_own_entry_modules(rng):
    """Two graphs whose kernels are the same C but whose entries differ (the arguments
    swapped) name their entry modules apart (backends/c/library.py, after the kernels' and the
    entry's source): named after the kernels alone, CPython gave a graph compiled again the
    other graph's module, its `call` from the other library. Compiled in turns, each graph's
    runner keeps one module for `run` and `call`, and each answers its own graph."""
    x = rng.standard_normal((4, 8)).astype(np.float32)
    y = rng.standard_normal((4, 8)).astype(np.float32)
    graphs = {"a-b": (lambda a, b: P.Exp()(P.Sub()(a, b)), np.exp(x - y)),
              "b-a": (lambda a, b: P.Exp()(P.Sub()(b, a)), np.exp(y - x))}
    names = {}
    for key in ["a-b", "b-a", "a-b", "b-a"]:
        fn, want = graphs[key]
        exe = graphkernel.compile(Fn(fn), x, y, options=ON)
        runner = exe.executable.runner
        assert [k.name for k in exe.kernels] == ["Fused_Sub_Exp"]
        module = runner.entry_module
        names.setdefault(key, module.__name__)
        assert module.__name__ == names[key]
        assert runner._entries[0].__self__ is module and module.call.__self__ is module
        np.testing.assert_allclose(exe(Tensor(x), Tensor(y)).asnumpy(), want, rtol=1e-6)
    assert names["a-b"] != names["b-a"]
