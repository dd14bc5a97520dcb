"""MindSpore 2.10 itself as the reference (issue 28): MindCV's real model files (ResNet-18/50,
MobileNetV2/V3, ViT, ConvNeXt, Swin at small configurations, 32x32 input, 10 classes) run
unchanged on graphkernel through bench/ms_alias.py's import alias and on MindSpore 2.10, on the
same weights, each side reading the other's `.ckpt`.

    .venv/bin/python -m bench.mindspore_parity [--nets resnet18,vit] [--out DIR]

runs graphkernel's side here and MindSpore's side in the MindSpore venv (MS_PYTHON, default
/work/ms-venv/bin/python; MindCV installed there by pip and read from there). Per network:
1. graphkernel builds the net (seed 0), saves gk.ckpt, evaluates a batch;
2. MindSpore loads gk.ckpt and evaluates (graphkernel's checkpoint in MindSpore), takes one
   training step from those weights; then builds its own net, saves ms.ckpt, evaluates, times;
3. graphkernel loads ms.ckpt and evaluates (MindSpore's checkpoint here); takes the same step
   fused in float32 and again in float64 (the reference: field notes, BN-heavy float32 updates
   are compared with float64, not with each other); times itself, and the ONNX export of the
   same net under ONNX Runtime and OpenVINO.
The same function builds and steps the net on both sides: under the alias it is graphkernel.
Dropout cells are kept in eval mode during the step (their random masks cannot agree across
frameworks); BatchNorm trains. Results: DIR/results.json and a markdown table on stdout."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETS = ["resnet18", "resnet50", "mobilenetv2", "mobilenetv3", "vit", "convnext", "swin"]
BATCH_EVAL, BATCH_STEP, BATCH_TIME = 4, 4, 8
LR, MOMENTUM = 0.01, 0.9


def build(name: str) -> Any:
    """MindCV's network `name` at a small configuration (imports `mindcv.models`)."""
    from mindcv.models import convnext, mobilenetv2, mobilenetv3, resnet, swintransformer, vit
    if name == "resnet18":
        return resnet.ResNet(resnet.BasicBlock, [2, 2, 2, 2], num_classes=10)
    if name == "resnet50":
        return resnet.ResNet(resnet.Bottleneck, [3, 4, 6, 3], num_classes=10)
    if name == "mobilenetv2":
        return mobilenetv2.MobileNetV2(alpha=0.35, num_classes=10)
    if name == "mobilenetv3":
        return mobilenetv3.MobileNetV3("small", alpha=0.75, num_classes=10)
    if name == "vit":
        return vit.VisionTransformer(image_size=32, patch_size=8, embed_dim=64, depth=2,
                                     num_heads=4, num_classes=10)
    if name == "convnext":
        return convnext.ConvNeXt(3, 10, depths=[1, 1, 1, 1], dims=[16, 32, 64, 128])
    if name == "swin":
        return swintransformer.SwinTransformer(image_size=32, patch_size=2, embed_dim=32,
                                               depths=[1, 1], num_heads=[2, 4], window_size=4,
                                               num_classes=10, drop_path_rate=0.0)
    raise SystemExit(f"unknown net {name!r}: one of {', '.join(NETS)}")


def inputs(batch: int, seed: int, dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, 3, 32, 32)).astype(dtype),
            rng.integers(0, 10, batch).astype(np.int32))


def load_all(ms: Any, net: Any, path: str) -> None:
    """Every parameter of the net from the file, every entry used: MindSpore's strict_load
    concerns dtypes, and a name that does not match is only returned, so both lists are
    checked here."""
    not_loaded, unused = ms.load_param_into_net(net, ms.load_checkpoint(path), strict_load=True)
    if not_loaded or unused:
        raise RuntimeError(f"{path}: parameters not loaded {not_loaded[:5]}, entries unused "
                           f"{unused[:5]}")


def evaluate(ms: Any, net: Any, x: np.ndarray) -> np.ndarray:
    net.set_train(False)
    return net(ms.Tensor(x)).asnumpy()


def train_step(ms: Any, net: Any, x: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """{parameter name: its update} of one Momentum step on softmax cross-entropy."""
    from mindspore import nn
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss),
                               nn.Momentum(net.trainable_params(), LR, MOMENTUM))
    step.set_train(True)
    for _, cell in net.cells_and_names():
        if isinstance(cell, nn.Dropout):
            cell.set_train(False)
    step(ms.Tensor(x), ms.Tensor(labels))
    return {p.name: p.asnumpy() - before[p.name] for p in net.trainable_params()}


def per_image_ms(run: Any, batch: int, seconds: float = 3.0) -> float:
    """Median wall time of one call over `batch` images, in ms per image (after a warm call)."""
    run()
    times = []
    end = time.perf_counter() + seconds
    while len(times) < 5 or (time.perf_counter() < end and len(times) < 200):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3 / batch


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """Largest difference relative to the larger array's largest magnitude."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def update_error(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> dict[str, float]:
    """L2 relative error of all updates together, and of the worst tensor among those whose
    reference update is not negligible (its norm at least 1e-4 of the largest tensor's: a
    tensor the float64 step leaves at ~0, a BatchNorm beta before a BatchNorm, would divide
    rounding noise by zero)."""
    num = sum(float(np.sum((got[k] - ref[k]) ** 2)) for k in ref)
    den = sum(float(np.sum(ref[k] ** 2)) for k in ref)
    norms = {k: float(np.linalg.norm(ref[k])) for k in ref}
    floor = 1e-4 * max(norms.values())
    worst = max(float(np.linalg.norm(got[k] - ref[k])) / norms[k]
                for k in ref if norms[k] >= floor and norms[k] > 0)
    return {"l2": (num / max(den, 1e-300)) ** 0.5, "worst_tensor": worst}


# -- MindSpore's side (runs in the MindSpore venv) --------------------------------------------
def mindspore_side(name: str, folder: str, fused: bool) -> dict[str, Any]:
    import mindspore as ms
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU", enable_graph_kernel=fused)
    tag = "fused" if fused else "unfused"
    out: dict[str, Any] = {}
    x, _ = inputs(BATCH_EVAL, 1)
    net = build(name)
    load_all(ms, net, os.path.join(folder, "gk.ckpt"))
    if fused:
        np.save(os.path.join(folder, "ms_on_gk_eval.npy"), evaluate(ms, net, x))
    xs, labels = inputs(BATCH_STEP, 2)
    np.savez(os.path.join(folder, f"ms_step_{tag}.npz"), **train_step(ms, net, xs, labels))
    ms.set_seed(1)
    own = build(name)
    xt, _ = inputs(BATCH_TIME, 3)
    tensor = ms.Tensor(xt)
    if fused:
        ms.save_checkpoint(own, os.path.join(folder, "ms.ckpt"))
        np.save(os.path.join(folder, "ms_own_eval.npy"), evaluate(ms, own, x))
        try:  # the ONNX Runtime / OpenVINO rows where graphkernel's export lacks an op
            ms.export(own, tensor, file_name=os.path.join(folder, "ms_net"), file_format="ONNX")
        except Exception as exc:
            out["ms_onnx_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    own.set_train(False)
    out[f"ms_{tag}_ms_per_image"] = per_image_ms(lambda: own(tensor).asnumpy(), BATCH_TIME)
    return out


# -- graphkernel's side ----------------------------------------------------------------------
def _as_float64(net: Any) -> None:
    """Every float32 Parameter of the net replaced by a float64 one of the same name."""
    from mindspore import Parameter
    for _, cell in net.cells_and_names():
        for attr, param in list(cell._params.items()):
            if param.dtype == np.float32:
                setattr(cell, attr, Parameter(param.asnumpy().astype(np.float64), param.name,
                                              requires_grad=param.requires_grad))


def graphkernel_init(name: str, folder: str) -> None:
    import mindspore as ms  # graphkernel, through the alias
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU", enable_graph_kernel=True)
    ms.set_seed(0)
    net = build(name)
    ms.save_checkpoint(net, os.path.join(folder, "gk.ckpt"))
    x, _ = inputs(BATCH_EVAL, 1)
    np.save(os.path.join(folder, "gk_own_eval.npy"), evaluate(ms, net, x))


def graphkernel_check(name: str, folder: str) -> dict[str, Any]:
    import mindspore as ms
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU", enable_graph_kernel=True)
    out: dict[str, Any] = {}
    x, _ = inputs(BATCH_EVAL, 1)
    out["eval_gk_ckpt_in_ms"] = rel(np.load(os.path.join(folder, "ms_on_gk_eval.npy")),
                                    np.load(os.path.join(folder, "gk_own_eval.npy")))
    net = build(name)
    load_all(ms, net, os.path.join(folder, "ms.ckpt"))
    got = evaluate(ms, net, x)
    out["eval_ms_ckpt_in_gk"] = rel(got, np.load(os.path.join(folder, "ms_own_eval.npy")))
    xt, _ = inputs(BATCH_TIME, 3)
    net.set_train(False)
    tensor = ms.Tensor(xt)
    out["gk_ms_per_image"] = per_image_ms(lambda: net(tensor).asnumpy(), BATCH_TIME)
    out.update(_onnx_peers(ms, net, xt, folder))

    xs, labels = inputs(BATCH_STEP, 2)
    gk_ckpt = os.path.join(folder, "gk.ckpt")
    updates = {}
    for dtype in ("float32", "float64"):
        net = build(name)
        load_all(ms, net, gk_ckpt)
        if dtype == "float64":
            _as_float64(net)
        try:
            updates[dtype] = train_step(ms, net, xs.astype(dtype), labels)
            np.savez(os.path.join(folder, f"gk_step_{dtype}.npz"), **updates[dtype])
        except Exception as exc:  # reported in the table, not hidden
            out[f"step_{dtype}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    # float64 is the reference where the model file lets it run (vit and swin cast to
    # ms.float32 inside construct); elsewhere MindSpore unfused, checked against gk's float32.
    ref_name = "f64" if "float64" in updates else "ms_unfused"
    ref = updates.get("float64") or dict(np.load(os.path.join(folder, "ms_step_unfused.npz")))
    out["step_reference"] = ref_name
    for tag in ("fused", "unfused"):
        if not (ref_name == "ms_unfused" and tag == "unfused"):
            step = dict(np.load(os.path.join(folder, f"ms_step_{tag}.npz")))
            out[f"step_ms_{tag}_vs_ref"] = update_error(step, ref)
    if "float32" in updates:
        out["step_gk_vs_ref"] = update_error(updates["float32"], ref)
    return out


def _onnx_peers(ms: Any, net: Any, xt: np.ndarray, folder: str) -> dict[str, Any]:
    """Time per image of graphkernel's ONNX export under ONNX Runtime and OpenVINO, and their
    results against graphkernel's."""
    out: dict[str, Any] = {}
    path = os.path.join(folder, "net.onnx")
    out["onnx_from"] = "graphkernel"
    try:
        ms.export(net, ms.Tensor(xt), file_name=path[:-5], file_format="ONNX")
    except Exception as exc:
        out["gk_onnx_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        path, out["onnx_from"] = os.path.join(folder, "ms_net.onnx"), "MindSpore"
        if not os.path.exists(path):
            return out
    want = net(ms.Tensor(xt)).asnumpy()
    try:
        import onnxruntime as ort
        opts = ort.SessionOptions()
        session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: xt}
        out["ort_vs_gk"] = rel(session.run(None, feed)[0], want)
        out["ort_ms_per_image"] = per_image_ms(lambda: session.run(None, feed), BATCH_TIME)
    except Exception as exc:
        out["ort_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    try:
        import openvino as ov
        core = ov.Core()
        compiled = core.compile_model(core.read_model(path), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32",
                                       "PERFORMANCE_HINT": "LATENCY"})
        request = compiled.create_infer_request()
        out["ov_vs_gk"] = rel(request.infer([xt])[0], want)
        out["ov_ms_per_image"] = per_image_ms(lambda: request.infer([xt]), BATCH_TIME)
    except Exception as exc:
        out["ov_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return out


# -- the two processes -----------------------------------------------------------------------
def _side(argv: list[str]) -> None:
    side, name, folder = argv
    if side.startswith("gk"):
        sys.path.insert(0, HERE)
        from bench.ms_alias import install_alias
        install_alias()
    if side.startswith("ms"):
        result = mindspore_side(name, folder, fused=side == "ms-fused")
    else:
        result = {"gk-init": graphkernel_init, "gk-check": graphkernel_check}[side](name, folder)
    if result is not None:
        with open(os.path.join(folder, f"{side}.json"), "w") as fh:
            json.dump(result, fh)


def _run(python: str, side: str, name: str, folder: str) -> None:
    # MS_PYTHONPATH: e.g. a folder with numpy 1.26 for MindSpore 2.10 (docs/mindspore-parity.md)
    env = {**os.environ, "PYTHONPATH": HERE if side.startswith("gk") else
           os.environ.get("MS_PYTHONPATH", "")}
    # MindSpore's kernel compiler writes akg_kernel_meta/ and logs into the working folder.
    proc = subprocess.run([python, os.path.abspath(__file__), "--side", side, name, folder],
                          env=env, capture_output=True, text=True, cwd=folder)
    if proc.returncode:
        raise RuntimeError(f"{side} {name} failed:\n{proc.stderr[-3000:]}")


def table(results: dict[str, dict[str, Any]]) -> str:
    def f(v: Any, fmt: str = ".1e") -> str:
        return "-" if v is None else format(v, fmt)

    lines = ["| net | eval: gk.ckpt in MS | ms.ckpt in gk | step reference | step L2 / worst "
             "tensor: gk fused | MS fused | MS unfused | ms/image: gk fused | MS fused | "
             "MS unfused | ORT | OpenVINO (ONNX from) |", "|---|---|---|---|---|---|---|---|---|"
             "---|---|---|"]
    for name, r in results.items():
        def err(key: str, r: dict[str, Any] = r) -> str:
            e = r.get(key)
            return "ref" if e is None else f"{f(e['l2'])} / {f(e['worst_tensor'])}"

        lines.append(
            f"| {name} | {f(r.get('eval_gk_ckpt_in_ms'))} | {f(r.get('eval_ms_ckpt_in_gk'))} "
            f"| {r.get('step_reference')} | {err('step_gk_vs_ref')} "
            f"| {err('step_ms_fused_vs_ref')} | {err('step_ms_unfused_vs_ref')} "
            f"| {f(r.get('gk_ms_per_image'), '.2f')} "
            f"| {f(r.get('ms_fused_ms_per_image'), '.2f')} "
            f"| {f(r.get('ms_unfused_ms_per_image'), '.2f')} "
            f"| {f(r.get('ort_ms_per_image'), '.2f')} | {f(r.get('ov_ms_per_image'), '.2f')} "
            f"({r.get('onnx_from')}) |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--side":
        _side(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--out", default="/tmp/mindspore-parity")
    args = parser.parse_args()
    ms_python = os.environ.get("MS_PYTHON", "/work/ms-venv/bin/python")
    if not os.path.exists(ms_python):
        raise SystemExit(f"no MindSpore venv at {ms_python} (set MS_PYTHON): see "
                         "docs/mindspore-parity.md")
    results: dict[str, dict[str, Any]] = {}
    for name in args.nets.split(","):
        folder = os.path.join(args.out, name)
        os.makedirs(folder, exist_ok=True)
        _run(sys.executable, "gk-init", name, folder)
        _run(ms_python, "ms-fused", name, folder)
        _run(ms_python, "ms-unfused", name, folder)
        _run(sys.executable, "gk-check", name, folder)
        results[name] = {}
        for side in ("ms-fused", "ms-unfused", "gk-check"):
            with open(os.path.join(folder, f"{side}.json")) as fh:
                results[name].update(json.load(fh))
        print(name, json.dumps(results[name]), flush=True)
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    print(table(results))


if __name__ == "__main__":
    main()
