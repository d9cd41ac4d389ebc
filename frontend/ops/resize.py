"""``resize``: nearest-neighbour and bilinear resizing of NHWC images, TFLite's
RESIZE_NEAREST_NEIGHBOR and RESIZE_BILINEAR (align_corners, half_pixel_centers).

Source positions follow TFLite's reference kernels (reference_ops::ResizeNearestNeighbor and
ResizeBilinear): the float scale ``in / out`` (``(in - 1) / (out - 1)`` with align_corners) in
float32, nearest ``min(floor((o + offset) * scale), in - 1)`` (``round`` with align_corners),
bilinear from ``(o + 0.5) * scale - 0.5`` (half-pixel centres) or ``o * scale``. int8 nearest
copies raw values; int8 bilinear is ResizeBilinearInteger: 10-bit fixed-point positions, the
four products summed in int64 and divided by 2^20 rounding half away from zero. Both keep the
input's quantisation.
"""
from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import tflite_checks as chk
from ..errors import ShapeError
from ..registry import QUANTIZABLE, SAME_AS_INPUT, SHAPE, Attr, defrule, register
from . import tflite_util as tfl
from ._util import tt
from .int8util import need_int8, same_quant, trunc_div

_ATTRS = {"size": Attr("ints", ()), "mode": Attr("str", "nearest", ("nearest", "bilinear")),
          "align_corners": Attr("bool", False), "half_pixel_centers": Attr("bool", False)}
chk.VERSIONS.update({"RESIZE_NEAREST_NEIGHBOR": 4, "RESIZE_BILINEAR": 4})


def _check(t, a, name="resize"):
    if len(t.shape) != 4:
        raise ShapeError(f"{name}: input must be NHWC (rank 4), got {t}")
    if len(a["size"]) != 2 or any(s <= 0 for s in a["size"]):
        raise ShapeError(f"{name}: size must be [height, width] > 0, got {a['size']}")
    if a["align_corners"] and a["half_pixel_centers"]:
        raise ShapeError(f"{name}: align_corners and half_pixel_centers cannot both be set (TFLite)")


def _infer(ts, a):
    _check(ts[0], a)
    n, _, _, c = ts[0].shape
    return tt((n, a["size"][0], a["size"][1], c), ts[0].dtype, ts[0].quant)


def _scale(n_in, n_out, align):
    if align and n_out > 1:
        return np.float32(n_in - 1) / np.float32(n_out - 1)
    return np.float32(n_in) / np.float32(n_out)


def nearest_index(n_in, n_out, align, half):
    """TFLite's GetNearestNeighbor for every output position (float32 arithmetic)."""
    s = _scale(n_in, n_out, align)
    v = (np.arange(n_out, dtype=np.float32) + np.float32(0.5 if half else 0.0)) * s
    fl = np.floor(v)
    idx = fl + (v - fl >= np.float32(0.5)) if align else fl     # TfLiteRound: half away from zero (v >= 0)
    idx = np.minimum(idx.astype(np.int64), n_in - 1)
    return np.maximum(idx, 0) if half else idx


def bilinear_float(n_in, n_out, align, half):
    """(source position, lower index, upper index) per output position, float32 as TFLite."""
    s = _scale(n_in, n_out, align)
    o = np.arange(n_out, dtype=np.float32)
    v = ((o + np.float32(0.5)) * s - np.float32(0.5)) if half else o * s
    v = v.astype(np.float32)
    lo = np.maximum(np.floor(v).astype(np.int64), 0)
    hi = np.minimum(np.ceil(v).astype(np.int64), n_in - 1)
    return v, lo, hi


def bilinear_int(n_in, n_out, align, half):
    """ResizeBilinearInteger's (10-bit position, lower index, upper index) per output position."""
    if align and n_out > 1:
        s10 = ((1 << 10) * (n_in - 1) + (n_out - 1) // 2) // (n_out - 1)
    else:
        s10 = ((1 << 10) * n_in + n_out // 2) // n_out
    o = np.arange(n_out, dtype=np.int64)
    v = o * s10 + (s10 // 2 - (1 << 9) if half else 0)
    lo = np.maximum(trunc_div(v, 1 << 10), 0)
    hi = np.minimum(trunc_div(v + (1 << 10) - 1, 1 << 10), n_in - 1)
    return v, lo, hi


def _ref(xs, a):
    x = xs[0]
    _, H, W, _ = x.shape
    oh, ow = a["size"]
    ac, hp = a["align_corners"], a["half_pixel_centers"]
    if a["mode"] == "nearest":
        return x[:, nearest_index(H, oh, ac, hp)][:, :, nearest_index(W, ow, ac, hp)].copy()
    vy, y0, y1 = bilinear_float(H, oh, ac, hp)
    vx, x0, x1 = bilinear_float(W, ow, ac, hp)
    dt = np.float64 if x.dtype == np.float64 else np.float32      # positions in float32 as TFLite
    one = dt(1)
    dy = (vy - y0.astype(np.float32)).astype(dt)[None, :, None, None]
    dx = (vx - x0.astype(np.float32)).astype(dt)[None, None, :, None]
    x = x.astype(dt)

    def at(yi, xi):
        return x[:, yi][:, :, xi]
    y = (at(y0, x0) * (one - dy) * (one - dx) + at(y1, x0) * dy * (one - dx) + at(y0, x1) * (one - dy) * dx
         + at(y1, x1) * dy * dx)
    return y.astype(xs[0].dtype)


def resize_matrix(n_in, n_out, mode, align, half):
    """The (n_out, n_in) matrix of one axis' resize (the op is linear: y = Ah x Aw^T per channel)."""
    m = np.zeros((n_out, n_in), np.float64)
    r = np.arange(n_out)
    if mode == "nearest":
        m[r, nearest_index(n_in, n_out, align, half)] = 1.0
        return m
    v, lo, hi = bilinear_float(n_in, n_out, align, half)
    d = v.astype(np.float64) - lo
    np.add.at(m, (r, lo), 1.0 - d)
    np.add.at(m, (r, hi), d)
    return m


def _vjp(n, xs, y, gy):
    return [F.emit("resize_grad", [gy], in_size=list(xs[0].shape[1:3]), **n.attrs)]


register("resize", attrs=_ATTRS, infer=_infer, ref=_ref, vjp=_vjp, props={SHAPE, QUANTIZABLE}, arity=1,
         doc="NHWC resize to size=[h, w]: mode 'nearest' or 'bilinear' (TFLite RESIZE_*; align_corners, "
             "half_pixel_centers)", quant=SAME_AS_INPUT)


def _grad_ref(xs, a):
    g = xs[0].astype(np.float64)
    ah = resize_matrix(a["in_size"][0], a["size"][0], a["mode"], a["align_corners"], a["half_pixel_centers"])
    aw = resize_matrix(a["in_size"][1], a["size"][1], a["mode"], a["align_corners"], a["half_pixel_centers"])
    return np.einsum("oh,bopc,pw->bhwc", ah, g, aw).astype(xs[0].dtype)


register("resize_grad", attrs=dict(_ATTRS, in_size=Attr("ints", ())),
         infer=lambda ts, a: tt((ts[0].shape[0], *a["in_size"], ts[0].shape[3]), ts[0].dtype), ref=_grad_ref,
         vjp=lambda n, xs, y, gy: [F.emit("resize", [gy], **{k: v for k, v in n.attrs.items() if k != "in_size"})],
         arity=1, doc="gradient of resize with respect to its input (the transpose of the linear map)")


# ---- float TE (int8 nearest uses it too: it only moves values) ---------------------------------
def _te_scale(T, n_in, n_out, align):
    return T.c(float(_scale(n_in, n_out, align)), "float32")


def _te_nearest(T, o, n_in, n_out, align, half):
    v = (T.cast(o, "float32") + T.c(0.5 if half else 0.0, "float32")) * _te_scale(T, n_in, n_out, align)
    fl = T.tirx.floor(v)
    i = T.cast(fl, "int32")
    if align:      # TfLiteRound (half away from zero; v >= 0): v - floor(v) is exact in float32
        i = i + T.cast(v - fl >= T.c(0.5, "float32"), "int32")
    i = T.te.min(i, T.c(n_in - 1, "int32"))
    return T.te.max(i, T.c(0, "int32")) if half else i


def _te_bilinear(T, o, n_in, n_out, align, half):
    f32 = "float32"
    v = T.cast(o, f32) * _te_scale(T, n_in, n_out, align)
    if half:
        v = (T.cast(o, f32) + T.c(0.5, f32)) * _te_scale(T, n_in, n_out, align) - T.c(0.5, f32)
    lo = T.te.max(T.cast(T.tirx.floor(v), "int32"), T.c(0, "int32"))
    hi = T.te.min(T.cast(T.tirx.ceil(v), "int32"), T.c(n_in - 1, "int32"))
    return v, lo, hi


@defrule("resize", "te")
def _resize_te(T, xs, a, out):
    x = xs[0]
    _, H, W, _ = T.shape(x)
    oh, ow = a["size"]
    ac, hp = a["align_corners"], a["half_pixel_centers"]
    if a["mode"] == "nearest":
        return T.te.compute(out.shape, lambda b, i, j, c: x(b, _te_nearest(T, i, H, oh, ac, hp),
                                                            _te_nearest(T, j, W, ow, ac, hp), c), name="resize")
    f32 = "float32"
    one = T.c(1.0, f32)

    def f(b, i, j, c):
        vy, y0, y1 = _te_bilinear(T, i, H, oh, ac, hp)
        vx, x0, x1 = _te_bilinear(T, j, W, ow, ac, hp)
        dy, dx = vy - T.cast(y0, f32), vx - T.cast(x0, f32)

        def at(yy, xx):
            return T.cast(x(b, yy, xx, c), f32)
        v = (at(y0, x0) * (one - dy) * (one - dx) + at(y1, x0) * dy * (one - dx) + at(y0, x1) * (one - dy) * dx
             + at(y1, x1) * dy * dx)
        return T.cast(v, out.dtype)
    return T.te.compute(out.shape, f, name="resize")


@defrule("resize_grad", "te")
def _resize_grad_te(T, xs, a, out):
    g = xs[0]
    _, OH, OW, _ = T.shape(g)
    H, W = a["in_size"]
    ac, hp, mode = a["align_corners"], a["half_pixel_centers"], a["mode"]
    ro, rp = T.te.reduce_axis((0, OH), "ro"), T.te.reduce_axis((0, OW), "rp")
    f32 = "float32"

    def weight(o, h, n_in, n_out):
        if mode == "nearest":
            return T.tirx.Select(_te_nearest(T, o, n_in, n_out, ac, hp) == h, T.c(1.0, f32), T.c(0.0, f32))
        v, lo, hi = _te_bilinear(T, o, n_in, n_out, ac, hp)
        d = v - T.cast(lo, f32)
        return (T.tirx.Select(lo == h, T.c(1.0, f32) - d, T.c(0.0, f32))
                + T.tirx.Select(hi == h, d, T.c(0.0, f32)))
    return T.te.compute(out.shape, lambda b, h, w, c: T.cast(T.te.sum(
        T.cast(g(b, ro, rp, c), f32) * weight(ro.var, h, H, OH) * weight(rp.var, w, W, OW), axis=[ro, rp]), out.dtype),
        name="resize_grad")


# ---- int8 -------------------------------------------------------------------------------------
@defrule("resize", "int8_ref")
def resize_int8(xs, attrs, in_types, out_type):
    need_int8(in_types[0], "input", "resize")
    same_quant(in_types[0], out_type, "resize")
    if attrs["mode"] == "nearest":
        return _ref(xs, attrs)
    x = xs[0].astype(np.int64)
    _, H, W, _ = x.shape
    oh, ow = attrs["size"]
    ac, hp = attrs["align_corners"], attrs["half_pixel_centers"]
    vy, y0, y1 = bilinear_int(H, oh, ac, hp)
    vx, x0, x1 = bilinear_int(W, ow, ac, hp)
    one = 1 << 10
    fy = (vy - one * y0)[None, :, None, None]
    fx = (vx - one * x0)[None, None, :, None]

    def at(yi, xi):
        return x[:, yi][:, :, xi]
    s = (at(y0, x0) * (one - fy) * (one - fx) + at(y1, x0) * fy * (one - fx) + at(y0, x1) * (one - fy) * fx
         + at(y1, x1) * fy * fx)
    r = np.where(s > 0, 1 << 19, -(1 << 19))
    return trunc_div(s + r, 1 << 20).astype(np.int8)


# ---- TFLite import / export -------------------------------------------------------------------
_BUILTIN = {"nearest": ("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions"),
            "bilinear": ("RESIZE_BILINEAR", "ResizeBilinearOptions")}


def _importer(mode):
    name, opts = _BUILTIN[mode]

    def conv(imp, k, op, ins, out):
        w = tfl.where(k, name)
        tfl.need(imp, k, name, ins, 2)
        o = tfl.options(imp, k, op, name, opts)
        x = imp.operand(ins[0], k, name)
        xt = imp.g.types[x]
        if len(xt.shape) != 4:
            raise imp.err(f"{w}: input {xt} must be rank 4 (NHWC)")
        if imp.tensors[ins[1]]["dtype"] != "int32":
            raise imp.err(f"{w}: size {imp.label(ins[1])} is {imp.tensors[ins[1]]['dtype']}; TFLite needs int32")
        size = [int(v) for v in np.asarray(imp.const(ins[1], k, name, "the output size")).ravel()]
        attrs = {"size": size, "mode": mode, "align_corners": bool(o.AlignCorners()) if o else False,
                 "half_pixel_centers": bool(o.HalfPixelCenters()) if o else False}
        try:
            _check(xt, attrs, w)
        except ShapeError as e:
            raise imp.err(str(e)) from None
        if xt.dtype == "int8":
            chk.same_quant(imp.err, w, xt.quant, imp.tensors[out]["quant"], "the input's")
        tfl.check_work(imp, k, name, imp.tensors[out]["shape"], 4 if mode == "bilinear" else 1)
        imp.values[out] = imp.emit(k, name, "resize", [x], attrs, out)
    return conv


tfl.importer("RESIZE_NEAREST_NEIGHBOR")(_importer("nearest"))
tfl.importer("RESIZE_BILINEAR")(_importer("bilinear"))


@tfl.exporter("resize", versions={"RESIZE_NEAREST_NEIGHBOR": 3, "RESIZE_BILINEAR": 3})
def _tfl_export_resize(e, n, act, out, int8):
    name, opts = _BUILTIN[n.attrs["mode"]]
    size = e.const(out + "/size", np.asarray(n.attrs["size"], np.int32))
    e.op(name, [e.value(n.inputs[0]), size], [e.tensor(out, e.g.types[out])], opts, int8,
         AlignCorners=bool(n.attrs["align_corners"]), HalfPixelCenters=bool(n.attrs["half_pixel_centers"]))
