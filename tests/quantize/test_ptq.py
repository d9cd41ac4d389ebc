"""PTQ of the digits CNN: accuracy, graph form, int8 I/O, export to .tflite bit-exact in LiteRT."""
import os
import sys

import numpy as np
import pytest

import kiln.quantize.calibrate  # noqa: F401
from kiln.frontend import run

cal = sys.modules["kiln.quantize.calibrate"]
from kiln.frontend.graph_passes import with_batch
from kiln.quantize.ptq import QuantizationError, ptq, quantize_weights
from kiln.quantize.tflite_export import export_tflite

from .litert_util import litert_run


def assert_int8_form(q, g):
    """quantize -> the float graph's ops, all int8 -> dequantize."""
    from kiln.frontend.graph_passes import prepare
    ops = [n.op for n in q.nodes]
    assert ops[0] == "quantize" and ops[-1] == "dequantize"
    assert ops[1:-1] == [n.op for n in prepare(g).nodes]
    assert all(q.types[n.name].dtype == "int8" for n in q.nodes[:-1])


def accuracy(g, x, y):
    out = run(with_batch(g, len(x)), x)[0]
    return float(np.mean(np.argmax(out, -1) == y))


def quantize_input(q, x):
    qq = q.types[q.inputs[0]].quant
    return np.clip(np.round(x / qq.scale[0]) + qq.zero_point[0], -128, 127).astype(np.int8)


@pytest.mark.parametrize("method", ["minmax", "percentile", "mse"])
def test_ptq_accuracy_close_to_float(digits_model, method):
    g, (train, test) = digits_model
    fa = accuracy(g, test.x, test.y)
    q = ptq(g, train.x[:300], method=method)
    assert_int8_form(q, g)
    assert abs(accuracy(q, test.x, test.y) - fa) <= 0.02


def test_ptq_int8_io_and_types(digits_model):
    g, (train, test) = digits_model
    q = ptq(g, train.x[:200], int8_io=True, per_channel=False)
    xt, yt = q.types[q.inputs[0]], q.types[q.outputs[0]]
    assert xt.dtype == "int8" and yt.dtype == "int8" and xt.quant is not None
    conv = q.nodes[0]
    wt, bt = q.types[conv.inputs[1]], q.types[conv.inputs[2]]
    assert wt.dtype == "int8" and not wt.quant.per_channel and bt.dtype == "int32"
    assert bt.quant.scale[0] == pytest.approx(xt.quant.scale[0] * wt.quant.scale[0], rel=1e-6)
    out = run(q, quantize_input(q, test.x[:1]))[0]
    assert out.dtype == np.int8


@pytest.mark.parametrize("int8_io", [False, True])
def test_exported_digits_cnn_is_bit_exact_in_litert(digits_model, int8_io):
    g, (train, test) = digits_model
    q = ptq(g, train.x[:300], int8_io=int8_io)
    data = export_tflite(q)
    for i in range(0, 60):
        x = test.x[i:i + 1]
        x = quantize_input(q, x) if int8_io else x
        assert np.array_equal(litert_run(data, [x])[0], run(q, x)[0]), f"test image {i}"


def test_round_trip_shared_models(shared_models):
    from kiln.frontend.tflite_import import load_tflite
    for m in ("kws_ref_model", "pretrainedResnet_quant"):
        g = load_tflite(os.path.join(shared_models, m + ".tflite"))
        data = export_tflite(g)
        z = np.load(os.path.join(shared_models, m + ".golden.npz"))
        for k in range(8):
            assert np.array_equal(litert_run(data, [z[f"in_{k}"]])[0], z[f"out_{k}"]), f"{m} pair {k}"
        g2 = load_tflite(data)
        assert [n.op for n in g2.nodes] == [n.op for n in g.nodes]
        assert np.array_equal(run(g2, z["in_0"])[0], z["out_0"])


def test_quantize_weights_symmetric_per_channel():
    w = np.array([[1.0, -2.0], [0.5, 0.25], [0.0, 0.0]])
    q, qp = quantize_weights(w)
    assert qp.axis == 0 and qp.zero_point == (0, 0, 0)
    assert q[0].tolist() == [64, -127] and q[1].tolist() == [127, 64] and q[2].tolist() == [0, 0]


def test_calibration_methods():
    rng = np.random.default_rng(0)
    obs = cal.Observer(rng)
    v = rng.normal(size=50_000).astype(np.float32)
    v[0] = 40.0                      # one outlier
    obs.update(v)
    lo, hi = cal.choose_range(obs, "minmax")
    assert hi == pytest.approx(40.0)
    plo, phi = cal.choose_range(obs, "percentile")
    assert phi < 5 and plo > -5
    mlo, mhi = cal.choose_range(obs, "mse")
    assert mhi < hi
    q = cal.qparams_from_range(0.0, 2.55)
    assert q.zero_point == (-128,) and q.scale[0] == pytest.approx(0.01)
    with pytest.raises(Exception, match="unknown calibration method"):
        cal.choose_range(obs, "kl")


def test_unsupported_op_is_named():
    from kiln.frontend import Graph, TensorType
    g = Graph("g")
    g.add_input("x", TensorType((1, 4)))
    g.add_node("sin", ["x"], name="e")
    g.outputs = ["e"]
    with pytest.raises(QuantizationError, match="op 'sin'"):
        ptq(g, np.zeros((2, 4), np.float32))
