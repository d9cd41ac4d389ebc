"""Small models shared by the server-target tests (host LLVM and CUDA): an MLP and a CNN with
conv, BatchNorm (train mode), depthwise conv, max/avg pooling and dense, plus their loss graphs."""
import numpy as np

import kiln
from kiln import F, nn


class MLP(nn.Module):
    def __init__(self):
        self.l1 = nn.Linear(12, 32, activation="relu")
        self.l2 = nn.Linear(32, 5)

    def forward(self, x):
        return self.l2(self.l1(x))


class CNN(nn.Module):
    def __init__(self):
        self.c1 = nn.Conv2d(3, 8, 3, padding="same")
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, stride=2, padding="same", groups=8)
        self.pw = nn.Conv2d(8, 12, 1, activation="relu")
        self.pool = nn.MaxPool2d(2)
        self.ap = nn.AvgPool2d(2, padding="same")
        self.fc = nn.Linear(12 * 2 * 2, 5)

    def forward(self, x):
        y = F.relu(self.bn(self.c1(x)))
        y = F.relu6(self.dw(y))
        y = self.ap(self.pool(self.pw(y)))
        return self.fc(F.reshape(y, (y.shape[0], -1)))


SHAPES = {"mlp": (8, 12), "cnn": (4, 16, 16, 3)}


def make(name, batch=None, seed=0):
    """(forward graph, grad graph of the cross-entropy loss, x, one-hot targets)."""
    kiln.frontend.manual_seed(seed)
    m = MLP() if name == "mlp" else CNN()
    shape = SHAPES[name]
    if batch is not None:
        shape = (batch,) + shape[1:]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    t = np.eye(5, dtype=np.float32)[rng.integers(0, 5, shape[0])]
    fwd = kiln.trace(m, x, name=f"{name}_fwd")

    def loss_fn(x, t):
        return -F.mean(F.sum(F.log_softmax(m(x)) * t, [1]))
    step = kiln.grad(kiln.trace(loss_fn, x, t, name=f"{name}_loss", input_names=["x", "t"]), name=f"{name}_step")
    return fwd, step, x, t
