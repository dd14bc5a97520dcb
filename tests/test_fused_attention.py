"""Attention as one step (graph_kernel/attention.py, backends/c/c_attention.py): the scores
product, the scale/mask/softmax group and the context product of an inference graph run as one
kernel per call, head by head, with the same results as numpy, fusion off, the unfused plan and
the Python runner; the encoder layer and BERT-tiny plan one such step per layer, and a
training step, whose gradient reads the probabilities, keeps the three steps."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cells import OFF, ON, Fn, needs_openmp

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.graph_kernel import lower
from graphkernel.graph_kernel.lower import KernelKind
from graphkernel.ops import operations as P

pytestmark = needs_openmp


def relu(x: Any) -> Any:
    return P.ReLU()(x)


def attention(scale: float, masked: bool) -> Any:
    """q, k, v [b, h, s, d] (and an additive mask [b, 1, 1, s]) -> relu(head merge of the
    context) [b, s, h * d]."""
    def fn(q: Any, k: Any, v: Any, *mask: Any) -> Any:
        scores = P.Mul()(P.BatchMatMul(transpose_b=True)(q, k), scale)
        if masked:
            scores = P.Add()(scores, mask[0])
        ctx = P.BatchMatMul()(P.Softmax(axis=-1)(scores), v)
        b, h, s, d = q.shape
        return relu(P.Reshape()(P.Transpose()(ctx, (0, 2, 1, 3)), (b, s, h * d)))
    return fn


def attention_numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                    mask: np.ndarray | None) -> np.ndarray:
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        s = s + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    ctx = (e / e.sum(-1, keepdims=True)) @ v
    b, h, n, d = q.shape
    return np.maximum(ctx.transpose(0, 2, 1, 3).reshape(b, n, h * d), 0)


def kinds(exe: Any) -> list[KernelKind | None]:
    return [s.lowering.kind if s.lowering is not None else None for s in exe.plan.steps]


def by_runner(exe: Any, *arrays: np.ndarray) -> list[np.ndarray]:
    ex = exe.executable
    return ex.runner.run(ex.check_inputs(list(arrays)), exe._weights())


@pytest.fixture
def three_steps(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Compile with lowering's attention step switched off: the unfused plan."""
    def compile_unfused(*args: Any, **kwargs: Any) -> Any:
        with monkeypatch.context() as m:
            m.setattr(lower, "attention_blocks", lambda graph, views: ({}, {}))
            return graphkernel.compile(*args, **kwargs)
    return compile_unfused


# (batch, heads, sequence, head size): one key, a sequence past no whole vector, BERT's sizes
SHAPES = [(2, 1, 1, 16), (2, 3, 7, 16), (1, 12, 128, 64), (2, 2, 128, 16)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("batch,heads,seq,size", SHAPES)
def test_one_attention_step_matches_numpy_and_the_unfused_plan(
        batch: int, heads: int, seq: int, size: int, masked: bool, dtype: Any, rng: Any,
        three_steps: Any) -> None:
    q, k, v = (rng.standard_normal((batch, heads, seq, size)).astype(dtype) for _ in range(3))
    arrays = [q, k, v]
    mask = None
    if masked:  # BERT's additive mask: -10000 past each sequence's length
        keep = rng.random((batch, 1, 1, seq)) < 0.7
        keep[..., 0] = True
        mask = np.where(keep, 0, -10000).astype(dtype)
        arrays.append(mask)
    scale = 1 / np.sqrt(size)
    fn = attention(scale, masked)
    exe = graphkernel.compile(Fn(fn), *arrays, options=ON)
    assert kinds(exe).count(KernelKind.ATTENTION) == 1
    assert not {"BatchMatMul", "Softmax"} & {s.op for s in exe.plan.steps}
    assert exe.executable.runner.entry is not None
    got = exe(*(Tensor(a) for a in arrays)).asnumpy()
    assert got.dtype == dtype
    tol = dict(rtol=2e-5, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(got, attention_numpy(q, k, v, scale, mask), **tol)
    np.testing.assert_allclose(by_runner(exe, *arrays)[0], got, **tol)
    unfused = three_steps(Fn(fn), *arrays, options=ON)
    assert kinds(unfused).count(KernelKind.ATTENTION) == 0
    np.testing.assert_allclose(unfused(*(Tensor(a) for a in arrays)).asnumpy(), got, **tol)
    off = graphkernel.compile(Fn(fn), *arrays, options=OFF)
    np.testing.assert_allclose(off(*(Tensor(a) for a in arrays)).asnumpy(), got, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_onnx_form_divides_by_the_scale_with_rank_4_matmuls(dtype: Any, rng: Any) -> None:
    """As torch exports attention to ONNX (and graphkernel.load imports it): MatMul of rank 4
    for both products and the scores divided by sqrt(d), not multiplied."""
    b, h, n, d = 2, 3, 9, 16
    q, k, v = (rng.standard_normal((b, h, n, d)).astype(dtype) for _ in range(3))
    root = float(np.sqrt(d))

    def fn(q: Any, k: Any, v: Any) -> Any:
        scores = P.Div()(P.MatMul()(q, P.Transpose()(k, (0, 1, 3, 2))), root)
        ctx = P.MatMul()(P.Softmax(axis=-1)(scores), v)
        return relu(P.Reshape()(P.Transpose()(ctx, (0, 2, 1, 3)), (b, n, h * d)))
    exe = graphkernel.compile(Fn(fn), q, k, v, options=ON)
    assert kinds(exe).count(KernelKind.ATTENTION) == 1
    assert not {"MatMul", "Softmax"} & {s.op for s in exe.plan.steps}
    got = exe(Tensor(q), Tensor(k), Tensor(v)).asnumpy()
    tol = dict(rtol=2e-5, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(got, attention_numpy(q, k, v, 1 / root, None), **tol)
    off = graphkernel.compile(Fn(fn), q, k, v, options=OFF)
    np.testing.assert_allclose(off(Tensor(q), Tensor(k), Tensor(v)).asnumpy(), got, **tol)


def test_the_plan_names_the_step_and_its_members(rng: Any) -> None:
    q, k, v = (rng.standard_normal((1, 2, 16, 16)).astype(np.float32) for _ in range(3))
    exe = graphkernel.compile(Fn(attention(0.25, False)), q, k, v, options=ON)
    text = exe.plan.describe()
    assert "BatchMatMul_1_attention" in text
    assert "# attention: BatchMatMul, Fused_Mul_Softmax, BatchMatMul_1: head by head, " \
        "scores kept in cache" in text, text


def encoder_steps(layers: int, batch: int = 2, seq: int = 16, hidden: int = 32,
                  heads: int = 2) -> tuple[Any, np.ndarray]:
    from bench.real_models import encoder_params, gk_encoder
    params = encoder_params(layers, hidden, 64, seed=1)
    x = np.random.default_rng(0).standard_normal((batch, seq, hidden)).astype(np.float32)
    return gk_encoder(params, batch, seq, hidden, heads), x


def test_the_encoder_layer_plans_one_attention_step(three_steps: Any) -> None:
    """The step replaces the scores product, the softmax kernel and the context product: two
    steps fewer, as many kernels (the softmax's becomes the attention's), no product left
    but the layer's dense ones."""
    net, x = encoder_steps(1)
    exe = graphkernel.compile(net, x, options=ON)
    steps = exe.plan.steps
    assert kinds(exe).count(KernelKind.ATTENTION) == 1
    attention_step = next(s for s in steps if s.kernel is not None and
                          s.kernel.kind is KernelKind.ATTENTION)
    assert attention_step.op_names[0] == "BatchMatMul"  # the head merge written in place:
    assert attention_step.op_names[-3:] == ("BatchMatMul", "Transpose", "Reshape")
    assert "Exp" in attention_step.op_names and len(attention_step.reads) == 3
    net2, _ = encoder_steps(1)
    unfused = three_steps(net2, x, options=ON)
    assert len(steps) == len(unfused.plan.steps) - 2
    assert sum(s.kernel is not None for s in steps) == \
        sum(s.kernel is not None for s in unfused.plan.steps)
    assert [s.op for s in steps if s.op in ("MatMul", "BatchMatMul")] == ["MatMul"] * 6
    np.testing.assert_allclose(exe.run_arrays(x)[0], unfused.run_arrays(x)[0],
                               rtol=1e-5, atol=1e-5)


def test_bert_tiny_plans_one_masked_attention_step_per_layer(rng: Any) -> None:
    from bench.gk_cells import make_cell
    from bench.workloads import full_suite, input_sets
    w = next(w for w in full_suite() if w.key.startswith("bert_tiny"))
    sets, params = input_sets(w, [0])
    arrays = list(sets[0].values())
    exe = graphkernel.compile(make_cell(w, params), *arrays, options=ON)
    fused = [s for s in exe.plan.steps
             if s.kernel is not None and s.kernel.kind is KernelKind.ATTENTION]
    # q, k, v (the projections, before their head split), the mask, then the three biases:
    # each head split + bias group is added up by the attention step as it loads
    assert len(fused) == 2 and all(len(s.reads) == 7 for s in fused)
    assert not any(s.kernel is not None and s.op_names[-1] == "Add" and "Transpose" in
                   s.op_names and "ReduceSum" not in s.op_names for s in exe.plan.steps)
    assert not any(s.op == "BatchMatMul" for s in exe.plan.steps)
    off = graphkernel.compile(make_cell(w, params), *arrays, options=OFF)
    for got, want in zip(exe.run_arrays(*arrays), off.run_arrays(*arrays)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_training_step_keeps_the_three_steps(rng: Any) -> None:
    """The gradient reads the probabilities (SoftmaxGrad): no attention step, and the reason is
    on the context product's step."""
    net, x = encoder_steps(1)
    target = rng.standard_normal(x.shape).astype(np.float32)

    class WithLoss(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.net = net
            self.sum, self.square = P.ReduceSum(), P.Square()

        def construct(self, x: Any, target: Any) -> Any:
            return self.sum(self.square(self.net(x) - target))

    loss = WithLoss()
    step = nn.TrainOneStepCell(loss, nn.SGD(loss.trainable_params(), 0.01))
    step.set_train(True)
    exe = graphkernel.compile(step, x, target, options=ON)
    assert KernelKind.ATTENTION not in kinds(exe)
    assert sum(s.op == "BatchMatMul" for s in exe.plan.steps) >= 2
    assert "three steps, not one attention step: the probabilities" in exe.plan.describe()


def test_heads_split_from_the_inputs(rng: Any) -> None:
    """q, k, v split into heads by a Reshape and Transpose of the call's inputs."""
    b, s, h, d = 2, 24, 3, 16

    def fn(xq: Any, xk: Any, xv: Any) -> Any:
        def split(t: Any) -> Any:
            return P.Transpose()(P.Reshape()(t, (b, s, h, d)), (0, 2, 1, 3))
        scores = P.Mul()(P.BatchMatMul(transpose_b=True)(split(xq), split(xk)), 0.25)
        ctx = P.BatchMatMul()(P.Softmax(axis=-1)(scores), split(xv))
        return relu(P.Reshape()(P.Transpose()(ctx, (0, 2, 1, 3)), (b, s, h * d)))

    xs = [rng.standard_normal((b, s, h * d)).astype(np.float32) for _ in range(3)]
    exe = graphkernel.compile(Fn(fn), *xs, options=ON)
    assert kinds(exe).count(KernelKind.ATTENTION) == 1
    q, k, v = (x.reshape(b, s, h, d).transpose(0, 2, 1, 3) for x in xs)
    got = exe(*(Tensor(x) for x in xs)).asnumpy()
    np.testing.assert_allclose(got, attention_numpy(q, k, v, 0.25, None), rtol=2e-5, atol=2e-6)
    off = graphkernel.compile(Fn(fn), *xs, options=OFF)
    np.testing.assert_allclose(off(*(Tensor(x) for x in xs)).asnumpy(), got,
                               rtol=2e-5, atol=2e-6)


def causal_attention(q: Any, k: Any, v: Any, keep: Any) -> Any:
    """GPT-2's export: an additive mask computed in the graph (a Select of the causal pattern
    and the padding mask, 0 or -1e9), read by the scores' Add alone."""
    seq = q.shape[2]
    allowed = P.LogicalAnd()(Tensor(np.tril(np.ones((seq, seq), np.bool_))), keep)
    mask = P.Select()(allowed, Tensor(np.float32(0)), Tensor(np.float32(-1e9)))
    scores = P.Add()(P.Mul()(P.BatchMatMul(transpose_b=True)(q, k), 0.125), mask)
    return P.BatchMatMul()(P.Softmax(axis=-1)(scores), v)


def causal_numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray) -> np.ndarray:
    allowed = np.tril(np.ones((q.shape[2], q.shape[2]), np.bool_)) & keep
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) * 0.125 + np.where(allowed, 0, -1e9)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def test_a_mask_computed_in_the_graph_stays_apart_so_attention_is_one_step(
        rng: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from graphkernel.graph_kernel import attention as attention_module

    b, h, n, d = 2, 2, 24, 64
    q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float32) for _ in range(3))
    keep = np.ones((b, 1, 1, n), np.bool_)
    keep[1, ..., n - 5:] = False  # padding at the end of the second sequence
    arrays = (q, k, v, keep)
    exe = graphkernel.compile(Fn(causal_attention), *arrays, options=ON)
    assert kinds(exe).count(KernelKind.ATTENTION) == 1, exe.summary()
    # the mask is a kernel of its own, and the report says why it was kept apart
    assert any("attention scores stays an attention step's" in r.detail for r in exe.reasons)
    got = exe(*(Tensor(a) for a in arrays)).asnumpy()
    np.testing.assert_allclose(got, causal_numpy(*arrays), rtol=2e-5, atol=2e-6)
    # merged (the rule off): three steps, the same results
    monkeypatch.setattr(attention_module, "KEEP_MASKS_APART", False)
    monkeypatch.setenv("GRAPHKERNEL_COMPILE_CACHE", "0")  # the same graph, planned again
    merged = graphkernel.compile(Fn(causal_attention), *arrays, options=ON)
    assert kinds(merged).count(KernelKind.ATTENTION) == 0
    np.testing.assert_allclose(merged(*(Tensor(a) for a in arrays)).asnumpy(), got,
                               rtol=2e-5, atol=2e-6)
