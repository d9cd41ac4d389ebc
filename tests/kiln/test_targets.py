"""Verification targets (kiln/targets.py) built from the one registry of backends: `kiln verify
--target` and `kiln run --target` on reference, host, host-llvm and cuda-plan; unknown names."""
import json
import os

import numpy as np
import pytest

import kiln
from kiln.cli import main
from kiln.frontend import executor
from kiln.targets import BACKEND_TARGETS, get_target, target_names
from tests.backends.server_models import make


def _json(capsys, argv):
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def mlp_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlp")
    fwd, _, x, _ = make("mlp")
    kiln.save(fwd, str(d / "mlp.json"))
    xs = [x, x * 0.5]
    np.savez(d / "golden.npz", **{f"in_{k}": v for k, v in enumerate(xs)},
             **{f"out_{k}": executor.run(fwd, v)[0] for k, v in enumerate(xs)})
    return str(d / "mlp.json"), str(d / "golden.npz")


def test_target_names():
    assert list(BACKEND_TARGETS) == ["reference", "host", "host-llvm", "cuda", "cuda-sim", "cuda-plan"]
    assert "mps2-an386" in target_names() and get_target("mps2-an386").exact
    with pytest.raises(kiln.KilnError, match=r"unknown target 'nowhere'; available: cuda, cuda-plan, cuda-sim, host"):
        get_target("nowhere")


@pytest.mark.parametrize("target", ["reference", "host", "host-llvm", "cuda-plan"])
def test_verify_a_float_model(capsys, tmp_path, mlp_files, target):
    model, golden = mlp_files
    rc, rep = _json(capsys, ["verify", model, "--golden", golden, "--target", target, "-o", str(tmp_path), "--json"])
    assert rc == 0 and rep["ok"] and rep["matched"] == rep["pairs"] == 2, rep


@pytest.mark.parametrize("target", ["host", "host-llvm", "cuda-plan"])
def test_run_on_a_backend_target(capsys, mlp_files, target):
    rc, rep = _json(capsys, ["run", mlp_files[0], "--target", target, "--inputs", "2", "--json"])
    assert rc == 0 and rep["ok"] and rep["target"] == target and rep["samples"] == 2
    assert rep["max_abs_err"] <= BACKEND_TARGETS[target].atol and rep["build"] is None


def test_run_an_int8_model_on_the_host_is_bit_exact(capsys, shared_models):
    m = os.path.join(shared_models, "kws_ref_model.tflite")
    rc, rep = _json(capsys, ["run", m, "--target", "host", "--inputs", "2", "--json"])
    assert rc == 0 and rep["ok"] and rep["max_abs_err"] == 0 and rep["comparison"].startswith("bit-exact (integer outputs)")


def test_run_unknown_target_is_a_usage_error(capsys, mlp_files):
    rc, rep = _json(capsys, ["run", mlp_files[0], "--target", "tpu", "--json"])
    assert rc == 2 and "--target 'tpu'" in rep["error"] and "host-llvm" in rep["error"]


def test_cuda_tolerance_follows_the_package_dtype(capsys, tmp_path, mlp_files):
    """A float16 package is compared within float16's tolerance (1e-4 always failed it)."""
    model, golden = mlp_files
    pkg = str(tmp_path / "pkg16")
    assert main(["compile", model, "--target", "cuda", "--dtype", "float16", "-o", pkg]) == 0
    capsys.readouterr()
    assert get_target("cuda-plan").tolerance(pkg) == 3e-2 and get_target("cuda").tolerance(model) == 1e-4
    rc, rep = _json(capsys, ["verify", pkg, "--golden", golden, "--target", "cuda-plan", "--json"])
    assert rc == 0 and rep["ok"] and rep["comparison"] == "within atol 0.03 (x (1 + |expected|))", rep
