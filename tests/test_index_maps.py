"""Layout ops read through index maps (graph_kernel/index_maps.py): Reshape, Transpose,
Slice/StridedSlice, ExpandDims, Squeeze and BroadcastTo of a kernel's inputs fuse into the
kernel; views move above the elementwise ops that feed them; a Reshape that only leaves the
kernel is written in place. Fused against unfused against numpy, kernels counted."""
import importlib.util
import pathlib

import numpy as np
import pytest
from cells import OFF, ON, Fn, product_atol

import graphkernel
from graphkernel.graph_kernel.flags import parse_flags
from graphkernel.graph_kernel.index_maps import IndexMap, _reshape
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P


def fused(fn, *arrays):
    on = graphkernel.compile(Fn(fn), *arrays, options=ON)
    off = graphkernel.compile(Fn(fn), *arrays, options=OFF)
    for a, b in zip(on.run_arrays(*arrays), off.run_arrays(*arrays)):
        np.testing.assert_array_equal(a, b)
    return on


CASES = {
    "transpose": (lambda t, c: P.Transpose()(t, (2, 0, 1)) * 2.0,
                  lambda t, c: t.transpose(2, 0, 1) * 2),
    "reshape_split": (lambda t, c: P.Reshape()(t, (3, 2, 2, 5)) - 1.0,
                      lambda t, c: t.reshape(3, 2, 2, 5) - 1),
    "reshape_merge": (lambda t, c: P.Reshape()(t, (12, 5)) + c[:5],
                      lambda t, c: t.reshape(12, 5) + c[:5]),
    "negative_steps": (lambda t, c: t[::-1, 1:4:2, ::-2] * 3.0,
                       lambda t, c: t[::-1, 1:4:2, ::-2] * 3),
    "shrink_newaxis": (lambda t, c: t[-1, None, :, 2] + c[None, 4:8],
                       lambda t, c: t[-1, None, :, 2] + c[None, 4:8]),
    "ellipsis": (lambda t, c: t[..., 1:] * t[..., :-1], lambda t, c: t[..., 1:] * t[..., :-1]),
    "slice": (lambda t, c: P.Slice()(t, (1, 0, 2), (2, -1, 3)) * 0.5,
              lambda t, c: t[1:3, :, 2:5] * 0.5),
    "broadcast_then_transpose": (
        lambda t, c: P.Transpose()(P.BroadcastTo((4, 10))(c), (1, 0)) + 1.0,
        lambda t, c: np.broadcast_to(c, (4, 10)).T + 1),
    "transpose_into_reduction": (lambda t, c: P.ReduceSum()(P.Transpose()(t, (0, 2, 1)), -1),
                                 lambda t, c: t.transpose(0, 2, 1).sum(-1)),
    "size_one_axes": (lambda t, c: P.Transpose()(P.Reshape()(t[:1], (1, 4, 5, 1)),
                                                 (3, 2, 0, 1)) * 2.0,
                      lambda t, c: t[:1].reshape(1, 4, 5, 1).transpose(3, 2, 0, 1) * 2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_layout_ops_of_inputs_fuse_and_match_numpy(name, rng):
    fn, want = CASES[name]
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    c = rng.standard_normal(10).astype(np.float32)
    on = fused(fn, x, c)
    np.testing.assert_allclose(on.run_arrays(x, c)[0], want(x, c), rtol=1e-6)
    assert [k.backend for k in on.kernels] == ["native"], on.summary()


def test_head_split_after_a_bias_add_is_one_kernel(rng):
    x = rng.standard_normal((2, 6, 8)).astype(np.float32)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)

    def split(t, w_, b_):
        y = P.BiasAdd()(P.MatMul(transpose_b=True)(P.Reshape()(t, (12, 8)), w_), b_)
        return P.Transpose()(P.Reshape()(y, (2, 6, 2, 4)), (0, 2, 1, 3))

    on = fused(split, x, w, b)
    want = ((x.reshape(12, 8) @ w.T + b).reshape(2, 6, 2, 4)).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(on.run_arrays(x, w, b)[0], want, rtol=1e-5,
                               atol=product_atol(x.reshape(12, 8), w.T))
    ops = [k.op_names for k in on.kernels if k.backend == "native"]
    assert len(ops) == 1 and {"Add", "Transpose"} <= set(ops[0])
    assert not [k for k in on.kernels if k.op_names in (["Transpose"], ["Reshape", "Add"])]


def tanh_gelu(t):
    """GPT-2's GeLU: reads its input three times."""
    inner = (t + P.Pow()(t, 3.0) * 0.044715) * 0.7978845608
    return t * 0.5 * (P.Tanh()(inner) + 1.0)


def test_a_view_sunk_along_several_paths_is_one_view_and_the_bias_joins_the_gelu(rng):
    # As GPT-2's ONNX export has its MLP: rows [b * s, h] @ W, back to [b, s, 4h], + bias,
    # the tanh GeLU, and to rows again for the next product. Moving the last reshape up to the
    # inputs leaves a copy on each of the GeLU's three reads of its input; they are one view,
    # so the reshape moves on above the bias add: one kernel for the bias and the GeLU, no
    # kernel of three copies, no broadcast bias written out.
    x = rng.standard_normal((2, 6, 8)).astype(np.float32)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    w2 = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)

    def mlp(t, w_, b_, w2_):
        h = P.Reshape()(P.MatMul()(P.Reshape()(t, (12, 8)), w_), (2, 6, 16)) + b_
        return P.MatMul()(P.Reshape()(tanh_gelu(h), (12, 16)), w2_)

    on = graphkernel.compile(Fn(mlp), x, w, b, w2, options=ON)
    native = [k.op_names for k in on.kernels if k.backend == "native"]
    assert len(native) == 1, on.summary()
    assert {"Add", "Pow", "Tanh"} <= set(native[0]), on.summary()
    h = (x.reshape(12, 8).astype(np.float64) @ w + b)
    g = h * 0.5 * (np.tanh((h + h ** 3 * 0.044715) * 0.7978845608) + 1)
    np.testing.assert_allclose(on.run_arrays(x, w, b, w2)[0], g @ w2, rtol=1e-4, atol=1e-4)
    off = graphkernel.compile(Fn(mlp), x, w, b, w2, options=OFF)
    np.testing.assert_allclose(on.run_arrays(x, w, b, w2)[0], off.run_arrays(x, w, b, w2)[0],
                               rtol=1e-5, atol=1e-5)


def test_head_merge_is_one_kernel_writing_in_place(rng):
    ctx = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    on = fused(lambda t: P.Reshape()(P.Transpose()(t, (0, 2, 1, 3)), (10, 12)), ctx)
    np.testing.assert_array_equal(on.run_arrays(ctx)[0], ctx.transpose(0, 2, 1, 3).reshape(10, 12))
    assert [k.op_names for k in on.kernels] == [["Transpose", "Reshape"]]
    assert on.kernels[0].backend == "native"


ROWS = {  # a reduction's result reshaped to or from rows [batch * seq, hidden] (ONNX exports)
    "layernorm_merge": (lambda t, g, b: P.Reshape()(LAYER_NORM(t, g, b)[0], (6, 8)), (2, 3, 8)),
    "layernorm_split": (lambda t, g, b: P.Reshape()(LAYER_NORM(t, g, b)[0], (2, 3, 8)), (6, 8)),
    "softmax_merge": (lambda t, g, b: P.Reshape()(P.Softmax()(t * g + b), (6, 8)), (2, 3, 8)),
}
LAYER_NORM = P.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1)


@pytest.mark.parametrize("name", list(ROWS))
def test_a_reshape_leaving_a_reduction_kernel_is_written_by_it(name, rng):
    """The reshape only relabels the dense result the reduction kernel writes: no step of its
    own (it was, for the kernel's iteration space is the reduction's input shape)."""
    fn, shape = ROWS[name]
    x = rng.standard_normal(shape).astype(np.float32)
    gamma, beta = rng.standard_normal((2, 8)).astype(np.float32)
    on = graphkernel.compile(Fn(fn), x, gamma, beta, options=ON)
    off = graphkernel.compile(Fn(fn), x, gamma, beta, options=OFF)
    (got,), (want,) = on.run_arrays(x, gamma, beta), off.run_arrays(x, gamma, beta)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert [k.backend for k in on.kernels] == ["native"], on.summary()
    assert on.kernels[0].op_names[-1] == "Reshape"
    numpy = graphkernel.compile(Fn(fn), x, gamma, beta,
                                options=CompileOptions(enable_graph_kernel=True, backend="numpy"))
    np.testing.assert_allclose(numpy.run_arrays(x, gamma, beta)[0], want, rtol=1e-5, atol=1e-6)
    assert [k.backend for k in numpy.kernels] == ["interpreted"], numpy.summary()


def test_a_view_that_is_not_affine_falls_back_with_a_reason(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    # Reshape of a transposed input cannot be one strided read: the transpose is a kernel of
    # its own, the reshape of its dense result is read by the next.
    on = fused(lambda t: P.Reshape()(P.Transpose()(t, (1, 0)), (3, 8)) + 1.0, x)
    np.testing.assert_array_equal(on.run_arrays(x)[0], x.T.reshape(3, 8) + 1)
    assert any(r.rule == "shape" and "moves data between axes" in r.detail for r in on.reasons)


def test_reshape_maps_follow_numpy():
    def strides(shape):
        return tuple(s // 4 for s in np.empty(shape, np.float32).strides)

    base = IndexMap(None, 0, strides((2, 3, 4)))
    assert _reshape(base, (2, 3, 4), (6, 4)).strides == strides((6, 4))
    assert _reshape(base, (2, 3, 4), (2, 3, 2, 2)).strides == strides((2, 3, 2, 2))
    transposed = IndexMap(None, 0, tuple(np.array(strides((2, 3, 4)))[[2, 0, 1]]))
    assert _reshape(transposed, (4, 2, 3), (4, 6)) is not None  # (2, 3) still contiguous
    assert _reshape(transposed, (4, 2, 3), (8, 3)) is None  # merges non-contiguous axes


def _load(name):
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAYOUT = {"Transpose", "Reshape", "Slice", "StridedSlice", "BroadcastTo", "ExpandDims",
          "Squeeze"}


def _encoder(options):
    bert = _load("bert_tiny")
    graphkernel.set_seed(0)
    net = bert.BertTiny(bert.Config(vocab_size=40, hidden_size=16, num_heads=2,
                                    intermediate_size=32, max_position=8))
    ids, mask = bert.make_inputs(2, 8, 40)
    return graphkernel.compile(net, ids, mask, options=options), (ids, mask)


def test_encoder_layout_launches_counted():
    # Counted before parallel fusion, which then launches independent kernels together.
    on, inputs = _encoder(CompileOptions(enable_graph_kernel=True,
                                         flags=parse_flags("--enable_parallel_fusion=false")))
    # No launch of the encoder is a layout op alone: head splits fuse with their bias add
    # (which the attention step adds up as it loads q, k and v: tests/test_attention_sums.py),
    # each head merge (Transpose + Reshape) is written in place by the attention step before
    # it (tests/test_fused_attention.py), and x[:, 0] (the [CLS] row) is read as a strided
    # matrix by the pooler's MatMul.
    assert [k.op_names for k in on.kernels if set(k.op_names) <= LAYOUT] == [], on.summary()
    merges = [k for k in on.kernels if "BatchMatMul" in k.op_names and
              k.op_names[-3:] == ["BatchMatMul", "Transpose", "Reshape"]]
    assert len(merges) == 2 and all(k.backend != "library" for k in merges), on.summary()
    assert [k.op_names for k in on.kernels if "StridedSlice" in k.op_names and
            "MatMul" in k.op_names] == [["StridedSlice", "MatMul"]]
    # The position embedding (a Gather of the constant 0..S-1) is a slice of its table read by
    # the LayerNorm kernel, and the mask's slice moved above its Cast: one kernel each.
    assert [k.op_names for k in on.kernels if "Gather" in k.op_names] == [["Gather"]]
    assert ["StridedSlice", "Cast", "Sub", "Mul"] in [k.op_names for k in on.kernels]
    # 55 launches before layout ops fused, 40 with index maps, 37 with layout ops folded
    # into the MatMuls next to them, 35 with those two, 31 with each layer's attention one
    # step, 25 with its q, k, v head splits + bias added up by that step; fusion off runs the
    # initial graph's ops one by one.
    assert on.kernel_count == 25, on.summary()
    off, _ = _encoder(OFF)
    assert off.kernel_count == 72, off.summary()
    # The mask's kernel and siblings share launches: fewer than the 31 above. Parallel fusion
    # also launches each layer's three head splits as one kernel of three results, which the
    # attention step does not add up (26 launches, against 25 without it); at the bench's
    # sizes each split moves over 1 MiB, stays a group of its own and is added up.
    parallel, _ = _encoder(ON)
    assert parallel.kernel_count < 31, parallel.summary()
    for exe in (on, parallel):
        for a, b in zip(exe.run_arrays(*inputs), off.run_arrays(*inputs)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
