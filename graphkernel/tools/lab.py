"""The seed lab's whole experiment in one process: two nets x fusion on/off, dumps, pictures,
and the lab's three conclusions checked."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphkernel import compile as gk_compile
from graphkernel.frontend import context
from graphkernel.frontend.cell import Cell, GraphKernel
from graphkernel.frontend.compiled import CompiledCell as Executable
from graphkernel.frontend.tensor import Tensor
from graphkernel.ir.printer import print_graph
from graphkernel.ops import operations as P
from graphkernel.passes import stage_names
from graphkernel.tools.render import render
from graphkernel.tools.report_timing import Spread


class NetBasicFuse(Cell):
    """out = ((x * 2.0) + 1.0) * 3.0 from two Muls and a TensorAdd."""

    def __init__(self) -> None:
        super().__init__()
        self.add = P.TensorAdd()
        self.mul = P.Mul()

    def construct(self, x: Any) -> Any:
        mul_res = self.mul(x, 2.0)
        add_res = self.add(mul_res, 1.0)
        out_basic = self.mul(add_res, 3.0)
        return out_basic


class Composite(GraphKernel):
    """The lab's user-declared composite: x * 2.0 + 1.0."""

    def __init__(self) -> None:
        super().__init__()
        self.add = P.TensorAdd()
        self.mul = P.Mul()

    def construct(self, x: Any) -> Any:
        mul_res = self.mul(x, 2.0)
        add_res = self.add(mul_res, 1.0)
        return add_res


class NetCompositeFuse(Cell):
    """Composite(x) * 3.0."""

    def __init__(self) -> None:
        super().__init__()
        self.mul = P.Mul()
        self.composite = Composite()

    def construct(self, x: Any) -> Any:
        composite_ = self.composite(x)
        pow_res = self.mul(composite_, 3.0)
        return pow_res


SCENARIOS = (
    ("test_basic_fuse", NetBasicFuse, True),
    ("test_composite_fuse", NetCompositeFuse, True),
    ("test_basic_fuse_no", NetBasicFuse, False),
    ("test_composite_fuse_no", NetCompositeFuse, False),
)
# The fused graph (fusion's result, before lowering notes each kernel's kind) beside the initial.
FIGURES = (stage_names.INITIAL, stage_names.END)


@dataclass
class ScenarioResult:
    name: str
    net: str
    fusion: bool
    executable: Executable
    x: np.ndarray
    result: np.ndarray
    folder: str
    pictures: list[str] = field(default_factory=list)

    @property
    def initial_text(self) -> str:
        return graph_text(self.executable, stage_names.INITIAL)

    @property
    def final_text(self) -> str:
        return graph_text(self.executable, stage_names.END)


@dataclass
class Conclusion:
    text: str
    holds: bool
    evidence: str


def graph_text(exe: Executable, stage: str) -> str:
    """The stage's graph as text without the header line naming the stage."""
    return print_graph(exe.stages[stage])


def run_scenario(name: str, net_cls: type[Cell], fusion: bool, out_dir: str,
                 rng: np.random.Generator, render_pictures: bool = True) -> ScenarioResult:
    folder = os.path.join(out_dir, name)
    saved = context.snapshot()
    try:
        context.set_context(mode=context.GRAPH_MODE, device_target="CPU", save_graphs=True,
                            save_graphs_path=folder, enable_graph_kernel=fusion)
        x = rng.standard_normal((4, 4)).astype(np.float32)
        net = net_cls()
        exe = gk_compile(net, Tensor(x))
        result = exe(Tensor(x)).asnumpy()
    finally:
        context.restore(saved)
    pictures = []
    if render_pictures:
        for stage in FIGURES:
            pictures.append(render(os.path.join(folder, stage + ".dot"),
                                   os.path.join(folder, stage + ".png")))
    return ScenarioResult(name, net_cls.__name__, fusion, exe, x, result, folder, pictures)


def conclusions(results: dict[str, ScenarioResult]) -> list[Conclusion]:
    out = []
    pairs = (("test_basic_fuse", "test_basic_fuse_no"),
             ("test_composite_fuse", "test_composite_fuse_no"))
    same = [(off, results[off].initial_text == results[off].final_text) for _, off in pairs]
    out.append(Conclusion(
        "Without fusion, the initial graph (6_validate) and the processed graph (hwopt_d_end) "
        "are the same.", all(s for _, s in same),
        "; ".join(f"{name}: {'identical' if s else 'DIFFERENT'}" for name, s in same)))
    evidence, holds = [], True
    for on, off in pairs:
        initial_same = results[on].initial_text == results[off].initial_text
        final_differs = results[on].final_text != results[on].initial_text
        holds &= initial_same and final_differs
        evidence.append(f"{on}: initial graph {'same as' if initial_same else 'DIFFERS from'} "
                        f"fusion off, processed graph "
                        f"{'differs' if final_differs else 'DOES NOT differ'}")
    out.append(Conclusion("With fusion, the initial graph is the same as without fusion and the "
                          "processed graph differs.", holds, "; ".join(evidence)))
    evidence, holds = [], True
    for on, off in pairs:
        k_on, k_off = results[on].executable.kernels, results[off].executable.kernels
        ops_on = sum(len(k.op_names) for k in k_on)
        one = len(k_on) == 1 and len(k_off) > 1 and k_on[0].backend == "native" and \
            ops_on == sum(len(k.op_names) for k in k_off)
        holds &= one
        evidence.append(f"{on}: {len(k_off)} kernels -> {len(k_on)} "
                        f"({', '.join(k.name for k in k_on)})")
    out.append(Conclusion("Fusion turns several operators into one composite operator, so fewer "
                          "kernels run with no gaps between them.", holds, "; ".join(evidence)))
    return out


def run_lab(out_dir: str, seed: int = 0, render_pictures: bool = True, echo: bool = True
            ) -> tuple[dict[str, ScenarioResult], list[Conclusion]]:
    rng = np.random.default_rng(seed)
    results: dict[str, ScenarioResult] = {}
    for name, cls, fusion in SCENARIOS:
        res = run_scenario(name, cls, fusion, out_dir, rng, render_pictures)
        results[name] = res
        if echo:
            print(f"=============== {name} ({res.net}, enable_graph_kernel={fusion}) "
                  "===============")
            print(f"x: {res.x}")
            print(f"result: {res.result}")
            print(f"kernels per call: {len(res.executable.kernels)} "
                  f"({', '.join(k.name for k in res.executable.kernels)})")
            print(f"files: {res.folder}/{{6_validate,hwopt_d_end}}.{{ir,dot"
                  f"{',png' if render_pictures else ''}}}")
    found = conclusions(results)
    if echo:
        print("=============== conclusions ===============")
        for i, c in enumerate(found, 1):
            print(f"{i}. [{'holds' if c.holds else 'DOES NOT HOLD'}] {c.text}\n   {c.evidence}")
    return results, found


# -- What fusion saves, where it matters --------------------------------------------------------

# The lab's 4x4 input is 64 bytes: fused or not, a call is one C call with nothing to save but a
# few loads, so the two times differ by noise. At 2048x2048 (16 MiB an array, past the caches)
# each unfused kernel reads and writes the whole array: memory traffic is the cost fusion cuts.
LARGE = (2048, 2048)
# Alternating samples per side; each sample times a batch of calls lasting at least
# SAMPLE_SECONDS, so a 4x4 call (microseconds) is timed over many calls.
SAMPLES = 15
SAMPLE_SECONDS = 2e-3


@dataclass
class Saving:
    """NetBasicFuse at one size, fusion off against on: kernels and bytes moved from the plans,
    seconds per call from alternating samples (median and interquartile range), and the
    ratio off/on of each pair of samples taken one after the other (load on the machine
    that slows both cancels in a pair)."""

    shape: tuple[int, ...]
    kernels_off: int
    kernels_on: int
    bytes_off: int
    bytes_on: int
    time_off: Spread
    time_on: Spread
    paired: Spread  # time off over time on, per pair of samples

    @property
    def ratio(self) -> tuple[float, float, float]:
        """(median, first quartile, third quartile) of the paired ratios off/on."""
        return self.paired.median, self.paired.q1, self.paired.q3

    @property
    def clear(self) -> bool:
        """Whether the measurement tells the two apart: the ratio's range leaves out 1."""
        _, low, high = self.ratio
        return low > 1.0 or high < 1.0

    def effect(self) -> str:
        median, low, high = self.ratio
        if not self.clear:
            return (f"no difference this measurement can tell (off/on {median:.2f}x, "
                    f"quartiles {low:.2f}-{high:.2f}x)")
        word, factor = ("faster", median) if median >= 1 else ("slower", 1 / median)
        lo, hi = (low, high) if median >= 1 else (1 / high, 1 / low)
        return f"{factor:.2f}x {word} (quartiles {lo:.2f}-{hi:.2f}x)"


def _alternating(first: Executable, second: Executable, x: np.ndarray
                 ) -> tuple[list[float], list[float]]:
    """Seconds per call of each, sampled in turns (so load on the machine falls on both)."""
    runs = [first.run_arrays, second.run_arrays]
    batches = []
    for run in runs:
        for _ in range(2):
            run(x)  # warm: pages, caches, the kernel library
        batch, start = 1, time.perf_counter()
        run(x)
        once = max(time.perf_counter() - start, 1e-7)
        batch = max(1, min(1 << 14, int(SAMPLE_SECONDS / once)))
        batches.append(batch)
    samples: list[list[float]] = [[], []]
    for _ in range(SAMPLES):
        for i, run in enumerate(runs):
            start = time.perf_counter()
            for _ in range(batches[i]):
                run(x)
            samples[i].append((time.perf_counter() - start) / batches[i])
    return samples[0], samples[1]


def measure_saving(off: Executable, on: Executable, x: np.ndarray) -> Saving:
    time_off, time_on = _alternating(off, on, x)
    return Saving(x.shape, len(off.kernels), len(on.kernels),
                  sum(k.bytes_moved for k in off.kernels),
                  sum(k.bytes_moved for k in on.kernels), Spread.of(time_off),
                  Spread.of(time_on), Spread.of([a / b for a, b in zip(time_off, time_on)]))


def fusion_savings(results: dict[str, ScenarioResult], seed: int = 0) -> list[Saving]:
    """What fusion saves NetBasicFuse at the lab's 4x4 (its own executables) and at LARGE
    (compiled here, fusion on and off, without touching the context or writing dumps)."""
    from graphkernel.graph_kernel.pipeline import CompileOptions
    small = measure_saving(results["test_basic_fuse_no"].executable,
                           results["test_basic_fuse"].executable, results["test_basic_fuse"].x)
    x = np.random.default_rng(seed).standard_normal(LARGE).astype(np.float32)
    on, off = (gk_compile(NetBasicFuse(), Tensor(x),
                          options=CompileOptions(enable_graph_kernel=fusion))
               for fusion in (True, False))
    return [small, measure_saving(off, on, x)]


def headline(savings: list[Saving]) -> str:
    """The lesson in one sentence per size, as plain text (the report draws its own)."""
    lines = []
    for s in savings:
        size = "x".join(map(str, s.shape))
        lines.append(f"{size}: {s.kernels_off} kernels -> {s.kernels_on}, "
                     f"{_bytes(s.bytes_off)} -> {_bytes(s.bytes_on)} moved per call, "
                     f"{_seconds(s.time_off.median)} -> {_seconds(s.time_on.median)} a call: "
                     f"{s.effect()}")
    return "\n".join(lines)


def _bytes(n: int) -> str:
    return f"{n} B" if n < 10_000 else f"{n / (1 << 20):.1f} MiB"


def _seconds(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"
