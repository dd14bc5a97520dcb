"""The `graphkernel` command: lab, render, report, tune, doctor, bench."""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from typing import TYPE_CHECKING

from graphkernel.errors import GraphKernelError

if TYPE_CHECKING:
    from graphkernel.tools.report_views import ReportEntry


def _cmd_lab(args: argparse.Namespace) -> int:
    from graphkernel.tools.lab import fusion_savings, headline, run_lab
    results, found = run_lab(args.out, seed=args.seed)
    if not args.no_report:
        from graphkernel.tools.report import write_lab_report
        path = args.report or os.path.join(args.out, "report.html")
        savings = fusion_savings(results, args.seed)
        print("=============== what fusion saves (NetBasicFuse, off -> on) ===============")
        print(headline(savings))
        # Reuse this run's results rather than running the lab a second time.
        print(f"report: {write_lab_report(args.out, path, lab=(results, found), savings=savings)}")
    return 0 if all(c.holds for c in found) else 1


def _cmd_render(args: argparse.Namespace) -> int:
    from graphkernel.tools.render import render
    print(render(args.dot, args.output))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from graphkernel.tools import report
    from graphkernel.tools.cellspec import check_input_count
    path, sep, _ = args.target.rpartition(":")
    if sep and path.endswith(".py"):
        import numpy as np

        from graphkernel.frontend.tensor import Tensor
        cell = report.load_cell_spec(args.target)
        types = [report.parse_input_spec(t) for t in args.input]
        check_input_count(cell, len(types))
        rng = np.random.default_rng(args.seed)
        inputs = [Tensor(np.asarray(rng.standard_normal(t.shape)).astype(t.dtype)) for t in types]
        sources: report.Source = report.compare(cell, *inputs)
    elif args.target.endswith(".onnx"):
        sources = _onnx_report_entry(args.target, args.input)
    else:
        if args.input:
            raise report.ReportError("--input goes with a FILE.py:CellClass or MODEL.onnx "
                                     "target, e.g. graphkernel report net.py:Net --input "
                                     "float32[4,4]")
        if args.target.endswith(".py") or (sep and ".py" in args.target):
            raise report.ReportError(f"{args.target!r}: name the cell class after the file, "
                                     "e.g. net.py:Net")
        sources = args.target
    out = args.out or default_report_path(args.target)
    print(report.write_report(sources, out, repeats=args.repeats, seed=args.seed))
    return 0


def default_report_path(target: str) -> str:
    """Where `graphkernel report TARGET` writes without --out: beside its input, never in the
    folder the command happens to run in (a checkout's root, say). A save_graphs folder gets
    FOLDER/report.html; FILE.py:Cell gets FILE_report.html beside FILE.py, MODEL.onnx
    MODEL_report.html beside it."""
    if target.endswith(".onnx"):
        return os.path.splitext(target)[0] + "_report.html"
    path, sep, _ = target.rpartition(":")
    if sep and path.endswith(".py"):
        return os.path.splitext(path)[0] + "_report.html"
    return os.path.join(target, "report.html")


def _onnx_report_entry(path: str, specs: list[str]) -> ReportEntry:
    """An ONNX model loaded with fusion on and off (explicit options, the context is not
    touched), each input at the static shape `--input` gives (a size for each dim_param)."""
    from graphkernel.graph_kernel.pipeline import CompileOptions
    from graphkernel.onnx import importer
    from graphkernel.tools import report
    names = importer.input_names(path)
    types = [report.parse_input_spec(s) for s in specs]
    if len(types) != len(names):
        raise report.ReportError(f"{path} takes {len(names)} input(s) ({', '.join(names)}): "
                                 f"give one --input each, got {len(types)}")
    # parse_input_spec gives whole numbers only: a static shape per input
    shapes = {name: tuple(int(d) for d in t.shape) for name, t in zip(names, types)}
    fused, plain = (importer.load_path(path, shapes, CompileOptions(enable_graph_kernel=on))
                    for on in (True, False))
    for name, type_ in fused.signature:
        given = types[names.index(name)]
        if type_.dtype != given.dtype:
            raise report.ReportError(f"{path}: input {name!r} is {type_}, --input gave {given}")
    assert fused.compiled is not None and plain.compiled is not None  # an import compiles
    return report.ReportEntry(os.path.basename(path), fused.compiled, plain.compiled)


def _cmd_tune(args: argparse.Namespace) -> int:
    """Compile a model with fusion on and `--online_tuning=LEVEL`: each kernel's schedule is
    measured here and stored in the kernel cache, where later compiles of it find it."""
    import numpy as np

    from graphkernel.frontend.compile import compile as gk_compile
    from graphkernel.frontend.tensor import Tensor
    from graphkernel.graph_kernel.flags import parse_flags
    from graphkernel.graph_kernel.pipeline import CompileOptions
    from graphkernel.tools.cellspec import check_input_count, load_cell_spec, parse_input_spec
    from graphkernel.tools.report_page import ReportError
    options = CompileOptions(enable_graph_kernel=True,
                             flags=parse_flags(f"--online_tuning={args.level}"))
    types = [parse_input_spec(t) for t in args.input]
    path, sep, _ = args.model.rpartition(":")
    if sep and path.endswith(".py"):
        cell = load_cell_spec(args.model)
        check_input_count(cell, len(types))
        rng = np.random.default_rng(0)
        inputs = [Tensor(np.asarray(rng.standard_normal(t.shape)).astype(t.dtype))
                  for t in types]
        compiled = gk_compile(cell, *inputs, options=options)
    elif args.model.endswith(".onnx"):
        from graphkernel.onnx import importer
        names = importer.input_names(args.model)
        if len(types) != len(names):
            raise ReportError(f"{args.model} takes {len(names)} input(s) ({', '.join(names)}): "
                              f"give one --input each, got {len(types)}")
        shapes = {n: tuple(int(d) for d in t.shape) for n, t in zip(names, types)}
        loaded = importer.load_path(args.model, shapes, options)
        assert loaded.compiled is not None  # an import compiles
        compiled = loaded.compiled
    else:
        raise ReportError(f"{args.model!r}: give FILE.py:CellClass or MODEL.onnx, e.g. "
                          "graphkernel tune net.py:Net --input float32[4,4]")
    from graphkernel.backends.c import calibration
    from graphkernel.backends.c.tuning import machine_rates
    notes = compiled.executable.plan.schedule_notes
    kernels = [k for k in compiled.kernels if k.backend == "native"]
    print(f"this machine: {machine_rates().describe()}")
    defaults = calibration.resolve()
    print("untuned defaults (what a kernel without a record uses):")
    for line in defaults.lines():
        print(f"  {line}")
    print(f"{compiled.name}: {len(kernels)} generated kernel(s), compiled and tuned in "
          f"{compiled.compile_seconds:.1f} s")
    for step in compiled.executable.plan.kernel_steps():
        if step.kernel is not None:
            print(f"  {step.name}: {notes.get(step.kernel.name, 'defaults')}")
    for warning in compiled.warnings:
        print(f"warning: {warning}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from graphkernel.tools.doctor import doctor
    text, ok = doctor()
    print(text)
    return 0 if ok else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    # The benchmark harness sits beside the package, not in it: run it as its own program
    # (`python -m bench`, which re-executes itself with its environment anyway) rather than
    # importing it into the CLI. -P: the `bench` found here, not a folder of that name in the
    # user's working directory.
    if importlib.util.find_spec("bench") is None:
        print("graphkernel: error: the benchmark package `bench` is not importable; run from "
              "a source checkout (python -m bench)", file=sys.stderr)
        return 2
    try:
        # GK_BENCH_PROG: its usage lines name the command the user typed.
        env = dict(os.environ, GK_BENCH_PROG="graphkernel bench")
        return subprocess.call([sys.executable, "-P", "-m", "bench", *args.bench_args], env=env)
    except KeyboardInterrupt:  # the child got the same interrupt and has stopped
        return 130


def build_parser() -> argparse.ArgumentParser:
    """The `graphkernel` command line (tests/test_first_hour.py checks every option has help)."""
    parser = argparse.ArgumentParser(prog="graphkernel", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    lab_help = ("run the seed lab's four scenarios, check its conclusions and write "
                "OUT/report.html")
    lab = sub.add_parser("lab", help=lab_help, description=lab_help)
    lab.add_argument("--out", default="lab_output", help="folder for the scenario folders")
    lab.add_argument("--seed", type=int, default=0,
                     help="seed of the scenarios' random inputs (default 0)")
    lab.add_argument("--report", default=None, metavar="FILE",
                     help="where to write the HTML report (default: OUT/report.html)")
    lab.add_argument("--no-report", action="store_true",
                     help="skip the HTML report (it times every kernel: a few seconds)")
    lab.set_defaults(fn=_cmd_lab)
    render_help = "render a .dot file (a save_graphs dump) to PNG or SVG"
    render = sub.add_parser("render", help=render_help, description=render_help)
    render.add_argument("dot", help="the .dot file, e.g. lab_output/test_basic_fuse/"
                        "hwopt_d_end.dot")
    render.add_argument("-o", "--output", default=None, metavar="OUT.png|OUT.svg",
                        help="the picture to write; its suffix picks the format (default: "
                        "beside the .dot file, as a .png)")
    render.set_defaults(fn=_cmd_render)
    report_help = ("an HTML page of what fusion did: graphs side by side, kernels timed with "
                   "and without fusion, reasons, C, stages")
    rep = sub.add_parser("report", help=report_help, description=report_help)
    rep.add_argument("target", nargs="?", default=".",
                     help="a save_graphs folder (or a folder of them, like the lab's output), or "
                     "FILE.py:CellClass or MODEL.onnx to compile and time with fusion on "
                     "and off")
    rep.add_argument("--out", default=None, metavar="FILE.html",
                     help="the HTML file to write (default: beside the input: FOLDER/report.html,"
                     " FILE_report.html beside FILE.py, MODEL_report.html beside MODEL.onnx)")
    rep.add_argument("--input", action="append", default=[], metavar="DTYPE[SHAPE]",
                     help="with FILE.py:CellClass or MODEL.onnx, one per input: dtype and "
                     "shape, e.g. float32[4,4]")
    rep.add_argument("--repeats", type=int, default=50, help="timing samples per executable")
    rep.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    rep.set_defaults(fn=_cmd_report)
    tune_help = ("measure each generated kernel's schedule (threads, streaming stores, prefetch) "
                 "and, where oneDNN is installed, which library runs each convolution "
                 "on this machine and store the choice in the kernel cache, keyed by the CPU "
                 "model: later compiles of the same kernels use it (set_context("
                 "graph_kernel_flags='--online_tuning=N') does the same while compiling)")
    tune = sub.add_parser("tune", help="tune a model's kernels on this machine ahead of time",
                          description=tune_help)
    tune.add_argument("model", help="FILE.py:CellClass or MODEL.onnx")
    tune.add_argument("--input", action="append", default=[], metavar="DTYPE[SHAPE]",
                      help="one per input: dtype and shape, e.g. float32[4,4]")
    tune.add_argument("--level", type=int, default=2, choices=(1, 2, 3),
                      help="--online_tuning level: 1 each choice alone, 2 (default) and 3 every "
                      "combination, with a longer time budget")
    tune.set_defaults(fn=_cmd_tune)
    doctor_help = ("what this machine offers graphkernel: C compiler, OpenMP runtime, vector "
                   "math library, Graphviz renderer, kernel cache folder; exit status 1 without a "
                   "working C compiler or with a kernel cache folder it refuses")
    doctor = sub.add_parser("doctor", help="what this machine offers graphkernel",
                            description=doctor_help)
    doctor.set_defaults(fn=_cmd_doctor)
    bench = sub.add_parser("bench", add_help=False, prefix_chars="\0",
                           help="benchmarks against numpy, numexpr, PyTorch, torch.compile, "
                           "jax.jit, ONNX Runtime, MindSpore and the copy floor (python -m "
                           "bench; `graphkernel bench --help` for its options)")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(fn=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except GraphKernelError as err:
        print(f"graphkernel: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
