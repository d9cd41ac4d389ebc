"""Losses (graph nodes) against torch: values and gradients, label smoothing, extreme logits."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from kiln.autodiff import grad
from kiln.frontend import run, trace
from kiln.frontend.errors import UsageError
from kiln.frontend.types import TensorType
from kiln.training import losses as L

N, C = 6, 5


def _kiln(loss_fn, a, b, b_dtype, **kw):
    """Loss value and d loss / d a, from a traced graph and its gradient graph."""
    g = trace(lambda p, t: loss_fn(p, t, **kw), TensorType(a.shape, "float64"), TensorType(b.shape, b_dtype),
              input_names=["p", "t"])
    gg = grad(g, wrt=["p"], keep_outputs=True)
    val, ga = run(gg, a, b)
    return float(val), ga


def _torch(fn, a, b, **kw):
    ta = torch.tensor(a, requires_grad=True)
    v = fn(ta, torch.tensor(b), **kw)
    v.backward()
    return float(v.detach()), ta.grad.numpy()


RNG = np.random.default_rng(0)
LOGITS = RNG.standard_normal((N, C)) * 3
LABELS = RNG.integers(0, C, N)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_matches_torch(smoothing, reduction):
    v, g = _kiln(L.cross_entropy, LOGITS, LABELS, "int64", reduction=reduction, label_smoothing=smoothing)
    tv, tg = _torch(TF.cross_entropy, LOGITS, LABELS, reduction=reduction, label_smoothing=smoothing)
    assert v == pytest.approx(tv, rel=1e-12)
    np.testing.assert_allclose(g, tg, rtol=1e-10, atol=1e-12)


def test_cross_entropy_stable_for_huge_logits():
    logits = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, 1e4], [1e4, 1e4, -1e4]])
    labels = np.array([1, 2, 0])
    for dtype in ("float32", "float64"):
        g = trace(lambda p, t: L.cross_entropy(p, t), TensorType(logits.shape, dtype), TensorType((3,), "int64"),
                  input_names=["p", "t"])
        val, gp = run(grad(g, wrt=["p"], keep_outputs=True), logits.astype(dtype), labels)
        assert np.isfinite(val) and np.all(np.isfinite(gp))
        tv, tg = _torch(TF.cross_entropy, logits.astype(dtype), labels)
        assert float(val) == pytest.approx(tv, rel=1e-6)
        np.testing.assert_allclose(gp, tg, atol=1e-6)


def test_nll_matches_torch():
    logp = torch.log_softmax(torch.tensor(LOGITS), -1).numpy()
    v, g = _kiln(L.nll_loss, logp, LABELS, "int64")
    tv, tg = _torch(TF.nll_loss, logp, LABELS)
    assert v == pytest.approx(tv, rel=1e-12)
    np.testing.assert_allclose(g, tg, rtol=1e-10, atol=1e-12)


def test_mse_matches_torch():
    t = RNG.standard_normal((N, C))
    v, g = _kiln(L.mse_loss, LOGITS, t, "float64")
    tv, tg = _torch(TF.mse_loss, LOGITS, t)
    assert v == pytest.approx(tv, rel=1e-12)
    np.testing.assert_allclose(g, tg, rtol=1e-10, atol=1e-12)


def test_bce_with_logits_matches_torch_and_is_stable():
    x = np.concatenate([LOGITS, [[1e4, -1e4, 50.0, -50.0, 0.0]]])
    t = np.concatenate([RNG.random((N, C)), [[0.0, 1.0, 0.3, 1.0, 0.5]]])
    v, g = _kiln(L.bce_with_logits, x, t, "float64")
    tv, tg = _torch(TF.binary_cross_entropy_with_logits, x, t)
    assert np.isfinite(v) and v == pytest.approx(tv, rel=1e-12)
    np.testing.assert_allclose(g, tg, rtol=1e-9, atol=1e-12)


def test_labels_must_match_logits():
    with pytest.raises(Exception, match="labels of shape"):
        trace(lambda p, t: L.cross_entropy(p, t), TensorType((4, 3)), TensorType((5,), "int64"))
    with pytest.raises(UsageError, match="unknown loss"):
        L.get_loss("hinge")
