"""Where two threads lose what one thread wins: per-step thread CPU time of a compiled model.

For each step of the plan (run one by one on the Python runner, as `Runner.profile` does) it
reads every thread's CPU time (`/proc/self/task/*/schedstat`, nanoseconds) before and after the
step and reports the step's wall time, the CPU time summed over threads and the most any one
thread took. A step whose threads' sum is close to their max ran on one thread (serial); a
parallel step whose max is well over sum/threads is unbalanced. Then the whole compiled call
(the C entry where the plan has one) is timed the same way, so products split inside the entry
are counted too. Process CPU and wall are per call.

    python -m bench.thread_steps MODEL [--threads 1,2] [--calls N] [--steps K]
    python -m bench.thread_steps onnx_bert_b8 --openvino [--rounds R]  # beside OpenVINO

MODEL: bert2, bert12 (the bench's BERT-base layers, bench/real.py `bert_base_row`),
onnx_bert_b8 / onnx_gpt2_b8 (transformers' BertModel / GPT2Model through ONNX),
resnet18_b1 / resnet50_b1 / mobilenetv2_b8 (or _b1 / _b8: inference, 224x224),
onnx_mobilenetv3_b1 / onnx_resnet18_b1 (or _b8: the bench's ONNX export, `--openvino` too;
the graphkernel.nn CNNs go to OpenVINO through torch's export of the same weights),
resnet50_train_b2 / _b4, or a
main-suite workload by its key prefixed `suite:` (bench/workloads.py `full_suite`, the first
key that starts with what follows: `suite:mlp` the MLP block, `suite:encoder`, `suite:bert`).
Each thread count runs in a new process (OMP_NUM_THREADS is read once per process).
Prints a table; `--json` prints one JSON object per thread count.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

MARK = "THREAD-STEPS "


def bench_environ() -> dict[str, str]:
    """This process's environment as the bench runs (bench/cli.py): without OPENBLAS_CORETYPE
    and OPENBLAS_L2_SIZE, which some machines set for old OpenBLAS builds (OPENBLAS_CORETYPE=
    Haswell held numpy's OpenBLAS 0.3.31 to AVX2 kernels on the AVX-512 EPYC host: ~115
    GFLOP/s a thread against ~215)."""
    from bench.cli import REMOVE
    return {k: v for k, v in os.environ.items() if k not in REMOVE}


def thread_times() -> dict[int, int]:
    """Each thread of this process: its CPU time so far in nanoseconds."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except OSError:  # the thread ended between the listing and the read
            continue
    return out


def sleeps() -> int:
    """Times this process's threads have gone to sleep so far (voluntary context switches: an
    OpenMP worker waiting passively for the next parallel region, a futex wait)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                total += next(int(line.split()[1]) for line in f
                              if line.startswith("voluntary_ctxt_switches"))
        except (OSError, StopIteration):  # the thread ended between the listing and the read
            continue
    return total


def spent(before: dict[int, int], after: dict[int, int]) -> list[int]:
    """CPU nanoseconds each thread spent between two snapshots (threads started since: all)."""
    return [t - before.get(tid, 0) for tid, t in after.items() if t > before.get(tid, 0)]


def _build(model: str, tmp: str) -> tuple[Any, list[Any]]:
    """(compiled callable, its arguments) of `model`, fused (fusion is off by default: the
    options say so, as the bench's fused rows do)."""
    import graphkernel
    from bench import real_systems as rs
    from bench.real import BERT_BASE, _sets
    from bench.real_models import transformer
    from graphkernel.graph_kernel.pipeline import CompileOptions
    if model.startswith("bert"):
        from bench.real_models import encoder_params, gk_encoder
        d = BERT_BASE
        params = encoder_params(int(model[4:]), d["hidden"], d["inner"])
        cell = gk_encoder(params, d["batch"], d["seq"], d["hidden"], d["heads"])
        x = _sets([(d["batch"], d["seq"], d["hidden"])], 1)[0]
        exe = graphkernel.compile(cell, *x, options=CompileOptions(enable_graph_kernel=True))
        return exe, [graphkernel.Tensor(a) for a in x]
    if model.startswith(("onnx_bert_b", "onnx_gpt2_b")):
        from bench.real_systems import fix_batch, torch_export
        from graphkernel import nn
        name, batch = model.split("_")[1], int(model.rsplit("b", 1)[1])
        net, names, sets, _ = transformer(name, batch)
        path, fixed = os.path.join(tmp, "net.onnx"), os.path.join(tmp, "net_fixed.onnx")
        torch_export(net, sets[0], names, path, dynamic_batch=True, opset=17)
        fix_batch(path, batch, fixed)
        from graphkernel.frontend import context
        context.set_context(enable_graph_kernel=True)  # the import fuses as the context says
        compiled = nn.GraphCell(graphkernel.load(fixed)).compiled
        return compiled, [graphkernel.Tensor(a) for a in sets[0]]
    if model.startswith(("onnx_mobilenetv3_b", "onnx_resnet18_b")):  # onnx_model_row's export
        import torch

        from bench.real_models import randomise_torch_batchnorm, torch_cnn
        from bench.real_systems import fix_batch, torch_export
        from graphkernel import nn
        name, batch = model.split("_")[1], int(model.rsplit("b", 1)[1])
        torch.manual_seed(0)
        tnet = torch_cnn(name, gk_padding=False)
        randomise_torch_batchnorm(tnet)
        x = _sets([(batch, 3, 224, 224)], 1)[0]
        path, fixed = os.path.join(tmp, "net.onnx"), os.path.join(tmp, "net_fixed.onnx")
        torch_export(tnet, x, ["x"], path, dynamic_batch=True, opset=17)
        fix_batch(path, batch, fixed)
        from graphkernel.frontend import context
        context.set_context(enable_graph_kernel=True)
        compiled = nn.GraphCell(graphkernel.load(fixed)).compiled
        return compiled, [graphkernel.Tensor(a) for a in x]
    if model.startswith(("resnet18_b", "resnet50_b", "mobilenetv2_b")):  # cnn_row's, 224x224
        from bench.real_models import gk_cnn, gk_params, load_into_torch, torch_cnn
        from bench.real_systems import torch_export
        batch = int(model.rsplit("b", 1)[1])
        x = _sets([(batch, 3, 224, 224)], 1)[0]
        net = gk_cnn(model.split("_")[0])
        net.set_train(False)
        if os.environ.get("THREAD_STEPS_ONNX"):  # --openvino: the same weights through ONNX
            tnet = torch_cnn(model.split("_")[0])
            load_into_torch(tnet, gk_params(net))
            torch_export(tnet, x, ["x"], os.path.join(tmp, "net_fixed.onnx"),
                         dynamic_batch=False)
        exe = graphkernel.compile(net, *x, options=CompileOptions(enable_graph_kernel=True))
        return exe, [graphkernel.Tensor(a) for a in x]
    if model.startswith("resnet50_train_b"):
        from bench.real_models import gk_cnn
        batch = int(model.rsplit("b", 1)[1])
        sets = _sets([(batch, 3, 224, 224), (batch, 1000)], 1)
        net = gk_cnn("resnet50")
        net.set_train(True)
        call, _ = rs.gk_train(net, sets, True)
        return call, [0]
    if model.startswith("suite:"):
        from bench.gk_cells import make_cell
        from bench.workloads import full_suite, make_arrays
        found = [w for w in full_suite() if w.key.startswith(model[6:])]
        if not found:
            raise SystemExit(f"no main-suite workload starts with {model[6:]!r}")
        inputs, weights = make_arrays(found[0])
        arrays = list(inputs.values())
        exe = graphkernel.compile(make_cell(found[0], weights), *arrays,
                                  options=CompileOptions(enable_graph_kernel=True))
        return exe, [graphkernel.Tensor(a) for a in arrays]
    raise SystemExit(f"unknown model {model!r}")


def beside_openvino(model: str, calls: int, rounds: int) -> dict[str, Any]:
    """Whole calls of an ONNX model (onnx_bert_b8, onnx_gpt2_b8) in graphkernel and in OpenVINO
    on the same ONNX file, at this process's OMP_NUM_THREADS (OpenVINO's
    INFERENCE_NUM_THREADS likewise), alternating `rounds` times: per call, the median wall and
    process CPU of each."""
    import openvino as ov

    from bench.peers import OPENVINO_CONFIG
    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    os.environ["THREAD_STEPS_ONNX"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        fn, args = _build(model, tmp)
        compiled = ov.Core().compile_model(os.path.join(tmp, "net_fixed.onnx"), "CPU",
                                           dict(OPENVINO_CONFIG, INFERENCE_NUM_THREADS=threads))
        request = compiled.create_infer_request()
        feeds = [a.asnumpy() for a in args]
        runs: dict[str, Callable[[], Any]] = {"graphkernel": lambda: fn(*args),
                                              "openvino": lambda: request.infer(feeds)}
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
        for run in runs.values():
            run()
            run()
        for _ in range(rounds):
            for name, run in runs.items():
                p0, w0 = time.process_time(), time.perf_counter()
                for _ in range(calls):
                    run()
                got[name].append(((time.perf_counter() - w0) / calls,
                                  (time.process_time() - p0) / calls))
        out: dict[str, Any] = {"model": model, "threads": threads, "load": os.getloadavg()[0]}
        for name, xs in got.items():
            out[name] = {"wall": sorted(x[0] for x in xs)[len(xs) // 2],
                         "cpu": sorted(x[1] for x in xs)[len(xs) // 2]}
        return out


def _step_label(step: Any) -> str:
    op = step.op or (step.op_names[0] if step.op_names else "")
    return f"{step.kind.value}:{op}" if step.kind.value != "kernel" else \
        f"kernel:{'+'.join(dict.fromkeys(step.op_names))[:40]}"


def measure(model: str, calls: int, steps: bool = True) -> dict[str, Any]:
    """Per-step (`steps`) and whole-call thread times of `model` in this process."""
    chunks = os.environ.get("THREAD_STEPS_CHUNKS")
    if chunks:  # an A/B variant: products' chunks per thread (backends/c/c_gemm.py)
        from graphkernel.backends.c import c_gemm
        c_gemm.PRODUCT_CHUNKS_PER_THREAD = int(chunks)
    with tempfile.TemporaryDirectory() as tmp:
        fn, args = _build(model, tmp)
        call: Callable[[], Any] = (lambda: fn(*args)) if not isinstance(args[0], int) \
            else (lambda: fn(0))
        call()
        call()  # warm: pools, first-touch pages, the prefault thread finished
        rows: list[dict[str, Any]] = []
        executable = getattr(fn, "executable", None)
        if executable is not None and steps:  # per step: the Python runner, step by step
            runner, plan = executable.runner, executable.plan
            arrays = executable.check_inputs([a.asnumpy() for a in args])
            weights = fn._weights()
            acc: dict[int, list[float]] = {}
            for _ in range(calls):
                slots = list(runner._template)
                for s, a in zip(plan.inputs, arrays):
                    slots[s] = a
                for s, a in zip(plan.weights, weights):
                    slots[s] = a
                for i, (step_fn, dead) in enumerate(zip(runner.step_fns, plan.release)):
                    t0, w0 = thread_times(), time.perf_counter()
                    step_fn(slots)
                    w1, t1 = time.perf_counter(), thread_times()
                    for s in dead:
                        slots[s] = None
                    each = spent(t0, t1)
                    a = acc.setdefault(i, [0.0, 0.0, 0.0])
                    a[0] += w1 - w0
                    a[1] += sum(each) / 1e9
                    a[2] += max(each, default=0) / 1e9
            for i, (wall, cpu, most) in acc.items():
                step = plan.steps[i]
                rows.append({"step": i, "what": _step_label(step), "wall": wall / calls,
                             "cpu": cpu / calls, "max_thread": most / calls})
        s0, p0, t0, w0 = sleeps(), time.process_time(), thread_times(), time.perf_counter()
        for _ in range(calls):
            call()
        w1, t1, p1, s1 = time.perf_counter(), thread_times(), time.process_time(), sleeps()
        each = sorted(spent(t0, t1), reverse=True)
        return {"model": model, "threads": os.environ.get("OMP_NUM_THREADS"), "chunks": chunks,
                "load": os.getloadavg()[0], "call_wall": (w1 - w0) / calls,
                "call_cpu": (p1 - p0) / calls, "call_sleeps": (s1 - s0) / calls,
                "call_threads": [e / 1e9 / calls for e in each],
                "steps": rows}


def summarise(result: dict[str, Any], top: int) -> list[str]:
    r = result
    lines = [f"{r['model']} OMP_NUM_THREADS={r['threads']} load {r['load']:.1f}: call wall "
             f"{r['call_wall'] * 1e3:.1f} ms, process CPU {r['call_cpu'] * 1e3:.1f} ms, "
             f"{r.get('call_sleeps', 0):.0f} thread sleeps, per thread "
             f"{', '.join(f'{t * 1e3:.1f}' for t in r['call_threads'][:4])} ms"]
    steps = r["steps"]
    if not steps:
        return lines
    threads = int(r["threads"] or 1)
    serial = [s for s in steps if s["cpu"] > 0 and s["max_thread"] >= 0.9 * s["cpu"]]
    lines.append(f"  steps: wall {sum(s['wall'] for s in steps) * 1e3:.1f} ms, CPU "
                 f"{sum(s['cpu'] for s in steps) * 1e3:.1f} ms; serial steps (one thread "
                 f">=90% of the step's CPU): {len(serial)}/{len(steps)}, wall "
                 f"{sum(s['wall'] for s in serial) * 1e3:.1f} ms")
    if threads > 1:
        par = [s for s in steps if s not in serial]
        excess = sum(s["max_thread"] - s["cpu"] / threads for s in par)
        lines.append(f"  parallel steps: CPU {sum(s['cpu'] for s in par) * 1e3:.1f} ms, "
                     f"max thread {sum(s['max_thread'] for s in par) * 1e3:.1f} ms, imbalance "
                     f"(max - sum/threads) {excess * 1e3:.1f} ms")
    lines.append("  heaviest steps by wall (ms): wall, CPU sum, max thread")
    for s in sorted(steps, key=lambda s: -s["wall"])[:top]:
        lines.append(f"    {s['step']:4d} {s['what']:<48s} {s['wall'] * 1e3:7.2f} "
                     f"{s['cpu'] * 1e3:7.2f} {s['max_thread'] * 1e3:7.2f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12, help="heaviest steps listed")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--blas-threads", default="",
                    help="OPENBLAS_NUM_THREADS (default: as OMP_NUM_THREADS); 1 runs the "
                         "step-by-step products on one thread, so kernels' threading shows alone")
    ap.add_argument("--ab-chunks", default="",
                    help="A/B: e.g. 1,2 compares products' chunks per thread, whole calls only, "
                         "one process per variant, alternating for --rounds rounds")
    ap.add_argument("--ab-wait", default="",
                    help="A/B: e.g. passive,spin:20000 compares OpenMP's passive wait with a "
                         "bounded spin (GOMP_SPINCOUNT), whole calls only, alternating")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-steps", action="store_true", help="whole calls only")
    ap.add_argument("--openvino", action="store_true",
                    help="ONNX models: graphkernel beside OpenVINO on the same file, whole calls "
                         "alternating for --rounds rounds, at each thread count")
    args = ap.parse_args(argv)
    if args.inner:
        result = beside_openvino(args.model, args.calls, args.rounds) if args.openvino else \
            measure(args.model, args.calls, not args.no_steps)
        print(MARK + json.dumps(result), flush=True)
        return
    if args.ab_chunks or args.ab_wait:
        ab(args)
        return
    for n in args.threads.split(","):
        env = dict(bench_environ(), OMP_NUM_THREADS=n,
                   OPENBLAS_NUM_THREADS=args.blas_threads or n,
                   OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
        out = subprocess.run([sys.executable, "-m", "bench.thread_steps", args.model,
                              "--calls", str(args.calls), "--inner"] +
                             (["--no-steps"] if args.no_steps else []) +
                             (["--openvino", "--rounds", str(args.rounds)] if args.openvino
                              else []), env=env,
                             capture_output=True, text=True, check=False)
        line = [x for x in out.stdout.splitlines() if x.startswith(MARK)]
        if not line:
            raise SystemExit(f"{args.model} at {n} threads failed:\n{out.stderr[-3000:]}")
        result = json.loads(line[0][len(MARK):])
        if args.openvino and not args.json:
            gk, ovr = result["graphkernel"], result["openvino"]
            print(f"{args.model} threads {n} load {result['load']:.1f}: graphkernel wall "
                  f"{gk['wall'] * 1e3:.1f} ms CPU {gk['cpu'] * 1e3:.1f} ms; OpenVINO wall "
                  f"{ovr['wall'] * 1e3:.1f} ms CPU {ovr['cpu'] * 1e3:.1f} ms; ratio wall "
                  f"{gk['wall'] / ovr['wall']:.2f}x, CPU {gk['cpu'] / ovr['cpu']:.2f}x",
                  flush=True)
            continue
        print(json.dumps(result) if args.json else "\n".join(summarise(result, args.steps)),
              flush=True)


def _inner(model: str, calls: int, env: dict[str, str], steps: bool) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.thread_steps", model, "--calls",
                          str(calls), "--inner"] + ([] if steps else ["--no-steps"]), env=env,
                         capture_output=True, text=True, check=False)
    line = [x for x in out.stdout.splitlines() if x.startswith(MARK)]
    if not line:
        raise SystemExit(f"{model} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(line[0][len(MARK):])
    return result


def wait_variant(spec: str) -> dict[str, str]:
    """The environment of one OpenMP wait variant: `passive` (graphkernel's default, a worker
    sleeps on a futex as soon as a parallel region ends), or `spin:N` (libgomp's
    GOMP_SPINCOUNT=N with no wait policy: a worker spins about N/100000 ms before it sleeps;
    OMP_WAIT_POLICY=PASSIVE would override any spin count)."""
    if spec == "passive":
        return {"OMP_WAIT_POLICY": "PASSIVE"}
    if spec.startswith("spin:") and spec[5:].isdigit():
        return {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": spec[5:]}
    raise SystemExit(f"--ab-wait: {spec!r} is neither 'passive' nor 'spin:N'")


def ab(args: argparse.Namespace) -> None:
    """Whole-call process CPU, wall and thread sleeps of each variant at each thread count,
    alternating: products' chunks per thread (--ab-chunks, each with a kernel cache of its
    own: the count is compiled in) or OpenMP's wait (--ab-wait)."""
    if args.ab_chunks:
        what = "chunks/thread"
        variants = {v: {"THREAD_STEPS_CHUNKS": v} for v in args.ab_chunks.split(",")}
    else:
        what = "wait"
        variants = {v: wait_variant(v) for v in args.ab_wait.split(",")}
    got: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as caches:
        for _ in range(args.rounds):
            for n in args.threads.split(","):
                for v, extra in variants.items():
                    env = dict(bench_environ(), OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n,
                               OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
                    env.pop("GOMP_SPINCOUNT", None)
                    env.update(extra)
                    if args.ab_chunks:
                        env["GRAPHKERNEL_CACHE_DIR"] = os.path.join(caches, v)
                    got.setdefault((n, v), []).append(_inner(args.model, args.calls, env, False))

    def median(runs: list[dict[str, Any]], key: str) -> float:
        return float(sorted(r.get(key, 0.0) for r in runs)[len(runs) // 2])
    base = next(iter(variants))
    for n in args.threads.split(","):
        for v in variants:
            runs, ref = got[(n, v)], got[(n, base)]
            cpu, wall = median(runs, "call_cpu"), median(runs, "call_wall")
            cpu0, wall0 = median(ref, "call_cpu"), median(ref, "call_wall")
            loads = ", ".join(f"{r['load']:.1f}" for r in runs)
            print(f"{args.model} threads {n} {what} {v}: median process CPU "
                  f"{cpu * 1e3:.1f} ms ({cpu / cpu0:.3f}x), wall {wall * 1e3:.1f} ms "
                  f"({wall / wall0:.3f}x), {median(runs, 'call_sleeps'):.1f} thread sleeps a "
                  f"call; load {loads}", flush=True)


if __name__ == "__main__":
    main()
