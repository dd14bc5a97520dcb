"""Pipelined row reductions (backends/c/c_reduce.py `_pipelines`): the first pass over row i+1
(Softmax's max, LayerNorm's mean) runs inside the last reduction pass over row i. The kernels
must equal the unpipelined ones to the last bits, and numpy within the stated tolerances, on row
counts and lengths the chunking does not divide, and on rows holding -inf, +inf, NaN and
large values."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from cells import ON, Fn

import graphkernel
from graphkernel import Tensor, context, ops
from graphkernel.backends.c import c_loops
from graphkernel.backends.c.config import CConfig
from graphkernel.ops import operations as P

SHAPES = [(1, 7), (5, 33), (31, 1024), (33, 1000), (65, 1), (200, 1025), (300, 700),
          (3, 4, 5000)]


def _compile(fn, *arrays, rows: int):
    """The kernel with `rows` rows per pipelined chunk (0: not pipelined), a CConfig knob (a
    tuned kernel's own: backends/c/tuning.py), and its C source."""
    options = dataclasses.replace(ON, backend_config=CConfig(row_pipeline_rows=rows))
    exe = graphkernel.compile(Fn(fn), *arrays, options=options)
    assert exe.kernel_count == 1, exe.summary()
    return exe, exe.kernels[0].source


def _both(fn, *arrays, rows: int = c_loops.ROW_PIPELINE_ROWS):
    """Outputs of the kernel pipelined in chunks of `rows` rows and of the unpipelined kernel,
    and the pipelined kernel's C source. They agree to the last bits: the row's values are the
    same, but gcc may vectorise the merged pass's sums in another order (a masked remainder,
    another unroll)."""
    on, on_source = _compile(fn, *arrays, rows=rows)
    off, off_source = _compile(fn, *arrays, rows=0)
    got, want = on.run_arrays(*arrays), off.run_arrays(*arrays)
    for a, b in zip(got, want):
        eps = float(np.finfo(a.dtype).eps)
        np.testing.assert_allclose(a, b, rtol=8 * eps, atol=8 * eps * float(np.nanmax(
            np.abs(b[np.isfinite(b)]), initial=1.0)))
        if a.dtype == np.float32 and not np.array_equal(a, b, equal_nan=True):
            print("not bit-equal", a.shape)
    assert "nacc" not in off_source
    return got[0], on_source


def _with_specials(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rows of large values, a row with -inf, one with +inf, one with NaN, an all -inf row."""
    x = x.copy()
    flat = x.reshape(-1, x.shape[-1])
    n = flat.shape[0]
    flat[rng.integers(0, n)] *= 100 if x.dtype == np.float16 else 1e4
    flat[rng.integers(0, n), rng.integers(0, flat.shape[1])] = -np.inf
    if n > 3:
        flat[rng.integers(0, n), rng.integers(0, flat.shape[1])] = np.inf
        flat[rng.integers(0, n), rng.integers(0, flat.shape[1])] = np.nan
        flat[n - 1] = -np.inf
    return x


def _softmax_ref(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_softmax_pipelined_equals_unpipelined_and_numpy(shape, dtype, rng):
    x = _with_specials((rng.standard_normal(shape) * 4).astype(dtype), rng)
    got, source = _both(lambda v: ops.softmax(v, -1), x)
    many_rows = int(np.prod(shape[:-1])) > 1 and shape[-1] > 1  # else no loop over rows
    pipelined = bool(re.search(r"nacc\d+ = nacc\d+ >", source) and "in0[rn * " in source)
    assert pipelined == many_rows, source
    want = _softmax_ref(x)
    tol = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-13}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * 1e-3)


@pytest.mark.parametrize("shape", SHAPES[:6])
def test_log_softmax_pipelined_equals_unpipelined_and_numpy(shape, rng):
    x = _with_specials((rng.standard_normal(shape) * 4).astype(np.float32), rng)
    got, _ = _both(lambda v: ops.log_softmax(v, -1), x)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        shifted = x64 - x64.max(-1, keepdims=True)
        want = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-5)


@pytest.mark.parametrize("shape", [(1, 7), (33, 1000), (65, 1024), (300, 700), (6, 2048)])
def test_layer_norm_pipelined_equals_unpipelined_and_numpy(shape, rng):
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    x[0] *= 1e4
    if shape[0] > 2:
        x[1, 0] = np.nan
    gamma = rng.standard_normal(shape[-1]).astype(np.float32)
    beta = rng.standard_normal(shape[-1]).astype(np.float32)
    got, source = _both(lambda v, g, b: ops.layer_norm(v, (shape[-1],), g, b, 1e-5),
                        x, gamma, beta)
    # Rows up to ROW_BLOCK carry their mean from row to row; longer rows sum the next row in
    # blocks, with a pairwise total of its own.
    assert ("nacc" in source) == (shape[0] > 1), source
    assert ("npw" in source) == (shape[0] > 1 and shape[-1] > c_loops.ROW_BLOCK), source
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    want = (x64 - mean) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * gamma + beta
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_softmax_of_many_rows_reads_the_next_row_in_its_exp_pass():
    """The kernel's shape: chunks of ROW_PIPELINE_ROWS rows on the threads; the exp pass over row
    i0 also takes the max of row rn (i0 + 1), and exp is called once per element."""
    from test_generated_c import exp_calls, softmax_source
    source = softmax_source((8192, 1024), np.float32)
    assert "#pragma omp parallel for schedule(static)\n  for (int64_t rc = 0; rc < 256;" in \
        source, source
    (call,) = exp_calls(source)
    body = source.splitlines()
    at = next(i for i, line in enumerate(body) if line.strip() == call)
    pragma = max(i for i in range(at) if "#pragma omp simd" in body[i])
    following = next(i for i in range(at, len(body)) if "#pragma omp simd" in body[i])
    assert "reduction(max:nacc0)" in body[pragma], source
    assert "in0[rn * 1024 + i1]" in "\n".join(body[at:following]), source
    assert "const int64_t rn = i0 + 1 < rhi ? i0 + 1 : i0;" in source


def _softmax_source(shape: tuple[int, ...], blocking: c_loops.LoopBlocking) -> str:
    """test_generated_c's Softmax kernel, emitted with `blocking`."""
    from graphkernel.backends.c.c_emitter import emit_kernel
    from graphkernel.graph_kernel.expanders import expand_node
    from graphkernel.graph_kernel.schedule import analyze
    from graphkernel.ir.graph import Input, Node
    from graphkernel.ir.types import TensorType
    x = Input(TensorType(shape, np.dtype(np.float32)), "x")
    sub = expand_node(Node("Softmax", [x], {"axis": -1}, x.type)).subgraph
    assert sub is not None
    config = CConfig()
    return emit_kernel(sub, "gk_Softmax", analyze(sub.nodes, sub.outputs),
                       config.parallel_threshold, config.stream_min_bytes,
                       blocking=blocking).source


def test_without_the_pipeline_the_max_has_a_pass_of_its_own():
    source = _softmax_source((8192, 1024), c_loops.LoopBlocking(row_pipeline_rows=0))
    assert "nacc" not in source and not re.search(r"\brn\b", source)
    assert source.count("#pragma omp simd") == 3


@pytest.mark.parametrize("rows", [1, 8, 128])
def test_each_pipeline_depth_chunks_the_rows_and_equals_the_unpipelined_kernel(rows, rng):
    """The rows per chunk are a knob (tuning tries 8 and 128 beside 32): the chunk loop takes
    the depth; results equal the unpipelined kernel's, on row counts no depth divides."""
    source = _softmax_source((8192, 1024), c_loops.LoopBlocking(row_pipeline_rows=rows))
    assert f"rc < {-(-8192 // rows)};" in source and f"rlo = rc * {rows}," in source, source
    x = _with_specials((rng.standard_normal((203, 333)) * 4).astype(np.float32), rng)
    got, _ = _both(lambda v: ops.softmax(v, -1), x, rows=rows)
    np.testing.assert_allclose(got, _softmax_ref(x), rtol=2e-6, atol=2e-9)


class _Normalize(graphkernel.nn.Cell):
    """d = x - sum(x), d / sqrt(sum(d d)) over the last axis (sums: a mean would divide by the
    run-time length): a first pass that is a float sum."""

    def __init__(self) -> None:
        super().__init__()
        self.sum = P.ReduceSum(keep_dims=True)
        self.rsqrt = P.Rsqrt()

    def construct(self, x):
        d = x - self.sum(x, -1)
        return d * self.rsqrt(self.sum(d * d, -1))


@pytest.mark.parametrize("rows, width", [(5, 3000), (40, 700), (33, 1024)])
def test_a_row_of_run_time_length_is_pipelined_with_its_sums_in_blocks(rows, width, rng):
    """A normalisation over [N, M] declared dynamic: the generic kernel carries the next row's
    sum in blocks with a pairwise total of its own, and equals the static kernel bit for
    bit (which sums a row up to ROW_BLOCK in one accumulator, as a dynamic row's last
    block does)."""
    x = (rng.standard_normal((rows, width)) * 3 + 1).astype(np.float32)
    context.set_context(enable_graph_kernel=True)
    static = _Normalize()(Tensor(x)).asnumpy()
    net = _Normalize()
    net.set_inputs(Tensor(shape=[None, None], dtype=graphkernel.float32))
    got = net(Tensor(x)).asnumpy()
    (exe,) = {id(v): v for v in net._compiled.values()}.values()
    assert exe.kernel_count == 1, exe.summary()
    source = exe.kernels[0].source
    assert "nacc" in source and "npw" in source and "const int64_t rn = " in source, source
    np.testing.assert_array_equal(got, static)
    x64 = x.astype(np.float64)
    d = x64 - x64.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, d / np.sqrt((d * d).sum(-1, keepdims=True)), rtol=1e-4,
                               atol=1e-6)
