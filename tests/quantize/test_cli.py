"""kiln verify --target reference, kiln inspect, kiln quantize."""
import json
import os

import pytest

from kiln.cli import main


def _json(capsys, argv):
    rc = main(argv + ["--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("model, macs", [("kws_ref_model", 2_656_768), ("pretrainedResnet_quant", 12_501_632)])
def test_inspect_shared_models(shared_models, capsys, model, macs):
    rc, rep = _json(capsys, ["inspect", os.path.join(shared_models, model + ".tflite")])
    assert rc == 0 and rep["macs"] == macs
    assert rep["weight_bytes"] > 20_000 and rep["peak_activation_bytes"] > 0
    assert rep["ops"][0]["quant"].startswith("s=")


@pytest.mark.parametrize("model", ["kws_ref_model", "pretrainedResnet_quant"])
def test_verify_cli_exit_codes(shared_models, capsys, model, tmp_path):
    path = os.path.join(shared_models, model + ".tflite")
    golden = os.path.join(shared_models, model + ".golden.npz")
    assert main(["verify", path, "--golden", golden, "--target", "reference"]) == 0
    import numpy as np
    z = dict(np.load(golden))
    z["out_0"] = z["out_0"].copy()
    z["out_0"].flat[3] ^= 1
    bad = tmp_path / "bad.npz"
    np.savez(bad, **z)
    assert main(["verify", path, "--golden", str(bad), "--target", "reference"]) == 1
    capsys.readouterr()


def test_quantize_cli_ptq_and_export(digits_model, tmp_path, capsys):
    from kiln.frontend import save
    g, _ = digits_model
    src = save(g, str(tmp_path / "digits.json"))
    rc, rep = _json(capsys, ["quantize", src, "--data", "digits", "--tflite", str(tmp_path / "d.tflite"),
                             "--calibration-size", "200"])
    assert rc == 0 and rep["mode"] == "ptq" and abs(rep["delta_pp"]) <= 2.0
    assert os.path.exists(rep["files"]["graph"]) and os.path.exists(rep["files"]["tflite"])
    rc, rep2 = _json(capsys, ["inspect", rep["files"]["tflite"]])
    rc, rep3 = _json(capsys, ["inspect", src])
    assert rc == 0 and rep2["macs"] == rep3["macs"] > 0


def test_quantize_cli_errors(tmp_path, capsys):
    assert main(["quantize", str(tmp_path / "missing.json"), "--data", "digits"]) == 2
    assert "not found" in capsys.readouterr().err
    # no silent default data set: --data is required
    with pytest.raises(SystemExit) as e:
        main(["quantize", str(tmp_path / "missing.json")])
    assert e.value.code == 2 and "--data" in capsys.readouterr().err


def test_quantize_cli_npz_data_and_qat(digits_model, tmp_path, capsys):
    import numpy as np

    from kiln.frontend import save
    g, (train, test) = digits_model
    src = save(g, str(tmp_path / "digits.json"))
    npz = tmp_path / "data.npz"
    np.savez(npz, x_train=train.x[:300], y_train=train.y[:300], x_test=test.x, y_test=test.y)
    rc, rep = _json(capsys, ["quantize", src, "--data", str(npz), "--qat", "--epochs", "1", "--int8-io",
                             "--method", "percentile", "--out", str(tmp_path / "q.json")])
    assert rc == 0 and rep["mode"] == "qat" and rep["int8_io"] and abs(rep["delta_pp"]) <= 2.0
    assert rep["files"]["graph"].endswith("q.json")


def test_verify_reference_on_a_kiln_graph_json(digits_model, tmp_path, capsys):
    import numpy as np

    from kiln.frontend import run, save
    from kiln.quantize import ptq
    g, (train, test) = digits_model
    q = ptq(g, train.x[:200], int8_io=True)
    path = save(q, str(tmp_path / "q.json"))
    qq = q.types[q.inputs[0]].quant
    ins = [np.clip(np.round(test.x[i:i + 1] / qq.scale[0]) + qq.zero_point[0], -128, 127).astype(np.int8)
           for i in range(4)]
    golden = {f"in_{k}": x for k, x in enumerate(ins)}
    golden.update({f"out_{k}": run(q, x)[0] for k, x in enumerate(ins)})
    np.savez(tmp_path / "g.npz", **golden)
    assert main(["verify", path, "--golden", str(tmp_path / "g.npz"), "--target", "reference"]) == 0
    capsys.readouterr()
