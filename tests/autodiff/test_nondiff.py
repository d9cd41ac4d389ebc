"""Non-differentiable points behave as PyTorch's autograd does (docs/autodiff.md lists them):
relu'(0) = 0; relu6' = 0 at 0 and at 6; abs'(0) = 0; maximum/minimum split a tie's gradient
equally; the max reduction splits it equally among tied maxima (torch.amax, Tensor.max() without
dim); max pooling sends each window's gradient to its first maximum in row-major order (overlapping
windows accumulate); sqrt'(0) and log'(0) are inf; d(x**p)/dx at 0 follows torch.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from kiln.frontend import functional as F

from .util import kiln_vjp, torch_vjp


def _pool(fn):
    return lambda x: fn(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


EDGE = np.array([-1.0, 0.0, 0.5, 6.0, 7.0])
POOL_TIES = np.array([[1, 3, 3, 0], [3, 2, 2, 2], [2, 2, 2, 2], [2, 2, 5, 5]], np.float64).reshape(1, 4, 4, 1)
DENSE_X = np.array([[0.0, 1.0], [1.0, -1.0]])
DENSE_W = np.array([[1.0, 0.0], [1.0, 1.0]])   # pre-activations include exact zeros

CASES = [
    ("relu", F.relu, torch.relu, [EDGE]),
    ("relu6", F.relu6, TF.relu6, [EDGE]),
    ("abs", F.abs, torch.abs, [EDGE]),
    ("sqrt-at-0", F.sqrt, torch.sqrt, [np.array([0.0, 1.0, 4.0])]),
    ("log-at-0", F.log, torch.log, [np.array([0.0, 1.0])]),
    ("pow0.5-at-0", lambda x: x ** 0.5, lambda x: x ** 0.5, [np.array([0.0, 1.0])]),
    ("pow0-at-0", lambda x: x ** 0.0, lambda x: x ** 0.0, [np.array([0.0, 1.0])]),
    ("pow1-at-0", lambda x: x ** 1.0, lambda x: x ** 1.0, [np.array([0.0, 1.0])]),
    ("pow2-at-0", lambda x: x ** 2.0, lambda x: x ** 2.0, [np.array([0.0, -1.0])]),
    ("maximum-ties", F.maximum, torch.maximum, [np.array([1.0, 2.0, 3.0]), np.array([1.0, 5.0, 3.0])]),
    ("minimum-ties", F.minimum, torch.minimum, [np.array([1.0, 2.0, 3.0]), np.array([1.0, 5.0, 3.0])]),
    ("maximum-ties-broadcast", F.maximum, torch.maximum, [np.array([[1.0, 2.0], [2.0, 0.0]]), np.array([2.0])]),
    ("max-all-ties", lambda x: F.max(x), lambda x: x.max(), [np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])]),
    ("max-axis-ties", lambda x: F.max(x, 1), lambda x: x.amax(1), [np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])]),
    ("max-keepdims-ties", lambda x: F.max(x, 0, True), lambda x: x.amax(0, keepdim=True),
     [np.array([[1.0, 3.0, 3.0], [1.0, 3.0, 2.0]])]),
    ("max_pool-2x2-ties", lambda x: F.max_pool2d(x, 2), _pool(lambda x: TF.max_pool2d(x, 2)), [POOL_TIES]),
    ("max_pool-3x3-stride1-overlap-ties", lambda x: F.max_pool2d(x, 3, 1, [1, 1, 1, 1]),
     _pool(lambda x: TF.max_pool2d(x, 3, 1, 1)), [POOL_TIES]),
    ("max_pool-constant", lambda x: F.max_pool2d(x, 2, 1), _pool(lambda x: TF.max_pool2d(x, 2, 1)),
     [np.full((1, 3, 3, 2), 1.5)]),
    ("dense-fused-relu-at-0", lambda x, w: F.dense(x, w, activation="relu"), lambda x, w: torch.relu(x @ w.T),
     [DENSE_X, DENSE_W]),
    ("dense-fused-relu6-at-0-and-6", lambda x, w: F.dense(x, w * 6.0, activation="relu6"),
     lambda x, w: TF.relu6(x @ (w * 6.0).T), [DENSE_X, DENSE_W]),
    ("conv-fused-relu-at-0", lambda x, w: F.conv2d(x, w, activation="relu"),
     lambda x, w: torch.relu(TF.conv2d(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2))).permute(0, 2, 3, 1),
     [np.array([[[[1.0], [-1.0]], [[0.0], [2.0]]]]), np.ones((1, 1, 1, 1))]),
]


@pytest.mark.parametrize("name,kfn,tfn,arrays", CASES, ids=[c[0] for c in CASES])
def test_gradient_at_nondifferentiable_point_matches_torch(name, kfn, tfn, arrays):
    u = np.random.default_rng(0).standard_normal(np.shape(tfn(*[torch.tensor(a) for a in arrays])))
    got = kiln_vjp(kfn, *arrays, u=u)
    want = torch_vjp(tfn, *arrays, u=u)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)   # summation order only


def test_torch_max_with_dim_differs_and_we_follow_amax():
    """Documented choice: Kiln's max reduction is torch.amax (ties share), not torch.max(dim)
    (whose gradient goes to the single index it returns)."""
    x = np.array([[2.0, 2.0]])
    (got,) = kiln_vjp(lambda t: F.max(t, 1), x)
    np.testing.assert_array_equal(got, [[0.5, 0.5]])
    (picked,) = torch_vjp(lambda t: t.max(1).values, x)
    assert picked.sum() == 1.0 and picked.max() == 1.0
