"""QDQ-quantised ONNX models from onnxruntime.quantization import as Kiln int8 with their own
scales and weights; outputs within one output LSB of onnxruntime (its float requantisation with
round-half-to-even against TFLite's fixed point), bit-exact on a board against Kiln's reference."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quant = pytest.importorskip("onnxruntime.quantization")

import kiln  # noqa: E402
from kiln.frontend import load_model  # noqa: E402

from .import_models import make  # noqa: E402


def qdq_model(tmp_path, name, activation="QInt8"):
    m, shape = make(name)
    f = str(tmp_path / f"{name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.randn(*shape),), f, dynamo=False, opset_version=17)
    inp = onnx.load(f).graph.input[0].name

    class Reader(quant.CalibrationDataReader):
        def __init__(self):
            self.it = iter([{inp: np.random.default_rng(i).standard_normal(shape).astype(np.float32)}
                            for i in range(8)])

        def get_next(self):
            return next(self.it, None)
    q = str(tmp_path / f"{name}_qdq.onnx")
    quant.quantize_static(f, q, Reader(), quant_format=quant.QuantFormat.QDQ,
                          activation_type=getattr(quant.QuantType, activation),
                          weight_type=quant.QuantType.QInt8, per_channel=True)
    return q, shape


@pytest.mark.parametrize("activation", ["QInt8", "QUInt8"])
@pytest.mark.parametrize("name", ["cnn", "dsnet", "conv1d", "resnet"])
def test_qdq_imports_as_int8_within_one_lsb(tmp_path, name, activation):
    p, shape = qdq_model(tmp_path, name, activation)
    g = load_model(p)
    assert g.meta["quantized"] == "int8"
    ops = [n.op for n in g.nodes]
    assert ops[0] == "quantize" and ops[-1] == "dequantize"
    assert all(g.types[n.name].dtype == "int8" for n in g.nodes[1:-1])
    # the model's own int8 weights
    model = onnx.load(p)
    conv_w = next(i for i in model.graph.initializer if i.name.endswith("_quantized") and len(i.dims) >= 3)
    w = onnx.numpy_helper.to_array(conv_w)
    kw = [v for v in g.consts.values() if v.dtype == np.int8 and v.shape[0] == w.shape[0] and v.size == w.size]
    assert any(np.array_equal(np.sort(k.ravel()), np.sort(w.ravel())) for k in kw)
    sess = ort.InferenceSession(p, providers=["CPUExecutionProvider"])
    oq = g.types[g.nodes[-1].inputs[0]].quant
    worst = 0.0
    for i in range(10):
        x = np.random.default_rng(100 + i).standard_normal(shape).astype(np.float32)
        got = kiln.run(g, x)[0]
        want = sess.run(None, {sess.get_inputs()[0].name: x})[0]
        worst = max(worst, float(np.max(np.abs(got - want))) / oq.scale[0])
    assert worst <= 1.0 + 1e-4


@pytest.mark.slow
@pytest.mark.qemu
def test_qdq_model_bit_exact_on_board(tmp_path):
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    from kiln.samples import random_inputs
    p, shape = qdq_model(tmp_path, "dsnet")
    gold = str(tmp_path / "g.npz")
    golden(p, gold, random_inputs(load_model(p), 3, seed=2))
    rep = verify(p, gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 3, rep["results"]
