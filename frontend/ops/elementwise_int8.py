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
- ``exp``, ``elu``: 256-entry tables filled in float32 (LUTPopulate).
Multipliers are formed in float32 where TFLite's Prepare() computes in float, as it does.
"""
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
    return (fp.quantize_multiplier(float(_f(si) / _f(so))),
            fp.quantize_multiplier(float(_f(si) * _f(alpha) / _f(so))))


@defrule("leaky_relu", "int8_ref")
def leaky_relu_int8(xs, attrs, in_types, out_type):
    (si, zi), (so, zo) = int8_io(in_types, out_type, "leaky_relu")
    (mi, ei), (ma, ea) = leaky_params(si, so, attrs["alpha"])
    v = _i64(xs[0]) - zi
    y = np.where(v >= 0, fp.multiply_by_quantized_multiplier(v, mi, ei), fp.multiply_by_quantized_multiplier(v, ma, ea))
    return clamp8(y + zo)


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


# ---- how PTQ quantises them ----------------------------------------------------------------------
for _n in ("sub", "squared_difference", "leaky_relu", "prelu", "hard_swish", "abs", "rsqrt", "exp", "elu"):
    _quantizable(_n, Quant())
for _n in ("maximum", "minimum"):
    _quantizable(_n, Quant(inputs="requantize"))
