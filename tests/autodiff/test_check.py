"""check_grads: centered finite differences in float64, worst relative error per input, and the
node to blame when a VJP is wrong (broken here by monkeypatching and by a test-local op)."""
import numpy as np
import pytest

import kiln.frontend as kf
from kiln.autodiff import check_grads, to_float64
from kiln.frontend import functional as F
from kiln.frontend.registry import ELEMENTWISE, OPS, get_op, register
from kiln.frontend.types import TensorType

RNG = np.random.default_rng(0)


def _net(x, w):
    h = F.tanh(F.conv2d(x, w, padding="same", stride=2))
    return F.max_pool2d(h * F.sigmoid(h), 2, 1, "same")


def _inputs():
    return [RNG.standard_normal((1, 5, 5, 2)), RNG.standard_normal((3, 3, 3, 2))]


@pytest.mark.parametrize("order", [1, 2])
def test_correct_graph_passes_with_small_error(order):
    g = kf.trace(_net, (1, 5, 5, 2), (3, 3, 3, 2))      # float32 graph: checked in float64
    res = check_grads(g, _inputs(), order=order)
    assert res.ok and res.order == order and res.blame is None
    assert set(res.worst) == {"x0", "x1"} and res.max_error < 1e-7, res
    assert f"order-{order} gradient check: ok" in str(res)


def test_params_and_dict_inputs():
    lin = kf.Linear(3, 2)
    g = kf.trace(lambda x: F.sum(F.tanh(lin(x))), (4, 3))
    res = check_grads(g, {"x": RNG.standard_normal((4, 3))})
    assert len(res.worst) == 3 and "x" in res.worst    # the input and both parameters
    assert res.ok


def test_to_float64_converts_values_constants_and_casts():
    g = kf.trace(lambda x: F.cast(x * 0.5, "float16"), (2,))
    g64 = to_float64(g)
    assert all(t.dtype == "float64" for t in g64.types.values())
    assert g64.nodes[-1].attrs["dtype"] == "float64" and g.nodes[-1].attrs["dtype"] == "float16"


def test_broken_vjp_is_blamed_by_name(monkeypatch):
    # sigmoid's VJP off by a factor: the check fails and names the sigmoid node, not its neighbours
    op = get_op("sigmoid")
    good = op.vjp
    monkeypatch.setattr(op, "vjp", lambda n, xs, y, gy: [good(n, xs, y, gy)[0] * 1.1])
    g = kf.trace(_net, (1, 5, 5, 2), (3, 3, 3, 2))
    res = check_grads(g, _inputs())
    assert not res.ok and res.max_error > 1e-3
    node = next(n for n in g.nodes if n.op == "sigmoid")
    assert res.blame_node == node.name and res.blame_op == "sigmoid"
    assert f"node to blame: {node.name} (sigmoid)" in str(res)


@pytest.fixture
def broken_square():
    """A test-local op whose VJP forgets the factor 2 of d(x^2)/dx."""
    register("_test_square", infer=lambda ts, a: ts[0], ref=lambda xs, a: xs[0] * xs[0],
             vjp=lambda n, xs, y, gy: [gy * xs[0]], props={ELEMENTWISE}, arity=1)
    yield lambda x: F.emit("_test_square", [x])
    del OPS["_test_square"]


def test_broken_test_local_op_is_blamed(broken_square):
    g = kf.trace(lambda x: F.sum(F.exp(broken_square(F.tanh(x))) * 0.5), (3, 4))
    res = check_grads(g, [RNG.standard_normal((3, 4))])
    assert not res.ok
    assert res.blame_op == "_test_square" and res.blame_error > 0.1
    assert res.blame == f"{res.blame_node} (_test_square)"


def test_broken_second_order_rule_is_caught_only_at_order_2(monkeypatch):
    # conv2d_grad_input is the transpose rule conv2d's VJP emits; break *its* VJP
    op = get_op("conv2d_grad_input")
    good = op.vjp
    monkeypatch.setattr(op, "vjp", lambda n, xs, y, gy: [g * 0.5 if k == 0 else g
                                                         for k, g in enumerate(good(n, xs, y, gy))])
    g = kf.trace(lambda x, w: F.sum(F.tanh(F.conv2d(x, w, stride=2, padding="same"))), (1, 5, 5, 2), (3, 3, 3, 2))
    xs = _inputs()
    assert check_grads(g, xs, order=1).ok
    res = check_grads(g, xs, order=2)
    assert not res.ok and res.blame_op == "conv2d_grad_input", res


def test_blame_can_be_disabled_and_bad_order_is_named():
    g = kf.trace(lambda x: F.sum(x * x), (3,))
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        check_grads(g, [np.ones(3)], order=3)
    assert check_grads(g, [np.ones(3)], blame=False).ok


def test_relative_error_is_relative():
    # gradients of size ~1e-4 still have to agree to 1e-6 relative: a 1% error fails
    op = get_op("exp")
    g = kf.trace(lambda x: F.sum(F.exp(x) * 1e-4), TensorType((3,), "float64"))
    good = op.vjp
    try:
        op.vjp = lambda n, xs, y, gy: [good(n, xs, y, gy)[0] * 1.01]
        res = check_grads(g, [np.zeros(3)])
    finally:
        op.vjp = good
    assert not res.ok and 5e-3 < res.worst["x"] < 2e-2
