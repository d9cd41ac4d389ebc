"""kiln verify --float64: a float model or its training step as a CUDA package on cuda-sim against
the same graph computed in float64 (kiln/commands/verify64.py, cuda_sim.check64)."""
import json

import numpy as np
import pytest

import kiln
from kiln.cli import main
from kiln.commands.verify64 import text
from tests.backends.server_models import make

pytest.importorskip("pyopencl", reason="cuda-sim needs pyopencl (bash scripts/setup.sh --test installs it)")


def _json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_zoo_inference_against_float64(capsys):
    rc = main(["verify", "digits-cnn", "--target", "cuda-sim", "--float64", "--json"])
    rep = _json(capsys)
    assert rc == 0 and rep["ok"] and rep["guards_clean"] and rep["case"] == "inference" and rep["batch"] == 1, rep
    (out,) = rep["outputs"]
    assert out["ok"] and out["error"] < out["bound"] == 1e-4 and out["rounding_floor"] is None
    assert rep["beyond_float64"] == [] and rep["stepwise"] is None


def test_half_training_step_against_float64_names_its_gradients(capsys):
    rc = main(["verify", "digits-cnn", "--target", "cuda-sim", "--float64", "--train-step", "--dtype", "float16",
               "--json"])
    rep = _json(capsys)
    assert rc == 0 and rep["ok"] and rep["case"] == "training step" and rep["batch"] == 64, rep
    grads = {o["gradient_of"] for o in rep["outputs"] if "gradient_of" in o}
    assert grads == {"0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias"}, grads
    assert all(o["ok"] and o["rounding_floor"] is not None for o in rep["outputs"])
    assert "gradient of" in text(rep) and text(rep).endswith("OK")


def test_model_file_and_its_errors(tmp_path, capsys, shared_models):
    fwd, _, _, _ = make("mlp")
    model = str(tmp_path / "mlp.json")
    kiln.save(fwd, model)
    assert main(["verify", model, "--target", "cuda-sim", "--float64", "--dtype", "bfloat16", "--json"]) == 0
    rep = _json(capsys)
    assert rep["ok"] and rep["dtype"] == "bfloat16" and rep["outputs"][0]["bound"] >= 1e-1, rep
    for argv, words in [
        (["verify", model, "--target", "host", "--float64"], "--target cuda-sim"),
        (["verify", model, "--target", "cuda-sim"], "--golden"),
        (["verify", model, "--target", "cuda-sim", "--train-step"], "add --float64"),
        (["verify", model, "--target", "cuda-sim", "--float64", "--golden", "g.npz"], "drop --golden"),
        (["verify", model, "--target", "cuda-sim", "--float64", "--batch", "3"], "drop --batch"),
        (["verify", f"{shared_models}/ad01_int8.tflite", "--target", "cuda-sim", "--float64"], "bit for bit"),
        (["verify", f"{shared_models}/ad01_int8.tflite", "--target", "cuda-sim", "--float64", "--train-step"],
         "not a model this can train"),        # was a traceback from the .py model loader
    ]:
        assert main(argv + ["--json"]) == 2, argv
        assert words in _json(capsys)["error"], argv


def test_a_wrong_package_fails(tmp_path, monkeypatch, capsys):
    """A package whose kernel computes the wrong thing fails the float64 check (exit 1): the
    compiled graph's dense weights negated behind the check's back."""
    from kiln.backends import cuda

    real = cuda.compile

    def wrong(graph, out_dir, **kw):
        g = graph.copy()
        g.params = {k: -v if v.ndim == 2 else v for k, v in g.params.items()}
        return real(g, out_dir, **kw)
    monkeypatch.setattr(cuda, "compile", wrong)
    rc = main(["verify", "digits-cnn", "--target", "cuda-sim", "--float64", "--json"])
    rep = _json(capsys)
    assert rc == 1 and not rep["ok"] and not rep["outputs"][0]["ok"], rep
    assert np.isfinite(rep["max_err"]) and rep["max_err"] > 1e3 * rep["outputs"][0]["bound"]
