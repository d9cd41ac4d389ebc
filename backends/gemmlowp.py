"""gemmlowp fixed-point primitives as TIR expressions (run time), the counterparts of
``kiln.frontend.fixedpoint``. Used by the int8 softmax: exp of the possible input differences
(those above diff_min) is tabulated at compile time with the int8 reference's functions; the
reciprocal of the sum runs in the kernel."""
from __future__ import annotations

from tvm import tirx

from . import qmath
from .qmath import c

INT_MAX, INT_MIN = 2**31 - 1, -2**31


def srmbpot_tir(x, e):
    """SaturatingRoundingMultiplyByPOT<e>."""
    if e > 0:
        thr = (1 << (31 - e)) - 1
        return qmath._bind("sx", x, lambda xv: tirx.Select(xv > c(thr), c(INT_MAX),
                                                          tirx.Select(xv < c(-thr), c(INT_MIN), xv << c(e))))
    return qmath.rdbpot(x, -e)


def rounding_half_sum_max(a):
    """RoundingHalfSum(a, INT32_MAX): the half denominator of one_over_one_plus_x_for_x_in_0_1."""
    return qmath._bind("hs", a.astype("int64") + c(INT_MAX, "int64"), lambda s: tirx.truncdiv(
        s + tirx.Select(s >= c(0, "int64"), c(1, "int64"), c(-1, "int64")), c(2, "int64")).astype("int32"), "int64")


def newton_step(hd, x):
    """One Newton-Raphson iteration of gemmlowp's one_over_one_plus_x_for_x_in_0_1 (F2 format):
    x + Rescale<2>(x * (1 - hd * x)). Start: 48/17 - 32/17 * hd; result: Rescale<0>(x / 2)."""
    return x + srmbpot_tir(qmath.srdhm(x, c(1 << 29) - qmath.srdhm(hd, x)), 2)


def clz_positive(x):
    """Count leading zeros of a positive int32 expression."""
    n = c(0)
    for k in range(1, 32):
        n = n + tirx.Select(x < c(1 << (32 - k)) if 32 - k < 31 else x >= c(0), c(1), c(0))
    return n
