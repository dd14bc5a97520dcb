"""bench/codegen_ab.py: a setting's before/after in one process; `--threads` times whole calls
by the wall clock and is refused for per-step timing."""
import os

import pytest


@pytest.fixture
def codegen_ab(monkeypatch):
    # The module sets OMP_NUM_THREADS when imported and main() sets it again: keep this
    # worker's value for the tests after this one.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "2"))
    from bench import codegen_ab
    return codegen_ab


def test_threads_need_whole_calls(codegen_ab, capsys):
    with pytest.raises(SystemExit):
        codegen_ab.main(["suite:basic_4x4", "--threads", "2", "", ""])
    assert "--threads needs --whole" in capsys.readouterr().err


def test_whole_calls_on_threads(codegen_ab, capsys, cache_folder):
    codegen_ab.main(["suite:basic_4x4", "--whole", "--threads", "2", "--calls", "2", "",
                     "graphkernel.backends.c.c_text:INDEX_WRAPS=True"])
    out = capsys.readouterr().out
    assert "2 thread(s), 2 calls a side" in out
    assert "A: min" in out and "B: min" in out and "B/A min" in out
