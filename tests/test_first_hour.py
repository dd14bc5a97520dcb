"""What a new user reads first: constants and labels in the dumps, their own GraphKernel drawn
apart from fusion's kernels, the lab's default report, command-line errors at their file."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor
from graphkernel.frontend.cell import Cell
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ir.dot import to_dot
from graphkernel.ir.printer import print_graph
from graphkernel.ops import operations as P
from graphkernel.tools.lab import NetBasicFuse, NetCompositeFuse

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)


class Eps(Cell):
    def __init__(self) -> None:
        super().__init__()
        self.add = P.Add()
        self.mul = P.Mul()

    def construct(self, x):
        return self.mul(self.add(x, 1e-05), 0.1)


@pytest.mark.parametrize("dtype,texts", [(np.float32, ("1e-05", "0.1")),
                                         (np.float16, ("1e-05", "0.1")),
                                         (np.float64, ("1e-05", "0.1"))])
def test_constants_print_in_shortest_round_trip_form(dtype, texts):
    x = np.ones((2, 3), dtype)
    exe = graphkernel.compile(Eps(), x, options=ON)
    for stage in ("6_validate", "hwopt_d_end"):
        graph = exe.stages[stage]
        ir, dot = print_graph(graph), to_dot(graph)
        for text in texts:
            assert re.search(rf"[(, ]{re.escape(text)}[),]", ir), (stage, ir)
            assert f'label="{text}"' in dot, (stage, dot)
        assert "9.99999" not in ir + dot and "0.100000" not in ir + dot
    for const in [v for n in exe.stages["6_validate"].nodes for v in n.inputs
                  if hasattr(v, "literal")]:
        # The printed text reads back as exactly the stored value of its dtype.
        assert const.value.dtype.type(const.literal()) == const.value


def _labels(dot: str) -> list[str]:
    return sorted(re.findall(r'\bn\d+ \[label="([^"]+)", shape=box', dot))


def test_node_labels_are_the_same_in_every_stage():
    exe = graphkernel.compile(NetBasicFuse(), np.ones((4, 4), np.float32), options=ON)
    initial = _labels(to_dot(exe.stages["6_validate"]))
    final = _labels(to_dot(exe.stages["hwopt_d_end"]))
    assert initial == final == ["Add", "Mul", "Mul_1"]


def test_user_graph_kernel_is_drawn_apart_from_fused_kernels():
    x = np.ones((4, 4), np.float32)
    exe = graphkernel.compile(NetCompositeFuse(), x, options=ON)
    initial = to_dot(exe.stages["6_validate"])
    assert 'label="user GraphKernel: Composite"; style="dashed,filled"' in initial
    final = to_dot(exe.stages["hwopt_d_end"])
    assert 'label="Fused_Mul_Add_Mul"; style=filled' in final and "dashed" not in final
    off = graphkernel.compile(NetCompositeFuse(), x, options=OFF)
    assert "user GraphKernel: Composite" in to_dot(off.stages["hwopt_d_end"])
    assert "user_graph_kernel: Composite" in print_graph(off.stages["6_validate"])
    np.testing.assert_allclose(exe(Tensor(x)).asnumpy(), off(Tensor(x)).asnumpy())


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "graphkernel.tools.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_lab_writes_its_report_by_default_and_prints_the_path_last(tmp_path):
    proc = _cli("lab", "--out", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "report: out/report.html"
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    # The lab's four scenarios: each fused and unfused graph drawn, and one roofline each.
    assert page.count('<svg class="roofline"') == 4
    assert page.count("<svg") - page.count('<svg class="roofline"') == 8
    proc = _cli("lab", "--out", "quiet", "--no-report", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "quiet" / "report.html").exists() and "report:" not in proc.stdout
    assert (tmp_path / "quiet" / "test_basic_fuse" / "hwopt_d_end.png").is_file()


NET = '''from graphkernel.nn import Cell
from graphkernel.ops import operations as P


class Net(Cell):
    def __init__(self):
        super().__init__()
        self.mul = P.Mul()

    def construct(self, x, y):
        return self.mul(x, y)
'''


def test_report_errors_point_at_the_users_file_and_say_what_to_do(tmp_path):
    net = tmp_path / "net.py"
    net.write_text(NET)
    proc = _cli("report", f"{net}:Net", "--input", "float32[4,4]")
    assert proc.returncode == 2
    assert "Net.construct takes 2 input(s) (x, y) but 1 --input was given" in proc.stderr
    assert "--input float32[4,4] --input float32[4,4]" in proc.stderr
    assert f'File "{net}", line 10, in construct' in proc.stderr
    assert "tools" not in proc.stderr and "Traceback" not in proc.stderr
    broken = tmp_path / "broken.py"
    broken.write_text("import numpy\n\nx = numpy.zeros(3) +\n")
    proc = _cli("report", f"{broken}:Net", "--input", "float32[4]")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f'File "{broken}", line 3' in proc.stderr
    raising = tmp_path / "raising.py"
    raising.write_text("def f():\n    return 1 / 0\n\n\nf()\n")
    proc = _cli("report", f"{raising}:Net")
    assert proc.returncode == 2 and "ZeroDivisionError" in proc.stderr
    assert f'File "{raising}", line 2, in f' in proc.stderr
    proc = _cli("report", str(net))
    assert proc.returncode == 2 and "net.py:Net" in proc.stderr
    proc = _cli("report", f"{net}:Nett", "--input", "float32[4]")
    assert proc.returncode == 2 and "defines no Nett; classes with a construct there: Net" \
        in proc.stderr


def test_bench_says_when_it_writes_no_chart(tmp_path, monkeypatch, capsys):
    from bench.report import chart
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert chart({}, str(tmp_path / "chart.png")) is None
    err = capsys.readouterr().err
    assert "no chart written" in err and "matplotlib is not installed" in err
    assert not (tmp_path / "chart.png").exists()


def test_attributes_print_like_constants():
    from graphkernel.ir.graph import Graph, Input, Node
    from graphkernel.ir.types import TensorType
    x = Input(TensorType((2, 3), np.dtype(np.float32)), "x")
    node = Node("ReduceSum", [x], {"axis": (np.int64(1),), "keep_dims": np.bool_(True),
                                   "eps": np.float32(1e-05)},
                TensorType((2, 1), np.dtype(np.float32)))
    text = print_graph(Graph("g", [x], [node], [node]))
    assert "{axis=(1,), eps=1e-05, keep_dims=True}" in text, text


def test_what_a_speedup_measures():
    from graphkernel.tools.report_timing import dispatch_bound
    assert dispatch_bound(128, 1e-6, 1)[0]  # the lab at 4x4: nanoseconds of data, a us call
    assert not dispatch_bound(4096, 5e-3, 1)[0]  # long per launch: arithmetic, not dispatch
    assert not dispatch_bound(256 << 20, 30e-3, 2)[0]  # data-heavy
    bound, data_s = dispatch_bound(128, 3e-6, 3)
    assert bound and 0 < data_s < 1e-6


def _options_without_help(parser) -> list[str]:
    import argparse
    return [("/".join(a.option_strings) or a.dest) for a in parser._actions
            if not isinstance(a, argparse._HelpAction) and not a.help
            and not isinstance(a, argparse._SubParsersAction)]


def test_every_subcommand_says_what_it_does_and_every_option_has_help():
    import argparse

    from bench.cli import _parser as bench_parser
    from graphkernel.tools.cli import build_parser
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    listed = {c.dest: c.help for c in commands._choices_actions}
    assert set(listed) == {"lab", "render", "report", "tune", "doctor", "bench"}
    for name, sub in commands.choices.items():
        assert listed[name], name
        if name == "bench":  # its options are `python -m bench`'s, checked below
            continue
        assert sub.description, f"graphkernel {name} --help has no description"
        assert _options_without_help(sub) == [], name
    assert _options_without_help(bench_parser()) == []
    # The README writes an input as DTYPE[SHAPE]; the help says the same.
    text = commands.choices["report"].format_help()
    assert "--input DTYPE[SHAPE]" in text and "TYPE]" not in text.replace("DTYPE[SHAPE]", "")


def test_report_writes_beside_its_input_by_default(tmp_path):
    from graphkernel.tools.cli import default_report_path
    assert default_report_path("lab_output/test_basic_fuse") == \
        os.path.join("lab_output/test_basic_fuse", "report.html")
    assert default_report_path("models/net.py:Net") == "models/net_report.html"
    folder = tmp_path / "dumps"
    proc = _cli("lab", "--out", str(folder), "--no-report", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = _cli("report", str(folder / "test_basic_fuse"), "--repeats", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(folder / "test_basic_fuse" / "report.html")
    proc = _cli("render", str(folder / "test_basic_fuse" / "6_validate.dot"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dumps"]  # nothing in the cwd
