"""`kiln export MODEL -o OUT.onnx`: the CLI contract (--json, exit 0 / 1 / 2) and an .onnx that
onnxruntime runs like Kiln's reference; a .pt2 exported back to ONNX keeps its NCHW input."""
import json

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import kiln  # noqa: E402
from kiln import nn  # noqa: E402
from kiln.cli import main  # noqa: E402


def _json(capsys, argv):
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out)


@pytest.fixture
def float_model(tmp_path):
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding="same"), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(4 * 4 * 4, 3))
    g = kiln.trace(net, np.zeros((2, 8, 8, 1), np.float32))
    p = str(tmp_path / "net.json")
    kiln.save(g, p)
    return p, g


def test_export_json_report_and_onnxruntime(tmp_path, capsys, float_model):
    p, g = float_model
    out = str(tmp_path / "net.onnx")
    rc, rep = _json(capsys, ["export", p, "-o", out, "--json", "--check", "3"])
    assert rc == 0 and rep["ok"] and rep["out"] == out and rep["check"]["oracle"] == "onnxruntime"
    assert rep["check"]["inputs"] == 3 and max(rep["check"]["max_abs_diff"]) <= 1e-5
    assert rep["inputs"] == {g.inputs[0]: [2, 8, 8, 1]} and rep["onnx_ops"]["Conv"] == 1
    x = np.random.default_rng(0).standard_normal((2, 8, 8, 1)).astype(np.float32)
    got = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {g.inputs[0]: x})[0]
    want = kiln.run(g, x)
    np.testing.assert_allclose(got, want[0] if isinstance(want, list) else want, atol=1e-5)


def test_failed_check_exits_1(tmp_path, capsys, float_model):
    p, _ = float_model
    rc, rep = _json(capsys, ["export", p, "-o", str(tmp_path / "n.onnx"), "--json", "--atol", "-1"])
    assert rc == 1 and not rep["ok"] and not rep["check"]["ok"]


def test_int8_model_and_bad_paths_exit_2(tmp_path, capsys, float_model):
    from kiln.quantize import ptq
    p, g = float_model
    q = ptq(g, np.random.default_rng(1).random((8, 8, 8, 1)).astype(np.float32))
    qp = str(tmp_path / "q.json")
    kiln.save(q, qp)
    rc, rep = _json(capsys, ["export", qp, "-o", str(tmp_path / "q.onnx"), "--json"])
    assert rc == 2 and "quantised" in rep["error"] and "float model" in rep["error"]
    assert not (tmp_path / "q.onnx").exists()
    rc, rep = _json(capsys, ["export", p, "-o", p, "--json"])
    assert rc == 2 and "overwrite" in rep["error"]
    rc, rep = _json(capsys, ["export", str(tmp_path / "missing.json"), "--json"])
    assert rc == 2 and "not found" in rep["error"]


def test_pt2_round_trip_keeps_nchw(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from tests.frontend.import_models import make
    m, shape = make("dsnet")
    pt2 = str(tmp_path / "dsnet.pt2")
    torch.export.save(torch.export.export(m, (torch.zeros(shape),)), pt2)
    out = str(tmp_path / "dsnet.onnx")
    rc, rep = _json(capsys, ["export", pt2, "-o", out, "--json"])
    assert rc == 0 and rep["ok"] and list(rep["inputs"].values()) == [list(shape)] and rep["transposes"] == 0
    x = torch.randn(*shape)
    got = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, m(x).numpy(), atol=1e-4)
