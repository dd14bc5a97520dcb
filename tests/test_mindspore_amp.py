"""graphkernel.amp and Model.train's progress bar, the training-side APIs a MindSpore LeNet-style
script reaches (issue 28; the rest are in test_mindspore_api.py): auto_mixed_precision's
levels against a numpy reference, float32 weights under mixed-precision training, the loss-scale
cell and managers through Model, and a progress bar on a terminal only."""
import numpy as np
import pytest
from cells import fused_and_unfused_outputs

import graphkernel as ms
from graphkernel import Tensor, nn
from graphkernel.errors import InputError


@pytest.fixture(autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE, enable_graph_kernel=True)
    yield
    ms.set_context(mode=ms.GRAPH_MODE, enable_graph_kernel=False)


# -- graphkernel.amp --------------------------------------------------------------------------

class _AmpNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 16)
        self.bn = nn.BatchNorm1d(16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x):
        return self.fc2(self.relu(self.bn(self.fc1(x))))


def _amp_reference(net, x, level):
    """The eval-mode net in numpy, each layer in the dtype the level gives it."""
    p = {q.name: q.asnumpy() for q in net.get_parameters()}
    low = {"O0": np.float32}.get(level, np.float16)
    dense_dt = low
    bn_dt = {"O0": np.float32, "O1": np.float32, "O2": np.float32, "O3": np.float16}[level]
    rest_dt = np.float16 if level in ("O2", "O3") else np.float32

    def dense(v, name, dt):
        return (v.astype(dt) @ p[name + ".weight"].astype(dt).T + p[name + ".bias"].astype(dt))

    h = dense(x, "fc1", dense_dt).astype(bn_dt)
    mean, var = p["bn.moving_mean"].astype(bn_dt), p["bn.moving_variance"].astype(bn_dt)
    h = (h - mean) / np.sqrt(var + bn_dt(1e-5)) * p["bn.gamma"].astype(bn_dt) + \
        p["bn.beta"].astype(bn_dt)
    h = np.maximum(h.astype(rest_dt), 0)
    return dense(h, "fc2", dense_dt).astype(np.float32)


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_auto_mixed_precision_levels(level):
    """
    Feature: graphkernel.amp.auto_mixed_precision
    Description: a Dense-BatchNorm-ReLU-Dense net at each level, eval mode, fused and unfused
    Expectation: float32 outputs equal to numpy computing each layer in the level's dtype
        (float16 where MindSpore's level puts it); the weights stay float32
    """
    rng = np.random.default_rng(11)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    net = _AmpNet()
    full = net(Tensor(x)).asnumpy()
    assert ms.amp.auto_mixed_precision(net, level) is net
    (got,) = fused_and_unfused_outputs(lambda: net, x)
    assert got.dtype == np.float32
    assert all(q.dtype == np.float32 for q in net.get_parameters())
    want = _amp_reference(net, x, level)
    tolerance = 1e-6 if level == "O0" else 4e-3
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
    if level != "O0":  # float16 arithmetic really happened: not the float32 result
        assert np.abs(got - full).max() > 1e-5


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_mixed_precision_training_updates_float32_weights(level):
    """
    Feature: training an auto_mixed_precision network
    Description: TrainOneStepCell steps with CrossEntropyLoss and Momentum
    Expectation: the loss falls; weights, their updates and BatchNorm's statistics stay float32
    """
    rng = np.random.default_rng(12)
    x = rng.standard_normal((32, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + 2 * (x[:, 1] > 0).astype(np.int32)
    net = ms.amp.auto_mixed_precision(_AmpNet(), level)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.CrossEntropyLoss()),
                               nn.Momentum(net.trainable_params(), 0.1, 0.9))
    losses = [float(step(Tensor(x), Tensor(y)).asnumpy()) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    assert all(q.dtype == np.float32 for q in net.get_parameters())


def test_auto_mixed_precision_refuses_unknown_levels():
    with pytest.raises(InputError, match="amp_level must be one of O0, O1, O2, O3"):
        ms.amp.auto_mixed_precision(_AmpNet(), "O4")


def _copy_weights(src, dst):
    for a, b in zip(src.get_parameters(), dst.get_parameters()):
        b.set_data(Tensor(a.asnumpy().copy()))


def test_loss_scale_cell_matches_the_plain_step_and_drops_overflows():
    """
    Feature: nn.TrainOneStepWithLossScaleCell, amp.FixedLossScaleManager and
        DynamicLossScaleManager
    Description: steps with a power-of-two scale beside TrainOneStepCell from the same weights;
        then a float16 network with MindSpore's initial dynamic scale, 2**24, where they overflow
    Expectation: the same weights as the unscaled steps; an overflowing step leaves weights and
        momentum as they were, and the dynamic scale falls by scale_factor, rising again after
        scale_window good steps
    """
    rng = np.random.default_rng(13)
    x = rng.standard_normal((16, 6)).astype(np.float32)
    y = rng.integers(0, 4, 16).astype(np.int32)
    plain_net, scaled_net = _AmpNet(), _AmpNet()
    _copy_weights(plain_net, scaled_net)
    plain = nn.TrainOneStepCell(nn.WithLossCell(plain_net, nn.CrossEntropyLoss()),
                                nn.Momentum(plain_net.trainable_params(), 0.1, 0.9))
    optimizer = nn.Momentum(scaled_net.trainable_params(), 0.1, 0.9)
    manager = ms.amp.FixedLossScaleManager(1024.0)
    scaled = nn.TrainOneStepWithLossScaleCell(
        nn.WithLossCell(scaled_net, nn.CrossEntropyLoss()), optimizer,
        manager.get_update_cell())
    for _ in range(3):
        want = plain(Tensor(x), Tensor(y))
        loss, overflow, scale = scaled(Tensor(x), Tensor(y))
        np.testing.assert_allclose(loss.asnumpy(), want.asnumpy(), rtol=1e-6)
        assert not overflow.asnumpy() and scale.asnumpy() == 1024.0
    for a, b in zip(plain_net.get_parameters(), scaled_net.get_parameters()):
        np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-5, atol=1e-7)

    ms.amp.auto_mixed_precision(scaled_net, "O3")  # float16 gradients: 2**24 overflows
    dynamic = ms.amp.DynamicLossScaleManager(scale_factor=2, scale_window=2)
    scaled = nn.TrainOneStepWithLossScaleCell(
        nn.WithLossCell(scaled_net, nn.CrossEntropyLoss()), optimizer,
        dynamic.get_update_cell())
    before = [q.asnumpy().copy() for q in optimizer.get_parameters()]
    loss, overflow, scale = scaled(Tensor(x), Tensor(y))
    assert overflow.asnumpy() and scale.asnumpy() == 2.0 ** 24
    for q, old in zip(optimizer.get_parameters(), before):  # weights and momentum as they were
        np.testing.assert_array_equal(q.asnumpy(), old)
    assert dynamic.get_loss_scale() == 2.0 ** 23
    dynamic.loss_scale = 1024.0
    for _ in range(2):
        assert not scaled(Tensor(x), Tensor(y))[1].asnumpy()
    assert dynamic.get_loss_scale() == 2048.0


def test_model_with_amp_level_and_loss_scale_manager():
    """
    Feature: train.Model(amp_level=..., loss_scale_manager=...)
    Description: Model.train of an O2 network with a DynamicLossScaleManager, then Model.eval
    Expectation: the network computes in float16 (outputs float32), trains, and evaluates
    """
    from graphkernel import dataset as ds
    from graphkernel.train import Model
    rng = np.random.default_rng(14)
    x = rng.standard_normal((64, 6)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int32) + 2 * (x[:, 1] > 0)).astype(np.int32)
    net = _AmpNet()
    model = Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9),
                  metrics={"accuracy", "loss"}, amp_level="O2",
                  loss_scale_manager=ms.amp.DynamicLossScaleManager(2.0 ** 12))
    assert isinstance(model.train_network, nn.TrainOneStepWithLossScaleCell)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(16)
    before = model.eval(data)
    model.train(15, data)
    after = model.eval(data)
    assert after["loss"] < 0.6 * before["loss"] and after["accuracy"] > 0.8
    assert net(Tensor(x)).dtype == np.float32 and net.fc1._compute_dtype == np.float16
    with pytest.raises(InputError, match="loss_scale_manager must be a graphkernel.amp"):
        Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9),
              loss_scale_manager=1024)


# -- Model.train's progress bar ---------------------------------------------------------------

class _Terminal:
    """A stdout that says it is a terminal, keeping what is written."""

    def __init__(self):
        import io
        self.buffer = io.StringIO()

    def isatty(self):
        return True

    def write(self, text):
        return self.buffer.write(text)

    def flush(self):
        pass


def _train_digits_like(monkeypatch, stdout, steps):
    from graphkernel import dataset as ds
    from graphkernel.train import Model
    monkeypatch.setattr("sys.stdout", stdout)
    rng = np.random.default_rng(15)
    x = rng.standard_normal((steps * 4, 6)).astype(np.float32)
    y = rng.integers(0, 4, steps * 4).astype(np.int32)
    net = _AmpNet()
    model = Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9))
    model.train(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4))


def test_progress_bar_on_a_terminal_only(monkeypatch):
    """
    Feature: Model.train's progress bar (rich)
    Description: 60 steps with stdout a terminal; then not a terminal; then 10 steps
    Expectation: a bar counting to 60/60 on the terminal; nothing written otherwise
    """
    pytest.importorskip("rich")
    terminal = _Terminal()
    _train_digits_like(monkeypatch, terminal, 60)
    assert "60/60" in terminal.buffer.getvalue() and "epoch 1 loss" in terminal.buffer.getvalue()
    import io
    for stdout, steps in ((io.StringIO(), 60), (_Terminal(), 10)):
        _train_digits_like(monkeypatch, stdout, steps)
        written = stdout.getvalue() if isinstance(stdout, io.StringIO) else \
            stdout.buffer.getvalue()
        assert written == ""


def test_no_progress_bar_and_no_error_without_rich(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setitem(__import__("sys").modules, "rich.progress", None)  # not installed
    _train_digits_like(monkeypatch, terminal, 60)
    assert terminal.buffer.getvalue() == ""
