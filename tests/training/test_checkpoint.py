"""Checkpoints: round trips, atomic writes, clear errors for corrupt or incompatible files, and a
training subprocess killed with SIGKILL mid-epoch that resumes to bit-identical parameters."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from kiln.training import CheckpointError, fit
from kiln.training import checkpoint as ckpt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_round_trip_keeps_arrays_and_meta_exactly(tmp_path):
    p = tmp_path / "c.npz"
    rng = np.random.default_rng(0)
    arrays = {"param/conv.weight": rng.standard_normal((2, 3)).astype(np.float32),
              "opt/exp_avg/conv.weight": rng.standard_normal((2, 3)), "loader/perm": np.arange(5)}
    meta = {"step": 3, "rng": rng.bit_generator.state}
    ckpt.save(p, meta, arrays)
    m, a = ckpt.load(p)
    assert m["step"] == 3 and m["rng"] == rng.bit_generator.state
    assert set(a) == set(arrays)
    for k, v in arrays.items():
        assert a[k].dtype == v.dtype and np.array_equal(a[k], v)
    assert not os.path.exists(str(p) + ".tmp")


def test_corrupt_truncated_and_foreign_files_fail_clearly(tmp_path):
    p = tmp_path / "c.npz"
    ckpt.save(p, {"step": 1}, {"param/w": np.ones(1000)})
    blob = p.read_bytes()
    p.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        ckpt.load(p)
    p.write_bytes(b"not a zip file at all")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        ckpt.load(p)
    np.savez(p, w=np.ones(3))
    with pytest.raises(CheckpointError, match="not a Kiln checkpoint"):
        ckpt.load(p)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        ckpt.load(tmp_path / "missing.npz")


def test_checksum_mismatch_and_newer_version(tmp_path, monkeypatch):
    p = tmp_path / "c.npz"
    ckpt.save(p, {}, {"param/w": np.ones(3)})
    meta, arrays = ckpt.load(p)
    arrays["param/w"] = arrays["param/w"] + 1
    blob = json.dumps(meta).encode()
    np.savez(p, __meta__=np.frombuffer(blob, np.uint8), **arrays)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        ckpt.load(p)
    monkeypatch.setattr(ckpt, "VERSION", 99)
    ckpt.save(p, {}, {})
    monkeypatch.setattr(ckpt, "VERSION", 1)
    with pytest.raises(CheckpointError, match="newer"):
        ckpt.load(p)


def test_a_crash_before_the_rename_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    p = tmp_path / "c.npz"
    ckpt.save(p, {"step": 1}, {"param/w": np.ones(3)})

    def crash(*a):
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(p, {"step": 2}, {"param/w": np.zeros(3)})
    monkeypatch.undo()
    meta, arrays = ckpt.load(p)
    assert meta["step"] == 1 and np.array_equal(arrays["param/w"], np.ones(3))


def test_resume_in_process_is_exact_and_checks_compatibility(tiny_net, small_digits, tmp_path):
    tr, te = small_digits
    kw = dict(batch_size=16, lr=1e-2, augment="shift:1", seed=5, model_name="tiny")
    full = fit(tiny_net(2), tr, te, epochs=3, **kw)
    out = str(tmp_path / "run")
    fit(tiny_net(2), tr, te, epochs=3, max_steps=25, checkpoint_every=5, out=out, **kw)   # stops mid-epoch 2
    meta, _ = ckpt.load(os.path.join(out, "checkpoint.npz"))
    assert meta["step"] == 25 and meta["loader"]["has_perm"] and meta["loader"]["pos"] == 6
    resumed = fit(tiny_net(99), tr, te, epochs=3, out=out, resume=True, **kw)   # weights come from the checkpoint
    a = dict(full.module.state_dict())
    b = dict(resumed.module.state_dict())
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert [h["train_loss"] for h in full.history] == [h["train_loss"] for h in resumed.history]
    with pytest.raises(CheckpointError, match="lr=0.01 .this run: 0.1."):
        fit(tiny_net(2), tr, te, epochs=3, out=out, resume=True, **dict(kw, lr=0.1))
    with pytest.raises(CheckpointError, match="model 'tiny'"):
        fit(tiny_net(2), tr, te, epochs=3, out=out, resume=True, **dict(kw, model_name="other"))
    with pytest.raises(CheckpointError, match="no checkpoint"):
        fit(tiny_net(2), tr, te, epochs=3, out=str(tmp_path / "empty"), resume=True, **kw)


def _train_cmd(out, epochs=6):
    return [sys.executable, "-m", "kiln", "train", "--model", "digits-cnn", "--epochs", str(epochs),
            "--checkpoint-every", "7", "--threads", "1", "--out", str(out), "--quiet", "--json"]


def test_sigkill_mid_epoch_then_resume_is_bit_identical(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    proc = subprocess.Popen(_train_cmd(killed), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ck = killed / "checkpoint.npz"
    deadline = time.time() + 120
    step = 0
    while time.time() < deadline and proc.poll() is None:
        if ck.exists():
            try:
                step = ckpt.load(ck)[0]["step"]
            except CheckpointError:
                step = 0
            if step >= 60:        # epoch 2 runs steps 46..90 (45 batches of 32 per epoch)
                break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the run ended before it was killed: {proc.stderr.read()[-2000:]}"
    assert not (killed / "model.json").exists()
    meta, _ = ckpt.load(ck)
    assert 45 < meta["step"] < 90 and meta["loader"]["has_perm"], f"not mid-epoch 2: step {meta['step']}"
    subprocess.run(_train_cmd(ref), cwd=ROOT, env=env, check=True, capture_output=True)
    res = subprocess.run(_train_cmd(killed) + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    rep = json.loads(res.stdout.strip().splitlines()[-1])
    assert rep["steps"] == 270 and rep["epochs"] == 6
    _, a = ckpt.load(ref / "checkpoint.npz")
    _, b = ckpt.load(ck)
    assert set(a) == set(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), f"{k} differs after resume"
    with np.load(ref / "model.npz") as za, np.load(killed / "model.npz") as zb:
        for k in za.files:
            assert np.array_equal(za[k], zb[k])
    strip = lambda p: [{k: v for k, v in json.loads(s).items() if k != "seconds"} for s in p.read_text().splitlines()]
    assert strip(ref / "metrics.jsonl") == strip(killed / "metrics.jsonl")


def test_cli_reports_a_corrupt_checkpoint(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoint.npz").write_bytes(b"PK\x03\x04 torn")
    res = subprocess.run([sys.executable, "-m", "kiln", "train", "--model", "digits-cnn", "--out", str(out),
                          "--resume", "--json"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                         capture_output=True, text=True)
    assert res.returncode == 2
    rep = json.loads(res.stdout)
    assert rep["error_type"] == "CheckpointError" and "corrupt or truncated" in rep["error"]
