"""int8 references of TFLite's element-wise and activation kernels (LiteRT's reference kernels,
which TFLite Micro shares for these ops), bit for bit:

- ``sub``: TFLite's int8 SUB is its ADD with the second input's multiplier negated (left_shift 20).
- ``squared_difference``: both inputs rescaled to 2 * max scale with left_shift 7, the difference
  squared in int32, one requantisation by (2 * max scale)**2 / (2**14 * output scale).
- ``maximum``/``minimum``: the int8 codes compared as they are (TFLite does not rescale; PTQ gives
  inputs and output one quantisation).
- ``leaky_relu``: two multipliers, input/output scale (x >= 0) and alpha * input/output scale.
- ``prelu``: input/output scale (x >= 0) and input * alpha / output scale on (x - zx) * (alpha - za).
- ``hard_swish``: reference_ops::HardSwish's 16-bit fixed point (reluish and output multipliers).
- ``abs``: |x - zx|, rescaled by input/output scale when the scales differ.
- ``rsqrt``: GetInvSqrtQuantizedMultiplierExp (Newton-Raphson in gemmlowp fixed point), then
  1 / (sqrt(input scale) * output scale).
- ``exp``, ``elu``, ``log``: 256-entry tables filled in float32 (LUTPopulate); ``sqrt`` truncates.
- ``div``: GetReciprocal / CountLeadingSignBits arithmetic; ``neg``, ``where``: codes as they are;
  comparisons: both sides rescaled with left_shift 8.
Multipliers are formed in float32 where TFLite's Prepare() computes in float, as it does.
"""
import ctypes

import numpy as np

from .. import fixedpoint as fp
from ..errors import ShapeError
from ..registry import QUANTIZABLE, Quant, defrule, get_op
from .elementwise import ADD_LEFT_SHIFT, add_params
from .int8util import clamp8, f32, int8_io

SQDIFF_LEFT_SHIFT = 7


def _f(x):
    return np.float32(x)


def _quantizable(name, quant):
    op = get_op(name)
    op.quant = quant
    op.props = op.props | {QUANTIZABLE}


def _i64(x):
    return np.asarray(x).astype(np.int64)


# ---- sub --------------------------------------------------------------------------------------
def sub_params(s1, s2, s_out):
    """TFLite int8 SUB prepare: ADD's multipliers, the second one negated."""
    (m1, e1), (m2, e2), (mo, eo) = add_params(s1, s2, s_out)
    return (m1, e1), (-m2, e2), (mo, eo)


@defrule("sub", "int8_ref")
def sub_int8(xs, attrs, in_types, out_type):
    (s1, z1), (s2, z2), (so, zo) = int8_io(in_types, out_type, "sub", 2)
    (m1, e1), (m2, e2), (mo, eo) = sub_params(s1, s2, so)
    a = fp.multiply_by_quantized_multiplier((_i64(xs[0]) - z1) << ADD_LEFT_SHIFT, m1, e1)
    b = fp.multiply_by_quantized_multiplier((_i64(xs[1]) - z2) << ADD_LEFT_SHIFT, m2, e2)
    return clamp8(fp.multiply_by_quantized_multiplier(fp.wrap_int32(a + b), mo, eo) + zo)


# ---- squared_difference -------------------------------------------------------------------------
def sqdiff_params(s1, s2, s_out):
    twice_max = 2.0 * max(f32(s1), f32(s2))
    r_out = twice_max * twice_max / float(_f((1 << (2 * SQDIFF_LEFT_SHIFT)) * _f(s_out)))
    return (fp.quantize_multiplier(f32(s1) / twice_max), fp.quantize_multiplier(f32(s2) / twice_max),
            fp.quantize_multiplier(r_out))


@defrule("squared_difference", "int8_ref")
def squared_difference_int8(xs, attrs, in_types, out_type):
    (s1, z1), (s2, z2), (so, zo) = int8_io(in_types, out_type, "squared_difference", 2)
    (m1, e1), (m2, e2), (mo, eo) = sqdiff_params(s1, s2, so)
    a = fp.multiply_by_quantized_multiplier((_i64(xs[0]) - z1) << SQDIFF_LEFT_SHIFT, m1, e1)
    b = fp.multiply_by_quantized_multiplier((_i64(xs[1]) - z2) << SQDIFF_LEFT_SHIFT, m2, e2)
    d = a - b
    return clamp8(fp.multiply_by_quantized_multiplier(fp.wrap_int32(d * d), mo, eo) + zo)


# ---- maximum / minimum ----------------------------------------------------------------------------
def _minmax(name, fn):
    def rule(xs, attrs, in_types, out_type):
        int8_io(in_types, out_type, name, 2)
        return fn(xs[0], xs[1]).astype(np.int8)
    rule.__name__ = f"{name}_int8"
    return defrule(name, "int8_ref")(rule)


_minmax("maximum", np.maximum)
_minmax("minimum", np.minimum)


# ---- leaky_relu / prelu ---------------------------------------------------------------------------
def leaky_params(si, so, alpha):
    """TensorFlow Lite Micro's LEAKY_RELU multipliers (leaky_relu_common.cc): ``QuantizeMultiplier``
    of ``s_in / s_out`` (identity) and of ``s_in * alpha / s_out`` (alpha; negative for a negative
    alpha), each computed in float32 and then widened to double."""
    return (fp.quantize_multiplier(float(_f(si) / _f(so))),
            fp.quantize_multiplier(float(_f(si) * _f(alpha) / _f(so))))


def leaky_apply(v, params):
    """QuantizeLeakyRelu on ``v = x - z_in`` (int64 array): the identity multiplier where v >= 0,
    the alpha multiplier below; a negative alpha multiplier is applied as its magnitude and the
    result negated (TFLite Micro; multiplying by the negative multiplier rounds ties the other
    way)."""
    (mi, ei), (ma, ea) = params
    neg = -fp.multiply_by_quantized_multiplier(v, -ma, ea) if ma < 0 else fp.multiply_by_quantized_multiplier(v, ma, ea)
    return np.where(v >= 0, fp.multiply_by_quantized_multiplier(v, mi, ei), neg)


@defrule("leaky_relu", "int8_ref")
def leaky_relu_int8(xs, attrs, in_types, out_type):
    (si, zi), (so, zo) = int8_io(in_types, out_type, "leaky_relu")
    return clamp8(leaky_apply(_i64(xs[0]) - zi, leaky_params(si, so, attrs["alpha"])) + zo)


def prelu_params(si, sa, so):
    return (fp.quantize_multiplier(float(_f(si) / _f(so))),
            fp.quantize_multiplier(float(_f(si) * _f(sa) / _f(so))))


@defrule("prelu", "int8_ref")
def prelu_int8(xs, attrs, in_types, out_type):
    (si, zi), (sa, za), (so, zo) = int8_io(in_types, out_type, "prelu", 2)
    (m1, e1), (m2, e2) = prelu_params(si, sa, so)
    v = _i64(xs[0]) - zi
    al = _i64(xs[1]) - za
    y = np.where(v >= 0, fp.multiply_by_quantized_multiplier(v, m1, e1) + 0 * al,
                 fp.multiply_by_quantized_multiplier(v * al, m2, e2))
    return clamp8(y + zo)


# ---- hard_swish: 16-bit gemmlowp fixed point -----------------------------------------------------
I16_MIN, I16_MAX = -(1 << 15), (1 << 15) - 1


def _srdhm16(a, b):
    a, b = _i64(a), _i64(b)
    ab = a * b
    t = ab + np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    q = np.abs(t) >> 15
    q = np.where(t < 0, -q, q)
    return np.where((a == b) & (a == I16_MIN), I16_MAX, q)


def _sdhm16(a, b):
    """SaturatingDoublingHighMul (rounds toward zero)."""
    a, b = _i64(a), _i64(b)
    ab = a * b
    q = np.abs(ab) >> 15
    q = np.where(ab < 0, -q, q)
    return np.where((a == b) & (a == I16_MIN), I16_MAX, q)


def _sat_lshift16(x, n):
    return np.clip(_i64(x) * (1 << n), I16_MIN, I16_MAX)


def downscale_multiplier_16(m):
    """DownScaleInt32ToInt16Multiplier."""
    if m >= (1 << 31) - 1 - (1 << 15):
        return I16_MAX
    return (m + (1 << 15)) >> 16


def hard_swish_params(si, so):
    """(output multiplier int16, output exponent, reluish multiplier int16, reluish exponent),
    formed in float32 as TFLite's HardSwishPrepare."""
    hires = _f(1.0 / 128.0) * _f(si)
    m_out, e_out = fp.quantize_multiplier(float(hires / _f(so)))
    m_rel, e_rel = fp.quantize_multiplier(float(hires / _f(3.0 / 32768.0)))
    if e_out > 0:
        raise ShapeError(f"hard_swish: TFLite's int8 HARD_SWISH needs input scale / 128 <= output scale "
                         f"(output multiplier exponent {e_out} > 0); got input scale {si}, output scale {so}")
    return downscale_multiplier_16(m_out), e_out, downscale_multiplier_16(m_rel), e_rel


@defrule("hard_swish", "int8_ref")
def hard_swish_int8(xs, attrs, in_types, out_type):
    (si, zi), (so, zo) = int8_io(in_types, out_type, "hard_swish")
    m_out, e_out, m_rel, e_rel = hard_swish_params(si, so)
    hires = (_i64(xs[0]) - zi) * 128
    pre_out = _srdhm16(hires, m_out)
    r = hires
    if e_rel > 0:
        r = _sat_lshift16(r, e_rel - 1)
    r = _srdhm16(r, m_rel)
    if e_rel > 0:
        r = _sat_lshift16(r, 1)
    if e_rel < 0:
        r = fp.rounding_divide_by_pot(r, -e_rel)
    r = (r + (1 << 15)) >> 1
    y = fp.rounding_divide_by_pot(_sdhm16(r, pre_out), -e_out) + zo
    return clamp8(y)


# ---- abs ------------------------------------------------------------------------------------------
@defrule("abs", "int8_ref")
def abs_int8(xs, attrs, in_types, out_type):
    (si, zi), (so, zo) = int8_io(in_types, out_type, "abs")
    v = np.abs(_i64(xs[0]) - zi)
    if si != so:
        m, e = fp.quantize_multiplier(float(_f(si) / _f(so)))
        v = fp.multiply_by_quantized_multiplier(v, m, e)
    return clamp8(v + zo)


# ---- rsqrt ----------------------------------------------------------------------------------------
def _clz32(x):
    return 32 - int(x).bit_length()


def _smbpot(x, e):
    return int(fp.saturating_rounding_multiply_by_pot(np.int64(x), e))


def _mul(a, b):
    return int(fp.saturating_rounding_doubling_high_mul(np.int64(a), np.int64(b)))


def inv_sqrt_multiplier_exp(value):
    """GetInvSqrtQuantizedMultiplierExp(value, kReverseShift): (multiplier, left shift)."""
    if value <= 1:
        return (1 << 31) - 1, 0
    shift = 11
    while value >= (1 << 29):
        value //= 4
        shift += 1
    pairs = (_clz32(value) - 1) // 2 - 1
    shift -= pairs
    value <<= 2 * pairs
    half_input = _smbpot(value >> 1, -1)
    half_three = (1 << 28) + (1 << 27)
    x = 1 << 28                                        # F3::One()
    for _ in range(5):
        x3 = _smbpot(_mul(_mul(x, x), x), 6)           # Rescale<3>(F9)
        x = _smbpot(fp.wrap_int32(_mul(half_three, x) - _mul(half_input, x3)), 3)
    x = _mul(x, 1518500250)                            # * sqrt(2) / 2 (F0)
    if shift < 0:
        x = int(fp.wrap_int32(x << -shift))
        shift = 0
    return x, -shift


def rsqrt_table(si, zi, so, zo):
    """The int8 RSQRT of all 256 codes (index q + 128)."""
    m, e = fp.quantize_multiplier(float(1.0 / float(np.sqrt(_f(si)) * _f(so))))
    out = np.empty(256, np.int64)
    for k, qv in enumerate(range(-128, 128)):
        v = qv - zi
        if v == 0:
            out[k] = 127
            continue
        im, ie = inv_sqrt_multiplier_exp(v)
        data = int(fp.multiply_by_quantized_multiplier(np.int64(1), im, ie + 20))
        out[k] = int(fp.multiply_by_quantized_multiplier(np.int64(data), m, e - 20)) + zo
    return np.clip(out, -128, 127)


@defrule("rsqrt", "int8_ref")
def rsqrt_int8(xs, attrs, in_types, out_type):
    (si, zi), (so, zo) = int8_io(in_types, out_type, "rsqrt")
    return rsqrt_table(si, zi, so, zo)[_i64(xs[0]) + 128].astype(np.int8)


# ---- table ops: LUTPopulate in float32 --------------------------------------------------------------
def lut_populate(transform, si, zi, so, zo):
    """TFLite ``LUTPopulate<int8_t>``: ``transform`` maps float32 arrays to float32 (as C does)."""
    vals = np.arange(-128, 128, dtype=np.int64)
    deq = _f(si) * (vals - zi).astype(np.float32)
    t = np.asarray(transform(deq), np.float32)
    rescaled = fp.round_half_away((t * (_f(1.0) / _f(so))).astype(np.float32))
    # float -> int32 saturates (Arm's VCVT, and LiteRT: exp of large inputs gives 127, not -128)
    return np.clip(np.clip((rescaled + _f(zo)).astype(np.float64), -2.0 ** 31, 2.0 ** 31 - 1).astype(np.int64),
                   -128, 127)


def _exp_f32(x):
    return fp.expf(x)


def _elu_f32(x):
    return np.where(x < 0, (fp.expf(x) - _f(1.0)).astype(np.float32), x).astype(np.float32)


def _lut_rule(name, transform):
    def rule(xs, attrs, in_types, out_type):
        (si, zi), (so, zo) = int8_io(in_types, out_type, name)
        return lut_populate(transform, si, zi, so, zo)[_i64(xs[0]) + 128].astype(np.int8)
    rule.__name__ = f"{name}_int8"
    return defrule(name, "int8_ref")(rule)


_lut_rule("exp", _exp_f32)
_lut_rule("elu", _elu_f32)


def _libm_f32(name, fallback):
    """A float32 libm function (``logf``, ``sqrtf``) as C computes it, element by element."""
    lib = fp._LIBM
    fn = getattr(lib, name, None) if lib is not None else None
    if fn is None:
        return lambda x: fallback(np.asarray(x, np.float64)).astype(np.float32)
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return lambda x: np.asarray([fn(float(v)) for v in np.ravel(x)], np.float32).reshape(np.shape(x))


_logf = _libm_f32("logf", np.log)


def _log_rule(xs, attrs, in_types, out_type):
    """LogLUTPrepare: log of a value <= 0 is the output's lowest representable value."""
    (si, zi), (so, zo) = int8_io(in_types, out_type, "log")
    out_min = _f(_f(-128 - zo) * _f(so))

    def transform(v):
        safe = np.where(v > 0, v, _f(1.0)).astype(np.float32)
        return np.where(v > 0, _logf(safe), out_min).astype(np.float32)
    return lut_populate(transform, si, zi, so, zo)[_i64(xs[0]) + 128].astype(np.int8)


defrule("log", "int8_ref")(_log_rule)


@defrule("sqrt", "int8_ref")
def sqrt_int8(xs, attrs, in_types, out_type):
    """LiteRT 2.3's int8 SQRT: trunc(sqrtf(dequantised) / s_out) + z_out (it truncates where the
    LUT ops round). Inferred from LiteRT's results and property-tested against them (its source
    was not available); LiteRT refuses codes below the zero point, Kiln gives sqrt(0) there."""
    (si, zi), (so, zo) = int8_io(in_types, out_type, "sqrt")
    codes = np.arange(-128, 128, dtype=np.int64)
    deq = _f(si) * np.maximum(codes - zi, 0).astype(np.float32)
    r = np.trunc(np.sqrt(deq) * (_f(1.0) / _f(so))).astype(np.float64)
    table = np.clip(np.clip(r, -2.0 ** 31, 2.0 ** 31 - 1).astype(np.int64) + zo, -128, 127)
    return table[_i64(xs[0]) + 128].astype(np.int8)


# ---- neg / where: the codes as they are (LiteRT's int8 NEG and SELECT_V2 do not rescale) ---------
@defrule("neg", "int8_ref")
def neg_int8(xs, attrs, in_types, out_type):
    int8_io(in_types, out_type, "neg")
    return (-_i64(xs[0])).astype(np.int8)          # -(-128) wraps to -128, as C's int8 cast


@defrule("where", "int8_ref")
def where_int8(xs, attrs, in_types, out_type):
    int8_io(in_types[1:], out_type, "where", 2)
    return np.where(xs[0], xs[1], xs[2]).astype(np.int8)


# ---- div ----------------------------------------------------------------------------------------
def div_params(s1, s2, s_out):
    return fp.quantize_multiplier(float(_f(s1) / (_f(s2) * _f(s_out))))


def count_leading_sign_bits(x):
    """CountLeadingSignBits on int32 values (gcc's __builtin_clrsb; 31 for 0 and -1)."""
    x = _i64(x)
    return fp.count_leading_zeros_u32(np.where(x >= 0, x, ~x)) - 1


@defrule("div", "int8_ref")
def div_int8(xs, attrs, in_types, out_type):
    (s1, z1), (s2, z2), (so, zo) = int8_io(in_types, out_type, "div", 2)
    m, e = div_params(s1, s2, so)
    a, b = np.broadcast_arrays(_i64(xs[0]) - z1, _i64(xs[1]) - z2)
    if np.any(b == 0):
        raise ShapeError(f"div: int8 divisor equals its zero point {z2} (division by zero; TFLite's int8 DIV "
                         f"is undefined there)")
    a, b = np.where(b < 0, -a, a), np.abs(b)
    inv, recip_shift = fp.get_reciprocal(b, 31)
    headroom = count_leading_sign_bits(a)
    q = fp.multiply_by_quantized_multiplier_greater_than_one(a, inv, headroom)
    total = e - recip_shift - headroom
    if np.any(total > 0):
        raise ShapeError(f"div: input 0 scale / (input 1 scale * output scale) = {s1 / (s2 * so):g} is too large for "
                         f"TFLite's int8 DIV (its right shift turns negative)")
    return clamp8(rounding_divide_by_pot_x86(fp.saturating_rounding_doubling_high_mul(q, m), -total) + zo)


def rounding_divide_by_pot_x86(x, exponent):
    """gemmlowp RoundingDivideByPOT(int32 x, exponent) also for exponent >= 32, which TFLite's int8 DIV
    reaches for small numerators (undefined in C): as LiteRT computes it on x86, the mask
    (1ll << exponent) - 1 truncated to int32 is -1 and the shift count is taken mod 32."""
    x, e = _i64(x), _i64(exponent)
    big = e >= 32
    mask = np.where(big, -1, (np.int64(1) << np.minimum(e, 31)) - 1)
    threshold = (mask >> 1) + (x < 0)
    return (x >> (e & 31)) + ((x & mask) > threshold)


# ---- comparisons: both sides rescaled with left_shift 8 ------------------------------------------
CMP_LEFT_SHIFT = 8


def cmp_params(s):
    if not f32(s) < 1.0:
        raise ShapeError(f"comparison: TFLite's int8 comparisons need input scales below 1, got {s}")
    return fp.quantize_multiplier(f32(s))


def _cmp_rule(name, fn):
    def rule(xs, attrs, in_types, out_type):
        (s1, z1), (s2, z2) = int8_io(in_types, in_types[0], name, 2)[:2]
        (m1, e1), (m2, e2) = cmp_params(s1), cmp_params(s2)
        a = fp.multiply_by_quantized_multiplier((_i64(xs[0]) - z1) << CMP_LEFT_SHIFT, m1, e1)
        b = fp.multiply_by_quantized_multiplier((_i64(xs[1]) - z2) << CMP_LEFT_SHIFT, m2, e2)
        return fn(a, b)
    rule.__name__ = f"{name}_int8"
    return defrule(name, "int8_ref")(rule)


for _n, _fn in (("equal", np.equal), ("not_equal", np.not_equal), ("less", np.less), ("less_equal", np.less_equal),
                ("greater", np.greater), ("greater_equal", np.greater_equal)):
    _cmp_rule(_n, _fn)


# ---- how PTQ quantises them ----------------------------------------------------------------------
for _n in ("sub", "squared_difference", "leaky_relu", "prelu", "hard_swish", "abs", "rsqrt", "exp", "elu", "log",
           "div", "sqrt"):
    _quantizable(_n, Quant())
for _n in ("maximum", "minimum"):
    _quantizable(_n, Quant(inputs="requantize"))
