"""OpenMP's threads between the kernels of one call (backends/c/c_entry.py `_AWAKE`).

graphkernel's threads wait passively: an idle one sleeps at once. Each kernel's parallel region
then had to wake the others (10-60 us on a 2-vCPU VM), and the digits CNN's convolutions gained
nothing from a second thread. The compiled entry now keeps them spinning from one kernel to
the next within a call and puts them back to sleep at its end.

Counted by the OpenMP threads' voluntary context switches (each sleep is one; a spin is none),
in a process of its own with two threads (OpenMP reads OMP_NUM_THREADS once): a call of several
parallel kernels that follows calls not preempted sleeps them about once, not once per kernel,
and they do not spin between calls. (A preempted thread waits passively for a while: spinning
on a machine whose cores others want lost their turns.) The results stay numpy's (fused and
unfused), and a one-kernel plan is left as it was."""
from __future__ import annotations

import sys

import numpy as np
import pytest
from cells import OFF, ON, needs_openmp
from thread_child import run_at_threads

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c.c_entry import PASSIVE_CALLS_AFTER_PREEMPTION, awake_between_kernels
from graphkernel.backends.c.toolchain import detect


class ConvStack(nn.Cell):
    """`depth` same-padded 3x3 convolutions with BatchNorm and ReLU: one kernel each."""

    def __init__(self, channels: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.SequentialCell([
            nn.SequentialCell([nn.Conv2d(channels, channels, 3, pad_mode="same", has_bias=True),
                               nn.BatchNorm2d(channels), nn.ReLU()])
            for _ in range(depth)])

    def construct(self, x):
        return self.layers(x)


def _numpy_stack(cell: ConvStack, x: np.ndarray) -> np.ndarray:
    """The inference stack in float64 numpy: conv, BatchNorm with moving statistics, ReLU."""
    y = x.astype(np.float64)
    for layer in cell.layers:
        conv, bn = layer[0], layer[1]
        w = conv.weight.asnumpy().astype(np.float64)
        n, c, h, wd = y.shape
        pad = np.pad(y, ((0, 0), (0, 0), (1, 1), (1, 1)))
        cols = np.stack([pad[:, :, i:i + h, j:j + wd] for i in range(3) for j in range(3)], 2)
        z = np.einsum("nctij,oct->noij", cols, w.reshape(w.shape[0], c, 9))
        z += conv.bias.asnumpy()[None, :, None, None]
        mean, var = bn.moving_mean.asnumpy(), bn.moving_variance.asnumpy()
        gamma, beta = bn.gamma.asnumpy(), bn.beta.asnumpy()
        z = (z - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
        y = np.maximum(z * gamma[None, :, None, None] + beta[None, :, None, None], 0)
    return y


@pytest.mark.parametrize("channels,size,batch", [(16, 4, 1), (16, 8, 5), (32, 4, 5)])
def test_small_map_conv_stack_matches_numpy_fused_and_unfused(channels, size, batch, rng):
    cell = ConvStack(channels, 3)
    cell.set_train(False)
    x = rng.standard_normal((batch, channels, size, size)).astype(np.float32)
    want = _numpy_stack(cell, x)
    outs = []
    for options in (ON, OFF):
        exe = graphkernel.compile(cell, Tensor(x), options=options)
        outs.append(exe(Tensor(x)).asnumpy())
        np.testing.assert_allclose(outs[-1], want, rtol=2e-4, atol=2e-4 * np.abs(want).max())
    fused = graphkernel.compile(cell, Tensor(x), options=ON)
    assert fused.kernel_count == 3  # conv + folded BatchNorm + ReLU: one kernel a layer
    assert awake_between_kernels(fused.plan)
    if fused.entry is not None:
        assert "threads: the compiled entry keeps OpenMP's idle threads spinning" in \
            fused.summary()


def test_a_one_kernel_plan_leaves_the_threads_as_they_were(rng):
    cell = ConvStack(16, 1)
    cell.set_train(False)
    x = rng.standard_normal((2, 16, 4, 4)).astype(np.float32)
    exe = graphkernel.compile(cell, Tensor(x), options=ON)
    assert exe.kernel_count == 1
    assert not awake_between_kernels(exe.plan)
    assert "threads:" not in exe.summary()


_CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
import numpy as np
import graphkernel
from graphkernel import Tensor
from cells import ON
from test_digits_threads import ConvStack

def sleeps(skip):
    # voluntary context switches of every thread but `skip` (the caller): OpenMP's workers
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == skip:
            continue
        with open(f"/proc/self/task/{tid}/status") as fh:
            for line in fh:
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
    return total

def cpu(skip):
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != skip:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime, clock ticks
    return total

# Where allowed (root), real-time priority for this short run, before OpenMP starts its threads
# (they inherit it): on a busy shared host every call would follow a preemption and wait
# passively, and the test could only skip.
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except (AttributeError, OSError):
    pass
cell = ConvStack(16, 4)
cell.set_train(False)
x = np.random.default_rng(0).standard_normal((256, 16, 8, 8)).astype(np.float32)
exe = graphkernel.compile(cell, Tensor(x), options=ON)
assert exe.executable.runner.entry is not None
for _ in range(5):
    exe.run_arrays(x)
me = __import__("threading").get_native_id()
per_call, preempted = [], []
for _ in range(300):
    s0, n0 = sleeps(me), resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
    exe.run_arrays(x)
    per_call.append(sleeps(me) - s0)
    preempted.append(resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw != n0)
time.sleep(0.05)
idle0 = cpu(me)
time.sleep(0.5)
idle = cpu(me) - idle0
print("RESULT " + json.dumps({"kernels": exe.kernel_count, "sleeps": per_call,
                              "preempted": preempted, "idle_ticks": idle}))
"""


@needs_openmp
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
@pytest.mark.skipif(detect() is None or not detect().openmp_lib,
                    reason="the threads stay awake under LLVM's libomp only")
def test_threads_sleep_once_a_call_not_once_a_kernel():
    # the libomp defaults (no passive wait forced), as a user's process has them
    r = run_at_threads(_CHILD, 2, timeout=600, blas_threads=1,
                       unset=("OMP_WAIT_POLICY", "KMP_BLOCKTIME"))
    assert r["kernels"] == 4
    # A call spins only when its thread was not preempted in the calls just before
    # (c_entry.PASSIVE_CALLS_AFTER_PREEMPTION): those calls sleep the workers about once, after
    # the last kernel; before, every kernel's region woke a sleeping worker (4 or more a call).
    window = PASSIVE_CALLS_AFTER_PREEMPTION + 2
    calm = [n for i, n in enumerate(r["sleeps"])
            if i >= window and not any(r["preempted"][i - window:i + 1])]
    if not calm:
        pytest.skip("every call followed a preemption: the threads rightly waited passively")
    assert min(calm) <= 2, (calm, r["sleeps"])
    # and between calls they sleep: half a second idle takes (nearly) no CPU
    assert r["idle_ticks"] <= 5, r
