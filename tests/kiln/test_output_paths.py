"""Outputs of compile/build/run: a package appears whole or not at all (a full disk leaves nothing
behind), bad paths and bad counts are usage errors (exit 2), and a board's RAM check counts
everything the board keeps in RAM, not only the arena."""
import errno
import json
import os
import re

import numpy as np
import pytest

from kiln import boards, hil
from kiln.backends import emit, manifest
from kiln.backends.pipeline import BudgetError
from kiln.cli import main
from kiln.frontend import Graph, TensorType, files, save


def _json(capsys, argv):
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture
def tiny_model(tmp_path):
    g = Graph("tiny")
    g.add_input("x", TensorType((1, 256)))
    g.add_const("w", np.ones((256, 256), np.float32))
    g.add_node("dense", ["x", "w"], {"activation": "relu"}, name="d")
    g.outputs = ["d"]
    return save(g, str(tmp_path / "models" / "tiny.json"))


def _compile(out, model):
    return ["compile", model, "--target", "host", "-o", str(out), "--no-plot", "--json"]


def _leftovers(parent):
    return [n for n in os.listdir(parent) if n.endswith(".partial") or n.endswith(".tmp")]


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), a[0] if a else None)


@pytest.mark.parametrize("victim", ["kernels.c", "manifest.json", "graph.json"])
def test_a_full_disk_during_compile_leaves_no_package(capsys, tmp_path, tiny_model, monkeypatch, victim):
    real_open = open

    def open_(path, *a, **k):
        if os.path.basename(str(path)).startswith(victim):
            _enospc(path)
        return real_open(path, *a, **k)
    monkeypatch.setattr(emit, "open", open_, raising=False)         # kernels.c
    monkeypatch.setattr(manifest, "open", open_, raising=False)     # manifest.json
    monkeypatch.setattr(files, "open", open_, raising=False)        # graph.json (atomic_write)
    from kiln.backends import pipeline
    monkeypatch.setattr(pipeline, "open", open_, raising=False)
    out = tmp_path / "pkg"
    rc, rep = _json(capsys, _compile(out, tiny_model))
    assert rc == 2 and rep["error_type"] == "OutputError", rep
    assert "No space left on device; the disk is full" in rep["error"] and str(out) in rep["error"]
    assert not out.exists() and not _leftovers(tmp_path)


def test_a_failed_compile_leaves_the_previous_package_as_it_was(capsys, tmp_path, tiny_model, monkeypatch):
    out = tmp_path / "pkg"
    assert _json(capsys, _compile(out, tiny_model))[0] == 0
    (out / "notes.txt").write_text("mine")                           # a user's file in the package folder
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(emit, "open", lambda p, *a, **k: _enospc(p), raising=False)
    assert _json(capsys, _compile(out, tiny_model))[0] == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and not _leftovers(tmp_path)
    monkeypatch.undo()
    rc, rep = _json(capsys, _compile(out, tiny_model))                # a new package replaces the old one
    assert rc == 0 and (out / "notes.txt").read_text() == "mine" and (out / "graph.json").exists()
    assert json.loads((out / "manifest.json").read_text())["model"] == "tiny" and not _leftovers(tmp_path)


def test_compile_output_paths_are_checked(capsys, tmp_path, tiny_model):
    f = tmp_path / "afile"
    f.write_text("keep me")
    rc, rep = _json(capsys, _compile(f, tiny_model))
    assert rc == 2 and "package folder" in rep["error"] and "is an existing file, not a folder" in rep["error"]
    assert f.read_text() == "keep me"
    rc, rep = _json(capsys, _compile(f / "pkg", tiny_model))          # a file where a folder should be
    assert rc == 2 and rep["error_type"] == "OutputError"
    if os.path.isdir("/proc/1"):                                      # nobody, root included, may create files here
        rc, rep = _json(capsys, _compile("/proc/1/pkg", tiny_model))
        assert rc == 2 and rep["error_type"] == "OutputError" and "/proc/1/pkg" in rep["error"]


def test_a_read_only_package_folder_is_refused(capsys, tmp_path, tiny_model):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: a read-only mode does not stop writes (test_compile_output_paths_are_checked "
                        "covers /proc/1)")
        rc, rep = _json(capsys, _compile(ro, tiny_model))
        assert rc == 2 and "Permission denied" in rep["error"] and not list(ro.iterdir())
    finally:
        ro.chmod(0o755)


def test_build_output_that_is_a_file_and_bad_stack_size(capsys, tmp_path, tiny_model):
    f = tmp_path / "afile"
    f.write_text("keep me")
    rc, rep = _json(capsys, ["build", tiny_model, "--board", "mps2-an386", "-o", str(f), "--json"])
    assert rc == 2 and "output folder (-o)" in rep["error"] and "existing file" in rep["error"]
    with pytest.raises(SystemExit) as e:
        main(["build", tiny_model, "--board", "mps2-an386", "--stack-size", "0"])
    assert e.value.code == 2


@pytest.mark.parametrize("n", ["0", "-3", "two"])
def test_run_inputs_must_be_a_positive_count(capsys, tiny_model, n):
    """--inputs 0 used to 'run' nothing and exit 0; -3 too."""
    try:
        code = main(["run", tiny_model, "--board", "mps2-an386", "--inputs", n])
    except SystemExit as e:     # argparse: not a number
        code = e.code
    assert code == 2 and "--inputs" in capsys.readouterr().err


def test_board_ram_check_counts_buffers_and_stack(tmp_path, tiny_model):
    """A 6 KiB-RAM board: the 2 KiB arena alone fits (the old check let it through to the linker),
    but with the 1 KiB input and output buffers and the 8 KiB stack the board needs 12 KiB."""
    text = (boards.BOARD_DIR / "mps2-an386.toml").read_text().replace('name = "mps2-an386"', 'name = "tiny-ram"')
    text = re.sub(r"(\[memory\.ram\][^\[]*?size\s*=\s*)[0-9_x]+", r"\g<1>0x1800", text, flags=re.S)
    (tmp_path / "tiny-ram.toml").write_text(text)
    board = boards.load_file(tmp_path / "tiny-ram.toml")
    with pytest.raises(BudgetError) as e:
        hil.build_for_board(tiny_model, board, str(tmp_path / "b"), stack_size=8192)
    msg = str(e.value)
    m = re.search(r"needs ([\d,]+) B of RAM \(arena ([\d,]+) B \+ input buffer 1,024 B \+ output buffer 1,024 B "
                  r"\+ stack 8,192 B; the firmware's own .data/.bss come on top, checked when linking\) does not fit the RAM budget of 6144 B \(over by (\d+) B\)", msg)
    assert m, msg
    need, arena, over = (int(g.replace(",", "")) for g in m.groups())
    assert arena <= 6144 and need == arena + 1024 + 1024 + 8192 and over == need - 6144
    assert not (tmp_path / "b" / "package").exists() and not _leftovers(tmp_path / "b")


def test_demo_logs_have_no_progress_bars_and_readable_stage_times():
    from kiln.commands import demo
    from kiln.report import stage_times
    assert demo._bar(10, "images", quiet=False) is None          # pytest's stderr is not a terminal
    times = {"train the digits CNN on the host": 6.14, "quantise to int8 (PTQ)": 0.4}
    assert stage_times(times) == "train 6.1 s, quantise 0.4 s"
    assert stage_times(times, short=False) == "- train the digits CNN on the host: 6.1 s\n- quantise to int8 (PTQ): 0.4 s"
