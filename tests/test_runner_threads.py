"""OpenMP's threads between the kernels of one call on the Python runner (runtime/runner.py
`keep_awake`, backends/c/c_entry_threads.py `RunnerKeepAwake`).

A plan the compiled entry does not take (a step of a kind it has no C for, a result aliasing an
argument) runs its steps from Python; each kernel's parallel region woke the sleeping workers
(13-59 us on a loaded 2-vCPU VM). The runner now brackets a call's steps as the entry does: the
threads may spin from its first step on and are put back to sleep before its last kernel, also
when a step fails. Checked here: the bracket's calls and their place among the steps (any
OpenMP runtime: a stand-in bracket), the results (numpy-checked, the same with and without it),
and under LLVM's libomp, in a process of its own with two threads, that a call not preempted
sleeps the workers about once, not once per kernel."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cells import OFF, ON, needs_openmp

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c.toolchain import detect

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Net(nn.Cell):
    """`depth` 3x3 convolutions (BatchNorm, ReLU), flattened into a Dense layer."""

    def __init__(self, channels: int, size: int, depth: int) -> None:
        super().__init__()
        self.body = nn.SequentialCell([
            nn.SequentialCell([nn.Conv2d(channels, channels, 3, pad_mode="same", has_bias=True),
                               nn.BatchNorm2d(channels), nn.ReLU()])
            for _ in range(depth)])
        self.flat = nn.Flatten()
        self.fc = nn.Dense(channels * size * size, 10)

    def construct(self, x):
        return self.fc(self.flat(self.body(x)))


@pytest.fixture
def runner_only(monkeypatch, tmp_path):
    """Compile without the entry, as for a plan it refuses: CNN training steps now run on the
    entry, so the runner's own path is reached by refusing it here (a cache of the test's own,
    so that no entry built before is found warm)."""
    import graphkernel.backends.c.backend as backend
    monkeypatch.setattr(backend, "_entry_source", lambda plan: None)
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(tmp_path / "cache"))


def train_step(channels: int, size: int, depth: int, like: nn.Cell | None = None) -> nn.Cell:
    """A training step of a Net; `like`: another such step whose weights it starts from."""
    net = Net(channels, size, depth)
    if like is not None:
        for mine, theirs in zip(net.get_parameters(), like.network._backbone.get_parameters()):
            mine.set_data(Tensor(theirs.asnumpy().copy()))
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    return nn.TrainOneStepCell(loss, nn.Momentum(net.trainable_params(), 0.01, 0.9))


class Bracket:
    """A stand-in bracket: records, at each end(), how many kernel steps had run."""

    def __init__(self, kernels_run: list[int]) -> None:
        self.kernels_run = kernels_run
        self.ends: list[int] = []
        self.begins = 0

    def begin(self) -> bool:
        self.begins += 1
        return True

    def end(self) -> None:
        self.ends.append(self.kernels_run[0])


def _counting(runner) -> list[int]:
    """Wrap each kernel step of `runner` to count the kernels a call has run."""
    count = [0]
    for i, step in enumerate(runner.plan.steps):
        if step.kind.value == "kernel":
            fn = runner.step_fns[i]

            def counted(slots, fn=fn):
                fn(slots)
                count[0] += 1
            runner.step_fns[i] = counted
    return count


@pytest.mark.parametrize("channels,size,batch", [(8, 6, 3), (16, 8, 5)])
def test_the_runner_ends_the_bracket_before_the_last_kernel(channels, size, batch, rng,
                                                             runner_only):
    x = rng.standard_normal((batch, channels, size, size)).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int32)
    step = train_step(channels, size, 3)
    unfused = graphkernel.compile(train_step(channels, size, 3, like=step), x, y, options=OFF)
    fused = graphkernel.compile(step, x, y, options=ON)
    assert fused.entry is None  # the step runs on the Python runner
    runner = fused.executable.runner
    kernels = sum(s.kind.value == "kernel" for s in fused.plan.steps)
    assert kernels >= 2
    count = _counting(runner)
    bracket = Bracket(count)
    runner.keep_awake = bracket
    for call in range(3):
        count[0] = 0
        got = fused.run_arrays(x, y)[0]
        want = unfused.run_arrays(x, y)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert bracket.begins == call + 1
        assert bracket.ends[-1] == kernels - 1  # the last kernel runs after end()
        assert count[0] == kernels
    assert len(bracket.ends) == 3


def test_profile_times_the_kernels_inside_the_bracket_as_a_call_runs_them(rng, runner_only):
    # The tuner (backends/c/tuning.py) and profile_kernels time kernels through
    # Runner.profile: with the team asleep between kernels each parallel kernel paid a wake-up
    # a call does not, and the tuner chose one thread for the digits CNN's convolutions.
    x = rng.standard_normal((3, 8, 6, 6)).astype(np.float32)
    y = rng.integers(0, 10, 3).astype(np.int32)
    fused = graphkernel.compile(train_step(8, 6, 3), x, y, options=ON)
    runner = fused.executable.runner
    kernels = sum(s.kind.value == "kernel" for s in fused.plan.steps)
    count = _counting(runner)
    bracket = Bracket(count)
    runner.keep_awake = bracket
    times = fused.profile_kernels(x, y, repeats=4)
    assert len(times) == len(fused.kernels) and all(t > 0 for t in times)
    assert bracket.begins == 4
    # each call's end() came before its last kernel: kernels - 1 run in that call so far
    assert [e - k * kernels for k, e in enumerate(bracket.ends)] == [kernels - 1] * 4


def test_a_failing_step_still_ends_the_bracket(rng, runner_only):
    x = rng.standard_normal((2, 8, 6, 6)).astype(np.float32)
    y = rng.integers(0, 10, 2).astype(np.int32)
    fused = graphkernel.compile(train_step(8, 6, 2), x, y, options=ON)
    runner = fused.executable.runner
    bracket = Bracket([0])
    runner.keep_awake = bracket

    def fails(slots):
        raise RuntimeError("a step failed")
    runner.step_fns[1] = fails
    with pytest.raises(RuntimeError, match="a step failed"):
        fused.run_arrays(x, y)
    assert bracket.begins == 1 and len(bracket.ends) == 1


def test_with_and_without_the_bracket_the_steps_agree_bit_for_bit(rng, runner_only):
    x = rng.standard_normal((4, 8, 6, 6)).astype(np.float32)
    y = rng.integers(0, 10, 4).astype(np.int32)
    outs = []
    first = train_step(8, 6, 3)
    for bracket in (False, True):
        step = train_step(8, 6, 3, like=first)
        fused = graphkernel.compile(step, x, y, options=ON)
        runner = fused.executable.runner
        runner.keep_awake = Bracket([0]) if bracket else None
        outs.append([fused.run_arrays(x, y)[0] for _ in range(3)])
    for a, b in zip(*outs):
        assert a.tobytes() == b.tobytes()


def test_the_summary_says_what_the_backend_decided(rng, runner_only):
    x = rng.standard_normal((2, 8, 6, 6)).astype(np.float32)
    y = rng.integers(0, 10, 2).astype(np.int32)
    fused = graphkernel.compile(train_step(8, 6, 2), x, y, options=ON)
    runner = fused.executable.runner
    tc = detect()
    if tc is not None and tc.openmp and tc.openmp_lib and sys.platform.startswith("linux"):
        assert runner.keep_awake is not None
        assert "threads: the Python runner keeps OpenMP's idle threads spinning" in \
            fused.summary()
    else:  # GNU libgomp (or no OpenMP): nothing to set, and the summary says nothing
        assert runner.keep_awake is None
        assert "threads:" not in fused.summary()


_CHILD = r"""
import json, os, resource, sys, threading, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
import numpy as np
import graphkernel
from cells import ON
from test_runner_threads import train_step
import graphkernel.backends.c.backend as backend
backend._entry_source = lambda plan: None  # as the runner_only fixture: a plan the entry refuses

def sleeps(skip):
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == skip:
            continue
        with open(f"/proc/self/task/{tid}/status") as fh:
            for line in fh:
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
    return total

try:  # as tests/test_digits_threads.py: a quiet host's turns for this short run, where allowed
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except (AttributeError, OSError):
    pass
x = np.random.default_rng(0).standard_normal((32, 16, 8, 8)).astype(np.float32)
y = np.random.default_rng(1).integers(0, 10, 32).astype(np.int32)
exe = graphkernel.compile(train_step(16, 8, 3), x, y, options=ON)
runner = exe.executable.runner
assert exe.entry is None and runner.keep_awake is not None
for _ in range(5):
    exe.run_arrays(x, y)
me = threading.get_native_id()
rows = []
for bracket in (runner.keep_awake, None) * 2:
    runner.keep_awake = bracket
    for _ in range(60):
        s0, n0 = sleeps(me), resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
        exe.run_arrays(x, y)
        rows.append([bracket is not None, sleeps(me) - s0,
                     resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw != n0])
print("RESULT " + json.dumps({"kernels": sum(s.kind.value == "kernel" for s in exe.plan.steps),
                              "rows": rows}))
"""


@needs_openmp
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
@pytest.mark.skipif(detect() is None or not detect().openmp_lib,
                    reason="the threads stay awake under LLVM's libomp only")
def test_the_runners_threads_sleep_once_a_call_not_once_a_kernel(tmp_path):
    from graphkernel.backends.c.c_entry_threads import PASSIVE_CALLS_AFTER_PREEMPTION
    env = dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="1", PYTHONPATH=ROOT)
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("KMP_BLOCKTIME", None)
    env["GRAPHKERNEL_CACHE_DIR"] = str(tmp_path / "cache")  # no entry found warm
    done = subprocess.run([sys.executable, "-c", _CHILD, ROOT], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    r = json.loads(line[len("RESULT "):])
    rows = r["rows"]
    window = PASSIVE_CALLS_AFTER_PREEMPTION + 2
    calm = [n for i, (on, n, _) in enumerate(rows) if on and i % 60 >= window and
            not any(p for _, _, p in rows[i - window:i + 1])]
    if not calm:
        pytest.skip("every call followed a preemption: the threads rightly waited passively")
    # without the bracket the workers slept after each of the call's parallel kernels
    passive = [n for on, n, _ in rows if not on]
    assert min(calm) <= 2 < min(passive), (calm, passive)


_WARM = r"""
import json, sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/tests")
import numpy as np
import graphkernel
from graphkernel import Tensor
from cells import ON
from test_runner_threads import Net  # (test_digits_threads imports c_entry itself)
cell = Net(16, 4, 3)
cell.set_train(False)
x = np.random.default_rng(0).standard_normal((2, 16, 4, 4)).astype(np.float32)
exe = graphkernel.compile(cell, Tensor(x), options=ON)
lines = [l for l in exe.summary().splitlines() if l.startswith("threads:")]
print(json.dumps({"cache": exe.report.compile_cache, "entry": exe.entry is not None,
                  "threads": lines,
                  "c_entry": "graphkernel.backends.c.c_entry" in sys.modules}))
"""


@pytest.mark.skipif(detect() is None, reason="needs a C compiler")
def test_a_warm_hit_prints_the_recorded_decision_without_the_entry_writer(cache_folder):
    """summary() prints what the backend recorded when it built the executable: on a warm
    hit too, where no entry writer (backends/c/c_entry.py) is imported to derive it."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _WARM, ROOT], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["cache"].startswith("miss") and warm["cache"].startswith("hit")
    assert cold["c_entry"] and not warm["c_entry"]
    assert warm["entry"] and cold["entry"]
    assert len(warm["threads"]) == 1 and warm["threads"] == cold["threads"]
    assert warm["threads"][0].startswith("threads: the compiled entry keeps")
