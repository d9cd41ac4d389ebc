"""The oracle where LiteRT and TensorFlow Lite Micro differ (kiln/tflm.py): `kiln golden` and
`kiln run` ask TFLite Micro's interpreter for an integer LSTM (LiteRT's kernel differs from it by 1
in some outputs), LiteRT for everything else, Kiln's reference when tflite-micro is missing."""
import json
import os

import numpy as np
import pytest

from kiln import tflm
from kiln.cli import main
from kiln.commands.golden import resolve
from kiln.frontend.executor import run_stateful
from kiln.frontend.tflite_import import load_tflite
from kiln.litert import run_litert
from kiln.quantize.tflite_export import export_tflite
from kiln.samples import load_samples
from tests.frontend.test_ops_recurrent_lstm16 import upto

pytest.importorskip("tflite_micro.python.tflite_micro.runtime")
DATA = os.path.join(os.path.dirname(__file__), "..", "data", "tflm_mnist_lstm")


def _json(capsys, argv):
    rc = main(argv + ["--json"])
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def lstm_cut(tmp_path_factory):
    """TFLM's int8 mnist_lstm cut after its LSTM (exported by Kiln): the LSTM's own outputs, where
    LiteRT and TFLite Micro differ."""
    g = load_tflite(os.path.join(DATA, "trained_lstm_int8.tflite"))
    cut = upto(g, next(n for n in g.nodes if n.op == "lstm").name)
    path = tmp_path_factory.mktemp("cut") / "lstm_cut.tflite"
    path.write_bytes(export_tflite(cut))
    return str(path), load_tflite(str(path))      # its state tensors are variables: a stateful graph


def _inputs(n):
    return [(np.random.default_rng(s).integers(-128, 128, (1, 28, 28)).astype(np.int8),) for s in range(n)]


def test_auto_picks_tflm_for_an_integer_lstm_and_litert_otherwise(lstm_cut):
    oracle, why = resolve(lstm_cut[0])
    assert oracle == "tflm" and "int8 LSTM" in why
    assert resolve(os.path.join(DATA, "trained_lstm.tflite")) == ("litert", None)      # the float model
    assert resolve(lstm_cut[0], "litert") == ("litert", None)                           # asked for: kept


def test_golden_pairs_come_from_tflm_and_equal_kilns_reference(lstm_cut, tmp_path, capsys):
    path, cut = lstm_cut
    samples = _inputs(4)
    gold = str(tmp_path / "g.npz")
    rc, rep = _json(capsys, ["golden", path, "-o", gold, "--inputs", "4"])
    assert rc == 0 and rep["oracle"] == "tflm" and "LSTM" in rep["oracle_reason"]
    pairs = load_samples(gold, cut)
    assert cut.states                    # the LSTM's variable tensors: the samples are one stream
    want = tflm.run_tflm(path, pairs.inputs, stream=True)
    state = {}
    for (y,), x, (t,) in zip(pairs.targets, pairs.inputs, want):
        np.testing.assert_array_equal(y, t)
        np.testing.assert_array_equal(run_stateful(cut, state, *x)[0], t)
    # the choice matters: LiteRT's LSTM is 1 off somewhere on these inputs
    lite = run_litert(path, samples, stream=True)
    ours = tflm.run_tflm(path, samples, stream=True)
    assert any((a[0] != b[0]).any() for a, b in zip(lite, ours))


def test_without_tflite_micro_the_reference_is_the_oracle(lstm_cut, monkeypatch):
    monkeypatch.setattr(tflm, "available", lambda: False)
    oracle, why = tflm.oracle_for(lstm_cut[0])
    assert oracle == "reference" and "tflite-micro" in why


def test_tflm_stream_keeps_state_and_reset_clears_it(lstm_cut):
    """Without ``stream`` every sample starts from a reset interpreter: the same input gives the
    same output whatever came before; with it the state carries (as Kiln's reference)."""
    path, cut = lstm_cut
    a, b = _inputs(2)
    first = tflm.run_tflm(path, [a])[0][0]
    np.testing.assert_array_equal(first, tflm.run_tflm(path, [b, a])[1][0])
    carried = tflm.run_tflm(path, [b, a], stream=True)[1][0]
    assert (carried != first).any()
    state = {}
    run_stateful(cut, state, *b)
    np.testing.assert_array_equal(run_stateful(cut, state, *a)[0], carried)


def test_unloadable_model_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(tflm.TflmError, match="cannot load"):
        tflm.run_tflm(str(bad), [])


@pytest.mark.slow
@pytest.mark.qemu
def test_kiln_run_checks_an_int8_lstm_against_tflm(lstm_cut, capsys):
    rc, rep = _json(capsys, ["run", lstm_cut[0], "--board", "mps2-an386", "--inputs", "2"])
    assert rc == 0 and rep["ok"] and rep["bit_exact"], rep["checks"]
    assert rep["compared_against"] == ["Kiln's reference executor", "TensorFlow Lite Micro's interpreter"]
    assert "LSTM" in rep["litert_skipped"]


@pytest.mark.parametrize("name", ["quantize0", "sub4", "transpose_conv4"])
def test_tflm_runs_models_whose_activations_outweigh_their_weights(name):
    """TFLite Micro's seanet models whose tensors need more than the pip package's default arena
    (ten times the file: "Failed to resize buffer") run with kiln.tflm.arena_bytes, equal to Kiln's
    reference."""
    path = os.path.join(os.path.dirname(__file__), "..", "data", "seanet16", f"{name}.tflite")
    g = load_tflite(path)
    with open(path, "rb") as f:
        data = f.read()
    assert tflm.arena_bytes(data) > 10 * len(data)
    rng = np.random.default_rng(0)
    xs = []
    for v in g.inputs:
        t = g.types[v]
        info = np.iinfo(t.dtype)
        xs.append(rng.integers(max(int(info.min), -30000), min(int(info.max), 30000) + 1, size=t.shape).astype(t.dtype))
    got, = tflm.run_tflm(path, [tuple(xs)])
    want = run_stateful(g, {}, *xs)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a).reshape(-1), np.asarray(b).reshape(-1))
