"""The CLI contract: --json prints one JSON object; failures exit non-zero with a clear error."""
import json
import os
import subprocess
import sys

import pytest

from kiln.cli import main


def _json(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_version_and_help():
    r = subprocess.run([sys.executable, "-m", "kiln", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("kiln ")
    r = subprocess.run([sys.executable, "-m", "kiln", "--help"], capture_output=True, text=True)
    for cmd in ("demo", "train", "quantize", "inspect", "compile", "build", "run", "verify", "bench", "boards"):
        assert cmd in r.stdout


def test_boards_json(capsys):
    rc, rep = _json(capsys, ["boards", "--json"])
    assert rc == 0 and rep["ok"]
    names = {b["name"] for b in rep["boards"]}
    assert {"mps2-an386", "mps3-an547", "nucleo-l4r5zi", "rpi-pico"} <= names


def test_unknown_board_is_an_error(capsys):
    rc, rep = _json(capsys, ["boards", "no-such-board", "--json"])
    assert rc == 2 and not rep["ok"] and "unknown board 'no-such-board'" in rep["error"]


def test_verify_reference_and_host_exit_codes(capsys, shared_models):
    m = os.path.join(shared_models, "kws_ref_model.tflite")
    g = os.path.join(shared_models, "kws_ref_model.golden.npz")
    for target in ("reference", "host"):
        rc, rep = _json(capsys, ["verify", m, "--golden", g, "--target", target, "--json"])
        assert rc == 0 and rep["ok"] and rep["matched"] == 8, target
    rc, rep = _json(capsys, ["verify", m, "--golden", g, "--target", "nowhere", "--json"])
    assert rc == 2 and "unknown target 'nowhere'" in rep["error"]


def test_verify_missing_golden(capsys, shared_models):
    rc, rep = _json(capsys, ["verify", os.path.join(shared_models, "kws_ref_model.tflite"), "--golden",
                             "/nonexistent.npz", "--json"])
    assert rc == 2 and "not found" in rep["error"]


@pytest.mark.qemu
def test_build_and_run_json(capsys, shared_models, tmp_path):
    m = os.path.join(shared_models, "kws_ref_model.tflite")
    rc, rep = _json(capsys, ["build", m, "--board", "mps2-an386", "-o", str(tmp_path / "b"), "--json"])
    assert rc == 0 and rep["sizes"]["flash_used"] > 0 and os.path.exists(rep["elf"])
    rc, rep = _json(capsys, ["run", os.path.join(str(tmp_path / "b"), "package"), "--board", "mps2-an386",
                             "--inputs", "2", "--json"])
    assert rc == 0 and rep["bit_exact"] and rep["instructions_per_inference"] > 0
    assert rep["macs"] == 2_656_768 and len(rep["per_layer"]) > 5


def test_build_too_large_for_board_names_overflow(shared_models, tmp_path):
    # ResNet-8 (~80 KB of weights) on a Pico whose flash we shrink to 64 KB: the build fails
    # and says by how many bytes
    import re

    from kiln import boards, hil
    text = (boards.BOARD_DIR / "rpi-pico.toml").read_text().replace('name = "rpi-pico"', 'name = "tiny-pico"')
    text = re.sub(r"(\[memory\.flash\][^\[]*?size\s*=\s*)[0-9_x]+", r"\g<1>0x10000", text, flags=re.S)
    (tmp_path / "tiny-pico.toml").write_text(text)
    board = boards.load_file(tmp_path / "tiny-pico.toml")
    with pytest.raises(Exception) as e:
        hil.build_for_board(os.path.join(shared_models, "pretrainedResnet_quant.tflite"), board, str(tmp_path / "t"))
    msg = str(e.value)
    assert "tiny-pico" in msg and re.search(r"overflowed by \d+ bytes", msg), msg


@pytest.mark.qemu
def test_demo_end_to_end_json(capsys, tmp_path):
    rc, rep = _json(capsys, ["demo", "--out", str(tmp_path), "--limit", "16", "--quiet", "--json"])
    assert rc == 0 and rep["ok"]
    assert rep["float_accuracy"] >= 0.9 and rep["host_c_bit_exact"] and rep["board_bit_exact"]
    assert rep["board_images"] == 16
    assert rep["latency"]["instructions_per_inference"] > 0 and rep["latency"]["per_layer"]
    assert rep["memory"]["arena_bytes"] > 0 and rep["memory"]["flash_bytes"] > 0
    for f in ("report.md", "report.json", "latency.png", "memory.png"):
        assert (tmp_path / f).exists(), f


def test_compile_optimize_size_vs_speed(capsys, shared_models, tmp_path):
    """--optimize size stores int8 weights everywhere; speed int16-packs small layers: more
    weight bytes, recorded in the manifest; an unknown value is rejected by argparse."""
    m = os.path.join(shared_models, "kws_ref_model.tflite")
    reps = {}
    for opt in ("size", "speed"):
        rc, reps[opt] = _json(capsys, ["compile", m, "-o", str(tmp_path / opt), "--no-plot", "--optimize", opt,
                                       "--json"])
        assert rc == 0 and reps[opt]["optimize"] == opt
        with open(tmp_path / opt / "manifest.json") as f:
            assert json.load(f)["optimize"] == opt
    assert reps["speed"]["weight_bytes"] > reps["size"]["weight_bytes"]
    r = subprocess.run([sys.executable, "-m", "kiln", "compile", m, "-o", str(tmp_path / "x"), "--optimize", "fast"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--optimize" in r.stderr


def test_no_command_exits_2_with_usage():
    r = subprocess.run([sys.executable, "-m", "kiln"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage: kiln" in r.stderr


def test_piped_output_closed_early_is_not_a_traceback():
    r = subprocess.run(f"{sys.executable} -m kiln boards | head -n 1", shell=True, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("board") and "Traceback" not in r.stderr
