"""Data-parallel step time across two hosts over a rate-limited link, with and without the
gradient exchange overlapped with the backward pass, beside the scaling model's prediction
(docs/scaling.md, "Two hosts over a link").

    .venv/bin/python -m bench.netns_scaling --out bench/results/netns_scaling.md

Needs root, iproute2 and Open MPI, and the repository checkout (it runs examples/ and the
namespace helper of tests/netns.py): two network namespaces joined by a veth pair, one rank in
each, Open MPI over TCP on the veth. For each link rate (tc tbf on both ends) it measures

- the link: latency (half the round trip of 8 bytes, MPI ping-pong) and bandwidth (4 MB
  one way, from its round trip less the latency), the best of their runs;
- one blocking Allreduce of the model's gradient (what a step sends);
- the training step (examples/train_digits_dp.py, median after the first) without buckets
  (one Allreduce after the backward pass) and with buckets (Iallreduce per bucket as soon as
  the backward pass made it, waited before the optimizer).

The compute of a step is one process on a rank's share of the batch (no exchange), two such
processes at once as the two ranks share the machine. The model
predicts each run from those measurements alone: see `predict`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_digits_dp.py")
LIMIT_S = 900  # any one run

PROBE = """
import json, sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
repeats, gradient = int(sys.argv[1]), int(sys.argv[2])

def pingpong(n, repeats):
    buf = np.zeros(n, np.uint8)
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t = time.perf_counter()
        if rank == 0:
            comm.Send(buf, 1); comm.Recv(buf, 1)
        else:
            comm.Recv(buf, 0); comm.Send(buf, 0)
        times.append(time.perf_counter() - t)
    return float(np.min(times))  # the link's own: the least a busy machine added

def allreduce(n, repeats):
    buf = np.ones(n, np.float32)
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buf)
        times.append(time.perf_counter() - t)
    return float(np.median(times))

pingpong(8, 5); pingpong(1 << 22, 2)  # connections up, buffers warm
small = pingpong(8, repeats * 10)
large = pingpong(1 << 22, repeats)
reduce = allreduce(gradient, repeats)
if rank == 0:
    latency = small / 2
    print(json.dumps({"latency_s": latency, "bandwidth_Bps": (1 << 22) / (large / 2 - latency),
                      "allreduce_s": reduce}))
"""


def dense_sizes(layers: int, hidden: int) -> list[tuple[int, int]]:
    sizes = [64, *[hidden] * layers, 10]
    return list(zip(sizes, sizes[1:]))


def gradient_floats(layers: int, hidden: int) -> int:
    return sum(i * o + o for i, o in dense_sizes(layers, hidden))


def ring_allreduce_s(nbytes: float, hosts: int, bandwidth: float, latency: float) -> float:
    """The ring all-reduce: 2(N-1)/N of the bytes cross each link, in 2(N-1) rounds."""
    return 2 * (hosts - 1) / hosts * nbytes / bandwidth + 2 * (hosts - 1) * latency


def two_rank_allreduce_s(nbytes: float, bandwidth: float, latency: float) -> float:
    """Open MPI 4.1's all-reduce of two ranks, blocking (coll tuned) and non-blocking (libnbc:
    in place, fewer than 4 ranks: a binomial tree) alike: a reduce onto one rank, then a
    broadcast. The whole buffer crosses the link twice, one way after the other: twice the
    ring's time at N = 2 (calibrated: the measured Allreduce column)."""
    return 2 * nbytes / bandwidth + 2 * latency


def buckets(layers: int, hidden: int, bucket_mb: float) -> list[tuple[int, int]]:
    """(bytes, layer whose backward makes the bucket's last gradient) of each bucket, in the
    order nn.DistributedGradReducer makes them (last parameter first)."""
    params: list[tuple[int, int]] = []  # (bytes, layer), in parameter order
    for layer, (i, o) in enumerate(dense_sizes(layers, hidden)):
        params += [(4 * i * o, layer), (4 * o, layer)]
    out: list[list[tuple[int, int]]] = []
    filled = 0
    for size, layer in reversed(params):
        if not out or filled + size > bucket_mb * 1e6:
            out.append([])
            filled = 0
        out[-1].append((size, layer))
        filled += size
    return [(sum(s for s, _ in b), min(layer for _, layer in b)) for b in out]


def predict(compute_s: float, layers: int, hidden: int, bucket_mb: float | None,
            bandwidth: float, latency: float, exchange_cpu_s: float = 0.0) -> float:
    """Step time = compute + the communication not overlapped with it.

    Without buckets the exchange follows the whole compute. With buckets, bucket k may leave
    once the backward pass has made its gradients (the backward pass runs the layers last
    first; a layer's share of the compute is its share of the multiply-adds: forward 1,
    backward 2 per weight, 1 for the first layer, which needs no input gradient), and the
    buckets cross the link one after another, a bucket's latency hidden when the link is still
    busy with the one before; the step ends when both the compute and the last bucket are
    done. Overlap needs an idle resource: with every core computing (a rank per core), the
    exchange's own CPU work (`exchange_cpu_s`: copies, TCP, the sum) cannot hide behind the
    compute, only its waiting for the link can; the saving is held to that."""
    shapes = dense_sizes(layers, hidden)
    forward = [i * o for i, o in shapes]
    backward = [(1 if layer == 0 else 2) * f for layer, f in enumerate(forward)]
    total = sum(forward) + sum(backward)
    nbytes = 4 * gradient_floats(layers, hidden)
    exchange = two_rank_allreduce_s(nbytes, bandwidth, latency)
    if bucket_mb is None:
        return compute_s + exchange
    # When the backward pass has finished layer l (it runs len-1 .. 0).
    done_at: dict[int, float] = {}
    elapsed = sum(forward)
    for layer in reversed(range(len(shapes))):
        elapsed += backward[layer]
        done_at[layer] = compute_s * elapsed / total
    # A bucket's first bytes leave its latency after it was begun, unless the link is still
    # busy with the buckets before it (then its start-up overlapped their transfer).
    link_free = 0.0
    for size, layer in buckets(layers, hidden, bucket_mb):
        begins = max(link_free, done_at[layer] + two_rank_allreduce_s(0, bandwidth, latency))
        link_free = begins + two_rank_allreduce_s(size, bandwidth, 0.0)
    saving = compute_s + exchange - max(compute_s, link_free)
    return compute_s + exchange - min(saving, max(0.0, exchange - exchange_cpu_s))


def _run(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=LIMIT_S)
    if done.returncode != 0:
        raise SystemExit(f"`{' '.join(argv[-12:])}` failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _step_ms(output: str) -> float:
    found = re.search(r"([0-9.]+) ms per step", output)
    if found is None:
        raise SystemExit(f"no step time in:\n{output}")
    return float(found.group(1))


BERT_STEP = """
import sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from bert_tiny import BertClassifier, Config, make_inputs
from graphkernel import Tensor, context, nn
from bert_tiny import _WithLoss
context.set_context(enable_graph_kernel=True)
layers, batch, seq = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
config = Config(vocab_size=1000, hidden_size=768, num_layers=layers, num_heads=12,
                intermediate_size=3072, max_position=seq)
net = BertClassifier(config)
ids, mask = make_inputs(batch, seq, config.vocab_size)
labels = np.zeros(batch, np.int32)
step = nn.TrainOneStepCell(_WithLoss(net), nn.Adam(net.trainable_params(), learning_rate=1e-4))
args = (Tensor(ids), Tensor(mask), Tensor(labels))
step(*args)  # the compile
times = []
for _ in range(3):
    t = time.perf_counter(); step(*args).asnumpy(); times.append(time.perf_counter() - t)
print(min(times))
"""


def bert_layer_s(batch: int, seq: int, env: dict[str, str]) -> tuple[float, float]:
    """A BERT-base encoder layer's training step (hidden 768, 12 heads, 3072 wide, Adam)
    on `batch` sequences of `seq` tokens, one thread: the step of 2 layers less that of 1 (the
    embeddings, pooler and classifier cancel), and the step of 1 layer."""
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "bert_step.py")
        with open(script, "w") as f:
            f.write(BERT_STEP)
        steps = [float(_run([sys.executable, script, os.path.join(ROOT, "examples"), str(n),
                             str(batch), str(seq)], env).split()[-1]) for n in (1, 2)]
    return steps[1] - steps[0], steps[0]


def project(layer_s: float, link_efficiency: float, latency_s: float,
            global_batch: int = 256, measured_batch: int = 8) -> str:
    """The BERT-base training step (12 layers, 110M float32 gradients: 440 MB) at 8, 64 and
    512 hosts on 10 and 100 Gb/s links, by the model: step = compute + non-overlapped ring
    all-reduce. Compute: 12 measured encoder layers (embeddings and heads left out: their
    share of the step is within the measurement's noise) per `measured_batch` sequences,
    proportional to the sequences a host runs. Overlap hides the exchange behind the backward
    pass (2/3 of the compute) except the last bucket's (25 MB, PyTorch's default).
    Weak scaling: every host runs `measured_batch` sequences. Strong scaling: the hosts split
    `global_batch`; more hosts stop paying once a host's compute is below its non-overlapped
    exchange (parallel efficiency under 50%): N = the largest power of two still above."""
    grad_bytes, bucket = 110e6 * 4, 25e6
    per_sequence = 12 * layer_s / measured_batch

    def step(compute: float, hosts: int, gbps: float, overlap: bool) -> float:
        bandwidth = gbps * 1e9 / 8 * link_efficiency
        comm = ring_allreduce_s(grad_bytes, hosts, bandwidth, latency_s)
        if not overlap:
            return compute + comm
        last = ring_allreduce_s(bucket, hosts, bandwidth, latency_s)
        return compute + max(last, comm - 2 / 3 * compute)

    lines = ["| link | hosts | weak: step, no overlap / overlap | weak: efficiency (overlap) | "
             f"strong ({global_batch} seq.): step, overlap | strong: speed-up over 1 host |",
             "|---|---|---|---|---|---|"]
    for gbps in (10, 100):
        for hosts in (8, 64, 512):
            weak = per_sequence * measured_batch
            plain, hidden = step(weak, hosts, gbps, False), step(weak, hosts, gbps, True)
            strong = step(per_sequence * global_batch / hosts, hosts, gbps, True)
            lines.append(f"| {gbps} Gb/s | {hosts} | {plain:.2f} / {hidden:.2f} s | "
                         f"{weak / hidden:.0%} | {strong:.2f} s | "
                         f"{per_sequence * global_batch / strong:.0f}x |")
    for gbps in (10, 100):
        hosts = 1
        while True:
            nxt = hosts * 2
            compute = per_sequence * global_batch / nxt
            if step(compute, nxt, gbps, True) > 2 * compute:  # efficiency under 50%
                break
            hosts = nxt
            if hosts >= 1 << 20:
                break
        lines.append(f"\nStrong scaling at {gbps} Gb/s stops paying past {hosts} hosts "
                     f"(at {hosts * 2} a host's compute, "
                     f"{per_sequence * global_batch / hosts / 2 * 1e3:.0f} ms, is under its "
                     "non-overlapped exchange).")
    return "\n".join(lines)


def _concurrent_step_ms(commands: list[list[str]], env: dict[str, str]) -> list[float]:
    running = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for c in commands]
    outputs = [p.communicate(timeout=LIMIT_S)[0] for p in running]
    return [_step_ms(out) for out in outputs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="100mbit,1gbit,10gbit")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256, help="the global batch")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--bucket-mb", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case (median)")
    parser.add_argument("--out", default=None, help="also write the table here (markdown)")
    parser.add_argument("--bert", action="store_true",
                        help="only time a BERT-base encoder layer's training step")
    parser.add_argument("--project", nargs=3, type=float, metavar=("LAYER_S", "EFFICIENCY",
                                                                  "LATENCY_S"),
                        help="only print the BERT-base projection from a layer's measured "
                             "step, the link's efficiency (bandwidth over tc rate), latency")
    parser.add_argument("--render", metavar="JSON",
                        help="only print the table of a run's saved measurements (--out's "
                             ".json) by the model as it is now")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            return _render(json.load(f), args.out)
    if args.project:
        print(project(*args.project))
        return 0
    if args.bert:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        layer, one = bert_layer_s(8, 128, env)
        print(f"BERT-base encoder layer, training step (Adam), 8 x 128 tokens, 1 thread: "
              f"{layer * 1e3:.0f} ms per layer (2 layers less 1; the 1-layer model's step "
              f"{one * 1e3:.0f} ms); load average {os.getloadavg()[0]:.1f}")
        return 0
    # Killed (timeout, kill): exit through Python, so the namespaces are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.path.insert(0, ROOT)
    from tests import netns
    reason = netns.unavailable()
    if reason:
        raise SystemExit(reason)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    forwarded = ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONPATH"]
    train = [sys.executable, EXAMPLE, "--epochs", "1000", "--steps", str(args.steps),
             "--batch", str(args.batch), "--hidden", str(args.hidden), "--layers",
             str(args.layers)]
    floats = gradient_floats(args.layers, args.hidden)
    # A rank's compute: one process on a rank's share of the batch, nothing exchanged; two
    # at once, as the two ranks run (they share this machine's cores).
    single = train[:-6] + ["--batch", str(args.batch // 2), *train[-4:], "--single"]
    compute_ms = statistics.median(
        ms for _ in range(args.repeats) for ms in _concurrent_step_ms([single, single], env))
    rows = []
    with netns.TwoHosts() as hosts, tempfile.TemporaryDirectory() as folder:
        probe = os.path.join(folder, "probe.py")
        with open(probe, "w") as f:
            f.write(PROBE)
        for rate in args.rates.split(","):
            hosts.rate_limit(None if rate == "none" else rate)
            link = json.loads(_run(hosts.mpirun_command(
                [sys.executable, probe, "20", str(floats)], forwarded), env).splitlines()[-1])
            measured = {}
            for label, extra in (("no overlap", []),
                                 ("overlap", ["--bucket-mb", str(args.bucket_mb)])):
                measured[label] = statistics.median(
                    _step_ms(_run(hosts.mpirun_command(train + extra, forwarded), env))
                    for _ in range(args.repeats))
            rows.append({"rate": rate, "bandwidth_Bps": link["bandwidth_Bps"],
                         "latency_s": link["latency_s"], "allreduce_s": link["allreduce_s"],
                         "no_overlap_ms": measured["no overlap"],
                         "overlap_ms": measured["overlap"]})
            print(json.dumps(rows[-1]), flush=True)
        hosts.rate_limit(None)
    report = {"rows": rows, "compute_ms": compute_ms, "layers": args.layers,
              "hidden": args.hidden, "batch": args.batch, "bucket_mb": args.bucket_mb,
              "steps": args.steps, "repeats": args.repeats, "openmpi": _ompi(),
              "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "load": os.getloadavg()[0]}
    if args.out:
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump(report, f, indent=1)
    return _render(report, args.out)


def _render(report: dict, out: str | None) -> int:
    """The table: each measurement beside the model's prediction from the measured link and
    compute alone."""
    layers, hidden, bucket_mb = report["layers"], report["hidden"], report["bucket_mb"]
    floats = gradient_floats(layers, hidden)
    compute_ms = report["compute_ms"]
    lines = [
        f"Two namespaces over a veth (tc tbf), Open MPI {report['openmpi']} over TCP, 1 rank "
        f"each, OMP_NUM_THREADS=1; MLP 64-{'-'.join([str(hidden)] * layers)}-10 ({floats} "
        f"float32 gradients, {4 * floats / 1e6:.2f} MB), global batch {report['batch']}, "
        f"buckets of {bucket_mb:g} MB; median step after the first of {report['steps']}, "
        f"median of {report['repeats']} runs; {report['when']}, load average "
        f"{report['load']:.1f}.",
        "",
        f"Compute per step (1 process on {report['batch'] // 2} rows, two at once): "
        f"{compute_ms:.1f} ms",
        "",
        "| tc rate | measured bandwidth | latency | Allreduce (measured / model) | step, no "
        "overlap (measured / model) | step, overlap (measured / model) | overlap saves |",
        "|---|---|---|---|---|---|---|",
    ]

    def pair(measured: float, model: float) -> str:
        return f"{measured:.1f} / {model:.1f} ms ({(model - measured) / measured:+.0%})"

    # This machine's own ceiling: the fastest exchange measured, as a rate through the
    # two-rank all-reduce (twice the buffer over the link). Above it the CPUs (TCP stack,
    # copies, the sum), not the link, set the pace.
    ceiling = max(2 * 4 * floats / r["allreduce_s"] for r in report["rows"])
    lines.insert(4, f"Exchange ceiling of this machine (fastest Allreduce measured, as a rate): "
                    f"{ceiling * 8 / 1e9:.3g} Gb/s; the model takes the lesser of it and the "
                    "link's measured bandwidth, and lets overlap hide only the exchange's "
                    "waiting for the link, not its CPU work at this ceiling (both cores "
                    "compute).")
    lines.insert(5, "")
    for r in report["rows"]:
        bandwidth, latency = min(r["bandwidth_Bps"], ceiling), r["latency_s"]
        # The exchange's CPU work: the whole buffer twice at the machine's ceiling.
        models = [predict(compute_ms / 1e3, layers, hidden, b, bandwidth, latency,
                          2 * 4 * floats / ceiling) * 1e3 for b in (None, bucket_mb)]
        exchange = two_rank_allreduce_s(4 * floats, bandwidth, latency) * 1e3
        lines.append(
            f"| {r['rate']} | {r['bandwidth_Bps'] * 8 / 1e9:.3g} Gb/s | {latency * 1e6:.0f} us | "
            f"{pair(r['allreduce_s'] * 1e3, exchange)} | "
            f"{pair(r['no_overlap_ms'], models[0])} | {pair(r['overlap_ms'], models[1])} | "
            f"{r['no_overlap_ms'] - r['overlap_ms']:.1f} ms |")
    text = "\n".join(lines)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    return 0


def _ompi() -> str:
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except OSError:
        return "?"
    found = re.search(r"([0-9]+\.[0-9]+\.[0-9]+)", out)
    return found.group(1) if found else "?"


if __name__ == "__main__":
    sys.exit(main())
