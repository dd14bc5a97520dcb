"""A static plan's entry runs each call on threads or on the calling thread alone, whichever its
latest calls found faster (backends/c/c_entry_threads.py, the probes): with other processes
holding the cores every parallel region waits for a worker off its core, and a plan of many
small kernels on threads (calibration.within_call) ran several times slower than on one thread.
Checked in a process of its own pinned to two CPUs beside two CPU-bound processes pinned to the
same two: the entry probes, moves to one thread, and its results stay numpy's; and the
thresholds a call's kernels were emitted with are the awake ones, named in the summary."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from cells import OFF, ON, needs_openmp
from thread_child import run_at_threads

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c import calibration
from graphkernel.backends.c.toolchain import detect

# A 2-vCPU VM's measurement: a sleeping team's fork/join 50 us, an awake one's 1 us
VM = calibration.Calibration(20e9, 115e9, 230e9, 50e-6, 48 << 10, 1 << 20, 32 << 20,
                             fork_join_awake_s=1e-6)


@pytest.fixture
def vm_calibration(tmp_path, monkeypatch):
    """Calibration on (the suite runs with it off), with VM's rates, in a folder of its own."""
    monkeypatch.delenv(calibration.ENV, raising=False)
    folder = str(tmp_path / "calibration")
    monkeypatch.setattr(calibration, "record_folder", lambda: folder)
    monkeypatch.setattr(calibration, "_resolved", {})
    monkeypatch.setattr(calibration, "measure", lambda: VM)


class SmallConvs(nn.Cell):
    """`depth` 3x3 convolutions with ReLU at batch 1: small kernels, each on threads within a
    call (about 0.6 M multiply-adds)."""

    def __init__(self, channels: int = 16, depth: int = 12) -> None:
        super().__init__()
        self.body = nn.SequentialCell([
            nn.SequentialCell([nn.Conv2d(channels, channels, 3, pad_mode="same"), nn.ReLU()])
            for _ in range(depth)])

    def construct(self, x):
        return self.body(x)


_CHILD = r"""
import json, multiprocessing as mp, os, sys, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, os.path.join(sys.argv[1], "tests"))

def hog(cpus, seconds):
    os.sched_setaffinity(0, cpus)
    end = time.time() + seconds
    while time.time() < end:
        pass

if __name__ == "__main__":
    cpus = sorted(os.sched_getaffinity(0))[:2]
    os.sched_setaffinity(0, cpus)
    import tempfile
    import numpy as np
    import graphkernel
    from graphkernel import Tensor
    from graphkernel.backends.c import calibration
    from cells import ON
    from test_taken_cores import VM, SmallConvs
    os.environ.pop(calibration.ENV, None)  # the suite's conftest is not here: VM's rates
    folder = tempfile.mkdtemp()
    calibration.record_folder = lambda: folder
    calibration.measure = lambda: VM
    cell = SmallConvs()
    x = np.random.default_rng(0).standard_normal((1, 16, 16, 16)).astype(np.float32)
    exe = graphkernel.compile(cell, Tensor(x), options=ON)
    entry = exe.executable.library.entry_module
    want = exe(Tensor(x)).asnumpy()
    for _ in range(40):  # quiet: the calls' best on threads
        exe(Tensor(x))
    hogs = [mp.Process(target=hog, args=(cpus, 60)) for _ in range(2)]
    for h in hogs:
        h.start()
    try:
        time.sleep(0.2)
        same = True
        deadline = time.time() + 40
        while time.time() < deadline and entry.threads_stats()["switches"] < 1:
            same = same and np.array_equal(exe(Tensor(x)).asnumpy(), want)
        for _ in range(20):  # and on, in whichever mode it found faster
            same = same and np.array_equal(exe(Tensor(x)).asnumpy(), want)
    finally:
        for h in hogs:
            h.terminate()
            h.join()
    print("RESULT " + json.dumps({"stats": entry.threads_stats(), "same": bool(same),
                                  "summary": exe.summary(),
                                  "notes": exe.executable.run_notes}))
"""


@needs_openmp
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CPU affinity")
@pytest.mark.skipif(detect() is None or not detect().openmp_lib,
                    reason="the entry steps back under LLVM's libomp only")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity")
                    else True, reason="needs two CPUs")
def test_with_the_cores_taken_the_calls_move_to_one_thread():
    # the libomp defaults (no passive wait forced), as a user's process has them
    r = run_at_threads(_CHILD, 2, timeout=300, blas_threads=1,
                       unset=("OMP_WAIT_POLICY", "KMP_BLOCKTIME"))
    assert r["same"]
    assert "thread thresholds" in r["notes"], r["notes"]
    stats = r["stats"]
    assert stats["probes"] >= 1 and stats["switches"] >= 1 and stats["calls_alone"] >= 2, stats


@needs_openmp
@pytest.mark.skipif(detect() is None or not detect().openmp_lib,
                    reason="the team stays awake under LLVM's libomp only")
def test_a_calls_kernels_take_the_awake_thresholds_and_say_so(rng, vm_calibration):
    x = rng.standard_normal((1, 16, 16, 16)).astype(np.float32)
    cell = SmallConvs(depth=3)
    exe = graphkernel.compile(cell, Tensor(x), options=ON)
    within, why = calibration.within_call(calibration.default_config())
    assert why is not None
    assert "thread thresholds: within a call the team is awake" in exe.summary()
    assert f"window_parallel_min_macs = {within.window_parallel_min_macs:,}" in exe.summary()
    source = exe.executable.library.source
    assert f">= (int64_t){within.window_parallel_min_macs}" in source
    off = graphkernel.compile(cell, Tensor(x), options=OFF)
    np.testing.assert_allclose(exe(Tensor(x)).asnumpy(), off(Tensor(x)).asnumpy(),
                               rtol=1e-4, atol=1e-5)


def test_the_awake_fork_lowers_the_thresholds_and_a_disturbed_one_is_not_used():
    import dataclasses
    passive, _ = calibration.derive(VM)
    awake, sources = calibration.derive(VM, within_call=True)
    assert awake.parallel_threshold < passive.parallel_threshold
    assert awake.window_parallel_min_macs < passive.window_parallel_min_macs
    assert "with the team awake" in sources["window_parallel_min_macs"]
    # everything else as the sleeping team's
    assert dataclasses.replace(awake, parallel_threshold=passive.parallel_threshold,
                               window_parallel_min_macs=passive.window_parallel_min_macs) == \
        passive
    for other in (60e-6, None):  # timed slower than a sleeping team's, or not measured
        assert calibration.derive(dataclasses.replace(VM, fork_join_awake_s=other),
                                  within_call=True)[0] == passive


def test_thresholds_the_caller_chose_stay(vm_calibration):
    import dataclasses
    mine = dataclasses.replace(calibration.default_config(), parallel_threshold=12345)
    within, why = calibration.within_call(mine)
    assert within.parallel_threshold == 12345
    assert within.window_parallel_min_macs < mine.window_parallel_min_macs
    assert why is not None and "parallel_threshold" not in why
