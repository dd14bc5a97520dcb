"""Real-size convolutions, one per line: graphkernel (fused conv [+ BN + ReLU]) beside ONNX
Runtime and OpenVINO on the same single-conv ONNX graph, and numpy's im2col + SGEMM (the
reference's own route), in GFLOP/s.

    python -m bench.conv_sizes [--batch 1 8] [--only NAME] [--repeat 5]

Shapes are ResNet-18/50's and MobileNetV2's at 224x224. Each time is the median of `--repeat`
steady calls after one warm-up call; first calls (compiles) are reported apart. The CPU model
and the BLAS are printed with the table: these ratios mean something on one machine, in one run.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from bench.machine import cpu_model


@dataclass(frozen=True)
class ConvShape:
    name: str
    cin: int
    cout: int
    k: int
    stride: int
    hw: int
    group: int = 1

    def pad(self) -> int:
        return self.k // 2

    def out_hw(self) -> int:
        return (self.hw + 2 * self.pad() - self.k) // self.stride + 1

    def flops(self, batch: int) -> float:
        o = self.out_hw()
        return 2.0 * batch * self.cout * o * o * (self.cin // self.group) * self.k * self.k


SHAPES = (
    ConvShape("stem7x7s2", 3, 64, 7, 2, 224),
    ConvShape("r18_3x3_64", 64, 64, 3, 1, 56),
    ConvShape("r18_3x3s2_128", 64, 128, 3, 2, 56),
    ConvShape("r18_3x3_128", 128, 128, 3, 1, 28),
    ConvShape("r18_1x1s2_128", 64, 128, 1, 2, 56),
    ConvShape("r18_3x3_256", 256, 256, 3, 1, 14),
    ConvShape("r18_3x3_512", 512, 512, 3, 1, 7),
    ConvShape("r50_1x1_64_256", 64, 256, 1, 1, 56),
    ConvShape("r50_1x1_256_64", 256, 64, 1, 1, 56),
    ConvShape("r50_1x1_1024_256", 1024, 256, 1, 1, 14),
    ConvShape("mb2_dw3x3_96", 96, 96, 3, 1, 56, group=96),
    ConvShape("mb2_dw3x3s2_144", 144, 144, 3, 2, 56, group=144),
    # strided and narrow depthwise, the stride phases' cases (c_depthwise.PhasePlanes)
    ConvShape("mb2_dw3x3s2_576", 576, 576, 3, 2, 14, group=576),
    ConvShape("mb2_dw3x3_960", 960, 960, 3, 1, 7, group=960),
    ConvShape("mb2_1x1_96_24", 96, 24, 1, 1, 56),
    # 1x1 of few taps in row segments (c_conv_units.SEGMENT_BY_PIXEL_TAPS)
    ConvShape("mb2_1x1_32_16", 32, 16, 1, 1, 112),
    ConvShape("mb2_1x1_32_144", 32, 144, 1, 1, 56),
)


CLOCK = time.perf_counter
THREADS = 0


def _median_time(fn, repeat: int) -> float:
    fn()
    ts = []
    for _ in range(repeat):
        t0 = CLOCK()
        fn()
        ts.append(CLOCK() - t0)
    return statistics.median(ts)


def _graphkernel(s: ConvShape, x: np.ndarray, w: np.ndarray, fused_block: bool,
                 repeat: int) -> tuple[float, float, np.ndarray]:
    import graphkernel as gk
    from graphkernel import Tensor, nn

    gk.set_context(mode=gk.GRAPH_MODE, enable_graph_kernel=True)

    class Block(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(s.cin, s.cout, s.k, stride=s.stride, pad_mode="pad",
                                  padding=s.pad(), group=s.group)
            self.conv.weight.set_data(Tensor(w))
            self.bn = nn.BatchNorm2d(s.cout)
            self.relu = nn.ReLU()

        def construct(self, x):
            y = self.conv(x)
            return self.relu(self.bn(y)) if fused_block else y

    net = Block()
    net.set_train(False)
    t0 = time.perf_counter()
    out = net(Tensor(x)).asnumpy()
    first = time.perf_counter() - t0
    return first, _median_time(lambda: net(Tensor(x)), repeat), out


def _onnx_file(s: ConvShape, w: np.ndarray, batch: int, folder: str) -> str:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    o = s.out_hw()
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[s.k, s.k],
                            strides=[s.stride] * 2, pads=[s.pad()] * 4, group=s.group)
    graph = helper.make_graph(
        [node], s.name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, s.cin, s.hw, s.hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, s.cout, o, o])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = os.path.join(folder, f"{s.name}_{batch}.onnx")
    onnx.save(model, path)
    return path


def _ort(path: str, x: np.ndarray, repeat: int) -> float | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    opts = ort.SessionOptions()
    if THREADS:
        opts.intra_op_num_threads = THREADS
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return _median_time(lambda: sess.run(None, {"x": x}), repeat)


def _openvino(path: str, x: np.ndarray, repeat: int) -> float | None:
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    if THREADS:
        config["INFERENCE_NUM_THREADS"] = THREADS
    compiled = core.compile_model(core.read_model(path), "CPU", config)
    req = compiled.create_infer_request()
    return _median_time(lambda: req.infer({0: x}), repeat)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--only", nargs="*", default=None, help="shape names to run")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--block", action="store_true",
                        help="time conv + BatchNorm + ReLU (fused) instead of the conv alone")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads for every system (0: each its default); with 1, times "
                        "are the process's CPU time, which a loaded machine disturbs less")
    args = parser.parse_args(argv)
    global THREADS, CLOCK
    if args.threads:
        THREADS = args.threads
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = str(args.threads)
        if args.threads == 1:
            CLOCK = time.process_time
    rng = np.random.default_rng(0)
    print(f"# CPU: {platform.processor() or platform.machine()}; "
          f"{cpu_model()}; numpy {np.__version__}")
    print("| conv | batch | GFLOP | graphkernel ms (GFLOP/s) | first call s | ONNX Runtime ms |"
          " OpenVINO ms | gk / best peer |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for s in SHAPES:
            if args.only and s.name not in args.only:
                continue
            w = (rng.standard_normal((s.cout, s.cin // s.group, s.k, s.k)) * 0.1).astype(
                np.float32)
            for b in args.batch:
                x = rng.standard_normal((b, s.cin, s.hw, s.hw)).astype(np.float32)
                first, t_gk, _ = _graphkernel(s, x, w, args.block, args.repeat)
                path = _onnx_file(s, w, b, folder)
                t_ort = _ort(path, x, args.repeat)
                t_ov = _openvino(path, x, args.repeat)
                peers = [t for t in (t_ort, t_ov) if t is not None]
                gf = s.flops(b) / 1e9

                def ms(t: float | None) -> str:
                    return "-" if t is None else f"{t * 1e3:.2f}"
                ratio = f"{t_gk / min(peers):.2f}x" if peers else "-"
                print(f"| {s.name} | {b} | {gf:.2f} | {t_gk * 1e3:.2f} ({gf / t_gk:.0f}) | "
                      f"{first:.2f} | {ms(t_ort)} | {ms(t_ov)} | {ratio} |", flush=True)



if __name__ == "__main__":
    main()
