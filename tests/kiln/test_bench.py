"""`kiln bench`: prints its table (or --json) and writes into a Markdown file only with --write;
the shared models come from --shared or KILN_SHARED (never a guessed ../shared), with a usage
error naming both when no models are given; its temporary build folder is removed unless --keep.
Also: every flag of every command has a help text, and `kiln verify --target BOARD` cleans up."""
import argparse
import hashlib
import json
import os
import tempfile

import numpy as np
import pytest

from kiln import docs_util
from kiln.cli import build_parser, main
from kiln.commands import BuildFolder
from kiln.docs_util import BENCHMARKS_MD
from kiln.errors import KilnError
from kiln.frontend import Graph, TensorType, save
from kiln.quantize import ptq


def _json(capsys, argv):
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """tempfile's folder for this test only, so what a command leaves behind can be seen."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


@pytest.fixture(scope="module")
def tiny_int8(tmp_path_factory):
    """A small int8 model (dense 16 -> 8 + relu), quick to compile, build and run on a board."""
    g = Graph("tiny")
    g.add_input("x", TensorType((1, 16)))
    g.add_const("w", np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32))
    g.add_node("dense", ["x", "w"], {"activation": "relu"}, name="d")
    g.outputs = ["d"]
    q = ptq(g, np.random.default_rng(1).normal(size=(64, 16)).astype(np.float32), int8_io=True)
    return save(q, str(tmp_path_factory.mktemp("models") / "tiny_int8.json"))


def test_every_flag_of_every_command_has_help():
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"kiln {name} {'/'.join(a.option_strings) or a.dest}" for name, sp in sub.choices.items()
               for a in sp._actions if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not missing, missing


def test_no_models_and_no_shared_is_a_usage_error_naming_both(capsys, monkeypatch):
    monkeypatch.delenv("KILN_SHARED", raising=False)
    rc, rep = _json(capsys, ["bench", "--json"])
    assert rc == 2 and not rep["ok"]
    assert "--shared" in rep["error"] and "KILN_SHARED" in rep["error"] and "--models" in rep["error"]


def test_shared_folder_without_the_models_names_what_is_missing(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("KILN_SHARED", raising=False)
    rc, rep = _json(capsys, ["bench", "--shared", str(tmp_path), "--json"])
    assert rc == 2 and "kws_ref_model.tflite" in rep["error"] and str(tmp_path) in rep["error"]
    monkeypatch.setenv("KILN_SHARED", str(tmp_path))
    rc, rep = _json(capsys, ["bench", "--json"])
    assert rc == 2 and rep["error"].startswith(f"KILN_SHARED {tmp_path}:")


def test_missing_model_file_is_a_usage_error(capsys, tmp_path):
    rc, rep = _json(capsys, ["bench", "--models", str(tmp_path / "nope.tflite"), "--json"])
    assert rc == 2 and "nope.tflite not found" in rep["error"]


def test_shared_models_come_from_the_flag_or_the_environment(monkeypatch, tmp_path):
    (tmp_path / "models").mkdir()
    for n in ("a.tflite", "b.tflite"):
        (tmp_path / "models" / n).write_bytes(b"")
    monkeypatch.delenv("KILN_SHARED", raising=False)
    want = [str(tmp_path / "models" / n) for n in ("a.tflite", "b.tflite")]
    assert docs_util.shared_models(str(tmp_path), ["a.tflite", "b.tflite"]) == want
    monkeypatch.setenv("KILN_SHARED", str(tmp_path))
    assert docs_util.shared_models(None, ["a.tflite", "b.tflite"]) == want


def test_write_path(monkeypatch):
    assert docs_util.write_path(None) is None                 # no --write: nothing is written
    assert docs_util.write_path("out.md") == "out.md"
    assert docs_util.write_path("") == BENCHMARKS_MD          # bare --write in a source checkout
    monkeypatch.setattr(docs_util, "checkout_benchmarks_md", lambda: None)
    with pytest.raises(docs_util.UsageError, match="--write needs a PATH"):
        docs_util.write_path("")                              # an installed copy has no docs/


def test_write_section_replaces_only_its_section(tmp_path):
    md = tmp_path / "b.md"
    md.write_text("# Benchmarks\n\n## A\n\nold a\n\n## B\n\nkeep b\n")
    docs_util.write_section(str(md), "## A\n\nnew a\n")
    assert md.read_text() == "# Benchmarks\n\n## A\n\nnew a\n\n## B\n\nkeep b\n"
    docs_util.write_section(str(md), "## C\n\nc\n")
    assert md.read_text().endswith("## B\n\nkeep b\n\n## C\n\nc\n")
    assert not (tmp_path / "b.md.tmp").exists()


def test_bench_prints_writes_only_with_write_and_cleans_up(capsys, tiny_int8, private_tmp, tmp_path):
    before = _digest(BENCHMARKS_MD)
    argv = ["bench", "--models", tiny_int8, "--boards", "mps2-an386", "--optimize", "size"]
    rc, rep = _json(capsys, argv + ["--json"])
    assert rc == 0 and rep["ok"] and rep["markdown"] is None and rep["build"] is None
    (row,) = rep["rows"]
    assert row["model"] == "tiny_int8" and row["bit_exact"] and row["instructions"] > 0
    assert os.listdir(private_tmp) == []                      # the build folder (QEMU logs included) is gone
    assert _digest(BENCHMARKS_MD) == before                   # docs/ untouched without --write

    md = tmp_path / "bench.md"
    rc = main(argv + ["--write", str(md), "--keep"])
    out = capsys.readouterr().out
    assert rc == 0 and "tiny_int8" in out and f"section of {md}" in out
    text = md.read_text()
    assert text.startswith("# Benchmarks\n\n## Boards (kiln bench)\n")
    assert "Produced by `kiln bench --models tiny_int8.json --boards mps2-an386 --optimize size --write`" in text
    (kept,) = os.listdir(private_tmp)
    assert f"build folder kept: {private_tmp / kept}" in out
    assert os.path.isdir(private_tmp / kept / "tiny_int8_mps2-an386_size" / "firmware" / "qemu")
    assert _digest(BENCHMARKS_MD) == before


def test_verify_on_a_board_removes_its_build_folder_unless_keep(capsys, tiny_int8, private_tmp, tmp_path):
    from kiln.frontend import load
    from kiln.targets import run_reference
    g = load(tiny_int8)
    x = np.random.default_rng(2).integers(-128, 128, (1, 16)).astype(np.int8)
    golden = tmp_path / "g.npz"
    np.savez(golden, in_0=x, out_0=run_reference(g, [(x,)])[0][0])
    argv = ["verify", tiny_int8, "--golden", str(golden), "--target", "mps2-an386", "--json"]
    rc, rep = _json(capsys, argv)
    assert rc == 0 and rep["ok"] and rep["build"] is None and os.listdir(private_tmp) == []
    rc, rep = _json(capsys, argv + ["--keep"])
    assert rc == 0 and rep["build"] and os.path.isdir(os.path.join(rep["build"], "firmware"))
    out = tmp_path / "build"
    rc, rep = _json(capsys, argv + ["-o", str(out)])
    assert rc == 0 and rep["build"] == str(out) and os.path.isdir(out / "package")


def test_build_folder_is_removed_unless_kept_or_named_by_the_error(private_tmp, tmp_path):
    with BuildFolder(None, False, "kiln_t_") as b:
        open(os.path.join(b.path, "f"), "w").close()
    assert b.temp and b.kept is None and os.listdir(private_tmp) == []
    with BuildFolder(None, True, "kiln_t_") as b:
        pass
    assert b.kept and os.path.isdir(b.kept)
    with pytest.raises(KilnError):
        with BuildFolder(None, False, "kiln_u_") as c:
            raise KilnError("something else went wrong")
    assert c.kept is None and not os.path.exists(c.path)
    with pytest.raises(KilnError):                           # QEMU's error names its logs: they stay
        with BuildFolder(None, False, "kiln_v_") as d:
            raise KilnError(f"QEMU still running (stderr: {d.path}/firmware/qemu/qemu.stderr)")
    assert d.kept == d.path and os.path.isdir(d.path)
    with BuildFolder(str(tmp_path / "mine"), False, "kiln_w_") as e:
        pass
    assert not e.temp and e.kept == str(tmp_path / "mine")  # a folder the user named is never removed


def test_bench_with_tflite_micro_semantics(capsys, shared_models, private_tmp):
    """--semantics tflm compiles a .tflite with TensorFlow Lite Micro's FULLY_CONNECTED arithmetic:
    the row says so and the board agrees with the reference that follows it."""
    ad01 = os.path.join(shared_models, "ad01_int8.tflite")
    rc, rep = _json(capsys, ["bench", "--models", ad01, "--boards", "mps2-an386", "--optimize", "size",
                             "--semantics", "tflm", "--json"])
    (row,) = rep["rows"]
    assert rc == 0 and row["semantics"] == "tflm" and row["bit_exact"] and row["instructions"] > 0, row
