"""Helium (MVE) kernels for batch-1 int8 FULLY_CONNECTED, ADD and MUL (backends/include/kiln_mve.h,
lowered by backends/ops_helium.py and ops_mve.py): their portable C versions equal the int8
references over random scales, zero points, activation ranges and odd lengths (hypothesis), the
FULLY_CONNECTED requantisation at and around halves, where the fast path must hand over to
kiln_fc_rq; and the MVE versions on the emulated Cortex-M55 (mps3-an547) equal the reference on a
graph of dense layers (odd K and N, two rows, per-channel weights, one layer whose multiplier is
above 1/2 so every lane takes the exact path) and same-shape adds and multiplies of odd lengths."""
import ctypes
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln import hil
from kiln.backends import compile as compile_pkg
from kiln.backends import ops_mve
from kiln.backends.ops_dense import requant_guard
from kiln.backends.ops_helium import prepare_fc
from kiln.frontend import Graph, QParams, TensorType, run
from kiln.frontend.ops.elementwise import add_int8, mul_int8
from kiln.frontend.ops.nn import dense_int8, fc_requant_constants, fc_requantize
from tests.backends.fc_kernel_util import c_library, fc_case, lim, near_halves, ptr
from tests.firmware.helpers import need_qemu

WRAPPER = r"""
#include "kiln_mve.h"
void rq_many(const int32_t *acc, const int32_t *m, const int32_t *rq, uint32_t c1, uint32_t c2, int32_t *out,
             int32_t n)
{
    for (int32_t i = 0; i < n; ++i) out[i] = kiln_mve_fc_rq1(acc[i], m[i], rq + 3 * i, c1, c2);
}
void fc(const int8_t *x, int32_t rows, int32_t K, int32_t N, const int8_t *w, const int32_t *b, const int32_t *m,
        const int32_t *rq, int32_t mstep, uint32_t c1, uint32_t c2, int32_t zy, int32_t lo, int32_t hi, int8_t *y)
{
    kiln_mve_fc_s8(x, rows, K, N, w, b, m, rq, mstep, c1, c2, zy, lo, hi, y);
}
void add(const int8_t *a, const int8_t *b, int32_t n, const int32_t *p, int8_t *y) { kiln_mve_add_s8(a, b, n, p, y); }
void mul(const int8_t *a, const int8_t *b, int32_t n, const int32_t *p, int8_t *y) { kiln_mve_mul_s8(a, b, n, p, y); }
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return c_library(tmp_path_factory, "mve_fc", WRAPPER)


def test_fc_requant_near_halves(lib):
    """eff = (k + 1/2) / acc and the doubles one and two units away: products on, just under and
    just over a half."""
    acc, eff = near_halves(np.random.default_rng(4), 20_000)
    mh, ml, sh = fc_requant_constants(eff)
    m, c1, c2 = requant_guard(60_000, mh, ml, sh)
    assert c2 > 0
    rq = np.ascontiguousarray(np.stack([mh, ml, sh], axis=1).astype(np.uint32).view(np.int32))
    acc = np.ascontiguousarray(acc, np.int32)
    out = np.empty_like(acc)
    lib.rq_many(ptr(acc), ptr(m), ptr(rq), ctypes.c_uint32(c1), ctypes.c_uint32(c2), ptr(out), ctypes.c_int32(acc.size))
    np.testing.assert_array_equal(lim(out.astype(np.int64)), lim(fc_requantize(acc, eff)))


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 3), K=st.integers(1, 70), N=st.integers(1, 13), per_channel=st.booleans(),
       act=st.sampled_from(["none", "relu", "relu6"]), big=st.booleans(), seed=st.integers(0, 2 ** 31))
def test_fc_equals_int8_reference(lib, rows, K, N, per_channel, act, big, seed):
    rng = np.random.default_rng(seed)
    w, b, (tx, tw, tb), ty, attrs = fc_case(rng, rows, K, N, per_channel, act, big)
    x = rng.integers(-128, 128, (rows, K)).astype(np.int8)
    want = dense_int8([x, w, b], attrs, [tx, tw, tb], ty)
    ws = np.broadcast_to(np.asarray(tw.quant.scale), (N,))
    p = prepare_fc(w, b, tx.quant.zero_point[0], tx.quant.scale[0], ws, ty.quant.scale[0], ty.quant.zero_point[0], act)
    assert p["c2"] == 0 or not big          # big: multipliers above 1/2, the exact path for every lane
    y = np.zeros((rows, N), np.int8)
    lib.fc(ptr(x, ctypes.c_int8), rows, K, N, ptr(p["w"], ctypes.c_int8), ptr(p["bias"]), ptr(p["m"]), ptr(p["rq"]),
           p["mstep"], ctypes.c_uint32(p["c1"]), ctypes.c_uint32(p["c2"]), ty.quant.zero_point[0], p["lo"], p["hi"],
           ptr(y, ctypes.c_int8))
    np.testing.assert_array_equal(y, want)


def _types(rng, n):
    """Two int8 operands and an output of n elements, random scales (over three decades) and zero points."""
    s = [float(np.float32(v)) for v in 10.0 ** rng.uniform(-3, 0, 3)]
    z = [int(v) for v in rng.integers(-128, 128, 3)]
    return [TensorType((n,), "int8", QParams((s[i],), (z[i],))) for i in range(3)]


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 41), op=st.sampled_from(["add", "mul"]), lo=st.integers(-128, 127), span=st.integers(0, 255),
       seed=st.integers(0, 2 ** 31))
def test_add_mul_equal_int8_reference(lib, n, op, lo, span, seed):
    rng = np.random.default_rng(seed)
    t1, t2, ty = _types(rng, n)
    hi = min(lo + span, 127)
    a, b = (rng.integers(-128, 128, n).astype(np.int8) for _ in range(2))
    ref = (add_int8 if op == "add" else mul_int8)([a, b], {}, [t1, t2], ty)
    want = np.clip(np.asarray(ref, np.int64), lo, hi)        # an activation clamp after the op
    params = (ops_mve.add_params if op == "add" else ops_mve.mul_params)(t1, t2, ty, lo, hi)
    y = np.zeros(n, np.int8)
    getattr(lib, op)(ptr(a, ctypes.c_int8), ptr(b, ctypes.c_int8), n, ptr(params), ptr(y, ctypes.c_int8))
    np.testing.assert_array_equal(y, want)


def _graph(rng):
    """dense (2 x 19 -> 19, relu), add(x, dense), mul(add, dense) (38 elements) + relu6, dense
    19 -> 7 (multiplier above 1/2: every lane exact), dense 7 -> 5 (relu6, per-tensor), add of that
    with itself (10 elements) + relu: the relus on the same quantisation are clamps the add / mul
    kernels apply (TFLite's fused activations)."""
    g = Graph("mve_fc_add_mul")
    qx = QParams((0.05,), (3,))
    g.add_input("x", TensorType((2, 19), "int8", qx))
    src, K, qin = "x", 19, qx
    for i, (N, pc, act, big) in enumerate([(19, True, "relu", False), (7, True, "none", True),
                                           (5, False, "relu6", False)]):
        w, b, (tx, tw, tb), ty, attrs = fc_case(rng, 2, K, N, pc, act, big, qin)
        if i == 0:
            ty = TensorType((2, N), "int8", QParams((0.07,), (-9,)))
        qin = ty.quant
        g.add_const(f"w{i}", w, tw.quant)
        g.add_const(f"b{i}", b, tb.quant)
        g.add_node("dense", [src, f"w{i}", f"b{i}"], attrs, name=f"d{i}", out_type=TensorType((2, N), "int8", ty.quant))
        src, K = f"d{i}", N
        if i == 0:
            g.add_node("add", ["x", "d0"], {}, name="a0", out_type=TensorType((2, 19), "int8", QParams((0.09,), (5,))))
            qin = QParams((0.2,), (-7,))
            g.add_node("mul", ["a0", "d0"], {}, name="m0", out_type=TensorType((2, 19), "int8", qin))
            g.add_node("relu6", ["m0"], {}, name="r0", out_type=TensorType((2, 19), "int8", qin))
            src = "r0"
    qa = QParams((0.03,), (11,))
    g.add_node("add", [src, src], {}, name="a1", out_type=TensorType((2, 5), "int8", qa))
    g.add_node("relu", ["a1"], {}, name="r1", out_type=TensorType((2, 5), "int8", qa))
    g.outputs = ["r1"]
    return g.validate()


def test_fc_add_mul_on_host_match_reference(tmp_path):
    rng = np.random.default_rng(5)
    g = _graph(rng)
    pkg = compile_pkg(g, target="cortex-m55", out_dir=tmp_path / "p", plot=False, measure_size=False)
    src = (tmp_path / "p" / "kernels.c").read_text()
    assert all(f"{fn}(" in src for fn in ("kiln_mve_fc_s8", "kiln_mve_add_s8", "kiln_mve_mul_s8"))
    plan = (tmp_path / "p" / "plan.txt").read_text()
    assert "scratch_add" not in plan and "scratch_mul" not in plan      # the relus fused: no buffer between
    for _ in range(3):
        x = rng.integers(-128, 128, (2, 19)).astype(np.int8)
        np.testing.assert_array_equal(pkg.run(x)[0], run(g, x)[0])


@pytest.mark.slow
def test_fc_add_mul_on_mps3_an547_match_reference(tmp_path):
    need_qemu()
    rng = np.random.default_rng(6)
    g = _graph(rng)
    img, pkg = hil.build_for_board(g, "mps3-an547", str(tmp_path / "b"))
    src = open(os.path.join(pkg, "kernels.c")).read()
    assert all(f"{fn}(" in src for fn in ("kiln_mve_fc_s8", "kiln_mve_add_s8", "kiln_mve_mul_s8"))
    xs = [rng.integers(-128, 128, (2, 19)).astype(np.int8) for _ in range(4)]
    res = hil.run_on_board(img, pkg, xs)
    for x, got in zip(xs, res.outputs):
        np.testing.assert_array_equal(got[0] if isinstance(got, list) else got, run(g, x)[0])
