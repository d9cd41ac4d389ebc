"""Resource limits: LimitError names the limit (never MemoryError or RecursionError), and deep
graphs are handled iteratively when the limits allow them."""
import numpy as np
import pytest

import kiln.frontend as kf
from kiln.autodiff import grad
from kiln.frontend import functional as F
from kiln.frontend.errors import LimitError
from kiln.frontend.limits import LIMITS, Limits
from kiln.frontend.types import TensorType


def _chain(n, op="neg"):
    g = kf.Graph("chain")
    v = g.add_input("x", TensorType((4,), "float32"))
    for _ in range(n):
        v = g.add_node(op, [v])
    g.outputs = [v]
    return g


def test_defaults_are_documented_values():
    d = Limits()
    assert (d.max_tensor_elements, d.max_nodes, d.max_depth) == (2 ** 28, 1_000_000, 100_000) or \
        any(k.startswith("KILN_MAX_") for k in __import__("os").environ)


def test_200k_node_chain_validates_and_runs_without_recursion_error():
    with kf.limits(max_depth=250_000):
        g = _chain(200_000)
        g.validate()
        st = kf.RunStats()
        (y,) = kf.run(g, np.arange(4, dtype=np.float32), stats=st)
    np.testing.assert_array_equal(y, np.arange(4))       # an even number of negations
    assert st.nodes_run == 200_000 and st.peak_live_bytes == 32
    with pytest.raises(LimitError, match=r"max_depth exceeded .*200,000 > limit 100,000.*set_limits\(max_depth="):
        g.validate()


def test_grad_of_a_deep_chain_is_iterative():
    with kf.limits(max_depth=50_000):     # the backward chain doubles the depth
        g = _chain(20_000, "tanh")
        from kiln.frontend.tensor import Tensor
        g.outputs = [F.sum(Tensor(g, g.outputs[0])).name]
        gg = grad(g, wrt=["x"])
        (dx,) = kf.run(gg, np.full(4, 0.1, np.float32))
    assert dx.shape == (4,) and np.all(np.isfinite(dx))


@pytest.mark.parametrize("shape", [(10 ** 6, 10 ** 6), (2 ** 20, 2 ** 9)])
def test_huge_shape_is_a_limit_error(shape):
    with pytest.raises(LimitError, match="max_tensor_elements exceeded"):
        kf.trace(lambda x: x * 2.0, shape)


def test_huge_intermediate_shape_is_a_limit_error():
    with pytest.raises(LimitError, match="max_tensor_elements"):
        kf.trace(lambda x: F.broadcast_to(x, (1 << 16, 1 << 16)), (1 << 16,))
    with pytest.raises(LimitError, match="max_tensor_elements"):
        kf.trace(lambda x: F.pad(x, [0, 1 << 30]), (2,))
    with pytest.raises(LimitError, match="max_tensor_elements"):
        kf.trace(lambda x: x @ F.reshape(x, (1, -1)), (1 << 15, 1))


def test_max_nodes():
    with kf.limits(max_nodes=10):
        with pytest.raises(LimitError, match=r"max_nodes exceeded .*11 > limit 10"):
            _chain(11)
        _chain(10).validate()


def test_max_tensor_elements_can_be_raised_and_is_restored():
    with kf.limits(max_tensor_elements=100):
        with pytest.raises(LimitError, match="KILN_MAX_TENSOR_ELEMENTS"):
            kf.trace(lambda x: x + 1.0, (101,))
    assert LIMITS.max_tensor_elements == Limits().max_tensor_elements
    kf.trace(lambda x: x + 1.0, (101,))


def test_limits_context_restores_after_an_error():
    before = LIMITS.max_nodes
    with pytest.raises(LimitError):
        with kf.limits(max_nodes=1):
            _chain(2)
    assert LIMITS.max_nodes == before


def test_unknown_limit_is_named():
    with pytest.raises(KeyError, match="max_nodes"):
        kf.set_limits(max_nodez=3)
