"""16x8 graphs (int16 activations, int8 weights, int64 biases) on CUDA (backends/cuda_int8.py):
each node lowered by the C backend's 16x8 rule (FULLY_CONNECTED by the CUDA rule's double
requantisation instead of the C helper), run on cuda-sim bit for bit against Kiln's int16
reference, on a PTQ model and on TFLite Micro's seanet int16 models in tests/data/seanet16."""
import glob
import os
import re

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.backends import cuda, cuda_int8
from kiln.frontend import run
from kiln.frontend.errors import KilnError
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize import ptq

SEANET = os.path.join(os.path.dirname(__file__), "..", "data", "seanet16")


def _sim(pkg):
    pytest.importorskip("pyopencl", reason="cuda-sim needs pyopencl (bash scripts/setup.sh --test installs it)")
    from kiln.backends import cuda_sim
    try:
        return cuda_sim.Simulator(pkg)
    except cuda_sim.SimUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def model16():
    rng = np.random.default_rng(0)
    g = kiln.trace(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                 nn.Flatten(), nn.Linear(512, 10)), np.zeros((1, 10, 10, 3), np.float32))
    return ptq(g, rng.random((16, 10, 10, 3)).astype(np.float32), activations="int16", int8_io=False)


def test_ptq_16x8_model_bit_exact_on_cuda_sim(tmp_path, model16):
    assert {model16.types[n.name].dtype for n in model16.nodes if n.op in ("conv2d", "dense")} == {"int16"}
    pkg = cuda.compile(model16, str(tmp_path / "p"), arch="sm_80", check=False)
    src = open(os.path.join(pkg, "kernels.cu")).read()
    assert "kiln_" not in src and "short" in src          # no C helper; int16 values
    sim = _sim(pkg)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.random((1, 10, 10, 3)).astype(np.float32) * 1.2 - 0.1
        want = run(model16, x)[0]
        np.testing.assert_array_equal(sim(x)[0].reshape(want.shape), want)


def test_16x8_nodes_on_inspect_and_refusals_name_the_node(model16):
    for n in model16.nodes:
        assert cuda_int8.node_refusal(model16, n) is None, n.name
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cuda_int8, "CUDA_RULES_16X8", ())           # the C rule's FC calls a C helper
        dense = next(n for n in model16.nodes if n.op == "dense")
        msg = cuda_int8.node_refusal(model16, dense)
        assert dense.name in msg and "C helper" in msg
        with pytest.raises(KilnError, match="C helper"):
            cuda.compile(model16, "/nonexistent/never-written", check=False)


def _seanet(path):
    z = np.load(path[:-len(".tflite")] + ".npz")
    return [z[k] for k in sorted(z.files) if k.startswith("in_")], z["golden"]


CI_MODELS = ("conv0", "leaky_relu11", "sub4", "transpose_conv4")     # the others: slow


def _marks(name):
    return [] if name in CI_MODELS else [pytest.mark.slow]


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in
                                  sorted(os.path.basename(p)[:-7] for p in glob.glob(os.path.join(SEANET, "*.tflite")))])
def test_seanet_int16_on_cuda_sim(tmp_path, name):
    """TFLite Micro's seanet int16 models: cuda-sim equals Kiln's int16 reference (which equals
    TFLM's golden output but for the documented SUB multiplier difference,
    tests/quantize/test_int16_backend.py)."""
    path = os.path.join(SEANET, name + ".tflite")
    g = load_tflite(path)
    ins, golden = _seanet(path)
    feeds = [x.reshape(g.types[v].shape) for x, v in zip(ins, g.inputs)]
    pkg = cuda.compile(g, str(tmp_path / name), arch="sm_80", check=False)
    got = _sim(pkg)(*feeds)[0]
    np.testing.assert_array_equal(got.ravel(), run(g, *feeds)[0].ravel())
    if name != "sub1":
        np.testing.assert_array_equal(got.ravel(), golden.ravel())


def test_strided_int8_gather_is_scalar_loads_in_opencl(tmp_path):
    """transpose_conv4's kernel gathers a strided int8x2 weight pair from shared memory. The CUDA
    source builds it with make_char2; TVM's OpenCL code generator packed the two bytes into one
    int and cast that with convert_int2 (pocl: ambiguous). cuda-sim's lowering writes the gather
    as two scalar loads in an OpenCL vector literal."""
    g = load_tflite(os.path.join(SEANET, "transpose_conv4.tflite"))
    pkg = cuda.compile(g, str(tmp_path / "tc"), arch="sm_80", check=False)
    pytest.importorskip("pyopencl")
    from kiln.backends import cuda_sim
    src = cuda_sim.opencl_source(pkg)
    assert "0x000000ff" not in src and "(char2)(" in src
    assert re.search(r"(?<![\w.(])char2\(", src) is None       # no C++-style vector constructor
    assert "make_char2(" in open(os.path.join(pkg, "kernels.cu")).read()


@pytest.mark.parametrize("activations", ["int16", "int8"])
def test_lstm_blockwise_bit_exact_on_cuda_sim(tmp_path, activations):
    """An LSTM (16x8 and int8, cell clip, batch 2, 6 steps) takes the blockwise schedule (each of
    the rule's per-step blocks its own kernel, nothing inlined: DLight's inlining is quadratic in
    the blocks and did not finish on micro_speech_lstm's 198) and runs bit-exact on cuda-sim."""
    import kiln.frontend as kf
    kf.manual_seed(0)
    g = kf.trace(kf.LSTM(3, 5, cell_clip=1.5), (2, 6, 3))
    rng = np.random.default_rng(1)
    q = ptq(g, rng.standard_normal((16, 6, 3)).astype(np.float32), activations=activations)
    lstm = next(n for n in q.nodes if n.op == "lstm")
    assert q.types[lstm.name].dtype == activations
    pkg = cuda.compile(q, str(tmp_path / "p"), arch="sm_80", check=False)
    steps = cuda.load_manifest(pkg).steps
    assert [s.schedule for s in steps].count("Blockwise") == 1 and len(steps) == 3     # quantize, lstm, dequantize
    sim = _sim(pkg)
    for _ in range(2):
        x = rng.standard_normal((2, 6, 3)).astype(np.float32)
        want = run(q, x)[0]
        np.testing.assert_array_equal(sim(x)[0].reshape(want.shape), want)
