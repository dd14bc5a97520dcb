"""Train a small MLP on scikit-learn's bundled handwritten digits with graphkernel, the MindSpore
way: nn.Dense + nn.ReLU, SoftmaxCrossEntropyWithLogits, nn.Momentum, TrainOneStepCell.

    python examples/digits_mlp.py                 # fusion on and off, side by side
    python examples/digits_mlp.py --fusion on --epochs 30 --save-graphs dumps/

Needs the examples extra (scikit-learn's digits): `.venv/bin/pip install -e '.[examples]'`.

Each training step is one compiled graph: forward, backward and the momentum update of every
parameter, written in place. It prints the loss per epoch, the held-out accuracy (a fifth of the
data, never trained on), and the kernels one step launches with and without fusion.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
from sklearn.datasets import load_digits

import graphkernel as gk
from graphkernel import Tensor, context, nn


class MLP(nn.Cell):
    def __init__(self, sizes: tuple[int, ...] = (64, 64, 10), seed: int = 0) -> None:
        super().__init__()
        layers: list[nn.Cell] = []
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
            layers.append(nn.Dense(n_in, n_out, seed=seed + i))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.body = nn.SequentialCell(layers)

    def construct(self, x: Any) -> Any:
        return self.body(x)


def digits(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train x, train labels, test x, test labels): a shuffled four fifths / one fifth split,
    pixels scaled to [0, 1], labels int32 class indices."""
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    test = order[: len(x) // 5]
    train = order[len(x) // 5:]
    return x[train], y[train], x[test], y[test]


def train(fusion: bool, epochs: int = 20, batch: int = 64, lr: float = 0.1,
          momentum: float = 0.9, seed: int = 0, save_graphs: str | None = None
          ) -> dict[str, Any]:
    """Train from a fixed initialisation; returns the per-step losses, the held-out accuracy
    and the compiled training step (its kernels)."""
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=fusion,
                        save_graphs=save_graphs is not None,
                        **({"save_graphs_path": save_graphs} if save_graphs else {}))
    x_train, y_train, x_test, y_test = digits(seed)
    net = MLP(seed=seed)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=momentum)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)
    rng = np.random.default_rng(seed + 1)
    losses: list[float] = []
    epoch_losses: list[float] = []
    for _ in range(epochs):
        order = rng.permutation(len(x_train))
        batch_losses = []
        for start in range(0, len(order) - batch + 1, batch):  # full batches: one signature
            idx = order[start:start + batch]
            loss = step(Tensor(x_train[idx]), Tensor(y_train[idx]))
            batch_losses.append(float(loss.asnumpy()))
        losses += batch_losses
        epoch_losses.append(float(np.mean(batch_losses)))
    context.set_context(save_graphs=False)
    logits = net(Tensor(x_test)).asnumpy()
    accuracy = float((logits.argmax(axis=1) == y_test).mean())
    exe = gk.compile(step, Tensor(x_train[:batch]), Tensor(y_train[:batch]))
    return {"losses": losses, "epoch_losses": epoch_losses, "accuracy": accuracy,
            "step": exe, "test_size": len(y_test)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fusion", choices=["on", "off", "both"], default="both")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--save-graphs", default=None, help="dump every stage of the step here")
    args = parser.parse_args(argv)
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.fusion]
    results = {}
    for fusion in modes:
        r = train(fusion, epochs=args.epochs, save_graphs=args.save_graphs if fusion else None)
        results[fusion] = r
        name = "fusion on " if fusion else "fusion off"
        print(f"{name}: loss per epoch " + " ".join(f"{v:.4f}" for v in r["epoch_losses"]))
        print(f"{name}: held-out accuracy {r['accuracy']:.4f} ({r['test_size']} digits); "
              f"one training step launches {len(r['step'].kernels)} kernels")
    if len(results) == 2:
        diff = np.max(np.abs(np.array(results[True]["losses"]) -
                             np.array(results[False]["losses"])))
        print(f"largest difference between the fused and unfused per-step losses: {diff:.2e}")
        print("\nthe fused step's kernels:")
        for k in results[True]["step"].kernels:
            print(f"  {k.name}")
    return 0 if all(r["accuracy"] >= 0.95 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
