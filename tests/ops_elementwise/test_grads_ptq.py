"""Gradients of the element-wise family against float64 finite differences, and post-training
quantisation of a float model built from them: Kiln's int8 graph equals LiteRT on its export."""
import numpy as np
import pytest

import kiln.frontend as kf
import kiln.nn as nn
from kiln.autodiff import check_grads
from kiln.frontend import functional as F
from kiln.frontend import run
from kiln.quantize import export_tflite, ptq
from tests.quantize.litert_util import litert_run

RNG = np.random.default_rng(21)

def _unary_net(op):
    def f(x):
        if op == "rsqrt":
            return F.sum(F.rsqrt(F.exp(x)) * x)
        if op == "leaky_relu":
            return F.sum(F.leaky_relu(x, 0.3) * x)
        return F.sum(F.emit(op, [x]) * x)
    return f


@pytest.mark.parametrize("op", ["abs", "square", "rsqrt", "sin", "cos", "elu", "hard_swish", "leaky_relu",
                                "floor", "ceil", "round"])
def test_unary_gradients(op):
    g = kf.trace(_unary_net(op), (3, 5))
    x = RNG.standard_normal((3, 5)) * 2.5
    x[np.abs(x) < 0.05] += 0.2                          # away from kinks at 0 (and +-3 for hard_swish)
    x[np.abs(np.abs(x) - 3) < 0.05] += 0.2
    res = check_grads(g, [x])
    assert res.ok, res


@pytest.mark.parametrize("op", ["sub", "div", "maximum", "minimum", "squared_difference", "prelu", "floor_mod"])
def test_binary_gradients(op):
    g = kf.trace(lambda a, b: F.sum(F.emit(op, [a, b]) * a), (3, 4), (4,))
    a = RNG.standard_normal((3, 4)) * 2
    b = RNG.uniform(0.5, 1.5, (4,)) * RNG.choice([-1, 1], 4)
    res = check_grads(g, [a, b])
    assert res.ok, res


def test_add_n_gradient():
    g = kf.trace(lambda a, b: F.sum(F.add_n([a, b, a]) * b), (2, 3), (2, 3))
    assert check_grads(g, [RNG.standard_normal((2, 3)), RNG.standard_normal((2, 3))]).ok


class Net(nn.Module):
    """The int8-capable ops of the family in one float model (ELU, outside LiteRT's BUILTIN_REF
    resolver, is checked on its own)."""

    def __init__(self):
        self.fc = nn.Linear(6, 8)
        self.prelu = nn.PReLU(8)

    def forward(self, x):
        h = self.prelu(self.fc(x))
        a = F.hard_swish(h) - F.leaky_relu(h, 0.1)
        b = F.maximum(a, F.minimum(h, F.abs(a)))
        c = F.squared_difference(b, h)
        d = F.exp(F.abs(c) * -0.5)
        e = F.rsqrt(d + 1.0) / (F.exp(a * 0.2) + 1.0) + F.sqrt(d)
        return F.log(e + 0.5) + b


@pytest.mark.parametrize("int8_io", [False, True])
def test_ptq_family_model_matches_litert(int8_io):
    kf.manual_seed(3)
    net = Net()
    g = kf.trace(net, (1, 6))
    calib = RNG.standard_normal((64, 6)).astype(np.float32)
    qg = ptq(g, calib, int8_io=int8_io)
    ops = {n.op for n in qg.nodes}
    assert {"prelu", "hard_swish", "leaky_relu", "sub", "maximum", "minimum", "abs", "squared_difference", "exp",
            "rsqrt", "div", "log", "sqrt", "add"} <= ops
    data = export_tflite(qg)
    for _ in range(5):
        x = RNG.standard_normal((1, 6)).astype(np.float32)
        feed = x
        if int8_io:
            s, z = qg.types[qg.inputs[0]].quant.scale[0], qg.types[qg.inputs[0]].quant.zero_point[0]
            feed = np.clip(np.round(x / s) + z, -128, 127).astype(np.int8)
        got = run(qg, feed)[0]
        want = litert_run(data, [feed])[0]
        np.testing.assert_array_equal(got, want)
        if not int8_io:
            np.testing.assert_allclose(got, run(g, x)[0], atol=0.35)   # int8 tracks the float model
