import os
import shutil
import tempfile

import numpy as np
import pytest

# The suite's kernels go to a private folder of this session, never to the user's cache
# (~/.cache/graphkernel): set before any test module is imported, and inherited by every
# subprocess a test starts. The default location itself (what a process without
# GRAPHKERNEL_CACHE_DIR would use) is pointed into the session folder too, so that anything
# falling back to it is seen at the end (pytest_sessionfinish) instead of landing in ~/.cache.
#
# Under pytest-xdist (`-n`) the controller's environment, set below, reaches its workers: a
# worker takes the controller's session folder and the user's cache it recorded, so that all
# workers share one kernel folder (a kernel compiled by one is loaded by the others; the cache's
# locks and atomic renames make that safe) and only the controller removes the folder.
_WORKER = "PYTEST_XDIST_WORKER" in os.environ and "GRAPHKERNEL_TEST_SESSION" in os.environ
if _WORKER:
    _USER_CACHE = os.environ["GRAPHKERNEL_TEST_USER_CACHE"]
    _SESSION = os.environ["GRAPHKERNEL_TEST_SESSION"]
else:
    _USER_CACHE = os.path.abspath(os.environ.get("GRAPHKERNEL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "graphkernel"))
    _SESSION = tempfile.mkdtemp(prefix="graphkernel-tests-")
    os.environ["GRAPHKERNEL_TEST_USER_CACHE"] = _USER_CACHE
    os.environ["GRAPHKERNEL_TEST_SESSION"] = _SESSION
# A cold folder costs the suite its compiles again (CI's case anyway); to keep kernels between
# runs on your machine, name a folder of the suite's own in GRAPHKERNEL_TEST_CACHE_DIR.
_KEEP = os.environ.get("GRAPHKERNEL_TEST_CACHE_DIR")
if _KEEP and os.path.abspath(_KEEP) == _USER_CACHE:
    raise pytest.UsageError(f"GRAPHKERNEL_TEST_CACHE_DIR is your own kernel cache ({_USER_CACHE}); "
                            "the test suite keeps out of it: name another folder")
os.environ["GRAPHKERNEL_CACHE_DIR"] = os.path.abspath(_KEEP) if _KEEP else \
    os.path.join(_SESSION, "kernels")
os.environ["XDG_CACHE_HOME"] = os.path.join(_SESSION, "xdg-cache")
_DEFAULT_CACHE = os.path.join(_SESSION, "xdg-cache", "graphkernel")
# The C backend's defaults are CConfig's constants in the suite, not this machine's calibration
# (backends/c/calibration.py): the generated C, golden files and kernel counts then do not
# depend on the host. tests/test_calibration.py turns it on with records of its own.
os.environ["GRAPHKERNEL_CALIBRATION"] = "off"

from graphkernel.frontend import context  # noqa: E402  (after the environment is set)

# The lab's own script sets the global context when imported; it runs in a subprocess instead
# (tests/test_lab.py::test_lab_script_runs_under_pytest).
collect_ignore = ["lab/test_graph_kernel_fusion.py"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _WORKER:
        return  # the controller checks and removes the shared folder once its workers are done
    fell_back = os.path.exists(_DEFAULT_CACHE)
    shutil.rmtree(_SESSION, ignore_errors=True)
    if fell_back:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nFAILED: something in the suite wrote to the default kernel cache folder "
              f"({_DEFAULT_CACHE}, standing for ~/.cache/graphkernel) instead of "
              "$GRAPHKERNEL_CACHE_DIR")


@pytest.fixture(autouse=True)
def fresh_context():
    context.reset_context()
    yield
    context.reset_context()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)



@pytest.fixture
def user_cache_dir() -> str:
    """The kernel cache folder the user's own runs use (which the suite must leave alone)."""
    return _USER_CACHE


@pytest.fixture
def cache_folder(tmp_path, monkeypatch) -> str:
    """A kernel cache of the test's own (GRAPHKERNEL_CACHE_DIR)."""
    folder = str(tmp_path / "kernels")
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", folder)
    return folder
