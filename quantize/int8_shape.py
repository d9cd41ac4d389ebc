"""int8 reference rules for pooling, mean and data movement (TFLite reference kernels):

- ``avg_pool2d``: sum of the raw values of the in-image taps, divided with rounding half away from
  zero: ``(sum +- count/2) / count`` (C division); input and output share scale and zero point.
- ``max_pool2d``, ``reshape``: on the raw int8 values.
- ``mean``: reference_ops::QuantizedMeanOrSum: raw sum, ``1/count`` folded into the multiplier of
  ``in_scale / out_scale``.
- ``pad``: fills with the quantised pad value (the zero point for value 0).
- ``concat``: TFLite int8 requires every input to share the output's scale and zero point.
"""
from __future__ import annotations

import numpy as np

from kiln.frontend.errors import ShapeError
from kiln.frontend.ops.nn import _padded, _win, pool_geometry
from kiln.frontend.ops import norm_axes
from kiln.frontend.registry import defrule, get_op

from . import fixedpoint as fp
from ._qutil import clamp8, f32, int8_io, need_int8, per_tensor, trunc_div


def _same_quant(t_in, t_out, op):
    si, zi = per_tensor(t_in, "input", op)
    so, zo = per_tensor(t_out, "output", op)
    if zi != zo or abs(si - so) > 1e-6:
        raise ShapeError(f"{op}: TFLite's int8 {op} keeps the quantisation: input {t_in} and output "
                         f"{t_out} must share scale and zero point")
    return si, zi


@defrule("avg_pool2d", "int8_ref")
def avg_pool2d_int8(xs, attrs, in_types, out_type):
    need_int8(in_types[0], "input", "avg_pool2d")
    _same_quant(in_types[0], out_type, "avg_pool2d")
    if attrs.get("count_include_pad"):
        raise ShapeError("avg_pool2d: TFLite's int8 average pool divides by the in-image tap count "
                         "(count_include_pad=False)")
    x = xs[0].astype(np.int64)
    G = pool_geometry(x.shape, attrs)
    xp = _padded(x, G)
    ones = _padded(np.ones((1, G["H"], G["W"], 1), np.int64), G)
    acc = np.zeros((G["N"], G["oh"], G["ow"], G["C"]), np.int64)
    cnt = np.zeros((1, G["oh"], G["ow"], 1), np.int64)
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            acc += xp[_win(G, kh, kw)]
            cnt += ones[_win(G, kh, kw)]
    half = cnt // 2
    y = np.where(acc > 0, trunc_div(acc + half, cnt), trunc_div(acc - half, cnt))
    return clamp8(y)


@defrule("max_pool2d", "int8_ref")
def max_pool2d_int8(xs, attrs, in_types, out_type):
    need_int8(in_types[0], "input", "max_pool2d")
    _same_quant(in_types[0], out_type, "max_pool2d")
    return get_op("max_pool2d").ref(xs, attrs)


@defrule("reshape", "int8_ref")
def reshape_int8(xs, attrs, in_types, out_type):
    return get_op("reshape").ref(xs, attrs)


def mean_params(in_scale, out_scale, count):
    """(multiplier, shift) of reference_ops::QuantizedMeanOrSum with 1/count folded in."""
    m, s = fp.quantize_multiplier(f32(in_scale) / f32(out_scale))
    k = int(count).bit_length() - 1
    k = min(k, 32, 31 + s)
    m = int((m << k) // int(count))
    return m, s - k


@defrule("mean", "int8_ref")
def mean_int8(xs, attrs, in_types, out_type):
    (si, zi), (so, zo) = int8_io(in_types, out_type, "mean")
    x = xs[0].astype(np.int64)
    axes = norm_axes(attrs["axes"], x.ndim, "mean")
    count = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    total = fp.wrap_int32(x.sum(axis=axes, keepdims=attrs["keepdims"]))
    if count == 0:
        return np.zeros(out_type.shape, np.int8)
    m, s = mean_params(si, so, count)
    y = fp.multiply_by_quantized_multiplier(fp.wrap_int32(total - zi * count), m, s) + zo
    return clamp8(y)


@defrule("pad", "int8_ref")
def pad_int8(xs, attrs, in_types, out_type):
    need_int8(in_types[0], "input", "pad")
    so, zo = _same_quant(in_types[0], out_type, "pad")
    value = int(np.clip(fp.quantize_value(attrs["value"], so, zo), -128, 127))
    a = dict(attrs, value=float(value))
    return get_op("pad").ref(xs, a)


@defrule("concat", "int8_ref")
def concat_int8(xs, attrs, in_types, out_type):
    for k, t in enumerate(in_types):
        need_int8(t, f"input {k}", "concat")
        _same_quant(t, out_type, "concat")
    return np.concatenate(xs, axis=attrs["axis"])
