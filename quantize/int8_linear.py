"""int8 reference rules for the linear ops: conv2d (incl. depthwise, groups = C_in) and dense.

TFLite semantics (reference_integer_ops::ConvPerChannel / DepthwiseConvPerChannel /
FullyConnected / FullyConnectedPerChannel): accumulate ``(x - x_zp) * (w - w_zp)`` in int32 over
the window (padding taps add nothing, i.e. padding holds the input zero point), add the int32
bias, requantise per output channel, add the output zero point, clamp to the fused activation
range. Accumulation runs in float64, exact for any realistic reduction length (|acc| < 2**53),
then wraps to int32 as the C kernels do.

The requantisation differs between the two op families, as in LiteRT's reference kernels:

- conv2d / depthwise: ``multiply_by_quantized_multiplier`` (gemmlowp's two roundings) with the
  multiplier of ``in_scale * w_scale[c] / out_scale`` (double);
- dense (FULLY_CONNECTED): ``round(double(acc) * eff[c])`` with
  ``eff[c] = double(in_scale) * double(w_scale[c]) / double(out_scale)``, rounded half away from
  zero (C's ``round``), per tensor and per channel alike. LiteRT's reference FULLY_CONNECTED has
  requantised this way since April 2025 ("do requant in float to avoid loss of precision"); its
  optimized kernels and TFLite Micro's reference kernel still use the fixed-point multiplier,
  which differs by 1 LSB where gemmlowp's double rounding lands on the other side of a half
  (e.g. acc * eff = 2.483 -> 3). See docs/int8_ir.md.
"""
from __future__ import annotations

import numpy as np

from kiln.frontend.errors import ShapeError
from kiln.frontend.ops.nn import conv2d_nobias
from kiln.frontend.registry import defrule

from . import fixedpoint as fp
from ._qutil import channel_params, clamp8, f32, int8_io, need_int8

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def requantize_params(in_scale, w_scales, out_scale):
    """Per-channel (multiplier, shift) int64 arrays for a conv output: TFLite's
    PopulateConvolutionQuantizationParams, ``double(s_in) * double(s_w[c]) / double(s_out)`` for
    per-channel and per-tensor weights alike."""
    return fp.quantize_multipliers([f32(in_scale) * f32(s) / f32(out_scale) for s in w_scales])


def fc_effective_scales(in_scale, w_scales, out_scale):
    """Per-channel ``double(s_in) * double(s_w[c]) / double(s_out)`` of LiteRT's reference
    FULLY_CONNECTED (float64 array; every scale rounded to float32 first, as a .tflite holds it)."""
    return np.asarray([f32(in_scale) * f32(s) / f32(out_scale) for s in np.ravel(w_scales)], np.float64)


def fc_requantize(acc, eff):
    """``(int32)round(double(acc) * eff)``: LiteRT's reference FULLY_CONNECTED requantisation
    (IEEE double product, ties away from zero), saturated to int32 where C's conversion would be
    undefined. ``acc``: int32 values (int64 array), ``eff``: broadcastable float64."""
    v = np.asarray(acc, np.int64).astype(np.float64) * np.asarray(eff, np.float64)
    r = fp.round_half_away(v)
    return np.clip(r, INT32_MIN, INT32_MAX).astype(np.int64)


def fc_requant_constants(eff):
    """(mh, ml, s) int64 arrays with ``eff = (mh * 2**32 + ml) * 2**-s`` exactly: the 53-bit
    significand of each double and its exponent, what the C kernels' ``kiln_fc_rq`` takes
    (kiln_intrinsics.h). eff == 0 gives m = 0 and s = 127 (every output 0)."""
    mh, ml, s = [], [], []
    for e in np.ravel(np.asarray(eff, np.float64)):
        e = float(e)
        if not np.isfinite(e) or e < 0:
            raise ValueError(f"FULLY_CONNECTED effective scale {e} is not a finite non-negative number")
        if e == 0.0:
            mh.append(0), ml.append(0), s.append(127)
            continue
        f, x = np.frexp(e)              # e = f * 2**x, f in [0.5, 1)
        m = int(np.ldexp(f, 53))        # exact: 53-bit significand
        mh.append(m >> 32), ml.append(m & 0xFFFFFFFF), s.append(53 - int(x))
    return np.asarray(mh, np.int64), np.asarray(ml, np.int64), np.asarray(s, np.int64)


def _finish(acc, bias, mult, shift, out_zp, act, out_scale):
    if bias is not None:
        acc = acc + np.asarray(bias, np.int64)
    acc = fp.wrap_int32(acc)
    y = fp.multiply_by_quantized_multiplier(acc, mult, shift) + out_zp
    lo, hi = fp.activation_range(act, out_scale, out_zp)
    return clamp8(y, lo, hi)


def _bias(xs, op, n):
    if len(xs) < 3:
        return None
    b = np.asarray(xs[2])
    if b.dtype.kind not in "iu":
        raise ShapeError(f"{op}: int8 reference needs an int32 bias, got {b.dtype}")
    return b.astype(np.int64)


@defrule("conv2d", "int8_ref")
def conv2d_int8(xs, attrs, in_types, out_type):
    x, w = xs[0], xs[1]
    (s_in, z_in), (s_out, z_out) = int8_io(in_types[:1], out_type, "conv2d")
    need_int8(in_types[1], "weight", "conv2d")
    O = w.shape[0]
    ws, wz, _ = channel_params(in_types[1], O, "conv2d")
    xf = x.astype(np.float64) - z_in
    wf = w.astype(np.float64) - wz.reshape(O, 1, 1, 1)
    acc = np.rint(conv2d_nobias(xf, wf, attrs)).astype(np.int64)
    mult, shift = requantize_params(s_in, ws, s_out)
    return _finish(acc, _bias(xs, "conv2d", O), mult, shift, z_out, attrs["activation"], s_out)


@defrule("dense", "int8_ref")
def dense_int8(xs, attrs, in_types, out_type):
    x, w = xs[0], xs[1]
    (s_in, z_in), (s_out, z_out) = int8_io(in_types[:1], out_type, "dense")
    need_int8(in_types[1], "weight", "dense")
    N = w.shape[0]
    ws, wz, _ = channel_params(in_types[1], N, "dense")
    xf = x.astype(np.float64) - z_in
    wf = w.astype(np.float64) - wz.reshape(N, 1)
    acc = np.rint(np.matmul(xf, wf.T)).astype(np.int64)
    bias = _bias(xs, "dense", N)
    if bias is not None:
        acc = acc + bias
    acc = fp.wrap_int32(acc)
    y = fc_requantize(acc, fc_effective_scales(s_in, ws, s_out)) + z_out
    lo, hi = fp.activation_range(attrs["activation"], s_out, z_out)
    return clamp8(y, lo, hi)
