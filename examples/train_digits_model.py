"""MindSpore's tutorial shape with graphkernel: a dataset pipeline, `Model.train` with
`LossMonitor`, `TimeMonitor` and `ModelCheckpoint`, `Model.eval`, and the loss curve as a PNG.
A MindSpore script ports by changing `mindspore` to `graphkernel` in its imports.

Needs the examples extra (scikit-learn's digits): pip install -e '.[examples]'. The PNG is
drawn with matplotlib when it is installed, else by the few lines of `plain_png` below (no
dependency).

    python examples/train_digits_model.py                      # 20 epochs, into ./digits_run/
    python examples/train_digits_model.py --epochs 30 --out /tmp/run

It prints MindSpore's per-step loss lines and epoch times, writes checkpoints
(`digits-{epoch}_{step}.ckpt`, MindSpore's format and names) and `loss.png` into --out, and
exits 0 when held-out accuracy (a fifth of the digits, never trained on) is at least 95%.
"""
from __future__ import annotations

import argparse
import os
import struct
import sys
import zlib
from typing import Any

import numpy as np
from sklearn.datasets import load_digits

import graphkernel as gk
import graphkernel.dataset as ds
from graphkernel import nn
from graphkernel.train import (
    Callback,
    CheckpointConfig,
    LossMonitor,
    Model,
    ModelCheckpoint,
    TimeMonitor,
)


class LeNetMLP(nn.Cell):
    """64 pixels -> 128 -> 64 -> 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(64, 128)
        self.fc2 = nn.Dense(128, 64)
        self.fc3 = nn.Dense(64, 10)
        self.relu = nn.ReLU()

    def construct(self, x: Any) -> Any:
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


def create_dataset(images: np.ndarray, labels: np.ndarray, batch_size: int,
                   training: bool) -> ds.Dataset:
    """The tutorial's pipeline: slices, a map that scales the pixels, shuffle and batch."""
    dataset = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False)
    dataset = dataset.map(lambda image: (image / 16.0).astype(np.float32), "image")
    if training:
        dataset = dataset.shuffle(buffer_size=len(labels))
    return dataset.batch(batch_size, drop_remainder=training)


class StepLosses(Callback):
    """Every step's loss, for the curve."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_step_end(self, run_context: Any) -> None:
        outputs = run_context.original_args().net_outputs
        self.losses.append(float(outputs.asnumpy()))


def plain_png(path: str, values: list[float], width: int = 480, height: int = 240) -> None:
    """A line plot of `values` (with a left and bottom axis) as an 8-bit grey PNG."""
    image = np.full((height, width), 255, np.uint8)
    margin = 20
    image[margin:height - margin, margin] = 0
    image[height - margin, margin:width - margin] = 0
    v = np.asarray(values, np.float64)
    span = (v.max() - v.min()) or 1.0
    xs = margin + np.linspace(0, width - 2 * margin - 1, len(v))
    ys = height - margin - (v - v.min()) / span * (height - 2 * margin - 1)
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        image[np.linspace(y0, y1, n).astype(int), np.linspace(x0, x1, n).astype(int)] = 40
    raw = b"".join(b"\0" + row.tobytes() for row in image)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height,
                                                                    8, 0, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def save_curve(path: str, losses: list[float]) -> str:
    """The loss per step as a PNG; says which drawer made it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plain_png(path, losses)
        return "plain PNG (matplotlib is not installed)"
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(losses)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return "matplotlib"


def run(epochs: int = 20, out: str = "digits_run", batch_size: int = 64, lr: float = 0.1,
        seed: int = 0, per_print_times: int = 10) -> dict[str, Any]:
    gk.set_context(mode=gk.GRAPH_MODE, enable_graph_kernel=True)
    gk.set_seed(seed)
    ds.config.set_seed(seed)
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    test, train = order[:len(order) // 5], order[len(order) // 5:]
    images, labels = digits.data.astype(np.float32), digits.target.astype(np.int32)
    train_set = create_dataset(images[train], labels[train], batch_size, training=True)
    test_set = create_dataset(images[test], labels[test], 128, training=False)

    net = LeNetMLP()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
    model = Model(net, loss_fn, optimizer, metrics={"accuracy", "loss"})

    os.makedirs(out, exist_ok=True)
    steps = train_set.get_dataset_size()
    config = CheckpointConfig(save_checkpoint_steps=steps, keep_checkpoint_max=3)
    checkpoint = ModelCheckpoint(prefix="digits", directory=out, config=config)
    curve = StepLosses()
    model.train(epochs, train_set, callbacks=[LossMonitor(per_print_times), TimeMonitor(),
                                              checkpoint, curve])
    metrics = model.eval(test_set)
    print(f"held-out: {metrics}")
    png = os.path.join(out, "loss.png")
    drawer = save_curve(png, curve.losses)
    print(f"checkpoint: {checkpoint.latest_ckpt_file_name}; loss curve: {png} ({drawer})")
    return {"metrics": metrics, "losses": curve.losses, "checkpoint":
            checkpoint.latest_ckpt_file_name, "png": png, "net": net, "test": (images[test],
                                                                             labels[test])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--out", default="digits_run", help="checkpoints and loss.png go here")
    args = parser.parse_args(argv)
    result = run(epochs=args.epochs, out=args.out)
    return 0 if result["metrics"]["accuracy"] >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
