"""TFLite int8 fixed-point arithmetic as TIR expressions, plus compile-time constants.

The kernels follow TFLite's reference kernels exactly: gemmlowp's
SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT (two roundings; not
``tirx.q_multiply_shift``, which rounds once). Requantisation constants come from
``kiln.frontend.fixedpoint.quantize_multiplier`` (the same function the int8 reference uses).
"""
from __future__ import annotations

import numpy as np
from tvm import tirx

from kiln.frontend import fixedpoint
from kiln.frontend.ops.int8util import channel_params, per_tensor
from kiln.frontend.ops.nn import requantize_params

I32, I64 = "int32", "int64"


def quantize_multiplier(real):
    """(multiplier, shift) with real ~= multiplier * 2^(shift - 31) (TFLite's QuantizeMultiplier)."""
    m, s = fixedpoint.quantize_multiplier(float(real))
    return int(m), int(s)


def c(v, dt=I32):
    return tirx.const(int(v), dt)


def _bind(name, e, fn, dtype=I32):
    """Let-bind ``e`` unless it is already a variable or a constant (keeps expressions linear)."""
    if isinstance(e, (tirx.Var, tirx.IntImm)):
        return fn(e)
    return let(name, e, fn, dtype)


def srdhm(a, b):
    """SaturatingRoundingDoublingHighMul(a, b) for int32 a, b (b is never INT32_MIN here:
    multipliers lie in [2^30, 2^31))."""
    # gemmlowp: trunc((ab + (ab >= 0 ? 2^30 : 1 - 2^30)) / 2^31). For integer y = ab + 2^30 and
    # N = 2^31 the negative branch is ceil((y + 1 - N) / N) = ceil((y + 1) / N) - 1 = floor(y / N),
    # the same as the positive one: one rounding add and an arithmetic shift (SMULL, ADDS/ADC,
    # LSR/ORR on Cortex-M) instead of a select and a signed 64-bit division.
    def body(ab):
        return ((ab + c(1 << 30, I64)) >> c(31, I64)).astype(I32)
    # a is Let-bound as an int32 first: otherwise the simplifier distributes the int64 cast over
    # a sum (acc + bias) and gcc emits a 64x64 multiply instead of one SMULL
    return _bind("sa", a, lambda av: _bind("ab", av.astype(I64) * b.astype(I64), body, I64))


def rdbpot(x, e):
    """RoundingDivideByPOT(x, e), e >= 0 (an int or an int32 expression)."""
    if isinstance(e, int) and e == 0:
        return x

    def body(xv, ev):
        if isinstance(e, int):
            mask, ee = c((1 << e) - 1), c(e)
        else:
            mask, ee = (c(1) << ev) - c(1), ev
        rem = tirx.bitwise_and(xv, mask)
        thr = (mask >> c(1)) + tirx.Select(xv < c(0), c(1), c(0))
        return (xv >> ee) + tirx.Select(rem > thr, c(1), c(0))
    if isinstance(e, int):
        return _bind("rx", x, lambda xv: body(xv, None))
    return _bind("rx", x, lambda xv: _bind("re", e, lambda ev: body(xv, ev)))


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


# ---- compile-time constants (the int8 reference's own prepare functions) ----------------------
def activation_range(act, scale, zp, qmin=-128, qmax=127):
    """TFLite CalculateActivationRangeQuantized: clamp bounds in the output's int8 domain."""
    return fixedpoint.activation_range(act, scale, zp, qmin, qmax)


def linear_requant(in_type, w_type, out_type, n):
    """Multipliers and shifts of a conv output, exactly as the int8 reference derives them
    (``frontend/ops/nn.py: requantize_params``)."""
    s_in, _ = per_tensor(in_type, "input", "conv")
    s_out, _ = per_tensor(out_type, "output", "conv")
    ws, _, _ = channel_params(w_type, n, "conv")
    mult, shift = requantize_params(s_in, ws, s_out)
    return np.asarray(mult, np.int64).astype(np.int32), np.asarray(shift, np.int64).astype(np.int32)
