"""A small CNN on scikit-learn's handwritten digits (8x8 images, 10 classes), written as a
MindSpore user writes it: porting it from MindSpore changes only the imports
(`import mindspore as ms; from mindspore import Tensor, nn, ops, context`).

Conv2d + BatchNorm2d + ReLU, a residual block, MaxPool2d, Flatten and Dense, trained end to
end: nn.SoftmaxCrossEntropyWithLogits, nn.Momentum and nn.TrainOneStepCell (one compiled graph
per step: forward, backward through every convolution, BatchNorm and pool, the momentum update
of every parameter, and BatchNorm's moving statistics, written in place). Evaluation runs the
same network in inference mode (`set_train(False)`: BatchNorm normalises with its moving
statistics, folded into the convolutions' weights when fusion is on).

    python examples/cnn_digits.py [--train N] [--epochs N] [--no-fusion] [--why]

Needs the examples extra (scikit-learn's digits): `.venv/bin/pip install -e '.[examples]'`.
"""
import argparse
import time

import numpy as np

import graphkernel as ms
from graphkernel import Tensor, context, nn, ops


class ConvBNReLU(nn.Cell):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, pad_mode="same", has_bias=True)
        self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.bn(self.conv(x)))


class Residual(nn.Cell):
    """relu(bn(conv(x)) + x): the epilogue (bias, BatchNorm, add, ReLU) follows one conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, pad_mode="same", has_bias=True)
        self.bn = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.bn(self.conv(x)) + x)


class Features(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.block1 = ConvBNReLU(1, 16)
        self.pool1 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.block2 = Residual(16)
        self.block3 = ConvBNReLU(16, 32)
        self.pool2 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()

    def construct(self, x):
        x = self.pool1(self.block1(x))
        x = self.block3(self.block2(x))
        return self.flatten(self.pool2(x))


class DigitsCNN(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.features = Features()
        self.fc = nn.Dense(32 * 2 * 2, 10)
        self.argmax = ops.Argmax(axis=-1)

    def construct(self, x):
        logits = self.fc(self.features(x))
        return logits, self.argmax(logits)


def load(n_train: int, n_test: int) -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # N, 1, 8, 8
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(labels))
    train, test = order[:n_train], order[n_train:n_train + n_test]
    return images[train], labels[train], images[test], labels[test]


class Logits(nn.Cell):
    """The classifier's logits alone, what the loss reads."""

    def __init__(self, net: DigitsCNN) -> None:
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, x):
        logits, _ = self.net(x)
        return logits


def train(n_train: int = 1200, seed: int = 0, epochs: int = 6, batch: int = 50,
          lr: float = 0.05, momentum: float = 0.9) -> tuple[DigitsCNN, tuple[np.ndarray, ...]]:
    """Train from a seeded initialisation on the first n_train shuffled digits (the rest are
    held out); the returned net is in inference mode. Its per-step losses: `net.losses`."""
    ms.set_seed(seed)
    net = DigitsCNN()
    data = load(n_train, 1797 - n_train)
    x_train, y_train = data[0], data[1]
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=momentum)
    step = nn.TrainOneStepCell(nn.WithLossCell(Logits(net), loss_fn), optimizer)
    rng = np.random.default_rng(seed + 1)
    losses = []
    for _ in range(epochs):
        order = rng.permutation(len(x_train))
        for start in range(0, len(order) - batch + 1, batch):  # full batches: one signature
            idx = order[start:start + batch]
            losses.append(float(step(Tensor(x_train[idx]), Tensor(y_train[idx])).asnumpy()))
    net.set_train(False)
    net.losses = losses
    return net, data


def accuracy(net: DigitsCNN, images: np.ndarray, labels: np.ndarray) -> float:
    _, predicted = net(Tensor(images))
    return float((predicted.asnumpy() == labels).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=1200)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--no-fusion", action="store_true", help="compile without fusion")
    parser.add_argument("--why", action="store_true",
                        help="also list every pair of ops fusion kept apart, and why")
    args = parser.parse_args()
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=not args.no_fusion)
    net, (x_train, y_train, x_test, y_test) = train(args.train, epochs=args.epochs)
    start = time.perf_counter()
    acc = accuracy(net, x_test, y_test)
    elapsed = time.perf_counter() - start
    compiled = ms.compile(net, x_test)
    print("loss every 10 steps: " + " ".join(f"{v:.3f}" for v in net.losses[::10]))
    print(f"test accuracy {acc:.3f} on {len(y_test)} digits ({len(y_train)} for training), "
          f"first call {elapsed * 1000:.0f} ms")
    print(compiled.summary(reasons=args.why))


if __name__ == "__main__":
    main()
