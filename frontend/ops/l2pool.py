"""``l2_pool2d``: TFLite's L2_POOL_2D (float), NHWC.

``y = sqrt(sum of x**2 over the window's in-image taps / their count)``, then the fused
activation (TFLite's reference ``L2Pool``: padding taps are left out of the sum and the count).
Its gradient is ``avg_pool2d_grad(gy / y) * x`` (the windows' average of squares backwards), an
expression of Kiln primitives; where ``y`` is 0 the gradient is 0.
"""
from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import tflite_checks as chk
from ..registry import defrule, register
from . import tflite_util as tfl
from .nn import ACT, POOL, _padded, _pool_infer, _win, apply_act, pool_geometry, tap_counts

L2 = {**POOL, "activation": ACT}


def _l2_ref(xs, a):
    x = xs[0]
    G = pool_geometry(x.shape, a)
    xp = _padded(x * x, G)
    acc = np.zeros((G["N"], G["oh"], G["ow"], G["C"]), x.dtype)
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            acc += xp[_win(G, kh, kw)]
    return apply_act(np.sqrt(acc / tap_counts(G, x.dtype)), a["activation"]).astype(x.dtype, copy=False)


def _l2_vjp(n, xs, y, gy):
    a = n.attrs
    x = xs[0]
    if a["activation"] == "relu6":
        gy = F.where(F.less(y, 6.0), gy, 0.0)
    pa = {k: a[k] for k in POOL}
    safe = F.where(F.greater(y, 0.0), y, 1.0)
    g = F.where(F.greater(y, 0.0), F.div(gy, safe), 0.0)
    return [F.mul(F.avg_pool2d_grad(g, x.shape, **pa), x)]


def _l2_infer(ts, a):
    return _pool_infer(ts, a)


register("l2_pool2d", attrs=L2, infer=_l2_infer, ref=_l2_ref, vjp=_l2_vjp, arity=1,
         doc="NHWC L2 pooling (TFLite L2_POOL_2D): sqrt of the mean of squares over in-image taps")


@defrule("l2_pool2d", "te")
def _l2_te(T, xs, a, out):
    x = xs[0]
    G = pool_geometry(T.shape(x), a)
    kh = T.te.reduce_axis((0, G["KH"]), "kh")
    kw = T.te.reduce_axis((0, G["KW"]), "kw")
    ad = T.acc_dtype(x.dtype)

    def f(n, oh, ow, c):
        h, wv = oh * G["sh"] + kh - G["pt"], ow * G["sw"] + kw - G["pl"]
        v = T.cast(x[n, h, wv, c], ad)
        return T.te.sum(T.tirx.if_then_else(T.in_bounds(h, wv, G["H"], G["W"]), v * v, T.c(0, ad)), axis=[kh, kw])
    s = T.te.compute(out.shape, f, name="l2_pool_sum")

    def count(o, stride, pad, k, size):
        lo = o * stride - pad
        return T.te.min(lo + k, size) - T.te.max(lo, 0)

    def g(n, oh, ow, c):
        cnt = (count(oh, G["sh"], G["pt"], G["KH"], G["H"]) * count(ow, G["sw"], G["pl"], G["KW"], G["W"])).astype(ad)
        return T.cast(T.act(T.te.sqrt(s[n, oh, ow, c] / cnt), a["activation"]), out.dtype)
    return T.te.compute(out.shape, g, name="l2_pool2d")


@defrule("l2_pool2d", "macs")
def _l2_macs(ts, out, a):
    return int(np.prod(out.shape)) * a["pool"][0] * a["pool"][1]


# ---- TFLite ------------------------------------------------------------------------------------
@tfl.importer("L2_POOL_2D")
def _tfl_l2(imp, k, op, ins, out):
    name = "L2_POOL_2D"
    tfl.need(imp, k, name, ins, 1)
    o = tfl.options(imp, k, op, name, "Pool2DOptions")
    w = tfl.where(k, name)
    if o is None:
        raise imp.err(f"{w} has no Pool2DOptions (TFLite then reads strides of 0 and rejects it)")
    attrs = tfl.window_attrs(imp, k, name, o, dilated=False)
    attrs["pool"] = [chk.window(imp.err, w, "filter_height", o.FilterHeight()),
                     chk.window(imp.err, w, "filter_width", o.FilterWidth())]
    attrs["activation"] = tfl.activation(imp, k, name, o.FusedActivationFunction())
    x = imp.operand(ins[0], k, name)
    if imp.g.types[x].dtype != "float32":
        raise imp.err(f"{w}: input {imp.label(ins[0])} is {imp.g.types[x].dtype}; TFLite's L2_POOL_2D is float32 only")
    tfl.check_work(imp, k, name, imp.tensors[out]["shape"], attrs["pool"][0] * attrs["pool"][1])
    imp.values[out] = imp.emit(k, name, "l2_pool2d", [x], attrs, out)


@tfl.exporter("l2_pool2d")
def _tfl_export_l2(e, n, act, out, int8):
    a = n.attrs
    if int8:
        raise tfl.ExportError(f"node {n.name!r}: TFLite's L2_POOL_2D is float32 only")
    if a["padding"] not in tfl.PAD_CODES:
        raise tfl.ExportError(f"node {n.name!r}: pooling padding must be 'same' or 'valid' for TFLite, got {a['padding']}")
    st = a["stride"] or a["pool"]
    e.op("L2_POOL_2D", [e.value(i) for i in n.inputs], [e.tensor(out, e.g.types[out])], "Pool2DOptions", False,
         Padding=tfl.PAD_CODES[a["padding"]], StrideW=st[1], StrideH=st[0], FilterWidth=a["pool"][1],
         FilterHeight=a["pool"][0], FusedActivationFunction=tfl.ACT_CODES[a["activation"]])
