"""bench/real.py (`python -m bench --real`): the row runner's checks and summaries on stand-in
systems, the imported-vs-hand-written row on a tiny workload, and the real networks' two
versions (graphkernel.nn and torch.nn) sharing every parameter by name."""
import os

import numpy as np
import pytest

from bench import real, real_report, real_systems
from bench.workloads import tiny_suite


def _row(outputs: dict, group: str = "real") -> real.Row:
    def build(tmp: str):
        return [real.Contender(k, (lambda v=v: ((lambda i: v), {"kernel_count": 3})))
                for k, v in outputs.items()] + \
            [real.Contender("torch", None, "torch is not installed")], {}
    return real.Row("stand_in", group, "stand-in row", build, rtol=1e-3)


def test_a_wrong_answer_is_flagged_and_not_timed(tmp_path) -> None:
    ref = np.linspace(-1, 1, 12, dtype=np.float32)
    res = real.run_row(_row({"gk_fused": ref * 1.01, "gk_unfused": ref, "onnxruntime": ref}),
                       2, str(tmp_path), lambda msg: None)
    s = res["systems"]
    assert res["checked_against"] == "onnxruntime"
    assert s["gk_fused"]["status"] == "wrong answer" and "steady_median_s" not in s["gk_fused"]
    assert s["gk_unfused"]["status"] == "ok" and len(s["gk_unfused"]["steady_samples_s"]) == 2
    assert s["torch"]["status"] == "skipped" and "not installed" in s["torch"]["note"]
    assert res["best_peer"] == "onnxruntime" and "gk_unfused_over_best_peer" in res
    text = real_report.markdown({"started_utc": "2026-01-01T00:00:00Z", "rounds": 2,
                          "machine": {"cpu_model": "test cpu"}, "versions": {},
                          "copy_bandwidth": {"gbps": 1.0}, "openvino_config": {},
                          "rows": [res]}, "python -m bench --real")
    assert "test cpu" in text and "wrong answer" in text and "| stand_in |" in text


def _counting_row(seconds: float, calls: dict[str, list[int]],
                  apart: dict[str, float] | None = None) -> real.Row:
    """Stand-in systems whose every call is logged; each call's time is `seconds`, or for the
    ones `apart` from the row's warm rule (Contender.warm_rule) their own."""
    import time as _time
    ref = np.ones(4, dtype=np.float32)
    apart = apart or {}

    def system(key: str):
        def call(i: int) -> np.ndarray:
            calls[key].append(i)
            _time.sleep(apart.get(key, seconds))
            return ref
        return call, {}

    def build(tmp: str):
        return [real.Contender(k, (lambda k=k: system(k)), warm_rule=k not in apart)
                for k in calls], {}
    return real.Row("counting", "real", "stand-in row", build, rtol=1e-3)


@pytest.mark.parametrize("seconds, warm", [(0.06, True), (1.05, False)])
def test_each_sample_follows_an_untimed_call_of_its_own_system(tmp_path, monkeypatch,
                                                               seconds, warm) -> None:
    # Timed after itself, not after the other system (whose pool may still spin), on rows
    # whose calls are short; long rows skip it (their bench time would double).
    calls: dict[str, list[int]] = {"gk_fused": [], "onnxruntime": []}
    rounds = 2
    res = real.run_row(_counting_row(seconds, calls), rounds, str(tmp_path), lambda m: None)
    assert res["warm_call_before_sample"] is warm
    for key, log in calls.items():
        timed = rounds * res["systems"][key]["calls_per_sample"]
        checking = 1  # the first call, checked against the reference (check_calls=1)
        assert len(log) == checking + timed + (rounds if warm else 0), key


def test_a_system_of_seconds_a_call_stands_apart_from_the_warm_rule(tmp_path) -> None:
    # MindSpore's CPU convolutions take seconds a call at 224x224 where the others take
    # milliseconds: it gets no untimed call, and the others keep theirs (1.05 s: over
    # WARM_CALL_BELOW_S, which would have turned theirs off)
    calls: dict[str, list[int]] = {"gk_fused": [], "onnxruntime": [], "mindspore": []}
    rounds = 2
    res = real.run_row(_counting_row(0.06, calls, apart={"mindspore": 1.05}), rounds,
                       str(tmp_path), lambda m: None)
    assert res["warm_call_before_sample"] is True and res["no_warm_call"] == ["mindspore"]
    for key, log in calls.items():
        timed = rounds * res["systems"][key]["calls_per_sample"]
        assert len(log) == 1 + timed + (0 if key == "mindspore" else rounds), key
    assert res["best_peer"] == "onnxruntime"  # the fastest peer, MindSpore among them
    text = real_report.markdown({"started_utc": "2026-01-01T00:00:00Z", "rounds": rounds,
                                 "machine": {}, "versions": {}, "copy_bandwidth": {"gbps": 1.0},
                                 "openvino_config": {}, "rows": [res]}, "python -m bench --real")
    assert "MindSpore 2.10 fused: no untimed call before each sample" in text


@pytest.mark.slow  # a peer library: MindSpore's compile of a ResNet takes seconds
def test_mindspore_runs_the_same_network_code_and_weights(tmp_path) -> None:
    if real_systems.mindspore_missing():
        pytest.skip(real_systems.mindspore_missing())
    import graphkernel
    from bench.real_models import gk_cnn, gk_params
    params = gk_params(gk_cnn("resnet18", classes=10))
    xs = [np.random.default_rng(i).standard_normal((2, 3, 32, 32)).astype(np.float32)
          for i in range(2)]
    exe = graphkernel.compile(gk_cnn("resnet18", params, classes=10), xs[0])
    call, info = real_systems.mindspore_cnn("resnet18", params, xs, str(tmp_path))
    for i, x in enumerate(xs):
        want = exe(graphkernel.Tensor(x)).asnumpy()
        got = call(i)
        assert got.shape == (2, 10)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert info["graph_kernel"] is True and info["first_call_in_helper_s"] > 0


def test_only_refuses_an_unknown_row() -> None:
    with pytest.raises(SystemExit, match="unknown row"):
        real.select(["resnet_999"])
    rows, table = real.select(["imported", "compile_table"])
    assert rows and all(r.group == "imported" for r in rows) and table


@pytest.mark.skipif(not os.environ.get("CI") and real_systems.missing("onnx") is not None,
                    reason="pip install -e '.[test]' (onnx)")
def test_imported_and_hand_written_agree_on_a_tiny_workload(tmp_path) -> None:
    w = next(w for w in tiny_suite() if w.kind == "mlp")
    res = real.run_row(real._imported_row(w), 2, str(tmp_path), lambda msg: None)
    s = res["systems"]
    assert s["gk_handwritten"]["status"] == "ok" and s["gk_imported"]["status"] == "ok"
    assert s["gk_imported"]["max_err_over_max_ref"] < 1e-5
    assert res["kernel_counts"]["gk_imported"] >= 1 and res["imported_over_handwritten"] > 0
    # the row says whether one C call ran the graph, and what else the plan holds
    assert s["gk_imported"]["c_entry"] is True, s["gk_imported"]["other_steps"]
    assert s["gk_imported"]["other_steps"] == ["library MatMul"]


@pytest.mark.parametrize("model", ["resnet18", "resnet50", "mobilenetv2"])
def test_the_torch_network_takes_every_graphkernel_parameter(model: str) -> None:
    pytest.importorskip("torch", reason="pip install -r bench/requirements.txt (torch)")
    from bench.real_models import gk_cnn, gk_params, load_into_torch, torch_cnn
    params = gk_params(gk_cnn(model))
    net = torch_cnn(model)
    load_into_torch(net, params)  # raises on any name in one and not the other
    state = net.state_dict()
    assert np.array_equal(state["features.0.bn.running_var"].numpy(),
                          params["features.0.bn.moving_variance"])
    rebuilt = gk_params(gk_cnn(model, params))
    assert all(np.array_equal(rebuilt[k], v) for k, v in params.items())


def test_a_training_step_with_the_wrong_update_is_flagged(tmp_path) -> None:
    def stepper(drop: float):
        return lambda: ((lambda i: np.array([10.0 - drop * i], np.float32)), {})

    def build(tmp: str):
        return [real.Contender("gk_fused", stepper(1.0)),
                real.Contender("gk_unfused", stepper(0.5)),
                real.Contender("torch", stepper(0.51))], {}
    row = real.Row("stand_in_train", "real", "stand-in step", build, rtol=0.2, check_calls=2)
    res = real.run_row(row, 1, str(tmp_path), lambda msg: None)
    s = res["systems"]
    assert res["checked_against"] == "torch"
    # the losses are within rtol of each other; only the change one step made tells them apart
    assert s["gk_fused"]["status"] == "wrong answer" and "loss change" in s["gk_fused"]["error"]
    assert s["gk_unfused"]["status"] == "ok" and abs(s["gk_unfused"]["loss_change"] + 0.5) < 1e-6


def test_the_summary_pairs_each_round_with_the_peer_timed_beside_it() -> None:
    # the machine slows in round 2 for both: medians alone say fused is 7% behind, the rounds
    # say it was ahead in two of three
    samples = {"gk_fused": [1.0, 2.0, 1.5], "onnxruntime": [1.05, 2.1, 1.4],
               "openvino": [1.6, 1.6, 1.6]}
    res = {"group": "real", "systems": {
        k: {"label": k, "status": "ok", "steady_median_s": float(np.median(v)),
            "steady_samples_s": v} for k, v in samples.items()}}
    real.summarise(res)
    assert res["best_peer"] == "onnxruntime"
    assert abs(res["gk_fused_over_best_peer"] - 1.5 / 1.4) < 1e-9
    assert res["gk_fused_over_best_peer_rounds"] == [0.9524, 0.9524, 1.071]
    res["name"], res["title"] = "drift", "a stand-in row"
    text = real_report.markdown({"started_utc": "2026-01-01T00:00:00Z", "rounds": 3,
                                 "machine": {}, "versions": {}, "copy_bandwidth": {"gbps": 1.0},
                                 "openvino_config": {}, "rows": [res]}, "python -m bench --real")
    assert "| drift | ONNX Runtime | 1400 | 1500 | 1.07x | 0.95x (0.95-1.07), 2/3 at or below |" \
        in text
    # the model's arithmetic over each one's median, against the run's FMA peak
    res["systems"]["gk_fused"]["flops"] = 300e9
    real.summarise(res)
    assert res["gflop_per_s"] == {"gk_fused": 200.0, "onnxruntime": 300e9 / 1.4 / 1e9}
    text = real_report.markdown({"started_utc": "2026-01-01T00:00:00Z", "rounds": 3,
                                 "machine": {}, "versions": {}, "copy_bandwidth": {"gbps": 1.0},
                                 "openvino_config": {}, "rows": [res],
                                 "fma_peak": {"gflops_core": 125.0, "cores": 2,
                                              "gflops": 250.0, "how": "stand-in"}},
                                "python -m bench --real")
    assert "FMA peak 250.0 GFLOP/s (125.0 a core x 2; stand-in)" in text
    assert "| 200 / 214 (80% / 86%) |" in text


def test_a_row_says_how_its_entry_ran_the_calls(tmp_path) -> None:
    # a sample on one thread (a probe) is twice a call on threads: the row keeps the counts
    ref = np.ones(4, dtype=np.float32)

    def fused():
        def call(i: int) -> np.ndarray:
            return ref
        call.threads_stats = lambda: {"calls_alone": 1, "probes": 2, "probes_skipped": 3,
                                      "switches": 0}
        return call, {}

    def build(tmp: str):
        return [real.Contender("gk_fused", fused),
                real.Contender("onnxruntime", lambda: ((lambda i: ref), {}))], {}
    res = real.run_row(real.Row("modes", "real", "stand-in row", build), 2, str(tmp_path),
                       lambda msg: None)
    assert res["systems"]["gk_fused"]["threads_stats"]["probes"] == 2
    assert "threads_stats" not in res["systems"]["onnxruntime"]
    text = real_report.markdown({"started_utc": "2026-01-01T00:00:00Z", "rounds": 2,
                                 "machine": {}, "versions": {}, "copy_bandwidth": {"gbps": 1.0},
                                 "openvino_config": {}, "rows": [res]}, "python -m bench --real")
    assert "graphkernel fused's entry: 1 calls on one thread, 2 probes (3 skipped), " \
        "0 switches." in text
