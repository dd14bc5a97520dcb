"""Bring your own model: a ResNet-18 exported from PyTorch to ONNX (random weights, nothing is
downloaded), loaded in graphkernel with one line, its fused kernels shown, its answer compared
with ONNX Runtime on the same file, and both timed.

Needs PyTorch (CPU), onnx and ONNX Runtime: the bench extra has them
(`.venv/bin/pip install -e '.[bench]'`). torchvision is not needed: the network is ResNet-18's
layout written here (torchvision's `resnet18()` exports the same graph).

    python examples/onnx_resnet.py [--batch B] [--size S] [--width W] [--repeats R]
                                   [--no-fusion]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import textwrap
import time

import numpy as np
import onnxruntime
import torch
from torch import nn as tnn

import graphkernel
from graphkernel import Tensor, context, nn


class BasicBlock(tnn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(cout)
        self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = tnn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False),
                                       tnn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(tnn.Module):
    """ResNet-18: a 7x7 stem, max pool, four stages of two basic blocks, average pool, linear.
    `width` is the first stage's channels (64 in the paper; each stage doubles it)."""

    def __init__(self, width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        widths = [width, 2 * width, 4 * width, 8 * width]
        self.stem = tnn.Sequential(tnn.Conv2d(3, width, 7, 2, 3, bias=False),
                                   tnn.BatchNorm2d(width), tnn.ReLU(), tnn.MaxPool2d(3, 2, 1))
        blocks, cin = [], width
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = tnn.Sequential(*blocks)
        self.fc = tnn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.fc(torch.flatten(tnn.functional.adaptive_avg_pool2d(y, 1), 1))


def export_resnet18(path: str, size: int, width: int) -> None:
    """The PyTorch model, random weights (fixed seed), exported with a dynamic batch axis."""
    torch.manual_seed(0)
    net = ResNet18(width).eval()
    example = torch.randn(1, 3, size, size)
    with torch.no_grad():
        torch.onnx.export(net, (example,), path, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})


def median_seconds(run, repeats: int) -> float:
    run()  # warm: first-call costs are not the steady state
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--size", type=int, default=224, help="image height and width")
    parser.add_argument("--width", type=int, default=64, help="first stage's channels")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-fusion", action="store_true")
    args = parser.parse_args()
    context.set_context(enable_graph_kernel=not args.no_fusion)

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "resnet18.onnx")
        export_resnet18(path, args.size, args.width)
        print(f"exported {path} ({os.path.getsize(path) / 1e6:.1f} MB) from PyTorch "
              f"{torch.__version__}")

        start = time.perf_counter()
        cell = nn.GraphCell(graphkernel.load(path))  # the one line: load, fuse, compile
        print(f"loaded and compiled in {time.perf_counter() - start:.1f} s")
        compiled = cell.compiled
        print(f"\n{len(compiled.kernels)} kernels per call (one compile serves every batch "
              "size):")
        print(textwrap.fill(", ".join(k.name for k in compiled.kernels), 96,
                            initial_indent="  ", subsequent_indent="  "))

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).standard_normal(
            (args.batch, 3, args.size, args.size)).astype(np.float32)
        ours = cell(Tensor(x)).asnumpy()
        theirs, = session.run(None, {"x": x})
        error = np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs))
        print(f"\nmax relative difference from ONNX Runtime {onnxruntime.__version__}: "
              f"{error:.2e}")

        ours_s = median_seconds(lambda: cell(Tensor(x)), args.repeats)
        theirs_s = median_seconds(lambda: session.run(None, {"x": x}), args.repeats)
        print(f"batch {args.batch}, {args.size}x{args.size}, median of {args.repeats}: "
              f"graphkernel {ours_s * 1e3:.2f} ms, ONNX Runtime {theirs_s * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
