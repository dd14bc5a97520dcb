"""An imported model fuses like the same network written with graphkernel.nn: the bench's own ONNX
graphs of its inference workloads (bench/peers.onnx_model, the ones ONNX Runtime runs), loaded
with graphkernel.load, launch as many kernels as the hand-written cells (bench/gk_cells), and
compute the same result, from the compiled C entry where the written cell's plan has one. The
hand-written cell is counted for the output the ONNX graph has (its first): the digits CNN's
Argmax and BERT-tiny's pooler are outputs the graph leaves out."""
import os

import numpy as np
import pytest

if not os.environ.get("CI"):  # CI (.ci/run) installs the test extra: there a missing one fails
    pytest.importorskip("onnx", reason="pip install -e '.[test]' (onnx, onnxruntime)")

import graphkernel  # noqa: E402
from bench.gk_cells import make_cell  # noqa: E402
from bench.peers import onnx_model  # noqa: E402
from bench.workloads import TRAIN_KINDS, input_sets, tiny_suite  # noqa: E402
from graphkernel import Tensor, nn  # noqa: E402
from graphkernel.frontend import context  # noqa: E402
from graphkernel.graph_kernel.pipeline import CompileOptions  # noqa: E402

WORKLOADS = {w.key: w for w in tiny_suite() if w.kind not in TRAIN_KINDS}


class FirstOutput(nn.Cell):
    """The hand-written cell's first output only: what the bench's ONNX graph computes."""

    def __init__(self, net: nn.Cell) -> None:
        super().__init__()
        self.net = net

    def construct(self, *inputs):
        out = self.net(*inputs)
        return out[0] if isinstance(out, tuple) else out


def _first(out):
    return (out[0] if isinstance(out, tuple) else out).asnumpy()


@pytest.mark.parametrize("key", sorted(WORKLOADS))
def test_an_imported_workload_has_the_kernels_of_the_written_cell(key):
    w = WORKLOADS[key]
    sets, params = input_sets(w, [0])
    arrays = list(sets[0].values())
    written = graphkernel.compile(FirstOutput(make_cell(w, params)), *arrays,
                                  options=CompileOptions(enable_graph_kernel=True))
    context.set_context(enable_graph_kernel=True)
    imported = nn.GraphCell(graphkernel.load(onnx_model(w, params))).compiled
    kernels = [k.name for k in imported.kernels]
    assert len(kernels) == len(written.kernels), (kernels, [k.name for k in written.kernels])
    assert not [k.name for k in imported.kernels if k.backend == "interpreted"]
    # and, where the written cell's plan runs as one compiled C call, so does the import's
    if written.executable.runner.entry is not None:
        assert imported.executable.runner.entry is not None
    tensors = [Tensor(a) for a in arrays]
    expected, got = _first(written(*tensors)), _first(imported(*tensors))
    np.testing.assert_allclose(got, expected, rtol=max(w.rtol, 1e-4) * 10,
                               atol=1e-5 * float(np.max(np.abs(expected))))


def test_an_imported_batchnorm_folds_into_the_convolution():
    """The digits CNN's BatchNormalization initializers are constants: the fold moves the scale
    into the convolution and the per-channel shift folds at compile time (no Reshape kernels)."""
    w = WORKLOADS["cnn_digits_4"]
    _, params = input_sets(w, [0])
    context.set_context(enable_graph_kernel=True)
    compiled = nn.GraphCell(graphkernel.load(onnx_model(w, params))).compiled
    ops = [op for k in compiled.kernels for op in k.op_names]
    assert ops.count("Conv2DFoldedBN") == 3 and "BatchNorm" not in ops
    assert not [k for k in compiled.kernels if k.op_names == ["Reshape"]], compiled.kernels
