"""gemmlowp's 16-bit fixed-point math (``FixedPoint<int16_t, N>``), vectorised in int64 NumPy.

TFLite's integer LSTM (``lstm_eval.cc``: ``ApplySigmoid``, ``ApplyTanh``) evaluates its gates with
``gemmlowp::logistic`` and ``gemmlowp::tanh`` on int16 raw values. These are the int32 routines of
``frontend/fixedpoint.py`` specialised to 16 bits: constants are the int32 initialisers rounded
right by 16 (``RescaleConstantInitializer``), additions wrap to int16 (``AddSaturatingIf16Bit``
saturates), ``SaturatingRoundingDoublingHighMul`` keeps the high 16 bits of the doubled product.
Every function takes and returns int64 arrays holding int16 values.
"""
from __future__ import annotations

import numpy as np

from ..fixedpoint import rounding_divide_by_pot, rounding_half_sum

I16_MIN, I16_MAX = -(1 << 15), (1 << 15) - 1


def _i(x):
    return np.asarray(x, np.int64)


def wrap16(x):
    """static_cast<int16_t> of an int32 value (two's complement wrap)."""
    return ((_i(x) + (1 << 15)) & 0xFFFF) - (1 << 15)


def sat16(x):
    return np.clip(_i(x), I16_MIN, I16_MAX)


def const16(raw32: int) -> int:
    """``RescaleConstantInitializer<int16>``: an int32 fixed-point constant rounded to 16 bits."""
    return int(rounding_divide_by_pot(np.int64(raw32), 16))


def srdhm16(a, b):
    a, b = _i(a), _i(b)
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    t = ab + nudge
    q = np.abs(t) >> 15                      # C division truncates toward zero
    q = wrap16(np.where(t < 0, -q, q))
    return np.where((a == b) & (a == I16_MIN), I16_MAX, q)


def srmbpot16(x, exponent: int):
    """``SaturatingRoundingMultiplyByPOT<exponent>`` on int16 raw values."""
    x = _i(x)
    if exponent == 0:
        return x
    if exponent < 0:
        return rounding_divide_by_pot(x, -exponent)
    threshold = (1 << (15 - exponent)) - 1
    r = wrap16(x << exponent)
    r = np.where(x > threshold, I16_MAX, r)
    return np.where(x < -threshold, I16_MIN, r)


def _add(a, b):
    return wrap16(_i(a) + _i(b))


def _exp_quarter(a):
    """exp(a) for a in [-1/4, 0), Q0.15 in and out."""
    constant_term = const16(1895147668)
    one_third = const16(715827883)
    x = _add(a, 1 << 12)
    x2 = srdhm16(x, x)
    x3 = srdhm16(x2, x)
    x4 = srdhm16(x2, x2)
    x4_over_4 = srmbpot16(x4, -2)
    t = srmbpot16(_add(srdhm16(_add(x4_over_4, x3), one_third), x2), -1)
    return sat16(constant_term + srdhm16(constant_term, _add(x, t)))


_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
           (2, 39332535), (3, 720401), (4, 242))


def exp_on_negative_values16(a, integer_bits: int):
    """gemmlowp ``exp_on_negative_values`` for Q(integer_bits).(15 - integer_bits) a <= 0; Q0.15."""
    a = _i(a)
    frac = 15 - integer_bits
    one_quarter = 1 << (frac - 2)
    a_mod = _add(a & (one_quarter - 1), -one_quarter)
    result = _exp_quarter(srmbpot16(a_mod, integer_bits))
    remainder = _add(a_mod, -a)
    for exponent, mult in _BARREL:
        if integer_bits > exponent:
            bit = np.int64(1) << (frac + exponent)
            result = np.where((remainder & bit) != 0, srdhm16(result, const16(mult)), result)
    if integer_bits > 5:
        clamp = const16(-(1 << (36 - integer_bits))) if 36 - integer_bits < 31 else None
        if clamp is not None:
            result = np.where(a < clamp, 0, result)
    return np.where(a == 0, I16_MAX, result)


def _newton(a):
    """The 3-step Newton-Raphson of 1 / (1 + a) (a Q0.15 in [0, 1)); returns Q2.13 x."""
    half_den = rounding_half_sum(a, I16_MAX)
    x = _add(const16(1515870810), srdhm16(half_den, const16(-1010580540)))
    one_f2 = 1 << 13
    for _ in range(3):
        one_minus = _add(one_f2, -srdhm16(half_den, x))
        x = _add(x, srmbpot16(srdhm16(x, one_minus), 2))
    return x


def logistic16(a, integer_bits: int):
    """``gemmlowp::logistic`` of FixedPoint<int16, integer_bits>: Q0.15 result."""
    a = _i(a)
    pos = a > 0
    absin = np.where(pos, a, wrap16(-a))
    r_pos = srmbpot16(_newton(exp_on_negative_values16(wrap16(-absin), integer_bits)), 1)
    r_neg = wrap16(I16_MAX - r_pos)
    return np.where(a == 0, 1 << 14, np.where(pos, r_pos, r_neg))


def tanh16(a, integer_bits: int):
    """``gemmlowp::tanh`` of FixedPoint<int16, integer_bits>: Q0.15 result."""
    a = _i(a)
    neg = a < 0
    n = np.where(neg, a, wrap16(-a))
    e = exp_on_negative_values16(n, integer_bits + 1)           # ExactMulByPot<1>: same raw bits
    t = srmbpot16(_add(_newton(e), -(1 << 13)), 2)
    return np.where(a == 0, 0, np.where(neg, wrap16(-t), t))
