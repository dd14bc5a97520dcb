"""save_graphs never deletes or overwrites a file it did not write; a bad folder is a clear error
before compiling."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

from graphkernel import Tensor, nn
from graphkernel.errors import ContextError, DumpError
from graphkernel.frontend import context
from graphkernel.ops import operations as P
from graphkernel.passes.dumper import MANIFEST

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
X = np.arange(12, dtype=np.float32).reshape(3, 4)


class Kernel(nn.GraphKernel):
    def construct(self, x: Any) -> Any:
        return x * 2.0 + 1.0


class Net(nn.Cell):
    traced = 0

    def __init__(self) -> None:
        super().__init__()
        self.k = Kernel()

    def construct(self, x: Any) -> Any:
        Net.traced += 1
        return P.Exp()(self.k(x)) * 0.5


def _dump_to(folder: Any, fusion: bool = True, flags: str = "") -> Any:
    context.set_context(save_graphs=True, save_graphs_path=str(folder),
                        enable_graph_kernel=fusion, graph_kernel_flags=flags)
    return Net()(Tensor(X))


def _files(folder: Any) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder)
            for f in fs}


def test_dumps_are_listed_and_rewritten_on_the_next_compile(tmp_path: Any) -> None:
    _dump_to(tmp_path, flags="--dump_as_text")
    first = _files(tmp_path)
    assert {"6_validate.ir", "hwopt_d_end.dot", "graph_kernel_summary.txt", MANIFEST} <= first
    assert any(f.startswith("kernel_meta" + os.sep) and f.endswith(".c") for f in first)
    # The execution plan a reader can check: its steps, slots, buffers and what each frees.
    plan = (tmp_path / "kernel_meta" / "gk_Net.plan.txt").read_text()
    assert plan.startswith("plan Net: inputs") and "kernel" in plan and "return" in plan
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    # graph_kernel_dump/ (--dump_as_text's folder, as in MindSpore) keeps its own list.
    own = {f for f in first if f.startswith("graph_kernel_dump" + os.sep)}
    assert own == {os.path.join("graph_kernel_dump", n) for n in ("Net.txt", MANIFEST)}
    assert set(manifest["files"]) == first - {MANIFEST} - own
    _dump_to(tmp_path, flags="--dump_as_text")  # our own files: replaced without complaint
    assert _files(tmp_path) == first  # nothing extra (no temporary files left behind)


@pytest.mark.parametrize("name", ["6_validate.ir", "0_trace.dot", "hwopt_d_end.ir",
                                  "graph_kernel_summary.txt",
                                  os.path.join("kernel_meta", "gk_Net.c"),
                                  os.path.join("kernel_meta", "gk_Net.plan.txt")])
def test_a_users_file_with_a_dumps_name_is_refused_before_compiling(tmp_path: Any,
                                                                    name: str) -> None:
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("my notes\n")
    Net.traced = 0
    with pytest.raises(DumpError) as info:
        _dump_to(tmp_path, flags="--dump_as_text")
    msg = str(info.value)
    assert str(path) in msg and "graphkernel did not write" in msg
    assert "save_graphs_path" in msg
    assert Net.traced == 0  # refused before tracing
    assert path.read_text() == "my notes\n"
    assert _files(tmp_path) == {name}  # nothing written, nothing removed


def test_a_dump_the_user_edited_is_not_overwritten(tmp_path: Any) -> None:
    _dump_to(tmp_path)
    edited = tmp_path / "hwopt_d_end.ir"
    edited.write_text(edited.read_text() + "\n# my annotations\n")
    with pytest.raises(DumpError, match="hwopt_d_end.ir"):
        _dump_to(tmp_path)
    assert edited.read_text().endswith("# my annotations\n")


def test_a_symlink_with_a_dumps_name_is_refused(tmp_path: Any) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    folder = tmp_path / "dumps"
    folder.mkdir()
    os.symlink(target, folder / "0_trace.ir")
    with pytest.raises(DumpError, match="0_trace.ir"):
        _dump_to(folder)
    assert target.read_text() == "keep me"


def test_other_files_in_the_folder_are_never_touched(tmp_path: Any) -> None:
    mine = {"notes.txt": "a", "0_trace.ir.tmp": "b", "6_validate.ir.bak": "c",
            os.path.join("kernel_meta", "helper.c"): "d"}
    for name, text in mine.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    for fusion in (True, False, True):
        _dump_to(tmp_path, fusion=fusion)
    for name, text in mine.items():
        assert (tmp_path / name).read_text() == text


def test_a_manifest_that_is_not_graphkernels_is_refused(tmp_path: Any) -> None:
    (tmp_path / MANIFEST).write_text("something else")
    with pytest.raises(DumpError, match="not graphkernel's list of its dumps"):
        _dump_to(tmp_path)
    assert (tmp_path / MANIFEST).read_text() == "something else"


def test_save_graphs_path_that_cannot_be_created(tmp_path: Any) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    Net.traced = 0
    with pytest.raises(ContextError) as info:
        _dump_to(blocker / "dumps")
    assert f"save_graphs_path {blocker / 'dumps'} cannot be created" in str(info.value)
    assert Net.traced == 0


def test_save_graphs_path_that_is_not_writable(tmp_path: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if os.fspath(p) == str(folder)
                        else real_access(p, mode))
    Net.traced = 0
    with pytest.raises(ContextError) as info:
        _dump_to(folder)
    assert f"save_graphs_path {folder} is not writable" in str(info.value)
    assert "set_context(save_graphs_path=...)" in str(info.value)
    assert Net.traced == 0
    assert os.listdir(folder) == []


def test_clean_up_removes_only_graphkernels_own_dumps(tmp_path: Any) -> None:
    from graphkernel.passes.dumper import Dumper
    (tmp_path / "notes.txt").write_text("mine")
    _dump_to(tmp_path)
    edited = tmp_path / "0_trace.ir"
    edited.write_text("my edit")
    removed = Dumper(str(tmp_path)).clean()
    assert removed and all(os.path.dirname(p).startswith(str(tmp_path)) for p in removed)
    assert str(edited) not in removed
    assert _files(tmp_path) == {"notes.txt", "0_trace.ir", MANIFEST}
    assert edited.read_text() == "my edit" and (tmp_path / "notes.txt").read_text() == "mine"
    # The edited file is still listed as ours-but-changed: a new dump refuses to replace it.
    with pytest.raises(DumpError, match="0_trace.ir"):
        _dump_to(tmp_path)
    edited.unlink()
    _dump_to(tmp_path)
    assert Dumper(str(tmp_path)).clean() and _files(tmp_path) == {"notes.txt"}


_SHARED_SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    sys.path.insert(0, {root!r})
    from graphkernel import Tensor, nn
    from graphkernel.frontend import context
    from graphkernel.ops import operations as P

    class Net(nn.Cell):
        def construct(self, x):
            return P.Exp()(x * 2.0 + 1.0) * 0.5

    folder, start, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    context.set_context(save_graphs=True, save_graphs_path=folder, enable_graph_kernel=True,
                        graph_kernel_flags="--dump_as_text")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    while time.time() < start:
        time.sleep(0.001)
    for _ in range(rounds):
        out = Net()(Tensor(x)).asnumpy()
        assert np.allclose(out, np.exp(x * 2.0 + 1.0) * 0.5, rtol=1e-6)
    print("ok")
""")


def test_processes_sharing_one_save_graphs_path(tmp_path: Any) -> None:
    import hashlib
    import time
    folder = tmp_path / "shared"
    script = tmp_path / "shared.py"
    script.write_text(_SHARED_SCRIPT.format(root=ROOT))
    env = dict(os.environ, GRAPHKERNEL_CACHE_DIR=str(tmp_path / "cache"))
    # Compile once first so that the processes race on the dumps, not on gcc.
    subprocess.run([sys.executable, str(script), str(tmp_path / "warm"), "0", "1"], env=env,
                   check=True, capture_output=True, timeout=300)
    start = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, str(script), str(folder), str(start), "3"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    results = [p.communicate(timeout=300) for p in procs]
    failed = [err[-600:] for p, (_, err) in zip(procs, results) if p.returncode != 0]
    assert failed == [], failed
    # The manifest lists every dump with the checksum of what is there: the folder stays usable.
    manifest = json.loads((folder / MANIFEST).read_text())["files"]
    files = _files(folder) - {MANIFEST}
    files = {f for f in files if not f.startswith("graph_kernel_dump" + os.sep)}
    assert set(manifest) == files
    for name, digest in manifest.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    assert not [f for f in _files(folder) if f.endswith((".tmp", ".lock"))]
    again = subprocess.run([sys.executable, str(script), str(folder), "0", "1"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr


def test_a_full_disk_while_dumping_is_a_dump_error(tmp_path: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import tempfile

    from graphkernel.passes import dumper as dumper_mod
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args: Any, **kwargs: Any) -> Any:
        if str(kwargs.get("dir", "")).startswith(str(tmp_path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_mkstemp(*args, **kwargs)
    monkeypatch.setattr(dumper_mod.tempfile, "mkstemp", mkstemp)
    with pytest.raises(DumpError) as info:
        _dump_to(tmp_path)
    assert "cannot write the dump" in str(info.value)
    assert "No space left on device" in str(info.value)
    assert not [f for f in _files(tmp_path) if f.endswith(".lock")]
