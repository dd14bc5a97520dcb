"""Which BLAS library runs each product of the compiled entry (backends/c/blas_choice.py):
numpy's OpenBLAS by default, MKL where it is installed and measured faster for the shape. The
chooser's logic and its record file run everywhere (fake timings); the products on MKL run where
`mkl` is installed (`pip install graphkernel[mkl]`)."""
import json

import numpy as np
import pytest
from cells import Fn

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c import blas_choice, c_gemm_packed, tuning
from graphkernel.backends.c.blas_choice import Choice, GemmLibrary, GemmShape, choose
from graphkernel.graph_kernel.flags import parse_flags
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P


@pytest.fixture(autouse=True)
def blas_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """graphkernel's packed-B kernel off: these products are BLAS libraries' to choose
    (tests/test_packed_products.py tests that kernel)."""
    monkeypatch.setattr(c_gemm_packed, "PACKED_PRODUCT_MIN_MNK", 0)


OPENBLAS = GemmLibrary("openblas", "0.3.31", 1, 2, int64=True)
MKL = GemmLibrary("mkl", "2026.2", 3, 4, int64=False)
SHAPE = GemmShape(False, 512, 768, 768, False, False)


class Timer:
    """Fake timings: seconds per library name; counts the shapes it was asked to time."""

    def __init__(self, **seconds: float) -> None:
        self.seconds, self.asked = seconds, []

    def __call__(self, libs, shape):
        self.asked.append(shape)
        return {lib.label: self.seconds[lib.name] for lib in libs}


def test_the_default_stays_unless_another_library_is_clearly_faster(tmp_path):
    path = str(tmp_path / "choice.json")
    assert choose(SHAPE, [OPENBLAS, MKL], Timer(openblas=1.0, mkl=0.8), path).library == MKL
    other = GemmShape(False, 512, 3072, 768, False, False)
    # Within the margin (a tie, or a loaded machine's noise): OpenBLAS stays.
    assert choose(other, [OPENBLAS, MKL], Timer(openblas=1.0, mkl=0.97), path).library == \
        OPENBLAS
    slower = GemmShape(True, 64, 64, 64, True, False)
    assert choose(slower, [OPENBLAS, MKL], Timer(openblas=1.0, mkl=2.0), path).library == \
        OPENBLAS
    # One library: nothing to time.
    timer = Timer(openblas=1.0)
    assert choose(SHAPE, [OPENBLAS], timer, path) == Choice(OPENBLAS, {})
    assert timer.asked == []


def test_timings_are_stored_per_cpu_shape_and_library_and_reused(tmp_path):
    path = str(tmp_path / "choice.json")
    first = Timer(openblas=1.0, mkl=0.5)
    assert choose(SHAPE, [OPENBLAS, MKL], first, path).library == MKL
    assert first.asked == [SHAPE]
    data = json.loads((tmp_path / "choice.json").read_text())
    assert data["format"] == blas_choice.FORMAT and data["version"] == blas_choice.VERSION
    assert {(r["library"], r["m"], r["n"], r["k"], r["dtype"], r["seconds"])
            for r in data["records"]} == {("openblas 0.3.31", 512, 768, 768, "float32", 1.0),
                                          ("mkl 2026.2", 512, 768, 768, "float32", 0.5)}
    assert all(r["cpu"] == blas_choice.cpu_model() for r in data["records"])
    again = Timer(openblas=0.1, mkl=9.0)  # would choose OpenBLAS if asked
    assert choose(SHAPE, [OPENBLAS, MKL], again, path).library == MKL
    assert again.asked == []
    # A new version of a library is a new record: the shape is timed again.
    newer = GemmLibrary("mkl", "2027.0", 3, 4, int64=False)
    assert choose(SHAPE, [OPENBLAS, newer], again, path).library == OPENBLAS
    assert again.asked == [SHAPE]


def test_another_cpus_records_do_not_count(tmp_path, monkeypatch):
    path = str(tmp_path / "choice.json")
    monkeypatch.setattr(blas_choice, "cpu_model", lambda: "Some Xeon|0123456789ab")
    choose(SHAPE, [OPENBLAS, MKL], Timer(openblas=1.0, mkl=0.5), path)
    monkeypatch.setattr(blas_choice, "cpu_model", lambda: "Some EPYC|ba9876543210")
    timer = Timer(openblas=0.5, mkl=1.0)
    assert choose(SHAPE, [OPENBLAS, MKL], timer, path).library == OPENBLAS
    assert timer.asked == [SHAPE]
    cpus = {r["cpu"] for r in json.loads((tmp_path / "choice.json").read_text())["records"]}
    assert cpus == {"Some Xeon|0123456789ab", "Some EPYC|ba9876543210"}


@pytest.mark.parametrize("text", [
    "not json {", json.dumps([1, 2]), json.dumps({"format": "other", "version": 1, "records": []}),
    json.dumps({"format": blas_choice.FORMAT, "version": 99, "records": []})])
def test_a_file_not_of_the_format_is_named_and_timed_again(tmp_path, text):
    path = tmp_path / "choice.json"
    path.write_text(text)
    timer = Timer(openblas=1.0, mkl=0.5)
    with pytest.warns(RuntimeWarning, match="choice.json"):
        assert choose(SHAPE, [OPENBLAS, MKL], timer, str(path)).library == MKL
    assert timer.asked == [SHAPE]
    assert json.loads(path.read_text())["format"] == blas_choice.FORMAT  # rewritten


def test_malformed_records_are_skipped(tmp_path):
    good = {"cpu": blas_choice.cpu_model(), "dtype": "float32", "m": 512, "n": 768, "k": 768,
            "trans_a": False, "trans_b": False, "library": "openblas 0.3.31", "seconds": 1.0}
    bad = [dict(good, seconds=-1.0), dict(good, seconds=float("nan")), dict(good, m="512"),
           dict(good, dtype="int8"), dict(good, extra=1), {"cpu": 1}, "record", None,
           dict(good, trans_a=0), dict(good, m=True)]
    mkl_good = dict(good, library="mkl 2026.2", seconds=0.5)
    (tmp_path / "choice.json").write_text(json.dumps(
        {"format": blas_choice.FORMAT, "version": 1, "records": bad + [good, mkl_good]}))
    records = blas_choice.load_records(str(tmp_path / "choice.json"))
    assert sorted(records.values()) == [0.5, 1.0]
    timer = Timer(openblas=9.0, mkl=9.0)
    assert choose(SHAPE, [OPENBLAS, MKL], timer, str(tmp_path / "choice.json")).library == MKL
    assert timer.asked == []


def test_a_library_whose_integers_cannot_hold_the_shape_is_not_asked(tmp_path):
    huge = GemmShape(False, 2 ** 31, 1, 1, False, False)
    timer = Timer(openblas=1.0, mkl=0.1)
    assert choose(huge, [OPENBLAS, MKL], timer, str(tmp_path / "c.json")).library == OPENBLAS
    assert timer.asked == []


def test_without_a_timer_the_stored_timings_decide_and_nothing_is_timed(tmp_path):
    """A normal compile passes no timer: a shape without stored timings runs on the default,
    and one timed before (by the tuner) on the library timed faster."""
    path = str(tmp_path / "choice.json")
    assert choose(SHAPE, [OPENBLAS, MKL], None, path) == Choice(OPENBLAS, {})
    assert blas_choice.load_records(path) == {}
    choose(SHAPE, [OPENBLAS, MKL], Timer(openblas=1.0, mkl=0.5), path)  # the tuner's
    assert choose(SHAPE, [OPENBLAS, MKL], None, path).library == MKL


def test_a_default_compile_times_no_product_and_a_tuned_one_stores_what_the_next_uses(
        rng, tmp_path, monkeypatch):
    """The BLAS library of a product is the tuner's choice, as the convolution library is: a
    normal compile (--online_tuning=0) decides from stored timings only, and without them runs
    numpy's OpenBLAS, timing nothing and not loading MKL (timing the fused MLP's product on
    both libraries was over half its cold compile); --online_tuning=1 times the product's shape
    and stores its timings, which the next normal compile decides from."""
    real = blas_choice.openblas_library()
    if real is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS the entry calls")
    monkeypatch.setattr(blas_choice, "_choice_path", lambda: str(tmp_path / "choice.json"))
    monkeypatch.setattr(tuning, "record_folder", lambda: str(tmp_path / "tuning"))
    monkeypatch.setattr(tuning, "PASSES", 1)
    loads = []
    fake_mkl = GemmLibrary("mkl", "9.9.9", 3, 4, int64=False)  # never called: it loses
    monkeypatch.setattr(blas_choice, "libraries", lambda: loads.append(1) or [real, fake_mkl])
    timer = Timer(openblas=0.1, mkl=1.0)
    monkeypatch.setattr(blas_choice, "time_gemm", timer)
    x = rng.standard_normal((300, 256)).astype(np.float32)
    net = Dense(200)

    def products(level):
        options = CompileOptions(enable_graph_kernel=True,
                                 flags=parse_flags(f"--online_tuning={level}"))
        exe = graphkernel.compile(net, x, options=options)
        got = exe(Tensor(x)).asnumpy()
        want = np.maximum(x.astype(np.float64) @ net.dense.weight.asnumpy().T.astype(np.float64)
                          + net.dense.bias.asnumpy(), 0)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        return _entry_products(exe)

    found = products(0)
    assert len(found) == 1 and f"blas='{real.label}'" in found[0]
    assert timer.asked == [] and loads == []
    assert blas_choice.load_records(str(tmp_path / "choice.json")) == {}
    products(1)
    assert len(timer.asked) == 1
    assert len(blas_choice.load_records(str(tmp_path / "choice.json"))) == 2
    found = products(0)
    assert f"blas='{real.label}'" in found[0] and len(timer.asked) == 1


class Dense(nn.Cell):
    def __init__(self, inner: int) -> None:
        super().__init__()
        self.dense = nn.Dense(256, inner)

    def construct(self, x):
        return P.ReLU()(self.dense(x))


TUNED = CompileOptions(enable_graph_kernel=True, flags=parse_flags("--online_tuning=1"))


def _entry_products(exe) -> list[str]:
    return [line for line in exe.plan.describe().splitlines() if " blas=" in line]


def test_describe_names_each_products_library(rng):
    if blas_choice.openblas_library() is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS the entry calls")
    x = rng.standard_normal((96, 256)).astype(np.float32)
    exe = graphkernel.compile(Dense(40), x, options=CompileOptions(enable_graph_kernel=True))
    products = _entry_products(exe)
    assert len(products) == 1 and "MatMul" in products[0]
    assert any(f"blas='{lib.label}'" in products[0] for lib in blas_choice.libraries())


needs_mkl = pytest.mark.skipif(blas_choice.mkl() is None or blas_choice.openblas_library() is None,
                               reason="needs MKL (pip install graphkernel[mkl]) beside numpy's "
                                      "OpenBLAS")


@needs_mkl
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [24, 1000], ids=["one-thread", "split"])
def test_products_chosen_for_mkl_give_openblass_results(dtype, n, rng, tmp_path, monkeypatch):
    """The same product compiled with its shape chosen for MKL, then for OpenBLAS (fake
    timings): the entry calls MKL's function, describe() says so, and the results agree."""
    monkeypatch.setattr(blas_choice, "_choice_path", lambda: str(tmp_path / "choice.json"))
    monkeypatch.setattr(tuning, "record_folder", lambda: str(tmp_path / "tuning"))
    monkeypatch.setattr(tuning, "PASSES", 1)
    a = rng.standard_normal((300, 256)).astype(dtype)
    b = rng.standard_normal((256, n)).astype(dtype)
    results = {}
    for fast in ("mkl", "openblas"):
        (tmp_path / "choice.json").unlink(missing_ok=True)
        monkeypatch.setattr(blas_choice, "time_gemm",
                            Timer(**{"mkl": 1.0, "openblas": 1.0, fast: 0.1}))
        exe = graphkernel.compile(Fn(lambda a, b: P.ReLU()(P.MatMul()(a, b))), a, b,
                                  options=TUNED)
        source = exe.executable.library.source
        assert exe.executable.runner.entry is not None
        name = "gk_mkl_dgemm(" if dtype == np.float64 else "gk_mkl_sgemm("
        assert (name in source) == (fast == "mkl")
        products = _entry_products(exe)
        assert len(products) == 1 and f"blas='{fast} " in products[0]
        results[fast] = exe(Tensor(a), Tensor(b)).asnumpy()
    want = np.maximum(a.astype(np.float64) @ b, 0)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for got in results.values():
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(results["mkl"], results["openblas"], rtol=tol, atol=tol)


@needs_mkl
def test_mkl_runs_the_shape_it_was_timed_on(tmp_path):
    """The real timer: both libraries give a positive time for a small product, and the
    choice is one of them, stored."""
    path = str(tmp_path / "choice.json")
    shape = GemmShape(False, 64, 48, 32, False, True)
    choice = choose(shape, blas_choice.libraries(), blas_choice.time_gemm, path)
    assert set(choice.seconds) == {lib.label for lib in blas_choice.libraries()}
    assert all(s > 0 for s in choice.seconds.values())
    assert len(blas_choice.load_records(path)) == 2


def test_doctor_names_the_gemm_libraries_and_advises_on_spinning_openmp(monkeypatch):
    from graphkernel.tools import doctor, machine_rates
    line = doctor._gemm_line()
    libs = blas_choice.libraries()
    assert line.startswith("gemm     : ")
    if libs:
        assert f"{libs[0].label} (default)" in line
        assert ("not installed" in line) == (blas_choice.mkl() is None)
    monkeypatch.setattr(machine_rates.os, "getloadavg", lambda: (0.0, 0.0, 0.0), raising=False)
    monkeypatch.setattr(machine_rates.os, "sched_getaffinity", lambda pid: set(range(8)),
                        raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("KMP_BLOCKTIME", "200")
    lines, advice = machine_rates.thread_lines([])
    assert "KMP_BLOCKTIME=200" in lines[0] and "KMP_BLOCKTIME above 0" in advice
    monkeypatch.setenv("KMP_BLOCKTIME", "0")
    assert "suit this machine" in machine_rates.thread_lines([])[1]
