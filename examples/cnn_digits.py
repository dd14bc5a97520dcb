"""A small CNN on scikit-learn's handwritten digits (8x8 images, 10 classes), written as a
MindSpore user writes it: porting it from MindSpore changes only the imports
(`import mindspore as ms; from mindspore import Tensor, nn, ops, context`).

Conv2d + BatchNorm2d + ReLU, a residual block, MaxPool2d, Flatten and Dense. Without gradients
(issue 12 brings them), the convolutions keep their seeded He initialisation, BatchNorm's moving
statistics are calibrated on the training images, and the Dense readout is fitted by ridge
regression on the features: random convolutional features with a trained linear head.

    python examples/cnn_digits.py [--train N] [--test N] [--no-fusion]
"""
from __future__ import annotations

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


class _Prefix(nn.Cell):
    """The features up to one BatchNorm's input (to calibrate it)."""

    def __init__(self, stages: list) -> None:
        super().__init__(auto_prefix=False)
        self.stages = stages

    def construct(self, x):
        for stage in self.stages:
            x = stage(x)
        return x


def calibrate(net: DigitsCNN, images: np.ndarray) -> None:
    """BatchNorm's moving statistics from the training images, layer by layer."""
    f = net.features
    before = [[f.block1.conv], [f.block1, f.pool1, f.block2.conv],
              [f.block1, f.pool1, f.block2, f.block3.conv]]
    norms = [f.block1.bn, f.block2.bn, f.block3.bn]
    for stages, bn in zip(before, norms):
        out = _Prefix(stages)(Tensor(images)).asnumpy()
        bn.moving_mean.set_data(out.mean(axis=(0, 2, 3)))
        bn.moving_variance.set_data(out.var(axis=(0, 2, 3)))


def fit_readout(net: DigitsCNN, images: np.ndarray, labels: np.ndarray, ridge: float = 1e-2
                ) -> None:
    feats = net.features(Tensor(images)).asnumpy().astype(np.float64)
    design = np.hstack([feats, np.ones((len(feats), 1))])
    targets = np.eye(10)[labels]
    solution = np.linalg.solve(design.T @ design + ridge * np.eye(design.shape[1]),
                               design.T @ targets)
    net.fc.weight.set_data(solution[:-1].T.astype(np.float32))
    net.fc.bias.set_data(solution[-1].astype(np.float32))


def train(n_train: int = 1200, seed: int = 0) -> tuple[DigitsCNN, tuple[np.ndarray, ...]]:
    ms.set_seed(seed)
    net = DigitsCNN()
    data = load(n_train, 1797 - n_train)
    calibrate(net, data[0])
    fit_readout(net, data[0], data[1])
    return net, data


def accuracy(net: DigitsCNN, images: np.ndarray, labels: np.ndarray) -> float:
    _, predicted = net(Tensor(images))
    return float((predicted.asnumpy() == labels).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=1200)
    parser.add_argument("--no-fusion", action="store_true")
    args = parser.parse_args()
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=not args.no_fusion)
    net, (x_train, y_train, x_test, y_test) = train(args.train)
    start = time.perf_counter()
    acc = accuracy(net, x_test, y_test)
    elapsed = time.perf_counter() - start
    compiled = ms.compile(net, x_test)
    print(f"test accuracy {acc:.3f} on {len(y_test)} digits ({len(y_train)} for training), "
          f"first call {elapsed * 1000:.0f} ms")
    print(compiled.summary())


if __name__ == "__main__":
    main()
