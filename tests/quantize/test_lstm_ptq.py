"""Post-training quantisation of a float LSTM (``kiln quantize --data`` / ``ptq``) to TFLite's int8
LSTM (int8 activations, int16 cell state): per-tensor symmetric int8 weights, int32 biases with scale s_x * s_w, a power-of-two
int16 cell state from the calibrated cell range, int8 output/output state. On TFLite Micro's
mnist_lstm the weights and biases come out identical to those TensorFlow's converter wrote into
trained_lstm_int8.tflite, and the exported .tflite runs in TensorFlow Lite Micro's interpreter
bit-exact with Kiln's reference and the host C package (LiteRT's int8 LSTM differs by 1 in some
values: docs/int8_ir.md)."""
import os

import numpy as np
import pytest

import kiln.frontend as kf
from kiln.backends import compile as compile_pkg
from kiln.frontend import run
from kiln.frontend.ops.recurrent_quant import cell_qparams
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize import ptq
from kiln.quantize.tflite_export import export_tflite
from tests.frontend.test_ops_recurrent_lstm16 import tflm_run
from tests.quantize.litert_util import assert_same

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "tflm_mnist_lstm")
SAMPLES = "/work/ext/tflm/tensorflow/lite/micro/examples/mnist_lstm/samples"


def _calibration(n=24, seed=0):
    """Images in [0, 1] holding both 0 and 1 (the input range the converter saw: scale 1/255)."""
    x = np.random.default_rng(seed).random((n, 28, 28)).astype(np.float32)
    x[:, :4] = 0.0
    x[:, -4:] = 1.0
    return x


def _lstm(g):
    return next(n for n in g.nodes if n.op == "lstm")


def _array(g, v):
    return np.asarray(g.consts.get(v, g.params.get(v)))


@pytest.fixture(scope="module")
def quantised():
    g = load_tflite(os.path.join(DATA, "trained_lstm.tflite"))
    return g, ptq(g, _calibration(), int8_io=True)


def test_weights_and_biases_match_tensorflows_converter(quantised):
    _, q = quantised
    ref = load_tflite(os.path.join(DATA, "trained_lstm_int8.tflite"))
    a, b = _lstm(q), _lstm(ref)
    for j in range(1, 13):
        assert q.types[a.inputs[j]].quant == ref.types[b.inputs[j]].quant, j
        np.testing.assert_array_equal(_array(q, a.inputs[j]), _array(ref, b.inputs[j]))
    c = q.types[a.inputs[14]]
    e = np.log2(c.quant.scale[0])
    assert c.dtype == "int16" and e == int(e) and -21 <= e <= -9 and c.quant.zero_point[0] == 0
    assert q.types[a.inputs[13]].quant == q.types[a.name].quant          # output state = output


def test_exported_model_runs_in_tflm_bit_exact(quantised, tmp_path):
    _, q = quantised
    model = export_tflite(q)
    g2 = load_tflite(model)
    pkg = compile_pkg(q, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    rng = np.random.default_rng(3)
    for _ in range(4):
        x = rng.integers(-128, 128, (1, 28, 28)).astype(np.int8)
        want = tflm_run(model, x)           # a fresh interpreter: the LSTM's states start at zero
        assert_same(run(q, x)[0], want, "reference")
        assert_same(run(g2, x)[0], want, "re-imported")
        pkg.reset_state()                   # the package carries them (a stateful LSTM): start over
        assert_same(pkg.run(x)[0], want, "host C")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(SAMPLES), reason="TFLite Micro checkout absent")
def test_accuracy_on_the_mnist_samples():
    """TFLM's ten digit samples shifted by -1..1 pixels (90 images), calibrated on the odd-numbered
    ones: the quantised model agrees with the float model's top class as often as TensorFlow's own
    int8 model does (within 2 images in 90)."""
    from PIL import Image
    g = load_tflite(os.path.join(DATA, "trained_lstm.tflite"))
    imgs = np.stack([np.asarray(Image.open(f"{SAMPLES}/sample{k}.png"), np.float32) / 255.0 for k in range(10)])
    x = np.concatenate([np.roll(imgs, (dy, dx), (1, 2)) for dy in range(-1, 2) for dx in range(-1, 2)])
    labels = np.tile(np.arange(10), 9)
    q = ptq(g, x[1::2], int8_io=True)
    ref = load_tflite(os.path.join(DATA, "trained_lstm_int8.tflite"))

    def top(graph, tq=None):
        out = []
        for v in x:
            if tq is not None:
                v = np.clip(np.round(v / tq.scale[0]) + tq.zero_point[0], -128, 127).astype(np.int8)
            out.append(int(run(graph, v[None])[0].argmax()))
        return np.array(out)
    f, ours, tf = top(g), top(q, q.types[q.inputs[0]].quant), top(ref, ref.types[ref.inputs[0]].quant)
    assert (ours == labels).mean() >= (f == labels).mean() - 0.023
    assert (ours == f).mean() >= (tf == f).mean() - 0.023


def test_module_lstm_quantises_and_exports(tmp_path):
    """nn.LSTM (cell clip, a zero state of batch 2) through ptq and TensorFlow Lite Micro."""
    m = kf.LSTM(3, 5, cell_clip=1.5)
    g = kf.trace(m, (2, 6, 3))
    q = ptq(g, np.random.default_rng(1).standard_normal((16, 6, 3)).astype(np.float32), int8_io=True)
    model = export_tflite(q)
    xq = np.random.default_rng(2).integers(-128, 128, (2, 6, 3)).astype(np.int8)
    assert_same(run(q, xq)[0], tflm_run(model, xq), "module LSTM")


def test_cell_scale_is_a_power_of_two_within_the_kernels_range():
    assert cell_qparams(-2.7, 7.9).scale[0] == 2.0 ** -12      # TensorFlow's converter test: 8 / 32768
    assert cell_qparams(-0.3, 0.2).scale[0] == 2.0 ** -16
    assert cell_qparams(0.0, 1e-9).scale[0] == 2.0 ** -21      # bounded by the kernel's tanh
    assert cell_qparams(-1e6, 0).scale[0] == 2.0 ** -9


@pytest.mark.parametrize("clip,int8_io", [(0.0, True), (0.8, False)])
def test_functional_lstm_quantises_bit_exact(clip, int8_io):
    """F.lstm with random weights (batch 2, cell clip, float or int8 graph I/O): TFLite Micro agrees."""
    from kiln.frontend import functional as F
    rng = np.random.default_rng(int(clip * 10))
    N, T, I, H = 2, 5, 3, 4
    wx, wh = ([rng.standard_normal(s).astype(np.float32) * 0.5 for _ in range(4)] for s in ((H, I), (H, H)))
    b = [rng.standard_normal(H).astype(np.float32) * 0.3 for _ in range(4)]
    z = np.zeros((N, H), np.float32)

    def consts(arrays):
        return [F.constant(a) for a in arrays]
    g = kf.trace(lambda x: F.lstm(x, consts(wx), consts(wh), consts(b), F.constant(z), F.constant(z), cell_clip=clip),
                 (N, T, I))
    q = ptq(g, rng.standard_normal((16, T, I)).astype(np.float32), int8_io=int8_io)
    model = export_tflite(q)
    x = rng.standard_normal((N, T, I)).astype(np.float32)
    if int8_io:
        s, zp = q.types[q.inputs[0]].quant.scale[0], q.types[q.inputs[0]].quant.zero_point[0]
        x = np.clip(np.round(x / s) + zp, -128, 127).astype(np.int8)
    assert_same(run(q, x)[0], tflm_run(model, x), "lstm")
