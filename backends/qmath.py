"""TFLite int8 fixed-point arithmetic as TIR expressions, plus compile-time constants.

The kernels follow TFLite's reference kernels exactly: gemmlowp's
SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT (two roundings; not
``tirx.q_multiply_shift``, which rounds once). Requantisation constants come from
``kiln.quantize.fixedpoint.quantize_multiplier`` (the same function the int8 reference uses).
"""
from __future__ import annotations

import math

import numpy as np
from tvm import tirx

I32, I64 = "int32", "int64"


def quantize_multiplier(real):
    """(multiplier, shift) with real ~= multiplier * 2^(shift - 31), TFLite's QuantizeMultiplier."""
    try:
        from kiln.quantize.fixedpoint import quantize_multiplier as qm
    except ImportError:  # quantize/ not available: TFLite's algorithm
        qm = _quantize_multiplier
    m, s = qm(float(real))
    return int(m), int(s)


def _quantize_multiplier(d):
    if d == 0.0:
        return 0, 0
    q, shift = math.frexp(d)
    q_fixed = int(round(q * (1 << 31)))
    if q_fixed == (1 << 31):
        q_fixed //= 2
        shift += 1
    if shift < -31:
        shift, q_fixed = 0, 0
    if shift > 30:
        shift, q_fixed = 30, (1 << 31) - 1
    return q_fixed, shift


def c(v, dt=I32):
    return tirx.const(int(v), dt)


def srdhm(a, b):
    """SaturatingRoundingDoublingHighMul(a, b) for int32 a, b (b is never INT32_MIN here:
    multipliers lie in [2^30, 2^31))."""
    ab = a.astype(I64) * b.astype(I64)
    nudge = tirx.Select(ab >= c(0, I64), c(1 << 30, I64), c(1 - (1 << 30), I64))
    return tirx.truncdiv(ab + nudge, c(1 << 31, I64)).astype(I32)


def rdbpot(x, e):
    """RoundingDivideByPOT(x, e), e >= 0 (an int or an int32 expression)."""
    if isinstance(e, int):
        if e == 0:
            return x
        mask = c((1 << e) - 1)
        e = c(e)
    else:
        mask = (c(1) << e) - c(1)
    rem = tirx.bitwise_and(x, mask)
    thr = (mask >> c(1)) + tirx.Select(x < c(0), c(1), c(0))
    return (x >> e) + tirx.Select(rem > thr, c(1), c(0))


def let(name, value, body_fn, dtype=I32):
    v = tirx.Var(name, dtype)
    return tirx.Let(v, value, body_fn(v))


def mbqm(x, mult, shift):
    """MultiplyByQuantizedMultiplier(x, mult, shift); ``shift`` a Python int, or a pair of
    int32 expressions (left, right) for per-channel constants."""
    if isinstance(shift, int):
        left, right = max(shift, 0), max(-shift, 0)
        xs = x * c(1 << left) if left else x
        return let("mq", srdhm(xs, mult), lambda v: rdbpot(v, right))
    left, right = shift
    xs = x if left is None else x << left
    return let("mq", srdhm(xs, mult), lambda v: rdbpot(v, right))


def clamp(x, lo, hi):
    return tirx.max(tirx.min(x, c(hi)), c(lo))


# ---- compile-time constants --------------------------------------------------------------
def activation_range(act, scale, zp, qmin=-128, qmax=127):
    """TFLite CalculateActivationRangeQuantized: clamp bounds in the output's int8 domain."""
    def q(v):
        return zp + int(_round_away(np.float32(v) / np.float32(scale)))
    if act == "relu":
        return max(qmin, q(0.0)), qmax
    if act == "relu6":
        return max(qmin, q(0.0)), min(qmax, q(6.0))
    if act in ("none", None):
        return qmin, qmax
    raise NotImplementedError(f"fused activation {act!r} in int8")


def _round_away(x):
    x = float(x)
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def per_channel_requant(in_scale, w_scales, out_scale, n):
    """Multipliers and shifts for conv/dense: input_scale * weight_scale[c] / output_scale
    (computed in double from the float32 scales, as TFLite does)."""
    ws = list(w_scales)
    if len(ws) == 1:
        ws = ws * n
    mult, shift = [], []
    for s in ws:
        m, sh = quantize_multiplier(float(np.float32(in_scale)) * float(np.float32(s)) / float(np.float32(out_scale)))
        mult.append(m)
        shift.append(sh)
    return np.asarray(mult, np.int32), np.asarray(shift, np.int32)
