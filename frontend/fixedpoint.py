"""TFLite / gemmlowp fixed-point arithmetic, vectorised in int64 NumPy.

These are the primitives of TFLite's int8 reference kernels, written to give the same bits:

- :func:`quantize_multiplier` is TFLite's ``QuantizeMultiplier`` (frexp, round half away from
  zero, the ``1 << 31`` carry, flush below ``2**-31``, saturation above ``2**30``).
- :func:`multiply_by_quantized_multiplier` is ``MultiplyByQuantizedMultiplier`` with TFLite's
  default double rounding: ``SaturatingRoundingDoublingHighMul`` then ``RoundingDivideByPOT``.
- :func:`exp_on_negative_values`, :func:`one_over_one_plus_x_for_x_in_0_1`,
  :func:`get_reciprocal` are gemmlowp's fixed-point math used by int8 softmax.
- :func:`lut_int8` builds the 256-entry tables of int8 LOGISTIC / TANH (LiteRT's reference
  kernels populate them in float32 with libm's ``expf``/``tanhf``).

Integer arrays are held in int64; every function returns values that fit the C type the kernel
uses (int32 unless said otherwise). Arguments may be scalars or arrays that broadcast
(per-channel multipliers and shifts). Backends call the same functions at compile time.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


def _i64(x):
    return np.asarray(x, dtype=np.int64)


def wrap_int32(x):
    """Two's-complement wrap of int64 values to int32 range (what C's int32 arithmetic does)."""
    x = _i64(x)
    return ((x + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def round_half_away(x):
    """C ``std::round`` (TfLiteRound): ties away from zero, in the dtype of ``x`` (exact)."""
    x = np.asarray(x)
    a = np.abs(x)
    f = np.floor(a)
    r = np.where(a - f >= 0.5, f + 1, f)
    return np.copysign(r, x).astype(x.dtype if x.dtype.kind == "f" else np.float64)


def _round_scalar(x: float) -> int:
    a = abs(x)
    f = math.floor(a)
    r = f + 1 if a - f >= 0.5 else f
    return int(r if x >= 0 else -r)


# ---- multipliers ------------------------------------------------------------------------------
def quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite ``QuantizeMultiplier``: ``real ~= multiplier * 2**(shift - 31)`` with
    ``multiplier`` in [2**30, 2**31). Returns ``(int32 multiplier, shift)``; shift > 0 is a left
    shift. ``real`` is a Python float (double), as TFLite computes it.

    Like TFLite, a multiplier below ``2**-31`` flushes to ``(0, 0)`` and one of ``2**30`` or more
    (a shift above 30) saturates to ``(2**31 - 1, 30)``: ``MultiplyByQuantizedMultiplier`` would
    otherwise shift left by 31 or more, undefined behaviour in C (x86 and Arm compute different
    bits). Kiln's reference and its generated C share these constants, so they agree bit for bit;
    the .tflite importer rejects models that need such multipliers (docs/int8_ir.md)."""
    real = float(real)
    if real == 0.0:
        return 0, 0
    if not math.isfinite(real):
        raise ValueError(f"quantize_multiplier: multiplier {real} is not finite")
    q, shift = math.frexp(real)
    q_fixed = _round_scalar(q * float(1 << 31))
    assert abs(q_fixed) <= (1 << 31)
    if q_fixed == (1 << 31):
        q_fixed //= 2
        shift += 1
    if shift < -31:
        shift = 0
        q_fixed = 0
    if shift > 30:
        shift = 30
        q_fixed = (1 << 31) - 1
    return int(q_fixed), int(shift)


def quantize_multipliers(reals) -> tuple[np.ndarray, np.ndarray]:
    """Vector form of :func:`quantize_multiplier` (per-channel scales): int64 arrays."""
    ms, ss = zip(*(quantize_multiplier(float(r)) for r in np.ravel(reals))) if np.size(reals) else ((), ())
    return np.asarray(ms, np.int64), np.asarray(ss, np.int64)


# ---- gemmlowp primitives ----------------------------------------------------------------------
def saturating_rounding_doubling_high_mul(a, b):
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` on int32 values (ARM VQRDMULH)."""
    a, b = _i64(a), _i64(b)
    overflow = (a == b) & (a == INT32_MIN)
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    t = ab + nudge
    q = np.abs(t) >> 31                      # C division truncates toward zero
    q = np.where(t < 0, -q, q)
    return np.where(overflow, INT32_MAX, q)


def rounding_divide_by_pot(x, exponent):
    """gemmlowp ``RoundingDivideByPOT``: arithmetic shift right with round-half-away rounding."""
    x, e = _i64(x), _i64(exponent)
    mask = (np.int64(1) << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> e) + (remainder > threshold)


def saturating_rounding_multiply_by_pot(x, exponent: int):
    """gemmlowp ``SaturatingRoundingMultiplyByPOT<exponent>`` on int32 raw values."""
    x = _i64(x)
    if exponent == 0:
        return x
    if exponent < 0:
        return rounding_divide_by_pot(x, -exponent)
    threshold = (1 << (31 - exponent)) - 1
    r = wrap_int32(x << exponent)
    r = np.where(x > threshold, INT32_MAX, r)
    return np.where(x < -threshold, INT32_MIN, r)


def multiply_by_quantized_multiplier(x, multiplier, shift):
    """TFLite ``MultiplyByQuantizedMultiplier(int32 x, int32 m, int shift)`` (double rounding):
    ``RoundingDivideByPOT(SRDHM(x * 2**max(shift, 0), m), max(-shift, 0))``. Vectorised: ``m`` and
    ``shift`` broadcast against ``x`` (per-channel on the last axis)."""
    x, m, s = _i64(x), _i64(multiplier), _i64(shift)
    left = np.maximum(s, 0)
    right = np.maximum(-s, 0)
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(wrap_int32(x << left), m), right)


def multiply_by_quantized_multiplier_greater_than_one(x, multiplier, left_shift):
    """``MultiplyByQuantizedMultiplierGreaterThanOne``: SRDHM(x * 2**left_shift, m) (one rounding)."""
    return saturating_rounding_doubling_high_mul(wrap_int32(_i64(x) << _i64(left_shift)), multiplier)


def rounding_half_sum(a, b):
    s = _i64(a) + _i64(b)
    t = s + np.where(s >= 0, 1, -1)
    q = np.abs(t) // 2
    return np.where(t < 0, -q, q)


def count_leading_zeros_u32(x):
    """``__builtin_clz`` on uint32 values (32 for 0)."""
    x0 = _i64(x) & 0xFFFFFFFF
    x = x0
    n = np.zeros(x.shape, np.int64)
    for bits in (16, 8, 4, 2, 1):
        small = x < (np.int64(1) << (32 - bits))
        n = np.where(small, n + bits, n)
        x = np.where(small, x << bits, x)
    return np.where(x0 == 0, 32, n)


# ---- gemmlowp fixed-point math (raw int32 values; "F<k>" = k integer bits) -------------------
def _mul(a, b):
    return saturating_rounding_doubling_high_mul(a, b)


def _add(a, b):
    return wrap_int32(_i64(a) + _i64(b))


def exp_on_interval_between_negative_one_quarter_and_0_excl(a):
    """exp(a) for a in [-1/4, 0); a and the result are Q0.31."""
    constant_term = 1895147668            # exp(-1/8)
    constant_1_over_3 = 715827883
    x = _add(a, 1 << 28)
    x2 = _mul(x, x)
    x3 = _mul(x2, x)
    x4 = _mul(x2, x2)
    x4_over_4 = saturating_rounding_multiply_by_pot(x4, -2)
    t = saturating_rounding_multiply_by_pot(_add(_mul(_add(x4_over_4, x3), constant_1_over_3), x2), -1)
    return _add(constant_term, _mul(constant_term, _add(x, t)))


_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
               (2, 39332535), (3, 720401), (4, 242))


def exp_on_negative_values(a, integer_bits: int):
    """gemmlowp ``exp_on_negative_values`` for a raw Q(integer_bits).(31-integer_bits) input a <= 0;
    returns Q0.31."""
    a = _i64(a)
    frac = 31 - integer_bits
    one_quarter = 1 << (frac - 2)
    mask = one_quarter - 1
    a_mod = _add(a & mask, -one_quarter)
    result = exp_on_interval_between_negative_one_quarter_and_0_excl(
        saturating_rounding_multiply_by_pot(a_mod, integer_bits))
    remainder = _add(a_mod, -a)
    for exponent, mult in _EXP_BARREL:
        if integer_bits > exponent:
            bit = np.int64(1) << (frac + exponent)
            result = np.where((remainder & bit) != 0, _mul(result, mult), result)
    if integer_bits > 5:
        clamp = -(1 << (36 - integer_bits))
        result = np.where(a < clamp, 0, result)
    return np.where(a == 0, INT32_MAX, result)


def one_over_one_plus_x_for_x_in_0_1(a):
    """gemmlowp: 1 / (1 + a) for a in [0, 1), Q0.31 in and out (Newton-Raphson, 3 steps)."""
    half_denominator = rounding_half_sum(a, INT32_MAX)
    x = _add(1515870810, _mul(half_denominator, -1010580540))      # F2: 48/17 - 32/17 * d
    one_f2 = 1 << 29
    for _ in range(3):
        hdx = _mul(half_denominator, x)
        one_minus = _add(one_f2, -hdx)
        x = _add(x, saturating_rounding_multiply_by_pot(_mul(x, one_minus), 2))
    return saturating_rounding_multiply_by_pot(x, 1)


def get_reciprocal(x, x_integer_digits: int):
    """TFLite ``GetReciprocal``: returns (Q0.31 reciprocal, num_bits_over_unit)."""
    x = _i64(x)
    headroom_plus_one = count_leading_zeros_u32(x)
    num_bits_over_unit = x_integer_digits - headroom_plus_one
    shifted_sum_minus_one = wrap_int32((((x & 0xFFFFFFFF) << headroom_plus_one) - (1 << 31)) & 0xFFFFFFFF)
    return one_over_one_plus_x_for_x_in_0_1(shifted_sum_minus_one), num_bits_over_unit


# ---- softmax / activation parameters ----------------------------------------------------------
def preprocess_softmax_scaling(beta: float, input_scale: float, input_integer_bits: int):
    """TFLite ``PreprocessSoftmaxScaling`` (double rounding build): (multiplier, left_shift)."""
    real = min(float(beta) * float(input_scale) * float(1 << (31 - input_integer_bits)), float((1 << 31) - 1))
    if not real > 1.0:
        raise ValueError(f"softmax: beta * input_scale = {beta * input_scale:g} is too small for "
                         f"TFLite's int8 softmax (needs > 2**-{31 - input_integer_bits})")
    m, s = quantize_multiplier(real)
    return m, s


def calculate_input_radius(input_integer_bits: int, input_left_shift: int, total_signed_bits: int = 31) -> int:
    v = 1.0 * ((1 << input_integer_bits) - 1) * (1 << (total_signed_bits - input_integer_bits)) / (1 << input_left_shift)
    return int(math.floor(v))


def _libm():
    name = ctypes.util.find_library("m")
    try:
        lib = ctypes.CDLL(name or "libm.so.6")
        for fn in ("expf", "tanhf"):
            getattr(lib, fn).restype = ctypes.c_float
            getattr(lib, fn).argtypes = [ctypes.c_float]
        return lib
    except (OSError, AttributeError):
        return None


_LIBM = _libm()


def expf(x):
    """float32 exp as C's ``expf`` computes it (libm when available, else a correctly rounded
    double computation, which agrees with glibc's expf)."""
    x = np.asarray(x, np.float32)
    if _LIBM is not None:
        return np.asarray([_LIBM.expf(float(v)) for v in x.ravel()], np.float32).reshape(x.shape)
    return np.exp(x.astype(np.float64)).astype(np.float32)


def tanhf(x):
    x = np.asarray(x, np.float32)
    if _LIBM is not None:
        return np.asarray([_LIBM.tanhf(float(v)) for v in x.ravel()], np.float32).reshape(x.shape)
    return np.tanh(x.astype(np.float64)).astype(np.float32)


def lut_int8(fn: str, input_scale: float, input_zero_point: int, output_scale: float,
             output_zero_point: int) -> np.ndarray:
    """TFLite ``LUTPopulate<int8_t>`` for 'logistic' or 'tanh', in float32 as LiteRT computes it.
    Returns a 256-entry int64 table indexed by ``q + 128``."""
    f32 = np.float32
    vals = np.arange(-128, 128, dtype=np.int64)
    deq = f32(input_scale) * (vals - input_zero_point).astype(f32)
    if fn == "logistic":
        t = f32(1.0) / (f32(1.0) + expf(-deq))
    elif fn == "tanh":
        t = tanhf(deq)
    else:
        raise ValueError(f"no int8 table for {fn!r}")
    inv = f32(1.0) / f32(output_scale)
    rescaled = round_half_away((t * inv).astype(f32))
    q = (rescaled + f32(output_zero_point)).astype(np.int64)
    return np.clip(q, -128, 127)


def quantize_value(f: float, scale: float, zero_point: int) -> int:
    """TFLite's ``Quantize`` helper (activation ranges): zp + round(float32(f) / float32(scale))."""
    v = np.float32(f) / np.float32(scale)
    return int(zero_point) + int(round_half_away(np.asarray(v, np.float32)))


def activation_range(activation: str, scale: float, zero_point: int, qmin=-128, qmax=127):
    """TFLite ``CalculateActivationRangeQuantized`` for a fused activation."""
    if activation in (None, "none"):
        return qmin, qmax
    lo = max(qmin, quantize_value(0.0, scale, zero_point))
    if activation == "relu":
        return lo, qmax
    if activation == "relu6":
        return lo, min(qmax, quantize_value(6.0, scale, zero_point))
    if activation == "relu_n1_to_1":
        return max(qmin, quantize_value(-1.0, scale, zero_point)), min(qmax, quantize_value(1.0, scale, zero_point))
    raise ValueError(f"unknown fused activation {activation!r}")
