"""q, k and v as sums the attention step adds up as it loads (graph_kernel/attention.py
`_sum_of_views`, backends/c/c_attention.py): a projection's head split with its bias (a fused
group of layout ops and one Add) runs no kernel of its own. The encoder layer at sizes the
kernel does not special-case (sequences past no whole vector, 3 and 5 heads, head sizes of
88, 64 and 128) matches numpy and the plan that keeps those groups as steps, with three kernels
fewer; an exporter's ONNX block, whose k is stored transposed, matches ONNX Runtime; a group
that something else reads too keeps its step. (Each head split moves over 1 MiB
here: smaller ones are launched as one kernel by parallel fusion, a group of three results
that the step does not take.)"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cells import ON, Fn, needs_openmp

import graphkernel
from graphkernel.graph_kernel import attention
from graphkernel.graph_kernel.lower import KernelKind
from graphkernel.ops import operations as P

pytestmark = needs_openmp


def encoder_params(hidden: int, rng: Any) -> dict[str, np.ndarray]:
    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    p = {f"w{n}": w(hidden, hidden) for n in "qkvo"}
    p.update({f"b{n}": w(hidden) for n in ("q", "k", "v", "o", "2")})
    p.update(w1=w(4 * hidden, hidden), b1=w(4 * hidden), w2=w(hidden, 4 * hidden))
    p.update({g: (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
              for g in ("g1", "g2")})
    p.update({b: w(hidden) for b in ("be1", "be2")})
    return p


def attention_steps(exe: Any) -> list[Any]:
    return [s for s in exe.plan.steps
            if s.kernel is not None and s.kernel.kind is KernelKind.ATTENTION]


@pytest.mark.parametrize("batch,seq,hidden,heads",
                         [(3, 173, 264, 3), (2, 257, 320, 5), (4, 131, 256, 2)])
def test_the_encoder_adds_its_biases_in_the_attention_step(
        batch: int, seq: int, hidden: int, heads: int, rng: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.gk_cells import EncoderLayer
    from bench.workloads import np_encoder
    p = encoder_params(hidden, rng)
    x = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    exe = graphkernel.compile(EncoderLayer(p, batch, seq, hidden, heads), x, options=ON)
    (step,) = attention_steps(exe)
    # q, k, v as the projections wrote them, then the three biases
    assert len(step.reads) == 6, step
    assert step.op_names.count("Add") == 3 and step.op_names.count("BroadcastTo") == 3
    assert "added up as loaded" in exe.plan.describe()
    got = exe.run_arrays(x)[0]
    want = np_encoder(x.astype(np.float64), {k: v.astype(np.float64) for k, v in p.items()},
                      heads)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    with monkeypatch.context() as m:  # the head splits as steps of their own
        m.setattr(attention, "FOLD_SUMS", False)
        apart = graphkernel.compile(EncoderLayer(p, batch, seq, hidden, heads), x, options=ON)
    (alone,) = attention_steps(apart)
    assert len(alone.reads) == 3
    kernels = [sum(s.kernel is not None for s in e.plan.steps) for e in (exe, apart)]
    assert kernels[0] == kernels[1] - 3
    np.testing.assert_allclose(got, apart.run_arrays(x)[0], rtol=1e-5, atol=1e-5)


def head_split_attention(returns_q: bool) -> Any:
    """x [b, s, h*d] + bias, split into heads, as q, k and v of one attention; the head split
    of q returned too when `returns_q`."""
    def fn(x: Any, bias: Any) -> Any:
        b, s, hd = x.shape
        heads, d = 3, hd // 3
        summed = P.Add()(x, P.BroadcastTo((b, s, hd))(bias))
        q = P.Transpose()(P.Reshape()(summed, (b, s, heads, d)), (0, 2, 1, 3))
        scores = P.Mul()(P.BatchMatMul(transpose_b=True)(q, q), 0.5)
        ctx = P.BatchMatMul()(P.Softmax(axis=-1)(scores), q)
        return (ctx, q) if returns_q else ctx
    return fn


def test_a_sum_read_elsewhere_keeps_its_step(rng: Any) -> None:
    x = rng.standard_normal((2, 11, 24)).astype(np.float32)
    bias = rng.standard_normal(24).astype(np.float32)
    exe = graphkernel.compile(Fn(head_split_attention(True)), x, bias, options=ON)
    (step,) = attention_steps(exe)
    assert len(step.reads) == 3 and "added up as loaded" not in exe.plan.describe()
    ctx, q = exe.run_arrays(x, bias)
    want_q = (x + bias).reshape(2, 11, 3, 8).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(q, want_q, rtol=1e-6)
    s = want_q.astype(np.float64) @ np.swapaxes(want_q, -1, -2) * 0.5
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(ctx, (e / e.sum(-1, keepdims=True)) @ want_q, rtol=1e-5,
                               atol=1e-5)


def test_an_onnx_encoder_block_reads_k_transposed_with_its_bias(
        rng: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exporter's block (tests/onnx_models.py): MatMul, Add of the bias, Reshape, then
    Transpose to [b, h, d, s] for k, so the step reads k transposed, bias included."""
    pytest.importorskip("onnxruntime")
    from onnx_models import encoder_block, onnxruntime_outputs

    from graphkernel import nn
    from graphkernel.frontend import context
    made = encoder_block(rng, seq=131, hidden=264, heads=3)
    made.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 8  # static: one plan
    x = rng.standard_normal((8, 131, 264)).astype(np.float32)
    context.set_context(enable_graph_kernel=True)
    outs = []
    for fold in (True, False):
        with monkeypatch.context() as m:
            m.setattr(attention, "FOLD_SUMS", fold)
            cell = nn.GraphCell(graphkernel.load(made))
            outs.append(cell(graphkernel.Tensor(x)).asnumpy())
            (step,) = attention_steps(cell.compiled)
            assert len(step.reads) == (6 if fold else 3)
            assert step.lowering.attention.transpose[1]  # k stored as [b, h, d, s]
    expected, = onnxruntime_outputs(made, {"x": x})
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(outs[0], expected, rtol=1e-4, atol=1e-4 * scale)
