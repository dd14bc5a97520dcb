"""bench/ab.py: the before/after harness's summary, flags, report and worker plumbing, on fake
runs (no compile, no subprocess)."""
from __future__ import annotations

import json
import math

import pytest

from bench import ab


def _record(side: str, rnd: int, workload: str, per_system: dict[str, float],
            jitter: float = 0.0) -> dict:
    """One worker's record: three samples per system around the given per-call seconds."""
    systems = {}
    for key, t in per_system.items():
        samples = [t * (1 - jitter), t, t * (1 + jitter)]
        systems[key] = {"status": "ok", "k": 10, "cpu_s": samples,
                        "wall_s": [s * 1.1 for s in samples]}
    return {"workload": workload, "side": side, "round": rnd, "systems": systems,
            "process_s": 1.0}


def _fake_run(after_gk: dict[str, list[float]], control: dict[str, list[float]] | None = None
              ) -> list[dict]:
    """Before: every system 1 ms; after: gk_fused's per-round factor from `after_gk`, numpy's
    from `control` (1.0 when not given)."""
    records = []
    for workload, factors in after_gk.items():
        for r, factor in enumerate(factors, start=1):
            c = (control or {}).get(workload, [1.0] * len(factors))[r - 1]
            records.append(_record("before", r, workload, {"gk_fused": 1e-3, "numpy": 2e-3},
                                   jitter=0.02))
            records.append(_record("after", r, workload, {"gk_fused": 1e-3 * factor,
                                                          "numpy": 2e-3 * c}, jitter=0.02))
    return records


def _row(rows: list[ab.Row], workload: str, system: str) -> ab.Row:
    return next(r for r in rows if r.workload == workload and r.system == system)


def test_a_slower_row_is_flagged_and_the_steady_control_is_one():
    records = _fake_run({"slow": [1.5, 1.4, 1.6], "same": [1.0, 1.01, 0.99]})
    rows, verdict = ab.summarise(records, ["slow", "same"], ["gk_fused", "numpy"], noise=0.03)
    slow = _row(rows, "slow", "gk_fused")
    assert slow.cpu_ratio == pytest.approx(1.5)
    assert (slow.cpu_ratio_low, slow.cpu_ratio_high) == pytest.approx((1.4, 1.6))
    assert slow.before_cpu_s == pytest.approx(1e-3)
    assert slow.wall_ratio == pytest.approx(1.5)
    assert slow.rounds == 3 and slow.flagged
    assert not _row(rows, "same", "gk_fused").flagged
    assert verdict["control_median_ratio"] == pytest.approx(1.0)
    assert verdict["noise_bound"] == pytest.approx(0.03)
    # spread: (p90 - p10) / median of the 9 samples, three each of 0.98, 1.0, 1.02 ms
    assert slow.before_spread == pytest.approx(0.04)
    text = ab.markdown(rows, verdict, ["# header"])
    assert "| slow | gk_fused | 1 | 1.5 |" in text
    assert "Rows outside noise: 1: slow/gk_fused (1.500)" in text
    assert "median after/before CPU ratio 1.000 over 2 workloads" in text


def test_an_unsteady_control_widens_the_noise_bound():
    records = _fake_run({"a": [1.10, 1.12, 1.08], "b": [1.0, 1.0, 1.0]},
                        control={"b": [1.2, 1.2, 1.2]})
    rows, verdict = ab.summarise(records, ["a", "b"], ["gk_fused", "numpy"], noise=0.03)
    assert verdict["control_largest_deviation"] == pytest.approx(0.2)
    assert verdict["noise_bound"] == pytest.approx(0.2)
    assert not _row(rows, "a", "gk_fused").flagged


def test_rounds_that_disagree_in_sign_are_noise():
    records = _fake_run({"a": [0.9, 1.3, 1.2]})
    rows, _ = ab.summarise(records, ["a"], ["gk_fused", "numpy"], noise=0.03)
    row = _row(rows, "a", "gk_fused")
    assert row.cpu_ratio == pytest.approx(1.2) and not row.flagged


def test_a_failed_or_inapplicable_system_is_a_row_with_its_reason():
    records = _fake_run({"a": [1.0, 1.0]})
    records.append({"workload": "b", "side": "before", "round": 1,
                    "error": "exit 1: Boom", "process_s": 0.1})
    records.append({"workload": "b", "side": "after", "round": 1, "process_s": 0.1,
                    "systems": {"gk_fused": {"status": "not applicable", "note": "no grads"}}})
    rows, _ = ab.summarise(records, ["a", "b"], ["gk_fused"], noise=0.03)
    row = _row(rows, "b", "gk_fused")
    assert row.rounds == 0 and math.isnan(row.cpu_ratio)
    assert row.note == "before: exit 1: Boom; after: not applicable (no grads)"
    assert "| b | gk_fused | - | - | - | - | - | before: exit 1: Boom;" in \
        ab.markdown(rows, {"control_median_ratio": math.nan, "control_rows": 0,
                           "control_largest_deviation": math.nan, "noise_bound": 0.03}, [])


def test_each_side_goes_first_equally_often():
    firsts = [ab.side_first(r, i)[0] for r in range(1, 5) for i in range(7)]
    assert firsts.count("before") == firsts.count("after") == 14
    assert ab.side_first(1, 0) != ab.side_first(2, 0)  # alternates by round
    assert ab.side_first(1, 0) != ab.side_first(1, 1)  # and by workload


def test_side_env_pins_threads_and_the_checkout():
    side = ab.Side("before", "/src/old", "abc", "/tmp/cache-before")
    base = {"OPENBLAS_CORETYPE": "Haswell", "OMP_NUM_THREADS": "8", "PATH": "/bin"}
    env = ab.side_env(side, all_cores=False, base=base)
    assert env["PYTHONPATH"] == "/src/old" and env["GRAPHKERNEL_CACHE_DIR"] == "/tmp/cache-before"
    assert all(env[v] == "1" for v in ab.THREAD_VARIABLES)
    assert "OPENBLAS_CORETYPE" not in env and env["PATH"] == "/bin"
    env_all = ab.side_env(side, all_cores=True, base=base)
    assert not any(v in env_all for v in ab.THREAD_VARIABLES)


def test_report_from_a_saved_run(tmp_path):
    records = _fake_run({"slow": [1.5, 1.5]})
    run = {"records": records, "workloads": ["slow"], "systems": ["gk_fused", "numpy"],
           "noise": 0.03, "header": ["# Before/after: fake"]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    out = tmp_path / "ab.md"
    assert ab.main(["--report", str(path), str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Before/after: fake") and "slow/gk_fused (1.500)" in text


def test_the_worker_times_the_control_on_a_tiny_workload():
    cfg = ab.WorkerConfig(systems=("numpy",), samples=2, min_sample_s=0.0, warmup_s=0.0)
    out = ab.worker("tiny", "basic_4x4", cfg)
    rec = out["systems"]["numpy"]
    assert rec["status"] == "ok" and rec["check_ok"]
    assert len(rec["cpu_s"]) == len(rec["wall_s"]) == 2 and min(rec["wall_s"]) > 0
    with pytest.raises(ValueError, match="no workload"):
        ab.worker("tiny", "nope", cfg)
