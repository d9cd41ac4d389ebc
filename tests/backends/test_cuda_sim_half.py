"""float16 and bfloat16 packages on cuda-sim (backends/half_legalize.py): the kernels' half
values stored as uint16 and computed in float32, rounded to the half format after every half
operation by integer TIR conversions that must be exact (NumPy's float16 is the oracle)."""
import json

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import te, tirx

from kiln.backends import cuda, cuda_sim, half_legalize
from kiln.cli import main
from kiln.frontend import executor
from tests.backends.server_models import make
from tests.backends.test_cuda_sim_stepwise import corrupted


def _on_pocl(fcompute, inputs, out_dtype):
    """``fcompute`` (TE, elementwise over the placeholders of ``inputs``' dtypes) as a CUDA step:
    DLight-scheduled, lowered and legalised by cuda-sim, its kernel run on pocl with its own
    launch. Half arrays go in and come out as their uint16 bits."""
    n = inputs[0][0].size
    phs = [te.placeholder((n,), dt, name=f"a{k}") for k, (_, dt) in enumerate(inputs)]
    out = te.compute((n,), lambda i: fcompute(*[p[i] for p in phs]), name="out")
    assert str(out.dtype) == out_dtype
    info, _, sched = cuda.lower_steps(tvm.IRModule({"f": te.create_prim_func([*phs, out])}), cuda.gpu_target())
    (launch,), _, _ = info["f"]
    src = cuda_sim.opencl_kernels(sched)
    assert "half" not in src and "bfloat" not in src
    cl, ctx = cuda_sim._context()
    queue = cl.CommandQueue(ctx)
    got = np.zeros(n, np.uint16 if out_dtype in half_legalize.HALF else out_dtype)
    mf = cl.mem_flags
    bufs = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(x)) for x, _ in inputs]
    bufs.append(cl.Buffer(ctx, mf.WRITE_ONLY, got.nbytes))
    kernel = getattr(cl.Program(ctx, src).build(), launch["kernel"])
    kernel(queue, tuple(g * b for g, b in zip(launch["grid"], launch["block"])), tuple(launch["block"]),
           *[bufs[k] for _, k in launch["args"]])
    cl.enqueue_copy(queue, got, bufs[-1])
    queue.finish()
    return got


def _float32_cases():
    """float32 bit patterns: random ones, every float16 value, every midpoint between two
    neighbouring float16 values (the ties) and the float32 values on either side of it, the
    subnormal and overflow boundaries, infinities, zeros and NaNs."""
    rng = np.random.default_rng(0)
    h = np.arange(0x7C01, dtype=np.uint32)                    # 0 .. +inf as float16 bits
    v = h.astype(np.uint16).view(np.float16).astype(np.float64)
    mid = ((v[:-1] + v[1:]) / 2).astype(np.float32).view(np.uint32)        # exact in float32
    near = np.concatenate([mid, mid - 1, mid + 1, v.astype(np.float32).view(np.uint32)])
    ranges = [np.arange(b - 4096, b + 4096, dtype=np.int64) for b in
              (0x33000000, 0x33800000, 0x38800000, 0x477FE000, 0x477FF000, 0x47800000, 0x7F800000)]
    u = np.concatenate([near, *[r[(r >= 0) & (r < 2**31)].astype(np.uint32) for r in ranges],
                        rng.integers(0, 2**31, 1_000_000, dtype=np.uint64).astype(np.uint32)])
    u = np.concatenate([u, u | np.uint32(0x80000000)])        # and their negatives
    return u.view(np.float32)


def test_float16_bits_to_float32_is_exact_for_all_65536_patterns():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = _on_pocl(lambda v: v.astype("float32"), [(h, "float16")], "float32")
    want = h.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert nan.sum() == 2046 and np.isnan(got[nan]).all()
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))   # -0.0 too


def test_float32_to_float16_rounds_like_numpy():
    x = _float32_cases()
    got = _on_pocl(lambda v: v.astype("float16"), [(x, "float32")], "float16")
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert nan.any() and (got[nan] == half_legalize.CANONICAL_NAN).all()
    bad = np.flatnonzero(got[~nan] != want[~nan])
    assert bad.size == 0, [(hex(int(x[~nan].view(np.uint32)[i])), hex(got[~nan][i]), hex(want[~nan][i]))
                           for i in bad[:5]]
    assert (~nan).sum() > 2_000_000


def test_bfloat16_conversions_match_ml_dtypes():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = _on_pocl(lambda v: v.astype("float32"), [(h, "bfloat16")], "float32")
    np.testing.assert_array_equal(got.view(np.uint32), h.astype(np.uint32) << 16)
    x = _float32_cases()
    got = _on_pocl(lambda v: v.astype("bfloat16"), [(x, "float32")], "bfloat16")
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(x)
    assert (got[nan] == half_legalize.CANONICAL_NAN).all()
    np.testing.assert_array_equal(got[~nan], want[~nan])


@pytest.mark.parametrize("fmt,npdt", [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)])
def test_half_arithmetic_is_rounded_after_every_operation(fmt, npdt):
    """max((a + b) * c - a / b, c) (max as fmax: a NaN operand gives the other, as __hmax) with half operands in a kernel equals NumPy doing each operation
    in the half format (float16: IEEE, bfloat16: ml_dtypes), bit for bit: float32 arithmetic
    rounded after every operation, as the GPU's half instructions give."""
    rng = np.random.default_rng(1)
    n = 16384
    a, b, c = [(rng.standard_normal(n) * 10.0 ** rng.integers(-6, 5, n)).astype(npdt) for _ in range(3)]
    b[:64] = 0                                            # division by zero, inf - inf ...
    got = _on_pocl(lambda x, y, z: tirx.max((x + y) * z - x / y, z), [(v.view(np.uint16), fmt) for v in (a, b, c)],
                   fmt).view(npdt)
    with np.errstate(all="ignore"):
        want = np.fmax(((a + b).astype(npdt) * c).astype(npdt) - (a / b).astype(npdt), c).astype(npdt)
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all()
    zeros = (got == 0) & (want == 0)                      # max(-0, +0): either zero
    np.testing.assert_array_equal(got[~nan & ~zeros].view(np.uint16), want[~nan & ~zeros].view(np.uint16))
    with np.errstate(all="ignore"):
        assert (got.astype(np.float32) != ((a.astype(np.float32) + b) * c - a / b)).any()   # not float32


@pytest.fixture(scope="module")
def mlp():
    return make("mlp")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_package_on_cuda_sim_matches_float64(tmp_path, mlp, dtype):
    fwd, _, x, _ = mlp
    pkg = cuda.compile(fwd, str(tmp_path / dtype), dtype=dtype, check=False)
    src = cuda_sim.opencl_source(pkg)
    assert "half" not in src and "bfloat" not in src and "ushort" in src
    r = cuda_sim.check64(pkg, fwd, [x])
    assert r["ok"] and r["guards_clean"] and r["tolerance"] == cuda_sim.TOLERANCE64[dtype], r
    assert r["max_err"] > 1e-5          # rounded to the half format, not float32
    got = cuda_sim.run(pkg, [x])[0]
    np.testing.assert_allclose(got, executor.run(fwd, x)[0], rtol=0, atol=3 * r["max_err"] * np.abs(got).max())


@pytest.mark.slow
def test_float16_training_step_on_cuda_sim(tmp_path, mlp):
    _, step, x, t = mlp
    pkg = cuda.compile_train_step(step, str(tmp_path / "step"), dtype="float16", check=False)
    r = cuda_sim.check64(pkg, step, [x, t])
    assert r["ok"] and r["guards_clean"], r
    assert set(cuda_sim.gradient_outputs(step)) <= set(r["errors"])


def test_kiln_verify_float16_package_on_cuda_sim(tmp_path, mlp, capsys):
    fwd, _, x, _ = mlp
    pkg = cuda.compile(fwd, str(tmp_path / "p"), dtype="float16", check=False)
    np.savez(tmp_path / "g.npz", in_0=x, out_0=executor.run(fwd, x)[0])
    rc = main(["verify", pkg, "--golden", str(tmp_path / "g.npz"), "--target", "cuda-sim", "--json"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and rep["ok"], rep


def _cancelling_graph(spread=3e-3):
    """y = (x - c) * 1000 with x near c (within ``spread``): rounding x to float16 (2^-11
    relative) moves y by O(1) of its scale, however exactly the package computes; ill-conditioned
    at half precision."""
    from kiln.frontend import Graph, TensorType
    g = Graph("cancel")
    g.add_input("x", TensorType((1, 64), "float32"))
    g.add_const("c", np.full((1, 64), 1.0001, np.float32))
    g.add_const("k", np.full((1, 64), 1000.0, np.float32))
    g.add_node("sub", ["x", "c"], {}, name="d")
    g.add_node("mul", ["d", "k"], {}, name="y")
    g.outputs = ["y"]
    x = (1.0001 + np.random.default_rng(0).uniform(-spread, spread, (1, 64))).astype(np.float32)
    return g, x


def test_rounding_floor_measures_what_half_storage_alone_costs():
    g, x = _cancelling_graph()
    want, _ = cuda_sim.reference64(g, [x])
    inputs16 = cuda_sim.rounding_floor64(g, [x], want, None, "float16", values=False)["y"]
    floor16 = cuda_sim.rounding_floor64(g, [x], want, None, "float16")["y"]
    floor32 = cuda_sim.rounding_floor64(g, [x], want, None, "float32")["y"]
    assert 0.05 < inputs16 <= floor16 < 0.5 and floor32 == 0.0     # float32 values are not rounded
    f32 = {"x": "float32", "c": "float32", "k": "float32"}
    keep = cuda_sim.rounding_floor64(g, [x], want, None, "float16", storage=dict(f32, d="float32", y="float32"))
    assert keep["y"] == 0.0                        # values the package keeps in float32 are not rounded
    stored = cuda_sim.rounding_floor64(g, [x], want, None, "float16", storage=f32)["y"]
    assert 0 < stored < 2.0 ** -10                 # d and y stored in float16: rounded where computed
    bound, _, floor = cuda_sim.bounds64(g, [x], want, None, "float16")
    assert floor["y"] == floor16 and bound["y"] == min(cuda_sim.FLOOR_CAP, 4 * floor16)


def test_ill_conditioned_half_package_is_held_to_its_rounding_floor(tmp_path):
    """The float16 package of the cancelling graph is far off float64 (its input rounded to half)
    yet within PEER_FACTOR x the floor (at most FLOOR_CAP); a wrong result would not be."""
    g, x = _cancelling_graph()
    pkg = cuda.compile(g, str(tmp_path / "p"), dtype="float16", check=False)
    r = cuda_sim.check64(pkg, g, [x])
    assert r["ok"] and r["max_err"] > cuda_sim.TOLERANCE64["float16"], r
    assert r["max_err"] <= 2 * r["rounding_floor"]["y"], r
    want, _ = cuda_sim.reference64(g, [x])
    assert cuda_sim.errors64(g, [-want[0]], want)["y"] > r["bound"]      # a sign error fails


def test_half_output_beyond_float64_passes_only_launch_by_launch(tmp_path):
    """Closer to c the float16 floor passes FLOOR_CAP / PEER_FACTOR: float64 can no longer tell a
    wrong result from rounding (mobilenet-v1-0.25's half training steps). check64 then holds the
    output to PEER_FACTOR x its floor only once every launch agrees with its unscheduled step;
    without that check, or with a launch that covers half its grid, it fails."""
    g, x = _cancelling_graph(spread=4e-4)
    pkg = cuda.compile(g, str(tmp_path / "p"), dtype="float16", check=False)
    alone = cuda_sim.check64(pkg, g, [x], launch_check=False)
    floor = alone["rounding_floor"]["y"]
    assert alone["beyond_float64"] == ["y"] and cuda_sim.PEER_FACTOR * floor > cuda_sim.FLOOR_CAP, alone
    assert not alone["ok"] and alone["stepwise"] is None and alone["bound"] == cuda_sim.FLOOR_CAP
    r = cuda_sim.check64(pkg, g, [x])
    assert r["ok"] and r["stepwise"]["ok"] and r["stepwise"]["checked"] == r["stepwise"]["steps"] >= 1, r
    assert r["bound"] == cuda_sim.PEER_FACTOR * floor and r["max_err"] <= 2 * floor
    bad, _ = corrupted(pkg, str(tmp_path / "bad"), 0, factor=32)     # 32 of 64 elements written
    rb = cuda_sim.check64(bad, g, [x])
    assert not rb["ok"] and not rb["stepwise"]["ok"] and rb["stepwise"]["failing_step"] == 0, rb
