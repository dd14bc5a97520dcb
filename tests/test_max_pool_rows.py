"""Max pools' row forms (backends/c/c_pool.py) take the prelude's branch-free maximum
(c_text.py gk_max_nan): NaN and infinities in a row's last outputs, past its whole vectors,
still win as in the reference."""
import numpy as np
import pytest
from test_window_kernels import compiled, native_ops, reference

from graphkernel.ops import operations as P


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_rows_keep_nan_in_their_last_outputs(dtype, rng):
    """The row form's maximum is an integer select (c_text.py gk_max_nan, _d for double), so a
    row's last outputs, past its whole vectors, take no branch: NaN and infinities there still
    win as in the reference, torchvision's pads (1, 1) and MindSpore's "same" (0, 1) alike."""
    x = np.maximum(rng.standard_normal((1, 6, 41, 43)), 0).astype(dtype)  # a ReLU's output
    x[..., -3:] = np.nan  # the last columns: the loops' scalar ends
    x[..., 5, -5] = np.inf
    x[..., 7, 1] = -np.inf
    for mode in ("same", "pad"):
        kwargs = {"pad_mode": "pad", "pad": 1} if mode == "pad" else {"pad_mode": "same"}
        exe = compiled(P.MaxPool(kernel_size=3, strides=2, **kwargs), x)
        assert native_ops(exe) == [("MaxPool",)]
        want = reference("MaxPool", x, kernel_size=3, strides=2, **kwargs)
        got = exe.run_arrays(x)[0]
        assert got.dtype == dtype and np.isnan(got[..., -1]).all()
        np.testing.assert_array_equal(got, want)
