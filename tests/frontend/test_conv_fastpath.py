"""The conv fast paths (im2col + matmul for groups = 1, per-tap multiply-accumulate for depthwise)
against the per-tap einsum oracle, forward and both gradients, float32 and float64."""
import numpy as np
import pytest

from kiln.frontend.ops import nn

CASES = [  # (N, H, W, C, O, KH, KW, stride, padding, dilation, groups)
    (2, 7, 6, 3, 5, 3, 3, (1, 1), "same", (1, 1), 1),
    (2, 9, 8, 4, 6, 3, 2, (2, 1), "valid", (1, 1), 1),
    (1, 10, 9, 2, 4, 3, 3, (2, 2), [1, 2, 0, 1], (2, 1), 1),
    (3, 8, 8, 1, 8, 3, 3, (1, 1), "same", (1, 1), 1),
    (2, 8, 7, 6, 6, 3, 3, (1, 1), "same", (1, 1), 6),      # depthwise
    (2, 9, 9, 4, 4, 3, 3, (2, 2), "same", (1, 1), 4),      # depthwise, strided
    (1, 9, 8, 4, 4, 2, 3, (1, 2), [0, 1, 2, 0], (2, 1), 4),
    (2, 6, 6, 4, 8, 3, 3, (1, 1), "same", (1, 1), 2),      # grouped: the oracle itself
    (2, 6, 6, 3, 6, 3, 3, (1, 1), "valid", (1, 1), 3),     # depthwise multiplier 2: the oracle
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_fast_conv_matches_einsum_oracle(case, dtype, tol):
    N, H, W, C, O, KH, KW, stride, padding, dilation, groups = case
    a = {"stride": list(stride), "padding": padding, "dilation": list(dilation), "groups": groups}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, H, W, C)).astype(dtype)
    w = rng.standard_normal((O, KH, KW, C // groups)).astype(dtype)
    y = nn.conv2d_nobias(x, w, a)
    want = nn.conv2d_nobias_einsum(x, w, a)
    assert y.dtype == want.dtype and y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol)
    gy = rng.standard_normal(y.shape).astype(dtype)
    ai = dict(a, input_shape=list(x.shape))
    gx = nn.conv2d_grad_input_ref(gy, w, ai)
    np.testing.assert_allclose(gx, nn.conv2d_grad_input_einsum(gy, w, ai), rtol=tol, atol=tol)
    assert gx.dtype == dtype
    aw = dict(a, weight_shape=list(w.shape))
    gw = nn.conv2d_grad_weight_ref(x, gy, aw)
    np.testing.assert_allclose(gw, nn.conv2d_grad_weight_einsum(x, gy, aw), rtol=tol, atol=tol * 10)
    assert gw.dtype == dtype
