"""Reverse mode by graph extension: grad/vjp against torch.autograd, gradient accumulation, pruning,
buffers, error messages. (Per-op VJPs and grad-of-grad are in tests/frontend/test_ops.py.)"""
import numpy as np
import pytest
import torch

import kiln.frontend as kf
from kiln.autodiff import check_grads, grad, prune, vjp
from kiln.frontend import functional as F
from kiln.frontend.errors import GraphError
from kiln.frontend.tensor import Tensor
from kiln.frontend.types import TensorType

from .util import trace64

RNG = np.random.default_rng(0)


class MLP(kf.Module):
    def __init__(self, sizes=(5, 8, 8, 3)):
        kf.manual_seed(1)
        self.layers = [kf.Linear(a, b, activation="relu" if k < len(sizes) - 2 else "none")
                       for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))]

    def forward(self, x, y):
        h = x
        for lin in self.layers:
            h = lin(h)
        return F.mean(-F.sum(F.log_softmax(h, -1) * y, 1))


def _torch_mlp(m):
    layers = []
    for k, lin in enumerate(m.layers):
        t = torch.nn.Linear(lin.in_features, lin.out_features).double()
        with torch.no_grad():
            t.weight.copy_(torch.tensor(lin.weight.data))
            t.bias.copy_(torch.tensor(lin.bias.data))
        layers += [t] + ([torch.nn.ReLU()] if k < len(m.layers) - 1 else [])
    return torch.nn.Sequential(*layers)


def test_mlp_gradients_match_torch():
    m = MLP().to("float64")
    x = RNG.standard_normal((6, 5))
    y = np.eye(3)[RNG.integers(0, 3, 6)]
    g = kf.trace(m, TensorType(x.shape, "float64"), TensorType(y.shape, "float64"))
    gg = grad(g, keep_outputs=True)
    loss, *grads = kf.run(gg, x, y)
    tm = _torch_mlp(m)
    tl = -(torch.log_softmax(tm(torch.tensor(x)), -1) * torch.tensor(y)).sum(1).mean()
    tgrads = torch.autograd.grad(tl, list(tm.parameters()))
    np.testing.assert_allclose(loss, tl.item(), rtol=1e-12)
    assert gg.meta["grad"]["wrt"] == [n for n, _ in m.named_parameters()]
    for name, a, b in zip(gg.meta["grad"]["wrt"], grads, tgrads):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    assert check_grads(g, [x, y], wrt=["layers.0.weight", "layers.2.bias"]).ok


def test_vjp_takes_a_cotangent_input():
    g = trace64(lambda a, b: F.tanh(a @ b), np.zeros((3, 4)), np.zeros((4, 2)))
    gv = vjp(g, wrt=["x0", "x1"])
    assert gv.inputs[:2] == ["x0", "x1"] and gv.types[gv.inputs[2]].shape == (3, 2)
    a, b, u = RNG.standard_normal((3, 4)), RNG.standard_normal((4, 2)), RNG.standard_normal((3, 2))
    ga, gb = kf.run(gv, a, b, u)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    wa, wb = torch.autograd.grad(torch.tanh(ta @ tb), [ta, tb], torch.tensor(u))
    np.testing.assert_allclose(ga, wa.numpy(), rtol=1e-12)
    np.testing.assert_allclose(gb, wb.numpy(), rtol=1e-12)


def test_gradients_accumulate_over_every_use():
    # x is used four times, once through a branch that does not depend on the others
    f = lambda x: F.sum(x * x + F.exp(x) * x + F.concat([x, x], 0)[:3])
    x = RNG.standard_normal(3)
    (gx,) = kf.run(grad(trace64(f, x), wrt=["x"]), x)
    np.testing.assert_allclose(gx, 2 * x + np.exp(x) * (x + 1) + 1, rtol=1e-12)


def test_unused_and_nondiff_paths_give_zero_gradients():
    def f(x, y):
        mask = F.cast(y > 0.0, "float64")   # y only reaches the loss through a comparison
        return F.sum(x * mask)
    g = trace64(f, np.zeros(4), np.zeros(4))
    gx, gy = kf.run(grad(g, wrt=["x0", "x1"]), np.ones(4), np.array([1.0, -1.0, 2.0, -2.0]))
    np.testing.assert_array_equal(gx, [1, 0, 1, 0])
    np.testing.assert_array_equal(gy, np.zeros(4))


def test_where_routes_gradients_and_blocks_the_condition():
    f = lambda x: F.sum(F.where(x > 0.0, x * 3.0, x * x))
    x = np.array([-2.0, 1.0, 0.5, -0.5])
    (gx,) = kf.run(grad(trace64(f, x), wrt=["x"]), x)
    np.testing.assert_array_equal(gx, [-4.0, 3.0, 3.0, -1.0])


def test_backward_is_a_pruned_ordinary_graph():
    g = trace64(lambda x: F.sum(F.exp(x)) + F.sum(F.log(x * x)) * 0.0, np.ones(3))
    gg = grad(g, wrt=["x"])
    assert gg.outputs and gg.validate() is gg
    produced = {n.name for n in gg.nodes}
    needed = set(gg.outputs)
    for n in reversed(gg.nodes):
        if n.name in needed:
            needed.update(n.inputs)
    assert produced <= needed, "prune left dead nodes"
    assert "graph grad_" in gg.pretty() and gg.to_dot().startswith("digraph")
    # differentiable again: d/dx sum(grad * r)
    r = gg.add_const("r", np.arange(3.0))
    gg.outputs = [F.sum(Tensor(gg, gg.outputs[0]) * Tensor(gg, r)).name]
    (h,) = kf.run(grad(gg, wrt=["x"]), np.array([0.1, 0.2, 0.3]))
    np.testing.assert_allclose(h, np.exp([0.1, 0.2, 0.3]) * np.arange(3.0) + 0.0, rtol=1e-12)


def test_prune_removes_dead_nodes_and_autodiff_constants_only():
    g = trace64(lambda x: (F.exp(x), F.log(x) + 1.0), np.ones(2))
    g.consts["buffer"] = np.zeros(2)
    g.types["buffer"] = TensorType((2,), "float64")
    g.outputs = g.outputs[:1]
    prune(g)
    assert [n.op for n in g.nodes] == ["exp"] and "buffer" in g.consts
    assert not any(c.startswith("const_") for c in g.consts)


def test_batchnorm_updates_kept_only_with_outputs():
    class Net(kf.Module):
        def __init__(self):
            self.bn = kf.BatchNorm2d(2)

        def forward(self, x):
            return F.sum(self.bn(x) ** 2.0)
    g = kf.trace(Net(), (2, 3, 3, 2))
    assert set(g.updates) == {"bn.running_mean", "bn.running_var"}
    assert grad(g, keep_outputs=True).updates == g.updates
    assert grad(g).updates == {}


def test_dropout_gradient_uses_the_same_mask():
    g = kf.trace(lambda x, k: F.sum(F.dropout(x, k, 0.5) * x), (100,), np.int64(0))
    x = np.linspace(1, 2, 100).astype(np.float32)
    (gx,) = kf.run(grad(g, wrt=["x0"]), x, np.int64(3))
    y = kf.run(kf.trace(lambda x, k: F.dropout(x, k, 0.5), (100,), np.int64(0)), x, np.int64(3))[0]
    np.testing.assert_allclose(gx, 2 * y, rtol=1e-6)     # d/dx (m x) . x = 2 m x


@pytest.mark.parametrize("call,message", [
    (lambda g: grad(g), "grad needs a scalar"),
    (lambda g: grad(g, of="nope"), "'nope'"),
    (lambda g: vjp(g, wrt=["nope"]), "value 'nope' is not defined"),
    (lambda g: vjp(g, wrt=["x1"]), "cannot differentiate with respect to 'x1' of dtype int32"),
])
def test_errors_name_the_problem(call, message):
    g = kf.trace(lambda x, i: x * F.cast(i, "float32"), (3,), TensorType((3,), "int32"))
    with pytest.raises((GraphError, KeyError), match=message):
        call(g)


def test_vjp_returning_wrong_shape_is_named(monkeypatch):
    from kiln.frontend.registry import get_op
    monkeypatch.setattr(get_op("exp"), "vjp", lambda n, xs, y, gy: [F.sum(gy)])
    g = trace64(lambda x: F.sum(F.exp(x)), np.ones(3))
    with pytest.raises(GraphError, match=r"VJP for 'exp' \(node 'exp_1'\) gave gradient of shape \(\)"):
        grad(g, wrt=["x"])
