"""Per-kernel schedule choices tuned on this machine (backends/c/tuning.py, `--online_tuning`):
a choice never changes results beyond the differential tests' tolerances, a stored record is
reused by the next compile, and a corrupt, foreign or truncated record falls back to the
defaults with its reason in the warnings and the plan's description."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time

import numpy as np
import pytest

import graphkernel
from graphkernel import nn
from graphkernel.backends.c import calibration, toolchain, tuning
from graphkernel.backends.c.config import BLOCKING_RANGES, CConfig
from graphkernel.backends.c.conv_tile import MAX_PIXELS
from graphkernel.backends.c.tuning import NEVER, Knobs
from graphkernel.errors import ContextError, FlagError
from graphkernel.graph_kernel.flags import parse_flags
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P

needs_cc = pytest.mark.skipif(toolchain.detect() is None, reason="no C compiler")
# The differential tests' tolerances for float32 programs with transcendental ops
RTOL, ATOL = 1e-4, 1e-5


class SoftmaxTanh(nn.Cell):
    """A reduction schedule (Softmax) with pointwise work after it."""

    def construct(self, x, b):
        return P.Tanh()(P.Softmax()(x + b) * 3.0) + x


class ExpChain(nn.Cell):
    """A pointwise kernel calling vector math (a prefetch candidate)."""

    def construct(self, x, b):
        return P.Exp()(x * 0.5) * P.Sigmoid()(x + b)


class DenseGeLU(nn.Cell):
    """A product, then kernels beside BLAS."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Dense(96, 96)

    def construct(self, x, b):
        return P.GeLU()(self.dense(x)) + P.ReduceMean(keep_dims=True)(x, -1) + b


class ConvReLU(nn.Cell):
    """A convolution with its epilogue (the window kernels' threads threshold)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="same")

    def construct(self, x, b):
        return P.ReLU()(P.BiasAdd()(self.conv(x), b)) * 2.0


def _inputs(cell: nn.Cell, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if isinstance(cell, ConvReLU):
        return [rng.standard_normal((2, 3, 12, 12)).astype(np.float32),
                rng.standard_normal((8,)).astype(np.float32)]
    return [rng.standard_normal((64, 96)).astype(np.float32),
            rng.standard_normal((96,)).astype(np.float32)]


def _options(level: int = 0, config: CConfig | None = None) -> CompileOptions:
    return CompileOptions(enable_graph_kernel=True,
                          flags=parse_flags(f"--online_tuning={level}"), backend_config=config)


@pytest.fixture
def records(tmp_path, monkeypatch):
    """A tuning-record folder of this test's own: records never reach other tests' kernels.
    Tuning measures for at most a few seconds (the budget's rule, not the choice, is what
    these tests need)."""
    folder = str(tmp_path / "tuning")
    monkeypatch.setattr(tuning, "record_folder", lambda: folder)
    monkeypatch.setattr(tuning, "TIME_BUDGET_S", 2.0)
    return folder


# Knob settings the tuner may choose (candidates at level 2 combine these values)
EXTREMES = [
    Knobs(1, 0, 0, 1),  # everything always: threads, streaming stores, prefetch
    Knobs(NEVER, None, None, NEVER),  # everything never
    Knobs(1, None, 0, NEVER),
    Knobs(NEVER, 0, None, 1),
] + [Knobs(1, 0, 0, NEVER, width) for width in tuning.vector_choices()] + [
    # a convolution's register tiles (conv_tile.py), where the 512-bit code runs
    Knobs(NEVER, None, None, NEVER, None, conv_channel_vectors=vectors, conv_pixels=pixels)
    for vectors, pixels in ((1, 16), (3, 8), (4, None), (None, 8))
    if tuning.conv_tile_choices()["conv_channel_vectors"]]


@needs_cc
@pytest.mark.parametrize("cell_type", [SoftmaxTanh, ExpChain, DenseGeLU, ConvReLU])
def test_every_choice_the_tuner_makes_keeps_the_results(cell_type, records):
    cell = cell_type()
    arrays = _inputs(cell)
    want = graphkernel.compile(cell, *arrays, options=_options()).run_arrays(*arrays)[0]
    default = Knobs.of(CConfig())
    thresholds = {"parallel_threshold", "stream_min_bytes", "prefetch_min_bytes",
                  "window_parallel_min_macs", "vector_width"}
    for knobs in EXTREMES:
        assert tuning.candidates(default, 2, relevant=thresholds | set(tuning._TILE),
                                 convolution=True).count(knobs) == 1
        exe = graphkernel.compile(cell, *arrays, options=_options(config=knobs.apply(CConfig())))
        np.testing.assert_allclose(exe.run_arrays(*arrays)[0], want, rtol=RTOL, atol=ATOL,
                                   err_msg=str(knobs))
    tuned = graphkernel.compile(cell, *arrays, options=_options(level=1))
    np.testing.assert_allclose(tuned.run_arrays(*arrays)[0], want, rtol=RTOL, atol=ATOL)
    other = _inputs(cell, seed=1)  # and on inputs the tuner did not see
    np.testing.assert_allclose(tuned.run_arrays(*other)[0],
                               graphkernel.compile(cell, *other, options=_options())
                               .run_arrays(*other)[0], rtol=RTOL, atol=ATOL)


def _tuned_once(records: str) -> tuple[str, dict]:
    """Tune SoftmaxTanh at level 1: its record's path and content."""
    cell = SoftmaxTanh()
    exe = graphkernel.compile(cell, *_inputs(cell), options=_options(level=1))
    notes = list(exe.executable.plan.schedule_notes.values())
    # a winner the whole calls did not confirm is back at the defaults, its record rewritten
    assert len(notes) == 1 and (notes[0].startswith("tuned here: ") or
                                notes[0].startswith("defaults (") and "not kept" in notes[0]), notes
    (name,) = os.listdir(records)
    path = os.path.join(records, name)
    with open(path, encoding="utf-8") as fh:
        return path, json.load(fh)


@needs_cc
def test_a_stored_choice_is_reused_without_measuring(records, monkeypatch):
    path, record = _tuned_once(records)
    assert record["cpu_model"] == tuning.cpu_model() and record["version"] == 3
    assert os.path.basename(path) == record["key"] + ".json"

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again although a record was stored")
    monkeypatch.setattr(tuning, "_measure", no_measuring)
    cell = SoftmaxTanh()
    for level in (0, 1):  # a record serves untuned compiles too (`graphkernel tune` ahead)
        exe = graphkernel.compile(cell, *_inputs(cell), options=_options(level=level))
        (note,) = exe.executable.plan.schedule_notes.values()
        assert note.startswith("tuned: ") and f"(record {record['key']})" in note
        assert "schedule: tuned: " in exe.executable.plan.describe()


@needs_cc
def test_a_stored_choice_steers_the_generated_kernel(records):
    path, record = _tuned_once(records)
    never = Knobs(NEVER, None, None, NEVER)
    tuning.write_record(record["key"], never, {}, Knobs.of(CConfig()))
    cell = SoftmaxTanh()
    arrays = _inputs(cell)
    exe = graphkernel.compile(cell, *arrays, options=_options())
    (source,) = [k.source for k in exe.kernels if k.source]
    assert "#pragma omp parallel" not in source
    (note,) = exe.executable.plan.schedule_notes.values()
    assert "parallel_threshold=never" in note
    threads = Knobs(1, None, None, NEVER)
    tuning.write_record(record["key"], threads, {}, Knobs.of(CConfig()))
    exe = graphkernel.compile(cell, *arrays, options=_options())
    (source,) = [k.source for k in exe.kernels if k.source]
    assert "#pragma omp parallel" in source


def _edit(field: str, value: object, knob: bool = False):
    def edit(text: str) -> str:
        data = json.loads(text)
        part = data["knobs"] if knob or field in data["knobs"] else data
        part[field] = value
        return json.dumps(data)
    return edit


@needs_cc
@pytest.mark.parametrize("edit,reason", [
    (lambda text: text[:len(text) // 2], "not JSON \\(truncated or corrupt\\)"),
    (lambda text: "", "not JSON"),
    (_edit("cpu_model", "Another CPU 9000"), "measured on another CPU \\('Another CPU 9000'"),
    (_edit("version", 1), "version 1; this graphkernel reads version 3"),
    (_edit("key", "0" * 32), "recorded for another kernel or toolchain"),
    (_edit("format", "something else"), "not a graphkernel tuning record"),
    (lambda text: "[1, 2]", "not a graphkernel tuning record"),
    (_edit("parallel_threshold", -1), "knob parallel_threshold is -1; it is an int from 0"),
    (_edit("stream_min_bytes", "0); system(\"id\"); (0"), "knob stream_min_bytes is"),
    (_edit("prefetch_min_bytes", 1.5), "knob prefetch_min_bytes is 1.5"),
    (_edit("window_parallel_min_macs", None), "knob window_parallel_min_macs is None"),
    (_edit("parallel_threshold", 1 << 80), "knob parallel_threshold is"),
    (_edit("vector_width", 300), "knob vector_width is 300; it is None or one of"),
    (_edit("vector_width", "256\")\n#include <evil.h>"), "knob vector_width is"),
    (_edit("register_width", 512, knob=True), "its knobs are not exactly"),
    # the block sizes: each within its range, an int (they reach the C text)
    (_edit("row_block", 0), "knob row_block is 0; it is an int from 64 to 65536"),
    (_edit("row_pipeline_rows", -1), "knob row_pipeline_rows is -1; it is an int from 0"),
    (_edit("column_block", 1 << 20), "knob column_block is 1048576; it is an int from 16"),
    (_edit("prefetch_distance_bytes", "4096); abort(); (0"), "knob prefetch_distance_bytes is"),
    (_edit("pointwise_chunk", 2.5), "knob pointwise_chunk is 2.5"),
    (_edit("row_block", True), "knob row_block is True"),
    # the register tile: each side in range, the pair fitting the registers
    (_edit("conv_channel_vectors", 9), "knob conv_channel_vectors is 9; it is None or an int "
     "from 1 to 4"),
    (_edit("conv_pixels", "12 }; system(\"id\"); {"), "knob conv_pixels is '12 }"),
    (_edit("conv_pixels", 0), "knob conv_pixels is 0; it is None or an int from 1 to "
     f"{MAX_PIXELS}"),
    (lambda text: _edit("conv_pixels", 12)(_edit("conv_channel_vectors", 4)(text)),
     "knob conv_pixels 12 with 4 channel vectors does not fit 32 vector registers"),
    # a conv block's epilogue placement: None, 0 or 1
    (_edit("conv_store_epilogue", 2), "knob conv_store_epilogue is 2; it is None, 0 or 1"),
    (_edit("conv_store_epilogue", True), "knob conv_store_epilogue is True"),
    (lambda text: text + " " * (1 << 16), "larger than 65536 bytes"),
])
def test_a_bad_record_falls_back_to_the_defaults_with_its_reason(records, edit, reason):
    path, record = _tuned_once(records)
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(edit(text))
    cell = SoftmaxTanh()
    arrays = _inputs(cell)
    exe = graphkernel.compile(cell, *arrays, options=_options())
    (warning,) = [w for w in exe.warnings if "tuning record" in w]
    assert path in warning and "defaults used" in warning
    assert re.search(reason, warning), warning
    (note,) = exe.executable.plan.schedule_notes.values()
    assert note.startswith("defaults (record refused: ")
    assert "record refused" in exe.executable.plan.describe()
    assert "tuning record" in exe.summary()
    plain = graphkernel.compile(cell, *arrays, options=CompileOptions(enable_graph_kernel=True))
    assert [k.source for k in exe.kernels] == [k.source for k in plain.kernels]
    np.testing.assert_allclose(exe.run_arrays(*arrays)[0], plain.run_arrays(*arrays)[0],
                               rtol=RTOL, atol=ATOL)


def test_online_tuning_is_a_level_from_0_to_3():
    assert parse_flags("--online_tuning=2").online_tuning == 2
    assert "online_tuning" not in parse_flags("--online_tuning=1").no_effect
    with pytest.raises(FlagError, match="--online_tuning must be 0, 1, 2 or 3, got 7"):
        parse_flags("--online_tuning=7")


def test_candidates_start_with_the_defaults_and_do_not_repeat():
    default = Knobs.of(CConfig())
    widths = len(tuning.vector_choices())
    blocks = sum(len(tuning.CHOICES[n]) for n in BLOCKING_RANGES)
    one = tuning.candidates(default, 1)
    assert one[0] == default and len(one) == len(set(one)) == 1 + 2 * 4 + widths + blocks
    thresholds = {"parallel_threshold", "stream_min_bytes", "prefetch_min_bytes",
                  "window_parallel_min_macs", "vector_width"}
    every = tuning.candidates(default, 2, relevant=thresholds)
    assert every[0] == default and len(every) == len(set(every)) == 3 ** 4 * (1 + widths)
    # level 2 combines only the knobs that change the kernel's C, fewest changes first
    rows = tuning.candidates(default, 2, relevant={"row_pipeline_rows", "row_block"})
    assert len(rows) == 4 * 4
    changed = [sum(getattr(k, n) != getattr(default, n) for n in ("row_pipeline_rows",
                                                                     "row_block")) for k in rows]
    assert changed == sorted(changed) and changed[0] == 0 and changed[-1] == 2
    calibrated = tuning.candidates(default, 1, calibrated=12345)
    assert Knobs(**{**default.__dict__, "parallel_threshold": 12345}) in calibrated
    for name in BLOCKING_RANGES:  # every candidate block size is one CConfig takes
        for value in tuning.CHOICES[name]:
            CConfig(**{name: value})


def test_a_convolution_tries_register_tiles_that_fit():
    """Window kernels try the tiles (where the 512-bit code runs), never one that does not fit
    the vector registers; other kernels do not try them."""
    from graphkernel.backends.c.conv_tile import check_conv_tile
    default = Knobs.of(CConfig())
    tiles = {(k.conv_channel_vectors, k.conv_pixels)
             for level in (1, 2) for k in tuning.candidates(default, level, convolution=True)}
    if not tuning.conv_tile_choices()["conv_channel_vectors"]:
        assert tiles == {(None, None)}
        return
    assert {(None, None), (1, None), (2, None), (3, None), (4, None), (None, 8), (1, 8),
            (1, 16), (2, 8), (3, 8)} == tiles
    assert all(check_conv_tile(*tile) is None for tile in tiles)
    assert (None, 16) not in tiles and (4, 8) not in tiles  # 2 x 16 and 4 x 8 would spill
    plain = {(k.conv_channel_vectors, k.conv_pixels) for k in tuning.candidates(default, 2)}
    assert plain == {(None, None)}
    # the epilogue placement too, for convolutions alone
    assert {k.conv_store_epilogue for k in tuning.candidates(default, 1, convolution=True)} \
        == {None, 0, 1}
    assert {k.conv_store_epilogue for k in tuning.candidates(default, 2)} == {None}
    with pytest.raises(ContextError, match="conv_pixels 16 with 2 channel vectors does not fit"):
        CConfig(conv_pixels=16)


@needs_cc
def test_a_stored_register_tile_steers_the_convolution(records):
    """A record's tile reaches the convolution's C (its units of three channel vectors) and the
    results stay the defaults'."""
    cell = ConvReLU()
    arrays = _inputs(cell)
    exe = graphkernel.compile(cell, *arrays, options=_options(level=1))
    (name,) = os.listdir(records)  # the convolution's one kernel, tuned
    key = name.removesuffix(".json")
    tile = Knobs(**{**Knobs.of(CConfig()).__dict__, "conv_channel_vectors": 3})
    tuning.write_record(key, tile, {}, Knobs.of(CConfig()))
    tiled = graphkernel.compile(cell, *arrays, options=_options())
    (note,) = tiled.executable.plan.schedule_notes.values()
    assert "conv_channel_vectors=3" in note, note
    (source,) = [k.source for k in tiled.kernels if k.source]
    assert "_NU = (" in source and "+ 2) / 3, " in source and "_UV = 3, " in source
    np.testing.assert_allclose(tiled.run_arrays(*arrays)[0], exe.run_arrays(*arrays)[0],
                               rtol=RTOL, atol=ATOL)


@needs_cc
def test_a_vector_width_wraps_the_kernel_in_gcc_target_options():
    cell = ExpChain()
    arrays = _inputs(cell)
    exe = graphkernel.compile(cell, *arrays, options=_options(config=CConfig(vector_width=256)))
    (source,) = [k.source for k in exe.kernels if k.source]
    assert '#pragma GCC target("prefer-vector-width=256")' in source
    want = graphkernel.compile(cell, *arrays, options=_options()).run_arrays(*arrays)[0]
    np.testing.assert_allclose(exe.run_arrays(*arrays)[0], want, rtol=RTOL, atol=ATOL)
    with pytest.raises(ContextError,
                       match=r"vector_width is 300; it is None or one of \(128, 256, 512\)"):
        CConfig(vector_width=300)


def test_a_block_size_out_of_its_range_is_refused_by_the_settings():
    with pytest.raises(ContextError, match="CConfig: row_block is 0; it is an int from 64"):
        CConfig(row_block=0)
    with pytest.raises(ContextError, match="CConfig: row_pipeline_rows is 1.5"):
        CConfig(row_pipeline_rows=1.5)  # type: ignore[arg-type]
    assert CConfig(row_pipeline_rows=0).blocking.row_pipeline_rows == 0  # 0: not pipelined


@needs_cc
def test_graphkernel_tune_tunes_a_cell_ahead_of_time(records, tmp_path, capsys):
    from graphkernel.tools import cli
    spec = tmp_path / "net.py"
    spec.write_text("from graphkernel import nn\n"
                    "from graphkernel.ops import operations as P\n\n\n"
                    "class Net(nn.Cell):\n"
                    "    def construct(self, x, b):\n"
                    "        return P.Tanh()(P.Softmax()(x + b) * 3.0) + x\n")
    assert cli.main(["tune", f"{spec}:Net", "--input", "float32[64,96]", "--input",
                     "float32[96]", "--level", "1"]) == 0
    out = capsys.readouterr().out
    # a winner the whole calls did not confirm is back at the defaults (_tuned_once)
    assert "1 generated kernel(s)" in out and ("tuned here: " in out or "not kept" in out), out
    assert len(os.listdir(records)) == 1
    # the next compile of that kernel, with no tuning asked, uses the record
    cell = SoftmaxTanh()
    exe = graphkernel.compile(cell, *_inputs(cell), options=_options())
    (note,) = exe.executable.plan.schedule_notes.values()
    assert note.startswith("tuned: ")
    assert cli.main(["tune", "net.txt", "--input", "float32[4]"]) == 2
    assert "give FILE.py:CellClass or MODEL.onnx" in capsys.readouterr().err


# Kernels each block-size knob applies to: a pointwise kernel calling vector math (prefetching:
# prefetch_min_bytes 0 turns it on at this size), LayerNorm and Softmax (pipelined rows; rows
# longer than some row blocks), a row sum and a column sum (row and column blocks).
class LayerNorm(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm((2500,))

    def construct(self, x):
        return self.norm(x)


class Softmax(nn.Cell):
    def construct(self, x):
        return P.Softmax()(x * 2.0)


class RowSum(nn.Cell):
    def construct(self, x):
        return P.ReduceSum(keep_dims=False)(x * x, -1)


class ColumnSum(nn.Cell):
    def construct(self, x):
        return P.ReduceSum(keep_dims=False)(P.Exp()(x * 0.1), 0)


class Pointwise(nn.Cell):
    def construct(self, x):
        return P.Exp()(x * 0.5) * P.Tanh()(x + 1.0)


BLOCK_KERNELS = [(Pointwise, (67, 1001)), (LayerNorm, (67, 2500)), (Softmax, (203, 700)),
                 (RowSum, (50, 3001)), (ColumnSum, (300, 2100))]


@needs_cc
@pytest.mark.parametrize("name", sorted(BLOCKING_RANGES))
def test_every_block_size_the_tuner_tries_keeps_the_results(name, records):
    """Each candidate value of a block-size knob, on the kernels it applies to: the same
    results as the defaults' within the differential tests' tolerances, on random inputs;
    and each value changes the C of at least one kernel (else the check would be empty)."""
    base = CConfig(prefetch_min_bytes=0)
    changed = {value: 0 for value in tuning.CHOICES[name]}
    for cell_type, shape in BLOCK_KERNELS:
        cell = cell_type()
        x = np.random.default_rng(3).standard_normal(shape).astype(np.float32) * 2
        default = graphkernel.compile(cell, x, options=_options(config=base))
        (default_source,) = [k.source for k in default.kernels if k.source]
        want = default.run_arrays(x)[0]
        for value in tuning.CHOICES[name]:
            exe = graphkernel.compile(cell, x, options=_options(
                config=CConfig(prefetch_min_bytes=0, **{name: value})))
            (source,) = [k.source for k in exe.kernels if k.source]
            changed[value] += source != default_source
            np.testing.assert_allclose(exe.run_arrays(x)[0], want, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{cell_type.__name__} {name}={value}")
    assert all(changed.values()), changed


@needs_cc
def test_a_stored_block_size_choice_steers_the_kernel_and_is_shown(records, monkeypatch):
    """A record choosing rows pipelined 8 at a time and row blocks of 512 elements: the next
    compile reads it without measuring, its LayerNorm kernel is emitted so, the plan's
    description names both, and the results stay."""
    cell = LayerNorm()
    x = np.random.default_rng(4).standard_normal((67, 2500)).astype(np.float32)
    plain = graphkernel.compile(cell, x, options=_options())
    tuned = graphkernel.compile(cell, x, options=_options(level=1))
    (name,) = os.listdir(records)
    key = name.removesuffix(".json")
    chosen = Knobs(**{**Knobs.of(CConfig()).__dict__, "row_pipeline_rows": 8, "row_block": 512})
    tuning.write_record(key, chosen, {}, Knobs.of(CConfig()))

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again although a record was stored")
    monkeypatch.setattr(tuning, "_measure", no_measuring)
    for level in (0, 1):
        exe = graphkernel.compile(cell, x, options=_options(level=level))
        (source,) = [k.source for k in exe.kernels if k.source]
        assert "rlo = rc * 8," in source and "kb += 512)" in source, source
        (note,) = exe.executable.plan.schedule_notes.values()
        assert "row_pipeline_rows=8, row_block=512" in note and f"(record {key})" in note
        assert "row_pipeline_rows=8" in exe.executable.plan.describe()
        np.testing.assert_allclose(exe.run_arrays(x)[0], plain.run_arrays(x)[0], rtol=RTOL,
                                   atol=ATOL)
    np.testing.assert_allclose(tuned.run_arrays(x)[0], plain.run_arrays(x)[0], rtol=RTOL,
                               atol=ATOL)


def test_untuned_block_defaults_come_from_the_calibration_where_a_rate_predicts_them():
    """The column block from L1d (its accumulators a sixteenth of it); the others keep their
    constants, each with its reason."""
    rates = calibration.Calibration(copy_bytes_per_s=20e9, fma_flops_256=115e9,
                                    fma_flops_512=115e9, fork_join_s=80e-6,
                                    l1d_bytes=48 << 10, l2_bytes=1 << 20, llc_bytes=32 << 20)
    config, why = calibration.derive(rates)
    assert config.column_block == 1024 and why["column_block"] == "calibrated: L1d 48 KiB"
    small, _ = calibration.derive(dataclasses.replace(rates, l1d_bytes=32 << 10))
    assert small.column_block == CConfig().column_block == 512
    unknown, why = calibration.derive(dataclasses.replace(rates, l1d_bytes=None))
    assert unknown.column_block == 512 and why["column_block"].startswith("default")
    for name in ("prefetch_distance_bytes", "pointwise_chunk", "row_pipeline_rows",
                 "row_block"):
        assert getattr(config, name) == getattr(CConfig(), name)
        assert why[name].startswith("default, "), why[name]


@needs_cc
def test_variants_built_before_the_budget_runs_out_are_timed_in_every_pass(records,
                                                                            monkeypatch):
    """A clock that moves only while the compiler runs: the budget ends after the second
    round's build. Those two rounds still get their later passes (each variant needs every
    pass to be compared), so two variants count as measured; cutting the first pass short
    used to leave none measured and the defaults chosen by default."""
    from types import SimpleNamespace

    from graphkernel.backends.c import library
    clock = [0.0]
    real_build = library.build_library

    def build(*args, **kwargs):
        clock[0] += 1.0
        return real_build(*args, **kwargs)
    monkeypatch.setattr(library, "build_library", build)
    monkeypatch.setattr(tuning, "time", SimpleNamespace(
        perf_counter=lambda: clock[0], strftime=time.strftime, gmtime=time.gmtime))
    monkeypatch.setattr(tuning, "machine_rates", lambda: tuning.MachineRates(20e9, 1e-5))
    monkeypatch.setattr(tuning, "TIME_BUDGET_S", 1.5)
    cell = LayerNorm()
    x = np.random.default_rng(5).standard_normal((67, 2500)).astype(np.float32)
    exe = graphkernel.compile(cell, x, options=_options(level=1))
    (note,) = exe.executable.plan.schedule_notes.values()
    assert re.search(r"2 of \d+ variants measured", note) and "nan" not in note, note
