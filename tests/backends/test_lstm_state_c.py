"""A stateful LSTM through the C backend: the output and cell states in model.c's own buffers,
carried from one kiln_model_run to the next and reset by kiln_reset_state(); float within 1e-6 of
the reference over a stream on the host, and streams on the emulated mps2-an386 (float, int8 and
16x8) equal to the reference, itself bit-exact with TensorFlow Lite Micro
(tests/frontend/test_lstm_state.py). The sequence lstm and its cell twin (the next c0) are one
command: the recurrence runs once."""
import json

import numpy as np
import pytest

import kiln
from kiln.backends import compile as compile_pkg
from kiln.quantize import ptq
from kiln.quantize.tflite_export import export_tflite
from tests.frontend.test_lstm_state import kiln_stream, lstm_model, stream, tflm_stream


def test_float_host_c_carries_the_state_and_resets(tmp_path):
    g = lstm_model(2, 3, head=True)
    pkg = compile_pkg(g, target="host", out_dir=str(tmp_path), plot=False, measure_size=False)
    man = json.load(open(tmp_path / "manifest.json"))
    assert man["state_bytes"] == 2 * (2 * 5 * 4) and len(man["states"]) == 2
    xs = stream((2, 3, 3), 5, 4)
    want = kiln_stream(g, xs)
    got = [pkg.run(x)[0] for x in xs]
    for k, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=f"invocation {k}")
    pkg.reset_state()
    np.testing.assert_allclose(pkg.run(xs[0])[0], want[0], rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.qemu
@pytest.mark.parametrize("acts", ["float32", "int8", "int16"])
def test_lstm_stream_on_board(acts, tmp_path):
    """`kiln golden` writes a stream (the state carried from pair to pair) and `kiln verify` runs
    it on a freshly booted mps2-an386: every output equal (float: within the verifier's
    tolerance). For int8 and 16x8 the stream is TensorFlow Lite Micro's too."""
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    from kiln.frontend.tflite_import import load_tflite
    from tests.firmware.helpers import need_qemu, need_toolchain
    need_toolchain()
    need_qemu()
    g = lstm_model(1, 2)            # the LSTM's own output: TFLM's 16x8 dense differs from LiteRT's
    if acts != "float32":
        g = ptq(g, np.random.default_rng(2).standard_normal((96, 2, 3)).astype(np.float32), int8_io=True,
                activations=acts)
    path = tmp_path / "lstm.tflite"
    path.write_bytes(export_tflite(g))
    xs = stream((1, 2, 3), 5, 6, acts)
    if acts != "float32":
        ref = kiln_stream(load_tflite(str(path)), xs)
        assert all(np.array_equal(a, b) for a, b in zip(ref, tflm_stream(path.read_bytes(), xs)))
    gold = str(tmp_path / "g.npz")
    golden(str(path), gold, [(x,) for x in xs], oracle="reference")
    rep = verify(str(path), gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 5, rep["results"]


@pytest.mark.parametrize("acts", ["float32", "int8", "int16"])
def test_the_recurrence_runs_once(acts, tmp_path):
    """The sequence lstm and its cell twin (the next c0) are one command whose kernel writes both
    outputs: one recurrence's MACs, the final cell state a second output parameter, and the
    host C stream equal to the reference (float within 1e-6)."""
    g = lstm_model(2, 3, head=True)
    if acts != "float32":
        g = ptq(g, np.random.default_rng(2).standard_normal((96, 3, 3)).astype(np.float32), int8_io=True,
                activations=acts)
    seq = next(n for n in g.nodes if n.op == "lstm" and n.attrs["output"] == "sequence")
    twin = g.producer(g.states[seq.inputs[14]])
    pkg = compile_pkg(g, target="host", out_dir=str(tmp_path), plot=False, measure_size=False)
    man = json.load(open(tmp_path / "manifest.json"))
    lstm = [c for c in man["commands"] if "lstm" in c["ops"].split("+")]
    assert len(lstm) == 1, [c["ops"] for c in man["commands"]]
    assert lstm[0]["nodes"] == [seq.name, twin.name] and lstm[0]["name"] == seq.name
    assert lstm[0]["macs"] == 2 * 3 * 4 * 5 * (3 + 5)          # N T 4 H (I + H): once
    xs = stream((2, 3, 3), 5, 4, acts)
    want = kiln_stream(g, xs)
    for k, x in enumerate(xs):
        got = pkg.run(x)[0]
        if acts == "float32":
            np.testing.assert_allclose(got, want[k], rtol=0, atol=1e-6, err_msg=f"invocation {k}")
        else:
            assert np.array_equal(got, want[k]), f"invocation {k}"


@pytest.mark.parametrize("twin_first", [False, True])
def test_a_final_cell_output_shares_the_kernel(twin_first, tmp_path):
    """A graph returning an LSTM's sequence and its final cell state (no graph state) runs one
    kernel for both, where the first of the two stands; a cell node with another cell clip is
    not the twin and keeps its own."""
    from kiln.frontend.ops.recurrent import LSTM_INPUTS
    from tests.frontend.test_lstm_state import _lstm_graph
    g = _lstm_graph(variable_like=False)
    g.add_node("lstm", list(LSTM_INPUTS), {"output": "cell", "cell_clip": 0.5}, name="c_clip")
    g.add_node("lstm", list(LSTM_INPUTS), {"output": "cell"}, name="c_T")
    if twin_first:
        g.nodes = g.nodes[::-1]
    g.outputs = ["y", "c_T", "c_clip"]
    pkg = compile_pkg(g.validate(), target="host", out_dir=str(tmp_path), plot=False, measure_size=False)
    man = json.load(open(tmp_path / "manifest.json"))
    assert [c["nodes"] for c in man["commands"]] == [["y", "c_T"], ["c_clip"]]
    x = stream((1, 2, 3), 1, 6)[0]
    for got, want in zip(pkg.run(x), kiln.run(g, x)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_a_kernel_must_write_what_its_group_covers():
    """A group whose rule leaves one of its outputs unwritten is a LoweringError naming it."""
    from kiln.backends.cpus import get as get_target
    from kiln.backends.lower import LoweringError, lower_group
    from kiln.backends.passes import Group, constants
    g = lstm_model(1, 2)
    seq, twin, sl = g.nodes[0], g.nodes[1], g.nodes[2]
    with pytest.raises(LoweringError, match=f"did not write '{sl.name}'"):
        lower_group(g, Group([seq, sl], seq.name, [sl.name]), get_target("host"), constants(g), "k")
    assert twin.attrs["output"] == "cell"
