"""int16 (16x8) references of TFLite's element-wise kernels beyond ADD, MUL, RELU(6), LOGISTIC and
TANH (those are in ``elementwise.py``), bit for bit with TensorFlow Lite Micro's kernels (where
LiteRT differs, docs/int8_ir.md says how):

- ``sub``: TFLM's CalculateOpDataSub: both inputs rescaled to 2 * max scale with left_shift 15, the
  multipliers formed in float32; the difference requantised by 2 * max scale / (2**15 * output scale).
- ``leaky_relu``: the int8 arithmetic (identity and alpha multipliers) clamped to int16.
- ``maximum``/``minimum``: the codes compared; ``abs``: |x|, rescaled when the scales differ.
- ``squared_difference``: inputs rescaled to 2 * max scale (left_shift 0), the int32 difference
  squared, one requantisation by (2 * max scale)**2 / output scale (double).
- ``prelu``: int16 input, int8 alpha: s_in / s_out and s_in * s_alpha / s_out (double).

Each rule is installed as the int16 branch of the op's quantised reference (``int16_branch``).
"""
import functools

import numpy as np

from .. import fixedpoint as fp
from ..errors import ShapeError
from ..registry import get_op
from ..types import TensorType
from . import elementwise_int8  # noqa: F401  (the int8 rules this module's branches fall back to)
from .elementwise import ADD_LEFT_SHIFT_16
from .elementwise_int8 import leaky_apply, leaky_params
from .int8util import per_tensor
from .int16util import clamp16, int16_branch, int16_io, is_int16


def _i64(x):
    return np.asarray(x).astype(np.int64)


# ---- sub ------------------------------------------------------------------------------------------
def sub16_params(s1, s2, s_out):
    """TFLM CalculateOpDataSub for int16: ((m1, e1), (m2, e2), (m_out, e_out)), every ratio
    computed in float32 (``input->params.scale / twice_max_input_scale``), then to double."""
    f = np.float32
    twice = f(2) * max(f(s1), f(s2))
    r1, r2 = float(f(s1) / twice), float(f(s2) / twice)
    r_out = float(twice / (f(1 << ADD_LEFT_SHIFT_16) * f(s_out)))
    return fp.quantize_multiplier(r1), fp.quantize_multiplier(r2), fp.quantize_multiplier(r_out)


def sub16_params_litert(s1, s2, s_out):
    """LiteRT's formation of the same multipliers, in double (``double(scale) / twice_max``); the
    seanet golden files follow it. Kiln follows TFLite Micro (``sub16_params``); see docs/int8_ir.md."""
    twice = 2.0 * max(float(np.float32(s1)), float(np.float32(s2)))
    r_out = twice / ((1 << ADD_LEFT_SHIFT_16) * float(np.float32(s_out)))
    return (fp.quantize_multiplier(float(np.float32(s1)) / twice), fp.quantize_multiplier(float(np.float32(s2)) / twice),
            fp.quantize_multiplier(r_out))


def sub_int16(xs, attrs, in_types, out_type):
    (s1, z1), (s2, z2), (so, zo) = int16_io(in_types, out_type, "sub", 2, symmetric=False)
    (m1, e1), (m2, e2), (mo, eo) = sub16_params(s1, s2, so)
    a = fp.multiply_by_quantized_multiplier((_i64(xs[0]) - z1) << ADD_LEFT_SHIFT_16, m1, e1)
    b = fp.multiply_by_quantized_multiplier((_i64(xs[1]) - z2) << ADD_LEFT_SHIFT_16, m2, e2)
    return clamp16(fp.multiply_by_quantized_multiplier(fp.wrap_int32(a - b), mo, eo) + zo)


int16_branch("sub", sub_int16)


# ---- leaky_relu -----------------------------------------------------------------------------------
def leaky_relu_int16(xs, attrs, in_types, out_type):
    """QuantizeLeakyRelu<int16_t> (elementwise_int8.leaky_apply), + z_out, clamped to int16."""
    (si, zi), (so, zo) = int16_io(in_types, out_type, "leaky_relu", symmetric=False)
    return clamp16(leaky_apply(_i64(xs[0]) - zi, leaky_params(si, so, attrs["alpha"])) + zo)


int16_branch("leaky_relu", leaky_relu_int16)


# ---- maximum / minimum: the int16 codes compared as they are (TFLite does not rescale) --------------
def _minmax16(name, fn):
    def rule(xs, attrs, in_types, out_type):
        int16_io(in_types, out_type, name, 2, symmetric=False)
        return fn(xs[0], xs[1]).astype(np.int16)
    rule.__name__ = f"{name}_int16"
    return int16_branch(name, rule)


_minmax16("maximum", np.maximum)
_minmax16("minimum", np.minimum)


# ---- abs: TFLM's AbsEvalQuantized<int16_t> ---------------------------------------------------------
def abs_int16(xs, attrs, in_types, out_type):
    """|x| (zero points 0), rescaled by the multiplier of float32(s_in / s_out) when the scales
    differ, clamped to int16 (|-32768| saturates to 32767)."""
    (si, _), (so, _) = int16_io(in_types, out_type, "abs")
    v = np.abs(_i64(xs[0]))
    if np.float32(si) != np.float32(so):
        m, e = fp.quantize_multiplier(float(np.float32(si) / np.float32(so)))
        v = fp.multiply_by_quantized_multiplier(v, m, e)
    return clamp16(v)


int16_branch("abs", abs_int16)


# ---- squared_difference: TFLM's PrepareQuantized with left_shift 0 ----------------------------------
def sqdiff16_params(s1, s2, s_out):
    """((m1, e1), (m2, e2), (m_out, e_out)): inputs rescaled to 2 * max scale, the squared
    difference by (2 * max scale)^2 / s_out, all in double."""
    twice = 2.0 * max(float(np.float32(s1)), float(np.float32(s2)))
    return (fp.quantize_multiplier(float(np.float32(s1)) / twice), fp.quantize_multiplier(float(np.float32(s2)) / twice),
            fp.quantize_multiplier(twice * twice / float(np.float32(s_out))))


def squared_difference_int16(xs, attrs, in_types, out_type):
    (s1, _), (s2, _), (so, _) = int16_io(in_types, out_type, "squared_difference", 2)
    (m1, e1), (m2, e2), (mo, eo) = sqdiff16_params(s1, s2, so)
    d = fp.multiply_by_quantized_multiplier(_i64(xs[0]), m1, e1) - fp.multiply_by_quantized_multiplier(_i64(xs[1]), m2, e2)
    return clamp16(fp.multiply_by_quantized_multiplier(fp.wrap_int32(d * d), mo, eo))


int16_branch("squared_difference", squared_difference_int16)


# ---- prelu: TFLM's BroadcastPrelu4DSlow<int16_t, int8_t> --------------------------------------------
def prelu16_params(si, sa, so):
    """CalculatePreluParams: s_in / s_out and s_in * s_alpha / s_out, in double."""
    f = [float(np.float32(s)) for s in (si, sa, so)]
    return fp.quantize_multiplier(f[0] / f[2]), fp.quantize_multiplier(f[0] * f[1] / f[2])


def prelu_int16(xs, attrs, in_types, out_type):
    """int16 input, int8 alpha (TFLM requires it), int16 output: (x - z_in) times the first
    multiplier where it is >= 0, else (x - z_in) * (alpha - z_alpha) times the second, + z_out."""
    (si, zi), (so, zo) = int16_io(in_types[:1], out_type, "prelu", symmetric=False)
    at = in_types[1]
    if at.dtype != "int8" or at.quant is None:
        raise ShapeError(f"prelu: TFLite Micro's int16 PRELU needs a quantised int8 alpha, got {at}")
    sa, za = per_tensor(at, "alpha", "prelu")
    (m1, e1), (m2, e2) = prelu16_params(si, sa, so)
    v, al = np.broadcast_arrays(_i64(xs[0]) - zi, _i64(xs[1]) - za)
    y = np.where(v >= 0, fp.multiply_by_quantized_multiplier(v, m1, e1),
                 fp.multiply_by_quantized_multiplier(fp.wrap_int32(v * al), m2, e2))
    return clamp16(y + zo)


int16_branch("prelu", prelu_int16)
_prelu_infer = get_op("prelu").infer


@functools.wraps(_prelu_infer)          # keeps the rule's home module (docs/ops.md's "defined in")
def _prelu_infer_16x8(ts, attrs):
    """prelu's shape rule, also for an int16 input with an int8 alpha (TFLite Micro's 16x8 PRELU)."""
    if len(ts) == 2 and is_int16(ts[0]) and ts[1].dtype == "int8" and ts[1].quant is not None:
        ts = [ts[0], TensorType(ts[1].shape, "int16", ts[1].quant)]
    return _prelu_infer(ts, attrs)


get_op("prelu").infer = _prelu_infer_16x8
