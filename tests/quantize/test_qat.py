"""fake_quant (forward = TFLite quantise/dequantise, straight-through gradient) and QAT."""
import numpy as np
import pytest

from kiln.autodiff import grad
from kiln.frontend import Graph, TensorType, run
from kiln.frontend.graph_passes import with_batch
from kiln.frontend.ops.quant import dequantize_array, fake_quant_array, quantize_array
from kiln.quantize.qat import FakeQuantModule, qat


def test_fake_quant_forward_is_quantize_dequantize():
    x = np.linspace(-3, 3, 101).astype(np.float32)
    s = float(np.float32(0.02))      # scales are float32 values, as in a .tflite file
    a = {"scale": [s], "zero_point": [10], "axis": None, "qmin": -128, "qmax": 127}
    want = dequantize_array(quantize_array(x, s, 10), s, 10)
    np.testing.assert_array_equal(fake_quant_array(x, a), want)


def test_fake_quant_straight_through_gradient():
    g = Graph("fq")
    g.add_input("x", TensorType((7,)))
    g.add_node("fake_quant", ["x"], {"scale": [0.1], "zero_point": [0]}, name="y")
    g.add_node("sum", ["y"], {"axes": [0]}, name="s")
    g.outputs = ["s"]
    dg = grad(g, wrt=["x"])
    x = np.array([-20.0, -12.8, -12.0, 0.0, 5.0, 12.7, 13.0], np.float32)
    gx = run(dg, x)[-1]
    np.testing.assert_array_equal(gx, [0, 1, 1, 1, 1, 1, 0])


def test_fake_quant_per_channel():
    x = np.ones((2, 3), np.float32) * np.array([[0.33], [3.3]], np.float32)
    a = {"scale": [0.1, 1.0], "zero_point": [0, 0], "axis": 0, "qmin": -127, "qmax": 127}
    np.testing.assert_allclose(fake_quant_array(x, a), [[0.3] * 3, [3.0] * 3], rtol=1e-6)


def test_qat_converts_to_the_ptq_graph_form(digits_model):
    g, (train, test) = digits_model
    r = qat(g, train, test, epochs=1, lr=1e-4)
    from .test_ptq import assert_int8_form
    assert_int8_form(r.graph, g)
    out = run(with_batch(r.graph, len(test.x)), test.x)[0]
    fl = run(with_batch(g, len(test.x)), test.x)[0]
    assert abs(np.mean(out.argmax(-1) == test.y) - np.mean(fl.argmax(-1) == test.y)) <= 0.02
    assert len(r.history) == 1 and "train_loss" in r.history[0]


def test_fake_quant_module_rejects_unsupported_ops():
    from kiln.quantize.ptq import QuantizationError
    g = Graph("g")
    g.add_input("x", TensorType((1, 4)))
    g.add_node("sin", ["x"], name="e")
    g.outputs = ["e"]
    with pytest.raises(QuantizationError, match="'sin'"):
        FakeQuantModule(g, {})
