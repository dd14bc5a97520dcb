import numpy as np
import pytest

from graphkernel.frontend import context

# The lab's own script sets the global context when imported; it runs in a subprocess instead
# (tests/test_lab.py::test_lab_script_runs_under_pytest).
collect_ignore = ["lab/test_graph_kernel_fusion.py"]


@pytest.fixture(autouse=True)
def fresh_context():
    context.reset_context()
    yield
    context.reset_context()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
