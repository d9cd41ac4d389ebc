"""The rules a .tflite file must follow before Kiln imports it: what TFLite's model loader
(``InterpreterBuilder::ParseQuantization``, ``ParseTensors``, the op resolver's versions) and its
kernels' ``Prepare()`` reject, plus the few places where TFLite's own behaviour is undefined or
differs between platforms, which Kiln rejects instead of guessing.

Every check raises through ``err`` (the importer's :class:`TFLiteImportError` factory) with the
tensor or operator index, the field, the value found and the allowed range.
"""
from __future__ import annotations

import math

import numpy as np

from .types import QParams

# scales: finite and within [2^-63, 2^63], so that the float32 product or quotient of any two
# stays a normal float32 (TFLite forms s_in * s_w and s1 * s2 / s_out in float32)
SCALE_MIN, SCALE_MAX = 2.0 ** -63, 2.0 ** 63
ZERO_POINT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
                    "int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 63), (1 << 63) - 1)}
# requantisation multipliers at or above 2^30 need a left shift of 31 or more in TFLite's
# MultiplyByQuantizedMultiplier: undefined behaviour in its C++ (x86 and Arm give other results)
MULTIPLIER_MAX = 2.0 ** 30
INT16_MAX = 32767          # TFLite's bound on depthwise strides and dilations; Kiln's for all windows
# op versions TFLite's reference op resolver (register_ref.cc) implements
VERSIONS = {"CONV_2D": 8, "DEPTHWISE_CONV_2D": 6, "FULLY_CONNECTED": 14, "AVERAGE_POOL_2D": 3, "MAX_POOL_2D": 3,
            "ADD": 5, "MUL": 7, "RESHAPE": 1, "SOFTMAX": 3, "QUANTIZE": 6, "DEQUANTIZE": 9, "PAD": 6, "MEAN": 3,
            "CONCATENATION": 7, "LOGISTIC": 3, "TANH": 3, "RELU": 3, "RELU6": 3}
PAD_MAX_RANK = 5           # reference_ops::PadKernelMaxDimensionCount


def label(t, i):
    return f"tensor {i} ({t['name']!r})"


def check_version(err, opname, index, version):
    hi = VERSIONS.get(opname)
    if hi is not None and not 1 <= version <= hi:
        raise err(f"operator code {index} ({opname}) has version {version}; TFLite's kernels implement "
                  f"versions 1..{hi} (allowed range)")


def quantization(err, where, dtype, shape, scales, zps, axis):
    """QParams of a tensor from its raw scale / zero_point vectors (None: not quantised), after
    TFLite's ParseQuantization rules and Kiln's ranges."""
    ns, nz = len(scales), len(zps)
    if ns == 0:
        return None
    if nz != ns:
        raise err(f"{where}: {ns} scales but {nz} zero points; TFLite needs one zero point per scale")
    if axis < 0 or (shape and axis >= len(shape) and not _axis_unused(shape, ns)):
        raise err(f"{where}: quantized_dimension = {axis} is out of range: allowed 0..{max(len(shape) - 1, 0)} "
                  f"for shape {list(shape)}")
    if shape and axis >= len(shape):
        axis = 0                    # TFLM's reading of a rank-1 tensor's stray axis (see _axis_unused)
    if ns != 1 and shape and shape[axis] != ns:
        raise err(f"{where}: {ns} per-channel scales on quantized_dimension {axis} of shape {list(shape)}; "
                  f"need 1 or {shape[axis]}")
    for k, s in enumerate(scales):
        s = float(s)
        if not (math.isfinite(s) and SCALE_MIN <= s <= SCALE_MAX):
            raise err(f"{where}: scale[{k}] = {s!r} is out of range: allowed finite values in "
                      f"[2^-63, 2^63] ({SCALE_MIN:.3g} .. {SCALE_MAX:.3g})")
    lo, hi = ZERO_POINT_RANGE.get(dtype, ZERO_POINT_RANGE["int64"])
    for k, z in enumerate(zps):
        if not lo <= int(z) <= hi:
            raise err(f"{where}: zero_point[{k}] = {int(z)} is out of range for {dtype}: allowed {lo}..{hi}")
    if dtype in ("float32", "float16", "float64"):
        return None            # TFLite's float kernels ignore quantisation parameters
    if ns > 1:
        return QParams(tuple(float(s) for s in np.asarray(scales, np.float32)), tuple(int(z) for z in zps), axis)
    return QParams((float(np.float32(scales[0])),), (int(zps[0]),), None)


def _axis_unused(shape, ns):
    """Whether a quantized_dimension beyond the rank carries no information: one scale (per tensor),
    or a rank-1 tensor with one scale per element (its only axis). TOCO wrote quantized_dimension 3
    on per-channel conv biases (TFLite Micro's person_detect.tflite); TFLite Micro's loader does
    not check the field and its kernels never read a bias's quantisation, so it runs such files,
    while LiteRT's ParseQuantization refuses them. Kiln follows TFLite Micro here."""
    return ns == 1 or (len(shape) == 1 and shape[0] == ns)


def multiplier(err, where, real, what):
    """A requantisation multiplier TFLite computes in Prepare(): finite and below 2^30."""
    if not (math.isfinite(real) and real < MULTIPLIER_MAX):
        raise err(f"{where}: requantisation multiplier {what} = {real:.6g} is out of range: allowed below 2^30 "
                  f"({MULTIPLIER_MAX:.4g}); TFLite's fixed-point kernels overflow above it (C++ undefined "
                  f"behaviour: results differ between platforms). Check the tensors' scales")


def activation_range(err, where, act, scale):
    """TFLite's CalculateActivationRangeQuantized: round(f / scale) must fit int32 for the fused
    activation's bounds (0 and 6 for RELU6)."""
    if act == "relu6":
        v = np.float32(6.0) / np.float32(scale)
        if not float(v) < 2.0 ** 31 - 256:
            raise err(f"{where}: RELU6 bound 6 / output scale {scale:.6g} = {float(v):.4g} does not fit int32; "
                      f"allowed output scale above {6.0 / (2.0 ** 31 - 256):.3g}")


def f32(x):
    return float(np.float32(x))


def per_tensor(err, where, q, what):
    if q is None:
        raise err(f"{where}: {what} has no quantisation parameters (scale and zero point); an int8 tensor needs them")
    if len(q.scale) != 1:
        raise err(f"{where}: {what} must be quantised per tensor (1 scale), got {len(q.scale)} scales")
    return f32(q.scale[0]), int(q.zero_point[0])


def same_quant(err, where, qa, qb, what):
    """TFLite copies raw int8 bytes (RESHAPE, PAD, pooling, CONCATENATION): input and output must
    share scale and zero point (TFLite ignores the output's; Kiln refuses the ambiguity)."""
    if qa is None or qb is None or qa.scale != qb.scale or qa.zero_point != qb.zero_point:
        raise err(f"{where}: {what} scale/zero point {_qs(qa)} differ from the output's {_qs(qb)}; TFLite's int8 "
                  f"kernel copies the raw values, so they must be equal")


def _qs(q):
    return "none" if q is None else f"({q.scale[0]:.6g}, {q.zero_point[0]})"


def conv_quant(err, where, xq, wq, bq, oq, w_shape, out_channels, act, w_axis_ok):
    """int8 CONV_2D / DEPTHWISE_CONV_2D / per-channel FULLY_CONNECTED Prepare: filter quantisation,
    symmetric filters, bias zero point, per-channel count, multipliers, activation range."""
    s_in, _ = per_tensor(err, where, xq, "the input")
    s_out, _ = per_tensor(err, where, oq, "the output")
    if wq is None:
        raise err(f"{where}: the int8 filter has no quantisation parameters; TFLite needs a scale per tensor or "
                  f"per output channel")
    if len(wq.scale) not in (1, out_channels):
        raise err(f"{where}: the filter has {len(wq.scale)} scales; allowed 1 or {out_channels} (output channels)")
    if len(wq.scale) > 1 and not w_axis_ok(wq.axis):
        raise err(f"{where}: per-channel filter scales on quantized_dimension {wq.axis} of {list(w_shape)}; "
                  f"they must run over the output channels")
    bad = [z for z in wq.zero_point if z != 0]
    if bad:
        raise err(f"{where}: filter zero_point {bad[0]} is out of range: allowed 0 (TFLite's int8 kernels need "
                  f"symmetric filters)")
    if bq is not None and bq.zero_point[0] != 0:
        raise err(f"{where}: bias zero_point {bq.zero_point[0]} is out of range: allowed 0")
    for c, s_w in enumerate(wq.scale):
        multiplier(err, where, s_in * f32(s_w) / s_out, f"input scale * filter scale[{c}] / output scale")
    activation_range(err, where, act, s_out)


def fc_per_tensor(err, where, xq, wq, has_bias, bq, oq, act):
    """Per-tensor int8 FULLY_CONNECTED Prepare (GetQuantizedConvolutionMultipler): the bias scale
    (0 when the bias has none) must match input scale * filter scale within 2% of the output scale."""
    s_in, _ = per_tensor(err, where, xq, "the input")
    s_out, _ = per_tensor(err, where, oq, "the output")
    s_w, _ = per_tensor(err, where, wq, "the filter")
    product = float(np.float32(np.float32(s_in) * np.float32(s_w)))
    if has_bias:
        s_b = f32(bq.scale[0]) if bq is not None else 0.0
        diff = abs(s_in * s_w - s_b) / s_out
        if not diff <= 0.02:
            raise err(f"{where}: bias scale {s_b:.6g} differs from input scale * filter scale "
                      f"{s_in * s_w:.6g} by {diff:.3g} output scales; allowed at most 0.02")
    multiplier(err, where, product / s_out, "input scale * filter scale / output scale")
    activation_range(err, where, act, s_out)


def add_quant(err, where, q1, q2, qo, act):
    """int8 ADD Prepare: QuantizeMultiplierSmallerThanOneExp aborts unless every multiplier is < 1."""
    s1, _ = per_tensor(err, where, q1, "input 0")
    s2, _ = per_tensor(err, where, q2, "input 1")
    so, _ = per_tensor(err, where, qo, "the output")
    twice_max = 2.0 * max(s1, s2)
    real_out = twice_max / ((1 << 20) * so)
    if not real_out < 1.0:
        raise err(f"{where}: output multiplier 2 * max(input scales) / (2^20 * output scale) = {real_out:.6g} is out "
                  f"of range: allowed below 1 (TFLite aborts); the output scale must exceed {twice_max / (1 << 20):.6g}")
    activation_range(err, where, act, so)


def mul_quant(err, where, q1, q2, qo, act):
    s1, _ = per_tensor(err, where, q1, "input 0")
    s2, _ = per_tensor(err, where, q2, "input 1")
    so, _ = per_tensor(err, where, qo, "the output")
    with np.errstate(all="ignore"):
        real = float(np.float32(np.float32(s1) * np.float32(s2)) / np.float32(so))
    multiplier(err, where, real, "input scale 0 * input scale 1 / output scale")
    activation_range(err, where, act, so)


def ratio_quant(err, where, qi, qo, what="input scale / output scale"):
    """RELU, RELU6, MEAN, QUANTIZE (int8 -> int8): one multiplier s_in / s_out."""
    si, _ = per_tensor(err, where, qi, "the input")
    so, _ = per_tensor(err, where, qo, "the output")
    multiplier(err, where, si / so, what)
    return si, so


def softmax_quant(err, where, qi, qo):
    """int8 SOFTMAX Prepare: output zero point -128, scale 1/256 (within 0.1%); TFLite aborts
    unless input scale * 2^26 > 1 (QuantizeMultiplierGreaterThanOne)."""
    si, _ = per_tensor(err, where, qi, "the input")
    so, zo = per_tensor(err, where, qo, "the output")
    if zo != -128:
        raise err(f"{where}: output zero_point {zo} is out of range: allowed -128 (TFLite's int8 softmax)")
    if abs(so - 1.0 / 256) > 0.001 / 256:
        raise err(f"{where}: output scale {so!r} is out of range: allowed 1/256 within 0.1%")
    if not si * float(1 << 26) > 1.0:
        raise err(f"{where}: input scale {si:.6g} is out of range: allowed above 2^-26 ({2.0 ** -26:.3g}); TFLite's "
                  f"softmax needs input scale * 2^26 > 1")


def logistic_quant(err, where, qi, qo):
    per_tensor(err, where, qi, "the input")
    so, _ = per_tensor(err, where, qo, "the output")
    if so != 1.0 / 256:
        raise err(f"{where}: output scale {so!r} is out of range: allowed exactly 1/256 (TFLite's int8 LOGISTIC)")


def window(err, where, name, value, lo=1, hi=INT16_MAX):
    if not lo <= int(value) <= hi:
        raise err(f"{where}: {name} = {int(value)} is out of range: allowed {lo}..{hi}")
    return int(value)


def reshape_shape(err, where, in_shape, new_shape):
    """TFLite's ResolveOutputShape: at most one -1, other dims >= 0, element counts equal."""
    new = [int(v) for v in new_shape]
    if sum(1 for v in new if v == -1) > 1 or any(v < -1 for v in new):
        raise err(f"{where}: new shape {new} is out of range: allowed dims >= 0 and at most one -1")
    n_in = math.prod(in_shape)
    known = math.prod(v for v in new if v != -1)
    if -1 in new:
        if known == 0:
            fill = 0
        elif n_in % known:
            raise err(f"{where}: new shape {new} does not divide the input's {n_in} elements")
        else:
            fill = n_in // known
        new = [fill if v == -1 else v for v in new]
    if math.prod(new) != n_in:
        raise err(f"{where}: new shape {new} holds {math.prod(new)} elements, the input {list(in_shape)} {n_in}")
    return new
