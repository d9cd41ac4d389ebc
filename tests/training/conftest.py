import numpy as np
import pytest

from kiln import frontend as kf


@pytest.fixture(scope="session")
def small_digits():
    """300 training and 100 test digits (enough to exercise every code path quickly)."""
    from kiln.training import digits
    tr, te = digits()
    return tr.subset(np.arange(300)), te.subset(np.arange(100))


class TinyNet(kf.Module):
    """conv + BatchNorm + relu + dropout + dense: every kind of state a step has."""

    def __init__(self, dropout=0.25):
        self.conv = kf.Conv2d(1, 4, 3, stride=2, padding="same")
        self.bn = kf.BatchNorm2d(4)
        self.drop = kf.Dropout(dropout)
        self.fc = kf.Linear(64, 10)

    def forward(self, x):
        h = kf.functional.relu(self.bn(self.conv(x)))
        return self.fc(self.drop(kf.functional.reshape(h, (h.shape[0], -1))))


@pytest.fixture
def tiny_net():
    def make(seed=0, dtype=None, **kw):
        kf.manual_seed(seed)
        m = TinyNet(**kw)
        if dtype:
            for p in m.parameters() + [b for _, b in m.named_buffers()]:
                p.data = p.data.astype(dtype)
        return m
    return make
