"""The NumPy reference executor: liveness (values freed after their last use, peak live bytes checked
by hand), check mode (NumericsError on the first NaN/Inf, naming node and op), feeds and overrides."""
import numpy as np
import pytest

import kiln.frontend as kf
from kiln.frontend import functional as F
from kiln.frontend.errors import GraphError, NumericsError
from kiln.frontend.types import TensorType

N = 1000                # float32 elements: 4000 bytes per value
B = 4 * N


def _chain(x):
    a = F.exp(x)
    b = F.neg(a)
    return F.tanh(b)


def _diamond(x):
    a = F.exp(x)
    b = F.neg(a)
    c = F.tanh(b)
    return c + x          # x stays alive until the last node


@pytest.mark.parametrize("fn,peak", [
    (_chain, 2 * B),      # at most one input and one output live at a time
    (_diamond, 3 * B),    # x, the previous value and the new one
])
def test_peak_live_bytes_by_hand(fn, peak):
    g = kf.trace(fn, (N,))
    st = kf.RunStats()
    kf.run(g, np.ones(N, np.float32), stats=st)
    assert st.peak_live_bytes == peak
    assert st.nodes_run == len(g.nodes)


def test_parameters_and_constants_are_not_counted_and_unused_inputs_are_dropped():
    def f(x, unused):
        return x * np.full(N, 2.0, np.float32)   # a constant: not counted
    g = kf.trace(f, (N,), (10 * N,))
    st = kf.RunStats()
    kf.run(g, np.ones(N, np.float32), np.ones(10 * N, np.float32), stats=st)
    assert st.peak_live_bytes == 2 * B


def test_keep_extends_a_value_lifetime_and_returns_it():
    g = kf.trace(_chain, (N,))
    first = g.nodes[0].name
    st = kf.RunStats()
    outs, kept = kf.run(g, np.zeros(N, np.float32), keep=[first], stats=st)
    np.testing.assert_array_equal(kept[first], np.ones(N))
    assert st.peak_live_bytes == 3 * B
    np.testing.assert_allclose(outs[0], np.tanh(-1.0) * np.ones(N), rtol=1e-6)


def test_outputs_selects_other_values():
    g = kf.trace(_chain, (3,))
    a = g.nodes[0].name
    (va,) = kf.run(g, np.zeros(3, np.float32), outputs=[a])
    np.testing.assert_array_equal(va, np.ones(3))


@pytest.mark.parametrize("fn,x,op,bad", [
    (lambda x: F.sqrt(F.log(x) + 1.0), [1.0, -1.0], "log", "NaN"),
    (lambda x: F.exp(x * 1000.0) * 0.0, [1.0, 2.0], "exp", "Inf"),
    (lambda x: 1.0 / (x - x), [1.0, 2.0], "div", "Inf"),
])
def test_check_mode_raises_on_first_nan_or_inf(fn, x, op, bad):
    g = kf.trace(fn, (2,))
    x = np.asarray(x, np.float32)
    kf.run(g, x)                      # off by default: NaN/Inf flow silently
    with pytest.raises(NumericsError) as e:
        kf.run(g, x, check=True)
    node = next(n for n in g.nodes if n.op == op)
    assert e.value.node == node.name and e.value.op == op
    assert bad in str(e.value) and repr(node.name) in str(e.value) and f"'{op}'" in str(e.value)


def test_check_mode_passes_finite_graphs_and_ignores_ints():
    g = kf.trace(lambda x: F.cast(x > 0.0, "int32"), (3,))
    kf.run(g, np.array([1.0, -1.0, 0.0], np.float32), check=True)


def test_feed_errors_say_what_was_expected():
    g = kf.trace(lambda x, y: x + y, (2, 3), (3,))
    x, y = np.ones((2, 3), np.float32), np.ones(3, np.float32)
    with pytest.raises(GraphError, match=r"missing input 'x1'"):
        kf.run(g, x)
    with pytest.raises(GraphError, match=r"input 'x0': expected shape \(2, 3\), got \(3, 2\)"):
        kf.run(g, x.T, y)
    with pytest.raises(GraphError, match="takes 2 inputs, got 3"):
        kf.run(g, x, y, y)
    with pytest.raises(GraphError, match="unknown inputs"):
        kf.run(g, feeds={"x0": x, "x1": y, "z": y})
    with pytest.raises(GraphError, match="expected float32, got bool"):
        kf.run(g, x, np.ones(3, bool))
    np.testing.assert_array_equal(kf.run(g, feeds={"x0": x, "x1": y})[0], 2 * x)


def test_param_overrides_are_checked():
    lin = kf.Linear(3, 2)
    g = kf.trace(lin, (1, 3))
    x = np.ones((1, 3), np.float32)
    w = np.zeros((2, 3), np.float32)
    np.testing.assert_array_equal(kf.run(g, x, params={"weight": w})[0], lin.bias.data[None])
    with pytest.raises(GraphError, match="no parameter or constant 'nope'"):
        kf.run(g, x, params={"nope": w})
    with pytest.raises(GraphError, match=r"override of 'weight': expected shape \(2, 3\)"):
        kf.run(g, x, params={"weight": w.T})


def test_a_failing_reference_names_the_node():
    g = kf.Graph("bad")
    g.add_input("x", TensorType((2,), "float32"))
    g.add_node("neg", ["x"], name="n0")
    g.outputs = ["n0"]
    from kiln.frontend.registry import get_op
    op = get_op("neg")
    old = op.ref
    op.ref = lambda xs, a: xs[0][5]
    try:
        with pytest.raises(GraphError, match=r"node 0 'n0' \(neg\) failed: IndexError"):
            kf.run(g, np.ones(2, np.float32))
    finally:
        op.ref = old


def test_run_updates_returns_new_buffer_values():
    bn = kf.BatchNorm2d(2)
    g = kf.trace(bn, (2, 2, 2, 2))
    x = np.arange(16, dtype=np.float32).reshape(2, 2, 2, 2)
    outs, upd = kf.run_updates(g, x)
    assert set(upd) == {"running_mean", "running_var"}
    np.testing.assert_allclose(upd["running_mean"], 0.1 * x.mean((0, 1, 2)), rtol=1e-6)
    assert kf.run_updates(kf.trace(lambda x: x * 2.0, (2,)), np.ones(2, np.float32))[1] == {}


def test_only_requested_values_live_to_the_end():
    g = kf.trace(lambda x: (F.exp(x), F.neg(F.exp(x))), (N,))
    st = kf.RunStats()
    kf.run(g, np.ones(N, np.float32), outputs=[g.outputs[1]], stats=st)
    assert st.peak_live_bytes == 2 * B     # the unrequested exp dies as soon as it is made
