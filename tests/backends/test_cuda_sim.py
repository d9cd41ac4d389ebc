"""cuda-sim (backends/cuda_sim.py): the package's DLight-scheduled kernels lowered for OpenCL and
run on pocl with the package's own launch plan (grid, block, arguments at their arena and
weights offsets), on a NaN-poisoned arena between guard zones."""
import json
import os

import numpy as np
import pytest

import kiln
from benchmarks import cuda_sim_zoo
from kiln import nn
from kiln.backends import cuda, cuda_sim
from kiln.cli import main
from kiln.frontend import executor
from tests.backends.server_models import make

pytest.importorskip("pyopencl", reason="cuda-sim needs pyopencl (bash scripts/setup.sh --test installs it)")


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim")
    fwd, step, x, t = make("mlp")
    return {"mlp": (cuda.compile(fwd, str(root / "mlp"), check=False), fwd, [x]),
            "mlp-step": (cuda.compile_train_step(step, str(root / "mlp-step"), check=False), step, [x, t])}


@pytest.mark.parametrize("which", ["mlp", "mlp-step"])
def test_sim_matches_numpy(pkgs, which):
    pkg, graph, inputs = pkgs[which]
    sim = cuda_sim.Simulator(pkg)
    got = sim(*inputs)
    for g, w in zip(got, executor.run(graph, *inputs)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert sim.guard >= 4096
    assert (sim.last_arena[:sim.guard] == 0xFF).all()


def test_sim_takes_new_weights(pkgs):
    pkg, graph, inputs = pkgs["mlp"]
    new = {k: (v * -0.7).astype(np.float32) for k, v in graph.params.items()}
    np.testing.assert_allclose(cuda_sim.run(pkg, inputs, params=new)[0], executor.run(graph, *inputs, params=new)[0],
                               rtol=1e-5, atol=1e-5)


def test_a_write_into_a_guard_zone_is_caught(pkgs, tmp_path):
    pkg, _, inputs = pkgs["mlp"]
    bad = str(tmp_path / "bad")
    os.makedirs(bad)
    for f in os.listdir(pkg):
        if os.path.isfile(os.path.join(pkg, f)):
            with open(os.path.join(pkg, f), "rb") as a, open(os.path.join(bad, f), "wb") as b:
                b.write(a.read())
    m = json.load(open(os.path.join(bad, "manifest.json")))
    last = m["steps"][-1]["launches"][-1]
    out = [a for a in last["args"] if a.get("space") == "arena"][0]
    out["offset"] = m["arena_bytes"]                    # the output now lands past the arena
    json.dump(m, open(os.path.join(bad, "manifest.json"), "w"))
    with pytest.raises(cuda_sim.GuardViolation, match="guard zone of the arena"):
        cuda_sim.run(bad, inputs)


def test_conv_halo_reads_stay_inside_the_allocation(tmp_path):
    """A same-padded 3x3 conv whose input sits at arena offset 0: its tiles read the padding halo
    before the bounds check, i.e. before the buffer; the guard zone (NaN) is read and discarded."""
    kiln.frontend.manual_seed(0)
    x = np.random.default_rng(1).standard_normal((1, 12, 12, 8)).astype(np.float32)
    g = kiln.trace(nn.Conv2d(8, 8, 3, padding="same"), x, name="conv8")
    pkg = cuda.compile(g, str(tmp_path / "p"), check=False)
    m = cuda.load_manifest(pkg)
    assert m.inputs[0].offset == 0
    np.testing.assert_allclose(cuda_sim.run(pkg, [x])[0], executor.run(g, x)[0], rtol=1e-5, atol=1e-5)


def test_kiln_verify_target_cuda_sim(tmp_path, capsys):
    fwd, _, x, _ = make("mlp")
    model = str(tmp_path / "mlp.json")
    kiln.save(fwd, model)
    np.savez(tmp_path / "g.npz", in_0=x, out_0=executor.run(fwd, x)[0])
    rc = main(["verify", model, "--golden", str(tmp_path / "g.npz"), "--target", "cuda-sim", "--json"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and rep["ok"] and rep["comparison"] == "within atol 0.0001 (x (1 + |expected|))", rep


@pytest.mark.slow
def test_resnet8_runs_on_cuda_sim(tmp_path):
    """ResNet-8 (MLPerf Tiny) inference, fp32, batch 1: its package compiles within the GPU limits
    (before the rule fallback, ptxas rejected a conv's 78 KiB of shared memory) and its scheduled
    kernels, halo reads included, match the float64 reference on pocl."""
    r = cuda_sim_zoo.run_case("resnet8", "b1", str(tmp_path), check=None)
    assert r["ok"] and r["guards_clean"] and r["max_err"] <= cuda_sim.TOLERANCE64["float32"], r


def test_float32_constants_reach_opencl_exactly():
    """TVM's OpenCL code generator prints float32 literals with 7 significant digits (1/3 as
    3.333333e-01f, one float32 step below float32(1/3)); cuda-sim writes such a constant as its
    bits, as the CUDA source's hexadecimal literal is exact."""
    import pyopencl as cl
    import tvm
    from tvm import te, tirx
    a = te.placeholder((1024,), "float32", name="a")
    b = te.compute((1024,), lambda i: a[i] * tirx.const(1 / 3, "float32"), name="b")
    info, _, sched = cuda.lower_steps(tvm.IRModule({"f": te.create_prim_func([a, b])}), cuda.gpu_target())
    (launch,), _, _ = info["f"]
    src = cuda_sim.opencl_kernels(sched)
    assert "3.333333e-01f" not in src
    _, ctx = cuda_sim._context()
    queue = cl.CommandQueue(ctx)
    x = np.ones(1024, np.float32)
    got = np.zeros_like(x)
    bufs = [cl.Buffer(ctx, cl.mem_flags.COPY_HOST_PTR, hostbuf=x), cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, x.nbytes)]
    getattr(cl.Program(ctx, src).build(), launch["kernel"])(
        queue, tuple(g * k for g, k in zip(launch["grid"], launch["block"])), tuple(launch["block"]),
        *[bufs[k] for _, k in launch["args"]])
    cl.enqueue_copy(queue, got, bufs[1])
    queue.finish()
    assert (got == np.float32(1 / 3)).all()
