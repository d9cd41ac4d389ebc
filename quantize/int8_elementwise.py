"""int8 reference rules for element-wise ops and activations, as LiteRT's reference kernels
compute them:

- ``add``: both inputs rescaled to a common scale with ``left_shift = 20`` (TFLite int8 ADD).
- ``mul``: one requantisation of the product by ``s1 * s2 / s_out`` (formed in float32, as TFLite).
- ``relu``/``relu6``: TFLite's ReluX: requantise input -> output scale, clamp to the activation range.
- ``sigmoid`` (LOGISTIC) / ``tanh``: 256-entry tables populated in float32 (LUTPopulate).
- ``softmax``: the gemmlowp fixed-point exp / reciprocal path of reference_ops::Softmax (beta 1).
"""
from __future__ import annotations

import numpy as np

from kiln.frontend.errors import ShapeError
from kiln.frontend.registry import defrule

from . import fixedpoint as fp
from ._qutil import clamp8, f32, int8_io

ADD_LEFT_SHIFT = 20


def add_params(s1, s2, s_out):
    """TFLite int8 ADD prepare: ((m1, sh1), (m2, sh2), (m_out, sh_out)), all shifts <= 0."""
    twice_max = float(2 * np.float32(max(f32(s1), f32(s2))))
    r1 = f32(s1) / twice_max
    r2 = f32(s2) / twice_max
    r_out = twice_max / float(np.float32((1 << ADD_LEFT_SHIFT) * np.float32(s_out)))
    return fp.quantize_multiplier(r1), fp.quantize_multiplier(r2), fp.quantize_multiplier(r_out)


@defrule("add", "int8_ref")
def add_int8(xs, attrs, in_types, out_type):
    (s1, z1), (s2, z2), (so, zo) = int8_io(in_types, out_type, "add", 2)
    (m1, e1), (m2, e2), (mo, eo) = add_params(s1, s2, so)
    a = (xs[0].astype(np.int64) - z1) << ADD_LEFT_SHIFT
    b = (xs[1].astype(np.int64) - z2) << ADD_LEFT_SHIFT
    a = fp.multiply_by_quantized_multiplier(a, m1, e1)
    b = fp.multiply_by_quantized_multiplier(b, m2, e2)
    y = fp.multiply_by_quantized_multiplier(fp.wrap_int32(a + b), mo, eo) + zo
    return clamp8(y)


def mul_params(s1, s2, s_out):
    return fp.quantize_multiplier(float(np.float32(np.float32(s1) * np.float32(s2)) / np.float32(s_out)))


@defrule("mul", "int8_ref")
def mul_int8(xs, attrs, in_types, out_type):
    (s1, z1), (s2, z2), (so, zo) = int8_io(in_types, out_type, "mul", 2)
    m, e = mul_params(s1, s2, so)
    prod = fp.wrap_int32((xs[0].astype(np.int64) - z1) * (xs[1].astype(np.int64) - z2))
    return clamp8(fp.multiply_by_quantized_multiplier(prod, m, e) + zo)


def _relu_x(op, act):
    def rule(xs, attrs, in_types, out_type):
        (si, zi), (so, zo) = int8_io(in_types, out_type, op)
        m, e = fp.quantize_multiplier(float(np.float32(si) / np.float32(so)))  # float32 division, as TFLite
        lo, hi = fp.activation_range(act, so, zo)
        y = fp.multiply_by_quantized_multiplier(xs[0].astype(np.int64) - zi, m, e) + zo
        return clamp8(y, lo, hi)
    rule.__name__ = f"{op}_int8"
    return defrule(op, "int8_ref")(rule)


_relu_x("relu", "relu")
_relu_x("relu6", "relu6")


def _lut(op, fn):
    def rule(xs, attrs, in_types, out_type):
        (si, zi), (so, zo) = int8_io(in_types, out_type, op)
        if fn == "logistic" and so != 1.0 / 256:
            raise ShapeError(f"{op}: TFLite's int8 LOGISTIC needs output scale 1/256, got {so}")
        table = fp.lut_int8(fn, si, zi, so, zo)
        return table[xs[0].astype(np.int64) + 128].astype(np.int8)
    rule.__name__ = f"{op}_int8"
    return defrule(op, "int8_ref")(rule)


_lut("sigmoid", "logistic")
_lut("tanh", "tanh")

SOFTMAX_SCALED_DIFF_INTEGER_BITS = 5
SOFTMAX_ACCUMULATION_INTEGER_BITS = 12


def softmax_params(input_scale, beta=1.0):
    """(input_multiplier, input_left_shift, diff_min) of TFLite's int8 reference softmax."""
    m, s = fp.preprocess_softmax_scaling(beta, f32(input_scale), SOFTMAX_SCALED_DIFF_INTEGER_BITS)
    diff_min = -fp.calculate_input_radius(SOFTMAX_SCALED_DIFF_INTEGER_BITS, s)
    return m, s, diff_min


def softmax_int8_rows(x, input_scale, beta=1.0):
    """reference_ops::Softmax for int8 -> int8 (output scale 1/256, zero point -128) over the
    last axis of ``x``."""
    mult, left_shift, diff_min = softmax_params(input_scale, beta)
    x = np.asarray(x, np.int64)
    diff = x - x.max(axis=-1, keepdims=True)
    use = diff >= diff_min
    rescaled = fp.multiply_by_quantized_multiplier_greater_than_one(diff, mult, left_shift)
    e = fp.exp_on_negative_values(rescaled, SOFTMAX_SCALED_DIFF_INTEGER_BITS)
    terms = np.where(use, fp.saturating_rounding_multiply_by_pot(e, -SOFTMAX_ACCUMULATION_INTEGER_BITS), 0)
    # the C loop adds in int32 (no saturation); a row never comes close to overflowing
    total = fp.wrap_int32(terms.sum(axis=-1, keepdims=True))
    scale, bits_over_unit = fp.get_reciprocal(total, SOFTMAX_ACCUMULATION_INTEGER_BITS)
    exponent = bits_over_unit + 31 - 8
    out = fp.rounding_divide_by_pot(fp.saturating_rounding_doubling_high_mul(scale, e), exponent) - 128
    return np.where(use, np.clip(out, -128, 127), -128).astype(np.int8)


@defrule("softmax", "int8_ref")
def softmax_int8(xs, attrs, in_types, out_type):
    (si, _), (so, zo) = int8_io(in_types, out_type, "softmax")
    if zo != -128 or abs(so - 1.0 / 256) > 0.001 / 256:
        raise ShapeError(f"softmax: TFLite's int8 softmax needs output scale 1/256 and zero point -128, "
                         f"got {out_type}")
    x = xs[0]
    ax = attrs["axis"] % x.ndim
    if ax != x.ndim - 1:
        return np.moveaxis(softmax_int8_rows(np.moveaxis(x, ax, -1), si), -1, ax)
    return softmax_int8_rows(x, si)
