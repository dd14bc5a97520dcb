"""The seed lab: both nets, fusion on and off, structure, dumps, pictures, conclusions."""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor
from graphkernel.frontend import context
from graphkernel.tools.lab import NetBasicFuse, NetCompositeFuse, run_lab


def expected(x):
    return ((x * 2.0) + 1.0) * 3.0


@pytest.mark.parametrize("net_cls", [NetBasicFuse, NetCompositeFuse])
@pytest.mark.parametrize("fusion", [True, False])
def test_nets_equal_numpy(net_cls, fusion, rng):
    context.set_context(enable_graph_kernel=fusion)
    x = rng.standard_normal((4, 4)).astype(np.float32)
    out = net_cls()(Tensor(x))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.asnumpy(), expected(x), rtol=1e-6)


def test_basic_fuse_kernel_counts():
    x = Tensor(np.ones((4, 4), np.float32))
    context.set_context(enable_graph_kernel=True)
    on = graphkernel.compile(NetBasicFuse(), x)
    assert [k.name for k in on.kernels] == ["Fused_Mul_Add_Mul"]
    assert on.kernels[0].op_names == ["Mul", "Add", "Mul"]
    assert on.kernels[0].backend == "native" and "void gk_Fused_Mul_Add_Mul" in on.kernels[0].source
    context.set_context(enable_graph_kernel=False)
    off = graphkernel.compile(NetBasicFuse(), x)
    assert [k.op_names for k in off.kernels] == [["Mul"], ["Add"], ["Mul"]]


def test_composite_fuse_kernel_counts():
    x = Tensor(np.ones((4, 4), np.float32))
    context.set_context(enable_graph_kernel=True)
    on = graphkernel.compile(NetCompositeFuse(), x)
    assert len(on.kernels) == 1
    assert on.kernels[0].op_names == ["Mul", "Add", "Mul"]
    # The composite grew in the composite-op fusion stage, not the basic one.
    basic = on.stages["hwopt_2_basic_op_fusion"]
    assert [n.name for n in basic.nodes] == ["Composite", "Mul"]
    context.set_context(enable_graph_kernel=False)
    off = graphkernel.compile(NetCompositeFuse(), x)
    assert [(k.name, k.op_names) for k in off.kernels] == [("Composite", ["Mul", "Add"]),
                                                            ("Mul", ["Mul"])]
    # The user's composite still runs as one generated kernel with fusion off.
    assert off.kernels[0].backend == "native"


def test_fusion_off_runs_the_initial_graph_node_for_node():
    from graphkernel.ir.printer import print_graph
    x = Tensor(np.ones((4, 4), np.float32))
    for net in (NetBasicFuse(), NetCompositeFuse()):
        exe = graphkernel.compile(net, x)
        assert print_graph(exe.stages["6_validate"]) == print_graph(exe.stages["hwopt_d_end"])
        assert list(exe.stages)[-2:] == ["hwopt_d_end", "hwopt_e_lower"]


def test_fused_dump_shows_inner_graph_and_source_lines(tmp_path):
    context.set_context(enable_graph_kernel=True, save_graphs=True, save_graphs_path=str(tmp_path))
    NetBasicFuse()(Tensor(np.ones((4, 4), np.float32)))
    text = (tmp_path / "hwopt_d_end.ir").read_text()
    assert "Fused_Mul_Add_Mul" in text
    assert "subgraph Fused_Mul_Add_Mul" in text
    assert len(re.findall(r"= Mul(\[\w+\])?\(", text)) == 2 and "= Add(" in text
    assert "lab.py" in text and "self.mul(x, 2.0)" in text  # construct's lines
    dot = (tmp_path / "hwopt_d_end.dot").read_text()
    assert 'subgraph cluster_' in dot and 'label="Fused_Mul_Add_Mul"' in dot
    initial = (tmp_path / "6_validate.ir").read_text()
    assert "Fused" not in initial
    assert list(tmp_path.glob("kernel_meta/*.c"))


def test_stage_dumps_numbered_and_complete(tmp_path):
    context.set_context(enable_graph_kernel=True, save_graphs=True, save_graphs_path=str(tmp_path))
    NetCompositeFuse()(Tensor(np.ones((2, 3), np.float32)))
    names = sorted(p.stem for p in tmp_path.glob("*.ir"))
    assert "6_validate" in names and "hwopt_d_end" in names
    assert all((tmp_path / f"{n}.dot").exists() for n in names)
    frontend = [n for n in names if n[0].isdigit()]
    assert frontend == sorted(frontend, key=lambda n: int(n.split("_")[0]))


def test_lab_command_writes_scenarios_and_conclusions_hold(tmp_path):
    results, found = run_lab(str(tmp_path), echo=False)
    assert [c.holds for c in found] == [True, True, True]
    for name in ("test_basic_fuse", "test_composite_fuse", "test_basic_fuse_no",
                 "test_composite_fuse_no"):
        for stage in ("6_validate", "hwopt_d_end"):
            for suffix in (".ir", ".dot", ".png"):
                path = tmp_path / name / (stage + suffix)
                assert path.exists() and path.stat().st_size > 0, path
        png = (tmp_path / name / "hwopt_d_end.png").read_bytes()
        assert png.startswith(b"\x89PNG")
    assert len(results["test_basic_fuse"].executable.kernels) == 1
    assert len(results["test_basic_fuse_no"].executable.kernels) == 3


def test_lab_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "graphkernel.tools.cli", "lab", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("[holds]") == 3
    assert "result:" in out.stdout and "kernels per call: 1" in out.stdout
    # The lesson where it shows: kernels and bytes from the plans, the time with its spread.
    assert "2048x2048: 3 kernels -> 1, 96.0 MiB -> 32.0 MiB moved per call" in out.stdout
    assert re.search(r"2048x2048: .*(x faster|x slower|no difference this measurement can "
                     r"tell) \(.*quartiles [\d.]+-[\d.]+x\)", out.stdout), out.stdout


@pytest.mark.slow  # a pytest run of the lab script
def test_lab_script_runs_under_pytest(tmp_path):
    """The lab's own test file, with mindspore->graphkernel and Ascend->CPU replaced, runs
    under pytest and writes the two dumps the lab copies into the working folder."""
    src = os.path.join(os.path.dirname(__file__), "lab", "test_graph_kernel_fusion.py")
    shutil.copy(src, tmp_path / "test_graph_kernel_fusion.py")
    for test in ("test_basic_fuse", "test_composite_fuse"):
        out = subprocess.run([sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider",
                              f"test_graph_kernel_fusion.py::{test}"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "result: [[" in out.stdout
        assert (tmp_path / "6_validate.dot").exists()
        assert (tmp_path / "hwopt_d_end.dot").exists()
    assert "Fused_Mul_Add_Mul" in (tmp_path / "hwopt_d_end.dot").read_text()


def test_render_command_and_missing_file(tmp_path):
    from graphkernel.errors import RendererError
    from graphkernel.tools.render import render
    context.set_context(save_graphs=True, save_graphs_path=str(tmp_path))
    NetBasicFuse()(Tensor(np.ones((4, 4), np.float32)))
    svg = render(str(tmp_path / "6_validate.dot"), str(tmp_path / "g.svg"))
    assert "<svg" in open(svg).read()
    with pytest.raises(RendererError, match="no such DOT file"):
        render(str(tmp_path / "missing.dot"))
    out = subprocess.run([sys.executable, "-m", "graphkernel.tools.cli", "render",
                          str(tmp_path / "6_validate.dot"), "-o", str(tmp_path / "g.png")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and (tmp_path / "g.png").read_bytes().startswith(b"\x89PNG")


def test_render_without_renderer_is_a_clear_error(tmp_path, monkeypatch):
    from graphkernel.errors import RendererError
    from graphkernel.tools import render as render_mod
    (tmp_path / "a.dot").write_text("digraph { a -> b }")
    monkeypatch.setattr(render_mod, "find_renderer", lambda: None)
    with pytest.raises(RendererError, match="graphviz-pure"):
        render_mod.render(str(tmp_path / "a.dot"))


def test_pynative_equals_graph_mode(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    context.set_context(mode=context.PYNATIVE_MODE)
    eager = NetCompositeFuse()(Tensor(x)).asnumpy()
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=True)
    graph = NetCompositeFuse()(Tensor(x)).asnumpy()
    np.testing.assert_allclose(eager, graph, rtol=1e-6)
    np.testing.assert_allclose(eager, expected(x), rtol=1e-6)


def test_graph_mode_caches_per_signature():
    net = NetBasicFuse()
    net(Tensor(np.ones((4, 4), np.float32)))
    net(Tensor(np.zeros((4, 4), np.float32)))
    assert len(net._compiled) == 1
    net(Tensor(np.ones((2, 8), np.float32)))
    assert len(net._compiled) == 2


# -- the headline: what fusion saves, where it matters ----------------------------------------

def test_fusion_savings_where_memory_traffic_dominates(tmp_path):
    from graphkernel.tools.lab import LARGE, fusion_savings
    from graphkernel.tools.report_parts import savings_html
    results, _ = run_lab(str(tmp_path), echo=False, render_pictures=False)
    small, large = fusion_savings(results)
    assert small.shape == (4, 4) and large.shape == LARGE
    # From the plans, by hand: unfused, each of the 3 kernels reads and writes the array;
    # fused, one kernel reads it once and writes it once.
    array = 4 * LARGE[0] * LARGE[1]
    assert (large.kernels_off, large.kernels_on) == (3, 1)
    assert (large.bytes_off, large.bytes_on) == (3 * 2 * array, 2 * array)
    assert (small.bytes_off, small.bytes_on) == (3 * 2 * 64, 2 * 64)
    for s in (small, large):
        assert s.time_on.samples == s.time_off.samples == s.paired.samples >= 10
        assert s.paired.q1 <= s.paired.median <= s.paired.q3
    page = savings_html([small, large])
    assert "1 kernel instead of 3" in page and "32.0&nbsp;MiB instead of 96.0&nbsp;MiB" in page
    assert "2048&times;2048 float32" in page.split("</p>")[0]  # the headline is the large size


def test_a_headline_inside_the_noise_names_no_winner():
    from graphkernel.tools.lab import Saving
    from graphkernel.tools.report_parts import savings_html
    from graphkernel.tools.report_timing import Spread
    times = Spread(1e-6, 0.9e-6, 1.2e-6, 15)
    # Fused 1.06x "slower" by the medians, but the paired ratios' quartiles hold 1.
    noisy = Saving((4, 4), 3, 1, 384, 128, times, times, Spread(1 / 1.06, 0.8, 1.3, 15))
    assert not noisy.clear and "no difference this measurement can tell" in noisy.effect()
    clear = Saving((2048, 2048), 3, 1, 3 << 25, 1 << 25, Spread(9e-3, 8e-3, 1e-2, 15),
                   Spread(3e-3, 2.8e-3, 3.3e-3, 15), Spread(3.0, 2.8, 3.2, 15))
    assert clear.clear and clear.effect().startswith("3.00x faster")
    page = savings_html([noisy, clear])
    row = page[page.index("float32[4,4]"):page.index("float32[2048,2048]")]
    assert "within noise" in row and "slower" not in row and "faster" not in row
    assert "3.00&times; faster" in page.split("</p>")[0]


def test_lab_report_leads_with_what_fusion_saves(tmp_path):
    from graphkernel.tools.lab import Saving
    from graphkernel.tools.report import Ceilings, write_lab_report
    from graphkernel.tools.report_timing import Spread
    lab = run_lab(str(tmp_path), echo=False, render_pictures=False)
    t = Spread(1e-3, 1e-3, 1e-3, 15)
    given = [Saving((2048, 2048), 3, 1, 3 << 25, 1 << 25, t, t, Spread(3.0, 2.8, 3.2, 15))]
    text = open(write_lab_report(str(tmp_path), str(tmp_path / "r.html"), lab=lab, repeats=3,
                                 savings=given, ceilings=Ceilings(2e10, 1e11, "test")),
                encoding="utf-8").read()
    assert text.index('<section class="headline">') < text.index('class="conclusions"')
    assert "What fusion saves" in text and "3.00&times; faster" in text
