"""An imported ONNX model goes through the pipeline a written network does: save_graphs dumps,
the reasons ops were kept apart, the HTML report (`graphkernel report model.onnx --input ...`),
the compile cache (a second process loading the same file hits it) and GKIR export."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

if not os.environ.get("CI"):  # CI (.ci/run) installs the test extra: there a missing one fails
    pytest.importorskip("onnx", reason="pip install -e '.[test]' (onnx, onnxruntime)")
    pytest.importorskip("onnxruntime", reason="pip install -e '.[test]' (onnxruntime)")

from onnx_models import cnn, onnxruntime_outputs  # noqa: E402

import graphkernel  # noqa: E402
from graphkernel import Tensor, nn  # noqa: E402
from graphkernel.frontend import context  # noqa: E402
from graphkernel.frontend.compile import kernel_source_name  # noqa: E402
from graphkernel.passes.stage_names import FINAL  # noqa: E402
from graphkernel.tools import cli  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _static_cnn(rng, tmp_path, batch=2):
    """The CNN of onnx_models (at a static batch of 2 by default), saved to a file."""
    made = cnn(rng, batch=batch)
    path = tmp_path / "cnn.onnx"
    path.write_bytes(made.SerializeToString())
    return made, str(path)


def test_save_graphs_dumps_every_stage_of_an_imported_model(tmp_path, rng):
    made, path = _static_cnn(rng, tmp_path)
    folder = tmp_path / "dumps"
    context.set_context(save_graphs=True, save_graphs_path=str(folder), enable_graph_kernel=True)
    loaded = graphkernel.load(path)
    written = set(os.listdir(folder))
    assert {"6_validate.dot", f"{FINAL}.dot"} <= written, sorted(written)
    assert os.path.isfile(folder / kernel_source_name(loaded.name))
    assert loaded.compiled.report.dump_files
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    got = nn.GraphCell(loaded)(Tensor(x)).asnumpy()
    expected, = onnxruntime_outputs(made, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)


def test_an_imported_model_says_why_ops_were_kept_apart(rng):
    context.set_context(enable_graph_kernel=True)
    cell = nn.GraphCell(graphkernel.load(cnn(rng)))
    assert cell.compiled.reasons, "the import's fusion reasons are lost"
    assert cell.compiled.report.stages[FINAL] is not None


def test_the_report_command_takes_an_onnx_file(tmp_path, rng, capsys):
    _, path = _static_cnn(rng, tmp_path, batch="batch")  # --input gives the batch its size
    out = tmp_path / "report.html"
    assert cli.main(["report", path, "--input", "float32[1,3,16,16]", "--out", str(out),
                     "--repeats", "2"]) == 0
    page = out.read_text()
    assert "cnn.onnx" in page and "<svg" in page
    for wrong in (["float32[1,3,16,16]", "float32[1]"], ["float32[1,3,8,8]"],
                  ["float64[1,3,16,16]"]):
        args = [a for spec in wrong for a in ("--input", spec)]
        assert cli.main(["report", path, *args, "--out", str(out)]) == 2
        assert "cnn.onnx" in capsys.readouterr().err


_CHILD = textwrap.dedent("""
    import json, sys
    import graphkernel
    loaded = graphkernel.load({path!r})
    print(json.dumps({{"cache": loaded.compiled.report.compile_cache,
                      "kernels": [k.name for k in loaded.compiled.kernels]}}))
""")


def test_a_second_process_loading_the_same_onnx_file_hits_the_compile_cache(
        tmp_path, rng, cache_folder):
    _, path = _static_cnn(rng, tmp_path)
    code = _CHILD.format(path=path)

    def child():
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    cold, warm = child(), child()
    assert cold["cache"].startswith("miss: no entry") and cold["cache"].endswith("stored"), cold
    assert warm["cache"].startswith("hit: "), warm
    assert warm["kernels"] == cold["kernels"]


def test_an_imported_model_exports_to_gkir_and_loads_back(tmp_path, rng):
    made, path = _static_cnn(rng, tmp_path)
    loaded = graphkernel.load(path)
    written = graphkernel.export(loaded, file_name=str(tmp_path / "cnn"))
    again = graphkernel.load(written)
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    expected, = onnxruntime_outputs(made, {"x": x})
    for graph in (loaded, again):
        np.testing.assert_allclose(nn.GraphCell(graph)(Tensor(x)).asnumpy(), expected,
                                   rtol=1e-4, atol=1e-6)
