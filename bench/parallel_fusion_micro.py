"""Micro-benchmark of parallel fusion at the per-call scale: `net(Tensor(x))` of a two-branch
net (x*2 and y+1, and the siblings exp(x*2) and x+1) at 4x4, parallel fusion on and off,
measured side by side in one process (interleaved rounds, median of rounds).

    python -m bench.parallel_fusion_micro [--rounds 15] [--calls 2000]
    python -m bench.parallel_fusion_micro --training quick [--rounds 15]

`--training SUITE` times the suite's training steps (bench/training.py: forward, backward and
Adam) the same way: one executable per setting, called in alternating rounds.
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

    class Composites(nn.Cell):  # each branch a fused kernel: the C entry runs both settings
        def __init__(self) -> None:
            super().__init__()
            self.mul, self.add, self.sub = P.Mul(), P.Add(), P.Sub()

        def construct(self, x, y):  # noqa: ANN001, ANN201
            return self.add(self.mul(x, 2.0), 1.0), self.sub(self.mul(y, 3.0), 1.0)

    rng = np.random.default_rng(0)
    x, y = (Tensor(rng.standard_normal((4, 4)).astype(np.float32)) for _ in range(2))
    return {"x*2, y+1": (Independent(), (x, y)), "exp(x*2), x+1": (Siblings(), (x,)),
            "x*2+1, y*3-1": (Composites(), (x, y))}


def _training(suite: str, rounds: int) -> None:
    import graphkernel
    from bench import training, workloads
    from graphkernel.graph_kernel.flags import parse_flags
    from graphkernel.graph_kernel.pipeline import CompileOptions

    print(f"{'training step':<28}{'parallel fusion':>16}{'kernels':>9}{'ms per step':>13}")
    for w in workloads.SUITES[suite]():
        if w.kind not in workloads.TRAIN_KINDS:
            continue
        sets, params = workloads.input_sets(w, [0])
        arrays = list(sets[0].values())
        exes = {}
        for mode in ("off", "on"):
            flags = parse_flags("" if mode == "on" else "--enable_parallel_fusion=false")
            exes[mode] = graphkernel.compile(training.gk_step_cell(w, params), *arrays,
                                             options=CompileOptions(enable_graph_kernel=True,
                                                                    flags=flags))
            exes[mode].run_arrays(*arrays)
        calls = max(1, int(0.2 / _seconds(exes["on"], arrays)))
        samples: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(rounds):
            for mode in ("off", "on"):
                samples[mode].append(_seconds(exes[mode], arrays, calls) * 1e3)
        for mode in ("off", "on"):
            print(f"{w.key:<28}{mode:>16}{exes[mode].kernel_count:>9}"
                  f"{statistics.median(samples[mode]):>13.3f}")


def _seconds(exe: object, arrays: list[np.ndarray], calls: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        exe.run_arrays(*arrays)  # type: ignore[attr-defined]
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--training", choices=("full", "quick", "tiny"))
    args = parser.parse_args()
    if args.training:
        _training(args.training, args.rounds)
        return
    import graphkernel.context as context
    from graphkernel.frontend.compile import compile_cached

    print(f"{'net':<16}{'parallel fusion':>18}{'kernels':>9}{'us per call':>13}  runner")
    for name, (net, inputs) in _nets().items():
        samples: dict[str, list[float]] = {"on": [], "off": []}
        kernels: dict[str, int] = {}
        runner: dict[str, str] = {}
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
                compiled = compile_cached(net, inputs)
                kernels[mode] = len(compiled.kernels)
                runner[mode] = "C entry" if compiled.entry is not None else "Python"
        for mode in ("off", "on"):
            print(f"{name:<16}{mode:>18}{kernels[mode]:>9}"
                  f"{statistics.median(samples[mode]):>13.2f}  {runner[mode]}")


if __name__ == "__main__":
    main()
