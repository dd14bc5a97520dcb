"""Split, Unstack, broadcasting Tiles and Gathers of constant runs fuse into their consumers as
Slices and BroadcastTos read through index maps (graph_kernel/lower_layout.py); a Concat or a
Tile of a kernel's inputs is read in place (each element from its piece; the index modulo the
input's length); a Gather of data stays a library call. Fused against unfused against numpy on
odd shapes, kernels counted."""
import numpy as np
import pytest
from cells import OFF, ON, Fn

import graphkernel
from graphkernel.ops import operations as P


def check(fn, want, *arrays):
    on = graphkernel.compile(Fn(fn), *arrays, options=ON)
    off = graphkernel.compile(Fn(fn), *arrays, options=OFF)
    expected = want(*arrays)
    for exe in (on, off):
        np.testing.assert_allclose(exe.run_arrays(*arrays)[0], expected, rtol=1e-5, atol=1e-6)
    return on, off


@pytest.mark.parametrize("shape,axis,parts", [((6, 5, 3), 0, 3), ((2, 9, 7), 1, 3),
                                              ((3, 5, 4), -1, 2), ((1, 1, 7), 2, 7)])
def test_split_parts_are_read_in_place_by_one_kernel(shape, axis, parts, rng):
    x = rng.standard_normal(shape).astype(np.float32)

    def fn(t):
        items = P.Split(axis=axis, output_num=parts)(t)
        out = items[0] * 2.0
        for item in items[1:]:
            out = out + P.Exp()(item)
        return out

    def want(t):
        items = np.split(t, parts, axis=axis)
        return items[0] * 2 + sum(np.exp(i) for i in items[1:])

    on, off = check(fn, want, x)
    # One generated kernel reads every part from x; unfused: Split, then each op.
    assert on.kernel_count == 1 and on.kernels[0].backend == "native", on.summary()
    assert "Split" not in on.kernels[0].op_names
    assert off.kernels[0].op_names == ["Split"]


def test_unstack_items_are_read_in_place(rng):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    on, _ = check(lambda t: P.Unstack(axis=1)(t)[1] * P.Unstack(axis=1)(t)[3] + 1.0,
                  lambda t: t[:, 1] * t[:, 3] + 1, x)
    assert on.kernel_count == 1 and on.kernels[0].backend == "native", on.summary()


def test_tile_of_size_one_axes_is_a_broadcast_read(rng):
    row = rng.standard_normal((1, 7)).astype(np.float32)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    on, off = check(lambda r, t: P.Tile()(r, (5, 1)) * t, lambda r, t: np.tile(r, (5, 1)) * t,
                    row, x)
    assert on.kernel_count == 1 and on.kernels[0].backend == "native", on.summary()
    assert off.kernel_count == 2
    col = rng.standard_normal((3,)).astype(np.float32)
    on, _ = check(lambda c: P.Tile()(c, (4, 2, 1)) - 1.0,
                  lambda c: np.tile(c, (4, 2, 1)) - 1, col)
    assert on.kernel_count == 1, on.summary()


@pytest.mark.parametrize("shape,multiples", [((2, 3), (2, 2)), ((3,), (4,)),
                                              ((2, 1, 3), (1, 5, 2)), ((2, 3), (3, 1, 2)),
                                              ((1, 4), (3, 2)), ((5, 1), (1, 1))])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_tile_repeating_an_axis_is_read_modulo_its_length(shape, multiples, dtype, rng):
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    on, off = check(lambda t: P.Abs()(P.Tile()(t, multiples)) * 2,
                    lambda t: np.abs(np.tile(t, multiples)) * dtype(2), x)
    assert on.kernel_count == 1 and on.kernels[0].backend == "native", on.summary()
    assert off.kernel_count == 3


def test_tile_of_a_value_the_kernel_computes_stays_apart_with_a_reason(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    on, _ = check(lambda t: P.Tile()(t * 2.0, (2, 2)) + 1.0,
                  lambda t: np.tile(t * 2, (2, 2)) + 1, x)
    assert any("Tile of values computed in the kernel" in r.detail for r in on.reasons)
    assert on.kernel_count == 2, on.summary()


@pytest.mark.parametrize("axis,shapes", [(0, [(2, 3, 5), (1, 3, 5), (4, 3, 5)]),
                                         (1, [(3, 1, 5), (3, 6, 5)]),
                                         (-1, [(3, 4, 2), (3, 4, 7), (3, 4, 1)]),
                                         (1, [(3, 0, 5), (3, 2, 5)])])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_concat_of_inputs_is_read_in_place(axis, shapes, dtype, rng):
    arrays = [(rng.standard_normal(s) * 4).astype(dtype) for s in shapes]

    def fn(*ts):
        return P.Abs()(P.Concat(axis=axis)(ts)) * 3

    def want(*ts):
        return np.abs(np.concatenate(ts, axis=axis)) * dtype(3)

    on, off = check(fn, want, *arrays)
    assert on.kernel_count == 1 and on.kernels[0].backend == "native", on.summary()
    assert on.kernels[0].op_names[0] == "Concat"
    assert off.kernels[0].op_names == ["Concat"]


def test_concat_twice_the_same_input_and_broadcast_over_rows(rng):
    row = rng.standard_normal((1, 3)).astype(np.float32)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    on, _ = check(lambda r, t: P.Concat(axis=1)((r, r)) * t,
                  lambda r, t: np.concatenate([r, r], axis=1) * t, row, x)
    assert on.kernel_count == 1, on.summary()


def test_concat_of_values_the_kernel_computes_stays_apart_with_a_reason(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    on, _ = check(lambda t: P.Concat(axis=1)((t * 2.0, t)) + 1.0,
                  lambda t: np.concatenate([t * 2, t], axis=1) + 1, x)
    assert any("Concat of values computed in the kernel" in r.detail for r in on.reasons)
    assert on.kernel_count == 2, on.summary()  # x * 2, then the Concat read by the add


def test_split_item_returned_as_is(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    on, _ = check(lambda t: P.Split(axis=1, output_num=2)(t)[1],
                  lambda t: np.split(t, 2, axis=1)[1], x)
    first, second = on.run_arrays(x)[0], on.run_arrays(x)[0]
    assert not np.shares_memory(first, x) and not np.shares_memory(first, second)


def test_gather_of_a_constant_run_is_a_slice_of_the_table(rng):
    table = rng.standard_normal((9, 5)).astype(np.float32)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    for ids in (np.arange(3), np.arange(2, 8, 2), np.array([4])):
        constant = graphkernel.Tensor(ids.astype(np.int32))
        on, off = check(lambda t, y, c=constant: P.Gather()(t, c, 0)[None] * 2.0 + y,
                        lambda t, y, i=ids: t[i][None] * 2 + y, table, x[:len(ids)])
        assert on.kernel_count == 1 and on.kernels[0].backend == "native", on.summary()
        assert "Gather" in off.kernels[0].op_names
    # Along axis 1, and indices that are no run (or are data) stay a Gather.
    cols = graphkernel.Tensor(np.array([1, 2, 3], np.int32))
    on, _ = check(lambda t, c=cols: P.Gather()(t, c, 1) + 1.0, lambda t: t[:, 1:4] + 1, table)
    assert on.kernel_count == 1, on.summary()
    shuffled = graphkernel.Tensor(np.array([3, 1, 2], np.int32))
    on, _ = check(lambda t, c=shuffled: P.Gather()(t, c, 0) + 1.0,
                  lambda t: t[[3, 1, 2]] + 1, table)
    assert ["Gather"] in [k.op_names for k in on.kernels], on.summary()
    ids = np.array([0, 1, 2], np.int32)
    on, _ = check(lambda t, i: P.Gather()(t, i, 0) + 1.0, lambda t, i: t[i] + 1, table, ids)
    assert ["Gather"] in [k.op_names for k in on.kernels], on.summary()


def test_a_constant_run_of_negative_indices_is_a_slice_where_they_count_from_the_end(rng):
    """Rows -3, -2, -1 of a Gather declared with negative indices (ONNX's) are the table's
    last three: a slice read in place, as rows 6, 7, 8 are."""
    table = rng.standard_normal((9, 5)).astype(np.float32)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    last = graphkernel.Tensor(np.array([-3, -2, -1], np.int64))
    on, off = check(lambda t, y, c=last: P.Gather(negative_indices=True)(t, c, 0) * 2.0 + y,
                    lambda t, y: t[-3:] * 2 + y, table, x)
    assert on.kernel_count == 1 and on.kernels[0].backend == "native", on.summary()
    assert "Gather" in off.kernels[0].op_names


def test_a_slice_of_a_cast_is_a_cast_of_the_slice(rng):
    mask = (rng.random((3, 7)) > 0.3).astype(np.int32)
    on, off = check(lambda m: (1.0 - P.Cast()(m, graphkernel.float32)[:, None, None, :]) * 5.0,
                    lambda m: (1 - m.astype(np.float32)[:, None, None, :]) * 5, mask)
    assert on.kernel_count == 1, on.summary()
    assert on.kernels[0].op_names[:2] == ["StridedSlice", "Cast"]
