"""CUDA packages compiled as the runner compiles them, without a GPU: NVRTC (pip) for sm_80 and
sm_90, ptxas -v per kernel, limits checked at compile time; DLight rule fallback when a rule's
kernels exceed the limits or leave loops on the host."""
import json
import os

import numpy as np
import pytest

import kiln
from kiln import F, nn
from kiln.backends import cuda, nvrtc
from kiln.cli import main as cli_main
from kiln.frontend import save
from tests.backends.server_models import make

BROKEN = """
extern "C" __global__ void k(float* __restrict__ out) {
""" + "\n".join(f"  int unused_{i} = {i};" for i in range(300)) + """
  out[threadIdx.x] = undefined_name;
}
"""

BIG_SHARED = """
extern "C" __global__ void __launch_bounds__(128) big_shared_kernel(float* __restrict__ out) {
  __shared__ float buf[20000];
  buf[threadIdx.x] = out[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = buf[127 - threadIdx.x];
}
"""


def test_nvrtc_error_keeps_the_error_not_the_warnings():
    with pytest.raises(nvrtc.NvrtcError) as e:
        nvrtc.compile_ptx(BROKEN, "sm_90")
    msg = str(e.value)
    assert 'identifier "undefined_name" is undefined' in msg
    assert "unused_" not in msg and "177" not in msg       # -diag-suppress=177, warnings dropped
    assert len(msg) < 1000


def test_static_shared_memory_over_the_limit_names_kernel_and_limit():
    ptx = nvrtc.compile_ptx(BIG_SHARED, "sm_80")
    with pytest.raises(nvrtc.NvrtcError, match=r"kernel big_shared_kernel: 80000 bytes of static shared memory, "
                                               r"limit 49152"):
        nvrtc.ptxas_resources(ptx, "sm_80")


def test_ptxas_report_parses_every_kernel():
    src = BIG_SHARED.replace("20000", "1000")
    res = nvrtc.ptxas_resources(nvrtc.compile_ptx(src, "sm_90"), "sm_90")
    r = res["big_shared_kernel"]
    assert r["shared_bytes"] == 4000 and 0 < r["registers"] <= 255
    assert r["spill_stores"] == 0 and r["stack_bytes"] == 0


@pytest.fixture(scope="module")
def small_packages(tmp_path_factory):
    root = tmp_path_factory.mktemp("nvrtc-pkgs")
    out = {}
    for name in ("mlp", "cnn"):
        fwd, step, _, _ = make(name)
        for dtype in ("float32", "float16", "bfloat16"):
            out[f"{name}-{dtype}"] = cuda.compile(fwd, str(root / f"{name}-{dtype}"), dtype=dtype, check=False)
        out[f"{name}-step"] = cuda.compile_train_step(step, str(root / f"{name}-step"), check=False)
    out["cnn-step-float16"] = cuda.compile_train_step(make("cnn")[1], str(root / "cnn-step16"), dtype="float16",
                                                      check=False)
    return out


@pytest.mark.parametrize("which", ["mlp-float32", "mlp-float16", "mlp-bfloat16", "mlp-step", "cnn-float32",
                                   "cnn-float16", "cnn-bfloat16", "cnn-step", "cnn-step-float16"])
def test_packages_compile_for_sm80_and_sm90(small_packages, which):
    pkg = small_packages[which]
    m = cuda.load_manifest(pkg)
    res = nvrtc.check_package(pkg, m, archs=("sm_80", "sm_90"))
    for arch in ("sm_80", "sm_90"):
        assert set(res[arch]) == set(m.kernels)
        for r in res[arch].values():
            assert 0 < r["registers"] <= nvrtc.MAX_REGISTERS_PER_THREAD
            assert r["shared_bytes"] <= nvrtc.SHARED_LIMIT


def test_a_launch_over_the_register_file_is_named(small_packages):
    pkg = small_packages["mlp-float32"]
    m = cuda.load_manifest(pkg)
    k = m.steps[0].launches[0]
    fake = {k.kernel: {"registers": 255, "shared_bytes": 0, "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0}}
    k.block = [1024, 1, 1]
    bad = nvrtc.limit_errors(m, fake)
    assert bad and k.kernel in bad[0] and "limit 65536" in bad[0]


def test_scalar_reduction_in_half_precision_falls_back(tmp_path):
    """fp16 sum to a scalar times a constant: GeneralReduction left the loops on the host
    ('kernel argument ax1 is not a buffer or a constant'); the next rule (Fallback) launches."""
    x = np.random.default_rng(0).standard_normal((8, 12)).astype(np.float32)
    g = kiln.trace(lambda x: F.sum(x, [0, 1]) * 0.5, x, name="summul")
    pkg = cuda.compile(g, str(tmp_path / "p"), dtype="float16", check=True)
    m = cuda.load_manifest(pkg)
    assert [s.schedule for s in m.steps] == ["Fallback"]
    np.testing.assert_allclose(cuda.interpret_plan(pkg, [x])[0], x.sum() * 0.5, rtol=2e-2, atol=2e-2)


def test_conv_over_the_shared_memory_limit_takes_the_next_rule(tmp_path):
    """ResNet-8's 16->16 3x3 conv at 32x32: DLight Matmul's tiles needed 78,336 bytes of shared
    memory (ptxas: 0x13200 > 0xc000); verify_gpu_code rejects it and the next rule is used."""
    kiln.frontend.manual_seed(0)
    x = np.random.default_rng(1).standard_normal((1, 32, 32, 16)).astype(np.float32)
    g = kiln.trace(nn.Conv2d(16, 16, 3, padding="same"), x, name="conv16")
    pkg = cuda.compile(g, str(tmp_path / "p"), arch="sm_80", check=True)
    res = json.load(open(os.path.join(pkg, "resources.json")))["sm_80"]
    assert all(r["shared_bytes"] <= nvrtc.SHARED_LIMIT for r in res.values())
    assert cuda.load_manifest(pkg).steps[0].schedule != "Matmul"
    np.testing.assert_allclose(cuda.interpret_plan(pkg, [x])[0], kiln.frontend.executor.run(g, x)[0],
                               rtol=1e-5, atol=1e-5)


def test_kiln_compile_reports_registers_shared_and_spills(tmp_path, capsys):
    fwd, _, _, _ = make("mlp")
    model = str(tmp_path / "mlp.json")
    save(fwd, model)
    out = str(tmp_path / "pkg")
    assert cli_main(["compile", model, "--target", "cuda", "--arch", "sm_80", "-o", out, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    m = cuda.load_manifest(out)
    assert set(rep["resources"]["sm_80"]) == set(m.kernels)
    assert {"registers", "shared_bytes", "spill_stores", "spill_loads"} <= set(rep["resources"]["sm_80"][m.kernels[0]])
    assert cli_main(["compile", model, "--target", "cuda", "-o", out]) == 0
    text = capsys.readouterr().out
    assert "NVRTC + ptxas sm_90" in text and "regs" in text and "spill" in text


ZOO = ["ds-cnn", "resnet8", "mobilenet-v1-0.25", "fc-autoencoder", "digits-cnn"]
CASES = [(m, d, "forward") for m in ZOO for d in ("float32", "float16", "bfloat16")] + \
        [(m, d, "step") for m in ZOO for d in ("float32", "float16")]


@pytest.mark.slow
@pytest.mark.parametrize("model,dtype,kind", CASES, ids=[f"{m}-{d}-{k}" for m, d, k in CASES])
def test_zoo_packages_compile_for_sm80_and_sm90(tmp_path, model, dtype, kind):
    """Every zoo model's inference (batch 1) and training step (batch 8) package, in each dtype,
    compiles with NVRTC and ptxas within the limits for sm_80 and sm_90."""
    from kiln.training import zoo
    from kiln.training.step import StepGraph
    kiln.frontend.manual_seed(0)
    z = zoo.get(model)
    if kind == "forward":
        g = kiln.trace(z.module, np.zeros(z.input_shape, np.float32), name=model.replace("-", "_"))
        pkg = cuda.compile(g, str(tmp_path / "p"), arch="sm_80", dtype=dtype, check=True)
    else:
        step = StepGraph(z.module, z.loss, tuple(z.input_shape[1:]), 8).graph
        pkg = cuda.compile_train_step(step, str(tmp_path / "p"), arch="sm_80", dtype=dtype, check=True)
    m = cuda.load_manifest(pkg)
    res = nvrtc.check_package(pkg, m, archs=("sm_90",))
    assert set(res["sm_90"]) == set(m.kernels)
    assert set(json.load(open(os.path.join(pkg, "resources.json")))["sm_80"]) == set(m.kernels)
