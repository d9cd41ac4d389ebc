"""``l2_normalize``: ``x / max(sqrt(sum(x^2, last axis)), 1e-6)``, TFLite's L2_NORMALIZATION.

int8 is reference_integer_ops::L2Normalization (TFLite and TFLite Micro): per row the int32 sum
of ``(x - zp)^2``, its inverse square root as a quantised multiplier and shift
(GetInvSqrtQuantizedMultiplierExp: five gemmlowp Newton-Raphson steps in F3 fixed point), then
``MultiplyByQuantizedMultiplier(x - zp, m, shift + 7)`` clamped to int8; the output scale is
1/128 and the zero point 0.
"""
from __future__ import annotations

import numpy as np

from .. import fixedpoint as fp
from .. import functional as F
from .. import tflite_checks as chk
from ..errors import ShapeError
from ..registry import QUANTIZABLE, Quant, defrule, register
from . import tflite_util as tfl
from ._util import need_float
from .int8util import need_int8, per_tensor

EPSILON = 1e-6
OUTPUT_SHIFT = 7                 # the output is in 1/128 units
MAX_DEPTH = 1 << 15              # the int32 sum of squares cannot overflow
INT32_MAX = (1 << 31) - 1
chk.VERSIONS.update({"L2_NORMALIZATION": 2})


def _infer(ts, a):
    t = ts[0]
    if not t.shape:
        raise ShapeError("l2_normalize: the input is a scalar; it normalises along the last axis")
    need_float(t, "l2_normalize")
    return t


def _ref(xs, a):
    dt = np.float64 if xs[0].dtype == np.float64 else np.float32
    x = xs[0].astype(dt)
    n = np.sqrt(np.sum(x * x, axis=-1, keepdims=True, dtype=dt))
    return (x / np.maximum(n, dt(EPSILON))).astype(xs[0].dtype)


def _vjp(n, xs, y, gy):
    x = xs[0]
    nrm = F.maximum(F.sqrt(F.sum(x * x, -1, keepdims=True)), EPSILON)
    s = F.sum(gy * y, -1, keepdims=True)
    return [(gy - y * F.broadcast_to(s, y.shape)) / F.broadcast_to(nrm, y.shape)]


register("l2_normalize", attrs={}, infer=_infer, ref=_ref, vjp=_vjp, props={QUANTIZABLE}, arity=1,
         doc="x / max(||x||, 1e-6) along the last axis (TFLite L2_NORMALIZATION)",
         quant=Quant("fixed", (1.0 / 128, 0)))


@defrule("l2_normalize", "te")
def _l2_te(T, xs, a, out):
    x = xs[0]
    shape = T.shape(x)
    d = len(shape) - 1
    acc = T.acc_dtype(x.dtype)
    r = T.te.reduce_axis((0, shape[-1]), "r")
    ss = T.te.compute(shape[:-1] + (1,), lambda *i: T.te.sum(T.cast(x(*i[:d], r), acc) * T.cast(x(*i[:d], r), acc),
                                                             axis=r), name="l2_sumsq")
    nrm = T.te.compute(ss.shape, lambda *i: T.te.max(T.te.sqrt(ss(*i)), T.c(EPSILON, acc)), name="l2_norm")
    return T.te.compute(shape, lambda *i: T.cast(T.cast(x(*i), acc) / nrm(*i[:d], 0), out.dtype), name="l2_normalize")


def inv_sqrt_multiplier_exp(acc, reverse_shift=-1):
    """GetInvSqrtQuantizedMultiplierExp on an array of int32 sums: (multiplier, shift), the shift
    already times ``reverse_shift`` (a left shift for MultiplyByQuantizedMultiplier)."""
    acc = np.asarray(acc, np.int64)
    small = acc <= 1
    v = np.where(small, 2, acc)
    shift = np.full(v.shape, 11, np.int64)
    big = v >= 1 << 29
    v, shift = np.where(big, v // 4, v), shift + big
    pairs = (fp.count_leading_zeros_u32(v) - 1) // 2 - 1
    shift = shift - pairs
    v = v << (2 * pairs)
    half_in = fp.rounding_divide_by_pot(v >> 1, 1)
    srdhm, srmbpot = fp.saturating_rounding_doubling_high_mul, fp.saturating_rounding_multiply_by_pot
    x = np.full(v.shape, 1 << 28, np.int64)
    for _ in range(5):
        x3 = srmbpot(srdhm(srdhm(x, x), x), 6)
        x = srmbpot(fp.wrap_int32(srdhm((1 << 28) + (1 << 27), x) - srdhm(half_in, x3)), 3)
    x = srdhm(x, 1518500250)
    neg = shift < 0
    x = np.where(neg, x << np.where(neg, -shift, 0), x)
    shift = np.where(neg, 0, shift) * reverse_shift
    return np.where(small, INT32_MAX, x), np.where(small, 0, shift)


def _check_out(out_type, op="l2_normalize"):
    so, zo = per_tensor(out_type, "output", op)
    if zo != 0 or abs(so - 1.0 / 128) > 1e-9:
        raise ShapeError(f"{op}: TFLite's int8 L2_NORMALIZATION needs output scale 1/128 and zero point 0, "
                         f"got {out_type}")


@defrule("l2_normalize", "int8_ref")
def l2_normalize_int8(xs, attrs, in_types, out_type):
    need_int8(in_types[0], "input", "l2_normalize")
    _, zi = per_tensor(in_types[0], "input", "l2_normalize")
    _check_out(out_type)
    x = xs[0].astype(np.int64) - zi
    acc = fp.wrap_int32(np.sum(x * x, axis=-1, keepdims=True))
    m, s = inv_sqrt_multiplier_exp(acc)
    y = fp.multiply_by_quantized_multiplier(x, np.broadcast_to(m, x.shape), np.broadcast_to(s + OUTPUT_SHIFT, x.shape))
    return np.clip(y, -128, 127).astype(np.int8)


@tfl.importer("L2_NORMALIZATION")
def _tfl_l2_normalization(imp, k, op, ins, out):
    name = "L2_NORMALIZATION"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 1)
    o = tfl.options(imp, k, op, name, "L2NormOptions")
    if o is not None and int(o.FusedActivationFunction()) != 0:
        raise imp.err(f"{w}: fused_activation_function is out of range: allowed NONE")
    x = imp.operand(ins[0], k, name)
    xt = imp.g.types[x]
    if not xt.shape or xt.shape[-1] > MAX_DEPTH:
        raise imp.err(f"{w}: input {xt} needs rank >= 1 and a last axis of at most {MAX_DEPTH}")
    if xt.dtype == "int8":
        chk.per_tensor(imp.err, w, xt.quant, "the input")
        oq = imp.tensors[out]["quant"]
        sc, zp = chk.per_tensor(imp.err, w, oq, "the output")
        if zp != 0 or sc != chk.f32(1.0 / 128):
            raise imp.err(f"{w}: output scale {sc} zero point {zp} are out of range: TFLite's int8 kernel needs "
                          f"1/128 and 0")
    imp.values[out] = imp.emit(k, name, "l2_normalize", [x], {}, out)


@tfl.exporter("l2_normalize", versions={"L2_NORMALIZATION": 2})
def _tfl_export_l2(e, n, act, out, int8):
    e.op("L2_NORMALIZATION", [e.value(n.inputs[0])], [e.tensor(out, e.g.types[out])], "L2NormOptions", int8,
         FusedActivationFunction=0)
