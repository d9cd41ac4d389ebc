"""`kiln run --port` and `kiln verify` on a real-board code path: the fake board answers like
hardware with no QEMU plugin (DWT ticks, no instruction counts), serving a compiled package's C
run on the host. Outputs must be bit-exact, a wrong board answer a mismatch (exit 1), a link
fault an error naming the link (never "not bit-exact")."""
import json
import os

import numpy as np
import pytest

from kiln import hil
from kiln.cli import main
from kiln.frontend import Graph, QParams, TensorType
from tests.firmware import helpers


def _q(scale, zp):
    return QParams((scale,), (zp,))


def _dense_graph():
    rng = np.random.default_rng(3)
    g = Graph("one_in")
    g.add_input("x", TensorType((1, 40), "int8", _q(0.05, 3)))
    g.add_const("w", rng.integers(-127, 128, (12, 40)).astype(np.int8), QParams((0.01,), (0,)))
    g.add_const("b", rng.integers(-500, 500, 12).astype(np.int32))
    g.add_node("dense", ["x", "w", "b"], {"activation": "relu"}, name="y",
               out_type=TensorType((1, 12), "int8", _q(0.1, -128)))
    g.outputs = ["y"]
    return g


def _two_in_graph():
    """Two inputs, two outputs (TFLM's memory_footprint example is an ADD of two inputs)."""
    g = Graph("two_in")
    g.add_input("a", TensorType((1, 8, 8, 2), "int8", _q(0.05, 3)))
    g.add_input("b", TensorType((1, 8, 8, 2), "int8", _q(0.04, -2)))
    g.add_node("add", ["a", "b"], name="sum", out_type=TensorType((1, 8, 8, 2), "int8", _q(0.1, -3)))
    g.add_node("mul", ["a", "b"], name="prod", out_type=TensorType((1, 8, 8, 2), "int8", _q(0.2, 4)))
    g.outputs = ["sum", "prod"]
    return g


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    out = {}
    for name, g in (("one", _dense_graph()), ("two", _two_in_graph())):
        out[name] = str(hil.compile_model(g, "cortex-m4", str(tmp_path_factory.mktemp(name)), plot=False).path)
    return out


def _run(capsys, argv):
    rc = main(argv)
    return rc, capsys.readouterr().out


@pytest.fixture
def no_flash(monkeypatch):
    """The fake board stands in for a board already flashed with the image (there is no probe
    here to flash a real one with)."""
    from kiln.boards import target
    monkeypatch.setattr(target, "flash_image", lambda image, serial=None: None)


@pytest.mark.parametrize("model", ["one", "two"])
def test_kiln_run_port_against_the_fake_board(model, packages, capsys, tmp_path, no_flash):
    """A real board's path: its real image is built, the board answers with DWT ticks and no
    instruction counts. Was: ValueError ("Cannot specify ',' with 's'") after the inferences,
    the results lost, even with --json."""
    helpers.need_toolchain()
    pkg = packages[model]
    with hil.fake_board(pkg) as fb:
        base = ["run", pkg, "--board", "nucleo-l4r5zi", "--port", fb.url, "-o", str(tmp_path)]
        rc, text = _run(capsys, base + ["--inputs", "3"])
        assert rc == 0, text
        assert "3 samples" in text and "match (bit-exact" in text and "MISMATCH" not in text
        assert "time / inference:" in text and " n/a" in text     # DWT ticks, no instruction counts
        rc, text = _run(capsys, base + ["--inputs", "3", "--json"])
        rep = json.loads(text)
        assert rc == 0 and rep["ok"] and rep["bit_exact"] and rep["samples"] == 3 and not rep["emulated"]
        assert rep["instructions_per_inference"] is None and rep["timing"]["ms"] > 0
        assert all(p["ticks"] is not None and p["instructions"] is None for p in rep["per_layer"])
        assert rep["link_stats"]["frames_sent"] > 0
        rc, text = _run(capsys, base + ["--inputs", "0", "--json"])
        assert rc == 2 and "--inputs must be at least 1" in json.loads(text)["error"]   # a usage error
        assert fb.errors == []


def test_a_wrong_board_answer_is_a_mismatch(packages, capsys, tmp_path, no_flash):
    helpers.need_toolchain()
    with hil.fake_board(packages["one"], mode="wrong-answer") as fb:
        rc, text = _run(capsys, ["run", packages["one"], "--board", "nucleo-l4r5zi", "--port", fb.url,
                                 "-o", str(tmp_path), "--inputs", "2", "--json"])
    rep = json.loads(text)
    assert rc == 1 and rep["bit_exact"] is False and rep["mismatched_inputs"] == [0, 1]


@pytest.mark.parametrize("mode", ["ack-no-reply", "short-invoke", "reset-before-output"])
def test_a_link_fault_is_reported_as_a_link_fault(mode, packages, capsys, tmp_path, monkeypatch, no_flash):
    """A board that stops answering, or answers garbage, is an error naming the link (exit 2:
    infrastructure, not a failed check); a reset is survived (the transaction is redone) and
    the outputs are bit-exact."""
    helpers.need_toolchain()
    monkeypatch.setattr(hil, "invoke_budget", lambda man, board: 1.0)
    with hil.fake_board(packages["one"], mode=mode) as fb:
        rc, text = _run(capsys, ["run", packages["one"], "--board", "nucleo-l4r5zi", "--port", fb.url,
                                 "-o", str(tmp_path), "--inputs", "2", "--json"])
    rep = json.loads(text)
    if mode == "reset-before-output":
        assert rc == 0 and rep["bit_exact"] and rep["link_stats"]["restarts"] == 1
        return
    assert rc == 2 and rep["ok"] is False and "bit_exact" not in rep
    assert rep["error_type"] in ("DeviceTimeout", "DeviceProtocolError")
    assert fb.url in rep["error"] and "last bytes received" in rep["error"]


def test_verify_on_a_board_reports_a_link_fault_not_a_mismatch(packages, tmp_path, monkeypatch):
    helpers.need_toolchain()
    from kiln.boards.device import DeviceError
    from kiln.commands.verify import verify
    pkg = packages["one"]
    x = np.random.default_rng(0).integers(-128, 128, (1, 40)).astype(np.int8)
    gold = tmp_path / "g.npz"
    np.savez(gold, in_0=x, out_0=hil.reference_outputs(hil.package_graph(pkg), [x])[0])
    with hil.fake_board(pkg) as fb:
        rep = verify(pkg, str(gold), "mps2-an386", options={"port": fb.url, "out": str(tmp_path / "ok")})
        assert rep["ok"] and rep["matched"] == 1
    monkeypatch.setattr(hil, "invoke_budget", lambda man, board: 1.0)
    with hil.fake_board(pkg, mode="ack-no-reply") as fb:
        with pytest.raises(DeviceError, match="INVOKE acknowledged, but no reply"):
            verify(pkg, str(gold), "mps2-an386", options={"port": fb.url, "out": str(tmp_path / "bad")})


def test_run_on_board_takes_and_returns_one_array_per_input_and_output(packages, tmp_path):
    """hil.run_on_board: a sample is a list of arrays (one per input), a result likewise; a
    single-input model keeps taking and returning plain arrays."""
    helpers.need_toolchain()
    from kiln.backends.host import HostModel
    pkg = packages["two"]
    image, _ = hil.build_for_board(pkg, "mps2-an386", str(tmp_path))
    rng = np.random.default_rng(1)
    xs = [[rng.integers(-128, 128, (1, 8, 8, 2)).astype(np.int8) for _ in range(2)] for _ in range(2)]
    with hil.fake_board(pkg) as fb:
        res = hil.run_on_board(image, pkg, xs, port=fb.url)
        host = HostModel(pkg)
        for x, got in zip(xs, res.outputs):
            assert isinstance(got, list) and len(got) == 2
            for g, w in zip(got, host.run(*x)):
                assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w)
        with pytest.raises(Exception, match="takes 2 inputs"):
            hil.run_on_board(image, pkg, [xs[0][0]], port=fb.url)
    one = packages["one"]
    image1, _ = hil.build_for_board(one, "mps2-an386", str(tmp_path / "one"))
    x = rng.integers(-128, 128, (1, 40)).astype(np.int8)
    with hil.fake_board(one) as fb:
        res = hil.run_on_board(image1, one, [x, [x]], port=fb.url)
    ref = hil.reference_outputs(hil.package_graph(one), [x])[0]
    assert all(isinstance(o, np.ndarray) and np.array_equal(o, ref) for o in res.outputs)
    assert os.path.exists(os.path.join(one, "manifest.json"))


@pytest.mark.qemu
def test_verify_a_two_input_two_output_model_on_a_board(packages, tmp_path):
    """kiln verify on a board with golden pairs in_K_J / out_K_J: every input set by index,
    every output read by index, each compared bit-exactly."""
    helpers.need_qemu()
    from kiln.commands.verify import verify
    pkg = packages["two"]
    rng = np.random.default_rng(5)
    xs = [[rng.integers(-128, 128, (1, 8, 8, 2)).astype(np.int8) for _ in range(2)] for _ in range(3)]
    ref = hil.reference_outputs(hil.package_graph(pkg), xs)
    arrays = {}
    for k, (x, y) in enumerate(zip(xs, ref)):
        for j in range(2):
            arrays[f"in_{k}_{j}"], arrays[f"out_{k}_{j}"] = x[j], y[j]
    gold = tmp_path / "g.npz"
    np.savez(gold, **arrays)
    rep = verify(pkg, str(gold), "mps2-an386", options={"out": str(tmp_path / "b")})
    assert rep["ok"] and rep["matched"] == rep["pairs"] == 3
