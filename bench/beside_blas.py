"""Fused against unfused on the BERT rows, alternating in one process (issue #30 item 6).

`python -m bench.beside_blas [--rounds N] [--layers L]`: the ONNX BERT export of
bench/real.py's onnx_bert_b8 row (4 layers, hidden 256, batch 8) and a shallow BERT-base
encoder (bench/real.py's bert_base row with L layers, hidden 768, batch 8, seq 128), each
compiled fused and unfused; then rounds of one call each, alternating, timed by wall clock and
by this process's CPU time (spinning threads show as CPU time beyond wall time x busy cores).
Prints the median per system and the fused/unfused ratio."""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _onnx_bert(tmp: str) -> tuple[str, list[list[np.ndarray]]]:
    from bench.real_models import transformer
    from bench.real_systems import fix_batch, torch_export
    net, names, sets, _ = transformer("bert", 8)
    path, fixed = os.path.join(tmp, "bert_dynamic.onnx"), os.path.join(tmp, "bert_b8.onnx")
    torch_export(net, sets[0], names, path, dynamic_batch=True)
    fix_batch(path, 8, fixed)
    return fixed, sets


def systems(layers: int, which: str) -> dict[str, Callable[[int], Any]]:
    from bench.real import BERT_BASE, _sets
    from bench.real_models import encoder_params, gk_encoder
    from bench.real_systems import gk_inference, gk_loaded
    out: dict[str, Callable[[int], Any]] = {}
    if which in ("all", "onnx"):
        tmp = tempfile.mkdtemp(prefix="gk-beside-blas-")
        path, sets = _onnx_bert(tmp)
        for fused in (True, False):
            out[f"onnx_bert_b8 {'fused' if fused else 'unfused'}"] = gk_loaded(path, sets,
                                                                                fused)[0]
    if which in ("all", "base"):
        d = BERT_BASE
        params = encoder_params(layers, d["hidden"], d["inner"])
        sets = _sets([(d["batch"], d["seq"], d["hidden"])], 2)
        for fused in (True, False):
            cell = gk_encoder(params, d["batch"], d["seq"], d["hidden"], d["heads"])
            out[f"bert_base_{layers}l {'fused' if fused else 'unfused'}"] = gk_inference(
                cell, sets, fused)[0]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--only", choices=("all", "onnx", "base"), default="all")
    args = p.parse_args(argv)
    calls = systems(args.layers, args.only)
    for call in calls.values():  # warm: first calls fault in buffers
        call(0)
        call(1)
    wall: dict[str, list[float]] = {k: [] for k in calls}
    cpu: dict[str, list[float]] = {k: [] for k in calls}
    for r in range(args.rounds):
        for name, call in calls.items():
            w0, c0 = time.perf_counter(), time.process_time()
            call(r % 2)
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    env = {k: os.environ.get(k, "unset") for k in
           ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")}
    print(f"{args.rounds} rounds alternating; {env}; load {os.getloadavg()[0]:.1f}")
    for name in calls:
        print(f"{name:26s} wall median {1e3 * statistics.median(wall[name]):8.1f} ms "
              f"min {1e3 * min(wall[name]):8.1f}  cpu median "
              f"{1e3 * statistics.median(cpu[name]):8.1f} ms")
    for name in calls:
        if name.endswith(" fused"):
            base = name[:-len(" fused")]
            ratio = statistics.median(wall[name]) / statistics.median(wall[base + " unfused"])
            print(f"{base}: fused / unfused (wall medians) {ratio:.2f}")


if __name__ == "__main__":
    main()
