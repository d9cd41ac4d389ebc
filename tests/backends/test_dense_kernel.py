"""The batch-1 int8 FULLY_CONNECTED kernel ``kiln_fc_mv_s8`` (backends/include/kiln_dense.h,
lowered by backends/ops_dense.py): its fast requantisation equals LiteRT's double-precision one
(``fc_requantize``) for accumulators up to the compile-time bound, including products constructed
at and around a half; the whole kernel (portable C, host) equals the int8 reference for odd K and
N, several rows, per-tensor and per-channel weights (hypothesis); and the firmware on QEMU
(Cortex-M4: the SMLAD assembly loop; Cortex-M3: the portable C) equals the reference on a graph
whose K values take every entry path of the unrolled loop."""
import ctypes
import os
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.backends.ops_dense import acc_bound, pack_dense, prepare_dense, requant_guard
from kiln.frontend import Graph, QParams, TensorType, save
from kiln.frontend.ops.nn import dense_int8, fc_effective_scales, fc_requant_constants, fc_requantize
from tests.backends.fc_kernel_util import c_library, fc_case, lim, near_halves, ptr

WRAPPER = r"""
#include "kiln_intrinsics.h"
void rq_many(const int32_t *acc, const int32_t *m, const int32_t *rq, uint32_t c1, uint32_t c2, int32_t *out,
             int32_t n)
{
    for (int32_t i = 0; i < n; ++i) out[i] = kiln_dense_rq(acc[i], m[i], rq + 3 * i, c1, c2);
}
void mv(const int8_t *x, int32_t rows, int32_t K, int32_t N, const int8_t *w, const int32_t *m, const int32_t *rq,
        int32_t mstep, uint32_t c1, uint32_t c2, int32_t zy, int32_t lo, int32_t hi, int8_t *y)
{
    kiln_fc_mv_s8(x, rows, K, N, w, m, rq, mstep, c1, c2, zy, lo, hi, y);
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return c_library(tmp_path_factory, "dense", WRAPPER)


def _rq_c(lib, acc, eff, bound):
    mh, ml, sh = fc_requant_constants(eff)
    m, c1, c2 = requant_guard(bound, mh, ml, sh)
    rq = np.ascontiguousarray(np.stack([mh, ml, sh], axis=1).astype(np.uint32).view(np.int32))
    acc = np.ascontiguousarray(acc, np.int32)
    out = np.empty_like(acc)
    lib.rq_many(ptr(acc), ptr(m), ptr(rq), ctypes.c_uint32(c1), ctypes.c_uint32(c2), ptr(out), ctypes.c_int32(acc.size))
    return out.astype(np.int64), c2


def test_fast_requant_random(lib):
    rng = np.random.default_rng(3)
    n = 200_000
    for bound in (1000, 70_000, 5_000_000):
        acc = rng.integers(-bound, bound + 1, n)
        eff = 10.0 ** rng.uniform(-8, np.log10(0.49), n)
        got, c2 = _rq_c(lib, acc, eff, bound)
        assert c2 > 0                                    # the fast path is on
        np.testing.assert_array_equal(lim(got), lim(fc_requantize(acc, eff)))


def test_fast_requant_near_halves(lib):
    """eff = (k + 1/2) / acc, and the doubles one and two units away: products on, just under and
    just over a half, where the fast path must hand over to kiln_fc_rq."""
    acc, eff = near_halves(np.random.default_rng(4), 30_000)
    got, _ = _rq_c(lib, acc, eff, 60_000)
    np.testing.assert_array_equal(lim(got), lim(fc_requantize(acc, eff)))


def test_guard_turns_fast_path_off():
    mh, ml, sh = fc_requant_constants(np.array([0.25, 0.5]))
    assert requant_guard(100, mh, ml, sh)[2] == 0           # eff >= 1/2
    mh, ml, sh = fc_requant_constants(np.array([0.25]))
    assert requant_guard(2 ** 31, mh, ml, sh)[2] == 0       # no room for the guard
    assert requant_guard(100, mh, ml, sh)[2] == 2 ** 32 - 2 * 1124


def test_pack_dense_layout():
    w = np.arange(5 * 6, dtype=np.int8).reshape(5, 6)
    b = np.array([1, -2, 3, -4, 5], np.int32)
    s = pack_dense(w, b)
    blk = s[:16 + 16 * 2]
    assert blk[:16].view("<i4").tolist() == [1, -2, 3, -4]
    assert blk[16:32].tolist() == [0, 1, 2, 3, 6, 7, 8, 9, 12, 13, 14, 15, 18, 19, 20, 21]
    assert blk[32:48].tolist() == [4, 5, 0, 0, 10, 11, 0, 0, 16, 17, 0, 0, 22, 23, 0, 0]
    assert s[48:52].view("<i4").tolist() == [5] and s[52:].tolist() == [24, 25, 26, 27, 28, 29, 0, 0]


def _case(rng, rows, K, N, per_channel, act):
    w, b, in_types, ty, attrs = fc_case(rng, rows, K, N, per_channel, act)
    return rng.integers(-128, 128, (rows, K)).astype(np.int8), w, b, in_types, ty, attrs


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 3), K=st.integers(1, 70), N=st.integers(1, 13), per_channel=st.booleans(),
       act=st.sampled_from(["none", "relu", "relu6"]), seed=st.integers(0, 2 ** 31))
def test_kernel_equals_int8_reference(lib, rows, K, N, per_channel, act, seed):
    rng = np.random.default_rng(seed)
    x, w, b, in_types, ty, attrs = _case(rng, rows, K, N, per_channel, act)
    want = dense_int8([x, w, b], attrs, list(in_types), ty)
    tx, tw, _ = in_types
    ws = np.broadcast_to(np.asarray(tw.quant.scale), (N,))
    p = prepare_dense(w, b, tx.quant.zero_point[0], tx.quant.scale[0], ws, ty.quant.scale[0], ty.quant.zero_point[0],
                      act)
    assert p["mstep"] == (1 if len(set(fc_effective_scales(tx.quant.scale[0], ws, ty.quant.scale[0]))) > 1 else 0)
    y = np.zeros((rows, N), np.int8)
    stream = np.ascontiguousarray(p["stream"])
    lib.mv(ptr(np.ascontiguousarray(x), ctypes.c_int8), rows, K, N, ptr(stream, ctypes.c_int8), ptr(p["m"]),
           ptr(p["rq"]), p["mstep"], ctypes.c_uint32(p["c1"]), ctypes.c_uint32(p["c2"]), ty.quant.zero_point[0],
           p["lo"], p["hi"], ptr(y, ctypes.c_int8))
    np.testing.assert_array_equal(y, want)
    assert acc_bound(w, b, tx.quant.zero_point[0]) < 2 ** 31


def _graph(rng):
    """Five dense layers, 2 rows: K = 13, 22, 30, 7, 3 (3, 5, 7, 1 and 0 groups of 4 plus tails:
    every entry of the unrolled loop), N = 22, 30, 7, 3, 5 (column tails, a layer with no 4-column
    block), per-channel and per-tensor weights."""
    g = Graph("dense_paths")
    g.add_input("x", TensorType((2, 13), "int8", QParams((0.05,), (3,))))
    src, K = "x", 13
    for i, (N, pc, act) in enumerate([(22, True, "relu"), (30, False, "none"), (7, True, "relu6"),
                                               (3, False, "none"), (5, True, "relu")]):
        x, w, b, (tx, tw, tb), ty, attrs = _case(rng, 2, K, N, pc, act)
        g.add_const(f"w{i}", w, tw.quant)
        g.add_const(f"b{i}", b, tb.quant)
        g.add_node("dense", [src, f"w{i}", f"b{i}"], attrs, name=f"d{i}",
                   out_type=TensorType((2, N), "int8", ty.quant))
        src, K = f"d{i}", N
    g.outputs = [src]
    return g


@pytest.mark.parametrize("board", ["mps2-an386", "mps2-an385"])
def test_kernel_on_qemu(board, tmp_path):
    if not shutil.which("arm-none-eabi-gcc") or not shutil.which("qemu-system-arm"):
        pytest.skip("arm-none-eabi-gcc / qemu-system-arm not installed (bash scripts/setup.sh)")
    from kiln import hil
    rng = np.random.default_rng(11)
    model = save(_graph(rng), str(tmp_path / "dense.json"))
    img, pkg = hil.build_for_board(model, board, str(tmp_path / "b"))
    assert "kiln_fc_mv_s8(" in open(os.path.join(pkg, "kernels.c")).read()     # the kernel, not a fallback
    g = hil.package_graph(pkg)
    samples = [rng.integers(-128, 128, (2, 13)).astype(np.int8) for _ in range(3)]
    res = hil.run_on_board(img, pkg, samples)
    want = hil.reference_outputs(g, samples)
    assert all(hil.same_outputs(a, b) for a, b in zip(res.outputs, want))
