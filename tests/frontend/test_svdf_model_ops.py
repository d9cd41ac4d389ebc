"""The two pieces TFLite Micro's keyword_scrambled needs besides SVDF: SOFTMAX with an int8 input
and an int16 output (TFLite's Softmax<int8_t, int16_t>) and QUANTIZE from int16 to int32
(Requantize): the reference bit-exact with LiteRT's reference kernels, the C package on the host
bit-exact with the reference."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.backends import compile as compile_pkg
from kiln.frontend import Graph, TensorType, run
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.tflite_export import export_tflite
from tests.frontend.svdf_util import litert_stream
from tests.quantize.litert_util import assert_same, q


def _softmax16(shape, s_in, z_in):
    g = Graph("softmax16")
    g.add_input("x", TensorType(shape, "int8", q(s_in, z_in)))
    g.add_node("softmax", ["x"], {"axis": -1, "out_dtype": "int16"}, name="y",
               out_type=TensorType(shape, "int16", q(1.0 / 65536, -32768)))
    g.outputs = ["y"]
    return g.validate()


def _requant32(shape, s_in, z_in, s_out, z_out):
    g = Graph("requant32")
    g.add_input("x", TensorType(shape, "int16", q(s_in, z_in)))
    g.add_node("quantize", ["x"], {"scale": [float(np.float32(s_out))], "zero_point": [z_out], "dtype": "int32"},
               name="y")
    g.outputs = ["y"]
    return g.validate()


shapes = st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple)


@settings(max_examples=40, deadline=None)
@given(shapes, st.floats(1e-3, 1.0), st.integers(-128, 127), st.integers(0, 10**6))
def test_softmax_int8_to_int16_matches_litert(shape, s_in, z_in, seed):
    g = _softmax16(shape, s_in, z_in)
    x = np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)
    (want,), = litert_stream(export_tflite(g), [x])
    assert_same(run(g, x)[0], want, "softmax int8 -> int16")
    assert load_tflite(export_tflite(g)).nodes[0].attrs["out_dtype"] == "int16"


@settings(max_examples=40, deadline=None)
@given(shapes, st.floats(1e-5, 1e-2), st.floats(1e-6, 1e-2), st.integers(-1000, 1000), st.integers(0, 10**6))
def test_quantize_int16_to_int32_matches_litert(shape, s_in, s_out, z_out, seed):
    g = _requant32(shape, s_in, 0, s_out, z_out)
    x = np.random.default_rng(seed).integers(-32768, 32768, shape).astype(np.int16)
    (want,), = litert_stream(export_tflite(g), [x])
    assert_same(run(g, x)[0], want, "quantize int16 -> int32")


def test_both_on_host_c(tmp_path):
    rng = np.random.default_rng(0)
    for k, g in enumerate([_softmax16((3, 10), 0.07, 2), _softmax16((2, 5), 0.9, -128),
                           _requant32((4, 6), 6.25e-4, 0, 3.05e-5, 3)]):
        pkg = compile_pkg(g, target="host", out_dir=str(tmp_path / str(k)), plot=False, measure_size=False)
        t = g.types["x"]
        lo, hi = (-128, 128) if t.dtype == "int8" else (-32768, 32768)
        for _ in range(3):
            x = rng.integers(lo, hi, t.shape).astype(t.dtype)
            np.testing.assert_array_equal(pkg.run(x)[0], run(g, x)[0])
