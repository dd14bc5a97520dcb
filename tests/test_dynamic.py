"""Dynamic dimensions: set_inputs with None dimensions and automatic dynamic shapes build one
shape-generic library that serves every size, equal to numpy; mismatching calls are clear
errors; dumps and summary() show the symbols."""
import glob
import os

import numpy as np
import pytest
from cells import Pointwise, pointwise_ref

import graphkernel
from graphkernel import Parameter, Symbol, Tensor, nn
from graphkernel.errors import InputError, ShapeError
from graphkernel.frontend import context
from graphkernel.ops import operations as P

BATCHES = (1, 3, 17, 64, 129, 1000)


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    folder = str(tmp_path / "kernels")
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", folder)
    return folder


def libraries(folder):
    return sorted(glob.glob(os.path.join(folder, "*.so")))


class LayerNormSoftmax(nn.Cell):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm((64,))
        self.sm = nn.Softmax()

    def construct(self, x):
        return self.sm(self.ln(x))


def ln_softmax_ref(x):
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-7)
    e = np.exp(y - y.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def generic(net):
    exes = {id(v): v for v in net._compiled.values()}
    return list(exes.values())


def test_declared_batch_builds_one_library_for_every_size(cache_folder, rng):
    context.set_context(enable_graph_kernel=True)
    net = Pointwise()
    net.set_inputs(Tensor(shape=[None, 64], dtype=graphkernel.float32))
    for b in BATCHES:
        x = rng.standard_normal((b, 64)).astype(np.float32)
        out = net(Tensor(x)).asnumpy()
        assert out.shape == (b, 64)
        np.testing.assert_allclose(out, pointwise_ref(net, x), rtol=2e-6, atol=1e-6)
    assert len(libraries(cache_folder)) == 1
    (exe,) = generic(net)
    assert exe.entry is not None and exe.kernel_count == 1
    assert "float32[N,64]" in exe.summary()
    assert "const int64_t N = " in exe.kernels[0].source  # the size is an argument
    assert "< N;" in exe.kernels[0].source


def test_declared_sequence_length_layernorm_softmax(cache_folder, rng):
    context.set_context(enable_graph_kernel=True)
    net = LayerNormSoftmax()
    net.set_inputs(Tensor(shape=[2, None, 64], dtype=graphkernel.float32))
    for s in BATCHES:
        x = rng.standard_normal((2, s, 64)).astype(np.float32) * 3
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), ln_softmax_ref(x), rtol=1e-5,
                                   atol=1e-6)
    assert len(libraries(cache_folder)) == 1
    (exe,) = generic(net)
    assert exe.kernel_count == 1 and "Softmax" in exe.kernels[0].name


def test_dynamic_row_length_reduction(cache_folder, rng):
    """The reduced axis itself dynamic: the row loop runs to a run-time length."""
    context.set_context(enable_graph_kernel=True)
    net = nn.Softmax()
    net.set_inputs(Tensor(shape=[4, None], dtype=graphkernel.float32))
    for n in (1, 7, 100, 3000):
        x = rng.standard_normal((4, n)).astype(np.float32)
        e = np.exp(x - x.max(-1, keepdims=True))
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), e / e.sum(-1, keepdims=True),
                                   rtol=1e-5, atol=1e-7)
    assert len(libraries(cache_folder)) == 1


def test_column_reduction_over_a_dynamic_axis(rng):
    class ColumnSum(nn.Cell):
        def construct(self, x):
            return P.ReduceSum()(x * x, 0)
    context.set_context(enable_graph_kernel=True)
    net = ColumnSum()
    net.set_inputs(Tensor(shape=[None, None], dtype=graphkernel.float32))
    for shape in ((3, 5), (1000, 700), (2, 1)):
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), (x.astype(np.float64) ** 2).sum(0),
                                   rtol=1e-4)
    (exe,) = generic(net)
    assert exe.kernels[0].output == "float32[M]"


def test_a_call_that_does_not_match_the_declaration_names_both(rng):
    net = Pointwise()
    net.set_inputs(Tensor(shape=[None, 64], dtype=graphkernel.float32))
    with pytest.raises(InputError, match=r"input 0 is float32\[3, 32\] but set_inputs declared "
                                         r"float32\[N, 64\]"):
        net(Tensor(np.ones((3, 32), np.float32)))
    with pytest.raises(InputError, match=r"float64\[3, 64\].*declared float32\[N, 64\]"):
        net(Tensor(np.ones((3, 64), np.float64)))


def test_one_symbol_in_two_inputs_must_agree(rng):
    class Two(nn.Cell):
        def construct(self, x, y):
            return x * y
    net = Two()
    net.set_inputs(Tensor(shape=[None, 8], dtype=graphkernel.float32),
                   Tensor(shape=[None, 8], dtype=graphkernel.float32))
    # Two None dims are two symbols: they may differ, so they do not broadcast together.
    with pytest.raises(ShapeError, match="dynamic dimension"):
        net(Tensor(np.ones((3, 8), np.float32)), Tensor(np.ones((3, 8), np.float32)))


def test_declared_tensor_has_no_data():
    t = Tensor(shape=[None, 64], dtype=graphkernel.float32)
    assert t.shape == (-1, 64) and t.dtype == np.float32
    assert "no data" in repr(t)
    with pytest.raises(InputError, match="no data"):
        t.asnumpy()
    with pytest.raises(InputError, match="Tensor shape"):
        Tensor(shape=["a"], dtype=graphkernel.float32)


def test_python_runner_follows_dynamic_sizes(rng):
    """Strided inputs skip the compiled entry: the step runner binds sizes and pools by
    shape."""
    context.set_context(enable_graph_kernel=True)
    net = Pointwise()
    net.set_inputs(Tensor(shape=[None, 64], dtype=graphkernel.float32))
    for b in (5, 9, 5):
        x = rng.standard_normal((b, 128)).astype(np.float32)[:, ::2]
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), pointwise_ref(net, x), rtol=2e-6,
                                   atol=1e-6)


def test_automatic_dynamic_builds_at_most_two_libraries(cache_folder, rng):
    context.set_context(enable_graph_kernel=True)
    net = Pointwise()
    for b in (3, 17, 64, 129, 1000, 1):
        x = rng.standard_normal((b, 64)).astype(np.float32)
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), pointwise_ref(net, x), rtol=2e-6,
                                   atol=1e-6)
    assert len(libraries(cache_folder)) == 2  # static for 3, then one for N
    shapes = sorted(str(e.kernels[0].output) for e in generic(net))
    assert shapes == ["float32[3,64]", "float32[N,64]"]


def test_automatic_dynamic_shares_a_symbol_between_inputs(rng):
    class Two(nn.Cell):
        def construct(self, x, y):
            return x * y + 1.0
    net = Two()
    for b in (2, 5, 11):
        x, y = (rng.standard_normal((b, 8)).astype(np.float32) for _ in range(2))
        np.testing.assert_allclose(net(Tensor(x), Tensor(y)).asnumpy(), x * y + 1, rtol=1e-6)
    assert len(generic(net)) == 2


def test_automatic_dynamic_off(cache_folder, rng):
    context.set_context(enable_graph_kernel=True, automatic_dynamic_shapes=False)
    net = Pointwise()
    for b in (3, 17, 64):
        net(Tensor(rng.standard_normal((b, 64)).astype(np.float32)))
    assert len(libraries(cache_folder)) == 3


def test_a_graph_that_cannot_be_generic_stays_static(rng):
    class Split(nn.Cell):
        def construct(self, x):
            return P.Reshape()(x, (x.shape[0], 2, 4))  # the size as a number
    context.set_context(enable_graph_kernel=True)
    net = Split()
    for b in (2, 3, 4):
        x = rng.standard_normal((b, 8)).astype(np.float32)
        np.testing.assert_array_equal(net(Tensor(x)).asnumpy(), x.reshape(b, 2, 4))
    assert len(generic(net)) == 3


def test_dumps_show_symbolic_shapes(tmp_path, rng):
    context.set_context(enable_graph_kernel=True, save_graphs=True,
                        save_graphs_path=str(tmp_path))
    net = Pointwise()
    net.set_inputs(Tensor(shape=[None, 64], dtype=graphkernel.float32))
    net(Tensor(rng.standard_normal((5, 64)).astype(np.float32)))
    text = (tmp_path / "hwopt_d_end.ir").read_text()
    assert "float32[N,64]" in text


def test_reshape_with_minus_one_keeps_the_dynamic_size(rng):
    class Rows(nn.Cell):
        def construct(self, x):
            y = P.Reshape()(x * 2.0, (-1, 8))
            return P.ReduceSum(keep_dims=True)(y, -1) + 1.0
    context.set_context(enable_graph_kernel=True)
    net = Rows()
    net.set_inputs(Tensor(shape=[None, 16], dtype=graphkernel.float32))
    for b in (1, 5, 9):
        x = rng.standard_normal((b, 16)).astype(np.float32)
        want = (x * 2).reshape(-1, 8).sum(-1, keepdims=True) + 1
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), want, rtol=1e-5, atol=1e-6)
    (exe,) = generic(net)
    assert "float32[2*N,1]" in exe.summary()


def test_a_dynamic_size_used_as_a_number_is_a_clear_error():
    class Fixed(nn.Cell):
        def construct(self, x):
            return P.Reshape()(x, (x.shape[0], 4, 4))
    net = Fixed()
    net.set_inputs(Tensor(shape=[None, 16], dtype=graphkernel.float32))
    with pytest.raises(InputError, match=r"(?s)Reshape: shape must be a tuple of integers, "
                                         r"got \(N, 4, 4\) \(N: a dynamic size has no value "
                                         r"while tracing; give -1 for it\).*"
                                         r"line \d+, in construct"):
        net(Tensor(np.ones((2, 16), np.float32)))


def test_guards_hold_for_shape_generic_graphs(rng):
    context.set_context(enable_graph_kernel=True)
    net = Pointwise()
    net.set_inputs(Tensor(shape=[None, 64], dtype=graphkernel.float32))
    net(Tensor(rng.standard_normal((3, 64)).astype(np.float32)))
    net.w = Parameter(np.full(64, 2.0, np.float32))
    for b in (3, 7):
        x = rng.standard_normal((b, 64)).astype(np.float32)
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), pointwise_ref(net, x), rtol=2e-6,
                                   atol=1e-6)
    (exe,) = generic(net)
    assert "Pointwise.w was replaced" in exe.report.recompiled_because


def test_compile_and_report_of_a_declared_cell_show_symbols(tmp_path, rng):
    from graphkernel.tools.report import compare, write_report
    net = Pointwise()
    net.set_inputs(Tensor(shape=[None, 64], dtype=graphkernel.float32))
    x = rng.standard_normal((5, 64)).astype(np.float32)
    exe = graphkernel.compile(net, x)
    assert str(exe.graph.inputs[0].tensor_type) == "float32[N,64]"
    with pytest.raises(InputError, match="declared float32"):
        graphkernel.compile(net, np.ones((5, 63), np.float32))
    out = tmp_path / "report.html"
    write_report(compare(net, x), str(out))
    assert "float32[N,64]" in out.read_text()


def test_large_calls_of_a_generic_kernel_stream_their_outputs(cache_folder, rng):
    """The dispatcher picks the variant with non-temporal stores when this call's outputs reach
    CostModel.stream_min_bytes (16 MiB), as the static emitter does for a known size."""
    class Basic(nn.Cell):
        def construct(self, x):
            return (x * 2.0 + 1.0) * 3.0

    class Norm(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm((1024,))

        def construct(self, x):
            return self.ln(x)
    context.set_context(enable_graph_kernel=True)
    for net, ref in ((Basic(), lambda x: (x * 2 + 1) * 3), (Norm(), None)):
        net.set_inputs(Tensor(shape=[None, 1024], dtype=graphkernel.float32))
        for rows in (3, 4096 + 5):  # 12 KiB of output, then just over 16 MiB
            x = rng.standard_normal((rows, 1024)).astype(np.float32)
            if ref is None:
                mean = x.astype(np.float64).mean(-1, keepdims=True)
                var = ((x - mean) ** 2).mean(-1, keepdims=True)
                want = (x - mean) / np.sqrt(var + 1e-7)
            else:
                want = ref(x)
            np.testing.assert_allclose(net(Tensor(x)).asnumpy(), want, rtol=1e-5, atol=2e-5)
        (exe,) = generic(net)
        source = exe.kernels[0].source
        # Pointwise: each line from registers; the row reduction: each row from the stack.
        store = "gk_stream(&out0" if ref is None else "gk_stream_line(&out0"
        assert "_stream(args);" in source and store in source
    assert len(libraries(cache_folder)) == 2  # one per cell, for both sizes


@pytest.mark.parametrize("length", [5, 1024, 1025, 3 * 1024 + 7, 100_000])
def test_a_dynamic_row_sums_as_the_static_kernel_does(length, rng):
    """A row of run-time length is summed in the same order as a static row of that length
    (one accumulator up to ROW_BLOCK, blocks combined pairwise beyond): equal bit for bit."""
    x = (1 + 1e-3 * rng.standard_normal((3, length))).astype(np.float32)
    context.set_context(enable_graph_kernel=True)
    static = nn.Softmax()(Tensor(x)).asnumpy()
    net = nn.Softmax()
    net.set_inputs(Tensor(shape=[None, None], dtype=graphkernel.float32))
    np.testing.assert_array_equal(net(Tensor(x)).asnumpy(), static)
    assert "float32[N,M]" in generic(net)[0].summary()


def test_the_digits_cnn_with_a_dynamic_batch_matches_its_static_graphs(rng):
    """Convolutions, folded BatchNorms, pools, Flatten and Dense over a batch symbol: one
    generic graph for three batch sizes, equal to a static compile of each (library calls
    through views need static strides: those layout ops run as numpy steps here)."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "cnn_digits.py"
    spec = importlib.util.spec_from_file_location("example_cnn_digits_dynamic", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.DigitsCNN()
    net.set_train(False)
    options = graphkernel.graph_kernel.pipeline.CompileOptions(enable_graph_kernel=True)
    x = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
    exe = graphkernel.compile(net, x, types=[graphkernel.ir.types.TensorType(
        (graphkernel.ir.types.SymSize.dim("N"), 1, 8, 8), np.dtype(np.float32))],
        options=options)
    assert "float32[N,10]" in exe.summary()
    for batch in (1, 7, 33):
        x = rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)
        static = graphkernel.compile(net, x, options=options).run_arrays(x)[0]
        np.testing.assert_allclose(exe.run_arrays(x)[0], static, rtol=1e-5, atol=1e-5)


# -- Symbol: shared and constrained dynamic dimensions (MindSpore's mindspore.Symbol) ----------

class Scale(nn.Cell):
    """Two inputs that meet: rows of x times one weight per row in w."""

    def construct(self, x, w):
        return x * w + 1.0


def test_a_unique_symbol_is_one_batch_of_two_inputs(cache_folder, rng):
    context.set_context(enable_graph_kernel=True)
    net = Scale()
    batch = Symbol(unique=True)
    net.set_inputs(Tensor(shape=[batch, 8], dtype=graphkernel.float32),
                   Tensor(shape=[batch, 1], dtype=graphkernel.float32))
    for b in (1, 5, 17):
        x = rng.standard_normal((b, 8)).astype(np.float32)
        w = rng.standard_normal((b, 1)).astype(np.float32)
        np.testing.assert_allclose(net(Tensor(x), Tensor(w)).asnumpy(), x * w + 1, rtol=1e-6)
    (exe,) = generic(net)
    assert [str(i.tensor_type) for i in exe.graph.inputs[:2]] == ["float32[N,8]", "float32[N,1]"]
    assert exe.fast_call is not None  # no constraint to check: the per-call path stays
    assert len(libraries(cache_folder)) == 1
    with pytest.raises(InputError, match=r"input 1 is float32\[4, 1\] but set_inputs declared "
                                         r"float32\[N, 1\] \(axis 0: N is 3 in an earlier "
                                         r"input, 4 here\)"):
        net(Tensor(np.ones((3, 8), np.float32)), Tensor(np.ones((4, 1), np.float32)))


def test_a_symbol_that_is_not_unique_shares_only_its_constraints(rng):
    """MindSpore's meaning: without unique, each dimension is a size of its own."""
    class Both(nn.Cell):
        def construct(self, x, y):
            return x * 2.0, y * 3.0
    net = Both()
    rows = Symbol(max=8)
    net.set_inputs(Tensor(shape=[rows, 4], dtype=graphkernel.float32),
                   Tensor(shape=[rows, 4], dtype=graphkernel.float32))
    x, y = np.ones((3, 4), np.float32), np.ones((5, 4), np.float32)
    a, b = net(Tensor(x), Tensor(y))
    np.testing.assert_array_equal(a.asnumpy(), x * 2)
    np.testing.assert_array_equal(b.asnumpy(), y * 3)
    with pytest.raises(InputError, match=r"Both input 1 axis 0 is 9, but it must be at most 8 "
                                         r"\(Symbol\(max=8\)\)"):
        net(Tensor(x), Tensor(np.ones((9, 4), np.float32)))
    net = Scale()
    net.set_inputs(Tensor(shape=[rows, 8], dtype=graphkernel.float32),
                   Tensor(shape=[rows, 1], dtype=graphkernel.float32))
    with pytest.raises(ShapeError, match="dynamic dimension"):
        net(Tensor(np.ones((3, 8), np.float32)), Tensor(np.ones((3, 1), np.float32)))


def test_symbol_constraints_are_checked_on_every_call(rng):
    """Each call, the compiled entry's per-call path included (it checks only the types)."""
    context.set_context(enable_graph_kernel=True)
    net = Pointwise()
    net.set_inputs(Tensor(shape=[Symbol(min=2, max=64, divisor=8, remainder=1), 64],
                          dtype=graphkernel.float32))
    for b in (9, 17, 9, 57):
        x = rng.standard_normal((b, 64)).astype(np.float32)
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), pointwise_ref(net, x), rtol=2e-6,
                                   atol=1e-6)
    assert len(generic(net)) == 1
    for b, need in ((10, "1 modulo 8"), (1, "at least 2"), (65, "at most 64")):
        with pytest.raises(InputError, match=rf"Pointwise input 0 axis 0 is {b}, but it must be "
                                             rf"{need} \(Symbol\(max=64, min=2, divisor=8, "
                                             r"remainder=1\)\)"):
            net(Tensor(np.ones((b, 64), np.float32)))
    exe = graphkernel.compile(net, np.ones((9, 64), np.float32))
    with pytest.raises(InputError, match="axis 0 is 10, but it must be 1 modulo 8"):
        exe(np.ones((10, 64), np.float32))


def test_a_symbol_divisor_is_in_the_type(rng):
    net = Pointwise()
    net.set_inputs(Tensor(shape=[Symbol(divisor=4), 64], dtype=graphkernel.float32))
    x = rng.standard_normal((12, 64)).astype(np.float32)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), pointwise_ref(net, x), rtol=2e-6,
                               atol=1e-6)
    assert str(generic(net)[0].graph.inputs[0].tensor_type) == "float32[4*N,64]"
    x = rng.standard_normal((8, 128)).astype(np.float32)[:, ::2]  # the Python runner's path
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), pointwise_ref(net, x), rtol=2e-6,
                               atol=1e-6)
    with pytest.raises(InputError, match=r"axis 0: axis size 6 must be a multiple of 4"):
        net(Tensor(np.ones((6, 64), np.float32)))


def test_a_named_symbol_for_importers():
    batch = Symbol.named("batch", max=32)
    assert batch.unique and batch.name == "batch"
    assert repr(batch) == "Symbol(name='batch', max=32, unique=True)"
    net = Scale()
    net.set_inputs(Tensor(shape=[batch, 8], dtype=graphkernel.float32),
                   Tensor(shape=[batch, 1], dtype=graphkernel.float32))
    assert "Symbol(name='batch'" in repr(Tensor(shape=[batch, 8], dtype=graphkernel.float32))
    with pytest.raises(InputError, match=r"input 0 axis 0 is 40, but it must be at most 32 "
                                         r"\(Symbol\(name='batch', max=32, unique=True\)\)"):
        net(Tensor(np.ones((40, 8), np.float32)), Tensor(np.ones((40, 1), np.float32)))


@pytest.mark.parametrize("arguments, error, message", [
    ({"min": 0}, ShapeError, "min must be positive"),
    ({"divisor": 0}, ShapeError, "divisor must be positive"),
    ({"divisor": 4, "remainder": 4}, ShapeError, r"remainder must be in \[0, divisor\)"),
    ({"max": 2.5}, InputError, "max must be an int"),
    ({"unique": 1}, InputError, "unique must be True or False"),
    ({"name": ""}, InputError, "name must be a non-empty str"),
    ({"maximum": 4}, InputError, "got maximum"),
])
def test_symbol_arguments_are_checked(arguments, error, message):
    with pytest.raises(error, match=message):
        Symbol(**arguments)


@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_a_dynamic_batch_training_step_matches_static_compiles(fusion, reduction, rng):
    """Data [N, 4] and labels [N] share one Symbol: one compiled step serves batches 3, 8 and
    16, equal to a step compiled for each batch (the same losses, the same weights after)."""
    context.set_context(enable_graph_kernel=fusion, automatic_dynamic_shapes=False)
    step, net = make_training_step(reduction)
    batch = Symbol(unique=True)
    step.set_inputs(Tensor(shape=[batch, 4], dtype=graphkernel.float32),
                    Tensor(shape=[batch], dtype=graphkernel.int32))
    static_step, static_net = make_training_step(reduction)
    for b in (3, 8, 16):
        x = rng.standard_normal((b, 4)).astype(np.float32)
        y = rng.integers(0, 3, b).astype(np.int32)
        loss = step(Tensor(x), Tensor(y)).asnumpy()
        np.testing.assert_allclose(loss, static_step(Tensor(x), Tensor(y)).asnumpy(),
                                   rtol=1e-6)
        for p, q in zip(net.trainable_params(), static_net.trainable_params()):
            np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-6, atol=1e-7)
    assert len(generic(step)) == 1
    assert len(generic(static_step)) == 3


def test_a_mean_over_a_dynamic_axis_is_shape_generic(rng):
    class Mean(nn.Cell):
        def construct(self, x):
            return P.ReduceMean(keep_dims=True)(x, 0) - P.ReduceMean()(x, ())
    context.set_context(enable_graph_kernel=True)
    net = Mean()
    net.set_inputs(Tensor(shape=[None, 8], dtype=graphkernel.float32))
    for b in (1, 3, 100):
        x = rng.standard_normal((b, 8)).astype(np.float32)
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), x.mean(0, keepdims=True) - x.mean(),
                                   rtol=1e-5, atol=1e-6)
    assert len(generic(net)) == 1


def make_training_step(reduction):
    graphkernel.set_seed(7)
    net = nn.SequentialCell([nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 3)])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction=reduction)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss),
                               nn.Momentum(net.trainable_params(), 0.1, 0.9))
    return step, net


@pytest.mark.parametrize("fusion", [True, False])
def test_a_training_step_compiles_for_a_batch_symbol(fusion, rng):
    """The gradients of a mean loss over a dynamic batch (BroadcastTo and Reshape back to
    [N, ...], the mean's 1/N) in a graph compiled for types with one symbol N: equal to a
    static compile of each batch."""
    from graphkernel.graph_kernel.pipeline import CompileOptions
    from graphkernel.ir.types import SymSize, TensorType
    options = CompileOptions(enable_graph_kernel=fusion)
    n = SymSize.dim("N")
    types = [TensorType((n, 4), np.dtype(np.float32)), TensorType((n,), np.dtype(np.int32))]
    for b in (3, 16):
        x = rng.standard_normal((b, 4)).astype(np.float32)
        y = rng.integers(0, 3, b).astype(np.int32)
        generic_step, generic_net = make_training_step("mean")
        static_step, static_net = make_training_step("mean")
        exe = graphkernel.compile(generic_step, x, y, types=types, options=options)
        np.testing.assert_allclose(exe(x, y).asnumpy(), graphkernel.compile(
            static_step, x, y, options=options)(x, y).asnumpy(), rtol=1e-6)
        for p, q in zip(generic_net.trainable_params(), static_net.trainable_params()):
            np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-6, atol=1e-7)


# -- Reshape's -1 of a dynamic size -----------------------------------------------------------

class Regroup(nn.Cell):
    def construct(self, x):
        return P.Reshape()(x * 2.0, (-1, 4)) + 1.0


@pytest.mark.parametrize("fusion", [True, False])
def test_reshape_of_a_dynamic_size_needs_a_multiple(fusion, rng):
    """[N, 6] into (-1, 4) is whole for even N: compiled once for those, [3N/2, 4] as
    [3*N, 4] of inputs [2*N, 6]; an odd N is a clear error naming the input, the axis and the
    Reshape, on every path."""
    context.set_context(enable_graph_kernel=fusion)
    net = Regroup()
    net.set_inputs(Tensor(shape=[None, 6], dtype=graphkernel.float32))
    for b in (2, 4, 10, 4):
        x = rng.standard_normal((b, 6)).astype(np.float32)
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), (x * 2).reshape(-1, 4) + 1,
                                   rtol=1e-6)
    (exe,) = generic(net)
    assert str(exe.graph.inputs[0].tensor_type) == "float32[2*N,6]"
    assert str(exe.graph.outputs[0].type) == "float32[3*N,4]"
    odd = r"(?s)Regroup input 0 axis 0 is {}, but it must be a multiple of 2 \(Reshape of " \
        r"\(N, 6\) into \(-1, 4\).*line \d+, in construct"
    for b in (3, 7):
        with pytest.raises(InputError, match=odd.format(b)):
            net(Tensor(np.ones((b, 6), np.float32)))
    first_odd = Regroup()
    first_odd.set_inputs(Tensor(shape=[None, 6], dtype=graphkernel.float32))
    with pytest.raises(InputError, match=odd.format(5)):
        first_odd(Tensor(np.ones((5, 6), np.float32)))
    with pytest.raises(InputError, match=odd.format(1)):
        exe(np.ones((1, 6), np.float32))


def test_automatic_dynamic_shapes_reshape_even_sizes_generically(rng):
    """The automatic graph takes 2*N too; an odd size (no Reshape of it is whole) is then the
    static compile's clear error, and even sizes still use the generic graph."""
    context.set_context(enable_graph_kernel=True)
    net = Regroup()
    for b in (2, 4, 6):
        x = rng.standard_normal((b, 6)).astype(np.float32)
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), (x * 2).reshape(-1, 4) + 1,
                                   rtol=1e-6)
    with pytest.raises(ShapeError, match=r"Reshape of \(3, 6\) into \(-1, 4\): 18 elements "
                                         r"do not split into rows of 4"):
        net(Tensor(np.ones((3, 6), np.float32)))
    x = rng.standard_normal((8, 6)).astype(np.float32)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), (x * 2).reshape(-1, 4) + 1, rtol=1e-6)
    assert [str(exe.graph.inputs[0].tensor_type) for exe in generic(net)] == \
        ["float32[2,6]", "float32[2*N,6]"]


@pytest.mark.parametrize("shape, declared, message", [
    ((4, 6), [None, 6], r"cannot reshape \(N, 6\) \(6\*N elements\) into \(4, 6\) \(a dynamic "
                        r"size cannot become a static one"),
    ((-1, 4), [None, None], r"the size M\*N splits into rows of 4 only for some values of M, N"),
    ((-1, 0), [None, 6], "the other dimensions hold no elements"),
    ((-1, 4), [Symbol(divisor=2, remainder=1), 6],
     r"only when N is a multiple of 2, but no size of N is 1 modulo 2 and a multiple of 2"),
])
def test_a_reshape_no_dynamic_size_allows_is_refused(shape, declared, message):
    class Bad(nn.Cell):
        def construct(self, x):
            return P.Reshape()(x, shape)
    net = Bad()
    net.set_inputs(Tensor(shape=declared, dtype=graphkernel.float32))
    with pytest.raises(ShapeError, match=message):
        net(Tensor(np.ones((3, 6), np.float32)))
