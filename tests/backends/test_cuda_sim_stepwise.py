"""cuda_sim.stepwise: a CUDA package checked launch by launch on pocl, each plan step's kernels
against the step's unscheduled PrimFunc (groups.json, built for LLVM) on the same bytes."""
import json
import os
import shutil

import numpy as np
import pytest

import kiln
from benchmarks import cuda_sim_zoo
from kiln.backends import cuda, cuda_sim
from kiln.backends.cuda_plan import PlanSteps
from kiln.cli import main
from kiln.frontend import executor
from tests.backends.server_models import make

pytest.importorskip("pyopencl", reason="cuda-sim needs pyopencl (bash scripts/setup.sh --test installs it)")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    graph, inputs = cuda_sim_zoo.zoo_case("digits-cnn", 1, False)
    path = str(tmp_path_factory.mktemp("sw") / "digits")
    return cuda.compile(graph, path, check=False), graph, inputs


def test_digits_cnn_passes_stepwise(digits):
    pkg, _, inputs = digits
    r = cuda_sim.stepwise(pkg, inputs)
    assert r["ok"] and r["checked"] == r["steps"] == len(cuda.load_manifest(pkg).steps), r
    assert r["failing_step"] is None and r["worst_err"] <= cuda_sim.STEP_TOLERANCE["float32"]
    assert all(s["ok"] for s in r["per_step"])


@pytest.mark.parametrize("model,dtype", [("fc-autoencoder", "float16"), ("digits-cnn", "bfloat16")])
def test_half_training_step_passes_stepwise(tmp_path, model, dtype):
    """Half training steps agree with their unscheduled functions: fc-autoencoder's bias
    gradients in front of train-mode BatchNorm (exact zeros, float32 reordering noise relative to
    their own scale) are held to the sum of their terms' magnitudes (abs_inputs); digits-cnn's
    float32 sums of bfloat16 products to the bfloat16 bound (the narrowest dtype of the step)."""
    r = cuda_sim_zoo.run_case(model, "train", str(tmp_path), dtype=dtype, stepwise=True)
    assert r["ok"] and r["guards_clean"] and r["checked"] == r["steps"] > 20, {k: v for k, v in r.items()
                                                                                if k != "per_step"}
    assert r["worst_err"] <= r["worst_bound"]


def corrupted(pkg, dest, step, launch=0, factor=2):
    """A copy of ``pkg`` whose step ``step``'s launch ``launch`` covers 1/``factor`` of its grid,
    or of its block where the grid is one block (part of the output left unwritten: a lost tile)."""
    shutil.copytree(pkg, dest)
    with open(os.path.join(dest, "manifest.json")) as f:
        m = json.load(f)
    L = m["steps"][step]["launches"][launch]
    dims = L["grid"] if max(L["grid"]) > 1 else L["block"]
    axis = max(range(3), key=lambda i: dims[i])
    assert dims[axis] >= factor, L
    dims[axis] //= factor
    with open(os.path.join(dest, "manifest.json"), "w") as f:
        json.dump(m, f)
    return dest, L["kernel"]


def test_a_launch_that_covers_half_its_output_fails_at_its_step(digits, tmp_path):
    pkg, _, inputs = digits
    assert cuda_sim.stepwise(pkg, inputs)["ok"]
    bad, kernel = corrupted(pkg, str(tmp_path / "bad"), 1)
    r = cuda_sim.stepwise(bad, inputs)
    assert not r["ok"] and r["failing_step"] == 1 and kernel in r["failing_kernel"], r
    assert all(s["ok"] for s in r["per_step"][:1])     # the steps before it pass
    err = r["per_step"][1]["err"]
    assert err is None or err > 1e3 * r["per_step"][1]["bound"]      # None: NaN left unwritten
    json.dumps(r, allow_nan=False)


def test_kiln_verify_stepwise(digits, tmp_path, capsys):
    pkg, graph, inputs = digits
    model = str(tmp_path / "digits.json")
    kiln.save(graph, model)
    np.savez(tmp_path / "g.npz", in_0=inputs[0], out_0=executor.run(graph, *inputs)[0])
    rc = main(["verify", model, "--golden", str(tmp_path / "g.npz"), "--target", "cuda-sim", "--stepwise", "--json"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    sw = rep["stepwise"]
    assert rc == 0 and rep["ok"] and sw["ok"] and sw["checked"] == sw["steps"] > 0, rep
    bad, kernel = corrupted(pkg, str(tmp_path / "bad"), 0)
    rc = main(["verify", bad, "--golden", str(tmp_path / "g.npz"), "--target", "cuda-sim", "--stepwise", "--json"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 1 and not rep["ok"] and rep["stepwise"]["failing_kernel"] == [kernel], rep


def test_stepwise_needs_cuda_sim(tmp_path, capsys):
    np.savez(tmp_path / "g.npz", in_0=np.zeros(3, np.float32), out_0=np.zeros(3, np.float32))
    rc = main(["verify", str(tmp_path / "m.json"), "--golden", str(tmp_path / "g.npz"), "--target", "host",
               "--stepwise", "--json"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 2 and "--target cuda-sim" in rep["error"], rep


def test_int8_package_is_bit_exact_step_by_step(tmp_path):
    """An int8 package (MLPerf Tiny's FC autoencoder): every step's int8 / int32 results are
    compared bit-exactly (bound 0), and a lost tile in one of them is a failure."""
    model = "/work/shared/models/ad01_int8.tflite"
    if not os.path.exists(model):
        pytest.skip(f"{model} not found (the shared MLPerf Tiny models)")
    from kiln.frontend.loader import load_model
    pkg = cuda.compile(load_model(model), str(tmp_path / "i8"), arch="sm_80", check=None)
    x = np.load(model.replace(".tflite", ".golden.npz"))["in_0"]
    r = cuda_sim.stepwise(pkg, [x])
    assert r["ok"] and r["worst_err"] == 0 and all(s["bound"] == 0 for s in r["per_step"]), r
    bad, kernel = corrupted(pkg, str(tmp_path / "bad"), 3, launch=-1, factor=16)   # 64 of 128 outputs
    r = cuda_sim.stepwise(bad, [x])
    assert not r["ok"] and r["failing_step"] == 3 and kernel in r["failing_kernel"] and r["per_step"][3]["err"] != 0, r


def test_a_step_that_rounds_to_bfloat16_inside_is_held_to_the_bfloat16_bound(tmp_path):
    """A mixed-precision weight gradient may read float32 activations and round them to bfloat16
    itself before multiplying (mobilenet-v1-0.25's depthwise and pointwise weight gradients, a
    CNN's here): its float32 output is a sum of bfloat16 products, held to bfloat16's bound (it
    was held to float32's and failed at 5e-4 on mobilenet-v1-0.25)."""
    _, step, x, t = make("cnn")
    pkg = cuda.compile_train_step(step, str(tmp_path / "cnn"), dtype="bfloat16", check=False)
    m = cuda.load_manifest(pkg)
    plan = PlanSteps(pkg, m)
    inside = {st.step for st in m.steps
              if plan.half_dtypes(st) == {"bfloat16"} and {dt for dt, _ in plan.params(st)} == {"float32"}}
    assert inside, "no step of the CNN's bfloat16 step rounds float32 arguments to bfloat16 inside"
    r = cuda_sim.stepwise(pkg, [x, t])
    assert r["ok"], {k: v for k, v in r.items() if k != "per_step"}
    assert all(s["bound"] == cuda_sim.STEP_TOLERANCE["bfloat16"] for s in r["per_step"] if s["step"] in inside)
