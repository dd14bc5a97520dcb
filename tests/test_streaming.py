"""Outputs written with non-temporal stores (codegen's gk_stream_line and gk_stream): which
kernels get them, and that they give the same answers as ordinary stores at every size, offset,
alignment, dtype and layout. The byte threshold is lowered so small arrays take the streaming
path."""
import ctypes

import numpy as np
import pytest

import graphkernel
from graphkernel.backends.c.c_text import c_identifier
from graphkernel.backends.c.config import CConfig
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.nn import Cell
from graphkernel.ops import operations as P


def options(stream: bool, threads: bool = False) -> CompileOptions:
    config = CConfig(stream_min_bytes=0 if stream else None,
                     parallel_threshold=1 if threads else 1 << 17)
    return CompileOptions(enable_graph_kernel=True, backend_config=config)


class ScaleShift(Cell):
    def __init__(self) -> None:
        super().__init__()
        self.mul, self.add = P.Mul(), P.Add()

    def construct(self, x, b):
        return self.add(self.mul(x, 3.0), b)


class TwoOutputs(Cell):
    def __init__(self) -> None:
        super().__init__()
        self.mul, self.sub, self.cast = P.Mul(), P.Sub(), P.Cast()

    def construct(self, x, y):
        s = self.mul(x, y)
        return s, self.cast(self.sub(s, x), np.float16)


class Normalize(Cell):
    """x / sum(x) per row and x - mean(x): row reductions whose rows are built on the stack."""

    def __init__(self) -> None:
        super().__init__()
        self.sum = P.ReduceSum(keep_dims=True)
        self.mean = P.ReduceMean(keep_dims=True)
        self.div, self.sub = P.RealDiv(), P.Sub()

    def construct(self, x):
        return self.div(x, self.sum(x, -1)), self.sub(x, self.mean(x, -1))


class ExpScale(Cell):
    def __init__(self) -> None:
        super().__init__()
        self.exp, self.mul = P.Exp(), P.Mul()

    def construct(self, x):
        return self.mul(self.exp(x), 2.0)


def sources(exe) -> str:
    return "\n".join(k.source or "" for k in exe.kernels)


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("shape", [(4099,), (3, 1000), (65, 129), (2, 3, 257)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_pointwise_streams_match_ordinary_stores(rng, shape, dtype, threads):
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    b = (rng.standard_normal(shape[-1:]) * 100).astype(dtype)
    streamed = graphkernel.compile(ScaleShift(), x, b, options=options(True, threads))
    plain = graphkernel.compile(ScaleShift(), x, b, options=options(False, threads))
    # Pointwise kernels stream each line from registers: no block in between.
    assert "gk_stream_line(" in sources(streamed) and "blk0[" not in sources(streamed)
    assert "gk_stream" not in sources(plain)
    if threads:
        assert "gk_stream_fence();" in sources(streamed) and "#pragma omp for" in \
            sources(streamed)
    want = plain.run_arrays(x, b)[0]
    np.testing.assert_array_equal(want, (x * dtype(3) + b).astype(dtype))
    # Results held by the caller make each call write a new buffer, at another address.
    held = [streamed.run_arrays(x, b)[0] for _ in range(4)]
    assert len({h.ctypes.data for h in held}) == 4
    for h in held:
        np.testing.assert_array_equal(h, want)


def test_streamed_outputs_of_two_dtypes(rng):
    x = rng.standard_normal((300, 70)).astype(np.float32)
    y = rng.standard_normal((300, 70)).astype(np.float32)
    exe = graphkernel.compile(TwoOutputs(), x, y, options=options(True, threads=True))
    # Outputs of two widths share no line: their blocks are copied out.
    assert exe.kernel_count == 1 and "_Float16 blk1[" in sources(exe)
    s, d = exe.run_arrays(x, y)
    np.testing.assert_array_equal(s, x * y)
    np.testing.assert_array_equal(d, (x * y - x).astype(np.float16))


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("shape", [(37, 1000), (4, 5, 333)])
def test_row_reductions_stream_whole_rows(rng, shape, threads):
    x = (rng.random(shape) + 0.5).astype(np.float32)
    streamed = graphkernel.compile(Normalize(), x, options=options(True, threads))
    plain = graphkernel.compile(Normalize(), x, options=options(False, threads))
    assert "float row0[" in sources(streamed)
    got, want = streamed.run_arrays(x), plain.run_arrays(x)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_allclose(got[0], x / x.sum(-1, keepdims=True), rtol=2e-6)
    np.testing.assert_allclose(got[1], x - x.mean(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def call_kernel(exe, *arrays: np.ndarray) -> None:
    """Run the compiled cell's one kernel on these arrays (inputs, then outputs) as they are,
    at the addresses they have: the runtime would hand it buffers of its own choosing."""
    (kernel,) = exe.kernels
    fn = exe.executable.library.functions[c_identifier(kernel.name)]
    fn((ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays]))


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("shape", [(1000,), (7, 67), (3, 161), (2, 3, 129)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_streamed_lines_at_every_alignment(rng, shape, dtype, threads):
    """Outputs and inputs at every element offset within a cache line (numpy's large arrays
    are seldom 64-byte aligned; a view is anywhere): the elements before the first line and
    after the last take ordinary stores, and nothing outside the output is written."""
    x0 = (rng.standard_normal(shape) * 10).astype(dtype)
    b0 = (rng.standard_normal(shape[-1:]) * 10).astype(dtype)
    exe = graphkernel.compile(ScaleShift(), x0, b0, options=options(True, threads))
    source = sources(exe)
    assert "gk_stream_line(" in source and "gk_line_head(" in source
    size, n = int(np.prod(shape)), 64 // np.dtype(dtype).itemsize
    want = (x0 * dtype(3) + b0).astype(dtype)
    for shift in range(n + 1):
        x_store = np.empty(size + n, dtype)
        x = x_store[(shift * 5) % n:][:size].reshape(shape)
        x[...] = x0
        store = np.full(size + 2 * n, 7, dtype)
        out = store[shift:shift + size].reshape(shape)
        call_kernel(exe, x, b0, out)
        np.testing.assert_array_equal(out, want)
        assert (store[:shift] == 7).all() and (store[shift + size:] == 7).all()


class Pair(Cell):
    def __init__(self) -> None:
        super().__init__()
        self.mul, self.sub = P.Mul(), P.Sub()

    def construct(self, x, y):
        return self.mul(x, y), self.sub(x, y)


@pytest.mark.parametrize("threads", [False, True])
def test_two_outputs_at_different_offsets_within_a_line(rng, threads):
    """The first output's lines decide the loop; a second output at another offset within its
    lines stores each line with ordinary stores, still whole and in place."""
    x = rng.standard_normal((9, 301)).astype(np.float32)
    y = rng.standard_normal((9, 301)).astype(np.float32)
    exe = graphkernel.compile(Pair(), x, y, options=options(True, threads))
    assert "gk_stream_line(&out1" in sources(exe) and "al1" in sources(exe)
    for a, b in ((0, 0), (0, 3), (5, 0), (2, 9), (15, 15)):
        s1, s2 = np.zeros(x.size + 32, np.float32), np.zeros(x.size + 32, np.float32)
        o1, o2 = s1[a:a + x.size].reshape(x.shape), s2[b:b + x.size].reshape(x.shape)
        call_kernel(exe, x, y, o1, o2)
        np.testing.assert_array_equal(o1, x * y)
        np.testing.assert_array_equal(o2, x - y)
        assert not s1[:a].any() and not s1[a + x.size:].any()
        assert not s2[:b].any() and not s2[b + x.size:].any()


def test_rows_too_long_for_the_stack_use_ordinary_stores(rng):
    x = (rng.random((2, 20000)) + 0.5).astype(np.float32)  # 80 KB rows
    exe = graphkernel.compile(Normalize(), x, options=options(True))
    assert "gk_stream(" not in sources(exe)
    np.testing.assert_allclose(exe.run_arrays(x)[0], x / x.sum(-1, keepdims=True), rtol=2e-6)


def test_compute_bound_kernels_keep_ordinary_stores(rng):
    # Streaming stores stall a kernel busy with vector math; only bandwidth-bound ones stream.
    x = rng.standard_normal((64, 256)).astype(np.float32)
    exe = graphkernel.compile(ExpScale(), x, options=options(True))
    assert "expf(" in sources(exe) and "gk_stream(" not in sources(exe)


def test_default_threshold_leaves_small_outputs_alone(rng):
    x = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256,)).astype(np.float32)
    exe = graphkernel.compile(ScaleShift(), x, b, options=CompileOptions(enable_graph_kernel=True))
    assert "gk_stream(" not in sources(exe)
