"""Calibrated against constant defaults, side by side in one run (issue 30, item 1): each
workload compiled with fusion on twice, once with CConfig's constants and once with the
defaults this machine's calibration gives (backends/c/calibration.py), then called in
alternating rounds (constant, calibrated, constant, ...) so that the load of the machine falls
on both alike. Wall time per call on OMP_NUM_THREADS threads (2 unless set: the thresholds are
about threads); the ratio is what to read.

    python -m bench.calibrated [--suite quick|full] [--only KEY,...] [--out FILE.md]

The kernel cache is a fresh temporary folder: the calibration is measured at the start of the
run (and stored there, not in the user's cache).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

from bench.workloads import SUITES, TRAIN_KINDS, Workload, make_arrays

ROUNDS = 15  # alternating rounds; each times CALLS calls of each side
CALLS = 5
DEFAULT_ONLY = ("softmax_8192x1024,layernorm_8192x1024,bias_gelu_4096x4096,chain8_4096x4096,"
                "encoder_8x128x256,cnn_digits_256")


def _row(w: Workload, calibrated: object) -> dict[str, object]:
    import graphkernel
    from bench.gk_cells import make_cell
    from graphkernel.backends.c.config import CConfig
    from graphkernel.graph_kernel.pipeline import CompileOptions
    inputs, params = make_arrays(w)
    arrays = list(inputs.values())
    sides = {}
    for side, config in (("constant", CConfig()), ("calibrated", calibrated)):
        sides[side] = graphkernel.compile(make_cell(w, params), *arrays, options=CompileOptions(
            enable_graph_kernel=True, backend_config=config))
    want = sides["constant"].run_arrays(*arrays)[0]
    got = sides["calibrated"].run_arrays(*arrays)[0]
    scale = float(np.max(np.abs(want))) or 1.0
    same = bool(np.allclose(got, want, rtol=w.rtol, atol=w.atol * scale))
    texts = {side: exe.executable.kernel_sources for side, exe in sides.items()}
    threaded = {side: sum("#pragma omp parallel" in t for t in texts[side].values())
                for side in sides}
    differ = sum(a != b for a, b in zip(texts["constant"].values(),
                                        texts["calibrated"].values()))
    samples: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(ROUNDS):
        for side, exe in sides.items():
            t = time.perf_counter()
            for _ in range(CALLS):
                exe.run_arrays(*arrays)
            samples[side].append((time.perf_counter() - t) / CALLS)
    constant_ms = statistics.median(samples["constant"]) * 1e3
    calibrated_ms = statistics.median(samples["calibrated"]) * 1e3
    return {"key": w.key, "kernels": len(texts["constant"]), "differ": differ,
            "threaded": threaded, "constant_ms": constant_ms, "calibrated_ms": calibrated_ms,
            "ratio": constant_ms / calibrated_ms, "same": same}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.calibrated", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), default="full",
                        help="workload sizes (default full)")
    parser.add_argument("--only", default=DEFAULT_ONLY, help="comma-separated workload keys")
    parser.add_argument("--out", default=None, help="markdown file to write")
    args = parser.parse_args(argv)
    os.environ["GRAPHKERNEL_CACHE_DIR"] = tempfile.mkdtemp(prefix="gk-bench-calibrated-")
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    os.environ.pop("GRAPHKERNEL_CALIBRATION", None)
    from graphkernel.backends.c import calibration, toolchain
    defaults = calibration.resolve()
    assert defaults.calibration is not None, defaults.origin
    print(f"calibration: {defaults.calibration.describe()} ({defaults.origin})")
    for line in defaults.lines():
        print(f"  {line}")
    only = {k for k in args.only.split(",") if k}
    workloads = [w for w in SUITES[args.suite]() if w.kind not in TRAIN_KINDS and
                 (not only or w.key in only)]
    loads = [os.getloadavg()[0]]
    rows = []
    for w in workloads:
        rows.append(_row(w, defaults.config))
        loads.append(os.getloadavg()[0])
        r = rows[-1]
        print(f"{w.key:<24} constant {r['constant_ms']:8.3f} ms  calibrated "
              f"{r['calibrated_ms']:8.3f} ms  {r['ratio']:.2f}x  ({r['differ']} of "
              f"{r['kernels']} kernels differ; load {loads[-1]:.1f})", flush=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Calibrated against constant defaults, one run ({when})", "",
             f"`python -m bench.calibrated {' '.join(argv if argv is not None else sys.argv[1:])}`"
             f" on {toolchain.cpu_model()} ({os.cpu_count()} CPUs, load {min(loads):.1f}-"
             f"{max(loads):.1f}), Python {platform.python_version()}, OMP_NUM_THREADS="
             f"{os.environ['OMP_NUM_THREADS']}; wall time per call, median of {ROUNDS} "
             f"alternating rounds of {CALLS} calls.", "",
             f"Calibration: {defaults.calibration.describe()}.", "",
             "| setting | constant | calibrated (source) |", "|---|---|---|"]
    from graphkernel.backends.c.config import CConfig
    for name, line in zip(defaults.sources, defaults.lines()):
        lines.append(f"| {name} | {getattr(CConfig(), name)} | {line.split(' = ', 1)[1]} |")
    lines += ["", "| workload | kernels | kernels whose C differs | threaded kernels constant / "
              "calibrated | constant ms | calibrated ms | constant/calibrated | same results |",
              "|---|---:|---:|---|---:|---:|---:|---|"]
    for r in rows:
        threaded = r["threaded"]
        assert isinstance(threaded, dict)
        lines.append(f"| {r['key']} | {r['kernels']} | {r['differ']} | {threaded['constant']} / "
                     f"{threaded['calibrated']} | {r['constant_ms']:.3f} | "
                     f"{r['calibrated_ms']:.3f} | {r['ratio']:.2f}x | "
                     f"{'yes' if r['same'] else 'NO'} |")
    text = "\n".join(lines) + "\n"
    out = args.out or os.path.join(os.path.dirname(__file__), "results",
                                   time.strftime("%Y-%m-%d-calibrated.md", time.gmtime()))
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"written: {out}")
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
