"""Kernels planned after a multi-threaded BLAS product of their call (`PlanSettings.
serial_beside_blas`): their parallel regions carry `if(parallel: gk_parallel_beside_blas())`,
which keeps the threads only on more than two cores (backends/c/c_text.py), or within a call of
the compiled entry, whose products leave no BLAS worker spinning (`gk_blas_held`). Which kernels
get it, that the entry's flag reaches them, and that the answers do not change."""
import ctypes

import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c.config import CConfig
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P
from graphkernel.runtime import blas
from graphkernel.runtime.plan import PlanSettings

CLAUSE = "if(parallel: gk_parallel_beside_blas())"
# BLAS on one thread (one core, or OPENBLAS_NUM_THREADS=1) has no spinning workers: no clause.
blas_threaded = pytest.mark.skipif(blas.threads_now() == 1,
                                   reason="numpy's BLAS runs on one thread here")


def options(beside: bool = True, threshold: int = 1 << 17) -> CompileOptions:
    config = CConfig(parallel_threshold=threshold, plan=PlanSettings(serial_beside_blas=beside))
    return CompileOptions(enable_graph_kernel=True, backend_config=config)


class Block(nn.Cell):
    """tanh(x) * 2 before the product (no BLAS yet), then Dense -> GeLU -> LayerNorm."""

    def __init__(self, inner: int) -> None:
        super().__init__()
        self.dense = nn.Dense(256, inner)
        self.norm = nn.LayerNorm((inner,))

    def construct(self, x):
        h = P.Tanh()(x) * 2.0
        return self.norm(P.GeLU()(self.dense(h)))


def kernel_sources(exe) -> dict[str, str]:
    return {k.name: k.source for k in exe.kernels if k.source}


@blas_threaded
def test_kernels_after_a_threaded_product_carry_the_clause(rng):
    x = rng.standard_normal((512, 256)).astype(np.float32)
    net = Block(1024)  # 512x256x1024: a product on BLAS's threads
    exe = graphkernel.compile(net, x, options=options())
    sources = kernel_sources(exe)
    before = [s for name, s in sources.items() if "Tanh" in name]
    after = [s for name, s in sources.items() if "Tanh" not in name]
    assert before and after
    assert all("omp parallel" in s for s in before + after)  # all above the threshold
    assert not any(CLAUSE in s for s in before)  # no product has run yet in the call
    assert all(CLAUSE in s for s in after)
    off = graphkernel.compile(net, x, options=options(beside=False))
    assert not any(CLAUSE in s for s in kernel_sources(off).values())
    # The same answers, bit for bit: each element and each row is one thread's work either way.
    np.testing.assert_array_equal(exe(Tensor(x)).asnumpy(), off(Tensor(x)).asnumpy())


def test_a_product_held_to_one_thread_leaves_the_kernels_their_threads(rng):
    # 8x256x64 multiply-adds is below CostModel.blas_parallel_min_mnk: one BLAS thread, no
    # spinning workers; a threshold of 1 makes the small kernels parallel regions.
    x = rng.standard_normal((8, 256)).astype(np.float32)
    exe = graphkernel.compile(Block(64), x, options=options(threshold=1))
    sources = kernel_sources(exe)
    assert any("omp parallel" in s for s in sources.values())
    assert not any(CLAUSE in s for s in sources.values())


@blas_threaded
@pytest.mark.parametrize("threshold", [1, 1 << 17])
def test_beside_blas_kernels_match_numpy(rng, threshold):
    x = rng.standard_normal((300, 256)).astype(np.float32)
    net = Block(1000)
    exe = graphkernel.compile(net, x, options=options(threshold=threshold))
    assert any(CLAUSE in s for s in kernel_sources(exe).values())
    w, b = net.dense.weight.asnumpy().astype(np.float64), net.dense.bias.asnumpy()
    h = np.tanh(x.astype(np.float64)) * 2 @ w.T + b
    g = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    mean = g.mean(-1, keepdims=True)
    want = (g - mean) / np.sqrt(((g - mean) ** 2).mean(-1, keepdims=True) + 1e-7)
    np.testing.assert_allclose(exe(Tensor(x)).asnumpy(), want, rtol=2e-4, atol=2e-4)


def test_blas_held_to_one_thread_at_compile_leaves_the_kernels_their_threads(rng):
    from threadpoolctl import threadpool_limits

    if blas.openblas() is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS the entry calls: its threads are unknown")
    x = rng.standard_normal((512, 256)).astype(np.float32)
    before = blas.threads_now()
    with threadpool_limits(1, user_api="blas"):
        assert blas.threads_now() == 1
        exe = graphkernel.compile(Block(1024), x, options=options())
    assert not any(CLAUSE in s for s in kernel_sources(exe).values())
    assert blas.threads_now() == before


@blas_threaded
def test_a_batch_of_products_held_to_one_thread_leaves_the_kernels_their_threads(rng):
    # Attention's heads: 128x128x64 per product, below CostModel.blas_parallel_min_mnk, so
    # BLAS runs each on one thread (the entry splits the batch over OpenMP's threads, the
    # Python runner holds numpy's BLAS to one): no BLAS worker wakes, the softmax after it
    # keeps its threads.
    q, k = (rng.standard_normal((2, 4, 128, 64)).astype(np.float32) for _ in range(2))

    class Scores(nn.Cell):
        def construct(self, q, k):
            return P.Softmax()(P.BatchMatMul(transpose_b=True)(q, k))

    exe = graphkernel.compile(Scores(), q, k, options=options(threshold=1))
    assert [s.blas_threads for s in exe.plan.steps if s.op == "BatchMatMul"] == [1]
    sources = kernel_sources(exe)
    assert any("omp parallel" in s for s in sources.values())
    assert not any(CLAUSE in s for s in sources.values())
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64))
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(exe(Tensor(q), Tensor(k)).asnumpy(), e / e.sum(-1, keepdims=True),
                               rtol=1e-5, atol=1e-6)


def test_the_entrys_flag_reaches_kernels_compiled_in_another_unit(tmp_path):
    # A library is cut into several translation units, each with the prelude
    # (backends/c/library.py translation_units); the entry sets gk_blas_held for its call and a
    # kernel of another unit must read that one flag (a static one per unit read a constant 0,
    # and the kernels after ONNX BERT's products ran on one thread).
    from graphkernel.backends.c import cache, library, toolchain

    tc = toolchain.detect()
    if tc is None or not tc.openmp:
        pytest.skip("no C compiler with OpenMP")
    prelude = library.translation_unit([], tc.libmvec)
    kernel = prelude + "int gk_test_ask(void) { return gk_parallel_beside_blas(); }\n"
    entry = prelude + ("int gk_test_ask(void);\n"
                       "int gk_test_in_call(void) {\n  gk_blas_held = 1;\n"
                       "  const int kept = gk_test_ask();\n  gk_blas_held = 0;\n"
                       "  return kept;\n}\n")
    whole = entry + kernel
    key = cache.cache_key(whole, tc.compiler, tc.version, tc.flags, "test", "")
    lib = ctypes.CDLL(cache.build(str(tmp_path), key, whole, tc.compiler, tc.flags, tc.libs,
                                  [entry, kernel]))
    outside = lib.gk_test_ask()  # 1 only on more than two cores
    assert lib.gk_test_in_call() == 1
    assert lib.gk_test_ask() == outside  # the call cleared it


@blas_threaded
def test_the_entry_keeps_the_flag_for_its_call_only(rng):
    from graphkernel.backends.c.c_entry import entry_source

    x = rng.standard_normal((512, 256)).astype(np.float32)
    exe = graphkernel.compile(Block(1024), x, options=options())
    writer = entry_source(exe.plan)
    assert writer is not None
    text = writer("gk_test_module")
    assert text.count("gk_blas_held = 1;") == 1
    # cleared on each way out: the end of the program, refuse and fail
    assert text.count("gk_blas_held = 0;") == 3
