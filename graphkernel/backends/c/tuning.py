"""Per-kernel schedule choices measured on this machine (issue 30, "tuned where it runs").

Each generated kernel takes a few settings of `CConfig` that change its C but not its results
(beyond rounding: a row block regroups a float sum, within the differential tests'
tolerances): whether its outer loop runs on OpenMP threads (`parallel_threshold`; for a
convolution or pool, `window_parallel_min_macs`), whether it writes with streaming stores
(`stream_min_bytes`), whether it prefetches its inputs (`prefetch_min_bytes`), the vector
width GCC prefers for it (`vector_width`: 256 beside AVX-512's 512), the block sizes of its
loops (backends/c/c_loops.py `LoopBlocking`): how far ahead it prefetches
(`prefetch_distance_bytes`) and in chunks of how many elements (`pointwise_chunk`), how many
rows per chunk a row reduction pipelines (`row_pipeline_rows`, 0: not pipelined), the elements
per float block sum of a row (`row_block`) and the lanes per column-reduction block
(`column_block`), and, for a convolution, the register tile of its units
(`conv_channel_vectors` x `conv_pixels`, conv_tile.py) and, for a conv block, whether its
epilogue runs in the units' stores (`conv_store_epilogue`). `Knobs` holds one kernel's values of
them. Tuning emits a kernel under each candidate setting, drops the candidates whose C is the
same text as one already kept (a knob the kernel does not use), builds every remaining variant
into one library, and times each variant inside the real plan on random inputs
(`Runner.profile`, so each kernel sees its neighbours' cache footprint). The fastest of the
variants that beat the defaults by more than MARGIN in every pass wins; otherwise the defaults
stay (a loaded machine's noise is not a reason to leave them).

The choice is stored as a versioned JSON record per kernel in the kernel cache folder
(`tuning/KEY.json`), KEY = sha256 of the kernel's C under the defaults with its name taken out,
the CPU model and the toolchain. A later compile of the same kernel on the same machine reads
it instead of measuring. A record is data: its version, key, CPU model and each knob's value
range are checked; one that fails is not used (the defaults are, with the reason in the
executable's warnings and the plan's description) and only the checked knob values ever reach
an emitter.

The defaults are the compile's CConfig (calibrated from this machine's rates by
backends/c/calibration.py, or the constants); what this machine's rates suggest also enters as
a candidate: the threads threshold at which one
thread's bandwidth-bound work is PAYOFF times the measured OpenMP fork/join cost, from the
measured copy bandwidth (`MachineRates`).

The library of each convolution kernel (ours or oneDNN's) is tuned beside the schedules, in
backends/c/onednn_choice.py (`tune`), under the same level and budget.

Levels (`--online_tuning=N`, MindSpore's graph-kernel flag; MindSpore declares it an integer,
0 off): 0 measures nothing (records already stored are still read); 1 tries each knob alone;
2 and above try every combination of the values of the knobs that change this kernel's C
(those that do not, a prefetch distance for a kernel that does not prefetch, would only repeat
a variant), fewest knobs away from the defaults first. No new variant is built after the time
budget (TIME_BUDGET_S per level); the variants built by then finish their passes.
"""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import itertools
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.backends.c import cache, records, toolchain
from graphkernel.backends.c.c_entry_threads import runner_keep_awake
from graphkernel.backends.c.c_loops import KernelSource
from graphkernel.backends.c.config import (
    BLOCKING_RANGES,
    CConfig,
    check_blocking,
    check_vector_width,
)
from graphkernel.backends.c.conv_tile import CONV_TILE, check_conv_tile, check_store_epilogue
from graphkernel.backends.c.shared_kernels import structural_key
from graphkernel.graph_kernel.lower import KernelKind
from graphkernel.runtime.plan import ExecutionPlan, KernelSpec

RECORD_FORMAT = "graphkernel-tuning"
RECORD_VERSION = 3  # 2: the block sizes and the conv register tile joined the knobs; 3: the
# conv block's epilogue placement
FOLDER = "tuning"
# A threshold no kernel reaches: the knob is off for this kernel.
NEVER = 1 << 62
# A variant must beat the defaults by this share to be chosen: below it the difference is within
# the noise of a loaded machine, and the defaults are the tested path.
MARGIN = 0.05
TIME_BUDGET_S = 30.0  # per level: --online_tuning=2 may measure for a minute
PASSES = 3  # every variant is timed this many times, interleaved with the others
REPEATS = 5  # calls per timing (Runner.profile takes each kernel's median)

# The values each knob may take in a candidate, beside the configured default.
CHOICES: dict[str, tuple[int | None, ...]] = {
    "parallel_threshold": (1, NEVER),  # threads always / never
    "stream_min_bytes": (0, None),  # streaming stores always / never
    "prefetch_min_bytes": (0, None),  # prefetch always / never
    "window_parallel_min_macs": (1, NEVER),  # a convolution's images on threads always / never
    "vector_width": (),  # 256 where GCC builds 512-bit kernels (`vector_choices`)
    # Block sizes (c_loops.py), around their defaults: prefetching 4 KiB ahead measured best
    # on one host, within 10% from 4 to 16 KiB; rows pipelined in chunks of 32 (0: off).
    "prefetch_distance_bytes": (1024, 2048, 8192, 16384),
    "pointwise_chunk": (32, 128, 256),
    "row_pipeline_rows": (0, 8, 128),
    "row_block": (512, 2048, 4096),
    "column_block": (128, 256, 1024, 2048),
    # A convolution's register tile (conv_tile.py), where the kernel is one and the 512-bit
    # code runs (`conv_tile_choices`); pairs that do not fit the registers are not tried. Two
    # vectors, the rule's for most, is a different C text where the rule takes four.
    "conv_channel_vectors": (1, 2, 3, 4),
    "conv_pixels": (8, 16),
    # A conv block's epilogue on blocked output (c_conv_block.py): a second pass over each
    # unit's output / in the units' stores (the rule picks by taps; neither wins everywhere).
    "conv_store_epilogue": (0, 1),
}
_TILE = CONV_TILE
_OPTIONAL = {"stream_min_bytes", "prefetch_min_bytes"}  # None allowed: never


# A kernel's outer loop goes on threads when one thread's work is at least PAYOFF times the
# cost of the fork and join: then the threads save more than the fork costs.
PAYOFF = 4


@dataclass(frozen=True)
class MachineRates:
    """What the calibrated thresholds come from, measured here (small and bounded)."""

    copy_bytes_per_s: float  # read + write, past the caches
    fork_join_s: float  # one empty OpenMP parallel region

    def parallel_threshold(self) -> int:
        """Elements of a bandwidth-bound loop (8 bytes moved each: a float32 read and written)
        whose one-thread time is PAYOFF forks."""
        return max(1, int(PAYOFF * self.fork_join_s * self.copy_bytes_per_s / 8))

    def describe(self) -> str:
        return (f"copy {self.copy_bytes_per_s / 1e9:.1f} GB/s, fork/join "
                f"{self.fork_join_s * 1e6:.1f} us: threads from {self.parallel_threshold():,} "
                "elements")


_FORK_JOIN_SOURCE = """
void gk_fork_join(void **args) {
  volatile int *sink = (volatile int *)args[0];
#pragma omp parallel
  { if (sink[0] < 0) sink[0] = 0; }
}
"""
_rates: list[MachineRates] = []


def machine_rates() -> MachineRates:
    """This machine's copy bandwidth and OpenMP fork/join cost (measured once a process: the
    best of a few short runs, closest to what the hardware does on a loaded machine)."""
    if _rates:
        return _rates[0]
    from graphkernel.backends.c.library import build_library
    src = np.ones(8 << 20, dtype=np.float32)
    dst = np.empty_like(src)
    copy = _best(lambda: np.copyto(dst, src), 10)
    library = build_library([KernelSource("gk_fork_join", _FORK_JOIN_SOURCE, [])])
    fork = library.functions["gk_fork_join"]
    sink = np.zeros(1, np.int32)
    argv = (ctypes.c_void_p * 1)(sink.ctypes.data)
    fork(argv)
    fork_join = _best(lambda: fork(argv), 200)
    _rates.append(MachineRates(2 * src.nbytes / copy, fork_join))
    return _rates[0]


def _best(run: Callable[[], object], times: int) -> float:
    best = float("inf")
    for _ in range(times):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return best


@dataclass(frozen=True)
class Knobs:
    """One kernel's values of the CConfig settings that shape its schedule."""

    parallel_threshold: int
    stream_min_bytes: int | None
    prefetch_min_bytes: int | None
    window_parallel_min_macs: int
    vector_width: int | None = None
    # The block sizes of the kernel's loops (CConfig's fields of the same names).
    prefetch_distance_bytes: int = CConfig.prefetch_distance_bytes
    pointwise_chunk: int = CConfig.pointwise_chunk
    row_pipeline_rows: int = CConfig.row_pipeline_rows
    row_block: int = CConfig.row_block
    column_block: int = CConfig.column_block
    # a convolution's register tile (conv_tile.py; None: the register file's rule)
    conv_channel_vectors: int | None = None
    conv_pixels: int | None = None
    # a conv block's epilogue placement (None: c_conv_block.store_epilogue_rule; 0 a second
    # pass, 1 in the units' stores)
    conv_store_epilogue: int | None = None

    @classmethod
    def of(cls, config: CConfig) -> Knobs:
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})

    def apply(self, config: CConfig) -> CConfig:
        return dataclasses.replace(config, **dataclasses.asdict(self))

    def differences(self, default: Knobs) -> str:
        """The knobs that differ from `default`, in words ("defaults" when none does)."""
        words = []
        for name, value in dataclasses.asdict(self).items():
            if value != getattr(default, name):
                words.append(f"{name}={_shown(name, value)}")
        return ", ".join(words) or "defaults"


def _shown(name: str, value: int | None) -> str:
    if name in _TILE:  # a register tile's side; None: the register file's rule
        return "rule" if value is None else str(value)
    if name == "conv_store_epilogue":
        return "rule" if value is None else "in stores" if value else "second pass"
    if name in BLOCKING_RANGES:  # a size; rows per pipelined chunk 0: not pipelined
        return "off" if name == "row_pipeline_rows" and value == 0 else str(value)
    return "never" if value is None or value == NEVER else \
        "always" if value in (0, 1) else str(value)


@dataclass(frozen=True)
class Choice:
    knobs: Knobs
    how: str  # where the choice came from, for the plan's description
    refused: str | None = None  # why a stored record was not used
    # The kernel's C when `knobs` are the defaults (emitted to find its key): not emitted again
    source: KernelSource | None = None
    recorded: bool = False  # `knobs` are a stored record's
    record_key: str | None = None  # where its tuning record is (`kernel_key`; None: nowhere)


def vector_choices() -> tuple[int, ...]:
    """The vector widths worth trying beside the toolchain's: 256 bits where GCC builds
    512-bit kernels (AVX-512; some cores run them as two 256-bit halves). Clang does not take
    GCC's per-function target pragma."""
    tc = toolchain.detect()
    if tc is None or not tc.avx512 or "clang" in tc.version.lower():
        return ()
    return (256,)


def conv_tile_choices() -> dict[str, tuple[int | None, ...]]:
    """The register tiles worth trying beside the rule's: only where the toolchain builds the
    512-bit code they shape (AVX-512; the 256-bit code keeps its own tile)."""
    tc = toolchain.detect()
    if tc is None or not tc.avx512:
        return {name: () for name in _TILE}
    return {name: CHOICES[name] for name in _TILE}


cpu_model = toolchain.cpu_model  # records are kept per CPU model


def toolchain_id() -> str:
    tc = toolchain.detect()
    if tc is None:
        return "no compiler"
    return f"{tc.compiler} {tc.version} {' '.join(tc.flags)}"


def kernel_key(default_source: KernelSource) -> str | None:
    """The record key of a kernel: its C under the defaults with its own name taken out, the
    CPU model and the toolchain; None when its name cannot be taken out."""
    code = structural_key(default_source)
    if code is None:
        return None
    text = "\0".join((code, cpu_model(), toolchain_id()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def record_folder() -> str:
    return os.path.join(cache.open_folder(), FOLDER)


def record_path(key: str) -> str:
    return os.path.join(record_folder(), key + ".json")


def read_record(path: str, key: str) -> tuple[Knobs | None, str | None]:
    """The knobs a stored record holds for kernel `key`: (knobs, None); (None, None) when there
    is no record; (None, why) when there is one this graphkernel does not use."""
    record, refused = records.read_record(path, RECORD_FORMAT, RECORD_VERSION, key, cpu_model(),
                                          "tuning record", "kernel or toolchain")
    if record is None:
        return None, refused
    knobs = record.get("knobs")
    names = [f.name for f in dataclasses.fields(Knobs)]
    if not isinstance(knobs, dict) or sorted(knobs) != sorted(names):
        return None, f"its knobs are not exactly {', '.join(names)}"
    for name in names:
        value = knobs[name]
        if name == "vector_width" or name in BLOCKING_RANGES:
            problem = check_vector_width(value) if name == "vector_width" else \
                check_blocking({name: value})
            if problem is not None:
                return None, f"knob {problem}"
            continue
        if name in _TILE:  # the pair too: a tile must fit the vector registers
            problem = check_conv_tile(knobs["conv_channel_vectors"], knobs["conv_pixels"])
            if problem is not None:
                return None, f"knob {problem}"
            continue
        if name == "conv_store_epilogue":
            problem = check_store_epilogue(value)
            if problem is not None:
                return None, f"knob {problem}"
            continue
        if value is None and name in _OPTIONAL:
            continue
        if type(value) is not int or not 0 <= value <= NEVER:
            kind = "an int from 0 to 2**62" + (" or null" if name in _OPTIONAL else "")
            return None, f"knob {name} is {value!r:.40}; it is {kind}"
    return Knobs(**knobs), None


def write_record(key: str, knobs: Knobs, seconds: dict[str, float], default: Knobs) -> str:
    """Store `knobs` for kernel `key` (atomically: a reader sees the old record or the new)."""
    record = {"format": RECORD_FORMAT, "version": RECORD_VERSION, "key": key,
              "cpu_model": cpu_model(), "toolchain": toolchain_id(),
              "knobs": dataclasses.asdict(knobs), "defaults": dataclasses.asdict(default),
              "measured_seconds": seconds, "written": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                    time.gmtime())}
    return records.write_record(record_folder(), key, record)


def candidates(default: Knobs, level: int, calibrated: int | None = None,
               relevant: set[str] | None = None, convolution: bool = False
               ) -> list[Knobs]:
    """The knob settings tried at `level`: the defaults first, then each knob alone (level 1)
    or every combination (level 2 and above) of the knobs in `relevant` (None: all), those
    with fewer knobs away from the defaults first (the time budget may end the list).
    `calibrated`: a threads threshold from this machine's rates
    (`MachineRates.parallel_threshold`), tried beside always and never. `convolution`: the
    kernel is a window kernel, whose register tile and (a conv block's) epilogue placement are
    tried too (tiles that do not fit the registers are left out)."""
    choices = dict(CHOICES, vector_width=vector_choices())
    choices.update(conv_tile_choices() if convolution else {name: () for name in _TILE})
    choices["conv_store_epilogue"] = CHOICES["conv_store_epilogue"] if convolution else ()
    if calibrated is not None:
        choices["parallel_threshold"] = (calibrated,) + CHOICES["parallel_threshold"]
    names = [n for n in CHOICES if relevant is None or n in relevant]
    base = dataclasses.asdict(default)
    out = [default]
    if level == 1:
        for name in names:
            for value in choices[name]:
                out.append(Knobs(**(base | {name: value})))
    else:
        values = [(base[n],) + tuple(choices[n]) for n in names]
        combos = [Knobs(**(base | dict(zip(names, combo))))
                  for combo in itertools.product(*values)]
        out += sorted(combos, key=lambda k: sum(
            getattr(k, n) != base[n] for n in names))  # stable: the product's order within
    # each once, in order; a register tile that does not fit the registers is never tried
    return [k for k in dict.fromkeys(out)
            if check_conv_tile(k.conv_channel_vectors, k.conv_pixels) is None]


@dataclass
class _Tunable:
    spec: KernelSpec
    key: str
    variants: list[tuple[Knobs, KernelSource]]  # defaults first, each a distinct C text
    seconds: list[list[float]]  # per pass, per variant (inf: not measured)

    def wins(self, i: int) -> bool:
        """Variant i beat the defaults by MARGIN in every pass: on a loaded machine one lucky
        round is not a win."""
        return all(p[i] < p[0] * (1 - MARGIN) for p in self.seconds)

    def typical(self, i: int) -> float:
        return statistics.median(p[i] for p in self.seconds)


class _Loaded:
    """The runner's view of a library whose functions are chosen per round."""

    def __init__(self, functions: dict[str, Any]) -> None:
        self.functions = functions
        self.entry = None
        self.entry_module = None


def stored_choice(kernel: str, key: str | None, default: Knobs) -> Choice:
    """Kernel `kernel`'s choice from what is stored for its record `key` (`kernel_key`; None:
    not separable): the record's knobs, else the defaults and why (a record refused)."""
    if key is None:
        return Choice(default, "defaults (its name is not separable)")
    path = record_path(key)
    knobs, refused = read_record(path, key)
    if knobs is not None:
        return Choice(knobs, f"tuned: {knobs.differences(default)} (record {key})",
                      recorded=True, record_key=key)
    refused_text = None if refused is None else \
        f"kernel {kernel}: tuning record {path} not used: {refused}; defaults used"
    return Choice(default, "defaults" + ("" if refused is None else
                                         f" (record refused: {refused})"), refused_text,
                  record_key=key)


def choose_schedules(plan: ExecutionPlan, config: CConfig, level: int,
                     emit: Callable[[KernelSpec, CConfig], KernelSource],
                     progress: bool = True) -> dict[str, Choice]:
    """Each kernel spec of `plan` -> its knobs: a stored record's, measured here (level > 0),
    or `config`'s defaults. `emit` writes a spec's C under a config."""
    default = Knobs.of(config)
    choices: dict[str, Choice] = {}
    tunable: list[_Tunable] = []
    specs = [s.kernel for s in plan.steps if s.kernel is not None]
    bases: dict[str, KernelSource] = {}
    for spec in specs:
        base = bases[spec.name] = emit(spec, config)
        key = kernel_key(base)
        choices[spec.name] = stored_choice(spec.name, key, default)
        if key is None or choices[spec.name].recorded or level <= 0 or plan.symbols:
            continue
        variants = _variants(spec, base, config, default, level, emit,
                             spec.kind in (KernelKind.WINDOW, KernelKind.CONV_BLOCK))
        if len(variants) > 1:
            tunable.append(_Tunable(spec, key, variants,
                                    [[float("inf")] * len(variants) for _ in range(PASSES)]))
    if tunable:
        _measure(plan, specs, choices, tunable, config, emit, level, progress)
        for t in tunable:
            winners = [i for i in range(1, len(t.variants)) if t.wins(i)]
            best = min(winners, key=t.typical, default=0)
            knobs = t.variants[best][0]
            measured = {t.variants[i][0].differences(default): t.typical(i)
                        for i in range(len(t.variants)) if t.typical(i) != float("inf")}
            note = ""
            try:
                write_record(t.key, knobs, measured, default)
            except OSError as exc:
                note = f"; not stored: {exc.strerror}"
            # Nothing timed in every pass (the budget spent on builds): no speed to quote.
            timed = math.isfinite(t.typical(0)) and t.typical(best) > 0
            speed = f"{t.typical(0) / t.typical(best):.2f}x the defaults' speed" if timed \
                else "the defaults not timed in every pass"
            choices[t.spec.name] = Choice(
                knobs, f"tuned here: {knobs.differences(default)} ({speed}, "
                f"{len(measured)} of {len(t.variants)} variants measured{note})",
                choices[t.spec.name].refused, record_key=t.key)
    for spec in specs:
        if choices[spec.name].knobs == default:
            choices[spec.name] = dataclasses.replace(choices[spec.name], source=bases[spec.name])
    return choices


def _variants(spec: KernelSpec, base: KernelSource, config: CConfig, default: Knobs,
              level: int, emit: Callable[[KernelSpec, CConfig], KernelSource],
              convolution: bool = False) -> list[tuple[Knobs, KernelSource]]:
    """The variants of kernel `spec` worth measuring at `level`, each a distinct C text, its
    defaults' (`base`) first: each knob alone, then (level 2 and above) the combinations of
    the knobs that changed its C alone."""
    variants = [(default, base)]
    seen = {structural_key(base)}
    calibrated = machine_rates().parallel_threshold()

    def add(knobs: Knobs) -> bool:
        source = emit(dataclasses.replace(spec, name=f"{spec.name}_tune{len(variants)}"),
                      knobs.apply(config))
        text = structural_key(source)
        if text is None or text in seen:
            return False
        seen.add(text)
        variants.append((knobs, source))
        return True
    relevant: set[str] = set()  # the knobs one of whose values changes this kernel's C
    for knobs in candidates(default, 1, calibrated, convolution=convolution)[1:]:
        if add(knobs):
            relevant.update(n for n in CHOICES if getattr(knobs, n) != getattr(default, n))
    if level >= 2:
        for knobs in candidates(default, level, calibrated, relevant, convolution)[1:]:
            add(knobs)
    return variants


def _measure(plan: ExecutionPlan, specs: list[KernelSpec], choices: dict[str, Choice],
             tunable: list[_Tunable], config: CConfig,
             emit: Callable[[KernelSpec, CConfig], KernelSource], level: int,
             progress: bool) -> None:
    """Time every variant of `tunable` inside `plan`, in rounds: round i runs each kernel's
    i-th variant (its defaults when it has fewer), so one build and one plan serve them all.
    Each round's variants are built in the first pass (one compiler run a round), and no
    round is built after the budget; the rounds built by then are timed in every pass (a
    variant needs all its passes to win), up to twice the budget: one build and the passes of
    the rounds built may overrun it, nothing more."""
    from graphkernel.backends.c.library import build_library
    from graphkernel.runtime.runner import Runner
    start = time.perf_counter()
    by_name = {t.spec.name: t for t in tunable}
    first = [t.variants[0][1] for t in tunable]
    first += [emit(spec, choices[spec.name].knobs.apply(config)) for spec in specs
              if spec.name not in by_name]
    built = {0: build_library(first).functions}
    runner = Runner(plan, prefault=False)
    rng = np.random.default_rng(0)
    arrays, weights = random_arrays(plan, rng)
    kernel_of = [step.kernel.name if step.kernel is not None else None
                 for step in plan.kernel_steps()]
    rounds = max(len(t.variants) for t in tunable)
    budget = TIME_BUDGET_S * level
    with progress_bar(PASSES * rounds, f"tuning {plan.name}: {len(tunable)} kernel(s)",
              progress) as advance:
        for p, i in itertools.product(range(PASSES), range(rounds)):
            if i >= rounds:  # past the rounds built in the first pass
                continue
            spent = time.perf_counter() - start
            if p == 0 and spent > budget:
                rounds = i  # the first pass builds no more rounds; later passes time these
                continue
            if spent > 2 * budget:
                break
            if i not in built:
                built[i] = build_library([t.variants[i][1] for t in tunable
                                          if i < len(t.variants)]).functions
            functions = dict(built[0])
            for t in tunable:
                if i < len(t.variants):
                    functions[t.spec.name] = built[i][t.variants[i][1].name]
            runner.load(_Loaded(functions))
            # Timed as a call runs them: the threads awake between kernels (Runner.profile)
            runner.keep_awake = runner_keep_awake(plan)
            times = runner.profile(arrays, weights, REPEATS)
            for kernel, seconds in zip(kernel_of, times):
                timed = by_name.get(kernel) if kernel is not None else None
                if timed is not None and i < len(timed.variants):
                    timed.seconds[p][i] = seconds
            advance()


def random_arrays(plan: ExecutionPlan, rng: np.random.Generator
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Inputs and weights for `plan` to time it on: normal floats, zeros otherwise (valid
    indices, masks)."""
    def one(slot: int) -> np.ndarray:
        tensor_type = plan.slots[slot].type
        shape, dtype = tuple(tensor_type.shape), np.dtype(tensor_type.dtype)
        return rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else \
            np.zeros(shape, dtype)
    return [one(s) for s in plan.inputs], [one(s) for s in plan.weights]


class progress_bar:
    """A rich progress bar on a terminal (stderr), nothing elsewhere or without rich."""

    def __init__(self, total: int, what: str, show: bool) -> None:
        self.total, self.what, self.show = total, what, show
        self.progress: Any = None

    def __enter__(self) -> Callable[[], None]:
        if self.show and getattr(sys.stderr, "isatty", lambda: False)():
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                )
            except ImportError:
                return lambda: None
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TimeElapsedColumn(),
                                     console=Console(file=sys.stderr), transient=True)
            task = self.progress.add_task(self.what, total=self.total)
            self.progress.start()
            return lambda: self.progress.update(task, advance=1)
        return lambda: None

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
