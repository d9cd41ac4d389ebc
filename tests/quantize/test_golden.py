"""Bit-exactness of Kiln's int8 reference on the shared MLPerf Tiny models: every golden output
(LiteRT BUILTIN_REF) and every intermediate tensor LiteRT computes."""
import os

import numpy as np
import pytest

from kiln.commands.verify import verify
from kiln.frontend import run
from kiln.frontend.tflite_import import load_tflite

MODELS = ["kws_ref_model", "pretrainedResnet_quant", "vww_96_int8", "ad01_int8"]


@pytest.mark.parametrize("model", MODELS)
def test_golden_outputs_bit_exact(shared_models, model):
    g = load_tflite(os.path.join(shared_models, model + ".tflite"))
    z = np.load(os.path.join(shared_models, model + ".golden.npz"))
    for k in range(8):
        got = run(g, z[f"in_{k}"])[0]
        want = z[f"out_{k}"]
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want), f"{model} pair {k}: {int((got != want).sum())} elements differ"


@pytest.mark.parametrize("model", MODELS)
def test_verify_reference_target(shared_models, model):
    rep = verify(os.path.join(shared_models, model + ".tflite"), os.path.join(shared_models, model + ".golden.npz"),
                 "reference")
    assert rep["ok"] and rep["matched"] == 8


def test_verify_fails_on_a_wrong_golden(shared_models, tmp_path):
    z = dict(np.load(os.path.join(shared_models, "kws_ref_model.golden.npz")))
    z["out_3"] = z["out_3"].copy()
    z["out_3"][0, 0] += 1
    bad = tmp_path / "bad.npz"
    np.savez(bad, **z)
    rep = verify(os.path.join(shared_models, "kws_ref_model.tflite"), str(bad), "reference")
    assert not rep["ok"] and rep["matched"] == 7


@pytest.mark.parametrize("model", MODELS)
def test_every_intermediate_matches_litert(shared_models, model):
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    path = os.path.join(shared_models, model + ".tflite")
    g = load_tflite(path)
    it = interp.Interpreter(model_path=path, experimental_op_resolver_type=interp.OpResolverType.BUILTIN_REF,
                            experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    tmap = g.meta["tflite_tensors"]
    names = [n.name for n in g.nodes if n.name in tmap]
    assert len(names) >= min(12, len(g.nodes))
    z = np.load(os.path.join(shared_models, model + ".golden.npz"))
    for k in (0, 5):
        it.set_tensor(it.get_input_details()[0]["index"], z[f"in_{k}"])
        it.invoke()
        _, kept = run(g, z[f"in_{k}"], keep=names)
        for n in names:
            assert np.array_equal(kept[n], it.get_tensor(tmap[n])), f"{model} pair {k}: {n} differs"


def test_every_quantizable_op_has_an_int8_reference():
    from kiln.frontend.registry import OPS, QUANTIZABLE
    missing = [n for n, op in OPS.items() if QUANTIZABLE in op.props and op.int8_ref is None]
    assert not missing, f"ops marked quantizable without an int8_ref rule: {missing}"
