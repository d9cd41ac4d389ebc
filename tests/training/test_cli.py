"""kiln train: zoo models, user model files with .npz data, JSON report, errors."""
import json
import os

import numpy as np
import pytest

from kiln.cli import main


def _json(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(out[-1])


def test_train_digits_json(capsys, tmp_path):
    rc, rep = _json(capsys, ["train", "--model", "digits-cnn", "--epochs", "1", "--out", str(tmp_path),
                             "--json", "--quiet", "--optimizer", "sgd", "--lr", "0.05", "--nesterov"])
    assert rc == 0 and rep["ok"] and rep["model"] == "digits-cnn" and rep["steps"] == 45
    assert {"test_acc", "test_loss", "train_loss", "seconds", "grad_norm"} <= set(rep)
    assert rep["config"]["optimizer"] == "sgd" and rep["config"]["nesterov"] is True
    assert (tmp_path / "model.json").exists() and (tmp_path / "report.json").exists()


def test_train_without_out_keeps_the_model_in_a_new_run_folder(capsys, tmp_path, monkeypatch):
    """No --out: the run goes to runs/train/MODEL-TIMESTAMP (a new folder each time) and the text
    report says where the trained model is."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--model", "fc-autoencoder", "--max-steps", "2", "--batch-size", "8", "--quiet"]
    rc = main(argv)
    text = capsys.readouterr().out
    assert rc == 0 and "kiln train fc-autoencoder on synthetic: 2 steps" in text
    (run,) = (tmp_path / "runs" / "train").iterdir()
    assert run.name.startswith("fc-autoencoder-") and (run / "model.json").exists() and (run / "checkpoint.npz").exists()
    assert f"trained model saved in {os.path.join('runs', 'train', run.name)}" in text
    assert main(argv) == 0                           # a second run gets its own folder
    assert len(list((tmp_path / "runs" / "train").iterdir())) == 2


def test_user_model_file_with_npz_data(capsys, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.random((40, 6)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x_train=x[:32], y_train=(x[:32, 0] > 0.5).astype(int),
             x_test=x[32:], y_test=(x[32:, 0] > 0.5).astype(int))
    (tmp_path / "mlp.py").write_text(
        "from kiln import nn\nDATASET = 'd.npz'\n"
        "def model():\n    return nn.Sequential(nn.Linear(6, 8, activation='relu'), nn.Linear(8, 2))\n")
    rc, rep = _json(capsys, ["train", "--model", str(tmp_path / "mlp.py"), "--epochs", "2", "--batch-size", "8",
                             "--json", "--quiet", "--out", str(tmp_path / "out")])
    assert rc == 0 and rep["model"] == "mlp" and rep["steps"] == 8 and 0 <= rep["test_acc"] <= 1


@pytest.mark.parametrize("argv,msg", [
    (["--model", "lenet"], "unknown zoo model"),
    (["--model", "digits-cnn", "--resume"], "--resume needs --out"),
    (["--model", "digits-cnn", "--data", "cifar"], "unknown dataset"),
    (["--model", "digits-cnn", "--optimizer", "lbfgs", "--max-steps", "1"], "unknown optimizer"),
])
def test_errors_are_clear(capsys, argv, msg):
    """Bad arguments are usage errors: exit code 2, one JSON object naming the problem."""
    rc, rep = _json(capsys, ["train", "--json", "--quiet"] + argv)
    assert rc == 2 and not rep["ok"] and msg in rep["error"]
