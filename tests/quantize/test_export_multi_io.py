"""Models with several inputs and outputs through .tflite export and import: LiteRT's reference
kernels run the exported file bit for bit like Kiln's references, the file imports back with its
inputs and outputs in order, and the generated C (host) agrees with the reference."""
import numpy as np
import pytest

from kiln.backends import compile as compile_pkg
from kiln.backends.host import HostModel
from kiln.frontend import Graph, QParams, TensorType, run
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.tflite_export import export_tflite
from tests.quantize.litert_util import assert_same, litert_run


def q(s, z=0, axis=None):
    if axis is None:
        return QParams((float(np.float32(s)),), (int(z),))
    return QParams(tuple(float(v) for v in np.asarray(s, np.float32)), tuple(int(v) for v in z), axis)


def two_input_add():
    """TFLite Micro's memory_footprint example: an int8 ADD of two 128x128 inputs."""
    g = Graph("two_input_add")
    g.add_input("a", TensorType((1, 128, 128), "int8", q(0.05, 3)))
    g.add_input("b", TensorType((1, 128, 128), "int8", q(0.04, -7)))
    g.add_node("add", ["a", "b"], name="sum", out_type=TensorType((1, 128, 128), "int8", q(0.09, -1)))
    g.outputs = ["sum"]
    return g


def detection_head():
    """A conv trunk with box and class heads: three outputs (the trunk's feature map is one of them
    and also feeds both heads), boxes int8, classes an int8 softmax."""
    rng = np.random.default_rng(3)
    g = Graph("detect")
    g.add_input("image", TensorType((1, 8, 8, 3), "int8", q(0.02, -10)))

    def conv(name, src, O, K, act, out_q, pad="same"):
        I = g.types[src].shape[3]
        ws = rng.uniform(0.004, 0.02, O)
        g.add_const(name + "/w", rng.integers(-127, 128, (O, K, K, I)).astype(np.int8), q(ws, [0] * O, 0))
        s_in = g.types[src].quant.scale[0]
        g.add_const(name + "/b", rng.integers(-300, 300, O).astype(np.int32), q(s_in * ws, [0] * O, 0))
        H = g.types[src].shape[1]
        g.add_node("conv2d", [src, name + "/w", name + "/b"], {"activation": act, "padding": pad}, name=name,
                   out_type=TensorType((1, H, H, O), "int8", out_q))
        return name

    trunk = conv("trunk", "image", 8, 3, "relu", q(0.03, -128))
    boxes = conv("boxes", trunk, 4, 1, "none", q(0.05, 2))
    logits = conv("logits", trunk, 3, 1, "none", q(0.1, 0))
    g.add_node("reshape", [boxes], {"shape": [1, 64, 4]}, name="boxes_flat",
               out_type=TensorType((1, 64, 4), "int8", q(0.05, 2)))
    g.add_node("reshape", [logits], {"shape": [1, 64, 3]}, name="logits_flat",
               out_type=TensorType((1, 64, 3), "int8", q(0.1, 0)))
    g.add_node("softmax", ["logits_flat"], {"axis": -1}, name="scores",
               out_type=TensorType((1, 64, 3), "int8", q(1 / 256, -128)))
    g.outputs = ["boxes_flat", "scores", trunk]
    return g


def mixed_dtypes():
    """A float32 input quantised in the graph, an int8 input, an int8 and a float32 output."""
    g = Graph("mixed")
    g.add_input("f", TensorType((2, 16), "float32"))
    g.add_input("i", TensorType((2, 16), "int8", q(0.1, 4)))
    g.add_node("quantize", ["f"], {"scale": [0.05], "zero_point": [-3], "dtype": "int8"}, name="fq",
               out_type=TensorType((2, 16), "int8", q(0.05, -3)))
    g.add_node("mul", ["fq", "i"], name="prod", out_type=TensorType((2, 16), "int8", q(0.02, 1)))
    g.add_node("dequantize", ["prod"], {"dtype": "float32"}, name="prod_f", out_type=TensorType((2, 16), "float32"))
    g.outputs = ["prod", "prod_f"]
    return g


def float_two_by_two():
    g = Graph("float2")
    g.add_input("x", TensorType((3, 5), "float32"))
    g.add_input("y", TensorType((3, 5), "float32"))
    g.add_node("add", ["x", "y"], name="s")
    g.add_node("relu", ["s"], name="r")
    g.add_node("mul", ["x", "y"], name="p")
    g.outputs = ["p", "r"]
    return g


def _inputs(g, seed):
    rng = np.random.default_rng(seed)
    out = []
    for name in g.inputs:
        t = g.types[name]
        if t.dtype == "int8":
            out.append(rng.integers(-128, 128, t.shape).astype(np.int8))
        else:
            out.append((rng.standard_normal(t.shape) * 3).astype(np.float32))
    return out


def _same(got, want, what):
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=what)
        assert got.shape == want.shape and got.dtype == want.dtype
    else:
        assert_same(got, want, what)


@pytest.mark.parametrize("make", [two_input_add, detection_head, mixed_dtypes, float_two_by_two])
def test_export_import_and_litert(make, tmp_path):
    g = make()
    data = export_tflite(g)
    g2 = load_tflite(data)
    assert [g2.types[v] for v in g2.inputs] == [g.types[v] for v in g.inputs]
    assert [g2.types[v] for v in g2.outputs] == [g.types[v] for v in g.outputs]
    for seed in range(3):
        xs = _inputs(g, seed)
        want = run(g, *xs)
        lit = litert_run(data, xs)
        back = run(g2, *xs)
        assert len(lit) == len(back) == len(want) == len(g.outputs)
        for k, w in enumerate(want):
            _same(lit[k], w, f"{g.name} output {k} ({g.outputs[k]}): LiteRT vs Kiln")
            _same(back[k], w, f"{g.name} output {k}: re-imported graph vs Kiln")
    pkg = compile_pkg(g2, target="host", out_dir=str(tmp_path), plot=False)
    xs = _inputs(g, 7)
    for k, (c, w) in enumerate(zip(HostModel(pkg.path).run(*xs), run(g2, *xs))):
        _same(c, w, f"{g.name} output {k}: host C vs reference")


def test_litert_reports_the_files_input_and_output_order():
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    g = detection_head()
    it = interp.Interpreter(model_content=export_tflite(g))
    assert [d["name"] for d in it.get_output_details()] == g.outputs
    g = mixed_dtypes()
    it = interp.Interpreter(model_content=export_tflite(g))
    assert [(d["name"], d["dtype"]) for d in it.get_input_details()] == [("f", np.float32), ("i", np.int8)]
