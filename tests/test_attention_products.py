"""Attention's per-head products on graphkernel's small-product kernel (backends/c/c_gemm.py
`small_product`): a float32 stack of small products runs `gk_small_sgemm` from the compiled
entry instead of one BLAS call per product, with the same results as numpy, the Python runner
and fusion off; the choice is named per product, survives a warm build, and a training step's
gradients through it match the unfused step's."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cells import OFF, ON, Fn, needs_openmp

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c import backend
from graphkernel.backends.c.c_gemm import SMALL_PRODUCT_LABEL, gemm_call, small_product
from graphkernel.frontend import compile_cache
from graphkernel.graph_kernel import lower
from graphkernel.ops import operations as P

pytestmark = needs_openmp


@pytest.fixture(autouse=True)
def three_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lowering's attention step (tests/test_fused_attention.py) off: these tests are about
    the products it would take in."""
    monkeypatch.setattr(lower, "attention_blocks", lambda graph, views: ({}, {}))


def relu(x: Any) -> Any:
    return P.ReLU()(x)  # a kernel after the product: the plan has a library to hold the entry


def attention(q: Any, k: Any, v: Any) -> Any:
    scores = P.Softmax()(P.Mul()(P.BatchMatMul(transpose_b=True)(q, k), 0.125))
    b, h, s, d = q.shape
    return relu(P.Reshape()(P.Transpose()(P.BatchMatMul()(scores, v), (0, 2, 1, 3)),
                            (b, s, h * d)))


def attention_numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = (q @ np.swapaxes(k, -1, -2)) * np.float32(0.125)
    e = np.exp(s - s.max(-1, keepdims=True))
    ctx = (e / e.sum(-1, keepdims=True)) @ v
    b, h, n, d = q.shape
    return np.maximum(ctx.transpose(0, 2, 1, 3).reshape(b, n, h * d), 0)


def products(exe: Any) -> list[Any]:
    return [s for s in exe.plan.steps if s.op in ("MatMul", "BatchMatMul")]


def by_runner(exe: Any, *arrays: np.ndarray) -> list[np.ndarray]:
    ex = exe.executable
    return ex.runner.run(ex.check_inputs(list(arrays)), exe._weights())


def test_attention_products_run_on_the_small_product_kernel(rng: Any) -> None:
    q, k, v = (rng.standard_normal((2, 3, 128, 64)).astype(np.float32) for _ in range(3))
    exe = graphkernel.compile(Fn(attention), q, k, v, options=ON)
    steps = products(exe)
    assert len(steps) == 2 and exe.executable.runner.entry is not None
    assert [s.attrs.get("gemm_library") for s in steps] == [SMALL_PRODUCT_LABEL] * 2
    assert f"blas='{SMALL_PRODUCT_LABEL}'" in exe.plan.describe()
    source = exe.executable.library.source
    # the scores (B transposed: packed) and the context written through the head merge's view
    assert source.count("gk_small_sgemm(0, 1, 128, 128, 64,") == 1
    assert source.count("gk_small_sgemm(0, 0, 128, 64, 128,") == 1
    assert "gk_sgemm(101" not in source  # no BLAS call left
    want = attention_numpy(q, k, v)
    got = exe(Tensor(q), Tensor(k), Tensor(v)).asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(by_runner(exe, q, k, v)[0], got, rtol=1e-5, atol=1e-6)
    off = graphkernel.compile(Fn(attention), q, k, v, options=OFF)
    np.testing.assert_allclose(off(Tensor(q), Tensor(k), Tensor(v)).asnumpy(), got,
                               rtol=1e-5, atol=1e-6)


# (batch, m, n, k, transpose_a, transpose_b): rows past the last block of 8, a last half tile
# of 16 columns, columns past the last whole vector, operands either way round
SHAPES = [(3, 13, 40, 7, False, False), (2, 8, 48, 33, True, False),
          (4, 9, 24, 5, False, True), (2, 17, 17, 64, True, True), (2, 1, 16, 1, False, True),
          (2, 64, 256, 64, False, False)]


@pytest.mark.parametrize("batch,m,n,k,ta,tb", SHAPES)
def test_small_products_match_numpy_in_every_layout(batch: int, m: int, n: int, k: int,
                                                     ta: bool, tb: bool, rng: Any) -> None:
    a = rng.standard_normal((batch, k, m) if ta else (batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, n, k) if tb else (batch, k, n)).astype(np.float32)

    def fn(a: Any, b: Any) -> Any:
        return relu(P.BatchMatMul(transpose_a=ta, transpose_b=tb)(a, b))
    exe = graphkernel.compile(Fn(fn), a, b, options=ON)
    (step,) = products(exe)
    call = gemm_call(exe.plan, step)
    assert call is not None and small_product(call)
    assert step.attrs.get("gemm_library") == SMALL_PRODUCT_LABEL
    assert exe.executable.runner.entry is not None
    want = np.maximum((np.swapaxes(a, 1, 2) if ta else a) @ (np.swapaxes(b, 1, 2) if tb else b),
                      0)
    got = exe(Tensor(a), Tensor(b)).asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("what", ["float64", "wide", "one product", "narrow"])
def test_products_outside_the_rule_stay_on_blas(what: str, rng: Any) -> None:
    shapes = {"float64": [(2, 16, 32), (2, 32, 16)], "wide": [(2, 16, 300), (2, 300, 16)],
              "one product": [(16, 32), (32, 16)], "narrow": [(2, 16, 32), (2, 32, 8)]}[what]
    dtype = np.float64 if what == "float64" else np.float32
    a, b = (rng.standard_normal(s).astype(dtype) for s in shapes)
    op = P.MatMul() if what == "one product" else P.BatchMatMul()
    exe = graphkernel.compile(Fn(lambda a, b: relu(op(a, b))), a, b, options=ON)
    (step,) = products(exe)
    assert step.attrs.get("gemm_library") != SMALL_PRODUCT_LABEL
    assert "gk_small_sgemm" not in exe.executable.library.source
    np.testing.assert_allclose(exe(Tensor(a), Tensor(b)).asnumpy(), np.maximum(a @ b, 0),
                               rtol=1e-5, atol=1e-5)


def test_a_warm_build_keeps_the_small_product_kernel_and_writes_no_c(
        monkeypatch: pytest.MonkeyPatch, cache_folder: str, rng: Any) -> None:
    """The plan record names the product's library as graphkernel's label; a record with it is
    used, not refused as an unknown library."""
    monkeypatch.setenv(compile_cache.ENV, "0")
    emitted: list[str] = []
    emit = backend.CBackend._emit

    def counting(self: Any, spec: Any, config: Any) -> Any:
        emitted.append(spec.name)
        return emit(self, spec, config)
    monkeypatch.setattr(backend.CBackend, "_emit", counting)
    q, k, v = (rng.standard_normal((1, 2, 32, 16)).astype(np.float32) for _ in range(3))
    cold = graphkernel.compile(Fn(attention), q, k, v, options=ON)
    written = len(emitted)
    assert written and not cold.from_cache
    warm = graphkernel.compile(Fn(attention), q, k, v, options=ON)
    assert len(emitted) == written, f"a warm build wrote C for {emitted[written:]}"
    assert warm.from_cache and warm.library_path == cold.library_path
    assert [s.attrs.get("gemm_library") for s in products(warm)] == [SMALL_PRODUCT_LABEL] * 2
    np.testing.assert_array_equal(warm(Tensor(q), Tensor(k), Tensor(v)).asnumpy(),
                                  cold(Tensor(q), Tensor(k), Tensor(v)).asnumpy())


def test_an_encoder_training_step_through_the_kernel_matches_the_unfused_step(rng: Any) -> None:
    """Forward and backward attention products (A or B transposed) on the kernel: two SGD
    steps of a 2-layer encoder (weights move by the gradient itself: Adam's normalisation
    would blow up the rounding of near-zero gradients) give the unfused step's losses and
    weights."""
    from bench.real_models import encoder_params, gk_encoder
    batch, seq, hidden, heads = 2, 32, 64, 2
    x = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    target = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    params = encoder_params(2, hidden, 128, seed=3)
    results = {}
    for name, options in (("fused", ON), ("unfused", OFF)):
        class WithLoss(nn.Cell):
            def __init__(self) -> None:
                super().__init__()
                self.net = gk_encoder(params, batch, seq, hidden, heads)
                self.sum, self.square = P.ReduceSum(), P.Square()

            def construct(self, x: Any, target: Any) -> Any:
                return self.sum(self.square(self.net(x) - target)) * (0.5 / batch)

        loss = WithLoss()
        initial = [p.asnumpy().copy() for p in loss.trainable_params()]
        step = nn.TrainOneStepCell(loss, nn.SGD(loss.trainable_params(), 0.1))
        step.set_train(True)
        exe = graphkernel.compile(step, x, target, options=options)
        if name == "fused":
            labels = [s.attrs.get("gemm_library") for s in products(exe)
                      if s.op == "BatchMatMul"]
            assert len(labels) >= 8 and set(labels) == {SMALL_PRODUCT_LABEL}, labels
            assert exe.executable.runner.entry is not None
        losses = [float(np.asarray(exe.run_arrays(x, target)[0])) for _ in range(2)]
        results[name] = (losses, [p.asnumpy() - q for p, q in
                                  zip(loss.trainable_params(), initial)])
    (fused_losses, fused_moves), (losses, moves) = results["fused"], results["unfused"]
    np.testing.assert_allclose(fused_losses, losses, rtol=1e-5)
    assert losses[1] != losses[0]
    # 0.1 x the sum of two steps' gradients; some are rounding alone (the keys' bias: softmax
    # is blind to it), so the bound is relative to the largest move
    scale = max(np.abs(m).max() for m in moves)
    for got, want in zip(fused_moves, moves):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale)
