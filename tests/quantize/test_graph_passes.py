"""BatchNorm folding, activation fusion, constant folding and re-batching keep the function."""
import numpy as np
import pytest

import kiln.frontend.module as M
from kiln.frontend import TensorType, manual_seed, run, trace
from kiln.frontend.graph_passes import fold_batchnorm, fold_constants, fuse_activations, prepare, with_batch


class ConvBNNet(M.Module):
    def __init__(self, act, depthwise=False):
        self.c = M.Conv2d(3, 3 if depthwise else 6, 3, padding="same", groups=3 if depthwise else 1)
        ch = 3 if depthwise else 6
        self.bn = M.BatchNorm2d(ch)
        self.act = {"relu": M.ReLU(), "relu6": M.ReLU6(), "none": None}[act]
        self.pool = M.GlobalAvgPool()
        self.fc = M.Linear(ch, 4)

    def forward(self, x):
        y = self.bn(self.c(x))
        if self.act is not None:
            y = self.act(y)
        return self.fc(self.pool(y))


@pytest.mark.parametrize("act", ["relu", "relu6", "none"])
@pytest.mark.parametrize("depthwise", [False, True])
def test_prepare_folds_batchnorm_and_fuses(act, depthwise):
    manual_seed(1)
    net = ConvBNNet(act, depthwise)
    rng = np.random.default_rng(0)
    for p in (net.bn.running_mean, net.bn.running_var, net.bn.weight, net.bn.bias):
        p.data[:] = rng.uniform(0.2, 2.0, p.data.shape) * rng.choice([-1, 1], p.data.shape) if p is not net.bn.running_var \
            else rng.uniform(0.2, 2.0, p.data.shape)
    net.eval()
    g = trace(net, TensorType((1, 6, 6, 3)))
    p = prepare(g)
    ops = [n.op for n in p.nodes]
    assert ops == ["conv2d", "mean", "dense"], ops
    assert p.nodes[0].attrs["activation"] == act
    x = rng.normal(size=(1, 6, 6, 3)).astype(np.float32)
    np.testing.assert_allclose(run(p, x)[0], run(g, x)[0], rtol=1e-5, atol=1e-5)


def test_passes_leave_unrelated_graphs_alone():
    manual_seed(0)
    net = M.Sequential(M.Conv2d(1, 2, 3, activation="relu"), M.Flatten(), M.Linear(2 * 4 * 4, 3))
    net.eval()
    g = trace(net, TensorType((1, 6, 6, 1)))
    for f in (fold_constants, fold_batchnorm, fuse_activations):
        assert [n.op for n in f(g).nodes] == [n.op for n in g.nodes]


def test_with_batch_matches_per_sample():
    manual_seed(0)
    net = M.Sequential(M.Conv2d(1, 2, 3, activation="relu"), M.Flatten(), M.Linear(2 * 4 * 4, 3))
    net.eval()
    g = trace(net, TensorType((1, 6, 6, 1)))
    xb = np.random.default_rng(0).normal(size=(5, 6, 6, 1)).astype(np.float32)
    yb = run(with_batch(g, 5), xb)[0]
    for i in range(5):
        np.testing.assert_allclose(yb[i], run(g, xb[i:i + 1])[0][0], rtol=1e-6, atol=1e-6)
