"""FULLY_CONNECTED with TensorFlow Lite Micro's requantisation (the dense node's requant "fixed")
in C: the batch-1 kernels ``kiln_fc_mv_s8_fx`` / ``kiln_fc_mv_s8_b_fx`` (kiln_dense.h, both forms
of ``ops_dense.fixed_constants``) and ``kiln_mve_fc_s8_fx`` (kiln_mve.h, portable C here) equal the
int8 reference; whole graphs compiled for the host with Kiln kernels and with TVM's default
schedule (the conv's requantisation epilogue, also taken by a weight zero point), and 16x8 layers
with int32 and int64 biases, equal the reference."""
import ctypes
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.backends import compile as compile_pkg
from kiln.backends import cpus
from kiln.backends.ops_dense import fixed_constants, prepare_dense
from kiln.backends.ops_helium import prepare_fc
from kiln.frontend import Graph, QParams, TensorType, run
from kiln.frontend.ops.nn import dense_int8
from tests.backends.fc_kernel_util import c_library, fc_case, ptr

WRAPPER = r"""
#include "kiln_mve.h"
void mv(const int8_t *x, int32_t rows, int32_t K, int32_t N, const int8_t *w, const int32_t *m, const int32_t *rq,
        int32_t mstep, uint32_t c1, uint32_t c2, int32_t zy, int32_t lo, int32_t hi, int8_t *y)
{
    kiln_fc_mv_s8_fx(x, rows, K, N, w, m, rq, mstep, c1, c2, zy, lo, hi, y);
}
void mvb(const int8_t *x, int32_t rows, int32_t K, int32_t N, const int8_t *w, const int32_t *b, const int32_t *m,
         const int32_t *rq, int32_t mstep, uint32_t c1, uint32_t c2, int32_t zy, int32_t lo, int32_t hi, int8_t *y)
{
    kiln_fc_mv_s8_b_fx(x, rows, K, N, w, b, m, rq, mstep, c1, c2, zy, lo, hi, y);
}
void mve(const int8_t *x, int32_t rows, int32_t K, int32_t N, const int8_t *w, const int32_t *b, const int32_t *m,
         const int32_t *rq, int32_t mstep, uint32_t c1, uint32_t c2, int32_t zy, int32_t lo, int32_t hi, int8_t *y)
{
    kiln_mve_fc_s8_fx(x, rows, K, N, w, b, m, rq, mstep, c1, c2, zy, lo, hi, y);
}
"""
FIXED = {"requant": "fixed"}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return c_library(tmp_path_factory, "dense_fx", WRAPPER)


def _tail(p, zy, y):
    return [ptr(p["m"]), ptr(p["rq"]), p["mstep"], ctypes.c_uint32(p["c1"]), ctypes.c_uint32(p["c2"]), zy, p["lo"],
            p["hi"], ptr(y, ctypes.c_int8)]


@settings(max_examples=80, deadline=None)
@given(rows=st.integers(1, 3), K=st.integers(1, 70), N=st.integers(1, 13), per_channel=st.booleans(),
       act=st.sampled_from(["none", "relu", "relu6"]), big=st.booleans(), seed=st.integers(0, 2 ** 31))
def test_kernels_equal_int8_reference(lib, rows, K, N, per_channel, act, big, seed):
    """big: multipliers 1.2 to 1.5, left shifts (kiln_mbqm, form 0); otherwise mostly the SMMULR
    form (form 0 where a multiplier reaches 1/2)."""
    rng = np.random.default_rng(seed)
    w, b, (tx, tw, tb), ty, attrs = fc_case(rng, rows, K, N, per_channel, act, big)
    x = rng.integers(-128, 128, (rows, K)).astype(np.int8)
    want = dense_int8([x, w, b], {**attrs, **FIXED}, [tx, tw, tb], ty)
    zx, zy = tx.quant.zero_point[0], ty.quant.zero_point[0]
    ws = np.broadcast_to(np.asarray(tw.quant.scale), (N,))
    sx, sy = tx.quant.scale[0], ty.quant.scale[0]
    for apart in (False, True):
        p = prepare_dense(w, b, zx, sx, ws, sy, zy, act, bias_apart=apart, fixed=True)
        assert p["c1"] == 0 or not big           # big: left shifts, kiln_mbqm (the SMMULR form needs e >= 1)
        y = np.zeros((rows, N), np.int8)
        stream = np.ascontiguousarray(p["stream"])
        head = [ptr(x, ctypes.c_int8), rows, K, N, ptr(stream, ctypes.c_int8)]
        (lib.mvb if apart else lib.mv)(*head, *([ptr(p["bias"])] if apart else []), *_tail(p, zy, y))
        np.testing.assert_array_equal(y, want, err_msg=f"kiln_fc_mv_s8{'_b' if apart else ''}_fx")
    p = prepare_fc(w, b, zx, sx, ws, sy, zy, act, fixed=True)
    y = np.zeros((rows, N), np.int8)
    lib.mve(ptr(x, ctypes.c_int8), rows, K, N, ptr(p["w"], ctypes.c_int8), ptr(p["bias"]), *_tail(p, zy, y))
    np.testing.assert_array_equal(y, want, err_msg="kiln_mve_fc_s8_fx")


def test_fixed_constants_forms():
    rq, form = fixed_constants(0.1, [0.002, 0.003], 0.5, bound=100_000, zy=3)
    assert form == 1 and rq.size == 6 and (rq[2::3] >= 1).all() and (rq[1::3] == 1 << (rq[2::3] - 1)).all()
    rq, form = fixed_constants(0.1, [0.002], 0.5, bound=2 ** 30, zy=3)     # 2 * acc would overflow
    assert form == 0 and rq.size == 3
    rq, form = fixed_constants(1.0, [1.0], 0.7, bound=1000, zy=0)          # a left shift
    assert form == 0 and rq[1] == 1 and rq[2] == 0


def _graph(rng, wzp=False):
    """Three dense layers, 2 rows: per-channel, per-tensor, and per-tensor weights with a zero point
    (TVM's loop with the conv's requantisation epilogue) when ``wzp``."""
    g = Graph("fc_fixed")
    g.add_input("x", TensorType((2, 13), "int8", QParams((0.05,), (3,))))
    src, K = "x", 13
    for i, (N, pc, act) in enumerate([(22, True, "relu"), (30, False, "none"), (7, False, "relu6")]):
        w, b, (tx, tw, tb), ty, attrs = fc_case(rng, 2, K, N, pc, act, qin=g.types[src].quant)
        if wzp and i == 2:
            tw = TensorType(tw.shape, "int8", QParams(tw.quant.scale, (5,)))
        g.add_const(f"w{i}", w, tw.quant)
        g.add_const(f"b{i}", b, tb.quant)
        g.add_node("dense", [src, f"w{i}", f"b{i}"], {**attrs, **FIXED}, name=f"d{i}",
                   out_type=TensorType((2, N), "int8", ty.quant))
        src, K = f"d{i}", N
    g.outputs = [src]
    return g


@pytest.mark.parametrize("target", ["host", "plain"])
@pytest.mark.parametrize("wzp", [False, True])
def test_graph_on_host_equals_reference(target, wzp, tmp_path):
    rng = np.random.default_rng(5 + wzp)
    g = _graph(rng, wzp)
    t = dataclasses.replace(cpus.get("cortex-m3"), kernels=False) if target == "plain" else target
    pkg = compile_pkg(g, target=t, out_dir=str(tmp_path / "p"), plot=False, measure_size=False)
    src = (tmp_path / "p" / "kernels.c").read_text()
    assert ("kiln_fc_mv_s8_fx(" in src) == (target == "host")      # the kernel, or TVM's loops
    assert "kiln_fc_s8" not in src                                  # never LiteRT's requantisation
    for _ in range(3):
        x = rng.integers(-128, 128, (2, 13)).astype(np.int8)
        np.testing.assert_array_equal(pkg.run(x)[0], run(g, x)[0])


@pytest.mark.parametrize("bias", [None, "int32", "int64"])
def test_16x8_on_host_equals_reference(bias, tmp_path):
    rng = np.random.default_rng(len(bias or ""))
    g = Graph("fc16")
    in_s, w_s, K, N = 2.0 ** -10, 2.0 ** -7, 24, 10
    g.add_input("x", TensorType((2, K), "int16", QParams((in_s,), (0,))))
    g.add_const("w", rng.integers(-127, 128, (N, K)).astype(np.int8), QParams((w_s,), (0,)))
    ins = ["x", "w"]
    if bias:
        g.add_const("b", rng.integers(-(1 << 20), 1 << 20, N).astype(bias), QParams((in_s * w_s,), (0,)))
        ins.append("b")
    g.add_node("dense", ins, {"activation": "none", "requant": "fixed"}, name="y",
               out_type=TensorType((2, N), "int16", QParams((in_s * w_s * 300,), (0,))))
    g.outputs = ["y"]
    pkg = compile_pkg(g, target="host", out_dir=str(tmp_path / "p"), plot=False, measure_size=False)
    for _ in range(3):
        x = rng.integers(-32768, 32768, (2, K)).astype(np.int16)
        np.testing.assert_array_equal(pkg.run(x)[0], run(g, x)[0])


def test_cuda_package_follows_tflm(tmp_path):
    """ad01 compiled for CUDA with TensorFlow Lite Micro's semantics: the launch plan interpreted on
    the CPU (and the kernels on pocl, when there) gives TFLite Micro's interpreter's outputs."""
    import os
    pytest.importorskip("tflite_micro.python.tflite_micro.runtime")
    from kiln import tflm
    from kiln.backends import cuda
    from kiln.frontend import load_model
    path = "/work/shared/models/ad01_int8.tflite"
    if not os.path.exists(path):
        pytest.skip(f"{path} not found")
    gold = np.load(path.replace(".tflite", ".golden.npz"))
    xs = [gold[f"in_{k}"] for k in range(3)]
    want = tflm.run_tflm(path, [(x,) for x in xs])
    pkg = cuda.compile(load_model(path, semantics="tflm"), str(tmp_path / "cu"), arch="sm_80", check=None)
    assert cuda.load_manifest(pkg).semantics == "tflm"
    for x, w in zip(xs, want):
        np.testing.assert_array_equal(cuda.interpret_plan(pkg, [x])[0].reshape(-1), w[0].reshape(-1))
    from kiln.backends import cuda_sim
    try:
        sim = cuda_sim.Simulator(pkg)
    except cuda_sim.SimUnavailable:
        return                                   # no OpenCL CPU device: the plan interpreter above
    for x, w in zip(xs, want):
        np.testing.assert_array_equal(sim(x)[0].reshape(-1), w[0].reshape(-1))
