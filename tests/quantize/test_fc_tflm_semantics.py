"""FULLY_CONNECTED with TensorFlow Lite Micro's semantics (the dense node's ``requant: "fixed"``,
``load_model(..., semantics="tflm")``): Kiln's reference equals TFLite Micro's interpreter bit for
bit on random int8 layers (per-tensor and per-channel weights, input zero points, effective scales
from ~1e-6 to above 1) and on 16x8 layers with int32 and int64 biases, and on MLPerf Tiny's
anomaly-detection model; the default (LiteRT's requantisation in double) stays bit-exact with the
model's LiteRT goldens."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.frontend import TensorType, load_model, run, semantics_of, with_semantics
from kiln.frontend.errors import SerializationError

from .litert_util import assert_same, q, single_op, tflm_run
from .test_litert_property import _dense_layer, i8

pytest.importorskip("tflite_micro.python.tflite_micro.runtime")
SETTINGS = dict(max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", 40)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
AD01 = "/work/shared/models/ad01_int8.tflite"
zp = st.integers(-128, 127)


def _tflm(g, feeds):
    """(Kiln's reference with TFLite Micro's semantics, its default, TFLite Micro's interpreter)."""
    from kiln.quantize.tflite_export import export_tflite
    want = tflm_run(export_tflite(g), feeds)[0]
    fixed = run(with_semantics(g, "tflm"), *feeds)[0]
    return fixed, run(g, *feeds)[0], want.reshape(fixed.shape)


@settings(**SETTINGS)
@given(b=st.integers(1, 3), k=st.integers(1, 200), nout=st.integers(1, 12), zin=zp, zout=zp,
       ls=st.floats(-9.0, 1.0), log_eff=st.floats(-20.0, 1.0), scales=st.sampled_from(["tensor", "same", "different"]),
       act=st.sampled_from(["none", "relu", "relu6"]), seed=st.integers(0, 2 ** 31))
def test_dense_int8_equals_tflm(b, k, nout, zin, zout, ls, log_eff, scales, act, seed):
    rng = np.random.default_rng(seed)
    in_s = 2.0 ** ls
    consts, out_q = _dense_layer(rng, "l", "x", k, nout, in_s, scales, log_eff, zout, act)
    g = single_op("dense", [("x", TensorType((b, k), "int8", q(in_s, zin)), None)] + consts,
                  {"activation": act}, out_q)
    got, _, want = _tflm(g, [i8(rng, (b, k))])
    assert_same(got, want, f"dense {scales} log2(eff)={log_eff:.2f} (TFLite Micro)")


@pytest.mark.parametrize("scales", ["tensor", "different"])
@pytest.mark.parametrize("log_eff", [-1.4, -6.1, -19.9, 0.7])
def test_dense_int8_many_outputs(scales, log_eff):
    """64 x 96 outputs over the int8 range: TFLite Micro's semantics give its interpreter's
    values, where LiteRT's (the default) differ from it on some of them."""
    rng = np.random.default_rng(abs(int(log_eff * 10)) + len(scales))
    k, nout, b = 48, 96, 64
    consts, out_q = _dense_layer(rng, "l", "x", k, nout, 2.0 ** -3, scales, log_eff, int(rng.integers(-128, 128)),
                                 "none")
    g = single_op("dense", [("x", TensorType((b, k), "int8", q(2.0 ** -3, 17)), None)] + consts,
                  {"activation": "none"}, out_q)
    got, default, want = _tflm(g, [i8(rng, (b, k))])
    assert_same(got, want, f"dense {scales} log2(eff)={log_eff} (TFLite Micro)")
    if -10 < log_eff < -1:  # (at ~1e-6 the bias alone sets every output; above 1/2 one rounding each)
        assert (default != want).any()    # the two semantics differ here: the option is what matches


@settings(**SETTINGS)
@given(b=st.integers(1, 3), k=st.integers(1, 40), nout=st.integers(1, 12), ls=st.floats(-9.0, 1.0),
       bias=st.sampled_from([None, "int32", "int64"]), act=st.sampled_from(["none", "relu", "relu6"]),
       seed=st.integers(0, 2 ** 31))
def test_dense_16x8_equals_tflm(b, k, nout, ls, bias, act, seed):
    """16x8: an int64 bias (or none) takes TFLite Micro's int64 accumulator and reduced multiplier,
    an int32 bias its int32 accumulator and the int8 multiplier."""
    rng = np.random.default_rng(seed)
    in_s = 2.0 ** ls
    w_s = float(2.0 ** rng.uniform(-9, -5))
    out_s = float(np.float32(in_s * w_s * np.sqrt(k) * 128 * 2.0 ** rng.uniform(-2, 2) / 4))
    inputs = [("x", TensorType((b, k), "int16", q(in_s)), None),
              ("w", TensorType((nout, k), "int8", q(w_s)), rng.integers(-127, 128, (nout, k)))]
    if bias:
        inputs.append(("b", TensorType((nout,), bias, q(float(np.float32(in_s) * np.float32(w_s)))),
                       rng.integers(-(1 << 22), 1 << 22, nout)))
    g = single_op("dense", inputs, {"activation": act}, q(out_s), out_dtype="int16")
    got, _, want = _tflm(g, [rng.integers(-32768, 32768, (b, k)).astype(np.int16)])
    assert_same(got, want, f"dense 16x8 bias {bias} (TFLite Micro)")


def _ad01_pairs():
    if not os.path.exists(AD01):
        pytest.skip(f"{AD01} not present")
    d = np.load(AD01.replace(".tflite", ".golden.npz"))
    return [((d[f"in_{k}"],), d[f"out_{k}"]) for k in range(8)]


def test_ad01_reference_follows_tflm_or_litert():
    """MLPerf Tiny's anomaly-detection model (ten FULLY_CONNECTED layers): with TFLite Micro's
    semantics the reference gives its interpreter's outputs on the 8 golden inputs; by default
    LiteRT's goldens, bit for bit."""
    from kiln import tflm
    from kiln.targets import run_reference
    pairs = _ad01_pairs()
    ins = [p[0] for p in pairs]
    want = tflm.run_tflm(AD01, ins)
    tg = load_model(AD01, semantics="tflm")
    assert semantics_of(tg) == "tflm" and all(n.attrs["requant"] == "fixed" for n in tg.nodes if n.op == "dense")
    for got, w in zip(run_reference(tg, ins), want):
        np.testing.assert_array_equal(got[0], w[0])
    g = load_model(AD01)
    assert semantics_of(g) == "litert"
    differ = 0
    for got, (_, gold), w in zip(run_reference(g, ins), pairs, want):
        np.testing.assert_array_equal(np.asarray(got[0]).reshape(gold.shape), gold)
        differ += int((np.asarray(got[0]).reshape(-1) != np.asarray(w[0]).reshape(-1)).sum())
    assert differ > 0                      # LiteRT's and TFLite Micro's answers differ on this model


def test_semantics_round_trip_and_errors(tmp_path):
    from kiln.frontend import save
    pairs = _ad01_pairs()
    g = load_model(AD01, semantics="tflm")
    p = save(g, str(tmp_path / "ad01.json"))
    back = load_model(p)
    assert semantics_of(back) == "tflm"                       # a saved graph keeps its semantics
    assert semantics_of(load_model(p, semantics="litert")) == "litert"
    plain = load_model(AD01)
    assert with_semantics(plain, "litert") is plain           # nothing to change: the same graph
    assert all(n.attrs["requant"] == "double" for n in plain.nodes if n.op == "dense")   # not modified
    np.testing.assert_array_equal(run(back, pairs[0][0][0])[0], run(g, pairs[0][0][0])[0])
    with pytest.raises(SerializationError, match="litert, tflm"):
        load_model(AD01, semantics="micro")


def test_quantize_cli_records_semantics(digits_model, tmp_path, capsys):
    """`kiln quantize --semantics tflm`: the int8 graph it writes follows TFLite Micro (its dense
    nodes requantise with the fixed-point multiplier) and says so; without it, LiteRT's."""
    import json

    from kiln.cli import main
    from kiln.frontend import save
    g, _ = digits_model
    src = save(g, str(tmp_path / "digits.json"))
    for sem in ("tflm", None):
        out = str(tmp_path / f"q_{sem}.json")
        rc = main(["quantize", src, "--data", "digits", "--calibration-size", "100", "--out", out, "--json"]
                  + (["--semantics", sem] if sem else []))
        rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert rc == 0 and rep["semantics"] == (sem or "litert")
        q8 = load_model(out)
        dense = [n for n in q8.nodes if n.op == "dense"]
        assert dense and semantics_of(q8) == (sem or "litert")
        assert all(n.attrs["requant"] == ("fixed" if sem else "double") for n in dense)
