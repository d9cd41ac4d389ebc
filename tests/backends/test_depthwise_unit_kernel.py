"""Depthwise convolutions with a kernel axis of size 1 (a Conv1d as a (k, 1) conv2d) compile on the
C backend (the depthwise schedule's reorder once met fewer loops than it expected) and match the
reference: float and int8."""
import numpy as np
import pytest

from kiln.backends import compile as compile_pkg
from kiln.frontend import Graph, TensorType, run
from kiln.quantize import ptq

RNG = np.random.default_rng(5)


def _graph(kh, kw):
    g = Graph("dw_unit")
    g.add_input("x", TensorType((1, 9, 7, 8)))
    g.add_param("w", RNG.standard_normal((8, kh, kw, 1)).astype(np.float32))
    g.add_param("b", RNG.standard_normal(8).astype(np.float32))
    g.add_node("conv2d", ["x", "w", "b"], {"groups": 8, "padding": [kh // 2, kh // 2, kw // 2, kw // 2]}, name="y")
    g.outputs.append("y")
    return g.validate()


@pytest.mark.parametrize("kh, kw", [(3, 1), (1, 3), (1, 1)])
def test_depthwise_unit_kernel_axis(tmp_path, kh, kw):
    g = _graph(kh, kw)
    x = RNG.standard_normal((1, 9, 7, 8)).astype(np.float32)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path / "f", plot=False, measure_size=False)
    np.testing.assert_allclose(pkg.run(x)[0], run(g, x)[0], rtol=1e-5, atol=1e-5)
    q = ptq(g, RNG.standard_normal((16, 9, 7, 8)).astype(np.float32), int8_io=True)
    xq = RNG.integers(-128, 128, (1, 9, 7, 8)).astype(np.int8)
    pq = compile_pkg(q, target="host", out_dir=tmp_path / "q", plot=False, measure_size=False)
    np.testing.assert_array_equal(pq.run(xq)[0], run(q, xq)[0])
