"""A warm start (compile cache and kernel cache filled by an earlier process) loads only the
modules its hit uses: no C emitter, no convolution or oneDNN module for a model without
convolutions, no tuner's timing of products. Each module a hit imports is CPU of the warm
first result (issue #30 item 5). The results are the cold process's, bit for bit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from graphkernel.backends.c import toolchain

needs_cc = pytest.mark.skipif(toolchain.detect() is None, reason="needs a C compiler")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Writing C, building it, and the convolution kernels' modules (with oneDNN's chooser): what a
# cold build of this model or a model with convolutions needs, and a warm hit here does not.
NOT_ON_A_WARM_HIT = (
    "graphkernel.backends.c.c_entry", "graphkernel.backends.c.generic_kernel",
    "graphkernel.backends.c.parallel_kernel", "graphkernel.backends.c.c_window",
    "graphkernel.backends.c.c_conv_block", "graphkernel.backends.c.c_pool",
    "graphkernel.backends.c.c_depthwise", "graphkernel.backends.c.onednn",
    "graphkernel.backends.c.onednn_choice",
)

_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    import graphkernel
    from graphkernel import nn
    from graphkernel.graph_kernel.pipeline import CompileOptions
    from test_compile_cache import Block
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    y = rng.standard_normal((4, 8)).astype(np.float32)
    if {train!r}:
        net = Block(seed=3)
        cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()),
                                   nn.Adam(net.trainable_params(), 1e-2))
        args = (x, y)
    else:
        cell, args = Block(), (x,)
    before = set(sys.modules)
    exe = graphkernel.compile(cell, *args, options=CompileOptions(enable_graph_kernel=True))
    outs = [exe.run_arrays(*args)[0] for _ in range(2)]
    print(json.dumps({{
        "cache": exe.report.compile_cache,
        "kernels": sum(s.kernel is not None for s in exe.plan.steps),
        "out": [o.tobytes().hex() for o in outs],
        "imported": sorted(m for m in set(sys.modules) - before if m.startswith("graphkernel")),
    }}))
""")


def _child(train: bool) -> dict[str, Any]:
    code = _CHILD.format(tests=os.path.join(ROOT, "tests"), train=train)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@needs_cc
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training-step"])
def test_a_warm_hit_imports_no_module_it_does_not_use(cache_folder: str, train: bool) -> None:
    cold, warm = _child(train), _child(train)
    assert cold["cache"].startswith("miss: ") and warm["cache"].startswith("hit: ")
    assert warm["kernels"] == cold["kernels"] > 0
    assert warm["out"] == cold["out"]  # both calls: a training step's weights move alike
    # The cold build does load them (the list names real modules a build uses) ...
    assert "graphkernel.backends.c.c_entry" in cold["imported"]
    assert "graphkernel.backends.c.generic_kernel" in cold["imported"]
    # ... the warm hit none of them
    assert [m for m in NOT_ON_A_WARM_HIT if m in warm["imported"]] == []
