"""Bool tensors in generated kernels are bytes in memory (numpy's 0 and 1) and C bools in
arithmetic (backends/c/c_text.py C_STORAGE): gcc does not vectorise loads of _Bool, so a
kernel reading a bool mask (a transformer's attention mask into its softmax) ran one element
at a time. Results stay numpy's, bool outputs included."""
from __future__ import annotations

import numpy as np
from cells import ON, Fn

import graphkernel
from graphkernel import ops


def test_a_masked_softmax_reads_its_bool_masks_as_bytes_and_matches_numpy(rng):
    scores = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    causal = np.tril(np.ones((8, 8), bool))
    padding = rng.random((2, 1, 1, 8)) > 0.3
    padding[..., 0] = True  # every row keeps a position

    def masked_softmax(x, a, b):
        keep = ops.logical_and(a, b)
        return ops.softmax(ops.select(keep, x * 0.5, ops.zeros_like(x) - 1e30), -1), \
            ops.logical_not(keep)

    exe = graphkernel.compile(Fn(masked_softmax), scores, causal, padding, options=ON)
    sources = [k.source for k in exe.kernels if k.source is not None]
    assert sources, exe.summary()
    assert not any("bool *" in s for s in sources), sources  # no _Bool loads or stores
    assert any("const uint8_t *restrict" in s for s in sources), sources
    probs, dropped = exe.run_arrays(scores, causal, padding)
    keep = causal & padding
    z = np.where(keep, scores * np.float32(0.5), np.float32(-1e30))
    e = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(probs, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert dropped.dtype == np.bool_ and np.array_equal(dropped, ~keep)
    assert set(np.unique(dropped.view(np.uint8))) <= {0, 1}
