"""The `graphkernel` command: lab, render, report, doctor, bench."""
from __future__ import annotations

import argparse
import sys

from graphkernel.errors import GraphKernelError


def _cmd_lab(args: argparse.Namespace) -> int:
    from graphkernel.tools.lab import run_lab
    _, found = run_lab(args.out, seed=args.seed)
    if args.report:
        from graphkernel.tools.report import write_lab_report
        print(f"report: {write_lab_report(args.out, args.report)}")
    return 0 if all(c.holds for c in found) else 1


def _cmd_render(args: argparse.Namespace) -> int:
    from graphkernel.tools.render import render
    print(render(args.dot, args.output))
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from graphkernel.tools.doctor import doctor
    text, ok = doctor()
    print(text)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="graphkernel", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    lab = sub.add_parser("lab", help="run the seed lab's four scenarios and check its conclusions")
    lab.add_argument("--out", default="lab_output", help="folder for the scenario folders")
    lab.add_argument("--seed", type=int, default=0)
    lab.add_argument("--report", default=None, help="also write an HTML report to this file")
    lab.set_defaults(fn=_cmd_lab)
    render = sub.add_parser("render", help="render a .dot file to PNG or SVG")
    render.add_argument("dot")
    render.add_argument("-o", "--output", default=None, help="OUT.png or OUT.svg")
    render.set_defaults(fn=_cmd_render)
    doctor = sub.add_parser("doctor", help="what this machine offers graphkernel")
    doctor.set_defaults(fn=_cmd_doctor)
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except GraphKernelError as err:
        print(f"graphkernel: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
