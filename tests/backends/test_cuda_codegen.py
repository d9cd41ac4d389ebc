"""CUDA package emitter (backends/cuda.py) on the CPU: package files, manifest/launch-plan
consistency, arena plan, the CPU plan interpreter against NumPy, half precision, errors.
GPU execution (backends/cuda_runner.py) is tested under ``@pytest.mark.gpu``."""
import json
import os
import re

import numpy as np
import pytest

from kiln.backends import cuda
from kiln.frontend import executor
from kiln.frontend.errors import KilnError
from kiln.frontend.graph import Graph
from kiln.frontend.registry import OPS
from kiln.frontend.types import TensorType
from tests.backends.server_models import make


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """MLP forward, CNN forward, CNN training step (built once for the module)."""
    root = tmp_path_factory.mktemp("cuda-pkgs")
    out = {}
    for name in ("mlp", "cnn"):
        fwd, step, x, t = make(name)
        out[name] = (cuda.compile(fwd, str(root / name)), fwd, [x])
        if name == "cnn":
            out["cnn-step"] = (cuda.compile_train_step(step, str(root / "cnn-step")), step, [x, t])
    return out


@pytest.mark.parametrize("which", ["mlp", "cnn", "cnn-step"])
def test_package_files_and_manifest(packages, which):
    pkg, graph, _ = packages[which]
    for f in ("kernels.cu", "manifest.json", "weights.bin", "plan.txt", "groups.json"):
        assert os.path.exists(os.path.join(pkg, f)), f
    m = cuda.check_package(pkg)      # offsets inside arena/blob, non-overlap, kernels defined, dims
    assert m.target == "cuda" and m.arch == "sm_90" and m.dtype == "float32"
    assert [i.name for i in m.inputs] == graph.inputs
    assert [o.name for o in m.outputs] == graph.outputs
    src = open(os.path.join(pkg, "kernels.cu")).read()
    defined = set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', src))
    assert set(m.kernels) <= defined and m.kernels
    # every parameter/constant that is not folded is in the weights blob, with its bytes
    blob = open(os.path.join(pkg, "weights.bin"), "rb").read()
    for w in m.weights:
        want = np.asarray(graph.tensors()[w.name], np.float32).tobytes()
        assert blob[w.offset:w.offset + w.bytes] == want
    # launches carry real launch dims read from the lowered TIR
    for st in m.steps:
        assert st.launches, st.func
        for L in st.launches:
            assert np.prod(L.grid) >= 1 and 1 <= np.prod(L.block) <= 1024
            assert all(a.space is not None or a.scalar is not None for a in L.args)


def test_kernel_params_follow_the_plan_argument_count(packages):
    pkg, _, _ = packages["cnn"]
    m = json.load(open(os.path.join(pkg, "manifest.json")))
    src = open(os.path.join(pkg, "kernels.cu")).read()
    for st in m["steps"]:
        for L in st["launches"]:
            sig = re.search(r"void (?:__launch_bounds__\(\d+\) )?" + re.escape(L["kernel"]) + r"\(([^)]*)\)", src).group(1)
            assert len([p for p in sig.split(",") if p.strip()]) == len(L["args"]), L["kernel"]


@pytest.mark.parametrize("which", ["mlp", "cnn", "cnn-step"])
def test_plan_interpreter_matches_numpy(packages, which):
    """The launch plan's arena/weights layout and order, executed on the CPU (arena poisoned
    with NaN bytes), reproduces the NumPy reference."""
    pkg, graph, inputs = packages[which]
    got = cuda.interpret_plan(pkg, inputs)
    want = executor.run(graph, *inputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_plan_interpreter_takes_new_weights(packages):
    pkg, graph, inputs = packages["mlp"]
    new = {k: (v * -0.7).astype(np.float32) for k, v in graph.params.items()}
    np.testing.assert_allclose(cuda.interpret_plan(pkg, inputs, params=new)[0],
                               executor.run(graph, *inputs, params=new)[0], rtol=1e-5, atol=1e-5)


def test_arena_is_shared_across_lifetimes(packages):
    pkg, _, _ = packages["cnn-step"]
    m = cuda.load_manifest(pkg)
    total = sum(b.bytes for b in m.buffers)
    assert m.arena_bytes < total          # buffers with disjoint lifetimes share bytes
    assert "arena:" in open(os.path.join(pkg, "plan.txt")).read()


def test_planner_by_hand():
    bufs = [("a", 1000, 0, 1), ("b", 500, 1, 2), ("c", 1000, 2, 3)]
    off, peak = cuda.plan_arena(bufs, align=256)
    cuda.check_plan(bufs, off)
    assert off["a"] == off["c"]              # a dies before c is born: same bytes
    assert peak == 1024 + 512
    with pytest.raises(KilnError, match="overlaps"):
        cuda.check_plan(bufs, {"a": 0, "b": 512, "c": 0})


def test_half_precision_packages(tmp_path):
    fwd, _, x, _ = make("mlp")
    ref = executor.run(fwd, x)[0]
    for dtype, tol in (("float16", 2e-2), ("bfloat16", 1e-1)):
        pkg = cuda.compile(fwd, str(tmp_path / dtype), dtype=dtype)
        m = cuda.check_package(pkg)
        assert m.dtype == dtype and all(w.dtype == dtype for w in m.weights)
        assert m.weights_bytes < sum(v.nbytes for v in fwd.params.values())
        src = open(os.path.join(pkg, "kernels.cu")).read()
        assert ("half" in src) if dtype == "float16" else ("bfloat16" in src or "nv_bfloat16" in src)
        if dtype == "float16":   # LLVM on the host runs fp16 kernels; accumulation is float32
            np.testing.assert_allclose(cuda.interpret_plan(pkg, [x])[0], ref, rtol=tol, atol=tol)


def test_dropout_masks_are_host_inputs(tmp_path):
    g = Graph("drop")
    g.add_input("x", TensorType((4, 16)))
    g.add_input("key", TensorType((), "int64"))
    g.outputs = [g.add_node("dropout", ["x", "key"], {"rate": 0.25, "salt": 1})]
    pkg = cuda.compile(g, str(tmp_path / "drop"))
    m = cuda.check_package(pkg)
    assert m.user_inputs == ["x", "key"] and len(m.dropout_masks) == 1
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_allclose(cuda.interpret_plan(pkg, [x, np.int64(9)])[0], executor.run(g, x, np.int64(9))[0])


def test_missing_te_rule_names_op_and_node(tmp_path):
    fwd, _, _, _ = make("mlp")
    g = fwd.copy()
    g.outputs = [g.add_node("sigmoid", [g.outputs[0]], name="odd_one")]
    rule, OPS["sigmoid"].te = OPS["sigmoid"].te, None
    try:
        with pytest.raises(NotImplementedError, match=r"TE lowering for 'sigmoid'.*'odd_one'"):
            cuda.compile(g, str(tmp_path / "x"))
    finally:
        OPS["sigmoid"].te = rule


def test_runner_without_gpu_says_what_it_found(packages):
    from kiln.backends import cuda_runner
    pkg, _, inputs = packages["mlp"]
    try:
        cuda_runner.probe("sm_90")
    except cuda_runner.CudaUnavailable as e:
        assert "CuPy" in str(e) or "compute capability" in str(e)
        with pytest.raises(cuda_runner.CudaUnavailable):
            cuda_runner.CudaRunner(pkg)
    else:
        pytest.skip("a GPU with CuPy is present: covered by the gpu tests")


def test_bad_package_is_reported(tmp_path):
    with pytest.raises(KilnError, match="manifest.json"):
        cuda.load_manifest(str(tmp_path))


# ---- on a GPU ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name,batch", [("mlp", 1), ("mlp", 64), ("cnn", 1), ("cnn", 64)])
def test_gpu_matches_numpy(tmp_path, name, batch):
    from kiln.backends.cuda_runner import CudaRunner
    fwd, step, x, t = make(name, batch=batch)
    for graph, inputs in ((fwd, [x]), (step, [x, t])):
        r = CudaRunner(cuda.compile(graph, str(tmp_path / graph.name)))
        want = executor.run(graph, *inputs)
        for got in (r(*inputs), r.capture()(*inputs)):
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_gpu_float16_close_to_numpy(tmp_path):
    from kiln.backends.cuda_runner import CudaRunner
    fwd, _, x, _ = make("cnn", batch=64)
    r = CudaRunner(cuda.compile(fwd, str(tmp_path / "h"), dtype="float16"))
    np.testing.assert_allclose(r(x)[0], executor.run(fwd, x)[0], rtol=3e-2, atol=3e-2)


SANITIZE = """
import sys, numpy as np
from kiln.backends.cuda_runner import CudaRunner
from tests.backends.server_models import make
fwd, step, x, t = make("cnn", batch=4)
r = CudaRunner(sys.argv[1])
r(x, t)
r.capture()(x, t)
assert r.guards_clean()
"""


@pytest.mark.gpu
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "initcheck"])
def test_compute_sanitizer(tmp_path, tool):
    """The CNN training step under compute-sanitizer: no out-of-bounds access, no shared-memory
    race, no read of uninitialised device memory."""
    import shutil
    import subprocess
    import sys
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer not on PATH (CUDA toolkit)")
    _, step, _, _ = make("cnn", batch=4)
    pkg = cuda.compile_train_step(step, str(tmp_path / "step"))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([exe, "--tool", tool, "--error-exitcode", "3", sys.executable, "-c", SANITIZE, pkg],
                       capture_output=True, text=True, cwd=root)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
