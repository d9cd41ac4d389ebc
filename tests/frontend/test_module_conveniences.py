"""Module API conveniences for PyTorch users: Conv1d and BatchNorm1d (checked against torch),
Tensor.view, and eager execution (the same numbers as the traced graph, no tracing)."""
import numpy as np
import pytest

import kiln
from kiln import F, nn
from kiln.frontend.errors import KilnError, TraceError

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("stride, padding, dilation, groups", [(1, 1, 1, 1), (2, 2, 1, 1), (1, 2, 2, 2), (1, 0, 1, 4)])
def test_conv1d_matches_torch(stride, padding, dilation, groups):
    nn.manual_seed(0)
    m = nn.Conv1d(4, 8, 3, stride=stride, padding=padding, dilation=dilation, groups=groups)
    t = torch.nn.Conv1d(4, 8, 3, stride=stride, padding=padding, dilation=dilation, groups=groups)
    t.weight.data = torch.from_numpy(m.weight.data.transpose(0, 2, 1).copy())     # [O, K, I] -> [O, I, K]
    t.bias.data = torch.from_numpy(m.bias.data)
    x = np.random.default_rng(0).standard_normal((2, 11, 4)).astype(np.float32)   # [N, L, C]
    want = t(torch.from_numpy(x.transpose(0, 2, 1))).detach().numpy().transpose(0, 2, 1)
    g = kiln.trace(m, x)
    np.testing.assert_allclose(kiln.run(g, x)[0], want, atol=1e-5)


@pytest.mark.parametrize("shape", [(6, 5), (4, 7, 5)])
def test_batchnorm1d_matches_torch_train_and_eval(shape):
    bn = nn.BatchNorm1d(5)
    t = torch.nn.BatchNorm1d(5)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    tx = torch.from_numpy(x if len(shape) == 2 else x.transpose(0, 2, 1))
    g = kiln.trace(bn, x)
    outs, upd = kiln.frontend.run_updates(g, x)
    want = t(tx).detach().numpy()
    np.testing.assert_allclose(outs[0], want if len(shape) == 2 else want.transpose(0, 2, 1), atol=1e-5)
    np.testing.assert_allclose(upd["running_var"], t.running_var.numpy(), atol=1e-5)
    bn.eval()
    t.eval()
    ge = kiln.trace(bn, x)
    bn.running_mean.data, bn.running_var.data = upd["running_mean"], upd["running_var"]
    ge = kiln.trace(bn, x)
    want = t(tx).detach().numpy()
    np.testing.assert_allclose(kiln.run(ge, x)[0], want if len(shape) == 2 else want.transpose(0, 2, 1), atol=1e-5)


def test_view():
    g = kiln.trace(lambda x: F.relu(x).view(x.shape[0], -1), np.zeros((2, 3, 4), np.float32))
    assert g.types[g.outputs[0]].shape == (2, 12)


def test_eager_equals_traced():
    from kiln.training.zoo import digits_cnn
    nn.manual_seed(3)
    m = digits_cnn().eval()
    x = np.random.default_rng(2).standard_normal((3, 8, 8, 1)).astype(np.float32)
    y = nn.eager(m, x)
    assert isinstance(y, np.ndarray)
    np.testing.assert_array_equal(y, kiln.run(kiln.trace(m, x), x)[0])
    with kiln.eager():
        h = F.relu(F.conv2d(x, m[0].weight, m[0].bias, padding="same"))   # one layer at a time
    assert h.shape == (3, 8, 8, 8)


def test_eager_dropout_and_outside_trace():
    d = nn.Dropout(0.5)
    with pytest.raises(KilnError, match="eval mode"):
        nn.eager(d, np.ones((2, 3), np.float32))
    with pytest.raises(TraceError, match="kiln.eager"):
        F.relu(np.ones(3, np.float32))
