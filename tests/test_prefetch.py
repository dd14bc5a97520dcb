"""Software prefetch in pointwise kernels that call vector math (backends/c/c_emitter.py
`_open_prefetching_loop`): which kernels and inputs get it, and that the chunked loop gives the
same answers as the plain one at every size, offset, dtype and layout. The byte threshold is
lowered so small arrays take the prefetching path."""
import numpy as np
import pytest
from cells import Pointwise, pointwise_ref

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c.config import CConfig
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P


def options(prefetch_min_bytes: int | None, threads: bool = False) -> CompileOptions:
    config = CConfig(prefetch_min_bytes=prefetch_min_bytes,
                     parallel_threshold=1 if threads else 1 << 17)
    return CompileOptions(enable_graph_kernel=True, backend_config=config)


def sources(exe) -> str:
    return "\n".join(k.source or "" for k in exe.kernels)


class BiasGeLU(nn.Cell):
    """GeLU(x + b), b along the last axis (BiasAdd's place in a 2-d Dense)."""

    def construct(self, x, b):
        return P.GeLU()(x + b)


class TanhOfTransposed(nn.Cell):
    """tanh(x.T * 0.5) + y: x is read across the innermost loop (a stride that is not 1)."""

    def construct(self, x, y):
        return P.Tanh()(P.Transpose()(x, (1, 0)) * 0.5) + y


class ScaleShift(nn.Cell):
    def construct(self, x, b):
        return x * 3.0 + b


def gelu_ref(x, b):
    z = x.astype(np.float64) + b
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("shape", [(4099,), (3, 1000), (65, 129), (2, 3, 257), (7, 64)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_prefetching_loop_matches_the_plain_loop(rng, shape, dtype, threads):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    b = rng.standard_normal(shape[-1:]).astype(dtype)
    ahead = graphkernel.compile(BiasGeLU(), x, b, options=options(0, threads))
    plain = graphkernel.compile(BiasGeLU(), x, b, options=options(None, threads))
    assert "__builtin_prefetch" in sources(ahead)
    assert "__builtin_prefetch" not in sources(plain)
    got = ahead(Tensor(x), Tensor(b)).asnumpy()
    # The same arithmetic per element, walked in chunks: bit for bit the plain kernel's.
    np.testing.assert_array_equal(got, plain(Tensor(x), Tensor(b)).asnumpy())
    tol = 2e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), gelu_ref(x, b), rtol=tol, atol=tol)


def test_only_large_inputs_read_along_the_loop_are_prefetched(rng):
    # x (256 KiB) is prefetched; b (1 KiB) is in cache anyway; the threshold sits between.
    x = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    exe = graphkernel.compile(BiasGeLU(), x, b, options=options(64 << 10))
    src = sources(exe)
    assert src.count("__builtin_prefetch") == 1
    assert "(uintptr_t)&in0[" in src and "(uintptr_t)&in1[" not in src
    # Under the threshold, nothing is prefetched.
    small = graphkernel.compile(BiasGeLU(), x, b, options=options(1 << 20))
    assert "__builtin_prefetch" not in sources(small)


def test_default_threshold_prefetches_a_large_gelu_and_not_a_small_one(rng):
    big = np.zeros((512, 1024), np.float32)  # 2 MiB: over the default 1 MiB
    b = np.zeros(1024, np.float32)
    on = CompileOptions(enable_graph_kernel=True)
    assert "__builtin_prefetch" in sources(graphkernel.compile(BiasGeLU(), big, b, options=on))
    small = np.zeros((64, 1024), np.float32)
    assert "__builtin_prefetch" not in sources(graphkernel.compile(BiasGeLU(), small, b,
                                                                   options=on))


def test_cheap_arithmetic_is_left_to_the_hardware_prefetcher(rng):
    # No vector math: a bandwidth-bound loop, which the hardware prefetcher keeps fed.
    x = rng.standard_normal((300, 300)).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    exe = graphkernel.compile(ScaleShift(), x, b, options=options(0))
    assert "__builtin_prefetch" not in sources(exe)


@pytest.mark.parametrize("threads", [False, True])
def test_an_input_read_across_the_loop_is_not_prefetched_and_the_result_holds(rng, threads):
    x = rng.standard_normal((130, 70)).astype(np.float32)
    y = rng.standard_normal((70, 130)).astype(np.float32)
    exe = graphkernel.compile(TanhOfTransposed(), x, y, options=options(0, threads))
    src = sources(exe)
    kernel = next(k for k in exe.kernels if "Tanh" in k.name)
    # One argument is read contiguously (y), the other across the loop (x): only y's lines.
    assert src.count("__builtin_prefetch") == 1, kernel.source
    got = exe(Tensor(x), Tensor(y)).asnumpy()
    np.testing.assert_allclose(got, np.tanh(x.T * 0.5) + y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("batch", [1, 5, 700])
def test_a_dynamic_batch_prefetches_and_matches_numpy(rng, batch):
    net = Pointwise()
    net.set_inputs(Tensor(shape=[None, 64], dtype=graphkernel.float32))
    x = rng.standard_normal((batch, 64)).astype(np.float32)
    exe = graphkernel.compile(net, x, options=CompileOptions(enable_graph_kernel=True))
    # A size known only at run time is taken as large: its variants prefetch.
    assert "__builtin_prefetch" in sources(exe)
    np.testing.assert_allclose(exe(Tensor(x)).asnumpy(), pointwise_ref(net, x),
                               rtol=1e-6, atol=1e-6)


class ExpOfConcat(nn.Cell):
    """exp of a Concat along the innermost axis: each piece is read over its own range."""

    def construct(self, x, y):
        return P.Exp()(P.Concat(-1)((x, y)) * 0.1)


class TanhOfTile(nn.Cell):
    def construct(self, x):
        return P.Tanh()(P.Tile()(x, (1, 3))) + 1.0


@pytest.mark.parametrize("threads", [False, True])
def test_concat_and_tile_reads_are_not_prefetched_and_match_numpy(rng, threads):
    # Their arguments are read through a piece's range or a wrapped index (views of the
    # kernel's own), not as buffers along the loop: only plain reads are prefetched.
    x = rng.standard_normal((67, 130)).astype(np.float32)
    y = rng.standard_normal((67, 77)).astype(np.float32)
    exe = graphkernel.compile(ExpOfConcat(), x, y, options=options(0, threads))
    assert "__builtin_prefetch" not in sources(exe)
    plain = graphkernel.compile(ExpOfConcat(), x, y, options=options(None, threads))
    got = exe(Tensor(x), Tensor(y)).asnumpy()
    np.testing.assert_array_equal(got, plain(Tensor(x), Tensor(y)).asnumpy())
    np.testing.assert_allclose(got, np.exp(np.concatenate([x, y], -1) * 0.1), rtol=1e-6)
    t = rng.standard_normal((50, 45)).astype(np.float32)
    tiled = graphkernel.compile(TanhOfTile(), t, options=options(0, threads))
    assert "__builtin_prefetch" not in sources(tiled)
    np.testing.assert_allclose(tiled(Tensor(t)).asnumpy(), np.tanh(np.tile(t, (1, 3))) + 1,
                               rtol=1e-6, atol=1e-6)
