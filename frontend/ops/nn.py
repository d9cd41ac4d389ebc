"""Linear and window ops (NHWC): matmul, dense, conv2d (stride, same/valid/explicit padding,
dilation, groups incl. depthwise, fused activation), avg/max pooling, dropout, and the
primitives their VJPs emit (each itself differentiable, so grad-of-grad works).

Layouts: activations NHWC; conv weights OHWI with I = C_in / groups (depthwise: groups = C_in,
weights [C_in * multiplier, KH, KW, 1]); dense weights [N_out, K] (as TFLite and PyTorch).
Max pooling sends the gradient to the first maximum of each window (row-major), as PyTorch does.
Average pooling divides by the number of non-padding elements (TFLite), unless count_include_pad.

The ``te`` rules (float lowerings, ``frontend/ops/te_helpers.py``) follow the NumPy references with the
same geometry helpers (``conv_geometry``, ``pool_geometry``) and the same first-maximum rule.
Padding is inlined into the consumer's expression with ``if_then_else`` (lazy), so a convolution
is one TE stage and schedules see no separate pad block. ``macs`` counts the multiply-accumulates
of conv2d (any groups), dense, matmul and the conv gradients.
"""
import math

import numpy as np

from .. import fixedpoint as fp
from .. import functional as F
from .. import tflite_checks as chk
from ..errors import ShapeError
from ..limits import check as check_limit
from ..registry import (
    INT16,
    LINEAR,
    QUANTIZABLE,
    SAME_AS_INPUT,
    WEIGHTS,
    Attr,
    defrule,
    get_op,
    mark,
    register,
)
from ..types import QParams, TensorType
from . import tflite_util as tfl
from ._util import conv_out_and_pads, same_dtype, tt
from .int8util import (
    channel_params,
    clamp8,
    f32,
    int8_io,
    need_int8,
    same_quant,
    trunc_div,
)
from .int16util import clamp16, int16_io, is_16x8, is_int16, mbqm64, symmetric16

ACT = Attr("str", "none", ("none", "relu", "relu6"))


def apply_act(y, act):
    if act == "relu":
        return np.maximum(y, 0)
    if act == "relu6":
        return np.clip(y, 0, 6)
    return y


def act_grad(gy, y, act):
    if act == "relu":
        return F.where(y > 0.0, gy, 0.0)
    if act == "relu6":
        return F.where(F.logical_and(y > 0.0, y < 6.0), gy, 0.0)
    return gy


# ---- matmul / dense ---------------------------------------------------------------------------
def _matmul_infer(ts, a):
    x, w = ts
    dt = same_dtype(ts, "matmul")
    if x.ndim < 2 or w.ndim < 2:
        raise ShapeError(f"matmul needs rank >= 2 operands, got {x} and {w} (reshape vectors first)")
    if x.shape[-1] != w.shape[-2]:
        raise ShapeError(f"matmul: inner dimensions differ: {x.shape} @ {w.shape}")
    batch = np.broadcast_shapes(x.shape[:-2], w.shape[:-2]) if (x.ndim > 2 or w.ndim > 2) else ()
    return tt(tuple(batch) + (x.shape[-2], w.shape[-1]), dt)


def _matmul_vjp(n, xs, y, gy):
    a, b = xs
    ga = F.matmul(gy, F.swap_last(b))
    gb = F.matmul(F.swap_last(a), gy)
    return [F.unbroadcast(ga, a.shape), F.unbroadcast(gb, b.shape)]


register("matmul", infer=_matmul_infer, ref=lambda xs, a: np.matmul(xs[0], xs[1]), vjp=_matmul_vjp,
         props={LINEAR}, arity=2, doc="NumPy matmul for rank >= 2 (batch dims broadcast)")


@defrule("matmul", "macs")
def _matmul_macs(ts, out, a):
    return math.prod(out.shape) * ts[0].shape[-1]


def _bidx_batch(t, bi, nb):
    tb = len(t.shape) - 2
    lead = nb - tb
    return [0 if int(t.shape[j]) == 1 else bi[lead + j] for j in range(tb)]


@defrule("matmul", "te")
def _matmul_te(T, xs, a, out):
    x, w = xs
    ad = T.acc_dtype(x.dtype)
    shape = out.shape
    nb = len(shape) - 2
    k = T.te.reduce_axis((0, int(x.shape[-1])), "k")

    def f(*i):
        bi = i[:nb]
        xi = _bidx_batch(x, bi, nb) + [i[-2], k]
        wi = _bidx_batch(w, bi, nb) + [k, i[-1]]
        return T.te.sum(T.cast(x(*xi), ad) * T.cast(w(*wi), ad), axis=k)
    return T.to_out(T.te.compute(shape, f, name="matmul"), out, "matmul_cast")


def _dense_infer(ts, a):
    x, w = ts[:2]
    same_dtype(ts[:1] if is_16x8(ts) else ts[:2], "dense")
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ShapeError(f"dense: input {x} does not match weights {w} (expected [N_out, {x.shape[-1] if x.ndim else '?'}])")
    if len(ts) == 3 and ts[2].shape != (w.shape[0],):
        raise ShapeError(f"dense: bias must have shape ({w.shape[0]},), got {ts[2].shape}")
    if len(ts) not in (2, 3):
        raise ShapeError("dense takes (x, w) or (x, w, bias)")
    return tt(x.shape[:-1] + (w.shape[0],), x.dtype)


def _dense_ref(xs, a):
    y = np.matmul(xs[0], xs[1].T)
    if len(xs) == 3:
        y = y + xs[2]
    return apply_act(y, a["activation"]).astype(xs[0].dtype, copy=False)


def _dense_vjp(n, xs, y, gy):
    x, w = xs[:2]
    g = act_grad(gy, y, n.attrs["activation"])
    gx = F.matmul(g, F.broadcast_to(w, w.shape)) if x.ndim >= 2 else None
    if gx is None:
        gx = F.reshape(F.matmul(F.reshape(g, (1, -1)), w), x.shape)
    g2 = F.reshape(g, (-1, w.shape[0]))
    x2 = F.reshape(x, (-1, w.shape[1]))
    gw = F.matmul(F.transpose(g2, [1, 0]), x2)
    out = [gx, gw]
    if len(xs) == 3:
        out.append(F.sum(g2, [0]))
    return out


# how an int8/int16 dense requantises its accumulator: "double" (LiteRT's reference FULLY_CONNECTED,
# the default) or "fixed" (TensorFlow Lite Micro's and CMSIS-NN's fixed-point multiplier, as conv2d);
# see dense_int8 and docs/int8_ir.md. A float dense ignores it.
FC_REQUANT = Attr("str", "double", ("double", "fixed"))


def fixed_requant(attrs) -> bool:
    """Whether a dense with ``attrs`` requantises as TensorFlow Lite Micro does (``requant``
    "fixed": the conv's fixed-point multiplier), not as LiteRT's reference kernel (double)."""
    return attrs.get("requant", "double") == "fixed"

register("dense", attrs={"activation": ACT, "requant": FC_REQUANT}, infer=_dense_infer, ref=_dense_ref, vjp=_dense_vjp,
         props={LINEAR, QUANTIZABLE}, doc="x @ w.T + b, w is [N_out, K]; optional fused activation", quant=WEIGHTS)


@defrule("dense", "macs")
def _dense_macs(ts, out, a):
    return math.prod(out.shape) * ts[1].shape[1]


@defrule("dense", "te")
def _dense_te(T, xs, a, out):
    x, w = xs[:2]
    ad = T.acc_dtype(x.dtype)
    k = T.te.reduce_axis((0, int(w.shape[1])), "k")
    shape = out.shape
    y = T.te.compute(shape, lambda *i: T.te.sum(T.cast(x(*i[:-1], k), ad) * T.cast(w(i[-1], k), ad), axis=k),
                     name="dense")
    b = xs[2] if len(xs) == 3 else None

    def epi(*i):
        v = y(*i)
        if b is not None:
            v = v + T.cast(b(i[-1]), ad)
        return T.cast(T.act(v, a["activation"]), out.dtype)
    if b is None and a["activation"] == "none" and ad == out.dtype:
        return y
    return T.te.compute(shape, epi, name="dense_epilogue")


# ---- convolution ------------------------------------------------------------------------------
CONV = {"stride": Attr("ints", (1, 1)), "padding": Attr("any", "valid"), "dilation": Attr("ints", (1, 1)),
        "groups": Attr("int", 1)}


def conv_geometry(xshape, wshape, a):
    if len(xshape) != 4 or len(wshape) != 4:
        raise ShapeError(f"conv2d needs NHWC input and OHWI weights, got {xshape} and {wshape}")
    N, H, W, C = xshape
    O, KH, KW, I = wshape
    g = a["groups"]
    pad = a["padding"]
    if not (pad in ("same", "valid") or (isinstance(pad, list) and len(pad) == 4)):
        raise ShapeError(f"padding must be 'same', 'valid' or [top, bottom, left, right], got {pad!r}")
    if g < 1 or C != I * g or O % g:
        raise ShapeError(f"conv2d: input channels {C} and weights {wshape} do not match groups={g} "
                         f"(need C_in = I * groups and C_out divisible by groups)")
    (sh, sw), (dh, dw) = a["stride"], a["dilation"]
    if min(sh, sw, dh, dw) < 1:
        raise ShapeError(f"stride and dilation must be >= 1, got {a['stride']}, {a['dilation']}")
    oh, pt, pb = conv_out_and_pads(H, KH, sh, dh, pad, 0)
    ow, pl, pr = conv_out_and_pads(W, KW, sw, dw, pad, 1)
    return dict(N=N, H=H, W=W, C=C, O=O, KH=KH, KW=KW, I=I, g=g, sh=sh, sw=sw, dh=dh, dw=dw,
                oh=oh, ow=ow, pt=pt, pb=pb, pl=pl, pr=pr)


def _win(G, kh, kw):
    """Slices of the padded input seen by kernel tap (kh, kw) for every output position."""
    h0, w0 = kh * G["dh"], kw * G["dw"]
    return (slice(None), slice(h0, h0 + (G["oh"] - 1) * G["sh"] + 1, G["sh"]),
            slice(w0, w0 + (G["ow"] - 1) * G["sw"] + 1, G["sw"]))


def _padded(x, G, value=0.0):
    return np.pad(x, ((0, 0), (G["pt"], G["pb"]), (G["pl"], G["pr"]), (0, 0)), constant_values=value)


def _conv_infer(ts, a):
    if len(ts) not in (2, 3):
        raise ShapeError("conv2d takes (x, w) or (x, w, bias)")
    same_dtype(ts[:1] if is_16x8(ts) else ts[:2], "conv2d")
    G = conv_geometry(ts[0].shape, ts[1].shape, a)
    if len(ts) == 3 and ts[2].shape != (G["O"],):
        raise ShapeError(f"conv2d: bias must have shape ({G['O']},), got {ts[2].shape}")
    return tt((G["N"], G["oh"], G["ow"], G["O"]), ts[0].dtype)


def _taps(G):
    return [(kh, kw) for kh in range(G["KH"]) for kw in range(G["KW"])]


def _fast_kind(G):
    """Which fast path computes this conv exactly like the einsum oracle (to rounding): 'dense'
    (groups = 1: im2col + one matmul), 'depthwise' (one input and one output channel per group:
    a multiply-accumulate per tap) or None (other grouped convs: the oracle itself)."""
    if G["g"] == 1:
        return "dense"
    if G["I"] == 1 and G["O"] == G["g"]:
        return "depthwise"
    return None


def _im2col(xp, G):
    """[N, oh, ow, KH*KW*C] patches of the padded input: taps in (kh, kw) order, channels last,
    matching OHWI weights reshaped to [O, KH*KW*I]."""
    return np.concatenate([xp[_win(G, kh, kw)] for kh, kw in _taps(G)], axis=-1)


def conv2d_nobias(x, w, a):
    """The float reference used by the executor: fast paths for groups = 1 and depthwise (BLAS
    matmul / per-tap multiply-accumulate), the per-tap einsum oracle otherwise. Tests check the
    fast paths against :func:`conv2d_nobias_einsum`."""
    G = conv_geometry(x.shape, w.shape, a)
    kind = _fast_kind(G)
    if kind is None:
        return conv2d_nobias_einsum(x, w, a)
    xp = _padded(x, G)
    dt = np.result_type(x, w)
    if kind == "dense":
        cols = _im2col(xp, G)
        y = np.matmul(cols.reshape(-1, cols.shape[-1]), w.reshape(G["O"], -1).T)
        return y.reshape(G["N"], G["oh"], G["ow"], G["O"]).astype(dt, copy=False)
    acc = np.zeros((G["N"], G["oh"], G["ow"], G["O"]), dt)
    for kh, kw in _taps(G):
        acc += xp[_win(G, kh, kw)] * w[:, kh, kw, 0]
    return acc


def conv2d_nobias_einsum(x, w, a):
    """The oracle: one einsum per kernel tap, any groups."""
    G = conv_geometry(x.shape, w.shape, a)
    g, I, Og = G["g"], G["I"], G["O"] // G["g"]
    xp = _padded(x, G)
    xp = xp.reshape(xp.shape[:3] + (g, I))
    wg = w.reshape(g, Og, G["KH"], G["KW"], I)
    acc = np.zeros((G["N"], G["oh"], G["ow"], g, Og), np.result_type(x, w))
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            acc += np.einsum("nhwgi,goi->nhwgo", xp[_win(G, kh, kw)], wg[:, :, kh, kw, :])
    return acc.reshape(G["N"], G["oh"], G["ow"], G["O"])


def _conv_ref(xs, a):
    y = conv2d_nobias(xs[0], xs[1], a)
    if len(xs) == 3:
        y = y + xs[2]
    return apply_act(y, a["activation"]).astype(xs[0].dtype, copy=False)


def _conv_attrs(a):
    return {k: a[k] for k in CONV}


def _conv_vjp(n, xs, y, gy):
    x, w = xs[:2]
    g = act_grad(gy, y, n.attrs["activation"])
    ca = _conv_attrs(n.attrs)
    out = [F.conv2d_grad_input(g, w, x.shape, **ca), F.conv2d_grad_weight(x, g, w.shape, **ca)]
    if len(xs) == 3:
        out.append(F.sum(g, [0, 1, 2]))
    return out


register("conv2d", attrs={**CONV, "activation": ACT}, infer=_conv_infer, ref=_conv_ref, vjp=_conv_vjp,
         props={LINEAR, QUANTIZABLE},
         doc="NHWC x OHWI conv (+bias, +fused activation); depthwise is groups = C_in", quant=WEIGHTS)


def conv_macs(out_shape, wshape):
    """MACs of a conv (or of either conv gradient) with output ``out_shape`` and OHWI weights
    ``wshape``: every output element reduces KH * KW * (C_in / groups) products."""
    return math.prod(out_shape) * wshape[1] * wshape[2] * wshape[3]


@defrule("conv2d", "macs")
def _conv_macs(ts, out, a):
    return conv_macs(out.shape, ts[1].shape)


@defrule("conv2d", "te")
def _conv_te(T, xs, a, out):
    x, w = xs[:2]
    G = conv_geometry(T.shape(x), T.shape(w), a)
    I, Og = G["I"], G["O"] // G["g"]
    ad = T.acc_dtype(x.dtype)
    kh = T.te.reduce_axis((0, G["KH"]), "kh")
    kw = T.te.reduce_axis((0, G["KW"]), "kw")
    ri = T.te.reduce_axis((0, I), "ri") if I > 1 else None

    def f(n, oh, ow, o):
        h = oh * G["sh"] + kh * G["dh"] - G["pt"]
        wv = ow * G["sw"] + kw * G["dw"] - G["pl"]
        i = ri if ri is not None else 0
        c = (o // Og) * I + i if G["g"] > 1 else i
        xv = T.tirx.if_then_else(T.in_bounds(h, wv, G["H"], G["W"]), T.cast(x[n, h, wv, c], ad), T.c(0, ad))
        axes = [kh, kw] + ([ri] if ri is not None else [])
        return T.te.sum(xv * T.cast(w[o, kh, kw, i], ad), axis=axes)
    y = T.te.compute(out.shape, f, name="conv2d")
    b = xs[2] if len(xs) == 3 else None
    if b is None and a["activation"] == "none" and ad == out.dtype:
        return y

    def epi(n, oh, ow, o):
        v = y[n, oh, ow, o]
        if b is not None:
            v = v + T.cast(b[o], ad)
        return T.cast(T.act(v, a["activation"]), out.dtype)
    return T.te.compute(out.shape, epi, name="conv2d_epilogue")


def _cgi_infer(ts, a):
    gy, w = ts
    same_dtype(ts, "conv2d_grad_input")
    G = conv_geometry(tuple(a["input_shape"]), w.shape, a)
    if gy.shape != (G["N"], G["oh"], G["ow"], G["O"]):
        raise ShapeError(f"conv2d_grad_input: gradient {gy.shape} does not match the conv output")
    return tt(a["input_shape"], gy.dtype)


def conv2d_grad_input_ref(gy, w, a):
    """Fast paths as in :func:`conv2d_nobias`; oracle: :func:`conv2d_grad_input_einsum`."""
    G = conv_geometry(tuple(a["input_shape"]), w.shape, a)
    kind = _fast_kind(G)
    if kind is None:
        return conv2d_grad_input_einsum(gy, w, a)
    C = G["C"]
    gxp = np.zeros((G["N"], G["H"] + G["pt"] + G["pb"], G["W"] + G["pl"] + G["pr"], C), np.result_type(gy, w))
    if kind == "dense":
        gcols = np.matmul(gy.reshape(-1, G["O"]), w.reshape(G["O"], -1))
        gcols = gcols.reshape(G["N"], G["oh"], G["ow"], -1)
        for t, (kh, kw) in enumerate(_taps(G)):
            gxp[_win(G, kh, kw)] += gcols[..., t * C:(t + 1) * C]
    else:
        for kh, kw in _taps(G):
            gxp[_win(G, kh, kw)] += gy * w[:, kh, kw, 0]
    gx = gxp[:, G["pt"]:G["pt"] + G["H"], G["pl"]:G["pl"] + G["W"]]
    return gx.reshape(a["input_shape"]).astype(gy.dtype, copy=False)


def conv2d_grad_input_einsum(gy, w, a):
    G = conv_geometry(tuple(a["input_shape"]), w.shape, a)
    g, I, Og = G["g"], G["I"], G["O"] // G["g"]
    gyg = gy.reshape(G["N"], G["oh"], G["ow"], g, Og)
    wg = w.reshape(g, Og, G["KH"], G["KW"], I)
    gxp = np.zeros((G["N"], G["H"] + G["pt"] + G["pb"], G["W"] + G["pl"] + G["pr"], g, I), np.result_type(gy, w))
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            gxp[_win(G, kh, kw)] += np.einsum("nhwgo,goi->nhwgi", gyg, wg[:, :, kh, kw, :])
    gx = gxp[:, G["pt"]:G["pt"] + G["H"], G["pl"]:G["pl"] + G["W"]]
    return gx.reshape(a["input_shape"]).astype(gy.dtype, copy=False)


def _cgw_infer(ts, a):
    x, gy = ts
    same_dtype(ts, "conv2d_grad_weight")
    G = conv_geometry(x.shape, tuple(a["weight_shape"]), a)
    if gy.shape != (G["N"], G["oh"], G["ow"], G["O"]):
        raise ShapeError(f"conv2d_grad_weight: gradient {gy.shape} does not match the conv output")
    return tt(a["weight_shape"], x.dtype)


def conv2d_grad_weight_ref(x, gy, a):
    """Fast paths as in :func:`conv2d_nobias`; oracle: :func:`conv2d_grad_weight_einsum`."""
    G = conv_geometry(x.shape, tuple(a["weight_shape"]), a)
    kind = _fast_kind(G)
    if kind is None:
        return conv2d_grad_weight_einsum(x, gy, a)
    xp = _padded(x, G)
    if kind == "dense":
        cols = _im2col(xp, G)
        gw = np.matmul(gy.reshape(-1, G["O"]).T, cols.reshape(-1, cols.shape[-1]))
    else:
        gw = np.zeros((G["O"], G["KH"], G["KW"], 1), np.result_type(x, gy))
        for kh, kw in _taps(G):
            gw[:, kh, kw, 0] = np.sum(xp[_win(G, kh, kw)] * gy, axis=(0, 1, 2))
    return gw.reshape(a["weight_shape"]).astype(x.dtype, copy=False)


def conv2d_grad_weight_einsum(x, gy, a):
    G = conv_geometry(x.shape, tuple(a["weight_shape"]), a)
    g, I, Og = G["g"], G["I"], G["O"] // G["g"]
    xp = _padded(x, G)
    xp = xp.reshape(xp.shape[:3] + (g, I))
    gyg = gy.reshape(G["N"], G["oh"], G["ow"], g, Og)
    gw = np.zeros((g, Og, G["KH"], G["KW"], I), np.result_type(x, gy))
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            gw[:, :, kh, kw, :] = np.einsum("nhwgi,nhwgo->goi", xp[_win(G, kh, kw)], gyg)
    return gw.reshape(a["weight_shape"]).astype(x.dtype, copy=False)


def _cgi_vjp(n, xs, y, gy):
    dy, w = xs
    ca = _conv_attrs(n.attrs)
    return [F.conv2d(gy, w, None, **ca), F.conv2d_grad_weight(gy, dy, w.shape, **ca)]


def _cgw_vjp(n, xs, y, gy):
    x, dy = xs
    ca = _conv_attrs(n.attrs)
    return [F.conv2d_grad_input(dy, gy, x.shape, **ca), F.conv2d(x, gy, None, **ca)]


register("conv2d_grad_input", attrs={**CONV, "input_shape": Attr("ints", ())}, infer=_cgi_infer,
         ref=lambda xs, a: conv2d_grad_input_ref(xs[0], xs[1], a), vjp=_cgi_vjp, arity=2,
         doc="transpose of conv2d with respect to its input: (grad_out, w) -> grad_x")
register("conv2d_grad_weight", attrs={**CONV, "weight_shape": Attr("ints", ())}, infer=_cgw_infer,
         ref=lambda xs, a: conv2d_grad_weight_ref(xs[0], xs[1], a), vjp=_cgw_vjp, arity=2,
         doc="gradient of conv2d with respect to its weights: (x, grad_out) -> grad_w")
defrule("conv2d_grad_input", "macs")(lambda ts, out, a: conv_macs(ts[0].shape, ts[1].shape))
defrule("conv2d_grad_weight", "macs")(lambda ts, out, a: conv_macs(ts[1].shape, a["weight_shape"]))


@defrule("conv2d_grad_input", "te")
def _cgi_te(T, xs, a, out):
    gy, w = xs
    G = conv_geometry(tuple(a["input_shape"]), T.shape(w), a)
    I, Og = G["I"], G["O"] // G["g"]
    ad = T.acc_dtype(gy.dtype)
    # at stride 1 the taps run in reverse (kh = KH-1-rkh) so the gathered gradient index grows
    # with the reduction iterator, as in conv2d: LLVM then keeps the CPU schedule's register tile
    # in registers (2x faster on the host); at stride 2 the reverse order is slower, kept forward
    rkh = T.te.reduce_axis((0, G["KH"]), "kh")
    rkw = T.te.reduce_axis((0, G["KW"]), "kw")
    kh = G["KH"] - 1 - rkh if G["sh"] == 1 else rkh
    kw = G["KW"] - 1 - rkw if G["sw"] == 1 else rkw
    ro = T.te.reduce_axis((0, Og), "ro") if Og > 1 else None

    def f(n, h, wp, c):
        vh, oh = T.tap(h, kh, G["pt"], G["dh"], G["sh"], G["oh"])
        vw, ow = T.tap(wp, kw, G["pl"], G["dw"], G["sw"], G["ow"])
        if G["g"] == 1:
            g, i = 0, c
        else:
            g, i = (c // I, c % I) if I > 1 else (c, 0)
        o = g * Og + (ro if ro is not None else 0)
        v = T.tirx.if_then_else(T.tirx.all(vh, vw), T.cast(gy[n, oh, ow, o], ad), T.c(0, ad))
        axes = [rkh, rkw] + ([ro] if ro is not None else [])
        return T.te.sum(v * T.cast(w[o, kh, kw, i], ad), axis=axes)
    return T.to_out(T.te.compute(out.shape, f, name="conv2d_grad_input"), out, "cgi_cast")


@defrule("conv2d_grad_weight", "te")
def _cgw_te(T, xs, a, out):
    x, gy = xs
    G = conv_geometry(T.shape(x), tuple(a["weight_shape"]), a)
    I, Og = G["I"], G["O"] // G["g"]
    ad = T.acc_dtype(x.dtype)
    rn = T.te.reduce_axis((0, G["N"]), "rn")
    rh = T.te.reduce_axis((0, G["oh"]), "rh")
    rw = T.te.reduce_axis((0, G["ow"]), "rw")

    def f(o, kh, kw, i):
        h = rh * G["sh"] + kh * G["dh"] - G["pt"]
        wv = rw * G["sw"] + kw * G["dw"] - G["pl"]
        c = (o // Og) * I + i if G["g"] > 1 else i
        xv = T.tirx.if_then_else(T.in_bounds(h, wv, G["H"], G["W"]), T.cast(x[rn, h, wv, c], ad), T.c(0, ad))
        return T.te.sum(xv * T.cast(gy[rn, rh, rw, o], ad), axis=[rn, rh, rw])
    return T.to_out(T.te.compute(out.shape, f, name="conv2d_grad_weight"), out, "cgw_cast")


# ---- int8 references: conv2d, dense (TFLite's reference kernels) ------------------------------------
# int8 reference rules for the linear ops: conv2d (incl. depthwise, groups = C_in) and dense.
#
# TFLite semantics (reference_integer_ops::ConvPerChannel / DepthwiseConvPerChannel /
# FullyConnected / FullyConnectedPerChannel): accumulate ``(x - x_zp) * (w - w_zp)`` in int32 over
# the window (padding taps add nothing, i.e. padding holds the input zero point), add the int32
# bias, requantise per output channel, add the output zero point, clamp to the fused activation
# range. Accumulation runs in float64, exact for any realistic reduction length (|acc| < 2**53),
# then wraps to int32 as the C kernels do.
#
# The requantisation differs between the two op families, as in LiteRT's reference kernels:
#
# - conv2d / depthwise: ``multiply_by_quantized_multiplier`` (gemmlowp's two roundings) with the
#   multiplier of ``in_scale * w_scale[c] / out_scale`` (double);
# - dense (FULLY_CONNECTED): ``round(double(acc) * eff[c])`` with
#   ``eff[c] = double(in_scale) * double(w_scale[c]) / double(out_scale)``, rounded half away from
#   zero (C's ``round``), per tensor and per channel alike. LiteRT's reference FULLY_CONNECTED has
#   requantised this way since April 2025 ("do requant in float to avoid loss of precision"); its
#   optimized kernels and TFLite Micro's reference kernel still use the fixed-point multiplier,
#   which differs by 1 LSB where gemmlowp's double rounding lands on the other side of a half
#   (e.g. acc * eff = 2.483 -> 3). A dense whose ``requant`` attribute is "fixed" (a model loaded
#   with ``semantics="tflm"``, frontend/loader.py) requantises as TFLite Micro does: conv2d's
#   ``multiply_by_quantized_multiplier``. See docs/int8_ir.md.

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
    if is_int16(in_types[0]):
        return conv2d_int16(xs, attrs, in_types, out_type)
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
    if is_int16(in_types[0]):
        return dense_int16(xs, attrs, in_types, out_type)
    x, w = xs[0], xs[1]
    (s_in, z_in), (s_out, z_out) = int8_io(in_types[:1], out_type, "dense")
    need_int8(in_types[1], "weight", "dense")
    N = w.shape[0]
    ws, wz, _ = channel_params(in_types[1], N, "dense")
    xf = x.astype(np.float64) - z_in
    wf = w.astype(np.float64) - wz.reshape(N, 1)
    acc = np.rint(np.matmul(xf, wf.T)).astype(np.int64)
    bias = _bias(xs, "dense", N)
    if fixed_requant(attrs):     # TensorFlow Lite Micro: the conv's fixed-point multiplier
        mult, shift = requantize_params(s_in, ws, s_out)
        return _finish(acc, bias, mult, shift, z_out, attrs["activation"], s_out)
    if bias is not None:
        acc = acc + bias
    acc = fp.wrap_int32(acc)
    y = fc_requantize(acc, fc_effective_scales(s_in, ws, s_out)) + z_out
    lo, hi = fp.activation_range(attrs["activation"], s_out, z_out)
    return clamp8(y, lo, hi)


# ---- pooling ----------------------------------------------------------------------------------
POOL = {"pool": Attr("ints", (2, 2)), "stride": Attr("ints", None), "padding": Attr("any", "valid")}


def pool_geometry(xshape, a):
    if len(xshape) != 4:
        raise ShapeError(f"pooling needs NHWC input, got shape {xshape}")
    kh, kw = a["pool"]
    st = a["stride"] or a["pool"]
    aa = {"groups": xshape[3], "stride": st, "padding": a["padding"], "dilation": [1, 1]}
    G = conv_geometry(xshape, (xshape[3], kh, kw, 1), aa)
    if max(G["pt"], G["pb"]) >= kh or max(G["pl"], G["pr"]) >= kw:
        # a window lying wholly in the padding has no maximum and no non-padding elements to average
        raise ShapeError(f"pooling padding {a['padding']} must be smaller than the window {a['pool']} "
                         f"on each side")
    return G


def _pool_infer(ts, a):
    G = pool_geometry(ts[0].shape, a)
    return tt((G["N"], G["oh"], G["ow"], G["C"]), ts[0].dtype, ts[0].quant)


def tap_counts(G, dtype):
    """In-image taps of every pooling window, [1, oh, ow, 1] (padding excluded, as TFLite counts)."""
    ones = _padded(np.ones((1, G["H"], G["W"], 1), dtype), G)
    cnt = np.zeros((1, G["oh"], G["ow"], 1), dtype)
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            cnt += ones[_win(G, kh, kw)]
    return cnt


def _avg_counts(G, a, dtype):
    if a.get("count_include_pad"):
        return np.asarray(G["KH"] * G["KW"], dtype)
    return tap_counts(G, dtype)


def _avg_ref(xs, a):
    x = xs[0]
    G = pool_geometry(x.shape, a)
    xp = _padded(x, G)
    acc = np.zeros((G["N"], G["oh"], G["ow"], G["C"]), x.dtype)
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            acc += xp[_win(G, kh, kw)]
    return (acc / _avg_counts(G, a, x.dtype)).astype(x.dtype)


def _avg_grad_ref(xs, a):
    gy = xs[0]
    G = pool_geometry(tuple(a["input_shape"]), a)
    g = gy / _avg_counts(G, a, gy.dtype)
    gxp = np.zeros((G["N"], G["H"] + G["pt"] + G["pb"], G["W"] + G["pl"] + G["pr"], G["C"]), gy.dtype)
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            gxp[_win(G, kh, kw)] += g
    return gxp[:, G["pt"]:G["pt"] + G["H"], G["pl"]:G["pl"] + G["W"]].copy()


def _pool_attrs(a):
    return {k: a[k] for k in POOL}


AVG = {**POOL, "count_include_pad": Attr("bool", False)}
register("avg_pool2d", attrs=AVG, infer=_pool_infer, ref=_avg_ref,
         vjp=lambda n, xs, y, gy: [F.avg_pool2d_grad(gy, xs[0].shape, **_pool_attrs(n.attrs),
                                                     count_include_pad=n.attrs["count_include_pad"])],
         props={QUANTIZABLE}, arity=1,
         doc="NHWC average pooling; padding excluded from the count (TFLite) unless count_include_pad", quant=SAME_AS_INPUT)
register("avg_pool2d_grad", attrs={**AVG, "input_shape": Attr("ints", ())},
         infer=lambda ts, a: tt(a["input_shape"], ts[0].dtype), ref=_avg_grad_ref,
         vjp=lambda n, xs, y, gy: [F.avg_pool2d(gy, **_pool_attrs(n.attrs), count_include_pad=n.attrs["count_include_pad"])],
         arity=1, doc="transpose of avg_pool2d")


def _te_count(T, o, stride, pad, k, size):
    lo = o * stride - pad
    return T.te.min(lo + k, size) - T.te.max(lo, 0)


def _te_avg_divisor(T, G, a, oh, ow, dtype):
    if a["count_include_pad"]:
        return T.c(G["KH"] * G["KW"], dtype)
    return (_te_count(T, oh, G["sh"], G["pt"], G["KH"], G["H"])
            * _te_count(T, ow, G["sw"], G["pl"], G["KW"], G["W"])).astype(dtype)


@defrule("avg_pool2d", "te")
def _avg_te(T, xs, a, out):
    x = xs[0]
    G = pool_geometry(T.shape(x), a)
    ad = T.acc_dtype(x.dtype)
    kh = T.te.reduce_axis((0, G["KH"]), "kh")
    kw = T.te.reduce_axis((0, G["KW"]), "kw")

    def f(n, oh, ow, c):
        h, wv = oh * G["sh"] + kh - G["pt"], ow * G["sw"] + kw - G["pl"]
        return T.te.sum(T.tirx.if_then_else(T.in_bounds(h, wv, G["H"], G["W"]), T.cast(x[n, h, wv, c], ad),
                                            T.c(0, ad)), axis=[kh, kw])
    s = T.te.compute(out.shape, f, name="avg_pool_sum")
    return T.te.compute(out.shape, lambda n, oh, ow, c: T.cast(s[n, oh, ow, c] / _te_avg_divisor(T, G, a, oh, ow, ad),
                                                               out.dtype), name="avg_pool2d")


@defrule("avg_pool2d_grad", "te")
def _avg_grad_te(T, xs, a, out):
    gy = xs[0]
    G = pool_geometry(tuple(a["input_shape"]), a)
    ad = T.acc_dtype(gy.dtype)
    kh = T.te.reduce_axis((0, G["KH"]), "kh")
    kw = T.te.reduce_axis((0, G["KW"]), "kw")

    def f(n, h, wp, c):
        vh, oh = T.tap(h, kh, G["pt"], 1, G["sh"], G["oh"])
        vw, ow = T.tap(wp, kw, G["pl"], 1, G["sw"], G["ow"])
        v = T.tirx.if_then_else(T.tirx.all(vh, vw), T.cast(gy[n, oh, ow, c], ad) / _te_avg_divisor(T, G, a, oh, ow, ad),
                                T.c(0, ad))
        return T.te.sum(v, axis=[kh, kw])
    return T.to_out(T.te.compute(out.shape, f, name="avg_pool2d_grad"), out, "apg_cast")


def _argmax_index(x, a):
    """For each output window, the flat (kh*KW+kw) index of its first maximum."""
    G = pool_geometry(x.shape, a)
    xp = _padded(x.astype(np.float64) if x.dtype.kind != "f" else x, G, -np.inf)
    best = np.full((G["N"], G["oh"], G["ow"], G["C"]), -np.inf, xp.dtype)
    idx = np.zeros(best.shape, np.int64)
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            v = xp[_win(G, kh, kw)]
            better = v > best
            best = np.where(better, v, best)
            idx = np.where(better, kh * G["KW"] + kw, idx)
    return G, idx


def _max_ref(xs, a):
    x = xs[0]
    G = pool_geometry(x.shape, a)
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = _padded(x, G, lowest)
    out = np.full((G["N"], G["oh"], G["ow"], G["C"]), lowest, x.dtype)
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            out = np.maximum(out, xp[_win(G, kh, kw)])
    return out


def _max_grad_ref(xs, a):
    x, gy = xs
    G, idx = _argmax_index(x, a)
    gxp = np.zeros((G["N"], G["H"] + G["pt"] + G["pb"], G["W"] + G["pl"] + G["pr"], G["C"]), gy.dtype)
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            gxp[_win(G, kh, kw)] += np.where(idx == kh * G["KW"] + kw, gy, 0)
    return gxp[:, G["pt"]:G["pt"] + G["H"], G["pl"]:G["pl"] + G["W"]].copy()


def _max_gather_ref(xs, a):
    x, g = xs
    G, idx = _argmax_index(x, a)
    gp = _padded(g, G)
    out = np.zeros((G["N"], G["oh"], G["ow"], G["C"]), g.dtype)
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            out += np.where(idx == kh * G["KW"] + kw, gp[_win(G, kh, kw)], 0)
    return out


register("max_pool2d", attrs=POOL, infer=_pool_infer, ref=_max_ref,
         vjp=lambda n, xs, y, gy: [F.max_pool2d_grad(xs[0], gy, **n.attrs)], props={QUANTIZABLE}, arity=1,
         doc="NHWC max pooling; gradient to each window's first maximum (row-major, as torch)", quant=SAME_AS_INPUT)
register("max_pool2d_grad", attrs=POOL, infer=lambda ts, a: ts[0], ref=_max_grad_ref,
         vjp=lambda n, xs, y, gy: [None, F.max_pool2d_gather(xs[0], gy, **n.attrs)], arity=2,
         doc="(x, grad_out) -> grad_x: routes each window's gradient to its first maximum")
register("max_pool2d_gather", attrs=POOL, infer=lambda ts, a: _pool_infer(ts[:1], a),
         ref=_max_gather_ref, vjp=lambda n, xs, y, gy: [None, F.max_pool2d_grad(xs[0], gy, **n.attrs)], arity=2,
         doc="(x, g) -> g at each window's first maximum (transpose of max_pool2d_grad)")


def _te_window_max(T, x, G, name):
    kh = T.te.reduce_axis((0, G["KH"]), "kh")
    kw = T.te.reduce_axis((0, G["KW"]), "kw")
    low = T.lowest(x.dtype)

    def f(n, oh, ow, c):
        h, wv = oh * G["sh"] + kh - G["pt"], ow * G["sw"] + kw - G["pl"]
        return T.te.max(T.tirx.if_then_else(T.in_bounds(h, wv, G["H"], G["W"]), x[n, h, wv, c], low), axis=[kh, kw])
    return T.te.compute((G["N"], G["oh"], G["ow"], G["C"]), f, name=name)


def _te_window_argmax(T, x, G):
    """Flat tap index (kh * KW + kw) of each window's first maximum (row-major), as the NumPy
    reference's ``_argmax_index``: the smallest tap whose value equals the window maximum."""
    m = _te_window_max(T, x, G, "pool_max")
    kh = T.te.reduce_axis((0, G["KH"]), "akh")
    kw = T.te.reduce_axis((0, G["KW"]), "akw")
    big = G["KH"] * G["KW"]
    low = T.lowest(x.dtype)

    def f(n, oh, ow, c):
        h, wv = oh * G["sh"] + kh - G["pt"], ow * G["sw"] + kw - G["pl"]
        v = T.tirx.if_then_else(T.in_bounds(h, wv, G["H"], G["W"]), x[n, h, wv, c], low)
        return T.te.min(T.tirx.Select(v == m[n, oh, ow, c], kh * G["KW"] + kw, big), axis=[kh, kw])
    return T.te.compute(m.shape, f, name="pool_argmax")


@defrule("max_pool2d", "te")
def _max_te(T, xs, a, out):
    x = xs[0]
    return _te_window_max(T, x, pool_geometry(T.shape(x), a), "max_pool2d")


def _te_argmax_taps(T, x, a, dtype):
    """What routing a gradient through max_pool2d's argmax needs: the window geometry, each
    window's argmax tap, the accumulation dtype for ``dtype`` and the (kh, kw) reduce axes."""
    G = pool_geometry(T.shape(x), a)
    return (G, _te_window_argmax(T, x, G), T.acc_dtype(dtype), T.te.reduce_axis((0, G["KH"]), "kh"),
            T.te.reduce_axis((0, G["KW"]), "kw"))


@defrule("max_pool2d_grad", "te")
def _max_grad_te(T, xs, a, out):
    x, gy = xs
    G, idx, ad, kh, kw = _te_argmax_taps(T, x, a, gy.dtype)

    def f(n, h, wp, c):
        vh, oh = T.tap(h, kh, G["pt"], 1, G["sh"], G["oh"])
        vw, ow = T.tap(wp, kw, G["pl"], 1, G["sw"], G["ow"])
        hit = T.tirx.all(vh, vw)
        v = T.tirx.if_then_else(hit, T.tirx.Select(idx[n, oh, ow, c] == kh * G["KW"] + kw,
                                                   T.cast(gy[n, oh, ow, c], ad), T.c(0, ad)), T.c(0, ad))
        return T.te.sum(v, axis=[kh, kw])
    return T.to_out(T.te.compute(out.shape, f, name="max_pool2d_grad"), out, "mpg_cast")


@defrule("max_pool2d_gather", "te")
def _max_gather_te(T, xs, a, out):
    x, g = xs
    G, idx, ad, kh, kw = _te_argmax_taps(T, x, a, g.dtype)

    def f(n, oh, ow, c):
        h, wv = oh * G["sh"] + kh - G["pt"], ow * G["sw"] + kw - G["pl"]
        take = T.tirx.all(T.in_bounds(h, wv, G["H"], G["W"]), idx[n, oh, ow, c] == kh * G["KW"] + kw)
        return T.te.sum(T.tirx.if_then_else(take, T.cast(g[n, h, wv, c], ad), T.c(0, ad)), axis=[kh, kw])
    return T.to_out(T.te.compute(out.shape, f, name="max_pool2d_gather"), out, "mpga_cast")


# ---- int8 references: pooling (input and output share scale and zero point) ----------------
@defrule("avg_pool2d", "int8_ref")
def avg_pool2d_int8(xs, attrs, in_types, out_type):
    if is_int16(in_types[0]):
        return avg_pool2d_int16(xs, attrs, in_types, out_type)
    need_int8(in_types[0], "input", "avg_pool2d")
    same_quant(in_types[0], out_type, "avg_pool2d")
    if attrs.get("count_include_pad"):
        raise ShapeError("avg_pool2d: TFLite's int8 average pool divides by the in-image tap count "
                         "(count_include_pad=False)")
    return clamp8(_avg_pool_integer(xs[0], attrs))


def _avg_pool_integer(x, attrs):
    """TFLite's integer AveragePool before the clamp: the window sum over the in-image tap count,
    rounded half away from zero (int8 and int16 alike)."""
    x = x.astype(np.int64)
    G = pool_geometry(x.shape, attrs)
    xp = _padded(x, G)
    acc = np.zeros((G["N"], G["oh"], G["ow"], G["C"]), np.int64)
    for kh in range(G["KH"]):
        for kw in range(G["KW"]):
            acc += xp[_win(G, kh, kw)]
    cnt = tap_counts(G, np.int64)
    half = cnt // 2
    return np.where(acc > 0, trunc_div(acc + half, cnt), trunc_div(acc - half, cnt))


@defrule("max_pool2d", "int8_ref")
def max_pool2d_int8(xs, attrs, in_types, out_type):
    if is_int16(in_types[0]):
        return max_pool2d_int16(xs, attrs, in_types, out_type)
    need_int8(in_types[0], "input", "max_pool2d")
    same_quant(in_types[0], out_type, "max_pool2d")
    return get_op("max_pool2d").ref(xs, attrs)


# ---- dropout ----------------------------------------------------------------------------------
def dropout_mask(shape, key, salt, rate, dtype):
    rng = np.random.default_rng([int(key) & 0xFFFFFFFF, int(salt)])
    return ((rng.random(shape) >= rate) / (1.0 - rate)).astype(dtype)


def dropout_mask_values(masks, feeds):
    """{mask input name: array} for the dropout masks a compiled package takes as inputs (the
    ``externalize_dropout`` records of backends/tvm_te.py), from their key inputs in ``feeds``.
    Here, not beside the TVM code, so that running a package (the CUDA runner) needs no TVM."""
    return {m["name"]: dropout_mask(tuple(m["shape"]), np.asarray(feeds[m["key"]]), m["salt"], m["rate"],
                                    m["dtype"]) for m in masks}


def _dropout_infer(ts, a):
    if ts[1].shape != () or ts[1].dtype != "int64":
        raise ShapeError(f"dropout: key must be an int64 scalar, got {ts[1]}")
    if not 0.0 <= a["rate"] < 1.0:
        raise ShapeError(f"dropout rate must be in [0, 1), got {a['rate']}")
    return ts[0]


register("dropout", attrs={"rate": Attr("float", 0.5), "salt": Attr("int", 0)}, infer=_dropout_infer,
         ref=lambda xs, a: xs[0] * dropout_mask(xs[0].shape, xs[1], a["salt"], a["rate"], xs[0].dtype),
         vjp=lambda n, xs, y, gy: [F.dropout(gy, xs[1], n.attrs["rate"], n.attrs["salt"]), None], arity=2,
         doc="inverted dropout with a counter-based mask from (key, salt): the same key gives the same mask")


# ---- TFLite import ----------------------------------------------------------
# CONV_2D, DEPTHWISE_CONV_2D (weights [1, KH, KW, C*M] -> OHWI [C*M, KH, KW, 1]), FULLY_CONNECTED, pools
def checked_conv_geometry(imp, k, name, xshape, wshape, attrs):
    try:
        G = conv_geometry(xshape, wshape, attrs)
    except ShapeError as e:
        raise imp.err(f"{tfl.where(k, name)}: {e}") from None
    check_limit("max_tensor_elements", G["N"] * (G["H"] + G["pt"] + G["pb"]) * (G["W"] + G["pl"] + G["pr"]) * G["C"],
                f"{imp.where} {tfl.where(k, name)} (padded input)")
    tfl.check_work(imp, k, name, (G["N"], G["oh"], G["ow"], G["O"]), G["KH"] * G["KW"] * G["I"])
    return G


def conv_filter(imp, k, name, ins):
    """(input value, input dtype, filter array, filter QParams or None) for a conv: float32 filters
    for float inputs (int8 ones dequantised: a hybrid model), int8 for int8 inputs."""
    w = tfl.where(k, name)
    x_i, w_i = ins[0], ins[1]
    xt = imp.activation_type(x_i, w)
    wt = imp.tensors[w_i]
    wdata = imp.const(w_i, k, name, "the filter")
    if len(xt["shape"]) != 4 or wdata.ndim != 4 or min(xt["shape"][1:]) < 1 or min(wdata.shape) < 1:
        raise imp.err(f"{w}: input {list(xt['shape'])} and filter {list(wdata.shape)} must be 4-D with every "
                      f"dimension >= 1 (batch may be 0)")
    if xt["dtype"] == "float32":
        if wt["dtype"] not in ("int8", "float32"):
            raise imp.err(f"{w}: float input with a {wt['dtype']} filter {imp.label(w_i)}; TFLite needs float32 "
                          f"or (dynamic-range quantisation) int8")
        if wt["dtype"] == "int8":
            tfl.symmetric(imp, k, name, w_i)
        return imp.operand(x_i, k, name), "float32", tfl.dequantized(imp, w_i, k, name, "the filter"), None
    if wt["dtype"] != "int8":
        raise imp.err(f"{w}: {xt['dtype']} input with a {wt['dtype']} filter {imp.label(w_i)}; TFLite needs an int8 filter")
    return imp.operand(x_i, k, name), xt["dtype"], wdata, wt["quant"]


@tfl.importer("CONV_2D")
def _tfl_conv(imp, k, op, ins, out):
    name = "CONV_2D"
    tfl.need(imp, k, name, ins, 3)          # TFLite's CONV_2D requires the bias
    o = tfl.options(imp, k, op, name, "Conv2DOptions")
    if o is None:
        raise imp.err(f"{tfl.where(k, name)} has no Conv2DOptions (TFLite then reads strides of 0 and rejects it)")
    attrs = tfl.window_attrs(imp, k, name, o)
    act = tfl.activation(imp, k, name, o.FusedActivationFunction())
    x, dtype, wdata, wq = conv_filter(imp, k, name, ins)
    xt = imp.g.types[x]
    C, I, O = xt.shape[3], wdata.shape[3], wdata.shape[0]
    if C % I or O % (C // I):
        raise imp.err(f"{tfl.where(k, name)}: input channels {C} and filter {list(wdata.shape)} do not match (need input "
                      f"channels divisible by filter channels and output channels by the groups)")
    attrs["groups"] = C // I
    checked_conv_geometry(imp, k, name, xt.shape, wdata.shape, attrs)
    if dtype in ("int8", "int16"):
        chk.conv_quant(imp.err, tfl.where(k, name), xt.quant, wq, imp.tensors[ins[2]]["quant"], imp.tensors[out]["quant"],
                       wdata.shape, O, act, lambda axis: axis == 0)
    if dtype == "int16":
        symmetric16(imp.err, tfl.where(k, name), [("the input", xt.quant), ("the output", imp.tensors[out]["quant"])])
    wname = imp._vname(imp.tensors[ins[1]]["name"])
    imp.g.add_const(wname, wdata, wq)
    inputs = [x, wname] + [b for b in [tfl.bias(imp, k, name, ins, dtype, O)] if b is not None]
    imp.values[out] = imp.emit(k, name, "conv2d", inputs, dict(attrs, activation=act), out)


@tfl.importer("DEPTHWISE_CONV_2D")
def _tfl_depthwise(imp, k, op, ins, out):
    name = "DEPTHWISE_CONV_2D"
    tfl.need(imp, k, name, ins, 2, 3)
    o = tfl.options(imp, k, op, name, "DepthwiseConv2DOptions")
    if o is None:
        raise imp.err(f"{tfl.where(k, name)} has no DepthwiseConv2DOptions (TFLite then reads strides of 0 and rejects it)")
    attrs = tfl.window_attrs(imp, k, name, o)
    act = tfl.activation(imp, k, name, o.FusedActivationFunction())
    x, dtype, wdata, wq = conv_filter(imp, k, name, ins)
    xt = imp.g.types[x]
    C = xt.shape[3]
    if wdata.shape[0] != 1 or wdata.shape[3] % C:
        raise imp.err(f"{tfl.where(k, name)}: filter {list(wdata.shape)} does not fit input {list(xt.shape)} "
                      f"(expected [1, KH, KW, C*M])")
    O = wdata.shape[3]
    if dtype in ("int8", "int16"):
        chk.conv_quant(imp.err, tfl.where(k, name), xt.quant, wq, imp.tensors[ins[2]]["quant"] if len(ins) == 3 else None,
                       imp.tensors[out]["quant"], wdata.shape, O, act, lambda axis: axis == 3)
        if wq.per_channel and len(wq.scale) > 1:
            wq = QParams(wq.scale, wq.zero_point, 0)
    if dtype == "int16":
        symmetric16(imp.err, tfl.where(k, name), [("the input", xt.quant), ("the output", imp.tensors[out]["quant"])])
    attrs["groups"] = C
    w_ohwi = np.ascontiguousarray(np.transpose(wdata, (3, 1, 2, 0)))
    checked_conv_geometry(imp, k, name, xt.shape, w_ohwi.shape, attrs)
    wname = imp._vname(imp.tensors[ins[1]]["name"] + "_ohwi")
    imp.g.add_const(wname, w_ohwi, wq)
    inputs = [x, wname] + [b for b in [tfl.bias(imp, k, name, ins, dtype, O)] if b is not None]
    imp.values[out] = imp.emit(k, name, "conv2d", inputs, dict(attrs, activation=act), out)


@tfl.importer("FULLY_CONNECTED")
def _tfl_fc(imp, k, op, ins, out):
    name = "FULLY_CONNECTED"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 2, 3, optional=(2,))
    o = tfl.options(imp, k, op, name, "FullyConnectedOptions")
    if o is not None and int(o.WeightsFormat()) != 0:
        raise imp.err(f"{w}: weights_format = {int(o.WeightsFormat())} is out of range: Kiln imports 0 (DEFAULT)")
    act = tfl.activation(imp, k, name, o.FusedActivationFunction() if o else 0)
    keep = bool(o.KeepNumDims()) if o else False
    xt = imp.activation_type(ins[0], w)
    wt = imp.tensors[ins[1]]
    wdata = imp.const(ins[1], k, name, "the weights")
    if wdata.ndim != 2 or min(wdata.shape) < 1 or math.prod(xt["shape"]) % wdata.shape[1]:
        raise imp.err(f"{w}: weights {list(wdata.shape)} do not fit input {list(xt['shape'])} (need [N, K], K "
                      f"dividing the input's elements)")
    N = wdata.shape[0]
    wq = None
    if xt["dtype"] == "float32":
        if wt["dtype"] == "int8":
            tfl.symmetric(imp, k, name, ins[1])
        elif wt["dtype"] != "float32":
            raise imp.err(f"{w}: float input with {wt['dtype']} weights {imp.label(ins[1])}; TFLite needs float32 "
                          f"or (dynamic-range quantisation) int8")
        wdata = tfl.dequantized(imp, ins[1], k, name, "the weights")
    elif wt["dtype"] != "int8":
        raise imp.err(f"{w}: {xt['dtype']} input with {wt['dtype']} weights {imp.label(ins[1])}; TFLite needs int8 weights")
    else:
        wq = wt["quant"]
        bq = imp.tensors[ins[2]]["quant"] if len(ins) == 3 and ins[2] >= 0 else None
        if wq is not None and len(wq.scale) > 1:
            chk.conv_quant(imp.err, w, xt["quant"], wq, bq, imp.tensors[out]["quant"], wdata.shape, N, act,
                           lambda axis: axis == 0)
        else:
            chk.fc_per_tensor(imp.err, w, xt["quant"], wq, len(ins) == 3 and ins[2] >= 0, bq,
                              imp.tensors[out]["quant"], act)
    if xt["dtype"] == "int16":
        symmetric16(imp.err, w, [("the input", xt["quant"]), ("the output", imp.tensors[out]["quant"])])
    x = imp.operand(ins[0], k, name)
    wname = imp._vname(wt["name"])
    imp.g.add_const(wname, wdata, wq)
    xtt = imp.g.types[x]
    tfl.check_work(imp, k, name, imp.tensors[out]["shape"], wdata.shape[1])
    if not keep and len(xtt.shape) != 2:
        flat = imp._vname(x + "_flat")
        imp.g.add_node("reshape", [x], {"shape": [xtt.size // wdata.shape[1], wdata.shape[1]]}, name=flat,
                       out_type=TensorType((xtt.size // wdata.shape[1], wdata.shape[1]), xtt.dtype, xtt.quant))
        x = flat
    inputs = [x, wname] + [b for b in [tfl.bias(imp, k, name, ins, xt["dtype"], N)] if b is not None]
    imp.values[out] = imp.emit(k, name, "dense", inputs, {"activation": act}, out)


def _tfl_pool(kop, name):
    def conv(imp, k, op, ins, out):
        tfl.need(imp, k, name, ins, 1)
        o = tfl.options(imp, k, op, name, "Pool2DOptions")
        if o is None:
            raise imp.err(f"{tfl.where(k, name)} has no Pool2DOptions (TFLite then reads strides of 0 and rejects it)")
        w = tfl.where(k, name)
        attrs = tfl.window_attrs(imp, k, name, o, dilated=False)
        attrs["pool"] = [chk.window(imp.err, w, "filter_height", o.FilterHeight()),
                         chk.window(imp.err, w, "filter_width", o.FilterWidth())]
        act = tfl.activation(imp, k, name, o.FusedActivationFunction())
        x = imp.operand(ins[0], k, name)
        if imp.g.types[x].dtype in ("int8", "int16"):
            chk.same_quant(imp.err, w, imp.g.types[x].quant, imp.tensors[out]["quant"], "the input's")
            chk.activation_range(imp.err, w, act, imp.tensors[out]["quant"].scale[0])
        tfl.check_work(imp, k, name, imp.tensors[out]["shape"], attrs["pool"][0] * attrs["pool"][1])
        imp.finish(k, name, kop, [x], attrs, out, act)
    return conv


tfl.importer("AVERAGE_POOL_2D")(_tfl_pool("avg_pool2d", "AVERAGE_POOL_2D"))
tfl.importer("MAX_POOL_2D")(_tfl_pool("max_pool2d", "MAX_POOL_2D"))


# ---- TFLite export ------------------------------------------------------------------------------
@tfl.exporter("dense", versions={"FULLY_CONNECTED": 4})
def _tfl_export_dense(e, n, act, out, int8):
    x_t = e.g.types[n.inputs[0]]
    e.op("FULLY_CONNECTED", [e.value(i) for i in n.inputs], [e.tensor(out, e.g.types[out])], "FullyConnectedOptions",
         int8, FusedActivationFunction=tfl.ACT_CODES[n.attrs["activation"]], KeepNumDims=len(x_t.shape) != 2)


@tfl.exporter("avg_pool2d", "max_pool2d", versions={"AVERAGE_POOL_2D": 2, "MAX_POOL_2D": 2}, fuses_activation=True)
def _tfl_export_pool(e, n, act, out, int8):
    a = n.attrs
    if n.op == "avg_pool2d" and a.get("count_include_pad"):
        raise tfl.ExportError(f"node {n.name!r}: TFLite's AVERAGE_POOL_2D excludes padding (count_include_pad)")
    pad = a["padding"]
    if pad not in tfl.PAD_CODES:
        raise tfl.ExportError(f"node {n.name!r}: pooling padding must be 'same' or 'valid' for TFLite, got {pad}")
    st = a["stride"] or a["pool"]
    e.op("AVERAGE_POOL_2D" if n.op == "avg_pool2d" else "MAX_POOL_2D", [e.value(i) for i in n.inputs],
         [e.tensor(out, e.g.types[out])], "Pool2DOptions", int8, Padding=tfl.PAD_CODES[pad], StrideW=st[1],
         StrideH=st[0], FilterWidth=a["pool"][1], FilterHeight=a["pool"][0],
         FusedActivationFunction=tfl.ACT_CODES[act])


def _export_explicit_pad(e, n, G, x, xt, int8):
    """Explicit conv padding: a PAD filled with the zero point, then a VALID conv."""
    pads = [0, 0, G["pt"], G["pb"], G["pl"], G["pr"], 0, 0]
    padded_t = TensorType((G["N"], G["H"] + G["pt"] + G["pb"], G["W"] + G["pl"] + G["pr"], G["C"]), xt.dtype, xt.quant)
    p = e.tensor(e._fresh(n.name + "/pad"), padded_t)
    e.op("PAD", [x, e.const(n.name + "/paddings", np.asarray(pads, np.int32).reshape(4, 2))], [p], "PadOptions", int8)
    return p


def _export_bias(e, n, G, xt, wt, is_dw, int8):
    if int8:
        # LiteRT's int8 conv kernels require a bias: zeros with scale s_in * s_w[c]
        wq, s_in = wt.quant, xt.quant.scale[0]
        bq = QParams(tuple(float(np.float32(s_in) * np.float32(s)) for s in wq.scale), (0,) * len(wq.scale),
                     0 if len(wq.scale) > 1 else None)
        bdt = np.int64 if xt.dtype == "int16" else np.int32     # 16x8: an int64 bias
        return [e.const(n.name + "/zero_bias", np.zeros(G["O"], bdt), bq)]
    if not is_dw:
        # TFLite's CONV_2D requires a bias in every dtype (its Prepare() checks has_bias)
        return [e.const(n.name + "/zero_bias", np.zeros(G["O"], xt.dtype))]
    return []


@tfl.exporter("conv2d", versions={"CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "PAD": 2})
def _tfl_export_conv(e, n, act, out, int8):
    g, a = e.g, n.attrs
    y = e.tensor(out, g.types[out])
    xt, wt = g.types[n.inputs[0]], g.types[n.inputs[1]]
    G = conv_geometry(xt.shape, wt.shape, a)
    is_dw = G["g"] > 1 and G["I"] == 1 and G["g"] == G["C"]
    xs = [e.value(i) if not (k == 1 and is_dw) else -1 for k, i in enumerate(n.inputs)]
    pad = a["padding"]
    if pad not in tfl.PAD_CODES:
        xs = [_export_explicit_pad(e, n, G, xs[0], xt, int8)] + xs[1:]
        pad = "valid"
    common = dict(Padding=tfl.PAD_CODES[pad], StrideW=a["stride"][1], StrideH=a["stride"][0],
                  DilationWFactor=a["dilation"][1], DilationHFactor=a["dilation"][0],
                  FusedActivationFunction=tfl.ACT_CODES[a["activation"]])
    bias = xs[2:] or _export_bias(e, n, G, xt, wt, is_dw, int8)
    if is_dw:
        w = np.asarray(g.consts.get(n.inputs[1], g.params.get(n.inputs[1])))
        q = wt.quant
        if q is not None and q.per_channel:
            q = QParams(q.scale, q.zero_point, 3)
        wi = e.const(n.inputs[1] + "/1hwo", np.ascontiguousarray(np.transpose(w, (3, 1, 2, 0))), q)
        e.op("DEPTHWISE_CONV_2D", [xs[0], wi] + bias, [y], "DepthwiseConv2DOptions", int8,
             DepthMultiplier=G["O"] // G["C"], **common)
    else:
        e.op("CONV_2D", xs[:2] + bias, [y], "Conv2DOptions", int8, **common)


# ---- int16 ----------------------------------------------------------------------------------------
# TFLite's 16x8 kernels (reference_integer_ops ConvPerChannel / DepthwiseConvPerChannel /
# FullyConnected with int16 input, int8 filter, int64 bias): accumulate ``x * w`` in int64 (input
# and output zero points 0, symmetric filters), add the bias, requantise with the int64
# ``MultiplyByQuantizedMultiplier`` (16-bit reduced multiplier, one rounding), clamp to the
# activation range in int16. Pooling is the int8 arithmetic clamped to int16.
def _bias16(xs, op):
    if len(xs) < 3:
        return None
    b = np.asarray(xs[2])
    if b.dtype.kind not in "iu":
        raise ShapeError(f"{op}: int16 reference needs an int64 (or int32) bias, got {b.dtype}")
    return b.astype(np.int64)


def _finish16(acc, bias, mult, shift, out_zp, act, out_scale):
    if bias is not None:
        acc = acc + bias
    y = mbqm64(acc, mult, shift) + out_zp
    lo, hi = fp.activation_range(act, out_scale, out_zp, -32768, 32767)
    return clamp16(y, lo, hi)


def conv2d_int16(xs, attrs, in_types, out_type):
    x, w = xs[0], xs[1]
    (s_in, z_in), (s_out, z_out) = int16_io(in_types[:1], out_type, "conv2d")
    need_int8(in_types[1], "weight", "conv2d")
    O = w.shape[0]
    ws, wz, _ = channel_params(in_types[1], O, "conv2d")
    wf = w.astype(np.float64) - wz.reshape(O, 1, 1, 1)
    acc = np.rint(conv2d_nobias(x.astype(np.float64), wf, attrs)).astype(np.int64)
    mult, shift = requantize_params(s_in, ws, s_out)
    return _finish16(acc, _bias16(xs, "conv2d"), mult, shift, z_out, attrs["activation"], s_out)


def dense_int16(xs, attrs, in_types, out_type):
    x, w = xs[0], xs[1]
    (s_in, z_in), (s_out, z_out) = int16_io(in_types[:1], out_type, "dense")
    need_int8(in_types[1], "weight", "dense")
    N = w.shape[0]
    ws, wz, _ = channel_params(in_types[1], N, "dense")
    wf = w.astype(np.float64) - wz.reshape(N, 1)
    acc = np.rint(np.matmul(x.astype(np.float64), wf.T)).astype(np.int64)
    bias = _bias16(xs, "dense")
    if fixed_requant(attrs):
        return _dense16_fixed(acc, bias, len(in_types) > 2 and in_types[2].dtype == "int32",
                              requantize_params(s_in, ws, s_out), z_out, attrs["activation"], s_out)
    if bias is not None:
        acc = acc + bias
    # LiteRT's reference FULLY_CONNECTED requantises in double for int16 as for int8 (see above)
    y = fc_requantize(acc, fc_effective_scales(s_in, ws, s_out)) + z_out
    lo, hi = fp.activation_range(attrs["activation"], s_out, z_out, -32768, 32767)
    return clamp16(y, lo, hi)


def _dense16_fixed(acc, bias, bias32, params, out_zp, act, out_scale):
    """TensorFlow Lite Micro's 16x8 FULLY_CONNECTED: with an int32 bias the accumulator is int32
    and requantised as int8's (``MultiplyByQuantizedMultiplier(int32_t, ...)``); with an int64 bias
    (or none) it is int64, requantised with the reduced multiplier as the 16x8 conv."""
    mult, shift = params
    if not bias32:
        return _finish16(acc, bias, mult, shift, out_zp, act, out_scale)
    acc = fp.wrap_int32(acc + bias)
    y = fp.multiply_by_quantized_multiplier(acc, mult, shift) + out_zp
    lo, hi = fp.activation_range(act, out_scale, out_zp, -32768, 32767)
    return clamp16(y, lo, hi)


def avg_pool2d_int16(xs, attrs, in_types, out_type):
    int16_io(in_types[:1], out_type, "avg_pool2d", symmetric=False)
    same_quant(in_types[0], out_type, "avg_pool2d")
    if attrs.get("count_include_pad"):
        raise ShapeError("avg_pool2d: TFLite's int16 average pool divides by the in-image tap count "
                         "(count_include_pad=False)")
    return clamp16(_avg_pool_integer(xs[0], attrs))


def max_pool2d_int16(xs, attrs, in_types, out_type):
    int16_io(in_types[:1], out_type, "max_pool2d", symmetric=False)
    same_quant(in_types[0], out_type, "max_pool2d")
    return get_op("max_pool2d").ref(xs, attrs)


mark(INT16, "conv2d", "dense", "avg_pool2d", "max_pool2d")   # the 16x8 rules above
