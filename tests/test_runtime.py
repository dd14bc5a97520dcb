"""Runtime behaviour: the compiled entry, output buffers, inputs of every layout, weights."""

import numpy as np
import pytest
from cells import Fn, MatMulChain, chain_reference, product_atol

import graphkernel
from graphkernel import Parameter, Tensor, nn
from graphkernel.frontend import context
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P
from graphkernel.runtime.plan import StepKind
from graphkernel.tools.lab import NetBasicFuse

ON = CompileOptions(enable_graph_kernel=True)


def expected(x):
    return ((x * 2.0) + 1.0) * 3.0


def test_fused_graph_has_a_compiled_entry(rng):
    x = rng.standard_normal((4, 4)).astype(np.float32)
    exe = graphkernel.compile(NetBasicFuse(), x, options=ON)
    assert exe.entry is not None
    np.testing.assert_allclose(exe.run_arrays(x)[0], expected(x), rtol=1e-6)


def test_results_held_by_the_caller_never_share_memory(rng):
    x = rng.standard_normal((64, 64)).astype(np.float32)
    exe = graphkernel.compile(NetBasicFuse(), x, options=ON)
    results = [exe.run_arrays(x * i)[0] for i in range(5)]
    for i, r in enumerate(results):
        np.testing.assert_allclose(r, expected(x * i), rtol=1e-6)
    addresses = {r.ctypes.data for r in results}
    assert len(addresses) == 5
    view = exe.run_arrays(x)[0][:2]  # only a view survives: its base must not be reused
    again = exe.run_arrays(x * 7)[0]
    np.testing.assert_allclose(view, expected(x)[:2], rtol=1e-6)
    np.testing.assert_allclose(again, expected(x * 7), rtol=1e-6)


def test_inputs_are_never_written(rng):
    x = rng.standard_normal((32, 8)).astype(np.float32)
    before = x.copy()
    exe = graphkernel.compile(NetBasicFuse(), x, options=ON)
    exe.run_arrays(x)
    exe(Tensor(x))
    np.testing.assert_array_equal(x, before)


def test_readonly_strided_and_fortran_inputs(rng):
    base = rng.standard_normal((8, 12)).astype(np.float32)
    exe = graphkernel.compile(NetBasicFuse(), base[:, :6], options=ON)
    readonly = base[:, :6].copy()
    readonly.setflags(write=False)
    fortran = np.asfortranarray(base[:, :6])
    strided = base[:, ::2]
    for x in (readonly, fortran, strided, base[:, :6]):
        np.testing.assert_allclose(exe.run_arrays(x)[0], expected(np.asarray(x)), rtol=1e-6)


def test_weights_are_read_at_call_time(rng):
    class Scale(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(np.ones((4,), np.float32), "w")
            self.mul = P.Mul()
            self.add = P.Add()

        def construct(self, x):
            return self.add(self.mul(x, self.w), 1.0)
    net = Scale()
    x = rng.standard_normal((3, 4)).astype(np.float32)
    context.set_context(enable_graph_kernel=True)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), x + 1, rtol=1e-6)
    net.w.set_data(np.full((4,), 2.0, np.float32))
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), 2 * x + 1, rtol=1e-6)
    assert len(net._compiled) == 1


def test_tuple_outputs_and_identity_outputs(rng):
    class Two(nn.Cell):
        def __init__(self):
            super().__init__()
            self.exp = P.Exp()

        def construct(self, x, y):
            return self.exp(x), y, self.exp(x)
    x, y = rng.standard_normal((3, 3)).astype(np.float32), np.ones((2,), np.float32)
    exe = graphkernel.compile(Two(), x, y, options=ON)
    a, b, c = exe(Tensor(x), Tensor(y))
    np.testing.assert_allclose(a.asnumpy(), np.exp(x), rtol=1e-6)
    np.testing.assert_array_equal(b.asnumpy(), y)
    np.testing.assert_allclose(c.asnumpy(), np.exp(x), rtol=1e-6)
    assert not np.shares_memory(a.asnumpy(), c.asnumpy())
    assert not np.shares_memory(b.asnumpy(), y)


def test_mixed_graph_results_held_never_share_memory(rng):
    class MatExp(nn.Cell):
        def __init__(self):
            super().__init__()
            self.mm, self.exp, self.mul = P.MatMul(), P.Exp(), P.Mul()

        def construct(self, a, b):
            return self.mul(self.exp(self.mm(a, b)), 2.0)
    a = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal((8, 16)).astype(np.float32) * 0.1
    exe = graphkernel.compile(MatExp(), a, b, options=ON)
    # The product calls BLAS from the C entry (backends/c/c_gemm.py); the Python step loop runs
    # the same plan with numpy's matmul. Neither hands out memory a held result still uses.
    assert exe.entry is not None
    runner = exe.executable.runner
    for run in (lambda x: exe.run_arrays(x, b)[0], lambda x: runner.run([x, b], [])[0]):
        results = [run(a * i) for i in range(4)]
        for i, r in enumerate(results):
            np.testing.assert_allclose(r, np.exp((a * i) @ b) * 2, rtol=1e-5)
        assert len({r.ctypes.data for r in results}) == 4


class AddTimesTwo(nn.Cell):
    def __init__(self):
        super().__init__()
        self.add, self.mul = P.Add(), P.Mul()

    def construct(self, x, y):
        return self.mul(self.add(x, y), 2.0)


def test_byte_swapped_inputs_are_read_by_value():
    # Issue 16: the compiled entry read '>f4' bytes as native floats ((x+y)*2 gave 2s), and the
    # Python path said "is float32[2, 3] but compiled for float32[2, 3]".
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.ones((2, 3), np.float32)
    want = (x + y) * 2
    for fusion in (True, False):
        exe = graphkernel.compile(AddTimesTwo(), x, y,
                                  options=CompileOptions(enable_graph_kernel=fusion))
        swapped = x.astype(">f4")
        np.testing.assert_array_equal(exe.run_arrays(swapped, y)[0], want)
        np.testing.assert_array_equal(exe.run_arrays(x, y.astype(">f4"))[0], want)
        np.testing.assert_array_equal(exe(Tensor(swapped), Tensor(y)).asnumpy(), want)
    np.testing.assert_array_equal(AddTimesTwo()(Tensor(x.astype(">f4")), Tensor(y)).asnumpy(),
                                  want)


class BoolLogic(nn.Cell):
    def __init__(self):
        super().__init__()
        self.land, self.eq, self.select = P.LogicalAnd(), P.Equal(), P.Select()

    def construct(self, a, b, x):
        both = self.land(a, b)
        same = self.eq(a, b)
        return self.select(both, x, x * 2.0), self.select(same, x, x * 3.0)


def test_bool_inputs_with_bytes_other_than_0_and_1_mean_true():
    # Issue 16: a uint8 view holding 2 as a bool gave different answers fused and unfused.
    rng = np.random.default_rng(5)
    raw_a = rng.integers(0, 4, size=(4, 8)).astype(np.uint8)
    raw_b = rng.integers(0, 3, size=(4, 8)).astype(np.uint8)
    a, b = raw_a.view(np.bool_), raw_b.view(np.bool_)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    ta, tb = raw_a != 0, raw_b != 0
    want = (np.where(ta & tb, x, x * 2), np.where(ta == tb, x, x * 3))
    for fusion in (True, False):
        exe = graphkernel.compile(BoolLogic(), ta, tb, x,
                                  options=CompileOptions(enable_graph_kernel=fusion))
        for got, expect in zip(exe.run_arrays(a, b, x), want):
            np.testing.assert_array_equal(got, expect)
        for got, expect in zip(exe(Tensor(a), Tensor(b), Tensor(x)), want):
            np.testing.assert_array_equal(got.asnumpy(), expect)


def _graph_with_assign(param):
    """x, weight w: w <- w + x after each call; returns (w + x) * 2 (built in the IR, as the
    training code's optimizers do)."""
    from graphkernel.ir.graph import Constant, Graph, Input, Node
    from graphkernel.ir.types import TensorType
    t = TensorType((3, 4), np.dtype(np.float32))
    x = Input(t, "x")
    w = Input(t, "w", kind="weight", binding=param)
    new = Node("Add", [w, x], {}, t)
    out = Node("Mul", [new, Constant(np.array(2.0, np.float32))], {}, t)
    graph = Graph("Accumulate", [x, w], [new, out], [out])
    graph.assigns = [(w, new)]
    return graph


def test_assigns_write_weights_in_place_fused_and_unfused(rng):
    from graphkernel.frontend.compile import compile_graph
    start = rng.standard_normal((3, 4)).astype(np.float32)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    for fusion in (True, False):
        param = Parameter(start, "w")
        own = param.asnumpy()
        exe = compile_graph(_graph_with_assign(param), "Accumulate",
                            CompileOptions(enable_graph_kernel=fusion))
        assert exe.entry is not None  # kernels (one per op unfused): the C entry
        # The kernel computing w + x writes it into w's array: no pooled result, no copy after.
        (writer,) = [s for s in exe.plan.steps if s.in_place]
        assert writer.in_place == ((writer.writes[0], exe.plan.weights[0]),)
        assert writer.writes[0] not in exe.plan.buffer_of
        assert not any(s.kind is StepKind.ASSIGN for s in exe.plan.steps)
        assert "written into $1:w" in exe.plan.describe() and "overwrites" in exe.plan.describe()
        first = exe(Tensor(x)).asnumpy()
        np.testing.assert_allclose(first, (start + x) * 2, rtol=1e-6)
        assert np.shares_memory(param.asnumpy(), own)  # written in place: the same array
        np.testing.assert_allclose(own, start + x, rtol=1e-6)
        second = exe.run_arrays(x)[0]
        np.testing.assert_allclose(second, (start + 2 * x) * 2, rtol=1e-6)
        np.testing.assert_allclose(param.asnumpy(), start + 2 * x, rtol=1e-6)
        np.testing.assert_array_equal(start, start.copy())  # the source array is untouched
    text = _graph_with_assign(Parameter(start, "w"))
    from graphkernel.ir.printer import print_graph
    assert "assign %para2_w <- %1" in print_graph(text)


def test_assigns_copied_after_the_call_when_a_later_step_reads_the_weight(rng):
    """w <- w + x, and a MatMul after that kernel reads the old w: the new value goes to a
    pooled buffer and is copied into w after the call (ASSIGN), fusion on and off."""
    from graphkernel.frontend.compile import compile_graph
    from graphkernel.ir.graph import Graph, Input, Node
    from graphkernel.ir.types import TensorType
    start = rng.standard_normal((3, 4)).astype(np.float32)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    for fusion in (True, False):
        param = Parameter(start, "w")
        t = TensorType((3, 4), np.dtype(np.float32))
        xi, w = Input(t, "x"), Input(t, "w", kind="weight", binding=param)
        new = Node("Add", [w, xi], {}, t)
        out = Node("MatMul", [w, xi], {"transpose_b": True}, TensorType((3, 3), t.dtype))
        graph = Graph("ReadAfter", [xi, w], [new, out], [out])
        graph.assigns = [(w, new)]
        exe = compile_graph(graph, "ReadAfter", CompileOptions(enable_graph_kernel=fusion))
        assert not any(s.in_place for s in exe.plan.steps)
        assert [s.kind for s in exe.plan.steps].count(StepKind.ASSIGN) == 1
        np.testing.assert_allclose(exe.run_arrays(x)[0], start @ x.T, rtol=1e-5,
                                   atol=product_atol(start, x.T))
        np.testing.assert_allclose(param.asnumpy(), start + x, rtol=1e-6)


@pytest.mark.parametrize("axis", [0, 1])
def test_a_column_reduction_writes_a_weight_in_place(rng, axis):
    """b <- b - 0.1 * sum(3 dy, axis) (a bias's update after its gradient): summed over rows
    (a column reduction: each block of columns summed, then its b stored last) one kernel
    writes b in place; summed along rows (a row reduction) the update is a pointwise kernel
    of its own, which does."""
    from graphkernel.frontend.compile import compile_graph
    from graphkernel.ir.graph import Constant, Graph, Input, Node
    from graphkernel.ir.types import TensorType
    shape = (37, 1030)
    n = shape[1 - axis]
    start = rng.standard_normal(n).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    param = Parameter(start, "b")
    t, tb = TensorType(shape, np.dtype(np.float32)), TensorType((n,), np.dtype(np.float32))
    x, b = Input(t, "dy"), Input(tb, "b", kind="weight", binding=param)
    scaled = Node("Mul", [x, Constant(np.array(3.0, np.float32))], {}, t)
    total = Node("ReduceSum", [scaled], {"axis": (np.int64(axis),),
                                         "keep_dims": np.bool_(False)}, tb)
    step = Node("Mul", [total, Constant(np.array(0.1, np.float32))], {}, tb)
    new = Node("Sub", [b, step], {}, tb)
    graph = Graph("Update", [x, b], [scaled, total, step, new], [total])
    graph.assigns = [(b, new)]
    exe = compile_graph(graph, "Update", CompileOptions(enable_graph_kernel=True))
    (writer,) = [s for s in exe.plan.steps if s.in_place]
    assert ("ReduceSum" in writer.op_names) is (axis == 0)
    assert len(exe.kernels) == (1 if axis == 0 else 2)
    assert StepKind.ASSIGN not in [s.kind for s in exe.plan.steps]
    got = exe.run_arrays(dy)[0]
    want = 3 * dy.astype(np.float64).sum(axis)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(param.asnumpy(), start - 0.1 * want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("read_after_the_sum", [False, True])
def test_a_full_size_weight_beside_a_column_sum_is_written_in_place_by_the_first_pass(
        rng, read_after_the_sum):
    """w <- w - 0.1 g beside db = sum over rows of 3 g: one column-reduction kernel whose first
    pass stores the new w (backends/c/c_reduce.py), so w is written in place. When the kernel
    also returns w * db, its last pass reads w after the first pass stored the new one: then
    the new w is copied after the call."""
    from graphkernel.frontend.compile import compile_graph
    from graphkernel.ir.graph import Constant, Graph, Input, Node
    from graphkernel.ir.types import TensorType
    shape = (37, 1030)
    start = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    param = Parameter(start, "w")
    t, tb = TensorType(shape, np.dtype(np.float32)), TensorType(shape[1:], np.dtype(np.float32))
    x, w = Input(t, "g"), Input(t, "w", kind="weight", binding=param)
    summand = Node("Mul", [x, Constant(np.array(3.0, np.float32))], {}, t)
    total = Node("ReduceSum", [summand], {"axis": (np.int64(0),),
                                          "keep_dims": np.bool_(False)}, tb)
    step = Node("Mul", [x, Constant(np.array(0.1, np.float32))], {}, t)
    new = Node("Sub", [w, step], {}, t)
    scaled = Node("Mul", [w, total], {}, t)
    nodes, outputs = [summand, total, step, new], [total]
    if read_after_the_sum:
        nodes, outputs = nodes + [scaled], outputs + [scaled]
    graph = Graph("Update", [x, w], nodes, outputs)
    graph.assigns = [(w, new)]
    exe = compile_graph(graph, "Update", CompileOptions(enable_graph_kernel=True))
    assert len(exe.kernels) == 1
    assert bool(exe.plan.steps[0].in_place) is not read_after_the_sum
    got = exe.run_arrays(g)
    want = (3.0 * g.astype(np.float64)).sum(0)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-4)
    if read_after_the_sum:  # the old w
        np.testing.assert_allclose(got[1], start * want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(param.asnumpy(), start - np.float32(0.1) * g, rtol=1e-6)


def test_parameters_own_their_arrays():
    source = np.ones((4,), np.float32)
    p = Parameter(source, "p")
    assert p.asnumpy() is not source
    source[:] = 5
    np.testing.assert_array_equal(p.asnumpy(), np.ones((4,), np.float32))


def test_unfused_ops_run_one_kernel_each(rng):
    """Fusion off: a composite op (GeLU), an elementwise op without a numpy ufunc (Erf) and one
    with (Add) run as one generated kernel each, and so does a sum (declared `kernel_alone`,
    single_op.py); another reduction (ReduceMax) stays a numpy call, and its plan then has
    no compiled entry."""
    class Ops(nn.Cell):
        def __init__(self):
            super().__init__()
            self.gelu, self.erf, self.add = P.GeLU(approximate="none"), P.Erf(), P.Add()
            self.sum, self.max = P.ReduceSum(keep_dims=True), P.ReduceMax(keep_dims=True)

        def construct(self, x):
            y = self.add(self.erf(self.gelu(x)), 1.0)
            return y, self.sum(y, 1), self.max(y, 0)
    x = rng.standard_normal((64, 48)).astype(np.float32)
    off = graphkernel.compile(Ops(), x, options=CompileOptions(enable_graph_kernel=False))
    assert [(k.op_names, k.backend) for k in off.kernels] == [
        (["GeLU"], "native"), (["Erf"], "native"), (["Add"], "native"),
        (["ReduceSum"], "native"), (["ReduceMax"], "library")]
    assert [n.op for n in off.graph.nodes] == ["GeLU", "Erf", "Add", "ReduceSum", "ReduceMax"]
    from graphkernel.runtime.reference import run_reference_graph
    want = run_reference_graph(off.graph, [x])
    for got, ref in zip(off.run_arrays(x), want):
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-5)
    assert off.entry is None  # the numpy step: the Python runner
    alone = graphkernel.compile(Fn(lambda v: P.ReduceSum()(P.Add()(P.Erf()(v), 1.0), 1)), x,
                                options=CompileOptions(enable_graph_kernel=False))
    assert alone.kernel_count == 3 and alone.entry is not None


class TwoProducts(nn.Cell):
    def __init__(self, small: np.ndarray, large: np.ndarray) -> None:
        super().__init__()
        self.small, self.large = Parameter(small), Parameter(large)
        self.matmul = P.MatMul()

    def construct(self, x, y):
        return P.ReLU()(self.matmul(x, self.small)), self.matmul(y, self.large)


def test_small_products_run_blas_on_one_thread_and_leave_blas_as_it_was(rng):
    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    small = rng.standard_normal((64, 256)).astype(np.float32)
    large = rng.standard_normal((256, 256)).astype(np.float32)
    x = rng.standard_normal((32, 64)).astype(np.float32)  # 32*256*64: below the threshold
    y = rng.standard_normal((128, 256)).astype(np.float32)  # 128*256*256: above it
    for fusion in (True, False):
        exe = graphkernel.compile(TwoProducts(small, large), Tensor(x), Tensor(y),
                                  options=CompileOptions(enable_graph_kernel=fusion))
        steps = {s.name: s.blas_threads for s in exe.plan.steps if s.op == "MatMul"}
        assert sorted(steps.values(), key=str) == [1, None], steps
        assert "blas_threads=1" in exe.plan.describe()
        before = blas_threads()
        a, b = exe(Tensor(x), Tensor(y))
        assert blas_threads() == before  # put back after the product
        np.testing.assert_allclose(a.asnumpy(), np.maximum(x @ small, 0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(b.asnumpy(), y @ large, rtol=1e-5, atol=1e-4)


def test_an_nd_operand_times_a_matrix_is_one_gemm_over_all_its_rows(rng):
    from graphkernel.ir.opdefs.matmul import as_rows, matmul_into

    b = rng.standard_normal((48, 40)).astype(np.float32)
    dense = rng.standard_normal((3, 5, 7, 48)).astype(np.float32)
    rows = as_rows(dense)
    assert rows is not None and rows.shape == (105, 48) and np.shares_memory(rows, dense)
    np.testing.assert_allclose(matmul_into(dense, b), np.matmul(dense, b), rtol=1e-5, atol=1e-5)
    # Rows that do not merge in place (every other row, a transposed view) stay batched; unit
    # axes never block a merge; results written through a strided view land where they belong.
    for a in (dense[:, :, ::2], dense.transpose(1, 0, 2, 3)):
        assert as_rows(a) is None
        np.testing.assert_allclose(matmul_into(a, b), np.matmul(a, b), rtol=1e-5, atol=1e-5)
    assert as_rows(dense[:, None]) is not None and as_rows(dense[:1, 2:3]) is not None
    for big, window, merges in ((np.zeros((3, 5, 7, 80), np.float32), np.s_[:, :], True),
                                (np.zeros((3, 10, 7, 80), np.float32), np.s_[:, ::2], False)):
        out = big[window][..., 20:60]
        assert (as_rows(out) is not None) == merges  # a column window keeps one row stride
        matmul_into(dense, b, out=out)
        np.testing.assert_allclose(out, np.matmul(dense, b), rtol=1e-5, atol=1e-5)
        assert not big[..., :20].any() and not big[..., 60:].any()
        assert np.count_nonzero(big) == np.count_nonzero(out)


class Dense3d(nn.Cell):
    def __init__(self, w: np.ndarray) -> None:
        super().__init__()
        self.dense = nn.Dense(w.shape[1], w.shape[0], weight_init=Tensor(w), has_bias=False)

    def construct(self, x):
        return P.ReLU()(self.dense(x))


def test_a_dense_over_3d_input_counts_all_rows_when_choosing_blas_threads(rng):
    w = rng.standard_normal((64, 64)).astype(np.float32)
    x = rng.standard_normal((8, 128, 64)).astype(np.float32)  # 8*128 rows x 64 x 64 >= 2^22
    for fusion in (True, False):
        exe = graphkernel.compile(Dense3d(w), Tensor(x),
                                  options=CompileOptions(enable_graph_kernel=fusion))
        (step,) = [s for s in exe.plan.steps if s.op == "MatMul"]
        assert step.blas_threads is None  # one GEMM of 1024 rows: BLAS's own threads
        np.testing.assert_allclose(exe(Tensor(x)).asnumpy(), np.maximum(x @ w.T, 0),
                                   rtol=1e-5, atol=1e-5)
    small = graphkernel.compile(Dense3d(w), Tensor(x[:2]))  # 256 rows: below the threshold
    assert [s.blas_threads for s in small.plan.steps if s.op == "MatMul"] == [1]


def test_the_blas_lookup_runs_while_the_plan_compiles(rng, monkeypatch):
    import threading

    from graphkernel.runtime import blas

    monkeypatch.setattr(blas, "_state", {})  # as in a new process
    x = rng.standard_normal((128, 128)).astype(np.float32)
    w = rng.standard_normal((128, 128)).astype(np.float32) * 0.1
    exe = graphkernel.compile(MatMulChain(), x, w, options=ON)
    assert any(step.blas_threads is not None for step in exe.executable.runner.plan.steps)
    for thread in threading.enumerate():
        if thread.name == "graphkernel-blas-lookup":
            thread.join()
    assert "openblas" in blas._state or "blas" in blas._state  # found before the first call
    flat, last = exe.run_arrays(x, w)
    np.testing.assert_allclose(last, chain_reference(x, w)[1], rtol=1e-4, atol=1e-6)
