"""gemmlowp fixed-point primitives, exact, in Python (compile time) and as TIR expressions
(run time). Used by the int8 softmax: exp of the 256 possible input differences is tabulated at
compile time; the reciprocal of the sum runs in the kernel."""
from __future__ import annotations

from tvm import tirx

from . import qmath
from .qmath import c

INT_MAX, INT_MIN = 2**31 - 1, -2**31


def _wrap(x):
    return (x + 2**31) % 2**32 - 2**31


def srdhm(a, b):
    if a == b == INT_MIN:
        return INT_MAX
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    v = ab + nudge
    q = abs(v) // (1 << 31)
    return q if v >= 0 else -q


def rdbpot(x, e):
    mask = (1 << e) - 1
    rem = x & mask
    thr = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> e) + (1 if rem > thr else 0)


def srmbpot(x, e):
    """SaturatingRoundingMultiplyByPOT<e>."""
    if e == 0:
        return x
    if e > 0:
        thr = (1 << (31 - e)) - 1
        if x > thr:
            return INT_MAX
        if x < -thr:
            return INT_MIN
        return _wrap(x << e)
    return rdbpot(x, -e)


def exp_on_interval_between_negative_one_quarter_and_0_excl(a):
    const_term, c13 = 1895147668, 715827883
    x = _wrap(a + (1 << 28))
    x2 = srdhm(x, x)
    x3 = srdhm(x2, x)
    x4 = srdhm(x2, x2)
    x4_over_4 = srmbpot(x4, -2)
    t = srmbpot(_wrap(srdhm(_wrap(x4_over_4 + x3), c13) + x2), -1)
    return _wrap(const_term + srdhm(const_term, _wrap(x + t)))


_BARREL = [(-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308), (2, 39332535),
           (3, 720401), (4, 242)]


def exp_on_negative_values(a, int_bits):
    frac = 31 - int_bits
    one_quarter = 1 << (frac - 2)
    mask = one_quarter - 1
    a_mod = _wrap((a & mask) - one_quarter)
    result = exp_on_interval_between_negative_one_quarter_and_0_excl(srmbpot(a_mod, int_bits))
    remainder = _wrap(a_mod - a)
    for exponent, mult in _BARREL:
        if int_bits > exponent and remainder & (1 << (frac + exponent)):
            result = srdhm(result, mult)
    if int_bits > 5:
        clamp_b = 36 - int_bits
        if a < -(1 << clamp_b):
            result = 0
    if a == 0:
        result = INT_MAX
    return result


# ---- run time (TIR) -------------------------------------------------------------------------
def srmbpot_tir(x, e):
    if e > 0:
        thr = (1 << (31 - e)) - 1
        return tirx.Select(x > c(thr), c(INT_MAX), tirx.Select(x < c(-thr), c(INT_MIN), x << c(e)))
    return qmath.rdbpot(x, -e)


def one_over_one_plus_x_for_x_in_0_1(a):
    """gemmlowp's Newton-Raphson reciprocal, unrolled (3 iterations), as one TIR expression
    with Let-bound intermediates."""
    s = a.astype("int64") + c(INT_MAX, "int64")
    half = tirx.truncdiv(s + tirx.Select(s >= c(0, "int64"), c(1, "int64"), c(-1, "int64")), c(2, "int64")).astype("int32")

    def step(hd, x, i):
        if i == 3:
            return srmbpot_tir(x, 1)          # Rescale<0>(ExactMulByPot<-1>(x))
        return qmath.let(f"nr{i}", x + srmbpot_tir(qmath.srdhm(x, c(1 << 29) - qmath.srdhm(hd, x)), 2),
                         lambda nx: step(hd, nx, i + 1))
    return qmath.let("hd", half, lambda hd: qmath.let(
        "nr", c(1515870810) + qmath.srdhm(hd, c(-1010580540)), lambda x0: step(hd, x0, 0)))


def clz_positive(x):
    """Count leading zeros of a positive int32 expression."""
    n = c(0)
    for k in range(1, 32):
        n = n + tirx.Select(x < c(1 << (32 - k)) if 32 - k < 31 else x >= c(0), c(1), c(0))
    return n
