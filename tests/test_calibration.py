"""The C backend's untuned defaults from this machine's calibration (backends/c/calibration.py):
the cost model is a pure function of the rates, a stored record is reused, a corrupt or foreign
record is refused with its reason and measured again, calibration can be turned off, and no
calibration changes results beyond the differential tests' tolerances.

The rest of the suite runs with $GRAPHKERNEL_CALIBRATION=off (tests/conftest.py); the tests here
turn it on, each with a record folder of its own."""
from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable

import numpy as np
import pytest

import graphkernel
from graphkernel import nn
from graphkernel.backends import backend_config, get_backend
from graphkernel.backends.c import calibration, toolchain
from graphkernel.backends.c.calibration import Calibration, derive
from graphkernel.backends.c.config import CConfig
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P
from graphkernel.tools import doctor as doctor_mod

needs_cc = pytest.mark.skipif(toolchain.detect() is None, reason="no C compiler")
RTOL, ATOL = 1e-4, 1e-5  # the differential tests' tolerances with transcendental ops

MIB = 1 << 20
# Two kinds of machine: a quiet Xeon whose threads wake in 2 us and whose 512-bit FMAs run
# at twice the 256-bit rate, and a loaded 2-vCPU EPYC VM whose fork/join takes 80 us and
# whose 512-bit FMAs are two 256-bit halves (the same rate: 512-bit code still wins there).
XEON = Calibration(copy_bytes_per_s=12e9, fma_flops_256=100e9, fma_flops_512=200e9,
                   fork_join_s=2e-6, l1d_bytes=48 << 10, l2_bytes=2 * MIB, llc_bytes=60 * MIB)
EPYC_VM = Calibration(copy_bytes_per_s=20e9, fma_flops_256=115e9, fma_flops_512=115e9,
                      fork_join_s=80e-6, l1d_bytes=32 << 10, l2_bytes=MIB, llc_bytes=32 * MIB)


def test_the_cost_model_gives_each_machine_its_own_defaults():
    xeon, why_xeon = derive(XEON)
    # threads once splitting t = n * 8 B / 12 GB/s over two saves 2 x 2 us: n = 12,000 -> 2^14
    assert xeon.parallel_threshold == 1 << 14
    assert xeon.stream_min_bytes == 32 * MIB  # half of 60 MiB, to a power of two
    assert xeon.prefetch_min_bytes == 2 * MIB  # its L2
    # 2 x 2 us / 0.5 x 100 G MAC/s at a quarter of the peak = 200 k
    assert xeon.window_parallel_min_macs == 1 << 18
    assert xeon.vector_width is None  # 512-bit FMAs pay: the toolchain's 512
    vm, why_vm = derive(EPYC_VM)
    assert vm.parallel_threshold == 1 << 20  # 800,000 elements: forks cost 40x more here
    assert vm.stream_min_bytes == 16 * MIB
    assert vm.prefetch_min_bytes == MIB
    assert vm.window_parallel_min_macs == 1 << 22  # 4.6 M
    assert vm.vector_width is None
    assert why_xeon["parallel_threshold"] == "calibrated: copy 12.0 GB/s, fork/join 2.0 us"
    assert why_vm["vector_width"] == "calibrated: 512-bit FMA 1.00x the 256-bit rate"
    # a core that slows down for 512-bit work gets 256-bit kernels
    throttled, why = derive(dataclasses.replace(XEON, fma_flops_512=80e9))
    assert throttled.vector_width == 256
    assert why["vector_width"] == "calibrated: 512-bit FMA 0.80x the 256-bit rate, under 0.9x"
    assert why_xeon["stream_min_bytes"] == "calibrated: last-level cache 60 MiB"
    assert vm.plan == xeon.plan == CConfig().plan  # the plan's settings are not calibrated
    assert derive(XEON) == (xeon, why_xeon)  # a function of the rates alone


def test_the_cost_model_without_cache_sizes_or_avx512_keeps_those_defaults():
    bare = dataclasses.replace(EPYC_VM, fma_flops_512=None, l1d_bytes=None, l2_bytes=None,
                               llc_bytes=None)
    config, why = derive(bare)
    constants = CConfig()
    assert (config.stream_min_bytes, config.prefetch_min_bytes, config.vector_width) == \
        (constants.stream_min_bytes, constants.prefetch_min_bytes, constants.vector_width)
    assert why["stream_min_bytes"] == "default, the cache sizes are unknown"
    assert why["vector_width"] == "default, no 512-bit FMA measured"
    assert config.parallel_threshold == 1 << 20  # still calibrated


def test_the_cost_model_clamps_what_extreme_rates_give():
    slow_forks = dataclasses.replace(EPYC_VM, fork_join_s=1e-2, copy_bytes_per_s=1e13,
                                     fma_flops_256=1e13, fma_flops_512=5e12,
                                     l2_bytes=1 << 32, llc_bytes=1 << 32)
    config, _ = derive(slow_forks)
    assert config.parallel_threshold == calibration.CLAMPS["parallel_threshold"][1]
    assert config.window_parallel_min_macs == calibration.CLAMPS["window_parallel_min_macs"][1]
    assert config.stream_min_bytes == 1 << 30 and config.prefetch_min_bytes == 64 * MIB
    fast_forks = dataclasses.replace(XEON, fork_join_s=1e-8, copy_bytes_per_s=1e8,
                                     fma_flops_256=1e8, fma_flops_512=1e9,
                                     l2_bytes=1 << 10, llc_bytes=1 << 10)
    config, _ = derive(fast_forks)
    assert config.parallel_threshold == 1 << 10 and config.window_parallel_min_macs == 1 << 14
    assert config.stream_min_bytes == MIB and config.prefetch_min_bytes == 64 << 10


@pytest.fixture
def calibrating(tmp_path, monkeypatch):
    """Calibration on, with a record folder of this test's own and a stand-in measurement
    (EPYC_VM; `measured` counts the calls)."""
    monkeypatch.delenv(calibration.ENV, raising=False)
    folder = str(tmp_path / "calibration")
    monkeypatch.setattr(calibration, "record_folder", lambda: folder)
    monkeypatch.setattr(calibration, "_resolved", {})
    measured: list[int] = []

    def measure() -> Calibration:
        measured.append(1)
        return EPYC_VM
    monkeypatch.setattr(calibration, "measure", measure)
    monkeypatch.setattr(toolchain, "detect", lambda: _TC)
    return measured


_TC = toolchain.detect() or toolchain.Toolchain("cc", "cc 1", True, True)


def test_a_measurement_is_stored_and_the_next_process_reads_it(calibrating):
    first = calibration.resolve()
    assert calibrating == [1]
    assert first.origin.startswith("measured now in ") and "stored in " in first.origin
    assert first.config == derive(EPYC_VM)[0]
    with open(calibration.record_path(), encoding="utf-8") as fh:
        record = json.load(fh)
    assert record["format"] == "graphkernel-calibration" and \
            record["version"] == calibration.RECORD_VERSION
    assert record["cpu_model"] == toolchain.cpu_model()
    assert record["rates"] == dataclasses.asdict(EPYC_VM)
    calibration._resolved.clear()  # a new process
    again = calibration.resolve()
    assert calibrating == [1]  # read, not measured
    assert again.origin == f"record {calibration.record_path()}"
    assert again.config == first.config
    # the backend's defaults are these
    assert backend_config(get_backend("c"), None) == first.config
    assert backend_config(get_backend("c"), CConfig()) == CConfig()  # explicit settings stay


def test_calibration_off_keeps_the_constants(calibrating, monkeypatch):
    monkeypatch.setenv(calibration.ENV, "off")
    defaults = calibration.resolve()
    assert calibrating == []
    assert defaults.config == CConfig() and defaults.calibration is None
    assert set(defaults.sources.values()) == \
        {"default, calibration off: $GRAPHKERNEL_CALIBRATION=off"}
    assert backend_config(get_backend("c"), None) == CConfig()


def test_a_refused_cache_keeps_the_constants(tmp_path, monkeypatch):
    monkeypatch.delenv(calibration.ENV, raising=False)
    monkeypatch.setattr(calibration, "_resolved", {})
    monkeypatch.setattr(toolchain, "detect", lambda: _TC)
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, 0o777)
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(folder))
    defaults = calibration.resolve()
    assert defaults.config == CConfig()
    assert defaults.origin.startswith("the kernel cache is refused (the kernel cache folder")
    assert not (folder / calibration.FOLDER).exists()


def _edit(field: str, value: object, where: str = "") -> Callable[[str], str]:
    def edit(text: str) -> str:
        record = json.loads(text)
        (record[where] if where else record)[field] = value
        return json.dumps(record)
    return edit


def _drop(field: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        record = json.loads(text)
        del record["rates"][field]
        return json.dumps(record)
    return edit


BAD_RECORDS = [
    (lambda text: text[:len(text) // 2], r"not JSON \(truncated or corrupt\)"),
    (lambda text: "[1, 2]", "not a graphkernel calibration record"),
    (_edit("format", "graphkernel-tuning"), "not a graphkernel calibration record"),
    (_edit("version", calibration.RECORD_VERSION + 1),
     f"version {calibration.RECORD_VERSION + 1}; this graphkernel reads version "
     f"{calibration.RECORD_VERSION}"),
    (_edit("key", "0" * 32), r"recorded for another CPU or toolchain \(its key differs\)"),
    (_edit("cpu_model", "Another CPU 9000"), "measured on another CPU \\('Another CPU 9000'"),
    (_edit("rates", [1, 2]), "it holds no rates"),
    (_drop("fork_join_s"), "its rates are not exactly copy_bytes_per_s, "),
    (_edit("fork_join_s", "fast", "rates"), "fork_join_s is 'fast'; it is a number from"),
    (_edit("copy_bytes_per_s", 1e20, "rates"), "copy_bytes_per_s is 1e\\+20; it is a number"),
    (_edit("copy_bytes_per_s", float("nan"), "rates"), "copy_bytes_per_s is nan"),
    (_edit("fork_join_s", True, "rates"), "fork_join_s is True"),
    (_edit("fma_flops_256", None, "rates"), "fma_flops_256 is None; it is a number"),
    (_edit("llc_bytes", 1.5e6, "rates"), "llc_bytes is 1500000.0; it is an int from 1024 "),
    (_edit("l2_bytes", -1, "rates"), "l2_bytes is -1"),
    (lambda text: text + " " * (1 << 16), "larger than 65536 bytes"),
]


@pytest.mark.parametrize("corrupt, reason", BAD_RECORDS)
def test_a_corrupt_or_foreign_record_is_refused_with_its_reason_and_measured_again(
        calibrating, corrupt, reason):
    calibration.resolve()
    path = calibration.record_path()
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(corrupt(text))
    calibration._resolved.clear()
    with pytest.warns(RuntimeWarning, match=f"calibration record .* not used: {reason}"):
        defaults = calibration.resolve()
    assert calibrating == [1, 1]  # measured again
    assert re.search(f"stored record refused: {reason}", defaults.origin), defaults.origin
    assert defaults.config == derive(EPYC_VM)[0]  # never the record's numbers
    assert calibration.read_record(path) == (EPYC_VM, None)  # and stored again, whole


def test_an_implausible_measurement_keeps_the_constants(calibrating, monkeypatch):
    monkeypatch.setattr(calibration, "measure",
                        lambda: dataclasses.replace(EPYC_VM, fork_join_s=5.0))
    with pytest.warns(RuntimeWarning, match="fork_join_s is 5.0; .* CConfig's constants"):
        defaults = calibration.resolve()
    assert defaults.config == CConfig()
    assert defaults.sources["parallel_threshold"].startswith("default, calibration fork_join_s")
    assert not os.path.exists(calibration.record_path())


def test_doctor_shows_each_default_and_where_it_came_from(calibrating, monkeypatch):
    calibration.resolve()  # a fixed record in the cache: EPYC_VM's rates
    calibration._resolved.clear()
    monkeypatch.setattr(doctor_mod, "_rate_lines", lambda tc: [])  # not measured here
    text, _ = doctor_mod.doctor()
    assert f"calibrate: {EPYC_VM.describe()} (record {calibration.record_path()})" in text
    assert "defaults : parallel_threshold = 1,048,576 (calibrated: copy 20.0 GB/s, fork/join " \
        "80.0 us)" in text
    assert "           vector_width = the toolchain's (calibrated: 512-bit FMA 1.00x the " \
        "256-bit rate)" in text
    assert "           stream_min_bytes = 16 MiB (calibrated: last-level cache 32 MiB)" in text
    monkeypatch.setenv(calibration.ENV, "off")
    text, _ = doctor_mod.doctor()
    assert "calibrate: none - calibration off: $GRAPHKERNEL_CALIBRATION=off" in text
    assert "defaults : parallel_threshold = 131,072 (default, calibration off: " in text


@needs_cc
def test_a_real_measurement_is_in_range_and_bounded():
    calibration.measure()  # the calibration kernels built (or from the cache)
    import time
    start = time.perf_counter()
    cal = calibration.measure()
    seconds = time.perf_counter() - start
    assert calibration.check(dataclasses.asdict(cal)) is None, cal
    assert (cal.fma_flops_512 is not None) == _TC.avx512
    assert seconds < 2.0 * max(1.0, os.getloadavg()[0] / 2), seconds  # loaded: more slack


class SoftmaxGeLU(nn.Cell):
    """A reduction, then vector math: threads, streaming stores and prefetch all apply."""

    def construct(self, x, b):
        return P.GeLU()(P.Softmax()(x + b) * 8.0) + P.Exp()(x * 0.25)


class ConvReLU(nn.Cell):
    """A convolution with its epilogue (the window kernels' threads threshold)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="same")

    def construct(self, x, b):
        return P.ReLU()(P.BiasAdd()(self.conv(x), b)) * 2.0


class DenseGeLU(nn.Cell):
    """A product, then kernels beside BLAS."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Dense(256, 256)

    def construct(self, x, b):
        return P.GeLU()(self.dense(x)) + P.ReduceMean(keep_dims=True)(x, -1) + b


# The two ends of what a calibration can give (CLAMPS): everything on threads, streamed and
# prefetched with 512-bit vectors, or nothing so, at 256 bits.
EAGER = derive(Calibration(1e8, 1e8, 1e9, 1e-8, 1 << 10, 1 << 10, 1 << 10))[0]
SHY = derive(Calibration(1e13, 1e13, 5e12, 1e-2, 1 << 32, 1 << 32, 1 << 32))[0]


@needs_cc
@pytest.mark.parametrize("cell_type, shapes", [
    (SoftmaxGeLU, [(512, 1024), (1024,)]),  # 2 MiB out: streamed under EAGER, not under SHY
    (ConvReLU, [(2, 3, 12, 12), (8,)]),  # 62 k MACs
    (DenseGeLU, [(1024, 256), (256,)]),
])
def test_extreme_calibrations_keep_the_results(cell_type, shapes):
    cell = cell_type()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    unfused = graphkernel.compile(cell, *arrays, options=CompileOptions(
        enable_graph_kernel=False)).run_arrays(*arrays)[0]
    sources = []
    for config in (EAGER, SHY):
        exe = graphkernel.compile(cell, *arrays, options=CompileOptions(
            enable_graph_kernel=True, backend_config=config))
        np.testing.assert_allclose(exe.run_arrays(*arrays)[0], unfused, rtol=RTOL, atol=ATOL,
                                   err_msg=str(config))
        sources.append("\n".join(exe.executable.kernel_sources.values()))
    eager, shy = sources
    if cell_type is not ConvReLU:
        assert "#pragma omp parallel" in eager and "#pragma omp parallel" not in shy
    else:  # a convolution's kernel holds both paths, chosen per call by its threshold
        for config, text in ((EAGER, eager), (SHY, shy)):
            assert f">= (int64_t){config.window_parallel_min_macs};" in text
    assert "prefer-vector-width=256" in shy and "prefer-vector-width" not in eager


def test_cache_sizes_come_from_sysfs_and_what_does_not_parse_is_left_out(tmp_path):
    def index(n: int, level: str, kind: str, size: str) -> None:
        folder = tmp_path / f"index{n}"
        folder.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(text + "\n")
    index(0, "1", "Data", "48K")
    index(1, "1", "Instruction", "32K")
    index(2, "2", "Unified", "2048K")
    index(3, "3", "Unified", "60M")
    assert calibration.cache_sizes(str(tmp_path)) == \
        {"l1d_bytes": 48 << 10, "l2_bytes": 2 * MIB, "llc_bytes": 60 * MIB}
    (tmp_path / "index3" / "size").write_text("lots\n")  # not a size: no LLC, not a guess
    (tmp_path / "index2" / "level").write_text("two\n")
    assert calibration.cache_sizes(str(tmp_path)) == \
        {"l1d_bytes": 48 << 10, "l2_bytes": None, "llc_bytes": None}
    assert calibration.cache_sizes(str(tmp_path / "missing")) == \
        {"l1d_bytes": None, "l2_bytes": None, "llc_bytes": None}


@needs_cc
def test_doctor_shows_the_thread_settings_the_calibration_found(tmp_path, monkeypatch):
    """Building the calibration's kernels sets OMP_WAIT_POLICY for the process: the doctor's
    thread line and advice are about the user's settings, taken before it measures."""
    monkeypatch.delenv(calibration.ENV, raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(calibration, "_resolved", {})
    monkeypatch.setattr(calibration, "record_folder", lambda: str(tmp_path / "calibration"))
    text, _ = doctor_mod.doctor()
    assert re.search(r"^calibrate: copy .* \(measured now in ", text, re.M), text
    assert "OMP_WAIT_POLICY=unset" in text


def test_a_seeded_cache_folder_reads_the_record_instead_of_measuring(calibrating, tmp_path,
                                                                     monkeypatch):
    """The bench's cold compiles run on an empty kernel cache, not on an uncalibrated machine."""
    calibration.resolve()
    other = tmp_path / "cold-cache"
    copy = calibration.seed(str(other))
    assert copy is not None and os.path.dirname(copy) == str(other / calibration.FOLDER)
    assert oct(os.stat(other).st_mode & 0o777) == "0o700"
    monkeypatch.setattr(calibration, "record_folder", lambda: str(other / calibration.FOLDER))
    calibration._resolved.clear()
    assert calibration.resolve().origin == f"record {copy}"
    assert calibrating == [1]  # measured once, in the first folder
    monkeypatch.setenv(calibration.ENV, "off")
    assert calibration.seed(str(tmp_path / "another")) is None
