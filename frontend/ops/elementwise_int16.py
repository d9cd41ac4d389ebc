"""int16 (16x8) references of TFLite's element-wise kernels beyond ADD, MUL, RELU(6), LOGISTIC and
TANH (those are in ``elementwise.py``), bit for bit with TensorFlow Lite Micro's kernels (where
LiteRT differs, docs/int8_ir.md says how):

- ``sub``: TFLM's CalculateOpDataSub: both inputs rescaled to 2 * max scale with left_shift 15, the
  multipliers formed in float32; the difference requantised by 2 * max scale / (2**15 * output scale).
- ``leaky_relu``: the int8 arithmetic (identity and alpha multipliers) clamped to int16.

Each rule is installed as the int16 branch of the op's quantised reference (``int16_branch``).
"""
import numpy as np

from .. import fixedpoint as fp
from . import elementwise_int8  # noqa: F401  (the int8 rules this module's branches fall back to)
from .elementwise import ADD_LEFT_SHIFT_16
from .elementwise_int8 import leaky_params
from .int16util import clamp16, int16_branch, int16_io


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
    """reference_ops::QuantizeLeakyRelu<int16_t>: (x - z_in) times the identity multiplier where it
    is >= 0, the alpha multiplier below, + z_out, clamped to int16."""
    (si, zi), (so, zo) = int16_io(in_types, out_type, "leaky_relu", symmetric=False)
    (mi, ei), (ma, ea) = leaky_params(si, so, attrs["alpha"])
    v = _i64(xs[0]) - zi
    y = np.where(v >= 0, fp.multiply_by_quantized_multiplier(v, mi, ei), fp.multiply_by_quantized_multiplier(v, ma, ea))
    return clamp16(y + zo)


int16_branch("leaky_relu", leaky_relu_int16)
