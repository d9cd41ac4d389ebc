"""int8 FULLY_CONNECTED requantisation: ``kiln_fc_rq`` (kiln_intrinsics.h, integer-only, every
target) equals the reference ``fc_requantize`` (``round(double(acc) * eff)``, LiteRT's reference
kernel) for every accumulator and effective scale tried: random int32 accumulators over the whole
range, effective scales from 1e-9 to 1e3, and products constructed to land on, just below and just
above a half (where the double product's own rounding and round's ties decide the result)."""
import ctypes
import os
import subprocess

import numpy as np
import pytest

from kiln.frontend.ops.nn import fc_requant_constants, fc_requantize

INCLUDE = os.path.join(os.path.dirname(__file__), "..", "..", "backends", "include")
WRAPPER = r"""
#include "kiln_intrinsics.h"
void fc_rq_many(const int32_t *acc, const uint32_t *mh, const uint32_t *ml, const int32_t *s, int32_t *out, int32_t n)
{
    for (int32_t i = 0; i < n; ++i) out[i] = kiln_fc_rq(acc[i], mh[i], ml[i], s[i]);
}
void fc_d_many(const int32_t *acc, const double *eff, int32_t *out, int32_t n)
{   /* what LiteRT's reference kernel computes, on this host's double FPU */
    for (int32_t i = 0; i < n; ++i) {
        const double v = __builtin_round((double)acc[i] * eff[i]);
        out[i] = v >= 2147483647.0 ? 2147483647 : (v <= -2147483648.0 ? (-2147483647 - 1) : (int32_t)v);
    }
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("fcrq")
    src, so = d / "w.c", d / "w.so"
    src.write_text(WRAPPER)
    for opt in ("-O2",):
        subprocess.run(["gcc", opt, "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-I", INCLUDE,
                        "-o", str(so), str(src)], check=True)
    lib = ctypes.CDLL(str(so))
    return lib


def _ptr(a, t):
    return a.ctypes.data_as(ctypes.POINTER(t))


def run_c(lib, acc, eff):
    acc = np.ascontiguousarray(acc, np.int32)
    eff = np.ascontiguousarray(np.broadcast_to(eff, acc.shape), np.float64)
    mh, ml, s = fc_requant_constants(eff)
    mh, ml, s = mh.astype(np.uint32), ml.astype(np.uint32), s.astype(np.int32)
    out, outd = np.empty_like(acc), np.empty_like(acc)
    lib.fc_rq_many(_ptr(acc, ctypes.c_int32), _ptr(mh, ctypes.c_uint32), _ptr(ml, ctypes.c_uint32),
                   _ptr(s, ctypes.c_int32), _ptr(out, ctypes.c_int32), ctypes.c_int32(acc.size))
    lib.fc_d_many(_ptr(acc, ctypes.c_int32), _ptr(eff, ctypes.c_double), _ptr(outd, ctypes.c_int32),
                  ctypes.c_int32(acc.size))
    return out.astype(np.int64), outd.astype(np.int64)


def check(lib, acc, eff):
    acc = np.asarray(acc, np.int64)
    eff = np.broadcast_to(np.asarray(eff, np.float64), acc.shape)
    got, dbl = run_c(lib, acc, eff)
    want = fc_requantize(acc, eff)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, (f"{bad.size} of {acc.size} differ, e.g. acc={acc[bad[0]]} eff={eff[bad[0]]!r}: "
                           f"kiln_fc_rq {got[bad[0]]}, reference {want[bad[0]]}")
    bad = np.nonzero(dbl != want)[0]
    assert bad.size == 0, f"host double arithmetic disagrees with the reference at acc={acc[bad[0]]} eff={eff[bad[0]]!r}"


def test_random_accumulators_and_scales(lib):
    rng = np.random.default_rng(1)
    n = 200_000
    acc = rng.integers(-(1 << 31), 1 << 31, n)
    small = rng.integers(-70000, 70000, n)            # the usual magnitude of a dense accumulator
    acc = np.where(rng.random(n) < 0.7, small, acc)
    eff = 10.0 ** rng.uniform(-9, 3, n)
    check(lib, acc, eff)


def test_products_at_and_around_half(lib):
    """eff chosen so that acc * eff is n + 0.5 to within a few ulps: the double product rounds
    (ties to even) and round() breaks the tie away from zero."""
    rng = np.random.default_rng(2)
    acc = rng.integers(1, 1 << 20, 50_000) * rng.choice([-1, 1], 50_000)
    n = rng.integers(0, 300, acc.size)
    base = (n + 0.5) / np.abs(acc)
    for k in range(-4, 5):
        check(lib, acc, np.nextafter(base, np.inf) if k > 0 else base)
        base = np.nextafter(base, np.inf if k >= 0 else -np.inf)
    # exact halves: acc * eff representable and exactly n + 0.5
    acc2 = rng.integers(1, 1 << 12, 20_000) * 2
    eff2 = (2 * rng.integers(0, 100, acc2.size) + 1) / acc2.astype(np.float64)
    check(lib, np.concatenate([acc2, -acc2]), np.concatenate([eff2, eff2]))


def test_fast_path_window_with_large_accumulators(lib):
    """kiln_fc_rq's fast path (eff < 1/2) bounds the product from one 32x32 multiply and falls back
    to the exact path within ~|acc| / 2^t of a half: large accumulators widen that window and make
    the double product's own rounding largest, so probe products a few ulps around n + 0.5 there."""
    rng = np.random.default_rng(4)
    acc = rng.integers(1 << 20, 1 << 31, 40_000) * rng.choice([-1, 1], 40_000)
    n = rng.integers(0, 1 << 20, acc.size)
    base = (n + 0.5) / np.abs(acc)
    lo = base
    for _ in range(6):
        check(lib, acc, base)
        check(lib, acc, lo)
        base, lo = np.nextafter(base, np.inf), np.nextafter(lo, -np.inf)
    check(lib, acc, rng.uniform(0.0, 0.5, acc.size))


def test_edges(lib):
    accs = np.array([0, 1, -1, 2, -2, (1 << 31) - 1, -(1 << 31), 12345, -12345] * 7, np.int64)
    effs = np.repeat([0.0, 1e-30, 5e-10, 0.25, 0.5, 1.0, 3e9], 9)
    check(lib, accs, effs)


def test_effective_scale_constants_are_exact():
    eff = 10.0 ** np.random.default_rng(3).uniform(-12, 6, 1000)
    mh, ml, s = fc_requant_constants(eff)
    back = [np.ldexp(float((int(h) << 32) | int(lo)), -int(e)) for h, lo, e in zip(mh, ml, s)]
    assert np.array_equal(np.asarray(back), eff)
    assert ((mh >> 20) == 1).all()      # 53-bit significands: 2^52 <= m < 2^53
