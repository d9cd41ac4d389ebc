"""Hardware-in-the-loop for real models: the shared MLPerf Tiny models and the digits CNN,
compiled by Kiln and run on the boards given with --board (default mps2-an386, mps3-an547; a
real board with --port / --lab-map runs the same tests), bit-exact with the int8 reference."""
import os
import subprocess

import numpy as np
import pytest

from kiln import hil
from kiln.commands.verify import verify

pytestmark = pytest.mark.qemu


def _boards(config):
    from kiln import boards
    val = config.getoption("--board")
    if val == "all-emulated":
        return [b.name for b in boards.all_boards() if b.emulated]
    return [b for b in val.split(",") if b]


def pytest_generate_tests(metafunc):
    if "board" in metafunc.fixturenames:
        metafunc.parametrize("board", _boards(metafunc.config))


@pytest.fixture(scope="module")
def lab(request):
    port = request.config.getoption("--port")
    lm = request.config.getoption("--lab-map")
    lab_map = None
    if lm:
        from kiln.boards.labmap import load_lab_map
        lab_map = load_lab_map(lm)
    return {"port": port, "lab_map": lab_map}


@pytest.mark.parametrize("model", ["kws_ref_model", "pretrainedResnet_quant", "vww_96_int8", "ad01_int8"])
def test_shared_model_golden_pairs_on_board(model, board, shared_models, lab, tmp_path):
    rep = verify(os.path.join(shared_models, f"{model}.tflite"), os.path.join(shared_models, f"{model}.golden.npz"),
                 board, options={"out": str(tmp_path), **lab})
    assert rep["pairs"] == 8
    assert rep["ok"], [r for r in rep["results"] if not r["match"]][:2]


@pytest.fixture(scope="module")
def digits_int8():
    from kiln.quantize import ptq
    from kiln.training import train_digits
    from kiln.training.data import digits
    r = train_digits(seed=0, epochs=3)
    train, test = digits()
    q = ptq(r.graph, train.x[:256], int8_io=True)
    s = q.types[q.inputs[0]].quant
    xq = np.clip(np.round(test.x[:24] / s.scale[0]) + s.zero_point[0], -128, 127).astype(np.int8)
    return q, xq


def test_digits_cnn_on_board(digits_int8, board, lab, tmp_path):
    q, xq = digits_int8
    image, pkg_dir = hil.build_for_board(q, board, str(tmp_path))
    xs = [xq[0]] + list(xq)     # the first image twice: its instruction count must repeat exactly
    res = hil.run_on_board(image, pkg_dir, xs, port=lab["port"], lab_map=lab["lab_map"])
    ref = hil.reference_outputs(q, xs)
    for k, (a, b) in enumerate(zip(res.outputs, ref)):
        assert np.array_equal(a.reshape(-1), b.reshape(-1)), f"image {k}: board {a} != reference {b}"
    assert res.instruction_source in ("qemu-plugin", "timer-estimate", "timer")
    assert res.instructions[0] == res.instructions[1] > 0
    assert 0 < res.stack_used < res.stack_size
    assert [p["name"] for p in res.profile] and all(p["instructions"] for p in res.profile)


def test_verify_fails_on_a_wrong_golden(shared_models, tmp_path):
    z = dict(np.load(os.path.join(shared_models, "kws_ref_model.golden.npz")))
    z["out_3"] = z["out_3"].copy()
    z["out_3"][0, 5] ^= 1
    bad = tmp_path / "bad.npz"
    np.savez(bad, **z)
    rep = verify(os.path.join(shared_models, "kws_ref_model.tflite"), str(bad), "host")
    assert not rep["ok"] and rep["matched"] == 7
    assert rep["results"][3]["mismatches"][0]["index"] == [0, 5]


def test_real_boards_run_their_stand_in_only_without_hardware(tmp_path):
    """A real board's run uses its QEMU stand-in unless a port or a lab-map entry names real
    hardware; then the real image (the board's own memory map, UART and boot2) is built."""
    from kiln import boards, hil
    from kiln.boards.labmap import load_lab_map
    nucleo, an386 = boards.load("nucleo-l4r5zi"), boards.load("mps2-an386")
    assert hil.emulate_by_default(nucleo) is True
    assert hil.emulate_by_default(nucleo, port="/dev/ttyACM0") is False
    assert hil.emulate_by_default(an386) is False
    lab = tmp_path / "lab.toml"
    lab.write_text('[[board]]\nname = "nucleo-l4r5zi"\nport = "/dev/ttyACM0"\n')
    assert hil.emulate_by_default(nucleo, lab_map=load_lab_map(lab)) is False
    assert hil.emulate_by_default(boards.load("rpi-pico"), lab_map=load_lab_map(lab)) is True


def test_kiln_build_makes_the_real_image_of_a_real_board(capsys, shared_models, tmp_path):
    import json

    from kiln.cli import main
    m = os.path.join(shared_models, "kws_ref_model.tflite")
    for emulate, origin in ((False, 0x08000000), (True, 0x0)):
        argv = ["build", m, "--board", "nucleo-l4r5zi", "-o", str(tmp_path / str(emulate)), "--json"]
        assert main(argv + (["--emulate"] if emulate else [])) == 0
        rep = json.loads(capsys.readouterr().out)
        out = subprocess.run(["arm-none-eabi-nm", rep["elf"]], capture_output=True, text=True, check=True).stdout
        vec = next(int(line.split()[0], 16) for line in out.splitlines() if line.endswith(" kiln_vectors"))
        assert vec == origin, (emulate, hex(vec))
