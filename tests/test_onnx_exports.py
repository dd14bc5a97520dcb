"""Real exports from PyTorch (tests/data/onnx/, made by make_models.py there: ResNet-18's and
MobileNetV3-Small's layouts at reduced widths, a transformers BERT encoder and GPT-2 block
from small configs, random weights), each with a dynamic batch axis: one compile serves batch
1 and 3, and both agree with ONNX Runtime within 1e-4 relative."""
import os

import numpy as np
import pytest

if not os.environ.get("CI"):  # CI (.ci/run) installs the test extra: there a missing one fails
    pytest.importorskip("onnx", reason="pip install -e '.[test]' (onnx, onnxruntime)")
    pytest.importorskip("onnxruntime", reason="pip install -e '.[test]' (onnxruntime)")

import graphkernel  # noqa: E402
from graphkernel import Tensor, nn  # noqa: E402
from graphkernel.frontend import context  # noqa: E402
from graphkernel.ir.types import SymSize  # noqa: E402
from graphkernel.nn import graph_cell  # noqa: E402
from graphkernel.onnx import importer  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data", "onnx")

# file, the input's shape after the batch, its kind
MODELS = {
    "resnet18_small": ((3, 32, 32), "image"),
    "mobilenetv3_small": ((3, 64, 64), "image"),
    "bert_encoder_small": ((16,), "tokens"),
    "gpt2_block_small": ((16,), "tokens"),
}


def _input(rng, kind, shape):
    if kind == "image":
        return rng.standard_normal(shape).astype(np.float32)
    return rng.integers(0, 100, shape).astype(np.int64)


@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_pytorch_export_with_a_dynamic_batch_compiles_once_and_matches_onnxruntime(
        name, fusion, rng, monkeypatch):
    import onnxruntime

    context.set_context(enable_graph_kernel=fusion)

    path = os.path.join(DATA, f"{name}.onnx")
    rest, kind = MODELS[name]
    compiles = []  # the load compiles (importer.compile_traced); GraphCell must not again

    def counting(module, name):
        real = getattr(module, name)

        def count(*args, **kwargs):
            compiles.append(name)
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, count)

    counting(importer, "compile_traced")
    counting(graph_cell, "compile_loaded")
    loaded = graphkernel.load(path)
    (input_name, input_type), = loaded.signature
    assert isinstance(input_type.shape[0], SymSize) and input_type.shape[1:] == rest
    cell = nn.GraphCell(loaded)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = _input(rng, kind, (batch,) + rest)
        got = cell(Tensor(x)).asnumpy()
        expected, = session.run(None, {input_name: x})
        assert got.shape == expected.shape and got.shape[0] == batch
        error = np.max(np.abs(got - expected)) / np.max(np.abs(expected))
        assert error <= 1e-4, (name, batch, error)
    assert len(compiles) == 1, compiles  # one compile serves both batch sizes
    if fusion:
        assert any(k.name.startswith("Fused_") for k in cell.compiled.kernels)


def test_the_committed_exports_are_small():
    for name in MODELS:
        assert os.path.getsize(os.path.join(DATA, f"{name}.onnx")) < 1_000_000, name


# transformers' models called with an attention mask as well: the mask is built by index
# arithmetic over arange(batch), an ONNX Range up to the dynamic batch (make_models.py)
MASKED = ("bert_encoder_masked_small", "gpt2_block_masked_small")


@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("name", MASKED)
def test_a_range_up_to_the_dynamic_batch_runs_at_every_batch(name, fusion, rng, monkeypatch):
    import onnx
    import onnxruntime

    context.set_context(enable_graph_kernel=fusion)
    path = os.path.join(DATA, f"{name}.onnx")
    assert any(n.op_type == "Range" for n in onnx.load(path).graph.node)
    compiles = []
    real = importer.compile_traced
    monkeypatch.setattr(importer, "compile_traced",
                        lambda *a, **k: compiles.append(1) or real(*a, **k))
    loaded = graphkernel.load(path)
    assert [n for n, _ in loaded.signature] == ["input_ids", "attention_mask"]
    assert all(isinstance(t.shape[0], SymSize) for _, t in loaded.signature)
    cell = nn.GraphCell(loaded)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        ids = _input(rng, "tokens", (batch, 16))
        mask = np.ones((batch, 16), np.int64)
        for row, padding in enumerate(rng.integers(0, 8, batch)):  # each row its own padding
            mask[row, 16 - padding:] = 0
        got = cell(Tensor(ids), Tensor(mask)).asnumpy()
        expected, = session.run(None, {"input_ids": ids, "attention_mask": mask})
        assert got.shape == expected.shape == (batch, 16, 32)
        error = np.max(np.abs(got - expected)) / np.max(np.abs(expected))
        assert error <= 1e-4, (name, batch, error)
    assert len(compiles) == 1  # one compile serves both batch sizes


# The bench's fused BERT and GPT-2 rows load their export with the batch fixed: then every step
# is a generated kernel, a BLAS product or an embedding lookup, and the whole graph is one call
# of the compiled entry (backends/c/c_entry.py), products on one BLAS thread as a hand-written
# BERT runs them. A Gather whose indices were computed in the graph (ONNX's negative-index
# wrap) kept these exports on the Python runner's steps.
@pytest.mark.parametrize("name", ["bert_encoder_small", "gpt2_block_small", *MASKED])
def test_a_transformer_export_with_its_batch_fixed_runs_as_one_entry_call(name, rng):
    import onnx
    import onnxruntime

    context.set_context(enable_graph_kernel=True)
    model = onnx.load(os.path.join(DATA, f"{name}.onnx"))
    for v in list(model.graph.input) + list(model.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = 2  # the batch: dim_param -> 2
    compiled = nn.GraphCell(graphkernel.load(model)).compiled
    assert not [s.name for s in compiled.plan.steps if s.backend == "interpreted"]
    assert compiled.entry is not None, compiled.plan.describe()
    feeds = {"input_ids": _input(rng, "tokens", (2, 16))}
    if name in MASKED:
        feeds["attention_mask"] = np.ones((2, 16), np.int64)
        feeds["attention_mask"][1, 11:] = 0
    runner = compiled.executable.runner
    got = runner.entry(*feeds.values(), *compiled._weights(), *runner.entry_constants)
    assert got is not NotImplemented  # the entry took the call, it did not hand it back
    got = got[0] if isinstance(got, (tuple, list)) else got
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    expected, = session.run(None, feeds)
    assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) <= 1e-4


# The same exports with their batch dynamic: the embedding lookup of N rows, the positions of a
# Range up to the batch (RangeLike), the mask's Gather at indices computed from them, the zeros
# the import shapes from an input and GPT-2's Split of [N, 16, 96] are entry steps or kernels
# too, so one compile serves every batch as one call of the compiled entry.
@pytest.mark.parametrize("name", ["bert_encoder_small", "gpt2_block_small", *MASKED])
def test_a_shape_generic_transformer_export_runs_as_one_entry_call(name, rng):
    import onnxruntime

    context.set_context(enable_graph_kernel=True)
    path = os.path.join(DATA, f"{name}.onnx")
    compiled = nn.GraphCell(graphkernel.load(path)).compiled
    assert compiled.plan.symbols, "the batch stays dynamic"
    assert compiled.entry is not None, compiled.plan.describe()
    runner = compiled.executable.runner
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        feeds = {"input_ids": _input(rng, "tokens", (batch, 16))}
        if name in MASKED:
            feeds["attention_mask"] = np.ones((batch, 16), np.int64)
            feeds["attention_mask"][-1, 11:] = 0
        got = runner.entry(*feeds.values(), *compiled._weights(), *runner.entry_constants)
        assert got is not NotImplemented  # the entry took the call, it did not hand it back
        got = got[0] if isinstance(got, (tuple, list)) else got
        expected, = session.run(None, feeds)
        assert got.shape == expected.shape and got.shape[0] == batch
        assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) <= 1e-4, batch


def test_an_out_of_range_embedding_index_at_a_dynamic_batch_is_a_clear_error(rng):
    from graphkernel.errors import GraphKernelError

    context.set_context(enable_graph_kernel=True)
    cell = nn.GraphCell(graphkernel.load(os.path.join(DATA, "gpt2_block_small.onnx")))
    assert cell.compiled.entry is not None
    ids = _input(rng, "tokens", (3, 16))
    ids[2, 5] = 10 ** 6  # past the vocabulary
    with pytest.raises(GraphKernelError, match="Gather"):
        cell(Tensor(ids))


# ONNX's MaxPool pads (ResNet's stem: 3x3, stride 2, pads 1) are the pool's own (pad_mode "pad"):
# the import padded with -inf borders, two Concat steps that kept the plan off the entry.
@pytest.mark.parametrize("fusion", [True, False])
def test_the_resnet_export_pools_with_its_pads_and_runs_as_one_entry_call(fusion, rng):
    import onnxruntime

    context.set_context(enable_graph_kernel=fusion)
    path = os.path.join(DATA, "resnet18_small.onnx")
    loaded = graphkernel.load(path)
    pools = [n for n in loaded.graph.nodes if n.op == "MaxPool"]
    assert pools and all(n.attrs["pad_mode"] == "pad" for n in pools)
    assert not [n for n in loaded.graph.nodes if n.op == "Concat"]
    compiled = nn.GraphCell(loaded).compiled
    assert compiled.entry is not None, compiled.plan.describe()
    runner = compiled.executable.runner
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = _input(rng, "image", (batch, 3, 32, 32))
        got = runner.entry(x, *compiled._weights(), *runner.entry_constants)
        assert got is not NotImplemented
        got = got[0] if isinstance(got, (tuple, list)) else got
        expected, = session.run(None, {"x": x})
        assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) <= 1e-4, batch
