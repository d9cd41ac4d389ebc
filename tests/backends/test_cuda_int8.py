"""int8 graphs on CUDA (backends/cuda_int8.py): the shared MLPerf Tiny int8 models compile to CUDA
packages that NVRTC compiles for sm_80 and sm_90, and their scheduled kernels, run on pocl with
the package's own launch plan (cuda-sim), match LiteRT's reference outputs bit for bit; on a GPU
(``@pytest.mark.gpu``) the same packages run with CuPy."""
import json
import os

import numpy as np
import pytest
import tvm
from tvm import te

from kiln.backends import cuda, cuda_int8, nvrtc
from kiln.cli import main
from kiln.frontend.errors import KilnError
from kiln.frontend.loader import load_model
from kiln.frontend.ops.nn import fc_requantize
from kiln.frontend.types import QParams, TensorType

MODELS = "/work/shared/models"
SMALL = "ad01_int8"                                            # FC autoencoder: compiles in seconds
BIG = ["kws_ref_model", "pretrainedResnet_quant", "vww_96_int8"]


def _model(name):
    path = os.path.join(MODELS, f"{name}.tflite")
    if not os.path.exists(path):
        pytest.skip(f"{path} not found (the shared MLPerf Tiny models)")
    return path


def _golden(name):
    g = np.load(os.path.join(MODELS, f"{name}.golden.npz"))
    return [(g[f"in_{k}"], g[f"out_{k}"]) for k in range(8)]


def _sim(pkg, name):
    pytest.importorskip("pyopencl", reason="cuda-sim needs pyopencl (bash scripts/setup.sh --test installs it)")
    from kiln.backends import cuda_sim
    try:
        sim = cuda_sim.Simulator(pkg)
    except cuda_sim.SimUnavailable as e:
        pytest.skip(str(e))
    for k, (x, want) in enumerate(_golden(name)):
        got = sim(x)[0]
        assert got.dtype == np.int8 and got.shape == tuple(cuda.load_manifest(pkg).outputs[0].shape)
        np.testing.assert_array_equal(got.reshape(want.shape), want, err_msg=f"{name} golden pair {k}")


@pytest.fixture(scope="module")
def small_pkg(tmp_path_factory):
    return cuda.compile(load_model(_model(SMALL)), str(tmp_path_factory.mktemp("i8") / SMALL), arch="sm_80",
                        check=None)


# ---- the requantisation of FULLY_CONNECTED ------------------------------------------------------
def _requant_func(eff, zy, lo, hi):
    """fc_double_epilogue as a CPU function over an int32 vector, one channel of ``eff``."""
    class K:
        def const(self, tag, array):
            self.array = np.asarray(array)
            return te.placeholder(self.array.shape, str(self.array.dtype), name=tag)
    q = lambda s: QParams([s], [0])   # noqa: E731
    tx = TensorType((1, 8), "int8", QParams([1.0], [0]))
    tw = TensorType((1, 8), "int8", q(eff))
    ty = TensorType((1, 1), "int8", QParams([1.0], [zy]))
    acc = te.placeholder((64, 1), "int32", name="acc")
    k = K()
    y = cuda_int8.fc_double_epilogue(k, acc, tx, tw, ty, 1, "none")
    eff_t = [t for t in y.op.input_tensors if t.op.name == "fc_eff"][0]
    f = tvm.tirx.build(te.create_prim_func([acc, eff_t, y]), target="llvm")
    return f, k.array


def test_fc_requantisation_rounds_like_litert_at_ties_and_extremes():
    """round(double(acc) * eff), ties away from zero: products exactly at .5 (both signs), just
    beside it, and |acc| up to 2^31 - 1 with a large eff (saturating) match fc_requantize."""
    for eff in (0.5, 0.25, 0.0123456789, 3.0517578125e-05, 0.999999, 37.5):
        f, effs = _requant_func(eff, 0, -128, 127)
        acc = np.array([1, -1, 3, -3, 5, -5, 2 ** 31 - 1, -2 ** 31, 0, 81, -81, 7, -7, 1000003, -1000003, 255]
                       + list(range(-24, 24)), np.int32).reshape(64, 1)
        out = tvm.runtime.tensor(np.zeros((64, 1), np.int8))
        f(tvm.runtime.tensor(acc), tvm.runtime.tensor(effs), out)
        want = np.clip(fc_requantize(acc.astype(np.int64), effs[0]), -128, 127)
        np.testing.assert_array_equal(out.numpy().astype(np.int64), want, err_msg=f"eff {eff}")


# ---- the FC autoencoder: every check, in seconds ----------------------------------------------------
def test_int8_package_is_int8(small_pkg):
    m = cuda.load_manifest(small_pkg)
    assert m.dtype == "int8" and m.inputs[0].dtype == "int8" and m.outputs[0].dtype == "int8"
    # dp4a: weights packed 4 to an int32 word (``*_w4``), biases with the input zero point folded in
    assert {w.dtype for w in m.weights} >= {"int32", "float64"}            # packed weights, biases, FC scales
    assert any(w.name.endswith("_w4") for w in m.weights)
    assert all(s.launches for s in m.steps)


def test_int8_package_compiles_for_sm80_and_sm90(small_pkg):
    try:
        nvrtc.toolkit()
    except nvrtc.NvrtcUnavailable as e:
        pytest.skip(str(e))
    m = cuda.load_manifest(small_pkg)
    res = nvrtc.check_package(small_pkg, m, archs=("sm_80", "sm_90"))
    for arch in ("sm_80", "sm_90"):
        assert set(res[arch]) == set(m.kernels)
        assert all(r["spill_stores"] == 0 and r["shared_bytes"] <= nvrtc.SHARED_LIMIT for r in res[arch].values())


def test_int8_plan_interpreter_is_bit_exact(small_pkg):
    for x, want in _golden(SMALL)[:3]:
        got = cuda.interpret_plan(small_pkg, [x])[0]
        np.testing.assert_array_equal(got.reshape(want.shape), want)


def test_int8_cuda_sim_is_bit_exact(small_pkg):
    _sim(small_pkg, SMALL)


def test_kiln_verify_int8_on_cuda_sim_compares_exactly(tmp_path, capsys):
    pytest.importorskip("pyopencl")
    rc = main(["verify", _model(SMALL), "--golden", os.path.join(MODELS, f"{SMALL}.golden.npz"),
               "--target", "cuda-sim", "--json"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    if rc == 2 and "OpenCL" in json.dumps(rep):
        pytest.skip("no OpenCL CPU device")
    assert rc == 0 and rep["ok"] and rep["matched"] == 8, rep
    assert rep["comparison"].startswith("bit-exact")


def test_kiln_verify_int8_fails_on_one_wrong_lsb(tmp_path, capsys):
    """A golden output off by one LSB in one element is a failure (no tolerance)."""
    pytest.importorskip("pyopencl")
    g = dict(np.load(os.path.join(MODELS, f"{SMALL}.golden.npz")))
    bad = g["out_0"].copy()
    bad.flat[7] = bad.flat[7] + (1 if bad.flat[7] < 127 else -1)
    g["out_0"] = bad
    np.savez(tmp_path / "g.npz", **g)
    rc = main(["verify", _model(SMALL), "--golden", str(tmp_path / "g.npz"), "--target", "cuda-plan", "--json"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 1 and not rep["ok"] and rep["matched"] == 7
    assert rep["results"][0]["mismatched_elements"] == 1


def test_quantised_graph_refuses_a_float_storage_dtype(tmp_path):
    with pytest.raises(KilnError, match="quantised.*float16"):
        cuda.compile(load_model(_model(SMALL)), str(tmp_path / "p"), dtype="float16", check=False)


def test_kiln_compile_int8_for_cuda(tmp_path, capsys):
    out = str(tmp_path / "pkg")
    assert main(["compile", _model(SMALL), "--target", "cuda", "--arch", "sm_80", "-o", out, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["launches"] >= 10 and rep["dtype"] == "int8" and cuda.load_manifest(out).dtype == "int8"


# ---- the other three models (minutes of TVM each) ------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", BIG)
def test_mlperf_tiny_int8_bit_exact_on_cuda_sim(tmp_path, name):
    pkg = cuda.compile(load_model(_model(name)), str(tmp_path / name), arch="sm_80", check=None)
    assert "__dp4a(" in open(os.path.join(pkg, "kernels.cu")).read()
    _sim(pkg, name)
    try:
        nvrtc.toolkit()
    except nvrtc.NvrtcUnavailable:
        return
    m = cuda.load_manifest(pkg)
    assert set(nvrtc.check_package(pkg, m, archs=("sm_90",))["sm_90"]) == set(m.kernels)


# ---- on a GPU ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", [SMALL] + BIG)
def test_gpu_int8_bit_exact(tmp_path, name):
    from kiln.backends.cuda_runner import CudaRunner
    r = CudaRunner(cuda.compile(load_model(_model(name)), str(tmp_path / name)))
    for run in (r, r.capture()):
        for k, (x, want) in enumerate(_golden(name)):
            np.testing.assert_array_equal(run(x)[0].reshape(want.shape), want, err_msg=f"{name} pair {k}")
    assert r.guards_clean()
