"""Every shell command and Python snippet in README.md, run the way a user runs them, so the
README cannot drift from what works.

Fenced ```bash blocks: one command per line. Fenced ```python blocks: a block whose first line
is `# NAME.py` is that file (later commands use it); the others run as scripts. Everything runs
in order in one fresh folder, with `.venv/bin/` meaning the environment running this test.
HOW says how each command is run; a README command missing from it fails the test:
  run        run as written
  after_venv the two setup commands: the `python3 -m venv .venv && .venv/bin/pip install ...`
             part made the environment this test runs in; the part after it runs as written
             (for the test command, that part is this very pytest run)
  ci         run by .ci/run as written, too slow to repeat here
  not_run    not run anywhere: the reason is given
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
BIN = os.path.dirname(sys.executable)

HOW: dict[str, tuple[str, str]] = {
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/graphkernel lab --out "
    "lab_output": ("after_venv", "runs `graphkernel lab --out lab_output`"),
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test,browser]' && "
    ".venv/bin/python -m pytest": ("after_venv", "the pytest part is this run"),
    ".venv/bin/graphkernel report net.py:Net --input float32[64,256]": ("run", ""),
    ".venv/bin/graphkernel report lab_output/test_composite_fuse": ("run", ""),
    ".venv/bin/graphkernel render lab_output/test_composite_fuse/hwopt_d_end.dot -o "
    "lab_output/test_composite_fuse/hwopt_d_end.svg": ("run", ""),
    ".venv/bin/graphkernel doctor": ("run", ""),
    ".venv/bin/python -m bench --quick": ("ci", ".ci/run's bench smoke step"),
    ".venv/bin/python -m bench": ("not_run", "the full benchmark takes hours"),
    ".venv/bin/pip install -r bench/requirements.txt": ("not_run", "downloads several GB"),
    ".venv/bin/pip install -e '.[onednn]' && .venv/bin/python -m pytest tests/test_onednn.py": (
        "not_run", "downloads 601 MB of oneDNN wheels; the choice tests run on a fake here"),
    ".venv/bin/pip install -e '.[examples]'": ("not_run", "its packages are in the test extra, "
                                               "which made this environment"),
    ".venv/bin/python -m bench.targets bench/results/results.json": ("run", ""),
    ".venv/bin/graphkernel bench": ("not_run", "the same program as python -m bench"),
    ".venv/bin/python -m pytest -m slow": ("ci", ".ci/run's slow-test step"),
    ".venv/bin/graphkernel report model.onnx --input float32[8,4] --out model_report.html":
        ("run", ""),
    "mpirun -n 2 --allow-run-as-root --oversubscribe .venv/bin/python "
    "examples/train_digits_dp.py": ("not_run", "tests/test_data_parallel.py runs the example "
                                    "under mpirun -n 2 (fewer steps)"),
    ".venv/bin/python examples/dask_batch_inference.py --workers 2": (
        "not_run", "tests/test_dask_inference.py runs the same inference on a LocalCluster"),
}


def readme_blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced code block, in order."""
    with open(README, encoding="utf-8") as fh:
        text = fh.read()
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"^```(\w*)\n(.*?)^```$", text, flags=re.M | re.S)]


def shell_commands() -> list[str]:
    commands = []
    for lang, text in readme_blocks():
        if lang == "bash":
            for line in text.splitlines():
                command = re.sub(r"\s+#.*$", "", line).strip()
                if command:
                    commands.append(command)
    return commands


def inline_commands() -> list[str]:
    """Commands quoted inline (`...` spans starting with .venv/bin/)."""
    with open(README, encoding="utf-8") as fh:
        text = re.sub(r"^```.*?^```$", "", fh.read(), flags=re.M | re.S)
    return [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", text)
            if span.startswith(".venv/bin/") and span != ".venv/bin/"]


def _local(command: str) -> str:
    return command.replace(".venv/bin/", BIN + "/")


def test_every_readme_command_is_known():
    commands = shell_commands() + inline_commands()
    missing = [c for c in commands if c not in HOW]
    assert not missing, f"add these README commands to HOW in {__file__}: {missing}"
    stale = [c for c in HOW if c not in commands]
    assert not stale, f"HOW lists commands the README no longer has: {stale}"
    for command in shell_commands():
        # No bare `graphkernel`/`python`: the README's commands work without activating.
        for word in re.split(r"\s*&&\s*", command):
            words = word.split()
            if words[0] == "mpirun":  # its program: the first word that is not an option
                words = [w for w in words[1:] if not w.startswith("-") and not w.isdigit()]
            assert words[0] in ("python3", ".venv/bin/python", ".venv/bin/pip",
                                ".venv/bin/graphkernel"), command


def test_the_test_command_paragraph_names_chromium():
    with open(README, encoding="utf-8") as fh:
        text = fh.read()
    paragraph = text[text.index("Set up and run the tests"):text.index(".venv/bin/python -m "
                                                                       "pytest")]
    assert "apt-get install -y chromium\nchromium-driver" in paragraph or \
        "apt-get install -y chromium chromium-driver" in paragraph


def _losses_fall(out: str) -> bool:
    losses = [float(line) for line in out.split()]
    return (len(losses) == 3 and 1.5 < losses[0] < 3.5
            and all(b < a for a, b in zip(losses, losses[1:])))


CHECKS = {
    # snippet marker -> what its output must show
    "class NetBasicFuse": lambda out, err, cwd: (
        os.path.isfile(os.path.join(cwd, "hwopt_d_end.ir")) and
        "Fused_Mul_Add_Mul" in open(os.path.join(cwd, "hwopt_d_end.ir")).read()),
    "write_report(exe": lambda out, err, cwd: (
        "kernel(s) per call" in out and os.path.isfile(os.path.join(cwd, "r.html")) and
        all(abs(float(v) - 1) < 1e-4 for v in out.strip().splitlines()[-1].strip("[]").split())),
    # three training steps on one batch: the loss (near ln 10 at the start) goes down
    "nn.TrainOneStepCell": lambda out, err, cwd: _losses_fall(out),
    # an ONNX model loaded in one line: relu(ones @ 0.5) is 2 everywhere, batch 2
    'graphkernel.load("model.onnx")': lambda out, err, cwd: (
        out.split() == ["[[2.", "2.", "2.]", "[2.", "2.", "2.]]"]),
    "enable_stitch_fusion": lambda out, err, cwd: (
        out.strip() == "True" and
        "--enable_stitch_fusion has no effect in graphkernel" in err),
}


@pytest.mark.slow  # every README command: the lab, reports, bench targets
def test_readme_runs(tmp_path):
    # The snippets' own files first; then the caller's path, so that a checkout other than the
    # one installed in the environment runs its own graphkernel.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    ran = []
    for lang, text in readme_blocks():
        if lang == "python":
            first = text.splitlines()[0]
            if re.fullmatch(r"# \w+\.py", first):
                (tmp_path / first[2:]).write_text(text)
                continue
            script = tmp_path / f"snippet_{len(ran)}.py"
            script.write_text(text)
            proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, (text, proc.stderr)
            checks = [check for marker, check in CHECKS.items() if marker in text]
            assert len(checks) == 1, f"no output check for this README snippet:\n{text}"
            assert checks[0](proc.stdout, proc.stderr, str(tmp_path)), (proc.stdout, proc.stderr)
            ran.append(text)
            continue
        if lang != "bash":
            continue
        for line in text.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            how, _ = HOW[command]
            if how == "after_venv":
                venv, install, rest = re.split(r"\s*&&\s*", command)
                assert venv == "python3 -m venv .venv"
                assert install.startswith(".venv/bin/pip install -e ")
                if "pytest" in rest:
                    assert "pytest" in sys.modules  # this run is that command
                    continue
                command = rest
            elif how != "run":
                continue
            cwd = ROOT if "bench" in command else tmp_path  # bench lives in the checkout
            proc = subprocess.run(_local(command), shell=True, cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-2000:])
            ran.append(command)
            if "graphkernel lab" in command:
                assert proc.stdout.splitlines()[-1] == "report: lab_output/report.html"
                assert (tmp_path / "lab_output" / "report.html").is_file()
    for command in inline_commands():
        if HOW[command][0] == "run" and command not in ran:
            proc = subprocess.run(_local(command), shell=True, cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-2000:])
            ran.append(command)
    # Each command wrote beside its input: net.py's page beside net.py, the dumps' page and
    # picture in the dumps' folder.
    dumps = tmp_path / "lab_output" / "test_composite_fuse"
    assert (tmp_path / "net_report.html").is_file() and (dumps / "report.html").is_file()
    assert (dumps / "hwopt_d_end.svg").read_text(encoding="utf-8").lstrip().startswith("<?xml")
    assert len(ran) >= 9


@pytest.mark.parametrize("command", [c for c, (how, _) in HOW.items() if how == "ci"])
def test_ci_runs_the_commands_marked_ci(command):
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as fh:
        assert command.split("#")[0].strip() in fh.read()
