"""Micro-benchmark of parallel fusion at the per-call scale: `net(Tensor(x))` of a two-branch
net (x*2 and y+1, and the siblings exp(x*2) and x+1) at 4x4, parallel fusion on and off,
measured side by side in one process (interleaved rounds, median of rounds).

    python -m bench.parallel_fusion_micro [--rounds 15] [--calls 2000]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _nets() -> dict[str, tuple[object, tuple[np.ndarray, ...]]]:
    from graphkernel import Tensor, nn
    from graphkernel.ops import operations as P

    class Independent(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.mul, self.add = P.Mul(), P.Add()

        def construct(self, x, y):  # noqa: ANN001, ANN201
            return self.mul(x, 2.0), self.add(y, 1.0)

    class Siblings(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.mul, self.add, self.exp = P.Mul(), P.Add(), P.Exp()

        def construct(self, x):  # noqa: ANN001, ANN201
            return self.exp(self.mul(x, 2.0)), self.add(x, 1.0)

    rng = np.random.default_rng(0)
    x, y = (Tensor(rng.standard_normal((4, 4)).astype(np.float32)) for _ in range(2))
    return {"x*2, y+1": (Independent(), (x, y)), "exp(x*2), x+1": (Siblings(), (x,))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    import graphkernel.context as context
    from graphkernel.frontend.compile import compile_cached

    print(f"{'net':<16}{'parallel fusion':>18}{'kernels':>9}{'us per call':>13}")
    for name, (net, inputs) in _nets().items():
        samples: dict[str, list[float]] = {"on": [], "off": []}
        kernels: dict[str, int] = {}
        for _ in range(args.rounds):
            for mode in ("off", "on"):
                flags = "" if mode == "on" else "--enable_parallel_fusion=false"
                context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=True,
                                    graph_kernel_flags=flags)
                net(*inputs)  # compiled (or found) for this context
                start = time.perf_counter()
                for _ in range(args.calls):
                    net(*inputs)
                samples[mode].append((time.perf_counter() - start) / args.calls * 1e6)
                kernels[mode] = len(compile_cached(net, inputs).kernels)
        for mode in ("off", "on"):
            print(f"{name:<16}{mode:>18}{kernels[mode]:>9}"
                  f"{statistics.median(samples[mode]):>13.2f}")


if __name__ == "__main__":
    main()
