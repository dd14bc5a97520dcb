"""Fusion structure: kernel counts, members, reasons, flags and simplification (no timing)."""
import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.errors import ContextError, FlagError
from graphkernel.frontend import context
from graphkernel.graph_kernel.flags import parse_flags
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)


def with_flags(text):
    return CompileOptions(enable_graph_kernel=True, flags=parse_flags(text))


class Fn(nn.Cell):
    """A cell whose construct is a Python function of primitives (built per test)."""

    def __init__(self, fn, **prims):
        super().__init__()
        self.fn = fn
        for name, prim in prims.items():
            setattr(self, name, prim)

    def construct(self, *xs):
        return self.fn(self, *xs)


def run_both(cell, *arrays, options=ON):
    on = graphkernel.compile(cell, *arrays, options=options)
    off = graphkernel.compile(cell, *arrays, options=OFF)
    got, want = on.run_arrays(*arrays), off.run_arrays(*arrays)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    return on, off


def native(exe):
    return [k for k in exe.kernels if k.backend == "native"]


def test_bias_add_gelu_is_one_kernel(rng):
    x = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    cell = Fn(lambda s, x, b: s.gelu(s.bias(x, b)), bias=P.BiasAdd(), gelu=P.GeLU())
    on, off = run_both(cell, x, b)
    assert [k.name for k in on.kernels] == ["Fused_BiasAdd_GeLU"]
    assert len(off.kernels) == 2


@pytest.mark.parametrize("shape", [(128, 96), (4, 6, 32)])
def test_layer_norm_is_one_kernel(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    g, b = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
    on, _ = run_both(nn.LayerNorm((shape[-1],)), x)
    assert len(on.kernels) == 1 and on.kernels[0].backend == "native"
    cell = Fn(lambda s, x, g, b: s.ln(x, g, b)[0], ln=P.LayerNorm())
    on, _ = run_both(cell, x, g, b)
    assert len(on.kernels) == 1
    assert "ReduceSum" in on.kernels[0].op_names and "Rsqrt" in on.kernels[0].op_names


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_is_one_kernel_on_any_axis(axis, rng):
    x = rng.standard_normal((5, 7, 9)).astype(np.float32) * 4
    on, _ = run_both(nn.Softmax(axis), x)
    assert [k.backend for k in on.kernels] == ["native"]
    e = np.exp(x - x.max(axis, keepdims=True))
    np.testing.assert_allclose(on.run_arrays(x)[0], e / e.sum(axis, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("axis,keep", [(0, False), (1, False), (1, True), (2, True)])
def test_reduce_sum_after_elementwise_any_axis(axis, keep, rng):
    x = rng.standard_normal((6, 5, 4)).astype(np.float32)
    cell = Fn(lambda s, x: s.sum(s.exp(x), axis), sum=P.ReduceSum(keep_dims=keep), exp=P.Exp())
    on, _ = run_both(cell, x)
    assert len(on.kernels) == 1
    np.testing.assert_allclose(on.run_arrays(x)[0], np.exp(x).sum(axis, keepdims=keep),
                               rtol=1e-5)


def test_mlp_block_two_matmuls_and_two_fused_kernels(rng):
    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.d1 = nn.Dense(32, 64, activation=nn.GELU(), seed=1)
            self.d2 = nn.Dense(64, 32, seed=2)
            self.ln = nn.LayerNorm((32,))
            self.add = P.Add()

        def construct(self, x):
            return self.ln(self.add(self.d2(self.d1(x)), x))
    x = rng.standard_normal((16, 32)).astype(np.float32)
    on, off = run_both(Block(), x)
    kinds = [k.op_names for k in on.kernels]
    assert kinds.count(["MatMul"]) == 2
    assert len(on.kernels) - 2 <= 2
    assert [k.name for k in on.kernels] == ["MatMul", "Fused_BiasAdd_GeLU", "MatMul_1",
                                            "Fused_BiasAdd_Add_LayerNorm"]
    assert len(off.kernels) == 7
    # The refusals name the opaque matmuls.
    assert any(r.rule == "pattern" and "MatMul" in r.detail for r in on.reasons)


def test_intermediate_used_outside_gives_a_multi_output_kernel(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    cell = Fn(lambda s, x: (s.mul(s.exp(x), 2.0), s.exp(x)), mul=P.Mul(), exp=P.Exp())
    on, _ = run_both(cell, x)
    assert len(on.kernels) == 1
    sub = on.graph.nodes[0].subgraph
    assert len(sub.outputs) == 2


def test_no_cycle_through_an_opaque_op(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    # a = x*2 feeds both the matmul and the final add: fusing a with the add would make the
    # fused kernel both feed and consume the matmul.
    cell = Fn(lambda s, x: s.add(s.mm(s.mul(x, 2.0), x), s.mul(x, 2.0)),
              mul=P.Mul(), add=P.Add(), mm=P.MatMul())
    on, _ = run_both(cell, x)
    assert len(on.kernels) == 3
    assert any(r.rule == "cycle" for r in on.reasons), on.summary()


def test_composite_op_limit_splits_chains(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)

    def chain(s, x):
        for _ in range(6):
            x = s.add(s.mul(x, 1.5), 0.25)
        return x
    cell = Fn(chain, mul=P.Mul(), add=P.Add())
    on, _ = run_both(cell, x, options=with_flags("--composite_op_limit_size=4"))
    assert len(on.kernels) == 3 and all(len(k.op_names) <= 4 for k in on.kernels)
    assert any(r.rule == "limit" and "composite_op_limit_size=4" in r.detail for r in on.reasons)
    on_default, _ = run_both(cell, x)
    assert len(on_default.kernels) == 1


def test_cost_model_declines_recomputing_expensive_broadcast_producer(rng):
    x = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    cell = Fn(lambda s, x, b: s.add(x, s.exp(s.mul(b, 2.0))), add=P.Add(), exp=P.Exp(),
              mul=P.Mul())
    on, _ = run_both(cell, x, b)
    assert len(on.kernels) == 2
    assert any(r.rule == "cost" and "recomputed" in r.detail for r in on.reasons)


def test_flags_disable_expand_and_cluster(rng):
    x = rng.standard_normal((16, 16)).astype(np.float32)
    on, _ = run_both(nn.Softmax(), x, options=with_flags("--disable_expand_ops=Softmax"))
    # Not expanded into the graph: Softmax runs as one op (its own kernel), not a fused group.
    assert [k.op_names for k in on.kernels] == [["Softmax"]]
    assert "hwopt_1_graph_kernel_expand" in on.stages
    assert [n.op for n in on.graph.nodes] == ["Softmax"]
    cell = Fn(lambda s, x: s.mul(s.exp(s.add(x, 1.0)), 3.0), add=P.Add(), exp=P.Exp(),
              mul=P.Mul())
    on, _ = run_both(cell, x, options=with_flags("--disable_cluster_ops=Exp"))
    assert [k.op_names for k in on.kernels] == [["Add"], ["Exp"], ["Mul"]]
    assert {r.rule for r in on.reasons} == {"flag"}
    assert "disable_cluster_ops" in on.summary()


def test_opt_levels(rng):
    x = rng.standard_normal((16, 16)).astype(np.float32)
    on, _ = run_both(nn.Softmax(), x, options=with_flags("--opt_level=0"))
    assert [k.op_names for k in on.kernels] == [["Softmax"]]  # one op, one kernel
    assert "hwopt_2_basic_op_fusion" not in on.stages
    on, _ = run_both(nn.Softmax(), x, options=with_flags("--opt_level=1"))
    assert [k.op_names for k in on.kernels] == [["Softmax"]]  # reductions are level 2
    on, _ = run_both(nn.Softmax(), x,
                     options=with_flags("--opt_level=1 --enable_expand_ops=Softmax "
                                        "--enable_cluster_ops=ReduceMax,ReduceSum"))
    assert [k.backend for k in on.kernels] == ["native"]
    gelu = Fn(lambda s, x: s.gelu(x), gelu=P.GeLU())
    on, _ = run_both(gelu, x, options=with_flags("--opt_level=1"))
    assert [k.backend for k in on.kernels] == ["native"]


def test_dump_as_text_writes_summary_with_reasons(tmp_path, rng):
    context.set_context(enable_graph_kernel=True, save_graphs=True, save_graphs_path=str(tmp_path),
                        graph_kernel_flags="--disable_cluster_ops=Exp --dump_as_text")
    cell = Fn(lambda s, x: s.mul(s.exp(x), 3.0), exp=P.Exp(), mul=P.Mul())
    cell(Tensor(rng.standard_normal((4, 4)).astype(np.float32)))
    text = (tmp_path / "graph_kernel_summary.txt").read_text()
    assert "not fused (flag)" in text and "--disable_cluster_ops" in text


@pytest.mark.parametrize("flags,message", [
    ("--opt_level=7", "opt_level must be"),
    ("--fuse_everything", "unknown flag --fuse_everything; the flags that act here: --opt_level"),
    ("--composite_op_limit_size=x", "needs an integer"),
    ("opt_level=2", "does not start with '--'"),
])
def test_bad_flags_are_clear_errors(flags, message):
    with pytest.raises(FlagError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_flags(flags)
    with pytest.raises(FlagError):
        context.set_context(graph_kernel_flags=flags)


def test_simplification_inside_kernels(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)

    def body(s, x):
        y = s.mul(s.neg(s.neg(x)), 1.0)        # double negation, x*1
        y = s.add(y, -0.0)                      # x + (-0.0)
        z = s.add(s.exp(y), s.exp(y))           # common subexpression
        return s.mul(z, s.add(2.0, 3.0))        # constant folding (done in the frontend)
    cell = Fn(body, mul=P.Mul(), neg=P.Neg(), add=P.Add(), exp=P.Exp())
    on, _ = run_both(cell, x)
    assert len(on.kernels) == 1
    assert on.kernels[0].op_names == ["Exp", "Add", "Mul"]
    np.testing.assert_allclose(on.run_arrays(x)[0], (np.exp(x) * 2) * 5, rtol=1e-6)


def test_simplification_keeps_signed_zero():
    x = np.array([[-0.0, 0.0, 1.0]], np.float32)
    cell = Fn(lambda s, x: s.exp(s.add(s.mul(x, 1.0), 0.0)), mul=P.Mul(), add=P.Add(),
              exp=P.Exp())
    on, _ = run_both(cell, x)
    assert "Add" in on.kernels[0].op_names  # x + 0.0 is not an identity for -0.0


def test_summary_is_readable(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    cell = Fn(lambda s, x: s.mul(s.mm(s.exp(x), x), 2.0), exp=P.Exp(), mm=P.MatMul(),
              mul=P.Mul())
    on = graphkernel.compile(cell, x, options=ON)
    text = on.summary()
    assert "3 kernel(s) per call" in text
    assert "Exp -> MatMul: not fused (pattern): MatMul is opaque" in text


def test_context_errors():
    with pytest.raises(ContextError, match="available targets: CPU"):
        context.set_context(device_target="Ascend")
    with pytest.raises(ContextError, match="known keys: mode, device_target"):
        context.set_context(enable_graph_kernal=True)
    with pytest.raises(ContextError, match="GRAPH_MODE"):
        context.set_context(mode=5)
    with pytest.raises(ContextError, match="True or False"):
        context.set_context(enable_graph_kernel="yes")


def test_column_reductions_across_blocks_keep_nan_and_outputs(rng):
    """Reducing a non-innermost axis walks the innermost axis in blocks of lanes; shapes that
    straddle a block boundary, NaN propagation and several outputs stay exact."""
    x = rng.standard_normal((37, 1030)).astype(np.float32)
    x[5, 7] = np.nan
    x[0, 1029] = np.nan
    cell = Fn(lambda s, x: s.max(s.mul(x, 2.0), 0), max=P.ReduceMax(keep_dims=False),
              mul=P.Mul())
    on, _ = run_both(cell, x)
    got = on.run_arrays(x)[0]
    np.testing.assert_array_equal(got, (x * 2).max(0))
    assert np.isnan(got[7]) and np.isnan(got[1029])

    y = rng.standard_normal((3, 1030)).astype(np.float32)
    on, _ = run_both(nn.Softmax(0), y)
    e = np.exp(y - y.max(0, keepdims=True))
    np.testing.assert_allclose(on.run_arrays(y)[0], e / e.sum(0, keepdims=True), rtol=1e-5)

    def centre(s, x):
        mean = s.mul(s.sum(x, 0), 1.0 / x.shape[0])
        return s.sub(x, mean), mean
    cell = Fn(centre, sum=P.ReduceSum(keep_dims=True), mul=P.Mul(), sub=P.Sub())
    z = rng.standard_normal((6, 5, 700)).astype(np.float32)
    on, _ = run_both(cell, z)
    assert len(on.kernels) == 1
    centred, mean = on.run_arrays(z)
    np.testing.assert_allclose(mean, z.mean(0, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(centred, z - z.mean(0, keepdims=True), rtol=1e-5, atol=1e-6)


def test_column_reduction_with_a_full_size_result_is_one_pass(rng):
    """A bias gradient beside its activation's gradient (dz = dy * (1 - tanh(x)^2), db = sum of
    dz over rows): one kernel, dz stored by the pass that sums it; both equal numpy's, across
    column blocks and with NaN (backends/c/c_reduce.py)."""
    def grad(s, x, dy):
        t = s.tanh(x)
        dz = s.mul(dy, s.sub(1.0, s.mul(t, t)))
        return dz, s.sum(dz, 0)
    cell = Fn(grad, tanh=P.Tanh(), mul=P.Mul(), sub=P.Sub(), sum=P.ReduceSum(keep_dims=False))
    for shape in ((37, 1030), (512, 64), (3, 5)):
        x = rng.standard_normal(shape).astype(np.float32)
        dy = rng.standard_normal(shape).astype(np.float32)
        dy[1, 2] = np.nan
        on, _ = run_both(cell, x, dy)
        assert len(on.kernels) == 1
        dz, db = on.run_arrays(x, dy)
        want = dy.astype(np.float64) * (1 - np.tanh(x.astype(np.float64)) ** 2)
        np.testing.assert_allclose(dz, want, rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(db, want.sum(0), rtol=1e-5, atol=1e-5)
        assert np.isnan(db[2]) and np.isnan(dz[1, 2])


def test_broadcast_and_unit_dim_views_join_kernels(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)

    def body(s, x, b):
        bb = s.bcast(s.exp(b))                   # BroadcastTo of an intermediate
        y = s.expand(s.add(x, bb), 0)            # leading unit dim: [1, 4, 6]
        return s.squeeze(s.mul(y, 2.0))          # and back
    cell = Fn(body, bcast=P.BroadcastTo((4, 6)), exp=P.Exp(), add=P.Add(), mul=P.Mul(),
              expand=P.ExpandDims(), squeeze=P.Squeeze(axis=0))
    on, _ = run_both(cell, x, b)
    assert len(on.kernels) == 1
    assert on.kernels[0].op_names == ["Exp", "BroadcastTo", "Add", "ExpandDims", "Mul",
                                      "Squeeze"]
    np.testing.assert_allclose(on.run_arrays(x, b)[0], (x + np.exp(b)) * 2, rtol=1e-6)


def test_reshape_that_moves_data_is_read_through_an_index_map(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    # Reshape(Exp(x)) becomes Exp(Reshape(x)): one kernel reads x through the reshape's map.
    cell = Fn(lambda s, x: s.mul(s.reshape(s.exp(x), (6, 4)), 2.0), exp=P.Exp(), mul=P.Mul(),
              reshape=P.Reshape())
    on, _ = run_both(cell, x)
    assert [k.op_names for k in on.kernels] == [["Reshape", "Exp", "Mul"]]
    np.testing.assert_allclose(on.run_arrays(x)[0], np.exp(x).reshape(6, 4) * 2, rtol=1e-6)
    # Exp's result also leaves the graph: it is computed once, and a kernel cannot both
    # compute it and read it reshaped (that moves data between axes): two kernels, one of them
    # writing the reshape in place or reading it through its map.
    cell = Fn(lambda s, x: (s.mul(s.reshape(s.exp(x), (6, 4)), 2.0), s.exp(x)), exp=P.Exp(),
              mul=P.Mul(), reshape=P.Reshape())
    on, _ = run_both(cell, x)
    assert sorted(op for k in on.kernels for op in k.op_names) == ["Exp", "Mul", "Reshape"]
    assert len(on.kernels) == 2
    assert any(r.rule == "shape" and "moves data between axes" in r.detail for r in on.reasons)


def test_every_composite_op_has_an_expander_and_only_those():
    """The op table's `composite` flag and graph_kernel/expanders.py agree: flags name
    expandable ops by the table (graph_kernel/flags.py), fusion expands them by the expanders."""
    from graphkernel.graph_kernel.expanders import EXPANDERS
    from graphkernel.ir.opset import OPS
    assert {n for n, op in OPS.items() if op.composite} == set(EXPANDERS)
