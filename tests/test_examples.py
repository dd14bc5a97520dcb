"""The example networks in examples/: they run, their answers match numpy written here from
their parameters, fusion on and off agree, and their launches are counted."""
import importlib.util
import math
import pathlib
import re

import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor
from graphkernel.graph_kernel.pipeline import CompileOptions

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)


def load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # six epochs of training
def test_cnn_digits_trains_end_to_end_and_its_epilogues_fuse():
    cnn = load("cnn_digits")
    trained = {}
    try:
        for fusion in (False, True):
            graphkernel.context.set_context(enable_graph_kernel=fusion)
            trained[fusion] = cnn.train(n_train=400, epochs=3)
    finally:
        graphkernel.context.set_context(enable_graph_kernel=False)
    # Fusion on and off take the same steps. In float32 they round differently, and training
    # amplifies that step by step: the first dozen steps agree to 1e-4, later ones drift
    # (about 1% after 20 steps).
    on, off = trained[True][0].losses, trained[False][0].losses
    np.testing.assert_allclose(on[:12], off[:12], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(on, off, rtol=3e-2, atol=5e-3)
    net, (x_train, y_train, x_test, y_test) = trained[True]
    losses = net.losses
    assert np.mean(losses[-5:]) < 0.25 * np.mean(losses[:5]), losses
    # Every layer learned, not only the head: the convolutions and BatchNorms moved from their
    # seeded initialisation and BatchNorm's moving statistics were written. A convolution's
    # bias before a training-mode BatchNorm has a zero gradient (the batch mean removes it):
    # only rounding moves it.
    graphkernel.set_seed(0)
    fresh = dict(cnn.DigitsCNN().parameters_and_names())
    for name, param in net.parameters_and_names():
        before, after = fresh[name].asnumpy(), param.asnumpy()
        if name.endswith("conv.bias"):
            np.testing.assert_allclose(after, before, atol=1e-5, err_msg=name)
        else:
            assert np.abs(after - before).max() > 1e-3, name
    assert cnn.accuracy(net, x_test[:400], y_test[:400]) > 0.9
    on = graphkernel.compile(net, x_test[:64], options=ON)
    off = graphkernel.compile(net, x_test[:64], options=OFF)
    logits_on, logits_off = on.run_arrays(x_test[:64])[0], off.run_arrays(x_test[:64])[0]
    np.testing.assert_allclose(logits_on, logits_off, rtol=1e-4, atol=1e-4)
    kernels = on.kernels
    # Each BatchNorm is folded into its convolution's weights (the report says so), and each
    # convolution runs as one kernel with the group after it (backends/c/c_conv_block.py): the
    # bias, the BatchNorm's per-channel shift, the residual add and the ReLU over each image's
    # tile, and the max pool that follows blocks 1 and 3.
    blocks = [k for k in kernels if k.op_names[0] == "Conv2DFoldedBN"]
    assert len(blocks) == 3 and all(k.backend == "native" for k in blocks)
    assert len([line for line in on.report.rewrites if "folded into Conv2D" in line]) == 3
    assert "rewrites:" in on.summary()
    for block in blocks:
        assert {"Rsqrt", "Mul", "Add", "Maximum"} <= set(block.op_names), kernels
    assert [k.op_names[-1] for k in blocks] == ["MaxPool", "Maximum", "MaxPool"]
    assert blocks[1].op_names.count("Add") >= 4  # bias, shift, residual, and var + eps
    # Flatten is read by the classifier's MatMul as a view of the pooled features.
    assert ["Reshape", "MatMul"] in [k.op_names for k in kernels]
    assert on.kernel_count == 6  # 24 before layout ops, BatchNorm's parameters and blocks fused


@pytest.mark.slow  # a training run
def test_train_digits_model_reaches_95_percent_and_its_checkpoint_loads(tmp_path, capsys):
    """The MindSpore tutorial shape (dataset pipeline, Model.train with LossMonitor, TimeMonitor
    and ModelCheckpoint, Model.eval): >= 95% held out, MindSpore's printed lines, the last
    checkpoint reproduces the trained net, and the loss curve is a PNG."""
    example = load("train_digits_model")
    try:
        result = example.run(out=str(tmp_path))
    finally:
        graphkernel.context.set_context(enable_graph_kernel=False)
    out = capsys.readouterr().out
    assert result["metrics"]["accuracy"] >= 0.95, result["metrics"]
    assert "epoch: 1 step: 10, loss is " in out and "per step time: " in out
    losses = result["losses"]
    assert np.mean(losses[-10:]) < 0.2 * np.mean(losses[:10])
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == [
        "digits-18_22.ckpt", "digits-19_22.ckpt", "digits-20_22.ckpt"]
    fresh = example.LeNetMLP()
    not_loaded, _ = graphkernel.load_param_into_net(
        fresh, graphkernel.load_checkpoint(result["checkpoint"]))
    assert not_loaded == []
    images, labels = result["test"]
    logits = fresh(Tensor((images / 16.0).astype(np.float32))).asnumpy()
    assert float((logits.argmax(1) == labels).mean()) == result["metrics"]["accuracy"]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def numpy_bert(net, ids, mask):
    """The same network in plain numpy, from its parameters."""
    p = {name: prm.asnumpy().astype(np.float64) for name, prm in net.parameters_and_names()}

    def dense(x, name, act=None):
        y = x @ p[name + ".weight"].T + p[name + ".bias"]
        if act == "gelu":
            y = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
        if act == "tanh":
            y = np.tanh(y)
        return y

    def norm(x, name, eps=1e-12):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * p[name + ".gamma"] + p[name + ".beta"]

    b, s = ids.shape
    x = p["word_embeddings.embedding_table"][ids] + p["position_embeddings.embedding_table"][:s]
    x = norm(x, "embedding_norm")
    bias = (1.0 - mask[:, None, None, :]) * -10000.0
    for i in range(len(net.layers)):
        a = f"layers.{i}.attention"
        heads = net.layers[i].attention.heads
        hd = x.shape[-1] // heads

        def split(t, heads=heads, hd=hd):
            return t.reshape(b, s, heads, hd).transpose(0, 2, 1, 3)

        q, k, v = (split(dense(x, f"{a}.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + bias
        e = np.exp(scores - scores.max(-1, keepdims=True))
        ctx = (e / e.sum(-1, keepdims=True)) @ v
        x = norm(dense(ctx.transpose(0, 2, 1, 3).reshape(b, s, -1), f"{a}.output") + x,
                 f"{a}.norm")
        f = f"layers.{i}.ffn"
        x = norm(dense(dense(x, f"{f}.dense_in", "gelu"), f"{f}.dense_out") + x, f"{f}.norm")
    return x, dense(x[:, 0], "pooler", "tanh")


@pytest.mark.parametrize("batch,seq", [(2, 8), (3, 5)])
def test_bert_tiny_matches_numpy_fused_and_not(batch, seq):
    bert = load("bert_tiny")
    graphkernel.set_seed(1)
    config = bert.Config(vocab_size=50, hidden_size=32, num_heads=4, intermediate_size=64,
                         max_position=16)
    net = bert.BertTiny(config)
    ids, mask = bert.make_inputs(batch, seq, config.vocab_size, seed=batch)
    want_seq, want_pooled = numpy_bert(net, ids, mask.astype(np.float64))
    counts = {}
    for name, options in (("on", ON), ("off", OFF)):
        compiled = graphkernel.compile(net, ids, mask, options=options)
        got_seq, got_pooled = compiled.run_arrays(ids, mask)
        np.testing.assert_allclose(got_seq, want_seq, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(got_pooled, want_pooled, rtol=2e-4, atol=2e-4)
        counts[name] = compiled.kernel_count
    assert counts["on"] < counts["off"]
    seq_out, pooled = net(Tensor(ids), Tensor(mask))
    assert seq_out.shape == (batch, seq, 32) and pooled.shape == (batch, 32)


@pytest.mark.slow  # a training run
def test_bert_tiny_trains_and_embeddings_get_gradients():
    bert = load("bert_tiny")
    config = bert.Config(vocab_size=40, hidden_size=16, num_heads=2, intermediate_size=32,
                         max_position=8)
    ids, mask = bert.make_inputs(6, 8, config.vocab_size, seed=3)
    labels = (ids[:, 1] % 2).astype(np.int32)
    runs = {}
    try:
        for fusion in (False, True):
            graphkernel.context.set_context(enable_graph_kernel=fusion)
            graphkernel.set_seed(0)
            net = bert.BertClassifier(config)
            table = net.bert.word_embeddings.embedding_table.asnumpy().copy()
            runs[fusion] = (bert.train_steps(net, ids, mask, labels, steps=8, learning_rate=1e-2),
                            net, table)
    finally:
        graphkernel.context.set_context(enable_graph_kernel=False)
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-3, atol=1e-5)
    losses, net, before = runs[True]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.5 * losses[0], losses
    # The word embeddings learned through Gather's gradient (a scatter-add into the table):
    # the rows of tokens in the batch moved, the rows of tokens never seen did not (Adam's
    # update is zero where every gradient was), nor did padding's row 0 (the mask keeps the
    # [CLS] output from reading padded positions).
    after = net.bert.word_embeddings.embedding_table.asnumpy()
    seen = np.zeros(config.vocab_size, bool)
    seen[np.unique(ids[mask == 1])] = True
    assert not seen[0] and seen.sum() > 10
    moved = np.abs(after - before).max(axis=1) > 1e-4
    np.testing.assert_array_equal(moved, seen)


def test_bert_tiny_prints_a_short_summary_unless_asked_why(monkeypatch, capsys):
    # By default a screenful: the kernels and how many op pairs were kept apart (it printed ~90
    # "kept apart" lines); --why lists them.
    bert = load("bert_tiny")
    outputs = {}
    for flags in ([], ["--why"]):
        monkeypatch.setattr("sys.argv", ["bert_tiny.py", "--batch", "2", "--seq", "8", *flags])
        bert.main()
        outputs[tuple(flags)] = capsys.readouterr().out
    short, full = outputs[()], outputs[("--why",)]
    kept = re.search(r"ops kept apart: (\d+) pair\(s\), not listed here", short)
    assert kept, short
    assert "ops kept apart:\n" not in short and len(short.splitlines()) < 40
    listed = full[full.index("ops kept apart:\n"):].splitlines()[1:]
    assert len([line for line in listed if line.startswith("  ")]) == int(kept.group(1))


def test_onnx_resnet_exports_loads_and_matches_onnxruntime(tmp_path):
    """examples/onnx_resnet.py's steps at a small size (it needs PyTorch: the bench extra)."""
    pytest.importorskip("torch", reason="pip install -e '.[bench]' (PyTorch)")
    onnxruntime = pytest.importorskip("onnxruntime", reason="pip install -e '.[test]'")
    example = load("onnx_resnet")
    path = str(tmp_path / "resnet18.onnx")
    example.export_resnet18(path, size=32, width=4)
    graphkernel.context.set_context(enable_graph_kernel=True)
    cell = graphkernel.nn.GraphCell(graphkernel.load(path))
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 2):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
        expected, = session.run(None, {"x": x})
        got = cell(Tensor(x)).asnumpy()
        assert np.max(np.abs(got - expected)) <= 1e-4 * np.max(np.abs(expected))
    assert any(k.name.startswith("Fused_") for k in cell.compiled.kernels)
