"""Convolution weights repacked once and kept in the plan's workspace (runtime/plan.py
Workspace, backends/c/c_window.py `prepack`), repacked only when a weight changes: every write
path of a Parameter bumps its version word, and the next call computes with the new weights
(float64 numpy reference); asnumpy() is read-only; a kept workspace is really kept (the
kernel reads it, not the weights); a training step's weights repack every step; the repack
enters OpenMP only for large weights."""
import os

import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor, nn, ops
from graphkernel.backends.c.c_window import emit_window_kernel, workspace_bytes
from graphkernel.common.checkpoint import load_checkpoint, load_param_into_net, save_checkpoint
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P
from graphkernel.runtime.plan import WORKSPACE_HEADER_BYTES, SlotRole

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)


class ConvNet(nn.Cell):
    """A 3x3 convolution, BatchNorm (folded into it in inference) and ReLU."""

    def __init__(self, cin=5, cout=20):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, pad_mode="same", has_bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def construct(self, x):
        return P.ReLU()(self.bn(self.conv(x)))


def conv64(x, w):
    """A 'same' 3x3 convolution in float64."""
    n, _, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for a in range(3):
        for b in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, a:a + h, b:b + wd],
                             w[:, :, a, b].astype(np.float64))
    return out


def expected(net, x):
    """The network in inference, float64: conv, BatchNorm with moving statistics, ReLU."""
    bn = net.bn
    gamma, beta, mean, var = (p.asnumpy().astype(np.float64).reshape(1, -1, 1, 1) for p in
                              (bn.gamma, bn.beta, bn.moving_mean, bn.moving_variance))
    y = conv64(x, net.conv.weight.asnumpy())
    return np.maximum((y - mean) / np.sqrt(var + bn.eps) * gamma + beta, 0)


@pytest.fixture
def net_and_input(rng):
    net = ConvNet()
    for p in net.get_parameters():
        p.set_data(rng.standard_normal(p.shape))
    net.bn.moving_variance.set_data(rng.random(net.bn.moving_variance.shape) + 0.5)
    net.set_train(False)
    return net, rng.standard_normal((2, 5, 9, 9)).astype(np.float32)


def check(net, x):
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), expected(net, x), rtol=2e-4,
                               atol=2e-4)


def compiled_of(net, x):
    return graphkernel.compile(net, Tensor(x), options=ON)


def workspace_arrays(compiled):
    runner = compiled.executable.runner
    return [runner._template[s.index] for s in compiled.plan.workspace_slots()]


# -- every write path: the next call computes with the new weights ---------------------------
def write_set_data(net, rng, tmp_path):
    net.conv.weight.set_data(rng.standard_normal(net.conv.weight.shape))


def write_item(net, rng, tmp_path):
    net.conv.weight[1:3] = rng.standard_normal((2, *net.conv.weight.shape[1:]))


def write_eager_assign(net, rng, tmp_path):
    P.Assign()(net.conv.weight, Tensor(rng.standard_normal(net.conv.weight.shape)
                                       .astype(np.float32)))


def write_ops_assign(net, rng, tmp_path):
    ops.assign(net.bn.gamma, Tensor(rng.standard_normal(net.bn.gamma.shape)
                                    .astype(np.float32)))


def write_checkpoint(net, rng, tmp_path):
    other = ConvNet()
    for p in other.get_parameters():
        p.set_data(rng.standard_normal(p.shape))
    other.bn.moving_variance.set_data(rng.random(other.bn.moving_variance.shape) + 0.5)
    path = os.path.join(tmp_path, "other.ckpt")
    save_checkpoint(other, path)
    load_param_into_net(net, load_checkpoint(path))


WRITES = {"set_data": write_set_data, "item": write_item, "eager_assign": write_eager_assign,
          "ops_assign": write_ops_assign, "checkpoint": write_checkpoint}


@pytest.mark.parametrize("write", list(WRITES))
def test_each_write_path_moves_the_version_and_the_next_call_sees_it(write, net_and_input, rng,
                                                                      tmp_path):
    net, x = net_and_input
    check(net, x)
    check(net, x)  # the kept repack
    before = {p.name: p.version for p in net.get_parameters()}
    WRITES[write](net, rng, tmp_path)
    after = {p.name: p.version for p in net.get_parameters()}
    assert any(after[k] > before[k] for k in after)
    check(net, x)
    check(net, x)


def test_asnumpy_is_a_read_only_view_of_the_live_values(net_and_input):
    net, x = net_and_input
    check(net, x)
    weight = net.conv.weight
    view, version = weight.asnumpy(), weight.version
    with pytest.raises(ValueError, match="read-only"):
        view[0, 0, 0, 0] = 1.0
    assert weight.version == version
    weight[0, 0, 0, 0] = 7.0
    assert view[0, 0, 0, 0] == 7.0 and weight.version == version + 1
    check(net, x)


def test_item_assignment_errors_name_the_parameter(net_and_input):
    net, _ = net_and_input
    with pytest.raises(graphkernel.errors.InputError, match=r"Parameter 'conv.weight'|weight"):
        net.conv.weight[0] = np.ones((2, 2))


# -- the workspace is kept: the kernel reads it, not the weights ------------------------------
def test_a_kept_workspace_is_read_until_a_weight_changes(net_and_input):
    net, x = net_and_input
    exe = compiled_of(net, x)
    (slot,) = exe.plan.workspace_slots()
    assert slot.role is SlotRole.WORKSPACE and slot.workspace.kept
    assert exe.plan.slots[slot.workspace.sources[0]].role is SlotRole.WEIGHT
    first = exe(Tensor(x)).asnumpy()
    np.testing.assert_allclose(first, expected(net, x), rtol=2e-4, atol=2e-4)
    (workspace,) = workspace_arrays(exe)
    workspace[WORKSPACE_HEADER_BYTES:] = 0  # the packed weights, zeroed behind its back
    kept = exe(Tensor(x)).asnumpy()  # ReLU(0 + shift): one value per channel, so kept
    assert np.ptp(kept, axis=(0, 2, 3)).max() == 0 and np.ptp(first) > 0
    net.bn.beta.set_data(np.zeros(net.bn.beta.shape))  # moves only a source of the epilogue
    net.bn.gamma.set_data(net.bn.gamma.asnumpy())  # a source of the pack: same values
    np.testing.assert_allclose(exe(Tensor(x)).asnumpy(), expected(net, x), rtol=2e-4,
                               atol=2e-4)


def test_weights_without_a_version_repack_every_call(net_and_input):
    """The executable alone, given arrays (no Parameters): nothing says when they change."""
    net, x = net_and_input
    exe = compiled_of(net, x)
    weights = [np.array(p._array) for p in exe.params]
    run = exe.executable.run
    exe.executable.runner.bind_versions([None] * len(weights))
    first = run([x], weights)[0]
    (workspace,) = workspace_arrays(exe)
    workspace[WORKSPACE_HEADER_BYTES:] = 0
    weights[[p.name for p in exe.params].index("conv.weight")][:] *= 2  # in place, unseen
    second = run([x], weights)[0]
    assert not np.allclose(second, first) and np.abs(second).max() > 0


def test_folded_constant_weights_pack_once(rng):
    """An imported graph's weights are constants: kept, bound to a version that never moves."""
    w = rng.standard_normal((20, 5, 3, 3)).astype(np.float32)
    x = rng.standard_normal((2, 5, 9, 9)).astype(np.float32)

    class Fixed(nn.Cell):
        def construct(self, x):
            return P.Conv2D(out_channel=20, kernel_size=3, pad_mode="same")(x, Tensor(w))

    exe = graphkernel.compile(Fixed(), Tensor(x), options=ON)
    (slot,) = exe.plan.workspace_slots()
    assert slot.workspace.kept
    assert exe.plan.slots[slot.workspace.sources[0]].role is SlotRole.CONSTANT
    np.testing.assert_allclose(exe(Tensor(x)).asnumpy(), conv64(x, w), rtol=2e-4, atol=2e-4)
    (workspace,) = workspace_arrays(exe)
    workspace[WORKSPACE_HEADER_BYTES:] = 0
    np.testing.assert_array_equal(exe(Tensor(x)).asnumpy(), 0)


# -- training: the weights change every step --------------------------------------------------
@pytest.mark.parametrize("options", [ON, OFF], ids=["fused", "unfused"])
def test_training_steps_repack_and_an_eval_graph_sees_the_updates(options, rng):
    net = ConvNet(3, 8)
    for p in net.get_parameters():
        p.set_data(rng.standard_normal(p.shape) * 0.3)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    label = rng.standard_normal((2, 8, 6, 6)).astype(np.float32)
    net.set_train(False)
    evaluate = graphkernel.compile(net, Tensor(x), options=options)
    evaluate(Tensor(x))  # packs the weights before training moves them
    net.set_train(True)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    step = graphkernel.compile(nn.TrainOneStepCell(loss_net, nn.SGD(net.trainable_params(),
                                                                    0.05)),
                               Tensor(x), Tensor(label), options=options)
    weight_slot = step.plan.weights[step.params.index(net.conv.weight)]
    for slot in step.plan.workspace_slots():  # the plan writes the weight it packs
        assert not (weight_slot in slot.workspace.sources and slot.workspace.kept)
    losses = []
    for _ in range(4):
        version = net.conv.weight.version
        losses.append(float(step(Tensor(x), Tensor(label)).asnumpy()))
        assert net.conv.weight.version == version + 1
    assert losses[-1] < losses[0]
    net.set_train(False)
    np.testing.assert_allclose(evaluate(Tensor(x)).asnumpy(), expected(net, x), rtol=2e-4,
                               atol=2e-4)


def test_training_step_matches_numpy_with_changing_weights(rng):
    """Each step's conv uses the weights the previous step wrote: SGD on a plain convolution
    against the same steps in float64 numpy."""
    conv = nn.Conv2d(3, 6, 3, pad_mode="same", has_bias=False)
    conv.weight.set_data(rng.standard_normal(conv.weight.shape) * 0.3)
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    label = rng.standard_normal((2, 6, 7, 7)).astype(np.float32)
    step = nn.TrainOneStepCell(nn.WithLossCell(conv, nn.MSELoss()),
                               nn.SGD(conv.trainable_params(), 0.1))
    w = conv.weight.asnumpy().astype(np.float64)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    for k in range(3):
        loss = float(step(Tensor(x), Tensor(label)).asnumpy())
        assert conv.weight.version == 2 + k  # set_data, then each step's in-place update
        diff = conv64(x, w) - label
        assert loss == pytest.approx((diff ** 2).mean(), rel=1e-4)
        grad_out = 2 * diff / diff.size
        grad = np.zeros_like(w)
        for a in range(3):
            for b in range(3):
                grad[:, :, a, b] = np.einsum("nohw,nchw->oc", grad_out, xp[:, :, a:a + 7, b:b + 7])
        w = w - 0.1 * grad
        np.testing.assert_allclose(conv.weight.asnumpy(), w, rtol=1e-4, atol=1e-5)


# -- the repack's OpenMP region only where the weights are large -----------------------------
def _conv_node(o, c, k):
    class One(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(c, o, k, pad_mode="same", has_bias=False)

        def construct(self, x):
            return self.conv(x)

    exe = graphkernel.compile(One(), Tensor(np.zeros((1, c, 8, 8), np.float32)), options=OFF)
    return next(n for n in exe.graph.nodes if n.op == "Conv2D")


def test_repack_enters_openmp_only_for_large_weights_and_fits_its_workspace():
    small, large = _conv_node(16, 16, 3), _conv_node(128, 128, 3)  # 2,304 and 147,456 weights
    for node, threaded in ((small, False), (large, True)):
        # our kernel (oneDNN's, where chosen, keeps oneDNN's layout: tests/test_onednn.py)
        source = emit_window_kernel(node, "k", 1 << 40, workspace=True,
                                    library_choice=False).source
        repack = source[source.index("gk_pack_fresh(pack"):].split("gk_pack_done")[0]
        assert ("#pragma omp parallel for schedule(static)\n" in repack) is threaded
        assert "#pragma omp parallel for schedule(static) if" not in source
        # float32 weights, 16 output channels a vector: the header and the weights, no more
        assert workspace_bytes(node, library_choice=False) == \
            WORKSPACE_HEADER_BYTES + 4 * np.prod(node.inputs[1].shape)
