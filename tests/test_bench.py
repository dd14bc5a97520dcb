"""The benchmark harness's correctness path on tiny sizes: every system that needs only numpy
(graphkernel fused and unfused, numpy eager, numexpr when present) must match the float64
reference on every workload. Times are never asserted."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from bench import workloads as W
from bench.cli import failures, main
from bench.harness import Config, run_workload
from bench.report import markdown
from bench.systems import GraphKernel, NumExpr, NumpyEager

TINY = W.tiny_suite()


def _systems() -> list:
    systems = [GraphKernel(True), GraphKernel(False), NumpyEager()]
    ne = NumExpr()
    if ne.probe() is None:
        systems.append(ne)
    return systems


@pytest.mark.parametrize("w", TINY, ids=[w.key for w in TINY])
def test_every_output_checks_on_tiny_sizes(w: W.Workload) -> None:
    cfg = Config.quick(suite="tiny", rounds=2, overhead_rounds=2, min_sample_s=1e-4,
                       warmup_s=0.0, log=lambda msg: None)
    res = run_workload(w, _systems(), cfg, l3=1 << 20, copy_gbps=10.0)
    for key, rec in res["systems"].items():
        if rec["status"] == "not applicable":
            assert (key == "numexpr" and w.kind not in W.ELEMENTWISE_KINDS) or \
                (key == "numpy" and w.kind in W.TRAIN_KINDS)
            continue
        assert rec["status"] == "ok", (key, rec.get("error"), rec.get("modes"))
        for mode, m in rec["modes"].items():
            assert m["status"] == "ok", (key, mode, m.get("error"))
            assert m["check"]["ok"] and m["check"]["dtype"] == "float32"
            assert m["timing"]["n"] == 2 and m["timing"]["median_s"] > 0
    assert res["copy"]["median_s"] > 0
    json.dumps(res)  # the results document stays serialisable


def test_check_rejects_wrong_answers() -> None:
    w = next(w for w in TINY if w.kind == "softmax")
    inputs, params = W.make_arrays(w)
    ref = W.reference(w, inputs, params)
    good = W.np_softmax(inputs["x"])
    assert W.check(w, good, ref)["ok"]
    off = good.copy()
    off[0, 0] += 1e-3
    bad = W.check(w, off, ref)
    assert not bad["ok"] and bad["bad_elements"] == 1 and "[0, 0]" in bad["error"]
    assert not W.check(w, good.astype(np.float64), ref)["ok"]  # float32 expected
    assert not W.check(w, good[:, :-1], ref)["ok"]
    nan = good.copy()
    nan[1, 1] = np.nan
    assert not W.check(w, nan, ref)["ok"]


def test_references_match_the_math() -> None:
    # Known values, independent of the shared numpy code path.
    assert math.isclose(float(W.np_gelu(np.float64(1.0))), 0.8411919906082768, rel_tol=1e-12)
    w = next(w for w in TINY if w.kind == "layernorm")
    inputs, params = W.make_arrays(w)
    x = inputs["x"].astype(np.float64)
    y = W.reference(w, {"x": inputs["x"], "gamma": np.ones_like(inputs["gamma"]),
                        "beta": np.zeros_like(inputs["beta"])}, params)
    assert np.allclose(y.mean(axis=-1), 0, atol=1e-12)
    assert np.allclose((y * y).mean(axis=-1), x.var(axis=-1) / (x.var(axis=-1) + W.EPS))
    s = next(w for w in TINY if w.kind == "softmax")
    p = W.reference(s, W.make_arrays(s)[0], {})
    assert np.allclose(p.sum(axis=-1), 1.0) and (p > 0).all()
    e = next(w for w in TINY if w.kind == "encoder")
    inputs, params = W.make_arrays(e)
    out = W.reference(e, inputs, params)
    assert out.shape == inputs["x"].shape and np.isfinite(out).all()


def test_the_readme_counts_the_workloads_the_suites_run() -> None:
    with open(Path(__file__).resolve().parents[1] / "README.md", encoding="utf-8") as fh:
        quoted = re.search(r"on (\d+) workloads of (\d+) kinds", fh.read())
    assert quoted, "README.md's Benchmarks section no longer counts the workloads"
    for suite in (W.quick_suite(), W.full_suite()):
        assert (len(suite), len({w.kind for w in suite})) == (int(quoted[1]), int(quoted[2]))


def test_bytes_and_suites() -> None:
    full = {w.key: w for w in W.full_suite()}
    assert full["basic_4096x4096"].nbytes()["total"] == 2 * 4096 * 4096 * 4
    assert full["basic_4x4"].is_overhead and not full["softmax_8192x1024"].is_overhead
    mlp = full["mlp_512x1024x4096"].nbytes()
    assert mlp["read"] == 4 * (512 * 1024 + 2 * 4096 * 1024 + 4096 + 3 * 1024)
    assert len({w.key for w in W.quick_suite()}) == 14  # + cnn, bert, 2 steps
    train = full["mlp_train_512x1024x4096"]
    assert train.matmul_flops() == 3 * full["mlp_512x1024x4096"].matmul_flops()
    assert train.output_shape() == (1 + sum(math.prod(s) for s in train.param_shapes().values()),)


def test_training_rows_agree_with_an_independent_step() -> None:
    """The training reference (graphkernel unfused, float64) against a numpy step written by
    hand for the MLP block: forward, backward through LayerNorm and GeLU, Adam."""
    from bench import training as TR
    w = next(w for w in TINY if w.kind == "mlp_train")
    inputs, params = W.make_arrays(w, 0)
    ref = TR.reference(w, inputs, params)
    p = {k: v.astype(np.float64) for k, v in params.items()}
    x, t = (a.astype(np.float64) for a in inputs.values())
    a = x @ p["w1"].T + p["b1"]
    u = W.SQRT_2_OVER_PI * (a + 0.044715 * a ** 3)
    h = 0.5 * a * (1 + np.tanh(u))
    z = h @ p["w2"].T + p["b2"] + x
    mean, var = z.mean(-1, keepdims=True), z.var(-1, keepdims=True)
    rstd = 1 / np.sqrt(var + W.EPS)
    zhat = (z - mean) * rstd
    out = zhat * p["gamma"] + p["beta"]
    n = x.shape[0]
    loss = 0.5 * ((out - t) ** 2).sum() / n
    dout = (out - t) / n
    g = {"gamma": (dout * zhat).sum(0), "beta": dout.sum(0)}
    dzhat = dout * p["gamma"]
    dz = rstd * (dzhat - dzhat.mean(-1, keepdims=True) -
                 zhat * (dzhat * zhat).mean(-1, keepdims=True))
    g["w2"], g["b2"] = dz.T @ h, dz.sum(0)
    dh = dz @ p["w2"]
    tn = np.tanh(u)
    da = dh * (0.5 * (1 + tn) + 0.5 * a * (1 - tn ** 2) * W.SQRT_2_OVER_PI *
               (1 + 3 * 0.044715 * a ** 2))
    g["w1"], g["b1"] = da.T @ x, da.sum(0)
    lr_t = TR.LR * np.sqrt(1 - TR.BETA2) / (1 - TR.BETA1)
    new = []
    for k in w.param_shapes():
        m, v = (1 - TR.BETA1) * g[k], (1 - TR.BETA2) * g[k] ** 2
        new.append(p[k] - lr_t * m / (np.sqrt(v) + TR.ADAM_EPS))
    want = TR.step_vector(w, loss, new)
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-7)


@pytest.mark.slow  # a whole bench run
def test_cli_quick_path_writes_results(tmp_path: object) -> None:
    out = str(tmp_path)
    code = main(["--suite", "tiny", "--keep-env", "--systems", "gk_fused,numpy",
                 "--workloads", "basic,softmax", "--compile-probes", "none", "--rounds", "2",
                 "--out", out])
    assert code == 0
    with open(f"{out}/results.json", encoding="utf-8") as fh:
        results = json.load(fh)
    assert [w["kind"] for w in results["workloads"]] == ["basic", "basic", "softmax"]
    assert failures(results) == []
    text = markdown(results)
    assert "| softmax_8x16 |" in text and "graphkernel fused" in text
    # A wrong answer is reported as a failure, never timed.
    rec = results["workloads"][0]["systems"]["gk_fused"]
    rec["modes"]["fresh"] = {"status": "wrong answer", "error": "1 of 16 elements"}
    assert failures(results) and "**wrong answer**" in markdown(results)


@pytest.mark.slow  # two compile probes, new processes
def test_progress_lines_give_every_figure_its_unit() -> None:
    # What a run prints while it works, every figure with its unit (it printed
    # `cold 0.6622946709999269`): the compile probes and the parallel check.
    from bench import machine
    from bench.probe import compile_times
    from bench.units import parallel_text
    lines: list[str] = []
    compile_times("tiny", TINY[:1], ["gk_fused"], log=lines.append)
    assert len(lines) == 1 and re.fullmatch(
        rf"  compile {TINY[0].key} gk_fused: cold [\d.]+ m?s, warm [\d.]+ [mµ]?s", lines[0]), lines
    text = parallel_text(machine.parallel_check(iterations=50))
    assert re.fullmatch(r"one process [\d.]+ [mµ]?s, two at once [\d.]+ [mµ]?s each \(mean of 4\): "
                        r"ratio [\d.]+, (parallel|partly time-shared|time-shared)", text), text


def test_a_system_that_crashed_in_its_probe_is_not_run() -> None:
    from bench.probe import crashes_in
    probes = {"workloads": {"basic_4x4": {
        "gk_fused": {"cold": {"error": "probe process died (exit code -11)", "crashed": True},
                     "warm": None},
        "gk_unfused": {"cold": {"first_result_s": 0.5, "ok": True}, "warm": None}}}}
    crashed = crashes_in(probes)
    assert crashed == {"basic_4x4": {"gk_fused": "probe process died (exit code -11)"}}
    w = TINY[0]
    cfg = Config.quick(suite="tiny", rounds=1, overhead_rounds=1, min_sample_s=1e-4,
                       warmup_s=0.0, log=lambda msg: None)
    res = run_workload(w, [GraphKernel(True), NumpyEager()], cfg, l3=1 << 20, copy_gbps=10.0,
                       crashed=crashed[w.key])
    assert res["systems"]["gk_fused"]["status"] == "crashed"
    assert res["systems"]["numpy"]["status"] == "ok"
    assert any("crashed" in line for line in failures({"workloads": [res]}))


def test_graphkernel_bench_runs_the_harness_as_its_own_program(capfd: pytest.CaptureFixture
                                                                 ) -> None:
    # `graphkernel bench ARGS` is `python -m bench ARGS` in a child process: the CLI never
    # imports the harness, and the child's exit status is the command's.
    import subprocess
    import sys

    from graphkernel.tools.cli import main as cli_main
    assert cli_main(["bench", "--help"]) == 0
    assert "usage: graphkernel bench [-h] [--quick]" in capfd.readouterr().out
    assert cli_main(["bench", "--suite", "no-such-suite"]) == 2
    assert "invalid choice: 'no-such-suite'" in capfd.readouterr().err
    code = "import sys, graphkernel.tools.cli; print('bench' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow  # peer libraries
@pytest.mark.parametrize("peer", ["torch", "jax", "onnxruntime"])
@pytest.mark.parametrize("kind", ["cnn", "bert"])
def test_example_networks_on_installed_peers_match_the_reference(kind: str, peer: str) -> None:
    """bench/net_peers.py: the CNN and BERT-tiny as each peer writes them, checked against the
    float64 reference (skipped where that peer is not installed, as in CI)."""
    from bench.peers import all_systems
    system = next(s for s in all_systems() if s.key == peer)
    why = system.probe()
    if why:
        pytest.skip(why)
    w = next(w for w in TINY if w.kind == kind)
    cfg = Config.quick(suite="tiny", rounds=2, overhead_rounds=2, min_sample_s=1e-4,
                       warmup_s=0.0, log=lambda msg: None)
    rec = run_workload(w, [system], cfg, l3=1 << 20, copy_gbps=10.0)["systems"][peer]
    assert rec["status"] == "ok", (peer, rec.get("error"), rec.get("note"))
    assert all(m["status"] == "ok" for m in rec["modes"].values()), rec["modes"]
