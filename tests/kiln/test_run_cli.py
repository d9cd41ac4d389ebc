"""`kiln run`: what it compares against (Kiln's reference, and LiteRT's reference kernels for a
.tflite), float models within a stated tolerance (they used to report MISMATCH on correct
firmware), accuracy over a data file on every stage, emulated stand-ins labelled as such, the
build folder removed unless asked for."""
import json
import os

import numpy as np
import pytest

from kiln import nn, trace
from kiln.cli import main
from kiln.frontend import manual_seed, save

pytestmark = pytest.mark.qemu


def _json(capsys, argv):
    rc = main(argv + ["--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out.strip().splitlines()[-1])


def test_tflite_model_is_checked_against_litert_too(shared_models, capsys):
    rc, rep = _json(capsys, ["run", os.path.join(shared_models, "ad01_int8.tflite"), "--board", "mps2-an386",
                             "--inputs", "2"])
    assert rc == 0 and rep["ok"] and rep["bit_exact"]
    assert rep["compared_against"] == ["Kiln's reference executor", "LiteRT's reference kernels (BUILTIN_REF)"]
    assert all(c["match"] and c["rule"] == "bit-exact" for c in rep["checks"])
    assert rep["emulated"] and rep["timing"] is None and rep["build"] is None


def test_real_board_stand_in_is_labelled_emulated(shared_models, capsys, tmp_path):
    rc, rep = _json(capsys, ["run", os.path.join(shared_models, "kws_ref_model.tflite"), "--board", "nucleo-l4r5zi",
                             "--inputs", "1", "-o", str(tmp_path / "b")])
    assert rc == 0 and rep["emulated"] and rep["timing"] is None
    assert rep["build"] == str(tmp_path / "b") and os.path.isdir(tmp_path / "b" / "package")
    main(["run", os.path.join(shared_models, "kws_ref_model.tflite"), "--board", "nucleo-l4r5zi", "--inputs", "1"])
    assert "emulated board (QEMU): no hardware timing" in capsys.readouterr().out


def test_float_model_passes_within_tolerance(tmp_path, capsys):
    manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 3, 3, padding="same", activation="relu"), nn.Flatten(), nn.Linear(3 * 25, 4))
    g = trace(m, np.zeros((1, 5, 5, 1), np.float32))
    save(g, tmp_path / "f.json")
    rc, rep = _json(capsys, ["run", str(tmp_path / "f.json"), "--board", "mps2-an386", "--inputs", "3"])
    assert rc == 0 and rep["ok"] and not rep["bit_exact"]
    c = rep["checks"][0]
    assert c["match"] and c["rule"].startswith("|diff| <=") and c["worst_abs_diff"] < 1e-4


def test_accuracy_on_a_data_file_for_every_stage(tmp_path, capsys):
    from kiln.quantize import ptq
    from kiln.training import train_digits
    from kiln.training.data import digits
    r = train_digits(seed=0, epochs=2)
    train, test = digits()
    save(r.graph, tmp_path / "f.json")
    q = ptq(r.graph, train.x[:200], int8_io=True)
    q.meta["float_model"] = str(tmp_path / "f.json")
    save(q, tmp_path / "q.json")
    np.savez(tmp_path / "t.npz", x=test.x[:40], y=test.y[:40])
    rc, rep = _json(capsys, ["run", str(tmp_path / "q.json"), "--board", "mps2-an386", "--data",
                             str(tmp_path / "t.npz")])
    assert rc == 0 and rep["samples"] == 40
    acc = {k: v["accuracy"] for k, v in rep["data_metrics"].items()}
    assert set(acc) == {"float (host)", "reference (host)", "C package (host)", "board (mps2-an386)"}
    assert acc["reference (host)"] == acc["C package (host)"] == acc["board (mps2-an386)"] > 0.5


def test_bad_arguments_are_usage_errors(shared_models, capsys):
    m = os.path.join(shared_models, "ad01_int8.tflite")
    for argv in (["--inputs", "0"], ["--inputs", "-3"], ["--limit", "0", "--inputs", "1"]):
        rc, rep = _json(capsys, ["run", m, "--board", "mps2-an386"] + argv)
        assert rc == 2 and not rep["ok"] and "at least 1" in rep["error"]
    rc, rep = _json(capsys, ["run", m])
    assert rc == 2 and "--board" in rep["error"]
