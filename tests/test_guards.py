"""Guards: a compiled graph records the attributes `construct` read, the Parameter objects it
captured and the context; a call after one of them changed recompiles, while Parameter data
changed in place or by set_data is read without recompiling."""
import numpy as np
import pytest

from graphkernel import Parameter, Tensor, nn
from graphkernel.errors import ShapeError
from graphkernel.frontend import context
from graphkernel.ops import operations as P


class Scaled(nn.Cell):
    def __init__(self, shape=(4, 4)):
        super().__init__()
        self.scale = 2.0
        self.offset = (1.0, 3)
        self.use_relu = False
        self.w = Parameter(np.ones(shape, np.float32), name="w")
        self.mul = P.Mul()
        self.relu = P.ReLU()
        self.note = "never read by construct"

    def construct(self, x):
        y = self.mul(x, self.scale) + self.w + self.offset[0] * self.offset[1]
        if self.use_relu:
            y = self.relu(y)
        return y


def _expected(net, x):
    y = x * net.scale + net.w.asnumpy() + net.offset[0] * net.offset[1]
    return np.maximum(y, 0) if net.use_relu else y


@pytest.fixture(params=[True, False], ids=["fused", "unfused"])
def fusion(request):
    context.set_context(enable_graph_kernel=request.param)
    return request.param


def _compiled(net):
    (exe,) = net._compiled.values()
    return exe


def test_changing_a_number_read_by_construct_changes_the_result(fusion, rng):
    net, x = Scaled(), rng.standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _expected(net, x), rtol=1e-6)
    first = _compiled(net)
    net.scale = 5.0
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _expected(net, x), rtol=1e-6)
    assert _compiled(net) is not first
    assert _compiled(net).report.recompiled_because == "Scaled.scale changed from 2.0 to 5.0"
    assert "recompiled because Scaled.scale changed" in _compiled(net).summary()


def test_tuples_and_flags_are_guarded_by_value(fusion, rng):
    net, x = Scaled(), rng.standard_normal((4, 4)).astype(np.float32) - 3
    net(Tensor(x))
    net.offset = (2.0, 3)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _expected(net, x), rtol=1e-6)
    net.use_relu = True
    out = net(Tensor(x)).asnumpy()
    np.testing.assert_allclose(out, _expected(net, x), rtol=1e-6)
    assert (out == 0).any() and "ReLU" in [n.op for n in _compiled(net).stages["0_trace"].nodes]


def test_replacing_a_parameter_changes_the_result(fusion, rng):
    net, x = Scaled(), rng.standard_normal((4, 4)).astype(np.float32)
    net(Tensor(x))
    net.w = Parameter(np.full((4, 4), 10.0, np.float32))
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _expected(net, x), rtol=1e-6)
    assert "Scaled.w was replaced by another Parameter" in _compiled(net).report.recompiled_because
    assert net.trainable_params() == [net.w]


def test_replacing_a_sub_cell_recompiles(rng):
    class Outer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.inner = Scaled()

        def construct(self, x):
            return self.inner(x) * 2.0
    net, x = Outer(), rng.standard_normal((4, 4)).astype(np.float32)
    net(Tensor(x))
    net.inner.scale = -1.0  # an attribute of a sub-cell
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), 2 * _expected(net.inner, x), rtol=1e-6)
    net.inner = Scaled()
    net.inner.w.set_data(np.full((4, 4), 7.0))
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), 2 * _expected(net.inner, x), rtol=1e-6)


def test_parameter_data_is_read_without_recompiling(fusion, rng):
    net, x = Scaled(), rng.standard_normal((4, 4)).astype(np.float32)
    net(Tensor(x))
    first = _compiled(net)
    net.w.set_data(np.full((4, 4), 3.0))
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _expected(net, x), rtol=1e-6)
    net.w[0, 0] = 100.0  # in place (asnumpy() is a read-only view)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _expected(net, x), rtol=1e-6)
    assert _compiled(net) is first


def test_set_data_keeps_the_shape_a_new_parameter_changes_it(rng):
    net, x = Scaled(), rng.standard_normal((4, 4)).astype(np.float32)
    net(Tensor(x))
    with pytest.raises(ShapeError, match=r"Parameter 'w' is float32\[4, 4\]; set_data got "
                                         r"shape \[1, 4\].*cell.weight = Parameter"):
        net.w.set_data(np.ones((1, 4)))
    net.w.set_data(np.full((4, 4), 2, np.int64))  # cast to the Parameter's dtype
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _expected(net, x), rtol=1e-6)
    net.w = Parameter(np.full((1, 4), 3.0, np.float32))  # another shape: a new Parameter
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _expected(net, x), rtol=1e-6)


def test_unread_or_unchanged_attributes_do_not_recompile(rng):
    net, x = Scaled(), rng.standard_normal((4, 4)).astype(np.float32)
    net(Tensor(x))
    first = _compiled(net)
    net.note = "changed, but construct never reads it"
    net.scale = 2.0  # the same value again
    net.extra = 1
    net(Tensor(x))
    assert _compiled(net) is first
    assert first.guards.hold()  # compared once by value, then by identity again


def test_an_integer_is_not_a_float_of_the_same_value(rng):
    net, x = Scaled(), rng.standard_normal((4, 4)).astype(np.float32)
    net(Tensor(x))
    first = _compiled(net)
    net.scale = 2  # an int scalar traces as another constant dtype rule
    net(Tensor(x))
    assert _compiled(net) is not first


def test_an_attribute_construct_looked_up_with_a_default(rng):
    class Optional(nn.Cell):
        def construct(self, x):
            bias = getattr(self, "bias", None)
            return x if bias is None else x + bias
    net, x = Optional(), rng.standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), x)
    net.bias = 1.5
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), x + 1.5, rtol=1e-6)
    del net.bias
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), x)


def test_context_and_flags_are_part_of_the_key(rng):
    net, x = Scaled(), rng.standard_normal((4, 4)).astype(np.float32)
    context.set_context(enable_graph_kernel=True)
    net(Tensor(x))
    assert _compiled(net).kernel_count == 1
    context.set_context(graph_kernel_flags="--enable_cluster_ops_only=Mul")
    net(Tensor(x))
    assert len(net._compiled) == 2
    context.set_context(graph_kernel_flags="")  # the same settings as the first call again
    net(Tensor(x))
    assert len(net._compiled) == 2


def test_tracing_leaves_the_cell_class_alone(rng):
    net = Scaled()
    net(Tensor(rng.standard_normal((4, 4)).astype(np.float32)))
    assert type(net) is Scaled


# -- writes however made: the check reads the attributes themselves -------------------------

def test_writes_that_bypass_setattr_recompile(fusion, rng):
    net, x = Scaled(), rng.standard_normal((4, 4)).astype(np.float32) - 1
    net(Tensor(x))
    object.__setattr__(net, "scale", 5.0)  # no Cell.__setattr__
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _expected(net, x), rtol=1e-6)
    assert _compiled(net).report.recompiled_because == "Scaled.scale changed from 2.0 to 5.0"
    net.__dict__["use_relu"] = True
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _expected(net, x), rtol=1e-6)
    object.__setattr__(net, "w", Parameter(np.full((4, 4), 10.0, np.float32), name="w"))
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _expected(net, x), rtol=1e-6)
    assert "Scaled.w was replaced by another Parameter" in \
        _compiled(net).report.recompiled_because


def test_cells_held_outside_the_sub_cells_are_guarded(rng):
    class Holder(nn.Cell):
        def __init__(self):
            super().__init__()
            object.__setattr__(self, "hidden", Scaled())  # not a registered sub-cell
            self.listed = [Scaled()]  # a plain list, not a CellList

        def construct(self, x):
            return self.listed[0](self.hidden(x))
    net, x = Holder(), rng.standard_normal((4, 4)).astype(np.float32)
    net(Tensor(x))
    net.hidden.scale = 3.0
    net.listed[0].use_relu = True
    want = _expected(net.listed[0], _expected(net.hidden, x))
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), want, rtol=1e-6)


class _Block(nn.Cell):
    def __init__(self, p):
        super().__init__()
        self.fc = nn.Dense(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(p=p)

    def construct(self, x):
        return self.drop(self.bn(self.fc(x)))


class _Outer(nn.Cell):
    def __init__(self, p=0.5):
        super().__init__()
        self.block = _Block(p)

    def construct(self, x):
        return self.block(x) * 1.0


def _twin(net):
    """A new _Outer (in inference) with net's weights and moving statistics."""
    twin = _Outer(net.block.drop.p)
    for (_, p), (_, q) in zip(net.parameters_and_names(), twin.parameters_and_names()):
        q.set_data(p.asnumpy())
    return twin


def test_set_train_of_a_sub_cell_after_the_parent_compiled(fusion, rng):
    """The parent's graph inlines the sub-cells: BatchNorm's statistics and Dropout follow the
    sub-cells' `training`, which set_train writes with object.__setattr__ (the parent kept its
    eval graph: max error 2.6)."""
    net, x = _Outer(p=0.0), (rng.standard_normal((16, 8)) * 3 + 1).astype(np.float32)
    eval_out = net(Tensor(x)).asnumpy()
    net.block.bn.set_train(True)  # two levels down
    want = _twin(net)
    want.block.bn.set_train(True)
    got = net(Tensor(x)).asnumpy()
    np.testing.assert_allclose(got, want(Tensor(x)).asnumpy(), rtol=1e-5, atol=1e-5)
    assert np.abs(got - eval_out).max() > 0.1
    assert "BatchNorm1d.training changed from False to True" in \
        _compiled(net).report.recompiled_because
    net.block.bn.set_train(False)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _twin(net)(Tensor(x)).asnumpy(),
                               rtol=1e-5, atol=1e-5)


def test_dropout_follows_set_train_of_a_deep_child(fusion, rng):
    net, x = _Outer(), rng.standard_normal((16, 8)).astype(np.float32)
    net.set_train(True)  # compiled with Dropout dropping and batch statistics
    assert (net(Tensor(x)).asnumpy() == 0).any()
    net.block.set_train(False)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), _twin(net)(Tensor(x)).asnumpy(),
                               rtol=1e-5, atol=1e-5)  # no element dropped


def test_a_graph_with_number_inputs_is_guarded(rng):
    class Shifted(Scaled):
        def construct(self, x, shift):
            return super().construct(x) + shift
    net, x = Shifted(), rng.standard_normal((4, 4)).astype(np.float32)
    net(Tensor(x), 1.0)
    net.scale = 5.0
    np.testing.assert_allclose(net(Tensor(x), 1.0).asnumpy(), _expected(net, x) + 1.0,
                               rtol=1e-6)


def test_a_cell_appended_to_a_sequential_cell_runs(rng):
    net, x = nn.SequentialCell([nn.ReLU()]), rng.standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), np.maximum(x, 0))
    net.append(nn.Tanh())
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), np.tanh(np.maximum(x, 0)), rtol=1e-6)


# -- training loops: the optimizer's step count, rates and moments live in Parameters the graph
# writes (Graph.assigns), so a loop of steps reads no changed attribute and compiles once.

class _Mlp(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 16, activation="relu")
        self.fc2 = nn.Dense(16, 2)

    def construct(self, x):
        return self.fc2(self.fc1(x))


def _optimizers(params):
    schedule = nn.ExponentialDecayLR(0.05, 0.5, decay_steps=2, is_stair=True)
    return {"Adam+ExponentialDecayLR": nn.Adam(params, schedule),
            "Momentum+per-step rates": nn.Momentum(params, [0.05, 0.04, 0.03, 0.02], 0.9),
            "SGD": nn.SGD(params, 0.05)}


@pytest.mark.parametrize("which", ["Adam+ExponentialDecayLR", "Momentum+per-step rates", "SGD"])
def test_a_training_loop_compiles_once(which, fusion, rng, tmp_path, monkeypatch):
    import glob
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(tmp_path / "kernels"))
    net = _Mlp()
    optimizer = _optimizers(net.trainable_params())[which]
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = np.stack([x[:, :4].sum(1), x[:, 4:].sum(1)], 1).astype(np.float32)
    w0 = net.fc1.weight.asnumpy().copy()
    losses, first = [], None
    for i in range(8):
        losses.append(float(step(Tensor(x), Tensor(y)).asnumpy()))
        (exe,) = step._compiled.values()
        first = first or exe
        assert exe is first, f"step {i} recompiled: {exe.report.recompiled_because}"
    assert losses[-1] < losses[0] and not np.array_equal(net.fc1.weight.asnumpy(), w0)
    if optimizer.dynamic_lr:
        assert float(optimizer.global_step.asnumpy()) == 8  # the count moved, in the graph
    libraries = glob.glob(str(tmp_path / "kernels" / "*.so"))
    # One library for all eight steps (or, unfused, none when numpy runs every op).
    assert len(libraries) == 1 if fusion else len(libraries) <= 1


def test_changing_an_optimizer_setting_between_steps_recompiles(rng):
    net = _Mlp()
    optimizer = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    x, y = rng.standard_normal((4, 8)).astype(np.float32), np.zeros((4, 2), np.float32)
    step(Tensor(x), Tensor(y))
    first = _compiled(step)
    optimizer.momentum = 0.0  # a float construct reads: baked into the graph, so guarded
    step(Tensor(x), Tensor(y))
    assert _compiled(step) is not first
    assert _compiled(step).report.recompiled_because == "Momentum.momentum changed from 0.9 to 0.0"
