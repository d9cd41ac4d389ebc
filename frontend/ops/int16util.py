"""Helpers shared by the int16 ("16x8") reference rules: TFLite's 16x8 quantisation keeps
activations in int16, symmetric (zero point 0), weights in int8 and biases in int64.

The rules themselves live with their ops (a ``# ---- int16 ----`` block at the end of each family
module); this module holds what they share: reading int16 quantisation parameters, the int64
``MultiplyByQuantizedMultiplier`` of TFLite's 16x8 conv/depthwise/fully-connected kernels, and
the int16 clamps.
"""
from __future__ import annotations

import numpy as np

from .. import fixedpoint as fp
from ..errors import ShapeError
from ..registry import INT16 as INT16_PROP
from ..registry import get_op, mark
from .int8util import per_tensor

QMIN16, QMAX16 = -32768, 32767
INT16 = "int16"


def is_int16(t) -> bool:
    """True when the TensorType ``t`` is a quantised int16 activation."""
    return t is not None and t.dtype == INT16


def need_int16(t, what, op):
    if t.dtype != INT16:
        raise ShapeError(f"{op}: int16 reference needs an int16 {what}, got {t}")


def int16_io(in_types, out_type, op, n=1, symmetric=True):
    """Check inputs 0..n-1 and the output are per-tensor int16 (zero point 0 where TFLite's 16x8
    kernels require it: ``symmetric``) and return their (scale, zero_point) pairs, output last."""
    names = ["input"] if n == 1 else [f"input {k}" for k in range(n)]
    out = []
    for t, what in list(zip(in_types, names)) + [(out_type, "output")]:
        need_int16(t, what, op)
        s, z = per_tensor(t, what, op)
        if symmetric and z != 0:
            raise ShapeError(f"{op}: TFLite's int16 kernels need a zero point of 0 on the {what}, got {z} ({t})")
        out.append((s, z))
    return out


def symmetric16(err, where, named_quants):
    """Import check of TFLite's 16x8 kernels' Prepare: every (what, QParams) has zero point 0."""
    for what, q in named_quants:
        z = [int(v) for v in (q.zero_point if q is not None else ()) if v != 0]
        if z:
            raise err(f"{where}: {what} zero_point {z[0]} is out of range: allowed 0 (TFLite's int16 kernels need "
                      f"symmetric int16 tensors)")


def clamp16(y, lo=QMIN16, hi=QMAX16):
    return np.clip(np.asarray(y, np.int64), lo, hi).astype(np.int16)


def mbqm64(x, multiplier, shift):
    """TFLite ``MultiplyByQuantizedMultiplier(int64_t x, int32_t m, int shift)`` (the 16x8
    kernels' requantisation): the multiplier reduced to 16 bits (``(m + 2**15) >> 16``, at most
    0x7FFF), then one rounding right shift by ``15 - shift``. Vectorised; ``multiplier`` and
    ``shift`` broadcast against ``x`` (per channel on the last axis). Exact in int64 for the
    kernels' input range |x| < 2**47. TFLite returns ``int32_t result = x >> total_shift`` (the
    double-rounding build, LiteRT's and TFLite Micro's), so the result is that int64 value's low 32
    bits (``wrap32``); where ``x * reduced`` leaves int64 (|x| from about 2**48) the product wraps
    as the compiled kernels' does (NumPy's int64 arithmetic wraps too)."""
    x = np.asarray(x, np.int64)
    m = np.asarray(multiplier, np.int64)
    s = np.asarray(shift, np.int64)
    reduced = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF)
    total = 15 - s
    rnd = np.left_shift(np.int64(1), total - 1)
    with np.errstate(over="ignore"):
        return wrap32((x * reduced + rnd) >> total)


def wrap32(v):
    """int64 -> int32 as C converts it (GCC and Clang; C++20 defines it): the low 32 bits, as int64.
    A requantised 16x8 product of 2**31 or more comes out negative before the int16 clamp."""
    return np.asarray(v, np.int64).astype(np.int32).astype(np.int64)



def is_16x8(ts) -> bool:
    """(input, weight, ...) types of a 16x8 conv/dense: a quantised int16 input, int8 weights."""
    return len(ts) >= 2 and is_int16(ts[0]) and ts[1].dtype == "int8"


# TFLite's sigmoid_table_uint16 (kernels/internal/common.h): sigmoid(i / 24) in 0.16 fixed point,
# shared by the int16 LOGISTIC and TANH kernels (tanh(x) = 2 * sigmoid(2x) - 1).
SIGMOID_TABLE_U16 = np.asarray([
    32768, 33451, 34133, 34813, 35493, 36169, 36843, 37513, 38180, 38841, 39498, 40149,
    40794, 41432, 42064, 42688, 43304, 43912, 44511, 45102, 45683, 46255, 46817, 47369,
    47911, 48443, 48964, 49475, 49975, 50464, 50942, 51409, 51865, 52311, 52745, 53169,
    53581, 53983, 54374, 54755, 55125, 55485, 55834, 56174, 56503, 56823, 57133, 57433,
    57724, 58007, 58280, 58544, 58800, 59048, 59288, 59519, 59743, 59959, 60168, 60370,
    60565, 60753, 60935, 61110, 61279, 61441, 61599, 61750, 61896, 62036, 62172, 62302,
    62428, 62549, 62666, 62778, 62886, 62990, 63090, 63186, 63279, 63368, 63454, 63536,
    63615, 63691, 63765, 63835, 63903, 63968, 64030, 64090, 64148, 64204, 64257, 64308,
    64357, 64405, 64450, 64494, 64536, 64576, 64614, 64652, 64687, 64721, 64754, 64786,
    64816, 64845, 64873, 64900, 64926, 64950, 64974, 64997, 65019, 65039, 65060, 65079,
    65097, 65115, 65132, 65149, 65164, 65179, 65194, 65208, 65221, 65234, 65246, 65258,
    65269, 65280, 65291, 65301, 65310, 65319, 65328, 65337, 65345, 65352, 65360, 65367,
    65374, 65381, 65387, 65393, 65399, 65404, 65410, 65415, 65420, 65425, 65429, 65433,
    65438, 65442, 65445, 65449, 65453, 65456, 65459, 65462, 65465, 65468, 65471, 65474,
    65476, 65479, 65481, 65483, 65485, 65488, 65489, 65491, 65493, 65495, 65497, 65498,
    65500, 65501, 65503, 65504, 65505, 65507, 65508, 65509, 65510, 65511, 65512, 65513,
    65514, 65515, 65516, 65517, 65517, 65518, 65519, 65520, 65520, 65521, 65522, 65522,
    65523, 65523, 65524, 65524, 65525, 65525, 65526, 65526, 65526, 65527, 65527, 65528,
    65528, 65528, 65529, 65529, 65529, 65529, 65530, 65530, 65530, 65530, 65531, 65531,
    65531, 65531, 65531, 65532, 65532, 65532, 65532, 65532, 65532, 65533, 65533, 65533,
    65533, 65533, 65533, 65533, 65533, 65534, 65534, 65534, 65534, 65534, 65534, 65534,
    65534, 65534, 65534, 65535,
], np.int64)


def checked_log2(x):
    """TFLite ``CheckedLog2(float x)``: (is a power of two within 1e-3 in log2, rounded log2), in
    float32 as TFLite computes it."""
    f = np.float32
    xl = f(np.log(f(x), dtype=f)) * (f(1.0) / f(np.log(f(2.0), dtype=f)))
    r = f(np.floor(abs(xl) + f(0.5))) * (1 if xl >= 0 else -1)
    return bool(abs(f(xl - f(r))) < f(1e-3)), int(r)


def lut_activation_params(input_scale, integer_bits_shift_ok):
    """(input_multiplier, input_left_shift) of TFLite's int16 LOGISTIC / TANH Prepare: a power of
    two input scale whose shift is allowed (``integer_bits_shift_ok(shift)``) gives multiplier 0;
    otherwise the input is rescaled to 1 / (3 * 4096) with a multiplier below 32768."""
    pot, log2 = checked_log2(input_scale)
    shift = (15 - 3) + log2
    if pot and integer_bits_shift_ok(shift):
        return 0, shift
    mult = float(np.float32(input_scale)) * 4096.0 * 3.0
    shift = 0
    while mult <= 32767.0 / 2.0 and shift <= 30:
        shift += 1
        mult *= 2.0
    return int(mult), shift


def _lut_input(x, mult, shift):
    if mult == 0:
        mult, shift = 3 << shift, 0
    rnd = (1 << (shift - 1)) if shift > 0 else 0
    return (np.asarray(x, np.int64) * mult + rnd) >> shift


def logistic16(x, mult, shift):
    """reference_integer_ops::Logistic (int16): table interpolation on |x| in 9 fractional bits."""
    v = _lut_input(x, mult, shift)
    a = np.abs(v)
    uh = a >> 9
    idx = np.minimum(uh, 254)
    ua, ub = SIGMOID_TABLE_U16[idx], SIGMOID_TABLE_U16[idx + 1]
    r = np.where(uh >= 255, 0x7FFF << 10, (ua << 9) + (a & 0x1FF) * (ub - ua))
    r = np.where(v >= 0, r + (1 << 9), (1 << 25) - r + (1 << 9) - 1)
    return (r >> 10).astype(np.int16)


def tanh16(x, mult, shift):
    """reference_integer_ops::Tanh (int16): the sigmoid table at 8 fractional bits."""
    v = _lut_input(x, mult, shift)
    a = np.abs(v)
    uh = a >> 8
    idx = np.minimum(uh, 254)
    ua, ub = SIGMOID_TABLE_U16[idx], SIGMOID_TABLE_U16[idx + 1]
    r = np.where(uh >= 255, 0xFFFF << 8, (ua << 8) + (a & 0xFF) * (ub - ua))
    r = np.where(v >= 0, r - (1 << 23) + (1 << 7), -r + (1 << 23) + (1 << 7) - 1)
    return (r >> 8).astype(np.int16)


# ---- int16 SOFTMAX: TFLite's 513-entry interpolated tables (LUTPopulate<int16_t>, float) ----------
def lut_populate_int16(transform, input_scale, input_zp, output_scale, output_zp, f=np.float32):
    """TFLite ``LUTPopulateInt16<float>``: 512 samples of ``transform`` (float32 in, float32 out)
    over the int16 input range, each biased by half the midpoint interpolation error, plus the
    end point; every step in float32 as the C++ computes it. Returns 513 int64 values."""
    in_s, out_s = f(input_scale), f(output_scale)
    input_min = in_s * f(-32768 - input_zp)
    input_max = in_s * f(32767 - input_zp)
    output_min = out_s * f(-32768 - output_zp)
    output_max = out_s * f(32767 - output_zp)
    step = (input_max - input_min) / f(512)
    half = step / f(2)
    inv = f(65536) / (output_max - output_min)
    i = np.arange(512).astype(f)
    val = transform(input_min + i * step)
    mid = transform(input_min + i * step + half)
    nxt = transform(input_min + (i + f(1)) * step)
    rnd = fp.round_half_away
    sample = rnd((val * inv).astype(f))
    interp = rnd(((nxt * inv + rnd((val * inv).astype(f))) / f(2)).astype(f))
    bias = rnd(((interp - rnd((mid * inv).astype(f))) / f(2)).astype(f))
    lut = np.clip(sample - bias, f(-32768), f(32767)).astype(np.int64)
    last = np.clip(rnd((transform(np.asarray([input_max], f)) * inv).astype(f)), -32768, 32767).astype(np.int64)
    return np.concatenate([lut, last])


def lut_lookup16(value, lut):
    """TFLite ``LUTLookup(int16_t, const int16_t*)``: 9-bit index, 7-bit linear interpolation."""
    v = np.asarray(value, np.int64)
    idx = 256 + (v >> 7)
    off = v & 0x7F
    base = lut[idx]
    slope = ((lut[idx + 1] - base + 32768) & 0xFFFF) - 32768        # int16_t slope
    return (((base + ((slope * off + 64) >> 7)) + 32768) & 0xFFFF) - 32768


def _exp64(x):
    return np.exp(np.asarray(x, np.float64))


def _one_over_one_plus_x64(x):
    return 1.0 / (1.0 + np.asarray(x, np.float64))


def softmax16_tables():
    """(exp table over [-10, 0], 1 / (1 + x) table over [0, 1]) of LiteRT's int16 softmax:
    ``LUTPopulate<int16_t>(10.0 / 65535, ...)`` with double scales and a double transform, which
    resolves to the double ``LUTPopulateInt16<double>``."""
    exp_lut = lut_populate_int16(_exp64, 10.0 / 65535, 32767, 2.0 / 65535, 0, np.float64)
    rec_lut = lut_populate_int16(_one_over_one_plus_x64, 1.0 / 65535, -32768, 2.0 / 65535, 0, np.float64)
    return exp_lut, rec_lut


def softmax16_rows(x, input_scale, beta=1.0):
    """reference_ops::SoftmaxInt16 over the last axis of ``x`` (int16 in, int16 out scale 1/32768)."""
    exp_lut, rec_lut = softmax16_tables()
    m, shift = fp.quantize_multiplier(float(np.float32(input_scale)) * float(np.float32(beta)) / (10.0 / 65535.0))
    x = np.asarray(x, np.int64)
    diff = x - x.max(axis=-1, keepdims=True)
    scaled = fp.multiply_by_quantized_multiplier(diff, m, shift)
    e = lut_lookup16(np.clip(scaled + 32767, -32768, 32767), exp_lut)
    total = fp.wrap_int32(e.sum(axis=-1, keepdims=True))
    h = fp.count_leading_zeros_u32(total)
    shifted = ((total << (h - 1)) + (1 << 13)) >> 14
    recip = lut_lookup16(np.clip(shifted - (1 << 15) - (1 << 16), -32768, 32767), rec_lut)
    right = 31 - h
    y = (e * recip + (np.int64(1) << (right - 1))) >> right
    return np.clip(y, 0, 32767).astype(np.int16)


def int16_branch(op_name, rule16):
    """Give op ``op_name`` an int16 branch: its ``int8_ref`` (Kiln's one quantised-reference slot)
    calls ``rule16`` when input 0 or the output is int16 and the rule it had otherwise; marks the
    op ``INT16`` (it has TFLite's 16x8 kernel)."""
    op = get_op(op_name)
    prev = op.int8_ref

    def rule(xs, attrs, in_types, out_type):
        if is_int16(in_types[0]) or is_int16(out_type):
            return rule16(xs, attrs, in_types, out_type)
        if prev is None:
            raise ShapeError(f"{op_name}: no int8 reference (its int16 branch takes int16 operands)")
        return prev(xs, attrs, in_types, out_type)
    rule.__name__ = f"{op_name}_int8_or_int16"
    rule.int16 = rule16
    op.int8_ref = rule
    mark(INT16_PROP, op_name)
    return rule16
