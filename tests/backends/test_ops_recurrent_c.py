"""The lstm op through the C backend on the host: int8 (TensorFlow Lite Micro's LSTM,
backends/ops_recurrent_int16.py) bit-exact with the int8 reference, float (the op's TE compute)
within 1e-5."""
import numpy as np
import pytest

import kiln.quantize  # noqa: F401
from kiln.backends import compile as compile_pkg
from kiln.frontend import run
from tests.frontend.test_ops_recurrent_lstm import lstm_graph


@pytest.mark.parametrize("cfg", [
    dict(n=2, t=4, i=5, h=3, time_major=False, cell_clip=0.0, cell_log2=-12, zx=3, zo=-5),
    dict(n=1, t=3, i=7, h=6, time_major=True, cell_clip=0.4, cell_log2=-11, zx=-128, zo=100, w_log2=-4.0),
    dict(n=3, t=2, i=2, h=4, time_major=False, cell_clip=2.0, cell_log2=-15, zx=0, zo=0, sx=1.0),
])
def test_lstm_int8_on_host_c_bit_exact(cfg, tmp_path):
    rng = np.random.default_rng(len(str(cfg)))
    g, xshape = lstm_graph(rng, int8=True, **cfg)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    for _ in range(3):
        x = rng.integers(-128, 128, xshape).astype(np.int8)
        np.testing.assert_array_equal(pkg.run(x)[0], run(g, x)[0])


def test_lstm_float_on_host_c(tmp_path):
    rng = np.random.default_rng(11)
    g, xshape = lstm_graph(rng, 2, 4, 3, 5, time_major=True, cell_clip=0.5, int8=False)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    x = rng.standard_normal(xshape).astype(np.float32)
    np.testing.assert_allclose(pkg.run(x)[0], run(g, x)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["trained_lstm_int8.tflite", "trained_lstm.tflite"])
def test_tflm_mnist_lstm_on_host_c(name, tmp_path):
    """TFLM's mnist_lstm models (28 steps, 20 units) compiled with the C backend: int8 bit-exact
    with the int8 reference (itself bit-exact with TFLite Micro), float within 1e-5."""
    import os

    from kiln.frontend.tflite_import import load_tflite
    g = load_tflite(os.path.join(os.path.dirname(__file__), "..", "data", "tflm_mnist_lstm", name))
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    rng = np.random.default_rng(1)
    for _ in range(2):
        pkg.reset_state()      # the LSTM's states persist between runs (variable tensors): one image each
        if "int8" in name:
            x = rng.integers(-128, 128, (1, 28, 28)).astype(np.int8)
            np.testing.assert_array_equal(pkg.run(x)[0], run(g, x)[0])
        else:
            x = rng.random((1, 28, 28)).astype(np.float32)
            np.testing.assert_allclose(pkg.run(x)[0], run(g, x)[0], rtol=1e-5, atol=1e-6)
