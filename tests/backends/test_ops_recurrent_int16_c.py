"""The 16x8 lstm through the C backend (backends/ops_recurrent_int16.py) on the host: bit-exact
with the int16 reference (itself bit-exact with TensorFlow Lite Micro) across layouts, cell clips
and scales, int32 and int64 accumulators and biases, gate products that wrap as TFLM's do, and on TFLM's mnist_lstm quantised to 16x8;
one combined model on the emulated mps2-an386."""
import os

import numpy as np
import pytest

import kiln.quantize  # noqa: F401
from kiln.backends import compile as compile_pkg
from kiln.frontend import run
from tests.frontend.test_ops_recurrent_lstm16 import lstm16_graph, tflm_run, upto

MNIST = os.path.join(os.path.dirname(__file__), "..", "data", "tflm_mnist_lstm", "trained_lstm.tflite")


@pytest.mark.parametrize("cfg", [
    dict(n=2, t=4, i=5, h=3, time_major=False, cell_clip=0.0, cell_log2=-11),
    dict(n=1, t=3, i=7, h=6, time_major=True, cell_clip=0.4, cell_log2=-13, w_log2=-4.0, sx=2.0 ** -8),
    dict(n=3, t=2, i=2, h=4, time_major=False, cell_clip=2.0, cell_log2=-8, bias=1 << 33),   # int64 biases
    dict(n=1, t=2, i=600, h=3, time_major=False, cell_clip=0.0, cell_log2=-16, w_log2=-10.0),  # int64 accumulator
    dict(n=1, t=14, i=3, h=80, time_major=True, cell_clip=0.0, cell_log2=-11),   # hidden states in the arena
    # gate products past int32 (TFLM keeps the low 32 bits), then past int64 (its products wrap)
    dict(n=2, t=3, i=2, h=4, cell_log2=-8, w_log2=-3.0, sx=2.0 ** -8, so=2.0 ** -12, bias=1 << 30),
    dict(n=2, t=3, i=2, h=4, cell_log2=-8, w_log2=-3.0, sx=2.0 ** -8, so=2.0 ** -12, bias=(1 << 63) - 1),
])
def test_lstm_16x8_on_host_c_bit_exact(cfg, tmp_path):
    rng = np.random.default_rng(len(str(cfg)))
    g, xshape = lstm16_graph(rng, **cfg)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    for _ in range(3):
        x = rng.integers(-32768, 32768, xshape).astype(np.int16)
        np.testing.assert_array_equal(pkg.run(x)[0], run(g, x)[0])


def test_mnist_lstm_16x8_on_host_c(tmp_path):
    """TFLM's mnist_lstm quantised to 16x8 by Kiln: host C = reference on the whole model, and
    the LSTM's output = TensorFlow Lite Micro's."""
    from kiln.frontend.tflite_import import load_tflite
    from kiln.quantize import ptq
    from kiln.quantize.tflite_export import export_tflite
    x = np.random.default_rng(0).random((16, 28, 28)).astype(np.float32)
    q = ptq(load_tflite(MNIST), x, int8_io=True, activations="int16")
    sub = upto(q, next(n.name for n in q.nodes if n.op == "lstm"))
    pkg = compile_pkg(q, target="host", out_dir=tmp_path / "all", plot=False, measure_size=False)
    sub_pkg = compile_pkg(sub, target="host", out_dir=tmp_path / "lstm", plot=False, measure_size=False)
    sub_model = export_tflite(sub)
    rng = np.random.default_rng(1)
    for _ in range(2):
        xi = rng.integers(-32768, 32768, (1, 28, 28)).astype(np.int16)
        pkg.reset_state()           # one image per stream: the LSTM's states start at zero
        sub_pkg.reset_state()
        np.testing.assert_array_equal(pkg.run(xi)[0], run(q, xi)[0])
        want = tflm_run(sub_model, xi)
        np.testing.assert_array_equal(run(sub, xi)[0], want)
        np.testing.assert_array_equal(sub_pkg.run(xi)[0], want)


@pytest.mark.qemu
@pytest.mark.slow
def test_lstm_16x8_on_mps2_an386(tmp_path):
    """TFLM's mnist_lstm quantised to 16x8 (LSTM, dense, softmax), a time-major single-op LSTM
    with a cell clip and int64 biases, and one whose 49 steps' hidden states would not fit the
    stack (H = 80) on QEMU mps2-an386 (Cortex-M4): firmware = reference."""
    import shutil
    if not shutil.which("arm-none-eabi-gcc") or not shutil.which("qemu-system-arm"):
        pytest.skip("arm-none-eabi-gcc / qemu-system-arm not installed (bash scripts/setup.sh)")
    from kiln import hil
    from kiln.frontend import save
    from kiln.frontend.tflite_import import load_tflite
    from kiln.quantize import ptq
    rng = np.random.default_rng(7)
    q = ptq(load_tflite(MNIST), rng.random((16, 28, 28)).astype(np.float32), int8_io=True, activations="int16")
    single, xshape = lstm16_graph(rng, 2, 3, 4, 5, time_major=True, cell_clip=0.8, bias=1 << 33)
    long, lshape = lstm16_graph(rng, 1, 49, 16, 80)
    for k, (g, shape) in enumerate([(q, (1, 28, 28)), (single, xshape), (long, lshape)]):
        img, pkg = hil.build_for_board(save(g, str(tmp_path / f"m{k}.json")), "mps2-an386", str(tmp_path / f"b{k}"))
        samples = [rng.integers(-32768, 32768, shape).astype(np.int16) for _ in range(2)]
        res = hil.run_on_board(img, pkg, samples)
        want = hil.reference_outputs(hil.package_graph(pkg), samples)
        assert all(hil.same_outputs(a, b) for a, b in zip(res.outputs, want))
