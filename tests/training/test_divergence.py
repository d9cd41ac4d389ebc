"""Divergence: a loss exploding against its running minimum stops the run (exit 1) naming the
first layer whose gradient norm blew up, the last good checkpoint stays; NaN/Inf in the data is
blamed on the data, not on the first conv."""
import json
import math

import numpy as np
import pytest

from kiln import frontend as kf
from kiln.cli import main
from kiln.training import StepGraph, TrainingDiverged, fit
from kiln.training import checkpoint as ckpt
from kiln.training.data import ArrayDataset, DataError
from kiln.training.loop import evaluate
from kiln.training.monitor import DivergenceMonitor, diagnose


def test_huge_learning_rate_exits_1_naming_the_layer(capsys, tmp_path):
    """`kiln train --lr 1e6` used to exit 0 with a loss of 1e19-1e31 and chance accuracy."""
    rc = main(["train", "--model", "digits-cnn", "--lr", "1e6", "--out", str(tmp_path), "--json", "--quiet"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 1 and rep["error_type"] == "TrainingDiverged"
    msg = rep["error"]
    assert "training diverged at epoch 1, step 2" in msg and "times its running minimum" in msg
    assert "The first layer whose gradient norm blew up: '0' (Conv2d)" in msg
    event = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert event["event"] == "diverged" and event["layer"] == "0" and event["step"] == 2
    assert not (tmp_path / "model.json").exists()            # no trained model from a diverged run


def _net(seed=0):
    kf.manual_seed(seed)
    return kf.Sequential(kf.Conv2d(1, 4, 3, stride=2, padding="same", activation="relu"), kf.Flatten(),
                         kf.Linear(64, 10))


def test_the_last_good_checkpoint_is_kept(small_digits, tmp_path):
    """A learning rate that jumps from 0.05 to 5e3 after 4 steps: the step-5 update breaks the
    weights and step 6's loss explodes. The checkpoint of step 5 (weights that gave that loss)
    never reaches the disk; the file holds step 4, whose weights give a healthy loss."""
    tr, _ = small_digits
    with pytest.raises(TrainingDiverged) as e:
        fit(_net(), tr, epochs=2, batch_size=16, optimizer="sgd", momentum=0.0, lr=0.05, schedule="step",
            step_size=4, gamma=1e5, checkpoint_every=1, out=str(tmp_path))
    msg = str(e.value)
    assert "training diverged at epoch 1, step 6" in msg, msg
    assert f"The last good checkpoint (step 4) is kept in {tmp_path / 'checkpoint.npz'}" in msg
    assert e.value.layer in ("0", "2") and e.value.node is None
    meta, arrays = ckpt.load(tmp_path / "checkpoint.npz")
    assert meta["step"] == 4 and not (tmp_path / "checkpoint.npz.tmp").exists()
    params = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
    healthy = evaluate(_net(), tr, params=params)["loss"]
    assert math.isfinite(healthy) and healthy < 3.0                    # chance level is ln 10 = 2.3
    # the run resumes from it
    r = fit(_net(), tr, epochs=1, batch_size=16, optimizer="sgd", momentum=0.0, lr=0.05, schedule="step",
            step_size=4, gamma=1e5, checkpoint_every=1, out=str(tmp_path), resume=True, max_steps=5)
    assert r.steps == 5


def test_monitor_tolerates_noise_near_zero_and_names_the_first_layer():
    m = DivergenceMonitor(1e3, {"conv": "Conv2d"})
    assert m.observe(1, 2.3, {"conv": 1.0, "fc": 1.0}) is None
    for s in range(2, 40):                          # the loss falls near 0 with noise; gradients shrink
        assert m.observe(s, 1e-4 * (1 + s % 3), {"conv": 1e-3, "fc": 1e-3}) is None
    assert m.observe(40, 5.0, {"conv": 1e-3, "fc": 0.5}) is None       # a bad batch: 5 < 1000 x 0.023
    # the conv gradient blows up first (step 41), the loss only at step 42
    assert m.observe(41, 1.0, {"conv": 1e3, "fc": 1e-3}) is None
    text, layer = m.observe(42, 1e5, {"conv": 1e9, "fc": 1e9})
    assert layer == "conv" and "'conv' (Conv2d) at step 41" in text and "times its running minimum" in text
    restored = DivergenceMonitor(1e3)
    restored.load_state_dict(json.loads(json.dumps(m.state_dict())))
    assert restored.state_dict() == m.state_dict()
    off = DivergenceMonitor(None)
    off.observe(1, 1.0, {"a": 1.0})
    assert off.observe(2, 1e30, {"a": 1e30}) is None


def _nan_data(tr):
    x = tr.x.copy()
    x[3, 2, 2, 0] = np.nan
    x[7] = np.inf
    return ArrayDataset(x, tr.y, "bad", 10)


def test_nan_in_the_data_is_blamed_on_the_data(small_digits, tmp_path, capsys):
    tr, te = small_digits
    with pytest.raises(DataError, match=r"'bad': the inputs of 2 of 300 samples hold NaN/Inf \(sample indices \[3, 7\]\)"):
        fit(_net(), _nan_data(tr), epochs=1, batch_size=16)
    np.savez(tmp_path / "bad.npz", x_train=_nan_data(tr).x, y_train=tr.y, x_test=te.x, y_test=te.y)
    rc = main(["train", "--model", "digits-cnn", "--data", str(tmp_path / "bad.npz"), "--out", str(tmp_path / "o"),
               "--json", "--quiet"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 2 and "NaN/Inf" in rep["error"] and "sample indices [3, 7]" in rep["error"]
    assert "conv" not in rep["error"]


def test_diagnose_checks_the_input_batch_before_the_graph(small_digits):
    """diagnose() used to re-run the step first, so NaN inputs were blamed on the first conv and the
    'input batch holds NaN/Inf' branch was unreachable."""
    tr, _ = small_digits
    net = _net()
    sg = StepGraph(net, "cross_entropy", (8, 8, 1), 16)
    params = {k: p.data for k, p in net.named_parameters()}
    x = tr.x[:16].copy()
    x[5, 0, 0, 0] = np.nan
    with pytest.raises(TrainingDiverged, match=r"the input batch holds NaN/Inf \(rows \[5\] of 16\)") as e:
        diagnose(sg, params, {}, x, tr.y[:16], None, "epoch 1, step 1")
    assert e.value.node is None
    # a NaN made inside the graph still names the node
    bad = dict(params)
    bad["0.weight"] = np.full_like(params["0.weight"], np.inf)
    with pytest.raises(TrainingDiverged, match=r"parameters or buffers hold NaN/Inf: \['0.weight'\]"):
        diagnose(sg, bad, {}, tr.x[:16], tr.y[:16], None, "epoch 1, step 1")
