"""The plan's schedule note says where a convolution's images run, by the rule its C follows
(backends/c/c_images.py: on threads from window_parallel_min_macs multiply-adds a call). It
said "a batch of one" at every batch, which hid that the digits CNN's first convolution ran on
one thread at batch 256."""
import numpy as np
import pytest

import graphkernel
from graphkernel import nn
from graphkernel.backends.c.config import CConfig
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P


class ConvReLU(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="same")

    def construct(self, x):
        return P.ReLU()(self.conv(x))


def _compiled(cell: ConvReLU, batch: int, threshold: int, x: np.ndarray):
    options = CompileOptions(enable_graph_kernel=True,
                             backend_config=CConfig(window_parallel_min_macs=threshold))
    exe = graphkernel.compile(cell, x[:batch], options=options)
    (note,) = exe.executable.plan.schedule_notes.values()
    (source,) = [k.source for k in exe.kernels if k.source]
    return exe, note, source


@pytest.mark.parametrize("batch", [5, 1])
def test_the_note_follows_the_threshold_the_c_tests(rng, batch):
    x = rng.standard_normal((5, 3, 9, 7)).astype(np.float32)
    macs = batch * 8 * 9 * 7 * 3 * 3 * 3  # output elements x taps
    cell = ConvReLU()
    want = graphkernel.compile(cell, x[:batch], options=CompileOptions(
        enable_graph_kernel=False)).run_arrays(x[:batch])[0]
    for threshold, on_threads in ((macs, True), (macs + 1, False)):
        exe, note, source = _compiled(cell, batch, threshold, x)
        assert f">= (int64_t){threshold})" in source  # the C's own test
        counted = f"({macs} multiply-adds, window_parallel_min_macs {threshold})"
        if batch == 1 and on_threads:  # the image itself shared out
            assert "a batch of one: one parallel region per image" in note, note
        elif batch == 1:
            assert f"a batch of one on the calling thread {counted}" in note, note
        else:
            where = "on threads" if on_threads else "on the calling thread"
            assert f"{batch} images {where} {counted}" in note, note
        np.testing.assert_allclose(exe.run_arrays(x[:batch])[0], want, rtol=1e-5, atol=1e-5)
