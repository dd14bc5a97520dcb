"""bench/codegen_ab.py: a setting's before/after in one process; `--threads` times whole calls,
or each kernel within them, by the wall clock."""
import os
import re

import pytest


@pytest.fixture
def codegen_ab(monkeypatch):
    # The module sets OMP_NUM_THREADS when imported and main() sets it again: keep this
    # worker's value for the tests after this one.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "2"))
    from bench import codegen_ab
    return codegen_ab


def test_kernels_within_whole_calls_on_threads(codegen_ab, capsys, cache_folder):
    codegen_ab.main(["suite:mlp", "--threads", "2", "--calls", "2", "",
                     "graphkernel.backends.c.c_text:INDEX_WRAPS=True"])
    out = capsys.readouterr().out
    assert "2 thread(s), 2 calls a side" in out
    assert "| kernel # | ops | A ms | B ms | B/A |" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "MatMul" in line]
    assert rows, out  # the block's products take well over the 50 us a row needs
    total = re.search(r"sum A ([0-9.]+) ms, B ([0-9.]+) ms", out)
    assert total is not None and float(total.group(1)) > 0 and float(total.group(2)) > 0


def test_whole_calls_on_threads(codegen_ab, capsys, cache_folder):
    codegen_ab.main(["suite:basic_4x4", "--whole", "--threads", "2", "--calls", "2", "",
                     "graphkernel.backends.c.c_text:INDEX_WRAPS=True"])
    out = capsys.readouterr().out
    assert "2 thread(s), 2 calls a side" in out
    assert "A: min" in out and "B: min" in out and "B/A min" in out
