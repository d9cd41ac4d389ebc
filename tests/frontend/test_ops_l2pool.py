"""l2_pool2d (TFLite L2_POOL_2D, float): LiteRT's reference kernel, gradients, the TE compute on
the C backend, TFLite round trip."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln.frontend as kf
from kiln.autodiff import check_grads
from kiln.frontend import Graph, TensorType, run
from kiln.frontend import functional as F
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.tflite_export import export_tflite
from tests.quantize.litert_util import litert_run


def _graph(shape, attrs):
    g = Graph("l2")
    g.add_input("x", TensorType(shape))
    g.add_node("l2_pool2d", ["x"], attrs, name="y")
    g.outputs = ["y"]
    return g


@settings(max_examples=30, deadline=None)
@given(h=st.integers(1, 8), w=st.integers(1, 8), c=st.integers(1, 3), ph=st.integers(1, 3), pw=st.integers(1, 3),
       sh=st.integers(1, 3), sw=st.integers(1, 3), pad=st.sampled_from(["same", "valid"]),
       act=st.sampled_from(["none", "relu", "relu6"]), seed=st.integers(0, 2 ** 31))
def test_l2_pool_matches_litert(h, w, c, ph, pw, sh, sw, pad, act, seed):
    if pad == "valid" and (ph > h or pw > w):
        return
    g = _graph((2, h, w, c), {"pool": [ph, pw], "stride": [sh, sw], "padding": pad, "activation": act})
    x = (np.random.default_rng(seed).standard_normal((2, h, w, c)) * 4).astype(np.float32)
    data = export_tflite(g)
    want = litert_run(data, [x])[0]
    np.testing.assert_allclose(run(g, x)[0], want, rtol=1e-6, atol=1e-6)
    g2 = load_tflite(data)
    assert [n.op for n in g2.nodes] == ["l2_pool2d"] and g2.nodes[0].attrs == g.nodes[0].attrs


@pytest.mark.parametrize("pad", ["same", "valid"])
def test_l2_pool_check_grads(pad):
    g = kf.trace(lambda x: F.sum(F.l2_pool2d(x, 2, 1, pad, "relu6")), (1, 4, 5, 2))
    assert check_grads(g, [np.random.default_rng(1).standard_normal((1, 4, 5, 2)) * 2]).ok


def test_l2_pool_on_host_c(tmp_path):
    from kiln.backends import compile as compile_pkg
    g = _graph((1, 7, 6, 3), {"pool": [3, 2], "stride": [2, 2], "padding": "same"})
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    x = np.random.default_rng(2).standard_normal((1, 7, 6, 3)).astype(np.float32)
    np.testing.assert_allclose(pkg.run(x)[0], run(g, x)[0], rtol=1e-5, atol=1e-6)
