"""backends/cuda_runner.py against a recording stand-in for CuPy (tests/backends/fake_cupy.py):
no GPU is lent here, so what is checked is what the runner asks of CuPy: one stream for every
copy and launch, the requested device selected before it is checked, a warm-up run before graph
capture and no partial graph after a failed one, a poisoned arena between guard zones, NVRTC
options with the CUDA headers; benchmarks/gpu_check.py's preparation. The real runs are the
gpu-marked tests here and in test_cuda_codegen.py."""
import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from benchmarks import cuda_sim_zoo, gpu_check
from kiln.backends import cuda, cuda_runner, cuda_sim, nvrtc
from tests.backends import fake_cupy
from tests.backends.server_models import make


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    fwd, _, x, _ = make("mlp")
    return cuda.compile(fwd, str(tmp_path_factory.mktemp("runner") / "mlp"), check=False), fwd, x


def _runner(monkeypatch, pkg, **kw):
    cp = fake_cupy.make(**{k: v for k, v in kw.items() if k in ("devices", "fail_launch")})
    monkeypatch.setitem(__import__("sys").modules, "cupy", cp)
    return cuda_runner.CudaRunner(pkg, device=kw.get("device")), cp


def test_every_copy_and_launch_is_on_the_runner_stream(monkeypatch, pkg):
    path, fwd, x = pkg
    r, cp = _runner(monkeypatch, path)
    r.set_params({k: v for k, v in fwd.params.items() if k in r.weight_names})
    r(x)
    ops = [e for e in cp.log if e[0] in ("set", "get", "full", "launch")]
    assert {e[0] for e in ops} == {"set", "get", "full", "launch"}
    streams = {e[1] if e[0] != "launch" else e[2] for e in ops}
    assert streams == {r.stream.name} and r.stream.name.endswith("-nb")


def test_arena_is_poisoned_between_guard_zones(monkeypatch, pkg):
    path, _, x = pkg
    r, cp = _runner(monkeypatch, path)
    assert ("full", r.stream.name, 0xFF) in cp.log          # the arena: NaN bytes, not zeros
    m = r.m
    biggest = max(a.bytes for st in m.steps for L in st.launches for a in L.args if a.space)
    assert r.guard >= biggest and r.guard % 256 == 0
    raw = {"arena": r._arena_raw, "weights": r._weights_raw}
    size = {"arena": m.arena_bytes, "weights": m.weights_bytes}
    spaces = set()
    for _, L, args in r._plan:                                # every pointer between the guard zones
        for a, p in zip(L.args, args):
            if a.space:
                spaces.add(a.space)
                lo = raw[a.space].data.ptr + r.guard
                assert int(p) == lo + a.offset and lo <= int(p) and int(p) + a.bytes <= lo + size[a.space]
    assert spaces == {"arena", "weights"} and r.guards_clean()
    r._arena_raw.a[3] = 0
    assert not r.guards_clean()


def test_probe_selects_the_requested_device_before_checking_it(monkeypatch, pkg):
    path, _, _ = pkg
    # device 0 is too old for sm_90, device 1 is an sm_90: asking for device 1 must work
    r, cp = _runner(monkeypatch, path, devices=(75, 90), device=1)
    assert r.cc == 90 and ("use", 1) in cp.log
    with pytest.raises(cuda_runner.CudaUnavailable, match=r"device 0 .*compute capability 7.5"):
        _runner(monkeypatch, path, devices=(75, 90))
    with pytest.raises(cuda_runner.CudaUnavailable, match=r"device 2 asked for.*2 CUDA device"):
        _runner(monkeypatch, path, devices=(75, 90), device=2)


def test_capture_warms_up_first(monkeypatch, pkg):
    path, _, x = pkg
    r, cp = _runner(monkeypatch, path)
    del cp.log[:]
    r.capture()
    begin = cp.log.index(("begin_capture", r.stream.name))
    n = len(r._plan)
    assert [e[0] for e in cp.log[:begin]].count("launch") == n      # one plain run before capture
    assert [e[0] for e in cp.log[begin:]].count("launch") == n
    r(x)
    assert ("graph", r.stream.name) in cp.log


def test_failed_capture_leaves_no_graph(monkeypatch, pkg):
    path, _, x = pkg
    last = None

    def fail(kernel, capturing):
        return capturing and kernel == last
    r, cp = _runner(monkeypatch, path, fail_launch=fail)
    last = r.m.steps[-1].launches[-1].kernel
    with pytest.raises(cuda_runner.CudaLaunchError, match=last):
        r.capture()
    assert r.graph is None and cp.log[-1][0] == "end_capture" and not cp.capturing[0]
    del cp.log[:]
    r(x)                                                       # launches kernel by kernel
    assert not any(e[0] == "graph" for e in cp.log)


def test_nvrtc_options_carry_the_cuda_headers(monkeypatch, pkg):
    path, _, _ = pkg
    _, cp = _runner(monkeypatch, path)
    assert "-diag-suppress=177" in cp.options and "--std=c++17" in cp.options
    inc = [o[2:] for o in cp.options if o.startswith("-I")]
    try:
        pip = nvrtc.toolkit()["include"]
    except nvrtc.NvrtcUnavailable:      # e.g. a GPU server with only a system CUDA 13 toolkit
        pip = []
    assert inc == cuda_runner.include_dirs() and {os.path.realpath(d) for d in pip} <= set(inc)


def _toolkit(root, version):
    """A system CUDA toolkit's header layout: include/ with cuda_fp16.h, and from CUDA 13 on
    libcu++ in include/cccl/cuda/std."""
    inc = root / "include"
    (inc / ("cccl" if version >= 13000 else "") / "cuda" / "std").mkdir(parents=True)
    (inc / "cuda_fp16.h").write_text("")
    (inc / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION {version}\n")
    return str(inc)


def test_headers_of_a_system_toolkit_are_found(monkeypatch, pkg, tmp_path):
    """A GPU server with CUDA 13 in CUDA_HOME (or /usr/local/cuda) and no pip nvidia-* headers:
    the runner passes its include/ and include/cccl (where CUDA 13 keeps cuda/std), and of the
    header sets it finds only those of the NVRTC that CuPy uses."""
    inc13 = _toolkit(tmp_path / "cuda13", 13000)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda13"))
    assert {inc13, inc13 + "/cccl"} <= set(cuda_runner.include_dirs(13))
    assert inc13 not in cuda_runner.include_dirs(12)
    assert not any("cuda_runtime" in d or "cuda_cccl" in d for d in cuda_runner.include_dirs(13))
    path, _, _ = pkg
    cp = fake_cupy.make()
    cp.cuda.nvrtc = types.SimpleNamespace(getVersion=lambda: (13, 0))
    monkeypatch.setitem(sys.modules, "cupy", cp)
    cuda_runner.CudaRunner(path)
    inc = [o[2:] for o in cp.options if o.startswith("-I")]
    assert inc == cuda_runner.include_dirs(13) and inc13 in inc
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "none"))
    inc12 = _toolkit(tmp_path / "cuda12", 12040)
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "cuda12"))
    assert inc12 in cuda_runner.include_dirs(12) and inc12 + "/cccl" not in cuda_runner.include_dirs(12)


def test_scaled_errors_scale_gradients_by_the_largest():
    """A gradient that is exactly 0 in float64 (a bias in front of a train-mode BatchNorm) comes
    back as rounding noise: against its own scale that is 100% off, against the step's largest
    gradient it is noise; the forward output keeps its own scale."""
    want = [np.array([10.0, -20.0]), np.array([0.5, -0.25]), np.array([0.0, 0.0])]
    got = [np.array([10.001, -20.0]), np.array([0.5, -0.2505]), np.array([1e-8, -2e-8])]
    e = cuda_runner.scaled_errors(["out", "g_w", "g_b"], got, want, gradients=["g_w", "g_b"])
    assert e["out"] == pytest.approx(0.001 / 20) and e["g_w"] == pytest.approx(0.0005 / 0.5)
    assert e["g_b"] == pytest.approx(2e-8 / 0.5)
    assert cuda_runner.scaled_errors(["g_b"], [got[2]], [want[2]])["g_b"] > 1e20
    assert cuda_runner.scaled_errors(["out"], [np.array([np.nan, 1.0])], [want[0]])["out"] == float("inf")


def test_the_runner_imports_without_tvm_or_torch():
    """A GPU server runs packages without TVM (the package is generated elsewhere): importing the
    runner must not pull in TVM (which imports torch), so that it works where neither is installed."""
    code = ("import sys, kiln.backends.cuda_runner; "
            "print(sorted(m for m in ('tvm', 'torch', 'tvm_ffi') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---- benchmarks/gpu_check.py: packages and float64 expectations made here, checked on a GPU ----
@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("gpu_check"))
    gpu_check.prepare(d, ["digits-cnn"], ["b1"], ["float32"])
    return d


def test_gpu_check_prepares_packages_and_float64_expectations(prepared):
    with open(os.path.join(prepared, "cases.json")) as f:
        (case,) = json.load(f)
    assert case["case"] == "digits-cnn-b1-float32" and case["tolerance"] == cuda_sim.TOLERANCE64["float32"]
    pkg, inputs, want = gpu_check._load(prepared, case)
    assert sorted(os.listdir(pkg)) == ["kernels.cu", "manifest.json", "plan.txt", "weights.bin"]
    graph, xs = cuda_sim_zoo.zoo_case("digits-cnn", 1, False)
    ref, _ = cuda_sim.reference64(graph, xs)
    assert all(np.array_equal(a, b) for a, b in zip(inputs, xs)) and want[0].dtype == np.float64
    assert np.array_equal(want[0], ref[0]) and case["outputs"] == graph.outputs
    gpu_check.prepare(prepared, ["digits-cnn"], ["b1"], ["float16"])      # adds to the folder
    with open(os.path.join(prepared, "cases.json")) as f:
        assert [c["case"] for c in json.load(f)] == ["digits-cnn-b1-float32", "digits-cnn-b1-float16"]


def test_gpu_check_without_a_gpu_prints_one_json_object(prepared):
    p = subprocess.run([sys.executable, gpu_check.__file__, prepared, "--iters", "0", "--sanitize", ""],
                       capture_output=True, text=True)
    rep = json.loads(p.stdout)
    if p.returncode == 2:                       # no CuPy or no device: says which
        assert not rep["ok"] and "CudaUnavailable" in rep["error"]
    else:                                       # a GPU: every case within its tolerance
        assert p.returncode == 0 and rep["ok"] and all(c["ok"] for c in rep["cases"]), rep


def test_gpu_check_imports_kiln_from_the_checkout_without_tvm():
    """On a GPU server Kiln need not be installed: the checkout's folders are mapped to kiln.*
    (pyproject's package-dir), and the runner loads neither TVM nor torch."""
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import gpu_check; "
            "sys.meta_path.insert(0, gpu_check._Checkout()); from kiln.backends import cuda_runner; "
            "print(cuda_runner.__file__); print(sorted(m for m in ('tvm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=gpu_check.ROOT).stdout.split()
    assert out == [os.path.join(gpu_check.ROOT, "backends", "cuda_runner.py"), "[]"]


@pytest.mark.gpu
def test_zoo_packages_under_compute_sanitizer(tmp_path):
    """The digits-cnn training step and ds-cnn inference at batch 64 on the GPU: within the
    float64 tolerance, guard zones clean, and clean under compute-sanitizer memcheck (no
    out-of-bounds or misaligned access) and racecheck (no shared-memory hazard)."""
    if shutil.which("compute-sanitizer") is None:
        pytest.skip("compute-sanitizer not on PATH (CUDA toolkit)")
    d = str(tmp_path)
    gpu_check.prepare(d, ["digits-cnn"], ["train"], ["float32"])
    gpu_check.prepare(d, ["ds-cnn"], ["b64"], ["float32"])
    p = subprocess.run([sys.executable, gpu_check.__file__, d, "--iters", "0", "--sanitize", "memcheck,racecheck"],
                       capture_output=True, text=True)
    rep = json.loads(p.stdout)
    assert p.returncode == 0 and rep["ok"], rep
    assert [(s["case"], s["tool"]) for s in rep["sanitizer"]] == [
        ("digits-cnn-train-float32", "memcheck"), ("digits-cnn-train-float32", "racecheck"),
        ("ds-cnn-b64-float32", "memcheck"), ("ds-cnn-b64-float32", "racecheck")]


def test_gpu_bench_times_prepared_packages_or_says_why_not(prepared):
    """gpu_bench --packages runs what gpu_check --prepare built (a GPU server needs no TVM); without
    a GPU it exits 2 saying what is missing instead of a traceback."""
    bench = os.path.join(gpu_check.ROOT, "benchmarks", "gpu_bench.py")
    p = subprocess.run([sys.executable, bench, "--packages", prepared, "--models", "digits-cnn", "--iters", "2",
                        "--cases", "b1", "--modes", "eager"], capture_output=True, text=True)
    if p.returncode == 2:
        assert "gpu_bench: " in p.stderr and "Traceback" not in p.stderr
    else:                                       # a GPU: the one model's row is in the table
        assert p.returncode == 0 and "| digits-cnn |" in p.stdout, p.stdout + p.stderr
