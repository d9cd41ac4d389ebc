"""Forward mode by the transpose trick (jvp), jvp/vjp consistency u.(J v) = (J^T u).v, and
Hessian-vector products of a small MLP against finite differences and torch."""
import numpy as np
import pytest
import torch

import kiln.frontend as kf
from kiln.autodiff import grad, hvp, jvp, vjp
from kiln.frontend import functional as F
from kiln.frontend.errors import GraphError
from kiln.frontend.types import TensorType

from .util import trace64

RNG = np.random.default_rng(0)

FUNCS = [
    ("tanh-matmul", lambda x, w: F.tanh(x @ w) * x[:, :1], lambda x, w: torch.tanh(x @ w) * x[:, :1], [(3, 4), (4, 2)]),
    ("softmax-broadcast", lambda a, b: F.softmax(a * b + a, -1), lambda a, b: torch.softmax(a * b + a, -1), [(2, 3), (3,)]),
    ("conv-pool", lambda x, w: F.avg_pool2d(F.conv2d(x, w, padding="same", stride=2), 2, 1, "same"), None,
     [(1, 5, 5, 2), (3, 3, 3, 2)]),      # conv/pool against torch: tests/frontend/test_ops.py
    ("reduce-shape", lambda x: F.max(F.transpose(F.reshape(x, (3, 2, 2)), [2, 0, 1]), 1) + F.mean(x),
     lambda x: x.reshape(3, 2, 2).permute(2, 0, 1).amax(1) + x.mean(), [(3, 4)]),
]


def _rand(shapes):
    return [RNG.standard_normal(s) for s in shapes]


@pytest.mark.parametrize("name,kfn,tfn,shapes", FUNCS, ids=[f[0] for f in FUNCS])
def test_jvp_and_vjp_are_consistent(name, kfn, tfn, shapes):
    xs = _rand(shapes)
    g = trace64(kfn, *xs)
    vs = _rand(shapes)
    u = RNG.standard_normal(g.types[g.outputs[0]].shape)
    gj = jvp(g, wrt=g.inputs)
    assert gj.inputs == g.inputs + [f"tangent_{i}" for i in g.inputs]
    assert not any(i.startswith("cotangent") for i in list(gj.inputs) + list(gj.consts))
    (jv,) = kf.run(gj, *xs, *vs)
    jtu = kf.run(vjp(g, wrt=g.inputs), *xs, u)
    lhs = float(np.sum(u * jv))
    rhs = float(sum(np.sum(a * v) for a, v in zip(jtu, vs)))
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs))
    # and J v against a centered finite difference
    eps = 1e-6
    fp = kf.run(g, *[x + eps * v for x, v in zip(xs, vs)])[0]
    fm = kf.run(g, *[x - eps * v for x, v in zip(xs, vs)])[0]
    np.testing.assert_allclose(jv, (fp - fm) / (2 * eps), rtol=1e-6, atol=1e-8)
    if tfn is not None:
        _, tj = torch.func.jvp(tfn, tuple(map(torch.tensor, xs)), tuple(map(torch.tensor, vs)))
        np.testing.assert_allclose(jv, tj.numpy(), rtol=1e-10, atol=1e-12)


def test_jvp_keep_outputs_and_params():
    m = kf.Linear(3, 2).to("float64")
    g = kf.trace(m, TensorType((4, 3), "float64"))
    gj = jvp(g, keep_outputs=True)         # wrt defaults to the parameters
    x = RNG.standard_normal((4, 3))
    vw, vb = RNG.standard_normal((2, 3)), RNG.standard_normal(2)
    y, jv = kf.run(gj, x, vw, vb)
    np.testing.assert_allclose(y, x @ m.weight.data.T + m.bias.data, rtol=1e-12)
    np.testing.assert_allclose(jv, x @ vw.T + vb, rtol=1e-12)


def test_jvp_of_a_constant_function_is_zero():
    g = trace64(lambda x, y: x * 2.0 + F.sum(y) * 0.0, np.ones(3), np.ones(2))
    (jv,) = kf.run(jvp(g, wrt=["x1"]), np.ones(3), np.ones(2), np.ones(2))
    np.testing.assert_array_equal(jv, np.zeros(3))


class SmallMLP(kf.Module):
    def __init__(self):
        kf.manual_seed(4)
        self.l1 = kf.Linear(3, 5)
        self.l2 = kf.Linear(5, 2)

    def forward(self, x, y):
        return F.mean((self.l2(F.tanh(self.l1(x))) - y) ** 2.0)


def test_hvp_of_small_mlp_matches_finite_differences_and_torch():
    m = SmallMLP().to("float64")
    x, y = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 2))
    g = kf.trace(m, TensorType(x.shape, "float64"), TensorType(y.shape, "float64"))
    wrt = [n for n, _ in m.named_parameters()]
    gh = hvp(g)
    gg = grad(g)
    params = {n: p.data for n, p in m.named_parameters()}
    vs = {n: RNG.standard_normal(p.shape) for n, p in params.items()}
    hv = kf.run(gh, x, y, *[vs[n] for n in wrt])
    # finite differences of the gradient along v
    eps = 1e-6
    gp = kf.run(gg, x, y, params={n: params[n] + eps * vs[n] for n in wrt})
    gm = kf.run(gg, x, y, params={n: params[n] - eps * vs[n] for n in wrt})
    worst = 0.0
    for n, h, a, b in zip(wrt, hv, gp, gm):
        fd = (a - b) / (2 * eps)
        np.testing.assert_allclose(h, fd, rtol=1e-6, atol=1e-8, err_msg=n)
        worst = max(worst, float(np.max(np.abs(h - fd) / np.maximum(1e-6, np.abs(fd)))))
    # torch: Hessian-vector product by double backward
    tp = [torch.tensor(params[n], requires_grad=True) for n in wrt]

    def loss(w1, b1, w2, b2):
        h = torch.tanh(torch.tensor(x) @ w1.T + b1) @ w2.T + b2
        return ((h - torch.tensor(y)) ** 2).mean()
    _, thv = torch.autograd.functional.hvp(loss, tuple(tp), tuple(torch.tensor(vs[n]) for n in wrt))
    for n, h, t in zip(wrt, hv, thv):
        np.testing.assert_allclose(h, t.numpy(), rtol=1e-10, atol=1e-12, err_msg=n)
    print(f"\nHVP vs finite differences: worst relative error {worst:.3g}")


def test_hvp_wrt_inputs_and_needs_a_scalar():
    g = trace64(lambda x: F.sum(F.exp(x) * x), np.ones(3))
    x, v = np.array([0.1, -0.2, 0.3]), np.array([1.0, 2.0, -1.0])
    (hv,) = kf.run(hvp(g, wrt=["x"]), x, v)
    np.testing.assert_allclose(hv, np.exp(x) * (x + 2) * v, rtol=1e-12)
    with pytest.raises(GraphError, match="the Hessian needs a scalar"):
        hvp(trace64(lambda x: x * 2.0, np.ones(3)), wrt=["x"])
