"""BatchNorm's gradient with the ReLU mask before it (ReluGrad then BatchNormGrad, as every
conv + BatchNorm + ReLU of a training step has): one reduction kernel per channel, two sums
over N, H, W (sum(dy) and sum(dy * (x - mean))) then dx, the per-channel inputs loaded once
per channel outside the passes over the pixels (inside them gcc left the dx pass scalar); and
its results against numpy in float64 and against the unfused ops, batch 1 and 3, channels
8/20/64, float32/float64, training and inference, at one and two OpenMP threads."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from cells import OFF, ON, Fn, needs_openmp

import graphkernel
from graphkernel.ops import operations as P

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPS = 1e-5


def bn_relu_grad_exe(shape, dtype, training, options=ON):
    bn_grad, relu_grad = P.BatchNormGrad(is_training=training, epsilon=EPS), P.ReluGrad()
    args = arrays(np.random.default_rng(0), shape, dtype)
    fn = Fn(lambda dout, y, x, s, m, v: bn_grad(relu_grad(dout, y), x, s, m, v, v))
    return graphkernel.compile(fn, *args, options=options)


def arrays(rng, shape, dtype):
    """dout, the ReLU's output y (zero at about half the elements), x, scale, and x's batch
    mean and variance per channel."""
    channels = shape[1]
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    y = np.maximum(rng.standard_normal(shape), 0).astype(dtype)
    dout = rng.standard_normal(shape).astype(dtype)
    scale = rng.uniform(0.5, 1.5, channels).astype(dtype)
    axes = (0, 2, 3)
    return dout, y, x, scale, x.mean(axes).astype(dtype), x.var(axes).astype(dtype)


def numpy_bn_relu_grad(dout, y, x, scale, mean, var, training):
    """The textbook formulas in float64."""
    dout, y, x, scale, mean, var = (a.astype(np.float64) for a in (dout, y, x, scale, mean, var))
    per = (1, -1, 1, 1)
    dy = np.where(y > 0, dout, 0.0)
    rstd = 1 / np.sqrt(var + EPS)
    xhat = (x - mean.reshape(per)) * rstd.reshape(per)
    dscale, dbias = (dy * xhat).sum((0, 2, 3)), dy.sum((0, 2, 3))
    if training:
        n = x.size // x.shape[1]
        dx = (scale * rstd).reshape(per) * (dy - dbias.reshape(per) / n -
                                            xhat * dscale.reshape(per) / n)
    else:
        dx = dy * (scale * rstd).reshape(per)
    return dx, dscale, dbias


def check_against_numpy(got, args, training):
    dtype = args[0].dtype
    for name, value, want in zip(("dx", "dscale", "dbias"), got,
                                 numpy_bn_relu_grad(*args, training)):
        assert value.dtype == dtype and value.shape == want.shape, name
        # float32: sums over N*H*W in any order, then the dx formula on them
        tol = 1e-11 if dtype == np.float64 else 2e-5 * np.sqrt(args[0].size // args[0].shape[1])
        np.testing.assert_allclose(value, want, rtol=tol, atol=tol * np.abs(want).max(),
                                   err_msg=f"{name} {args[0].shape} {dtype} training={training}")


def test_the_masked_gradient_is_one_kernel_of_two_sums():
    exe = bn_relu_grad_exe((2, 20, 7, 7), np.float32, True)
    # One generated kernel; dscale and dbias are views of its (1, C, 1, 1) sums.
    steps = [s for s in exe.plan.steps if s.lowering is not None]
    assert [s.lowering.kind.value for s in steps] == ["loop nest", "library", "library"]
    assert [tuple(s.op_names) for s in steps[1:]] == [("Reshape",), ("Reshape",)]
    assert all("aliases" in line for line in exe.plan.describe().splitlines()
               if "Reshape:" in line)
    (kernel,) = [k for k in exe.kernels if k.name.startswith("Fused_")]
    passes = pixel_passes(kernel)
    # Two accumulators per channel (not sum(dy * scale) and sum(dy * scale * xhat) besides).
    assert passes.split("\n")[0].count("reduction(+:") == 2


def pixel_passes(kernel):
    """The kernel's C from its first vector loop on (the passes over N, H, W of a row)."""
    source = kernel.source[kernel.source.index(f"void gk_{kernel.name}("):]
    return source[source.index("#pragma omp simd"):]


def assert_no_per_channel_loads_in_the_pixel_loops(kernel):
    # Read inside a pass that stores (dx, y), gcc assumed the store might change the
    # per-channel values, reloaded them per element and left the pass scalar.
    body = [line for line in pixel_passes(kernel).splitlines() if re.search(r"\bi2\b", line)]
    assert body and not any(re.search(r"in\d+\[i0\]", line) for line in body), body


@pytest.mark.parametrize("training", [True, False])
def test_per_channel_inputs_are_loaded_once_per_channel_in_the_gradient(training):
    exe = bn_relu_grad_exe((2, 20, 7, 7), np.float32, training)
    (kernel,) = [k for k in exe.kernels if k.name.startswith("Fused_")]
    assert_no_per_channel_loads_in_the_pixel_loops(kernel)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(1, 8, 5, 7), (3, 20, 6, 6), (3, 64, 9, 4), (1, 64, 28, 28)])
def test_against_numpy_and_unfused(shape, dtype, training, rng):
    args = arrays(rng, shape, dtype)
    fused = bn_relu_grad_exe(shape, dtype, training).run_arrays(*args)
    check_against_numpy(fused, args, training)
    unfused = bn_relu_grad_exe(shape, dtype, training, OFF).run_arrays(*args)
    for a, b in zip(fused, unfused):
        tol = 1e-12 if dtype == np.float64 else 1e-4
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())


_CHILD = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1] + "/tests")
from test_bn_grad import arrays, bn_relu_grad_exe, check_against_numpy
out = {}
for shape in [(3, 64, 28, 28), (1, 20, 14, 14)]:
    for dtype in (np.float32, np.float64):
        args = arrays(np.random.default_rng(1), shape, dtype)
        got = bn_relu_grad_exe(shape, dtype, True).run_arrays(*args)
        check_against_numpy(got, args, True)
        key = f"{shape}-{np.dtype(dtype).name}"
        out[key] = [float(np.asarray(g, np.float64).sum()) for g in got]
print("RESULT " + json.dumps(out))
"""


@needs_openmp
def test_one_and_two_threads_agree_with_numpy_and_each_other():
    results = []
    for threads in (1, 2):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS="1",
                   PYTHONPATH=ROOT)
        done = subprocess.run([sys.executable, "-c", _CHILD, ROOT], env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        results.append(json.loads(line[len("RESULT "):]))
    # A channel's sums are one thread's, in the same order at any thread count.
    assert results[0] == results[1]
