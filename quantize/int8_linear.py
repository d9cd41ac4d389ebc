"""int8 reference rules for the linear ops: conv2d (incl. depthwise, groups = C_in) and dense.

TFLite semantics (reference_integer_ops::ConvPerChannel / DepthwiseConvPerChannel /
FullyConnected): accumulate ``(x - x_zp) * (w - w_zp)`` in int32 over the window (padding taps add
nothing, i.e. padding holds the input zero point), add the int32 bias, requantise per output
channel with ``multiply_by_quantized_multiplier`` and the multiplier of
``in_scale * w_scale[c] / out_scale`` (double), add the output zero point, clamp to the fused
activation range. Accumulation runs in float64, exact for any realistic reduction length
(|acc| < 2**53), then wraps to int32 as the C kernels do.
"""
from __future__ import annotations

import numpy as np

from kiln.frontend.errors import ShapeError
from kiln.frontend.ops.nn import conv2d_nobias
from kiln.frontend.registry import defrule

from . import fixedpoint as fp
from ._qutil import channel_params, clamp8, f32, int8_io, need_int8


def requantize_params(in_scale, w_scales, out_scale, per_channel=True):
    """Per-channel (multiplier, shift) int64 arrays for a conv/dense output.

    ``per_channel=False`` reproduces TFLite's per-tensor FULLY_CONNECTED, which forms the product
    ``in_scale * w_scale`` in float32 before dividing in double (GetQuantizedConvolutionMultipler)."""
    if per_channel:
        reals = [f32(in_scale) * f32(s) / f32(out_scale) for s in w_scales]
    else:
        reals = [float(np.float32(in_scale) * np.float32(s)) / f32(out_scale) for s in w_scales]
    return fp.quantize_multipliers(reals)


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
    ws, wz, per_channel = channel_params(in_types[1], N, "dense")
    xf = x.astype(np.float64) - z_in
    wf = w.astype(np.float64) - wz.reshape(N, 1)
    acc = np.rint(np.matmul(xf, wf.T)).astype(np.int64)
    mult, shift = requantize_params(s_in, ws, s_out, per_channel=per_channel)
    return _finish(acc, _bias(xs, "dense", N), mult, shift, z_out, attrs["activation"], s_out)
