"""Layout ops folded into the MatMuls next to them (graph_kernel/library_views.py): operands read
and results written through strided views, so a slice, a Flatten or a head merge launches
nothing. Fused against unfused against numpy on odd shapes, launches counted, and the cases that
must stay a step of their own (a reversed slice, a transposed result, a second reader)."""
import numpy as np
import pytest
from cells import OFF, ON, Fn

import graphkernel
from graphkernel.graph_kernel.library_views import NOTE
from graphkernel.ir.printer import print_graph
from graphkernel.ops import operations as P

LAYOUT = {"Transpose", "Reshape", "Slice", "StridedSlice", "BroadcastTo", "ExpandDims",
          "Squeeze"}


def check(fn, want, *arrays):
    """Compile fused and unfused, compare both with numpy; return the fused executable."""
    on = graphkernel.compile(Fn(fn), *arrays, options=ON)
    off = graphkernel.compile(Fn(fn), *arrays, options=OFF)
    expected = want(*arrays)
    for exe in (on, off):
        got = exe.run_arrays(*arrays)
        got = got if isinstance(expected, tuple) else got[0]
        for g, w in zip(got if isinstance(expected, tuple) else [got],
                        expected if isinstance(expected, tuple) else [expected]):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    # With fusion off every layout op is a launch of its own.
    assert not any(NOTE in n.notes for n in off.report.stages["hwopt_d_end"].nodes)
    return on


def alone(exe):
    """Launches that are only layout ops."""
    return [k.op_names for k in exe.kernels if set(k.op_names) <= LAYOUT]


def test_matmul_reads_a_row_of_a_3d_tensor(rng):
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    w = rng.standard_normal((4, 7)).astype(np.float32)
    on = check(lambda t, v: P.MatMul(transpose_b=True)(t[:, 0], v), lambda t, v: t[:, 0] @ v.T,
               x, w)
    assert alone(on) == [] and [k.op_names for k in on.kernels] == [["StridedSlice", "MatMul"]]
    text = print_graph(on.report.stages["hwopt_d_end"])
    assert f"{NOTE}: reads input 0 as StridedSlice" in text


@pytest.mark.parametrize("transpose_a", [False, True])
def test_matmul_reads_a_slice_with_a_row_stride(transpose_a, rng):
    x = rng.standard_normal((9, 11)).astype(np.float32)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    # rows 1..6 step 1, columns 2..7: a matrix whose row stride (11) exceeds its width.
    if transpose_a:
        def fn(t, v):
            return P.MatMul(transpose_a=True)(P.Slice()(t, (2, 1), (5, 6)), v)

        def want(t, v):
            return t[2:7, 1:7].T @ v
        x = rng.standard_normal((9, 11)).astype(np.float32)
        w = rng.standard_normal((5, 3)).astype(np.float32)
    else:
        def fn(t, v):
            return P.MatMul()(P.Slice()(t, (1, 2), (6, 5)), v)

        def want(t, v):
            return t[1:7, 2:7] @ v
    on = check(fn, want, x, w)
    assert alone(on) == [], on.summary()
    assert on.kernel_count == 1


def test_flatten_before_a_matmul_is_a_view(rng):
    x = rng.standard_normal((5, 3, 2, 3)).astype(np.float32)
    w = rng.standard_normal((18, 7)).astype(np.float32)
    on = check(lambda t, v: P.MatMul()(P.Reshape()(P.ReLU()(t), (5, 18)), v),
               lambda t, v: np.maximum(t, 0).reshape(5, 18) @ v, x, w)
    assert alone(on) == [] and on.kernel_count == 2, on.summary()


@pytest.mark.parametrize("batch,heads,seq,size", [(3, 5, 7, 3), (1, 1, 1, 1), (2, 3, 1, 4)])
def test_head_merge_is_written_by_the_batch_matmul(batch, heads, seq, size, rng):
    p = rng.standard_normal((batch, heads, seq, seq)).astype(np.float32)
    v = rng.standard_normal((batch, heads, seq, size)).astype(np.float32)
    w = rng.standard_normal((heads * size, 6)).astype(np.float32)

    def fn(a, b, c):
        ctx = P.BatchMatMul()(a, b)
        merged = P.Reshape()(P.Transpose()(ctx, (0, 2, 1, 3)), (batch, seq, heads * size))
        return P.MatMul()(merged, c)

    def want(a, b, c):
        return (a @ b).transpose(0, 2, 1, 3).reshape(batch, seq, heads * size) @ c

    on = check(fn, want, p, v, w)
    assert alone(on) == [], on.summary()
    assert [k.op_names for k in on.kernels] == [["BatchMatMul", "Transpose", "Reshape"],
                                                ["MatMul"]]
    assert on.kernels[0].output == f"float32[{batch},{seq},{heads * size}]"


def test_a_folded_result_that_is_also_returned(rng):
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((2, 3, 5, 2)).astype(np.float32)
    on = check(lambda x, y: P.Reshape()(P.Transpose()(P.BatchMatMul()(x, y), (0, 2, 1, 3)),
                                        (2, 4, 6)),
               lambda x, y: (x @ y).transpose(0, 2, 1, 3).reshape(2, 4, 6), a, b)
    assert on.kernel_count == 1
    first = on.run_arrays(a, b)[0]
    second = on.run_arrays(a, b)[0]
    assert not np.shares_memory(first, second)  # each call's result is the caller's own
    np.testing.assert_array_equal(first, second)


def test_layouts_blas_cannot_take_stay_steps(rng):
    x = rng.standard_normal((6, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    # A reversed slice has a negative stride; a transposed 2-d result would be written
    # column-major: both stay launches of their own (and are right).
    on = check(lambda t, v: P.MatMul()(t[::-1], v), lambda t, v: t[::-1] @ v, x, w)
    assert alone(on) == [["StridedSlice"]], on.summary()
    on = check(lambda t, v: P.Transpose()(P.MatMul()(t, v), (1, 0)) * 2.0,
               lambda t, v: (t @ v).T * 2, x, w)
    assert [k.op_names for k in on.kernels][0] == ["MatMul"], on.summary()


def test_a_layout_op_with_a_second_reader_is_not_folded(rng):
    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    on = check(lambda t, v: (P.MatMul()(t[:, 1], v), t[:, 1] * 2.0),
               lambda t, v: (t[:, 1] @ v, t[:, 1] * 2), x, w)
    assert ["StridedSlice", "MatMul"] not in [k.op_names for k in on.kernels], on.summary()
