"""`python -m bench --real [--only NAME,...]`: the real-size rows, too slow on two cores for
`--quick` or CI, each measured in one process and written to bench/results/<date>-real.md/json.

Rows (names for --only):
- real sizes, written with graphkernel.nn (bench/real_models.py) beside torch eager and beside
  ONNX Runtime and OpenVINO on torch's ONNX export of the same weights: bert_base (12 encoder
  layers, hidden 768, 12 heads, seq 128, batch 8), bert_base_train, resnet18_b1/b8,
  resnet50_b1/b8 (224x224), resnet50_train_b4, mobilenetv2_b8; the CNNs' inference rows beside
  MindSpore 2.10 (graph-kernel fusion on) too, on the same network code and weights;
- ONNX models exported from PyTorch (a dynamic batch axis) and read with graphkernel.load:
  onnx_resnet18_b1/b8, onnx_mobilenetv3_b1/b8, onnx_bert_small, onnx_gpt2_block; graphkernel
  fused and unfused on the file with its batch fixed, shape-generic on the file itself, ONNX
  Runtime and OpenVINO on the file itself;
- imported: the bench's own ONNX graphs of its inference workloads (the ones ONNX Runtime runs,
  bench/peers.onnx_model), imported with graphkernel.load, against the hand-written cells;
- compile_table: cold and warm first result of 1, 2, 4 and 12 of the bench's encoder layers,
  each in a new process (cold: an empty kernel cache; warm: the cache the cold one filled).
  `python -m bench --compile-table` prints it alone.

Timing: a system's first result (compile, session creation or export load, plus its first
call) is reported apart from its steady calls; the steady calls of the systems of a row are
interleaved round by round (a few rounds: one call each at these sizes) and their median taken.
Where every system of a row takes under WARM_CALL_BELOW_S a call, each runs one untimed call
right before each of its samples, so it is timed after itself, as its users run it, and not
while the previous system's thread pool (ONNX Runtime's and OpenVINO's spin; torch's OpenMP)
still spins on the cores. MindSpore, whose calls take seconds at these sizes, stands apart
from that rule (Contender.warm_rule): no untimed call of its own, nor does it turn the others' off.
graphkernel compiles into a fresh kernel cache folder for the run, so its first calls are cold.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.peers import OPENVINO_CONFIG
from bench.real_models import transformer
from bench.real_report import markdown
from bench.real_systems import (
    LABELS,
    STEP_CHANGE_RTOL,
    fix_batch,
    gk_inference,
    gk_loaded,
    gk_train,
    mindspore_cnn,
    mindspore_missing,
    missing,
    needs_torch_export,
    openvino,
    ort,
    torch_export,
    torch_inference,
    torch_train,
)

GK_KEYS = ("gk_fused", "gk_unfused", "gk_generic")
PEER_KEYS = ("onnxruntime", "openvino", "torch")
ALL_PEER_KEYS = PEER_KEYS + ("mindspore",)  # MindSpore: the CNN inference rows
ENCODER_COMPILE_LAYERS = (1, 2, 4, 12)
MIN_SAMPLE_S = 0.05
# Peers' pools spin for milliseconds after a call: that matters to a 30 ms call, not a 1 s one,
# and an untimed call before each sample of the long rows would double their bench time.
WARM_CALL_BELOW_S = 1.0
# A training row's losses (the second after one update): float32 training of a deep BatchNorm
# net differs from float64 by ~0.6% (field notes, ResNet-50); 2e-3 flagged graphkernel unfused's
# ResNet-50 second loss at 0.202% off torch's while its loss change agreed within 0.3%.
TRAIN_RTOL = 1e-2


@dataclass
class Contender:
    """One system on one row: prepare() compiles and returns call(i) (a numpy result of input
    set i) and info; or a reason it does not run here."""
    key: str
    prepare: Callable[[], tuple[Callable[[int], np.ndarray], dict[str, Any]]] | None
    skipped: str | None = None
    # False: a system whose calls take seconds where the row's others take milliseconds
    # (MindSpore's CPU convolutions at 224x224) gets no untimed call before its samples and
    # does not turn that call off for the others (WARM_CALL_BELOW_S)
    warm_rule: bool = True


@dataclass
class Row:
    name: str
    group: str  # "real", "onnx", "imported"
    title: str
    build: Callable[[str], tuple[list[Contender], dict[str, Any]]]  # tmp dir -> contenders
    rtol: float = 1e-3  # max |error| / max |reference| allowed against the reference system
    reference: tuple[str, ...] = ("onnxruntime", "torch", "gk_unfused", "gk_handwritten")
    min_rounds: int = 0  # at least this many rounds, whatever --rounds says
    # Calls whose outputs are checked: 2 for a training step, whose second loss depends on the
    # first step's gradients and Adam update of every weight.
    check_calls: int = 1
    notes: list[str] = field(default_factory=list)


# -- rows ----------------------------------------------------------------------------------------

def _sets(shapes: list[tuple[int, ...]], n: int, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(n)]


def cnn_row(model: str, batch: int, train: bool = False) -> Row:
    def build(tmp: str) -> tuple[list[Contender], dict[str, Any]]:
        from bench.real_models import gk_cnn, gk_params, load_into_torch, torch_cnn
        x_shape = (batch, 3, 224, 224)
        shapes = [x_shape, (batch, 1000)] if train else [x_shape]
        sets = _sets(shapes, 2)
        params = gk_params(gk_cnn(model))
        ms = [] if train else [_mindspore_peer(model, params, sets, tmp)]

        def gk_prep(fused: bool) -> Callable[[], Any]:
            def prep() -> Any:
                net = gk_cnn(model, params)
                if train:
                    net.set_train(True)
                    return gk_train(net, sets, fused)
                return gk_inference(net, sets, fused)
            return prep
        out = [Contender("gk_fused", gk_prep(True)), Contender("gk_unfused", gk_prep(False))]
        why = needs_torch_export()
        if why:
            return out + [Contender(k, None, why) for k in PEER_KEYS] + ms, {}
        net = torch_cnn(model)
        load_into_torch(net, params)
        if train:
            return out + [Contender("torch", lambda: torch_train(net, sets))] + [
                Contender(k, None, "an inference runtime (its training is apart)")
                for k in ("onnxruntime", "openvino")], {}
        path = os.path.join(tmp, f"{model}_b{batch}.onnx")
        torch_export(net, sets[0], ["x"], path, dynamic_batch=False)
        return out + _onnx_peers(path, ["x"], sets) + [
            Contender("torch", lambda: torch_inference(net, sets))] + ms, {"onnx_file": path}

    kind = "training step (MSE + Adam)" if train else "inference"
    return Row(f"{model}_train_b{batch}" if train else f"{model}_b{batch}", "real",
               f"{model} {kind}, batch {batch}, 224x224 (graphkernel.nn)", build,
               rtol=TRAIN_RTOL if train else 1e-3, check_calls=2 if train else 1)


def _mindspore_peer(model: str, params: dict[str, np.ndarray], sets: list[list[np.ndarray]],
                    tmp: str) -> Contender:
    """MindSpore 2.10 running the same network code and weights (bench/real_models.py gk_cnn on
    MindSpore's cells), in a helper process."""
    why = mindspore_missing()
    return Contender("mindspore", None if why else
                     lambda: mindspore_cnn(model, params, [s[0] for s in sets], tmp), why,
                     warm_rule=False)


def _onnx_peers(path: str, names: list[str], sets: list[list[np.ndarray]]) -> list[Contender]:
    return [Contender("onnxruntime", (lambda: ort(path, names, sets)) if not
                      missing("onnxruntime") else None, missing("onnxruntime")),
            Contender("openvino", (lambda: openvino(path, names, sets)) if not
                      missing("openvino") else None, missing("openvino"))]


BERT_BASE = {"layers": 12, "hidden": 768, "heads": 12, "seq": 128, "batch": 8, "inner": 3072}


def bert_base_row(train: bool) -> Row:
    d = BERT_BASE

    def build(tmp: str) -> tuple[list[Contender], dict[str, Any]]:
        from bench.real_models import encoder_params, gk_encoder, torch_encoder
        params = encoder_params(d["layers"], d["hidden"], d["inner"])
        x = (d["batch"], d["seq"], d["hidden"])
        sets = _sets([x, x] if train else [x], 2)

        def cell() -> Any:
            return gk_encoder(params, d["batch"], d["seq"], d["hidden"], d["heads"])
        if train:
            out = [Contender("gk_fused", lambda: gk_train(cell(), sets, True)),
                   Contender("gk_unfused", lambda: gk_train(cell(), sets, False))]
        else:
            out = [Contender("gk_fused", lambda: gk_inference(cell(), sets, True)),
                   Contender("gk_unfused", lambda: gk_inference(cell(), sets, False))]
        why = missing("torch")
        if why:
            return out + [Contender(k, None, why) for k in PEER_KEYS], {}
        net = torch_encoder(params, d["heads"])
        if train:
            return out + [Contender("torch", lambda: torch_train(net, sets))] + [
                Contender(k, None, "an inference runtime (its training is apart)")
                for k in ("onnxruntime", "openvino")], {}
        path = os.path.join(tmp, "bert_base.onnx")
        torch_export(net, sets[0], ["x"], path, dynamic_batch=False)
        return out + _onnx_peers(path, ["x"], sets) + [
            Contender("torch", lambda: torch_inference(net, sets))], {"onnx_file": path}

    what = "training step (MSE + Adam)" if train else "inference"
    return Row("bert_base_train" if train else "bert_base", "real",
               f"BERT-base-size encoder {what}: 12 of the bench's encoder layers, hidden 768, "
               f"12 heads, seq 128, batch 8 (graphkernel.nn)", build,
               rtol=TRAIN_RTOL if train else 1e-3, check_calls=2 if train else 1)


def onnx_model_row(name: str, batch: int) -> Row:
    """A model exported from PyTorch with a dynamic batch axis, read with graphkernel.load."""
    def build(tmp: str) -> tuple[list[Contender], dict[str, Any]]:
        why = needs_torch_export() or (missing("transformers") if name in ("bert", "gpt2")
                                       else None)
        if why:
            return [Contender(k, None, why) for k in GK_KEYS + PEER_KEYS], {}
        import torch
        torch.manual_seed(0)
        opset = 17
        if name in ("resnet18", "mobilenetv3"):
            from bench.real_models import randomise_torch_batchnorm, torch_cnn
            net = torch_cnn(name, gk_padding=False)
            randomise_torch_batchnorm(net)
            names, sets = ["x"], _sets([(batch, 3, 224, 224)], 2)
            dims = {"batch": batch, "image": 224}
        else:
            net, names, sets, dims = transformer(name, batch)
            opset = 18 if name == "gpt2" else 17
        path = os.path.join(tmp, f"{name}_dynamic.onnx")
        fixed = os.path.join(tmp, f"{name}_b{batch}.onnx")
        torch_export(net, sets[0], names, path, dynamic_batch=True, opset=opset)
        fix_batch(path, batch, fixed)

        out = [Contender("gk_fused", lambda: gk_loaded(fixed, sets, True)),
               Contender("gk_unfused", lambda: gk_loaded(fixed, sets, False)),
               Contender("gk_generic", lambda: gk_loaded(path, sets, True))]
        return out + _onnx_peers(path, names, sets) + [
            Contender("torch", lambda: torch_inference(net, sets))], {
            "onnx_file": path, "opset": opset, "dims": dims}

    title = {"resnet18": "ResNet-18 (torchvision's layout in PyTorch), 224x224",
             "mobilenetv3": "MobileNetV3-small (torchvision's layout in PyTorch), 224x224",
             "bert": "transformers BertModel (4 layers, hidden 256, 4 heads, seq 128)",
             "gpt2": "transformers GPT2Model, one block (hidden 256, 4 heads, seq 128)"}[name]
    key = f"onnx_{name}_b{batch}"
    return Row(key, "onnx", f"ONNX export: {title}, batch {batch}", build)


def imported_rows() -> list[Row]:
    """The bench's inference workloads (full suite) as its ONNX graphs, imported."""
    from bench.workloads import TRAIN_KINDS, full_suite
    return [_imported_row(w) for w in full_suite() if w.kind not in TRAIN_KINDS]


def _imported_row(w: Any) -> Row:
    def build(tmp: str) -> tuple[list[Contender], dict[str, Any]]:
        why = missing("onnx")
        if why:
            return [Contender("gk_handwritten", None, why), Contender("gk_imported", None, why)
                    ], {}
        from bench.gk_cells import make_cell
        from bench.peers import onnx_model
        from bench.workloads import input_sets
        sets_d, params = input_sets(w, [0, 1])
        sets = [list(s.values()) for s in sets_d]
        model = onnx_model(w, params)
        return [Contender("gk_handwritten",
                          lambda: gk_inference(make_cell(w, params), sets, True)),
                Contender("gk_imported", lambda: gk_loaded(model, sets, True))], \
            {"onnx_nodes": len(model.graph.node)}
    return Row(f"imported_{w.key}", "imported", f"imported vs hand-written: {w.title}", build,
               rtol=max(w.rtol, 1e-4) * 10, min_rounds=9)  # a 5% question: more rounds


def all_rows() -> list[Row]:
    """Quick rows first, the slowest (the training steps) last."""
    rows = imported_rows()
    rows += [onnx_model_row(m, b) for m in ("resnet18", "mobilenetv3") for b in (1, 8)]
    rows += [onnx_model_row("bert", 8), onnx_model_row("gpt2", 8)]
    rows += [cnn_row(m, b) for m in ("resnet18", "resnet50") for b in (1, 8)]
    rows += [cnn_row("mobilenetv2", 8), bert_base_row(False)]
    return rows + [bert_base_row(True), cnn_row("resnet50", 4, train=True)]


# -- measuring -----------------------------------------------------------------------------------

def run_row(row: Row, rounds: int, tmp: str, log: Callable[[str], None]) -> dict[str, Any]:
    import gc
    log(f"[{row.name}] {row.title}")
    res: dict[str, Any] = {"name": row.name, "group": row.group, "title": row.title,
                           "systems": {}}
    try:
        contenders, extra = row.build(tmp)
    except Exception as exc:
        res["error"] = _error(exc)
        log(f"  FAILED to build: {res['error']}")
        return res
    res.update({k: v for k, v in extra.items() if k != "onnx_file"})
    live: list[tuple[str, Callable[[int], np.ndarray]]] = []
    outputs: dict[str, np.ndarray] = {}
    for c in contenders:
        rec: dict[str, Any] = {"label": LABELS[c.key]}
        res["systems"][c.key] = rec
        if c.prepare is None:
            rec["status"], rec["note"] = "skipped", c.skipped
            continue
        t0 = time.perf_counter()
        try:
            call, info = c.prepare()
            prepared = time.perf_counter()
            first_output = call(0)
            done = time.perf_counter()
            outputs[c.key] = np.concatenate(
                [np.ravel(first_output)] + [np.ravel(call(i)) for i in range(1, row.check_calls)])
        except Exception as exc:
            rec["status"], rec["error"] = "failed", _error(exc)
            log(f"  {c.key}: FAILED: {rec['error'][:400]}")
            continue
        rec.update(info)
        rec["prepare_s"], rec["first_call_s"] = prepared - t0, done - prepared
        rec["first_result_s"] = done - t0
        rec["status"] = "ok"
        live.append((c.key, call))
        log(f"  {c.key}: first result {done - t0:.2f} s (prepare {prepared - t0:.2f} s)")
    ref_key = next((k for k in row.reference if k in outputs), None)
    if ref_key:
        res["checked_against"] = ref_key
        ref = outputs[ref_key].astype(np.float64)
        scale = float(np.max(np.abs(ref))) or 1.0
        for key, out in outputs.items():
            rec = res["systems"][key]
            if out.shape != ref.shape:
                rec["status"], rec["error"] = "wrong answer", f"shape {out.shape} != {ref.shape}"
                continue
            err = float(np.max(np.abs(out.astype(np.float64) - ref))) / scale
            rec["max_err_over_max_ref"] = err
            if row.check_calls > 1:  # training: the loss change one step made, compared too
                change, ref_change = float(out[-1]) - float(out[0]), float(ref[-1] - ref[0])
                rec["loss_change"] = change
                change_err = abs(change - ref_change) / max(abs(ref_change), 1e-30)
                rec["loss_change_rel_err"] = change_err
                if not change_err <= STEP_CHANGE_RTOL:
                    rec["status"] = "wrong answer"
                    rec["error"] = (f"loss change of one step {change:.6g}, {ref_key}'s "
                                    f"{ref_change:.6g}")
                    log(f"  {key}: WRONG ANSWER against {ref_key}: {rec['error']}")
                    continue
            if not err <= row.rtol:
                rec["status"] = "wrong answer"
                rec["error"] = f"max |error| / max |ref| = {err:.3g} > {row.rtol:g}"
                log(f"  {key}: WRONG ANSWER against {ref_key}: {rec['error']}")
    live = [(k, c) for k, c in live if res["systems"][k]["status"] == "ok"]
    # Calls per sample: one at real sizes; as many as make MIN_SAMPLE_S for small workloads
    # (the imported rows include 4x4 ones), so a sample is not the clock's resolution.
    per_sample: dict[str, int] = {}
    call_s: dict[str, float] = {}
    for key, call in live:
        once = res["systems"][key]["first_call_s"]
        if once < MIN_SAMPLE_S:  # a first call can be slow (page faults): measure a second
            t0 = time.perf_counter()
            call(1)
            once = time.perf_counter() - t0
        per_sample[key] = max(1, min(100_000, int(MIN_SAMPLE_S / max(once, 1e-7))))
        call_s[key] = once
    # One rule for the whole row, so no system of it is timed warmer than another (but the
    # ones apart from it: Contender.warm_rule).
    apart = {c.key for c in contenders if not c.warm_rule} & set(call_s)
    ruled = [s for k, s in call_s.items() if k not in apart]
    warm = bool(ruled) and max(ruled) < WARM_CALL_BELOW_S
    res["warm_call_before_sample"] = warm
    if apart:
        res["no_warm_call"] = sorted(apart)
    samples: dict[str, list[float]] = {k: [] for k, _ in live}
    for r in range(max(rounds, row.min_rounds)):
        shift = r % max(1, len(live))
        for key, call in live[shift:] + live[:shift]:
            k = per_sample[key]
            if warm and key not in apart:
                call(r % 2)
            t0 = time.perf_counter()
            for j in range(k):
                call((r + j + 1) % 2)
            samples[key].append((time.perf_counter() - t0) / k)
    for key, call in live:  # whether a sample may have been a call on one thread
        if hasattr(call, "threads_stats"):
            res["systems"][key]["threads_stats"] = call.threads_stats()
    for key, s in samples.items():
        rec = res["systems"][key]
        rec["steady_median_s"] = float(np.median(s))
        rec["steady_min_s"] = float(np.min(s))
        rec["steady_samples_s"] = [float(f"{v:.4g}") for v in s]
        rec["calls_per_sample"] = per_sample[key]
    summarise(res)
    log("  " + " ".join(f"{k}={v['steady_median_s'] * 1e3:.4g}ms"
                        for k, v in res["systems"].items() if "steady_median_s" in v))
    del contenders, live, outputs
    gc.collect()
    return res


def summarise(res: dict[str, Any]) -> None:
    """graphkernel's best (fused; shape-generic shown too) against the best peer."""
    systems = res["systems"]

    def t(k: str) -> float | None:
        return systems.get(k, {}).get("steady_median_s")
    if res["group"] == "imported":
        h, i = t("gk_handwritten"), t("gk_imported")
        if h and i:
            res["imported_over_handwritten"] = i / h
            res["kernel_counts"] = {k: systems[k].get("kernel_count")
                                    for k in ("gk_handwritten", "gk_imported")}
        return
    peers = {k: t(k) for k in ALL_PEER_KEYS if t(k)}
    if peers:
        best = min(peers, key=lambda k: peers[k])  # type: ignore[arg-type,return-value]
        res["best_peer"], res["best_peer_s"] = best, peers[best]
        for k in GK_KEYS:
            if t(k):
                res[f"{k}_over_best_peer"] = t(k) / peers[best]  # type: ignore[operator]
        # The same model's arithmetic over each one's time: how near the machine's FMA peak
        # both run (the report divides by the peak measured at the start of the run).
        flops, fused_s = systems.get("gk_fused", {}).get("flops"), t("gk_fused")
        if flops and fused_s:
            res["gflop_per_s"] = {"gk_fused": flops / fused_s / 1e9,
                                  best: flops / peers[best] / 1e9}
        fused = systems.get("gk_fused", {}).get("steady_samples_s")
        if fused:
            res["gk_fused_over_best_peer_rounds"] = paired_ratios(
                fused, systems[best]["steady_samples_s"])


def paired_ratios(ours: list[float], theirs: list[float]) -> list[float]:
    """Round by round, our sample over the peer's taken in the same round (the two a few
    hundred ms apart at most): the machine's drift from one round to the next, which on a
    shared host moves both by 10-15%, cancels in each ratio, so their spread is the noise
    left between two systems timed side by side."""
    return [float(f"{a / b:.4g}") for a, b in zip(ours, theirs) if b > 0]


def _error(exc: BaseException) -> str:
    import traceback
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename.split('site-packages/')[-1]}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {str(exc).strip()[:1200]}{where}"


# -- compile table -------------------------------------------------------------------------------

def encoder_probe(layers: int) -> dict[str, Any]:
    """In a new process: the first result of `layers` of the bench's (full-suite) encoder
    layer, from cell construction to the first output; imports are done before the clock."""
    import graphkernel
    from bench.gk_cells import EncoderLayer  # noqa: F401
    from bench.real_models import encoder_params, gk_encoder
    from bench.workloads import full_suite
    from graphkernel.graph_kernel.pipeline import CompileOptions

    d = next(w for w in full_suite() if w.kind == "encoder").dims
    params = encoder_params(layers, d["hidden"], d["inner"])
    x = np.random.default_rng(0).standard_normal(
        (d["batch"], d["seq"], d["hidden"])).astype(np.float32)
    t0 = time.perf_counter()
    cell = gk_encoder(params, d["batch"], d["seq"], d["hidden"], d["heads"])
    exe = graphkernel.compile(cell, x, options=CompileOptions(enable_graph_kernel=True))
    compiled = time.perf_counter()
    out = exe(graphkernel.Tensor(x))
    (out[0] if isinstance(out, tuple) else out).asnumpy()
    done = time.perf_counter()
    t1 = time.perf_counter()
    exe(graphkernel.Tensor(x)).asnumpy()
    steady = time.perf_counter() - t1
    return {"layers": layers, "dims": d, "compile_s": compiled - t0,
            "first_result_s": done - t0, "steady_call_s": steady,
            "kernel_count": len(exe.kernels),
            "compile_cache": exe.report.compile_cache.split(":")[0],
            "compile_seconds_reported": exe.compile_seconds}


def compile_table(log: Callable[[str], None],
                  layer_counts: tuple[int, ...] = ENCODER_COMPILE_LAYERS) -> dict[str, Any]:
    rows = []
    for n in layer_counts:
        with tempfile.TemporaryDirectory(prefix="gk-bench-compile-") as cache:
            row: dict[str, Any] = {"layers": n}
            for phase in ("cold", "warm"):
                env = dict(os.environ, GRAPHKERNEL_CACHE_DIR=cache)
                proc = subprocess.run([sys.executable, "-m", "bench.real", "--encoder-probe",
                                       str(n)], env=env, capture_output=True, text=True,
                                      timeout=3600)
                if proc.returncode != 0:
                    row[phase] = {"error": proc.stderr.strip()[-1500:]}
                else:
                    row[phase] = json.loads(proc.stdout.strip().splitlines()[-1])
                p = row[phase]
                log(f"  {n} layer(s) {phase}: " + (f"first result {p['first_result_s']:.2f} s, "
                                                   f"{p['kernel_count']} kernels"
                                                   if "error" not in p else p["error"][-300:]))
            rows.append(row)
    one = rows[0].get("cold", {}).get("first_result_s")
    for row in rows:
        c = row.get("cold", {}).get("first_result_s")
        if one and c:
            row["cold_over_one_layer"] = c / one
    return {"rows": rows}


# -- the run -------------------------------------------------------------------------------------

def select(only: list[str] | None) -> tuple[list[Row], bool]:
    rows = all_rows()
    if not only:
        return rows, True
    names = {r.name for r in rows} | {r.group for r in rows} | {"compile_table"}
    unknown = [n for n in only if n not in names]
    if unknown:
        raise SystemExit(f"--only: unknown row(s) {unknown}; known: rows {[r.name for r in rows]}"
                         f", groups real, onnx, imported, and compile_table")
    order = {name: i for i, name in enumerate(only)}  # in the order asked (a long run's
    chosen = [r for r in rows if r.name in only or r.group in only]  # first rows come first)
    chosen.sort(key=lambda r: order.get(r.name, order.get(r.group, 0)))
    return chosen, "compile_table" in only


def run(only: list[str] | None, rounds: int, log: Callable[[str], None],
        on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The selected rows, then the compile table; on_row(results so far) after each row."""
    from bench import machine
    from bench.systems import version_of
    rows, with_table = select(only)
    started = time.time()
    results: dict[str, Any] = {
        "schema": 1, "suite": "real", "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                   time.gmtime(started)),
        "machine": machine.machine_info(), "rounds": rounds, "only": only,
        "versions": {d: version_of(d) for d in ("graphkernel", "numpy", "onnx", "onnxruntime",
                                                "openvino", "torch", "transformers",
                                                "mindspore")},
        "openvino_config": dict(OPENVINO_CONFIG, INFERENCE_NUM_THREADS=os.cpu_count()),
        "threads_env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                                                       "OPENBLAS_NUM_THREADS")}}
    # Other work on the machine shows here: quote ratios from one run, not absolute times.
    results["load_average_start"] = os.getloadavg()
    log("measuring copy bandwidth ...")
    results["copy_bandwidth"] = machine.copy_bandwidth(256 << 20)
    results["fma_peak"] = machine.fma_peak()
    results["rows"] = []
    if with_table:
        log("compile table: the bench's encoder layer, 1/2/4/12 layers, cold and warm ...")
        results["compile_table"] = compile_table(log)
    saved = os.environ.get("GRAPHKERNEL_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="gk-bench-real-") as tmp:
        os.environ["GRAPHKERNEL_CACHE_DIR"] = os.path.join(tmp, "cache")  # cold compiles
        try:
            for row in rows:
                results["rows"].append(run_row(row, rounds, tmp, log))
                results["wall_s"] = time.time() - started
                if on_row is not None:
                    on_row(results)
        finally:
            if saved is None:
                os.environ.pop("GRAPHKERNEL_CACHE_DIR", None)
            else:
                os.environ["GRAPHKERNEL_CACHE_DIR"] = saved
    results["load_average_end"] = os.getloadavg()
    results["wall_s"] = time.time() - started
    return results


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--encoder-probe":
        print(json.dumps(encoder_probe(int(sys.argv[2]))))
    elif len(sys.argv) == 3 and sys.argv[1] == "--render":  # the .md again from the .json
        with open(sys.argv[2]) as fh:
            saved = json.load(fh)
        with open(sys.argv[2].removesuffix(".json") + ".md", "w") as fh:
            fh.write(markdown(saved, saved.get("command", "python -m bench --real")))
    else:
        raise SystemExit("usage: python -m bench --real [--only NAME,...] | --compile-table | "
                         "python -m bench.real --render RESULTS.json")
