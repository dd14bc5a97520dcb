"""A fused CNN training step runs as one compiled entry call (backends/c/c_entry.py): the lone
ops its gradients leave (a strided convolution's input gradient interleaving its stride phases,
the transposes the filter gradients read, a mean pool's sum) are generated kernels, not numpy
steps (ops declared `kernel_alone`, graph_kernel/single_op.py; grad_expanders.py `_stack`).
On the Python runner its products ran on BLAS's own threads beside the kernels' pool. Against
the unfused step and numpy, at odd shapes."""
import numpy as np
import pytest
from cells import OFF, ON, Fn

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.ops import operations as P


class ConvBN(nn.Cell):
    def __init__(self, cin, cout, k, stride=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, pad_mode="pad", padding=k // 2)
        self.bn = nn.BatchNorm2d(cout)

    def construct(self, x):
        return self.bn(self.conv(x))


class TinyResNet(nn.Cell):
    """A stem, one bottleneck-like block with a strided 3x3 and a strided 1x1 shortcut, a mean
    pool and a Dense: the op kinds of ResNet-50's training step."""

    def __init__(self):
        super().__init__()
        self.stem = ConvBN(3, 6, 3)
        self.a = ConvBN(6, 5, 1)
        self.b = ConvBN(5, 5, 3, 2)
        self.c = ConvBN(5, 7, 1)
        self.down = ConvBN(6, 7, 1, 2)
        self.relu = nn.ReLU()
        self.mean = P.ReduceMean(keep_dims=False)
        self.fc = nn.Dense(7, 4)

    def construct(self, x):
        h = self.relu(self.stem(x))
        y = self.c(self.relu(self.b(self.relu(self.a(h))))) + self.down(h)
        return self.fc(self.mean(self.relu(y), (2, 3)))


class WithLoss(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self.sum, self.square = P.ReduceSum(), P.Square()

    def construct(self, x, target):
        return self.sum(self.square(self.net(x) - target))


def _step(options, x, t):
    net = TinyResNet()
    for k, p in enumerate(net.trainable_params()):
        p.set_data(Tensor(np.random.default_rng(k).standard_normal(p.shape).astype(
            np.float32) * 0.3))
    loss = WithLoss(net)
    step = nn.TrainOneStepCell(loss, nn.Momentum(loss.trainable_params(), 0.01, 0.9))
    step.set_train(True)
    exe = graphkernel.compile(step, x, t, options=options)
    losses = [float(np.asarray(exe.run_arrays(x, t)[0])) for _ in range(2)]
    return exe, losses, {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def test_fused_training_step_runs_on_the_entry_as_the_unfused_step(rng):
    x = rng.standard_normal((3, 3, 13, 11)).astype(np.float32)
    t = rng.standard_normal((3, 4)).astype(np.float32)
    fused, loss_f, after_f = _step(ON, x, t)
    unfused, loss_u, after_u = _step(OFF, x, t)
    assert fused.executable.runner.entry is not None, \
        sorted({s.op for s in fused.plan.steps if s.kind.value in ("library", "view")})
    ops = {s.op for s in fused.plan.steps}
    assert "Stack" not in ops  # the stride phases interleave through a Concat
    np.testing.assert_allclose(loss_f, loss_u, rtol=1e-4)
    for name, value in after_f.items():
        np.testing.assert_allclose(value, after_u[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("fn, want, op", [
    (lambda a, b: P.Transpose()(a, (1, 0, 3, 2)),
     lambda a, b: a.transpose(1, 0, 3, 2), "Transpose"),
    (lambda a, b: P.Concat(axis=2)((a, b)),
     lambda a, b: np.concatenate([a, b], axis=2), "Concat"),
    (lambda a, b: P.ReduceSum(keep_dims=False)(a, (0, 2)),
     lambda a, b: a.astype(np.float64).sum(axis=(0, 2)), "ReduceSum"),
])
def test_lone_copies_and_sums_are_generated_kernels(fn, want, op, rng):
    a = rng.standard_normal((3, 5, 7, 9)).astype(np.float32)
    b = rng.standard_normal((3, 5, 2, 9)).astype(np.float32)
    exe = graphkernel.compile(Fn(fn), a, b, options=OFF)
    (step,) = [s for s in exe.plan.steps if s.op == op or op in s.op_names]
    assert step.kind.value == "kernel" and step.lowering.kind.value == "single op", step
    got = exe.run_arrays(a, b)[0]
    np.testing.assert_allclose(got, want(a, b), rtol=1e-5, atol=1e-5)
