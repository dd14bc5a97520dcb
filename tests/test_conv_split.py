"""A convolution at batch 1 shares one image over the threads (backends/c/c_images.py
channel_image): one parallel region per image, the fill then the units, each unit split into
row pieces so that every thread gets the same work (units x pieces a multiple of the team),
and a block's epilogue run in each unit's work item on the rows and channels it wrote. Checked
here: the generated C and the plan's schedule note say so; fused, unfused and numpy agree at
1, 2 and 3 threads (each in a process of its own: OpenMP reads OMP_NUM_THREADS once) at batch
1 and 2, over channel counts of one, two and three units and a part unit, small images (one
row step) and large ones (rows and row segments), strides, 1x1, a pool after the block, a
residual, float32 and float64."""

import numpy as np
import pytest
from thread_child import run_at_threads

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c.config import CConfig
from graphkernel.frontend.compile import CompileOptions

ON = CompileOptions(enable_graph_kernel=True)


class Block(nn.Cell):
    """conv 3x3 + BN + ReLU, conv (k, stride) + BN, + shortcut, ReLU (then a pool)."""

    def __init__(self, c, o, k=3, stride=1, pool=False, dtype=np.float32):
        super().__init__()
        self.a = nn.Conv2d(c, o, 3, pad_mode="pad", padding=1, has_bias=False, dtype=dtype)
        self.b = nn.Conv2d(o, o, k, stride=stride, pad_mode="pad", padding=k // 2,
                           has_bias=False, dtype=dtype)
        self.short = nn.Conv2d(c, o, 1, stride=stride, has_bias=False, dtype=dtype)
        self.bn_a, self.bn_b, self.bn_s = nn.BatchNorm2d(o), nn.BatchNorm2d(o), \
            nn.BatchNorm2d(o)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2) if pool else None

    def construct(self, x):
        y = self.relu(self.bn_a(self.a(x)))
        y = self.relu(self.bn_b(self.b(y)) + self.bn_s(self.short(x)))
        return self.pool(y) if self.pool is not None else y


def test_a_batch_of_one_runs_each_image_in_one_region_with_the_epilogue_per_unit(rng):
    net = Block(32, 64)
    net.set_train(False)
    x = rng.standard_normal((1, 32, 14, 14)).astype(np.float32)
    # threads from one multiply-add, so every convolution splits its image whatever this
    # machine's calibrated threshold (the note then says so for each)
    split = CompileOptions(enable_graph_kernel=True,
                           backend_config=CConfig(window_parallel_min_macs=1))
    exe = graphkernel.compile(net, Tensor(x), options=split)
    source = exe.executable.library.source
    # the image function: one region, the fill shared out, then units x pieces with the
    # epilogue in each work item, and the pieces from the team's size
    assert "const int64_t team = omp_get_num_threads();" in source
    assert "#pragma omp for schedule(static) nowait\n        for (int64_t it = 0; it <" in source
    assert "_epilogue(on, n, args, pre, c0, c1, s0 * " in source
    # no epilogue region of its own after the image any more
    assert "_epilogue(tile, n, args, pre, gk_par)" not in source
    notes = [n for n in exe.plan.schedule_notes.values() if "convolution on" in n]
    assert notes and all("batch of one:" in n for n in notes), notes
    assert any("epilogue in each unit's work item" in n for n in notes), notes
    assert "batch of one:" in exe.plan.describe()


# Fused (C), unfused (C, op by op) and numpy's references on random inputs; prints the largest
# difference of each case from numpy's, as JSON.
_CHILD = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/tests")
import graphkernel
from graphkernel import Tensor
from graphkernel.frontend.compile import CompileOptions
from test_conv_split import Block

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)
NUMPY = CompileOptions(enable_graph_kernel=False, backend="numpy")
rng = np.random.default_rng(11)
out = {}
cases = [  # (c, o, k, stride, pool, h, w, dtype)
    (16, 16, 3, 1, False, 20, 24, "float32"),   # one channel vector, row segments
    (32, 64, 3, 1, False, 14, 14, "float32"),   # two units, rows of a 14-wide map
    (32, 48, 3, 2, False, 18, 18, "float32"),   # a part unit, stride 2 (9x9 out)
    (24, 96, 1, 1, False, 7, 7, "float32"),     # 1x1 in place, small image (one row step)
    (16, 32, 3, 1, True, 12, 10, "float32"),    # a pool after the block
    (8, 40, 3, 1, False, 11, 13, "float64"),    # float64, five channel vectors
]
for c, o, k, s, pool, h, w, dtype in cases:
    graphkernel.set_seed(5)
    net = Block(c, o, k, s, pool, getattr(np, dtype))
    net.set_train(False)
    for bn in (net.bn_a, net.bn_b, net.bn_s):
        bn.moving_mean.set_data(Tensor(rng.standard_normal(o).astype(dtype)))
        bn.moving_variance.set_data(Tensor(rng.uniform(0.5, 2.0, o).astype(dtype)))
        bn.gamma.set_data(Tensor(rng.standard_normal(o).astype(dtype)))
        bn.beta.set_data(Tensor(rng.standard_normal(o).astype(dtype)))
    for batch in (1, 2):
        x = Tensor(rng.standard_normal((batch, c, h, w)).astype(dtype))
        want = graphkernel.compile(net, x, options=NUMPY)(x).asnumpy().astype(np.float64)
        scale = max(1.0, float(np.abs(want).max()))
        got = {name: graphkernel.compile(net, x, options=opt)(x).asnumpy().astype(np.float64)
               for name, opt in (("fused", ON), ("unfused", OFF))}
        out[f"{c}-{o} k{k} s{s} pool{pool} {h}x{w} {dtype} b{batch}"] = [
            dtype, *(float(np.abs(g - want).max()) / scale for g in got.values())]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fused_unfused_and_numpy_agree_at_each_thread_count(threads):
    result = run_at_threads(_CHILD, threads, timeout=900)
    assert len(result) == 12
    for case, (dtype, fused, unfused) in result.items():
        # float64: the BatchNorms keep float32 parameters, which the fold and numpy's
        # reference round apart (6.7e-8 on the tree before this split, too)
        tol = 2e-4 if dtype == "float32" else 1e-6
        assert fused < tol and unfused < tol, (case, threads, fused, unfused)
