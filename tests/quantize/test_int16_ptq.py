"""16x8 post-training quantisation (``ptq(..., activations="int16")`` and ``kiln quantize
--activations int16``): symmetric int16 activations, int64 biases with scale s_in * s_w, fixed
1/32768 outputs, a .tflite LiteRT runs bit-exactly like Kiln's int16 reference."""
import json

import numpy as np
import pytest

from kiln.cli import main
from kiln.frontend import Graph, TensorType, run, save
from kiln.frontend.graph_passes import with_batch
from kiln.frontend.ops.quant import quantize_array
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize import QuantizationError, export_tflite, ptq

from .litert_util import litert_run


def _json(capsys, argv):
    rc = main(argv + ["--json"])
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_ptq_int16_types_and_litert(digits_model):
    g, (train, test) = digits_model
    q = ptq(g, train.x[:200], activations="int16", int8_io=True)
    assert q.meta["quantized"] == "16x8"
    for n in q.nodes:
        t = q.types[n.name]
        assert t.dtype == "int16" and t.quant.zero_point == (0,), n.name
        if n.op in ("conv2d", "dense"):
            w, b = q.types[n.inputs[1]], q.types[n.inputs[2]]
            assert w.dtype == "int8" and b.dtype == "int64"
            s_in = np.float32(q.types[n.inputs[0]].quant.scale[0])
            np.testing.assert_array_equal(np.asarray(b.quant.scale, np.float32),
                                          (s_in * np.asarray(w.quant.scale, np.float32)).astype(np.float32))
    data = export_tflite(q)
    t = q.types[q.inputs[0]]
    g1 = with_batch(q, 1)
    for x in test.x[:20]:
        xq = quantize_array(x.reshape(t.shape), t.quant.scale[0], 0, "int16")
        np.testing.assert_array_equal(litert_run(data, [xq])[0], run(g1, xq)[0])
    back = load_tflite(data)
    assert [n.op for n in back.nodes if n.op != "reshape"] == [n.op for n in q.nodes if n.op != "reshape"]


def test_ptq_int16_fixed_outputs_and_float_io():
    g = Graph("sm")
    g.add_input("x", TensorType((4, 10), "float32"))
    g.add_node("softmax", ["x"], {"axis": -1}, name="s", out_type=TensorType((4, 10), "float32"))
    g.add_node("tanh", ["x"], {}, name="t", out_type=TensorType((4, 10), "float32"))
    g.outputs = ["s", "t"]
    x = np.random.default_rng(0).normal(0, 3, (64, 10)).astype(np.float32)
    q = ptq(g, x, activations="int16")
    for name in ("s", "t"):
        assert q.types[name].dtype == "int16" and q.types[name].quant.scale == (float(np.float32(1 / 32768)),)
    ref = run(with_batch(g, 64), x)
    got = run(with_batch(q, 64), x)
    for r, o in zip(ref, got):
        assert np.max(np.abs(r - o)) < 2e-3        # int16 outputs: within a few 1/32768 steps


def test_convert_rejects_unknown_activation_type(digits_model):
    g, (train, _) = digits_model
    with pytest.raises(QuantizationError, match="int8' or 'int16"):
        ptq(g, train.x[:20], activations="int4")


def test_cli_quantize_int16(digits_model, tmp_path, capsys):
    g, _ = digits_model
    src = save(g, str(tmp_path / "digits.json"))
    rc, rep = _json(capsys, ["quantize", src, "--data", "digits", "--activations", "int16", "--calibration-size",
                             "200", "--tflite", str(tmp_path / "d16.tflite")])
    assert rc == 0 and rep["activations"] == "int16" and abs(rep["delta_pp"]) <= 1.0
    assert rep["files"]["graph"].endswith("_16x8.json")
    g16 = load_tflite(rep["files"]["tflite"])
    assert {g16.types[n.name].dtype for n in g16.nodes if g16.types[n.name].quant is not None} == {"int16"}
    rc8, rep8 = _json(capsys, ["quantize", src, "--data", "digits", "--calibration-size", "200"])
    assert rc8 == 0 and rep["int8_vs_float"]["mae"] < rep8["int8_vs_float"]["mae"]
    assert main(["quantize", src, "--data", "digits", "--activations", "int16", "--qat"]) == 2
    assert "--qat" in capsys.readouterr().err


def test_mixed_int8_int16_layers(digits_model, tmp_path):
    """Per-layer precision: chosen nodes int16, the rest int8, QUANTIZE nodes between them; LiteRT
    and the host C run it bit-exactly like the reference."""
    from kiln.backends import compile as compile_pkg
    from kiln.frontend.graph_passes import prepare
    g, (train, test) = digits_model
    names = [n.name for n in prepare(g).nodes]          # conv, conv, max_pool, reshape, dense
    layers = {"*": "int8", names[1]: "int16", names[2]: "int16", names[4]: "int16"}
    q = ptq(g, train.x[:200], activations=layers, int8_io=True)
    assert q.meta["quantized"] == "mixed" and q.meta["int16_layers"] == sorted([names[1], names[2], names[4]])
    dts = {n.name: q.types[n.name].dtype for n in q.nodes}
    assert dts[names[0]] == "int8" and dts[names[1]] == dts[names[4]] == "int16" and dts[names[3]] == "int8"
    assert q.types[q.outputs[0]].dtype == "int8" and q.types[q.inputs[0]].dtype == "int8"
    convs = [n for n in q.nodes if n.op == "quantize"]
    # int8 -> int16 (conv 2), int16 -> int8 (reshape), back (dense), int16 -> int8 (the int8 output)
    assert len(convs) == 4
    data = export_tflite(q)
    t = q.types[q.inputs[0]]
    g1 = with_batch(q, 1)
    pkg = compile_pkg(g1, target="host", out_dir=tmp_path / "mixed", plot=False, measure_size=False)
    for x in test.x[:10]:
        xq = quantize_array(x.reshape(t.shape), t.quant.scale[0], t.quant.zero_point[0], "int8")
        want = run(g1, xq)[0]
        np.testing.assert_array_equal(litert_run(data, [xq])[0], want)
        np.testing.assert_array_equal(np.asarray(pkg.run(xq)).reshape(want.shape), want)
    with pytest.raises(QuantizationError, match="does not have"):
        ptq(g, train.x[:20], activations={"nope": "int16"})
