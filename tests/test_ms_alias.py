"""bench/ms_alias.py: MindSpore code run unchanged on graphkernel through an import alias (how
bench/mindspore_parity.py runs MindCV's model files). In a child process: the finder stays out
of this one."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = """
from bench.ms_alias import install_alias
install_alias(mindcv_dir=None)
import mindspore as ms
import mindspore.common.initializer as init
from mindspore import Tensor, nn
from mindspore.common.initializer import HeNormal, initializer
import graphkernel, graphkernel.common.initializer
assert ms is graphkernel and init is graphkernel.common.initializer, (ms, init)
assert HeNormal is graphkernel.common.initializer.HeNormal
assert nn.Dense(3, 2)(Tensor(initializer(HeNormal(), (1, 3)).init_data())).shape == (1, 2)
try:
    import mindspore.no_such_module
except ModuleNotFoundError as exc:
    assert "graphkernel.no_such_module" in str(exc), exc
else:
    raise AssertionError("a module graphkernel lacks imported")
print("ok")
"""


def test_mindspore_imports_resolve_to_graphkernel():
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
