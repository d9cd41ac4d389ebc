"""ONNX import against onnxruntime: models exported from PyTorch (torch.onnx.export) and built with
onnx.helper, opsets 13 to the newest, within 1e-4; checker first; errors naming op, node, opset."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

import kiln  # noqa: E402
from kiln.frontend import load_model  # noqa: E402
from kiln.frontend.import_blocks import UnsupportedError  # noqa: E402
from kiln.frontend.onnx_import import OnnxImportError  # noqa: E402

from .import_models import MODELS, REQUIRED, inputs, make  # noqa: E402


def export(m, shape, path, opset=17):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.randn(*shape),), str(path), dynamo=False, opset_version=opset)
    return str(path)


def check_against_ort(path, g, shape, atol=1e-4):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for x in inputs(shape):
        want = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
        got = kiln.run(g, x.numpy())
        got = got if isinstance(got, (list, tuple)) else [got]
        assert len(got) == len(want)
        for a, w in zip(got, want):
            assert a.shape == w.shape
            np.testing.assert_allclose(a, w, atol=atol, rtol=0)


@pytest.mark.parametrize("name", list(MODELS))
def test_matches_onnxruntime(tmp_path, name):
    m, shape = make(name)
    p = export(m, shape, tmp_path / f"{name}.onnx")
    g = load_model(p)
    check_against_ort(p, g, shape)
    if name in REQUIRED[:4] + ["mobilenet_v2", "resnet18"]:
        tr = [n for n in g.nodes if n.op == "transpose"]
        assert len(tr) == 1 and tr[0].inputs == g.inputs


@pytest.mark.parametrize("opset", [13, 15, 18, 20])
@pytest.mark.parametrize("name", ["blocks", "lstm", "dsnet"])
def test_opsets(tmp_path, name, opset):
    m, shape = make(name)
    p = export(m, shape, tmp_path / f"{name}_{opset}.onnx", opset)
    check_against_ort(p, load_model(p), shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _save(tmp_path, model, name="m.onnx"):
    p = str(tmp_path / name)
    onnx.save(model, p)
    return p


def test_unsupported_op_names_node_and_opset(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    m = _model([helper.make_node("Relu", ["x"], ["r"], name="first"),
                helper.make_node("Hardmax", ["r"], ["y"], name="my_hardmax")], [x], [y])
    with pytest.raises(UnsupportedError) as e:
        load_model(_save(tmp_path, m))
    assert "Hardmax" in str(e.value) and "my_hardmax" in str(e.value) and "opset 17" in str(e.value)


def test_checker_runs_first(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    m = _model([helper.make_node("Relu", ["x", "x"], ["y"], name="bad_relu")], [x], [y])   # Relu takes 1 input
    with pytest.raises(OnnxImportError, match="onnx.checker"):
        load_model(_save(tmp_path, m))


def test_old_opset_refused(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y], opset=11)
    with pytest.raises(OnnxImportError, match="opset 11.*13"):
        load_model(_save(tmp_path, m))


def test_helper_built_graph(tmp_path):
    """Gemm with transB, Reshape from a computed shape, Clip to relu6, Sum, dynamic batch."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [5, 6], rng.standard_normal(30).astype(np.float32).ravel())
    c = helper.make_tensor("c", TensorProto.FLOAT, [5], rng.standard_normal(5).astype(np.float32))
    lo = helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0])
    hi = helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
             helper.make_node("Concat", ["n1", "six"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["f"]),
             helper.make_node("Gemm", ["f", "w", "c"], ["g"], transB=1, alpha=0.5),
             helper.make_node("Clip", ["g", "lo", "hi"], ["r"]),
             helper.make_node("Sum", ["r", "g", "r"], ["y"])]
    inits = [w, c, lo, hi, helper.make_tensor("zero", TensorProto.INT64, [], [0]),
             helper.make_tensor("zero1", TensorProto.INT64, [1], [0]), helper.make_tensor("six", TensorProto.INT64, [1], [6])]
    p = _save(tmp_path, _model(nodes, [x], [y], inits))
    g = load_model(p)
    assert g.types[g.inputs[0]].shape == (1, 2, 3)        # the symbolic batch is imported as 1
    sess = ort.InferenceSession(p, providers=["CPUExecutionProvider"])
    xx = rng.standard_normal((1, 2, 3)).astype(np.float32)
    got = kiln.run(g, xx)
    np.testing.assert_allclose(got[0] if isinstance(got, list) else got, sess.run(None, {"x": xx})[0], atol=1e-5)
    assert [n.op for n in g.nodes].count("dense") == 1 and "w" in g.params
