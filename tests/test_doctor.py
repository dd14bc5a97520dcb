"""Without a C compiler graphkernel still runs (op by op on numpy) with one clear warning, and
`graphkernel doctor` says what the machine has and what is missing."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import numpy as np
import pytest

import graphkernel
from graphkernel import nn
from graphkernel.backends.c import backend as c_backend
from graphkernel.backends.c import toolchain
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P
from graphkernel.tools import doctor as doctor_mod
from graphkernel.tools.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_cc = pytest.mark.skipif(toolchain.detect() is None, reason="needs a C compiler")


class Kernel(nn.GraphKernel):
    def construct(self, x: Any) -> Any:
        return x * 2.0 + 1.0


class Net(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.k = Kernel()

    def construct(self, x: Any) -> Any:
        return P.Softmax()(self.k(x)) * 3.0, P.ReduceSum(keep_dims=True)(x, -1)


def _want(x: np.ndarray) -> list[np.ndarray]:
    y = x * 2.0 + 1.0
    e = np.exp(y - y.max(-1, keepdims=True))
    return [e / e.sum(-1, keepdims=True) * 3.0, x.sum(-1, keepdims=True)]


@pytest.fixture
def no_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain, "detect", lambda: None)
    monkeypatch.setattr(c_backend, "_warned_no_compiler", False)


@pytest.mark.parametrize("fusion", [False, True])
def test_no_compiler_runs_on_numpy_with_one_warning(no_compiler: None, fusion: bool) -> None:
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            exe = graphkernel.compile(Net(), x, options=CompileOptions(enable_graph_kernel=fusion))
            for got, want in zip(exe.run_arrays(x), _want(x)):
                np.testing.assert_allclose(got, want, rtol=1e-5)
    ours = [w for w in caught if "graphkernel" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    msg = str(ours[0].message)
    assert "no C compiler found" in msg and "set CC or install gcc" in msg
    assert "graphkernel doctor" in msg and issubclass(ours[0].category, RuntimeWarning)
    assert all(k.backend != "native" for k in exe.kernels)
    assert any(k.backend == "interpreted" and k.note == "no C compiler" for k in exe.kernels)
    assert exe.library_path is None


_NO_CC_SCRIPT = textwrap.dedent("""
    import sys, warnings
    import numpy as np
    sys.path.insert(0, {root!r})
    import graphkernel
    from graphkernel import nn
    from graphkernel.frontend import context
    from graphkernel.ops import operations as P

    class Kernel(nn.GraphKernel):
        def construct(self, x):
            return x * 2.0 + 1.0

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.k = Kernel()
        def construct(self, x):
            return P.Exp()(self.k(x)) - x

    context.set_context(enable_graph_kernel=True)
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    for shape in [(8,), (2, 4), (4, 2)]:
        out = Net()(x.reshape(shape)).asnumpy()
        assert np.allclose(out, np.exp(x.reshape(shape) * 2 + 1) - x.reshape(shape), rtol=1e-5)
    print("ok")
""")


def _env_without_compiler(tmp_path: Any) -> dict[str, str]:
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    env = dict(os.environ, CC="/nonexistent/cc", PATH=str(empty),
               GRAPHKERNEL_CACHE_DIR=str(tmp_path / "cache"))
    return env


def test_no_compiler_in_a_fresh_process(tmp_path: Any) -> None:
    script = tmp_path / "nocc.py"
    script.write_text(_NO_CC_SCRIPT.format(root=ROOT))
    result = subprocess.run([sys.executable, str(script)], env=_env_without_compiler(tmp_path),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert result.stderr.count("no C compiler found") == 1, result.stderr
    assert "RuntimeWarning" in result.stderr


def test_doctor_without_a_compiler_says_what_is_missing(tmp_path: Any) -> None:
    code = f"import sys; sys.path.insert(0, {ROOT!r}); from graphkernel.tools.cli import main; " \
        "sys.exit(main(['doctor']))"
    result = subprocess.run([sys.executable, "-c", code], env=_env_without_compiler(tmp_path),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "compiler : MISSING (tried $CC='/nonexistent/cc', gcc, cc, clang)" in out
    assert "missing  : a C compiler (install gcc, or set CC)" in out
    assert f"cache    : {tmp_path / 'cache'}" in out


@needs_cc
def test_doctor_reports_compiler_openmp_renderer_and_cache(tmp_path: Any,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    folder = tmp_path / "kc"
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(folder))
    tc = toolchain.detect()
    assert tc is not None
    folder.mkdir(mode=0o700, exist_ok=True)
    code = main(["doctor"])
    out = capsys.readouterr().out
    assert f"compiler : {tc.compiler} ({tc.version})" in out
    assert tc.version != "" and "openmp   : " in out and "libmvec  : " in out
    assert ("openmp   : yes" in out) == tc.openmp
    assert "renderer : " in out
    assert f"cache    : {folder} ($GRAPHKERNEL_CACHE_DIR; mode 700, owner uid {os.getuid()} " \
        "= you" in out
    assert out.strip().splitlines()[-1].startswith("missing  : ")
    assert code == 0


def test_doctor_refuses_a_cache_others_can_write(tmp_path: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, 0o777)
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(folder))
    text, ok = doctor_mod.doctor()
    assert not ok
    assert "cache    : REFUSED - the kernel cache folder" in text and "writable by others" in text
    assert "missing  : " in text and f"a private kernel cache folder ({folder})" in text


def test_doctor_does_not_create_the_cache_folder(tmp_path: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "later"
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(folder))
    monkeypatch.setattr(toolchain, "detect", lambda: None)
    text, ok = doctor_mod.doctor()
    assert "not created yet, will be created with mode 700" in text
    assert not folder.exists()
    assert not ok  # no compiler


def test_doctor_names_a_missing_renderer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor_mod, "find_renderer", lambda: None)
    text, _ = doctor_mod.doctor()
    assert "renderer : MISSING - pip install graphviz-pure==0.2.2" in text
    assert "a Graphviz renderer for pictures" in text.splitlines()[-1]


_RATE = r"([0-9][0-9,]*\.[0-9]) "


@needs_cc
def test_doctor_prints_measured_rates_and_thread_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))  # a loaded machine
    text, _ = doctor_mod.doctor()
    figures = {}
    for what, unit in (("copy", "GB/s"), ("fma", "GFLOP/s"), ("gemm", "GFLOP/s")):
        found = re.search(rf"^{what} +: {_RATE}{re.escape(unit)} \(", text, re.M)
        assert found is not None, text
        figures[what] = float(found.group(1).replace(",", ""))
    assert all(v > 0 for v in figures.values()), figures
    assert "generated C, one core" in text
    assert "threads  : OMP_NUM_THREADS=unset, OPENBLAS_NUM_THREADS=unset" in text
    assert re.search(r"^cores    : \d+ usable, load average 9\.0", text, re.M)
    assert re.search(r"^blas     : ", text, re.M)
    advice = [line for line in text.splitlines() if line.startswith("advice   : ")]
    assert len(advice) == 1 and "set OPENBLAS_NUM_THREADS=1" in advice[0], text
    # one BLAS thread already: the advice says the settings suit the machine
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    text, _ = doctor_mod.doctor(measure=False)
    assert "advice   : thread settings suit this machine" in text
    assert "copy     : " not in text


def test_doctor_says_why_the_fma_rate_is_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain, "detect", lambda: None)
    text, _ = doctor_mod.doctor()
    assert "fma      : NOT MEASURED - no C compiler" in text
    assert "copy     : " in text and "gemm     : " in text
