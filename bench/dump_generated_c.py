"""Write every C library graphkernel generates for a fixed set of graphs to a folder, one file
per library, so two versions of the compiler can be compared with `diff -r`.

The graphs: the bench's quick workloads (elementwise chains, LayerNorm, Softmax, an MLP, an
encoder layer, two training steps, the digits CNN, BERT-tiny), fused with static shapes,
shape-generic and unfused, and the lab's composite scenarios (fused and unfused). With --full,
the bench's full suite instead of the quick one: the sizes `python -m bench` times, whose
kernels (GEMM blocking, conv blocks, parallel splits) differ from the small sizes' (a minute or
two more: every workload is compiled and called once at full size).

    python -m bench.dump_generated_c [--full] OUT_DIR

The whole-graph compile cache is turned off so that every graph is planned and generated
again; the kernel cache (GRAPHKERNEL_CACHE_DIR) may be shared: the source is recorded before it
is looked up.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np


def _library_module() -> Any:
    """The module that keys a whole library's C source (moved by issue 29)."""
    for name in ("graphkernel.backends.c.library", "graphkernel.codegen.library"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError("graphkernel's C library builder")


class _Recorder:
    """Keeps each distinct library source `_key` is asked about, under the current label."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir, self.label, self.count, self.seen = out_dir, "", 0, set[str]()

    def wrap(self, key_fn: Callable[..., str]) -> Callable[..., str]:
        def key(tc: Any, source: str, *args: Any) -> str:
            digest = hashlib.sha256(source.encode()).hexdigest()
            if (self.label, digest) not in self.seen:
                self.seen.add((self.label, digest))
                self.count += 1
                folder = os.path.join(self.out_dir, self.label)
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, f"{self.count:02d}.c"), "w") as f:
                    f.write(source)
            return key_fn(tc, source, *args)
        return key

    def start(self, label: str) -> None:
        self.label, self.count = label, 0


def main(argv: list[str]) -> int:
    full = "--full" in argv
    paths = [a for a in argv if a != "--full"]
    if len(paths) != 1 or paths[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = os.path.abspath(paths[0])
    os.makedirs(out_dir, exist_ok=True)
    os.environ["GRAPHKERNEL_COMPILE_CACHE"] = "0"
    from bench.systems import GraphKernel
    from bench.workloads import full_suite, input_sets, quick_suite
    from graphkernel import context
    from graphkernel.tools import lab

    library = _library_module()
    recorder = _Recorder(out_dir)
    library._key = recorder.wrap(library._key)
    # The three ways the bench times graphkernel: fused, shape-generic, unfused (one kernel
    # per op: the single-op kernels' C).
    for system in (GraphKernel(fused=True), GraphKernel(fused=True, generic=True),
                   GraphKernel(fused=False)):
        for w in full_suite() if full else quick_suite():
            if system.supports(w) is not None:
                continue
            recorder.start(f"{system.key}/{w.key}")
            sets, params = input_sets(w, [0])
            saved = context.snapshot()
            try:
                system.prepare(w, sets, params, [0])
            finally:
                context.restore(saved)
    with tempfile.TemporaryDirectory() as tmp:
        for name, net_cls, fusion in lab.SCENARIOS:
            recorder.start(f"lab/{name}")
            lab.run_scenario(name, net_cls, fusion, tmp, np.random.default_rng(0),
                             render_pictures=False)
    print(f"{len(recorder.seen)} library sources under {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
