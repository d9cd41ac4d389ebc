"""kiln train's output folder and options: a folder holding a run is not overwritten without
--resume/--force (or a yes on a terminal); a full disk or an unwritable folder gives a clean
error (exit 2) and leaves no partial file; bad option values are usage errors; --help shows
every default."""
import errno
import io
import json
import os

import numpy as np
import pytest

from kiln.cli import build_parser, main
from kiln.frontend import files
from kiln.frontend.errors import OutputError, UsageError
from kiln.training import TrainConfig, fit, monitor
from kiln.training import checkpoint as ckpt
from kiln.training.monitor import MetricsLog

QUICK = ["train", "--model", "fc-autoencoder", "--max-steps", "2", "--batch-size", "8", "--quiet", "--json"]


def _run(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(out[-1])


def _snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_a_folder_holding_a_run_is_refused_without_resume_or_force(capsys, tmp_path):
    """It used to truncate metrics.jsonl and replace checkpoint.npz without a word."""
    assert _run(capsys, QUICK + ["--out", str(tmp_path)])[0] == 0
    before = _snapshot(tmp_path)
    rc, rep = _run(capsys, QUICK + ["--out", str(tmp_path), "--epochs", "3"])
    assert rc == 2 and rep["error_type"] == "UsageError"
    assert "already holds a training run (checkpoint.npz, metrics.jsonl" in rep["error"]
    assert "--resume" in rep["error"] and "--force" in rep["error"]
    assert _snapshot(tmp_path) == before                     # nothing touched
    rc, rep = _run(capsys, QUICK + ["--out", str(tmp_path), "--force", "--seed", "3"])
    assert rc == 0 and rep["config"]["seed"] == 3
    assert ckpt.load(tmp_path / "checkpoint.npz")[0]["config"]["seed"] == 3
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 0    # a fresh log (no epoch ended)
    assert _run(capsys, QUICK + ["--out", str(tmp_path), "--resume", "--force"])[0] == 2
    with pytest.raises(UsageError, match="already holds a training run"):
        fit_quick(tmp_path)
    assert fit_quick(tmp_path, force=True).steps == 2


def fit_quick(out, **kw):
    from kiln.training import zoo
    from kiln.training.data import synthetic
    e = zoo.get("fc-autoencoder")
    tr, _ = synthetic(e.input_shape[1:], target="input", n_train=16, n_test=8)
    return fit(e.module, tr, input_shape=e.input_shape, loss=e.loss, out=str(out), max_steps=2, batch_size=8, **kw)


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("answer,rc", [("y\n", 0), ("n\n", 2), ("", 2)])
def test_on_a_terminal_kiln_asks_before_replacing_a_run(capsys, tmp_path, monkeypatch, answer, rc):
    assert _run(capsys, QUICK + ["--out", str(tmp_path)])[0] == 0
    before = _snapshot(tmp_path)
    monkeypatch.setattr("sys.stdin", _Terminal(answer))
    assert main([a for a in QUICK if a != "--json"] + ["--out", str(tmp_path), "--seed", "5"]) == rc
    if rc == 2:
        assert _snapshot(tmp_path) == before
    else:
        assert ckpt.load(tmp_path / "checkpoint.npz")[0]["config"]["seed"] == 5


def test_the_terminal_prompt_names_the_folder(capsys, tmp_path, monkeypatch):
    assert _run(capsys, QUICK + ["--out", str(tmp_path)])[0] == 0
    monkeypatch.setattr("sys.stdin", _Terminal("no\n"))
    assert main([a for a in QUICK if a != "--json"] + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} already holds a training run" in err and "Replace it? [y/N]" in err
    assert "error:" in err and "--force" in err


@pytest.mark.parametrize("flag,value,msg", [
    ("--epochs", "-1", "--epochs must be >= 1, got -1"),
    ("--epochs", "0", "--epochs must be >= 1, got 0"),
    ("--batch-size", "0", "--batch-size must be >= 1"),
    ("--lr", "nan", "--lr must be finite"),
    ("--lr", "-0.1", "--lr must be > 0.0"),
    ("--label-smoothing", "1", "--label-smoothing must be < 1.0"),
    ("--accum", "0", "--accum must be >= 1"),
])
def test_bad_option_values_are_usage_errors(capsys, tmp_path, flag, value, msg):
    rc, rep = _run(capsys, QUICK + ["--out", str(tmp_path / "o"), flag, value])
    assert rc == 2 and msg in rep["error"], rep
    assert not (tmp_path / "o").exists()              # rejected before anything was written


def test_train_config_checks_its_bounds():
    with pytest.raises(UsageError, match="epochs must be >= 1, got -1"):
        TrainConfig(epochs=-1)
    with pytest.raises(UsageError, match="batch_size must be an integer"):
        TrainConfig(batch_size=2.5)
    assert TrainConfig(epochs=np.int64(3)).epochs == 3


def test_help_shows_every_default():
    sub = build_parser()._subparsers._group_actions[0].choices["train"]
    for action in sub._actions:
        if action.dest in ("help", "json", "model"):
            continue
        assert "default:" in (action.help or ""), f"{action.option_strings} has no default in its help"
    text = sub.format_help()
    assert "(default: 10; digits-cnn: 25)" in text and "runs/train/MODEL-YYYYmmdd-HHMMSS" in text


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("point", ["write", "fsync", "replace"])
def test_a_full_disk_keeps_the_previous_checkpoint_and_leaves_no_tmp(tmp_path, monkeypatch, point):
    p = tmp_path / "checkpoint.npz"
    ckpt.save(p, {"step": 1}, {"param/w": np.ones(3)})
    if point == "write":
        real_open = open

        class HalfWritten:
            def __init__(self, path, mode):
                self.f = real_open(path, mode)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(data[:len(data) // 2])
                _enospc()
        monkeypatch.setattr(files, "open", HalfWritten, raising=False)
    else:
        monkeypatch.setattr(files.os, point, _enospc)
    with pytest.raises(OutputError, match="No space left on device; the disk is full") as e:
        ckpt.save(p, {"step": 2}, {"param/w": np.zeros(3)})
    assert "previous checkpoint" in str(e.value) and str(p) in str(e.value)
    monkeypatch.undo()
    assert not (tmp_path / "checkpoint.npz.tmp").exists()
    meta, arrays = ckpt.load(p)
    assert meta["step"] == 1 and np.array_equal(arrays["param/w"], np.ones(3))


def test_a_full_disk_during_training_exits_2_and_keeps_the_last_checkpoint(capsys, tmp_path, monkeypatch):
    out = tmp_path / "run"
    argv = ["train", "--model", "digits-cnn", "--max-steps", "6", "--checkpoint-every", "2", "--quiet", "--json",
            "--out", str(out)]
    writes = []
    real_replace = os.replace

    def replace(src, dst):
        if str(dst).endswith("checkpoint.npz"):
            writes.append(ckpt.load(src)[0]["step"])
            if len(writes) == 2:
                _enospc()
        return real_replace(src, dst)
    monkeypatch.setattr(files.os, "replace", replace)
    rc, rep = _run(capsys, argv)
    assert rc == 2 and rep["error_type"] == "OutputError" and "disk is full" in rep["error"]
    monkeypatch.undo()
    assert writes == [2, 4] and ckpt.load(out / "checkpoint.npz")[0]["step"] == 2
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]


def test_a_full_disk_on_the_metrics_log_is_an_output_error(tmp_path, monkeypatch):
    log = MetricsLog(str(tmp_path / "metrics.jsonl"))
    monkeypatch.setattr(monitor, "open", lambda *a, **k: _enospc(), raising=False)
    with pytest.raises(OutputError, match="cannot write metrics log .*metrics.jsonl: No space left"):
        log.append({"epoch": 1})


def test_an_output_path_that_is_a_file_or_not_writable_exits_2(capsys, tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep me")
    rc, rep = _run(capsys, QUICK + ["--out", str(f)])
    assert rc == 2 and "is an existing file, not a folder" in rep["error"] and f.read_text() == "keep me"
    rc, rep = _run(capsys, QUICK + ["--out", str(f / "sub")])        # a file where a folder should be
    assert rc == 2 and rep["error_type"] == "OutputError" and "Not a directory" in rep["error"]


def test_a_read_only_output_folder_exits_2(capsys, tmp_path):
    """A folder with mode 0555; as root, whom the mode does not stop, /proc/1 (a folder in which
    nobody can create files)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        target = ro if not os.access(ro, os.W_OK) else "/proc/1"
        if not os.path.isdir(target):
            pytest.skip("running as root without /proc: no folder here refuses writes")
        rc, rep = _run(capsys, QUICK + ["--out", str(target)])
        assert rc == 2 and rep["error_type"] == "OutputError", rep
        assert f"cannot write training output folder {target}" in rep["error"]
        assert not list(ro.iterdir())
    finally:
        ro.chmod(0o755)
