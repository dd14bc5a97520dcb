"""The bench's processes run as a user's would: Python's bytecode cache written. Under
PYTHONDONTWRITEBYTECODE=1 (set in some sandboxes) every warm compile probe compiled
graphkernel's modules from source, and the warm first result it reported was not graphkernel's."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import cli
from bench.probe import probe_environ
from bench.report import _compile_table


class _Exec(Exception):
    pass


def test_the_bench_reexecutes_without_dontwritebytecode_and_records_it(monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.delenv("OPENBLAS_L2_SIZE", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.delenv(cli.MARKER, raising=False)
    seen: dict[str, dict[str, str]] = {}

    def fake_execve(path: str, args: list[str], env: dict[str, str]) -> None:
        seen["env"] = env
        raise _Exec

    monkeypatch.setattr(cli.os, "execve", fake_execve)
    with pytest.raises(_Exec):
        cli._reexec(["--quick"])
    env = seen["env"]
    assert "PYTHONDONTWRITEBYTECODE" not in env and "OPENBLAS_CORETYPE" not in env
    # What was removed is recorded (results.json's removed_environment, results.md's line).
    assert json.loads(env[cli.MARKER]) == {"OPENBLAS_CORETYPE": "Haswell",
                                           "PYTHONDONTWRITEBYTECODE": "1"}


def test_probe_processes_write_the_bytecode_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env, removed = probe_environ(str(tmp_path))
    assert removed == {"PYTHONDONTWRITEBYTECODE": "1"}
    assert env["GRAPHKERNEL_CACHE_DIR"] == str(tmp_path / "graphkernel")
    done = subprocess.run([sys.executable, "-c", "import sys; print(sys.dont_write_bytecode)"],
                          env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    # Without the variable nothing is removed.
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    assert probe_environ(str(tmp_path))[1] == {}


def test_the_compile_table_says_what_the_probes_ran_without():
    ct = {"notes": {}, "removed_environment": {"PYTHONDONTWRITEBYTECODE": "1"},
          "workloads": {"basic_4x4": {"gk_fused": {
              "cold": {"first_result_s": 0.3, "ok": True},
              "warm": {"first_result_s": 0.04, "ok": True}}}}}
    text = "\n".join(_compile_table({"compile_times": ct}, {"gk_fused": "graphkernel fused"}))
    assert "| basic_4x4 | 0.30 / 0.04 |" in text
    assert "without PYTHONDONTWRITEBYTECODE=1" in text


def test_the_probe_leaves_the_bench_bookkeeping_out_of_the_first_result(monkeypatch):
    # A training step's prepare copies the weights for a restore and replays a pass stage for
    # its report (80-140 ms warm): the bench's work, not the user's, so not in the figure.
    import time

    from bench import probe, training
    weights = training._gk_weights

    def slow_weights(*args):
        time.sleep(0.3)
        return weights(*args)
    monkeypatch.setattr(training, "_gk_weights", slow_weights)
    res = probe._probe("tiny", "mlp_train_4x8x32", "gk_fused")
    assert res["ok"], res
    assert res["untimed_s"] >= 0.3
    # What is left is the cell, the compile and the first call (~ms at tiny sizes).
    assert res["first_result_s"] < res["compile_s"] + res["first_call_s"] + 0.2, res
