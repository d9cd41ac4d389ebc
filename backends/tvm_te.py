"""TE compute definitions of Kiln's float ops, shared by the server targets (host LLVM and CUDA).

Each op's rule is registered with ``deflower(op, "te")`` and has the signature
``rule(xs: list[te.Tensor], attrs: dict, out: TensorType) -> te.Tensor``: ``xs`` are the op's
inputs as TE tensors (scalar constants folded in arrive as constant stages, so a rule never sees a
Python number), ``out`` is the node's output type with the storage dtype already chosen (float32,
or float16/bfloat16 when a target stores in half precision). Reductions accumulate in float32 when
the storage dtype is 16-bit.

The rules follow the NumPy references in ``frontend/ops`` (the specification): padding, window
geometry and the first-maximum rule of max pooling are computed with the same helpers
(``conv_geometry``, ``pool_geometry``). Padding is inlined into the consumer's expression with
``if_then_else`` (lazy), so a convolution is one TE stage and schedules see no separate pad block.

``to_relax(graph)`` turns a whole Kiln graph into a Relax module (one ``emit_te`` per node) that
both server targets compile; ``missing_lowerings(graph)`` lists nodes without a rule.
"""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from kiln.frontend import ops as _ops  # noqa: F401  (fills the registry)
from kiln.frontend.graph import Graph
from kiln.frontend.ops._util import norm_axes, reduced_shape
from kiln.frontend.ops.nn import conv_geometry, pool_geometry
from kiln.frontend.ops.reduce_shape import resolve_shape
from kiln.frontend.registry import deflower, get_op

import tvm
from tvm import te, tirx

BACKEND = "te"
HALF = ("float16", "bfloat16")


# ---- helpers ----------------------------------------------------------------------------------
def _c(value, dtype):
    return tirx.const(value, str(dtype))


def acc_dtype(dtype):
    """Accumulation dtype for reductions: float32 for 16-bit storage, the dtype itself otherwise."""
    dtype = str(dtype)
    return "float32" if dtype in HALF else dtype


def _bidx(x, out_shape, idx):
    """Index ``x`` at output position ``idx`` under NumPy broadcasting (right-aligned, size-1 dims
    read index 0)."""
    nd = len(x.shape)
    lead = len(out_shape) - nd
    sub = [0 if int(x.shape[k]) == 1 else idx[lead + k] for k in range(nd)]
    return x(*sub)


def _dt(v):
    """dtype of a PrimExpr (TVM 0.27 exposes it as ``.ty``; TE slices as ``.dtype``)."""
    ty = getattr(v, "ty", None)
    return str(ty) if ty is not None else str(v.dtype)


def _cast(v, dtype):
    return v if _dt(v) == dtype else v.astype(dtype)


def _act(v, act):
    if act == "relu":
        return te.max(v, _c(0, _dt(v)))
    if act == "relu6":
        return te.min(te.max(v, _c(0, _dt(v))), _c(6, _dt(v)))
    return v


def _shape(t):
    return tuple(int(s) for s in t.shape)


# ---- element-wise -----------------------------------------------------------------------------
def _unary(name, f):
    @deflower(name, BACKEND)
    def rule(xs, a, out):
        x = xs[0]
        return te.compute(_shape(x), lambda *i: _cast(f(_cast(x(*i), acc_dtype(x.dtype)), a), out.dtype),
                          name=name)
    return rule


def _pow(v, a):
    p = float(a["exponent"])
    if p == 2.0:
        return v * v
    if p == 1.0:
        return v
    if p == 0.0:
        return _c(1, _dt(v))
    if p == 0.5:
        return te.sqrt(v)
    if p == -1.0:
        return _c(1, _dt(v)) / v
    return te.power(v, _c(p, _dt(v)))


_unary("neg", lambda v, a: -v)
_unary("exp", lambda v, a: te.exp(v))
_unary("log", lambda v, a: te.log(v))
_unary("sqrt", lambda v, a: te.sqrt(v))
_unary("tanh", lambda v, a: te.tanh(v))
_unary("sigmoid", lambda v, a: _c(1, _dt(v)) / (_c(1, _dt(v)) + te.exp(-v)))
_unary("relu", lambda v, a: _act(v, "relu"))
_unary("relu6", lambda v, a: _act(v, "relu6"))
_unary("pow", _pow)


def _binary(name, f):
    @deflower(name, BACKEND)
    def rule(xs, a, out):
        a_, b_ = xs
        shape = out.shape
        ad = acc_dtype(a_.dtype)
        return te.compute(shape, lambda *i: _cast(f(_cast(_bidx(a_, shape, i), ad), _cast(_bidx(b_, shape, i), ad)),
                                                  out.dtype), name=name)
    return rule


_binary("add", lambda a, b: a + b)
_binary("sub", lambda a, b: a - b)
_binary("mul", lambda a, b: a * b)
_binary("div", lambda a, b: a / b)
_binary("maximum", lambda a, b: te.max(a, b))
_binary("minimum", lambda a, b: te.min(a, b))
_binary("equal", lambda a, b: tirx.EQ(a, b))
_binary("not_equal", lambda a, b: tirx.NE(a, b))
_binary("less", lambda a, b: a < b)
_binary("less_equal", lambda a, b: a <= b)
_binary("greater", lambda a, b: a > b)
_binary("greater_equal", lambda a, b: a >= b)
_binary("logical_and", lambda a, b: tirx.And(a, b))
_binary("logical_or", lambda a, b: tirx.Or(a, b))


@deflower("logical_not", BACKEND)
def _logical_not(xs, a, out):
    x = xs[0]
    return te.compute(_shape(x), lambda *i: tirx.Not(x(*i)), name="logical_not")


@deflower("where", BACKEND)
def _where(xs, a, out):
    c, p, q = xs
    shape = out.shape
    return te.compute(shape, lambda *i: tirx.Select(_bidx(c, shape, i), _bidx(p, shape, i), _bidx(q, shape, i)),
                      name="where")


@deflower("cast", BACKEND)
def _cast_rule(xs, a, out):
    x = xs[0]
    if out.dtype == "bool":
        return te.compute(_shape(x), lambda *i: tirx.NE(x(*i), _c(0, x.dtype)), name="cast")
    return te.compute(_shape(x), lambda *i: x(*i).astype(out.dtype), name="cast")


# ---- linear -----------------------------------------------------------------------------------
@deflower("matmul", BACKEND)
def _matmul(xs, a, out):
    x, w = xs
    K = int(x.shape[-1])
    ad = acc_dtype(x.dtype)
    shape = out.shape
    nb = len(shape) - 2
    k = te.reduce_axis((0, K), "k")

    def f(*i):
        bi = i[:nb]
        xi = _bidx_batch(x, bi, nb) + [i[-2], k]
        wi = _bidx_batch(w, bi, nb) + [k, i[-1]]
        return te.sum(_cast(x(*xi), ad) * _cast(w(*wi), ad), axis=k)
    y = te.compute(shape, f, name="matmul")
    return y if ad == out.dtype else te.compute(shape, lambda *i: y(*i).astype(out.dtype), name="matmul_cast")


def _bidx_batch(t, bi, nb):
    tb = len(t.shape) - 2
    lead = nb - tb
    return [0 if int(t.shape[j]) == 1 else bi[lead + j] for j in range(tb)]


@deflower("dense", BACKEND)
def _dense(xs, a, out):
    x, w = xs[:2]
    K = int(w.shape[1])
    ad = acc_dtype(x.dtype)
    k = te.reduce_axis((0, K), "k")
    shape = out.shape
    y = te.compute(shape, lambda *i: te.sum(_cast(x(*i[:-1], k), ad) * _cast(w(i[-1], k), ad), axis=k),
                   name="dense")
    b = xs[2] if len(xs) == 3 else None

    def epi(*i):
        v = y(*i)
        if b is not None:
            v = v + _cast(b(i[-1]), ad)
        return _cast(_act(v, a["activation"]), out.dtype)
    if b is None and a["activation"] == "none" and ad == out.dtype:
        return y
    return te.compute(shape, epi, name="dense_epilogue")


def _in_bounds(h, w, H, W):
    return tirx.all(h >= 0, h < H, w >= 0, w < W)


@deflower("conv2d", BACKEND)
def _conv2d(xs, a, out):
    x, w = xs[:2]
    G = conv_geometry(_shape(x), _shape(w), a)
    I, Og = G["I"], G["O"] // G["g"]
    ad = acc_dtype(x.dtype)
    kh = te.reduce_axis((0, G["KH"]), "kh")
    kw = te.reduce_axis((0, G["KW"]), "kw")
    ri = te.reduce_axis((0, I), "ri") if I > 1 else None

    def f(n, oh, ow, o):
        h = oh * G["sh"] + kh * G["dh"] - G["pt"]
        wv = ow * G["sw"] + kw * G["dw"] - G["pl"]
        i = ri if ri is not None else 0
        c = (o // Og) * I + i if G["g"] > 1 else i
        xv = tirx.if_then_else(_in_bounds(h, wv, G["H"], G["W"]), _cast(x[n, h, wv, c], ad), _c(0, ad))
        axes = [kh, kw] + ([ri] if ri is not None else [])
        return te.sum(xv * _cast(w[o, kh, kw, i], ad), axis=axes)
    y = te.compute(out.shape, f, name="conv2d")
    b = xs[2] if len(xs) == 3 else None
    if b is None and a["activation"] == "none" and ad == out.dtype:
        return y

    def epi(n, oh, ow, o):
        v = y[n, oh, ow, o]
        if b is not None:
            v = v + _cast(b[o], ad)
        return _cast(_act(v, a["activation"]), out.dtype)
    return te.compute(out.shape, epi, name="conv2d_epilogue")


def _tap(pos, k, pad, dil, stride, n_out):
    """For input position ``pos`` and kernel tap ``k``: (valid, output index) of the window that
    reads ``pos`` through tap ``k`` (the transpose of the strided window)."""
    t = pos + pad - k * dil
    q = tirx.floordiv(t, stride)
    valid = tirx.all(t >= 0, tirx.floormod(t, stride) == 0, q < n_out)
    return valid, q


@deflower("conv2d_grad_input", BACKEND)
def _conv2d_grad_input(xs, a, out):
    gy, w = xs
    G = conv_geometry(tuple(a["input_shape"]), _shape(w), a)
    I, Og = G["I"], G["O"] // G["g"]
    ad = acc_dtype(gy.dtype)
    # at stride 1 the taps run in reverse (kh = KH-1-rkh) so the gathered gradient index grows
    # with the reduction iterator, as in conv2d: LLVM then keeps the CPU schedule's register tile
    # in registers (2x faster on the host); at stride 2 the reverse order is slower, kept forward
    rkh = te.reduce_axis((0, G["KH"]), "kh")
    rkw = te.reduce_axis((0, G["KW"]), "kw")
    kh = G["KH"] - 1 - rkh if G["sh"] == 1 else rkh
    kw = G["KW"] - 1 - rkw if G["sw"] == 1 else rkw
    ro = te.reduce_axis((0, Og), "ro") if Og > 1 else None

    def f(n, h, wp, c):
        vh, oh = _tap(h, kh, G["pt"], G["dh"], G["sh"], G["oh"])
        vw, ow = _tap(wp, kw, G["pl"], G["dw"], G["sw"], G["ow"])
        if G["g"] == 1:
            g, i = 0, c
        else:
            g, i = (c // I, c % I) if I > 1 else (c, 0)
        o = g * Og + (ro if ro is not None else 0)
        v = tirx.if_then_else(tirx.all(vh, vw), _cast(gy[n, oh, ow, o], ad), _c(0, ad))
        axes = [rkh, rkw] + ([ro] if ro is not None else [])
        return te.sum(v * _cast(w[o, kh, kw, i], ad), axis=axes)
    y = te.compute(out.shape, f, name="conv2d_grad_input")
    return y if ad == out.dtype else te.compute(out.shape, lambda *i: y(*i).astype(out.dtype), name="cgi_cast")


@deflower("conv2d_grad_weight", BACKEND)
def _conv2d_grad_weight(xs, a, out):
    x, gy = xs
    G = conv_geometry(_shape(x), tuple(a["weight_shape"]), a)
    I, Og = G["I"], G["O"] // G["g"]
    ad = acc_dtype(x.dtype)
    rn = te.reduce_axis((0, G["N"]), "rn")
    rh = te.reduce_axis((0, G["oh"]), "rh")
    rw = te.reduce_axis((0, G["ow"]), "rw")

    def f(o, kh, kw, i):
        h = rh * G["sh"] + kh * G["dh"] - G["pt"]
        wv = rw * G["sw"] + kw * G["dw"] - G["pl"]
        c = (o // Og) * I + i if G["g"] > 1 else i
        xv = tirx.if_then_else(_in_bounds(h, wv, G["H"], G["W"]), _cast(x[rn, h, wv, c], ad), _c(0, ad))
        return te.sum(xv * _cast(gy[rn, rh, rw, o], ad), axis=[rn, rh, rw])
    y = te.compute(out.shape, f, name="conv2d_grad_weight")
    return y if ad == out.dtype else te.compute(out.shape, lambda *i: y(*i).astype(out.dtype), name="cgw_cast")


# ---- pooling ----------------------------------------------------------------------------------
def _count(o, stride, pad, k, size):
    lo = o * stride - pad
    return te.min(lo + k, size) - te.max(lo, 0)


def _avg_divisor(G, a, oh, ow, dtype):
    if a["count_include_pad"]:
        return _c(G["KH"] * G["KW"], dtype)
    return (_count(oh, G["sh"], G["pt"], G["KH"], G["H"]) * _count(ow, G["sw"], G["pl"], G["KW"], G["W"])).astype(dtype)


@deflower("avg_pool2d", BACKEND)
def _avg_pool(xs, a, out):
    x = xs[0]
    G = pool_geometry(_shape(x), a)
    ad = acc_dtype(x.dtype)
    kh = te.reduce_axis((0, G["KH"]), "kh")
    kw = te.reduce_axis((0, G["KW"]), "kw")

    def f(n, oh, ow, c):
        h, wv = oh * G["sh"] + kh - G["pt"], ow * G["sw"] + kw - G["pl"]
        return te.sum(tirx.if_then_else(_in_bounds(h, wv, G["H"], G["W"]), _cast(x[n, h, wv, c], ad), _c(0, ad)),
                      axis=[kh, kw])
    s = te.compute(out.shape, f, name="avg_pool_sum")
    return te.compute(out.shape, lambda n, oh, ow, c: _cast(s[n, oh, ow, c] / _avg_divisor(G, a, oh, ow, ad), out.dtype),
                      name="avg_pool2d")


@deflower("avg_pool2d_grad", BACKEND)
def _avg_pool_grad(xs, a, out):
    gy = xs[0]
    G = pool_geometry(tuple(a["input_shape"]), a)
    ad = acc_dtype(gy.dtype)
    kh = te.reduce_axis((0, G["KH"]), "kh")
    kw = te.reduce_axis((0, G["KW"]), "kw")

    def f(n, h, wp, c):
        vh, oh = _tap(h, kh, G["pt"], 1, G["sh"], G["oh"])
        vw, ow = _tap(wp, kw, G["pl"], 1, G["sw"], G["ow"])
        v = tirx.if_then_else(tirx.all(vh, vw), _cast(gy[n, oh, ow, c], ad) / _avg_divisor(G, a, oh, ow, ad),
                              _c(0, ad))
        return te.sum(v, axis=[kh, kw])
    y = te.compute(out.shape, f, name="avg_pool2d_grad")
    return y if ad == out.dtype else te.compute(out.shape, lambda *i: y(*i).astype(out.dtype), name="apg_cast")


def _lowest(dtype):
    dtype = str(dtype)
    return tirx.min_value(dtype) if "float" not in dtype else _c(-math.inf, dtype)


def _window_max(x, G, name):
    kh = te.reduce_axis((0, G["KH"]), "kh")
    kw = te.reduce_axis((0, G["KW"]), "kw")
    low = _lowest(x.dtype)

    def f(n, oh, ow, c):
        h, wv = oh * G["sh"] + kh - G["pt"], ow * G["sw"] + kw - G["pl"]
        return te.max(tirx.if_then_else(_in_bounds(h, wv, G["H"], G["W"]), x[n, h, wv, c], low), axis=[kh, kw])
    return te.compute((G["N"], G["oh"], G["ow"], G["C"]), f, name=name)


def _window_argmax(x, G):
    """Flat tap index (kh * KW + kw) of each window's first maximum (row-major), as the NumPy
    reference's ``_argmax_index``: the smallest tap whose value equals the window maximum."""
    m = _window_max(x, G, "pool_max")
    kh = te.reduce_axis((0, G["KH"]), "akh")
    kw = te.reduce_axis((0, G["KW"]), "akw")
    big = G["KH"] * G["KW"]
    low = _lowest(x.dtype)

    def f(n, oh, ow, c):
        h, wv = oh * G["sh"] + kh - G["pt"], ow * G["sw"] + kw - G["pl"]
        v = tirx.if_then_else(_in_bounds(h, wv, G["H"], G["W"]), x[n, h, wv, c], low)
        return te.min(tirx.Select(v == m[n, oh, ow, c], kh * G["KW"] + kw, big), axis=[kh, kw])
    return te.compute(m.shape, f, name="pool_argmax")


@deflower("max_pool2d", BACKEND)
def _max_pool(xs, a, out):
    x = xs[0]
    return _window_max(x, pool_geometry(_shape(x), a), "max_pool2d")


def _argmax_taps(x, a, dtype):
    """What routing a gradient through max_pool2d's argmax needs: the window geometry, each
    window's argmax tap, the accumulation dtype for ``dtype`` and the (kh, kw) reduce axes."""
    G = pool_geometry(_shape(x), a)
    return (G, _window_argmax(x, G), acc_dtype(dtype), te.reduce_axis((0, G["KH"]), "kh"),
            te.reduce_axis((0, G["KW"]), "kw"))


@deflower("max_pool2d_grad", BACKEND)
def _max_pool_grad(xs, a, out):
    x, gy = xs
    G, idx, ad, kh, kw = _argmax_taps(x, a, gy.dtype)

    def f(n, h, wp, c):
        vh, oh = _tap(h, kh, G["pt"], 1, G["sh"], G["oh"])
        vw, ow = _tap(wp, kw, G["pl"], 1, G["sw"], G["ow"])
        hit = tirx.all(vh, vw)
        v = tirx.if_then_else(hit, tirx.Select(idx[n, oh, ow, c] == kh * G["KW"] + kw,
                                               _cast(gy[n, oh, ow, c], ad), _c(0, ad)), _c(0, ad))
        return te.sum(v, axis=[kh, kw])
    y = te.compute(out.shape, f, name="max_pool2d_grad")
    return y if ad == out.dtype else te.compute(out.shape, lambda *i: y(*i).astype(out.dtype), name="mpg_cast")


@deflower("max_pool2d_gather", BACKEND)
def _max_pool_gather(xs, a, out):
    x, g = xs
    G, idx, ad, kh, kw = _argmax_taps(x, a, g.dtype)

    def f(n, oh, ow, c):
        h, wv = oh * G["sh"] + kh - G["pt"], ow * G["sw"] + kw - G["pl"]
        take = tirx.all(_in_bounds(h, wv, G["H"], G["W"]), idx[n, oh, ow, c] == kh * G["KW"] + kw)
        return te.sum(tirx.if_then_else(take, _cast(g[n, h, wv, c], ad), _c(0, ad)), axis=[kh, kw])
    y = te.compute(out.shape, f, name="max_pool2d_gather")
    return y if ad == out.dtype else te.compute(out.shape, lambda *i: y(*i).astype(out.dtype), name="mpga_cast")


# ---- reductions and softmax -------------------------------------------------------------------
def _reduce(x, axes, keepdims, kind, name):
    shape = _shape(x)
    axes = norm_axes(axes, len(shape), name)
    ad = acc_dtype(x.dtype) if kind != "max" else str(x.dtype)
    rax = {ax: te.reduce_axis((0, shape[ax]), f"r{ax}") for ax in axes}
    oshape = reduced_shape(shape, axes, keepdims)

    def f(*i):
        it = iter(i)
        idx = []
        for d in range(len(shape)):
            if d in rax:
                idx.append(rax[d])
                if keepdims:
                    next(it)
            else:
                idx.append(next(it))
        v = _cast(x(*idx), ad)
        r = [rax[d] for d in axes]
        if not r:
            return v
        return te.max(v, axis=r) if kind == "max" else te.sum(v, axis=r)
    return te.compute(oshape, f, name=name), math.prod(shape[d] for d in axes)


@deflower("sum", BACKEND)
def _sum(xs, a, out):
    y, _ = _reduce(xs[0], a["axes"], a["keepdims"], "sum", "sum")
    return y if str(y.dtype) == out.dtype else te.compute(out.shape, lambda *i: y(*i).astype(out.dtype), name="sum_cast")


@deflower("mean", BACKEND)
def _mean(xs, a, out):
    y, count = _reduce(xs[0], a["axes"], a["keepdims"], "sum", "mean_sum")
    return te.compute(out.shape, lambda *i: _cast(y(*i) / _c(count, y.dtype), out.dtype), name="mean")


@deflower("max", BACKEND)
def _max(xs, a, out):
    return _reduce(xs[0], a["axes"], a["keepdims"], "max", "max")[0]


def _softmax_parts(x, axis):
    shape = _shape(x)
    ax = axis % len(shape)
    ad = acc_dtype(x.dtype)
    m, _ = _reduce(x, [ax], True, "max", "softmax_max")

    def kidx(i):
        return [0 if d == ax else i[d] for d in range(len(shape))]
    rk = te.reduce_axis((0, shape[ax]), "rk")

    def at_k(i):
        return [rk if d == ax else i[d] for d in range(len(shape))]
    s = te.compute(m.shape, lambda *i: te.sum(te.exp(_cast(x(*at_k(i)), ad) - _cast(m(*i), ad)), axis=rk),
                   name="softmax_expsum")
    return shape, ad, m, s, kidx


@deflower("softmax", BACKEND)
def _softmax(xs, a, out):
    x = xs[0]
    shape, ad, m, s, kidx = _softmax_parts(x, a["axis"])
    return te.compute(shape, lambda *i: _cast(te.exp(_cast(x(*i), ad) - _cast(m(*kidx(i)), ad)) / s(*kidx(i)),
                                              out.dtype), name="softmax")


@deflower("log_softmax", BACKEND)
def _log_softmax(xs, a, out):
    x = xs[0]
    shape, ad, m, s, kidx = _softmax_parts(x, a["axis"])
    return te.compute(shape, lambda *i: _cast((_cast(x(*i), ad) - _cast(m(*kidx(i)), ad)) - te.log(s(*kidx(i))),
                                              out.dtype), name="log_softmax")


# ---- data movement ----------------------------------------------------------------------------
def _unravel(flat, shape):
    idx = []
    for s in reversed(shape):
        idx.append(tirx.floormod(flat, s) if s != 1 else 0)
        flat = tirx.floordiv(flat, s) if s != 1 else flat
    return list(reversed(idx))


@deflower("reshape", BACKEND)
def _reshape(xs, a, out):
    x = xs[0]
    ishape = _shape(x)
    oshape = resolve_shape(a["shape"], math.prod(ishape))

    def f(*i):
        flat = 0
        for d, s in zip(i, oshape):
            flat = flat * s + d
        return x(*_unravel(flat, ishape))
    return te.compute(oshape, f, name="reshape")


@deflower("transpose", BACKEND)
def _transpose(xs, a, out):
    x = xs[0]
    nd = len(x.shape)
    perm = a["perm"] if a["perm"] is not None else list(reversed(range(nd)))

    def f(*i):
        idx = [None] * nd
        for o, p in enumerate(perm):
            idx[p] = i[o]
        return x(*idx)
    return te.compute(out.shape, f, name="transpose")


@deflower("broadcast_to", BACKEND)
def _broadcast_to(xs, a, out):
    x = xs[0]
    return te.compute(out.shape, lambda *i: _bidx(x, out.shape, i), name="broadcast_to")


@deflower("concat", BACKEND)
def _concat(xs, a, out):
    ax = a["axis"] % len(out.shape)
    offs = np.cumsum([0] + [int(x.shape[ax]) for x in xs]).tolist()

    def f(*i):
        v = None
        for k in reversed(range(len(xs))):   # innermost select: the last operand
            idx = list(i)
            idx[ax] = i[ax] - offs[k]
            val = xs[k](*idx)
            v = val if v is None else tirx.if_then_else(i[ax] < offs[k + 1], val, v)
        return v
    return te.compute(out.shape, f, name="concat")


@deflower("pad", BACKEND)
def _pad(xs, a, out):
    x = xs[0]
    p = a["pads"]
    shape = _shape(x)
    value = _c(a["value"], x.dtype) if str(x.dtype) != "bool" else tirx.const(bool(a["value"]), "bool")

    def f(*i):
        src = [i[d] - p[2 * d] for d in range(len(shape))]
        ok = tirx.all(*[tirx.all(s >= 0, s < n) for s, n in zip(src, shape)]) if shape else tirx.const(True, "bool")
        return tirx.if_then_else(ok, x(*src), value)
    return te.compute(out.shape, f, name="pad")


def _slice_spec(a, shape):
    st = list(a["strides"] or [1] * len(shape))
    return list(a["begin"]), st


@deflower("slice", BACKEND)
def _slice(xs, a, out):
    x = xs[0]
    b, st = _slice_spec(a, _shape(x))
    return te.compute(out.shape, lambda *i: x(*[b[d] + i[d] * st[d] for d in range(len(i))]), name="slice")


@deflower("slice_grad", BACKEND)
def _slice_grad(xs, a, out):
    x = xs[0]
    shape = tuple(a["shape"])
    b, st = _slice_spec(a, shape)
    n = _shape(x)

    def f(*i):
        t = [i[d] - b[d] for d in range(len(shape))]
        q = [tirx.floordiv(t[d], st[d]) for d in range(len(shape))]
        ok = tirx.all(*[tirx.all(t[d] >= 0, tirx.floormod(t[d], st[d]) == 0, q[d] < n[d]) for d in range(len(shape))])
        return tirx.if_then_else(ok, x(*q), _c(0, x.dtype))
    return te.compute(out.shape, f, name="slice_grad")


# ---- whole graphs -----------------------------------------------------------------------------
def lowering(op: str):
    return get_op(op).lower.get(BACKEND)


def missing_lowerings(graph: Graph):
    """[(node name, op)] of nodes whose op has no TE rule."""
    return [(n.name, n.op) for n in graph.nodes if lowering(n.op) is None]


def check_lowerable(graph: Graph, target="a server target"):
    """Raise NotImplementedError naming the first node (and op) without a TE definition."""
    for k, n in enumerate(graph.nodes):
        if lowering(n.op) is None:
            have = sorted(o for o in _all_ops() if lowering(o) is not None)
            raise NotImplementedError(
                f"TE lowering for '{n.op}' not implemented: node {k} {n.name!r} of graph {graph.name!r} "
                f"cannot be compiled for {target} (ops with TE definitions: {', '.join(have)}; "
                f"add one with deflower('{n.op}', 'te') in backends/tvm_te.py)")
        for i in n.inputs:
            t = graph.types[i]
            if t.quant is not None:
                raise NotImplementedError(
                    f"node {n.name!r} ({n.op}) has a quantised operand {i!r} ({t}); {target} compiles float "
                    f"graphs only (int8 graphs go to the C backend)")


def _all_ops():
    from kiln.frontend.registry import OPS
    return OPS


def storage_dtype(t, dtype):
    """Storage dtype of a value of type ``t`` when the target stores floats in ``dtype``."""
    return dtype if t.dtype == "float32" and dtype != "float32" else t.dtype


def folded_consts(graph: Graph):
    """Constants folded into kernels as immediates: single-element literal constants that are not
    buffers (not updated in train mode, not module state). Everything else is a runtime argument,
    so compiled code does not depend on parameter or buffer values."""
    out = {}
    for name, v in graph.consts.items():
        if v.size == 1 and name not in graph.updates and "." not in name and graph.types[name].dtype != "bfloat16":
            out[name] = v
    return out


def graph_signature(graph: Graph, dtype="float32", extra=None):
    """Hash of the graph structure: inputs/param/const types, nodes, outputs, folded scalar
    constants. Parameter and buffer values are not part of it."""
    folded = folded_consts(graph)
    d = {
        "inputs": [(i, graph.types[i].to_json()) for i in graph.inputs],
        "tensors": [(k, graph.types[k].to_json()) for k in list(graph.params) + list(graph.consts) if k not in folded],
        "folded": sorted((k, np.asarray(v).ravel().tolist(), str(np.asarray(v).dtype)) for k, v in folded.items()),
        "nodes": [(n.name, n.op, list(n.inputs), n.attrs) for n in graph.nodes],
        "outputs": list(graph.outputs),
        "updates": sorted(graph.updates.items()),
        "dtype": dtype,
        "extra": extra,
        "tvm": tvm.__version__,
    }
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:24]


def runtime_args(graph: Graph):
    """Names of the compiled function's arguments, in order: graph inputs, then parameters and
    constants that are not folded."""
    folded = folded_consts(graph)
    return list(graph.inputs) + [k for k in list(graph.params) + list(graph.consts) if k not in folded]


def const_stage(shape, value, dtype, name):
    """A TE stage holding ``value`` everywhere (inlined into its consumer by any schedule)."""
    if dtype == "bool":
        value = bool(value)
    return te.compute(tuple(shape), lambda *_: tirx.const(value, dtype), name=name)


def node_te(graph: Graph, node, te_inputs, dtype="float32"):
    """Build the TE of one node from TE tensors of its inputs (folded scalars become constant stages)."""
    rule = lowering(node.op)
    if rule is None:
        check_lowerable(graph)
    folded = folded_consts(graph)
    xs = []
    for i in node.inputs:
        if i in te_inputs:
            xs.append(te_inputs[i])
        else:
            v = np.asarray(folded[i])
            t = graph.types[i]
            dt = storage_dtype(t, dtype)
            xs.append(const_stage(t.shape, v.ravel()[0].item(), dt, f"const_{_safe(i)}"))
    out = graph.types[node.name]
    out = type(out)(out.shape, storage_dtype(out, dtype))
    try:
        return rule(xs, node.attrs, out)
    except NotImplementedError:
        raise
    except Exception as e:
        raise RuntimeError(f"TE lowering of node {node.name!r} ({node.op}, attrs {node.attrs}) failed: "
                           f"{type(e).__name__}: {e}") from e


def to_relax(graph: Graph, dtype="float32", with_updates=False):
    """Relax module whose ``main`` takes ``runtime_args(graph)`` and returns a tuple of the graph
    outputs (then the buffer updates when ``with_updates``). One ``emit_te`` per node: Relax's
    FuseOps/FuseTIR merge element-wise epilogues into their producers afterwards."""
    from tvm import relax
    check_lowerable(graph)
    bb = relax.BlockBuilder()
    names = runtime_args(graph)
    rvars = {}
    for n in names:
        t = graph.types[n]
        rvars[n] = relax.Var(_safe(n), relax.TensorType(t.shape, storage_dtype(t, dtype)))
    outs = list(graph.outputs) + (list(graph.updates.values()) if with_updates else [])
    with bb.function("main", [rvars[n] for n in names]):
        with bb.dataflow():
            for node in graph.nodes:
                args = [i for i in node.inputs if i in rvars]

                def fte(*tensors, _node=node, _args=args):
                    return node_te(graph, _node, dict(zip(_args, tensors)), dtype)
                rvars[node.name] = bb.emit_te(fte, *[rvars[i] for i in args],
                                              primfunc_name_hint=_safe(node.name))
            res = []
            for o in outs:
                if o not in rvars:   # an output that is a folded constant
                    t = graph.types[o]
                    stage = const_stage(t.shape, np.asarray(graph.consts[o]).ravel()[0].item(),
                                        storage_dtype(t, dtype), "const")
                    rvars[o] = bb.emit_te(lambda: stage, primfunc_name_hint=_safe(o))
                res.append(rvars[o])
            gv = bb.emit_output(relax.Tuple(res))
        bb.emit_func_output(gv)
    return bb.get()


def _safe(name):
    s = "".join(ch if ch.isalnum() else "_" for ch in name)
    return s if s and not s[0].isdigit() else "v_" + s


# ---- dropout: the mask is made on the host ----------------------------------------------------
def externalize_dropout(graph: Graph):
    """Dropout's mask comes from NumPy's generator seeded by (key, salt) (the reference), which a
    kernel cannot reproduce. Rewrite every ``dropout(x, key)`` into ``mul(x, mask)`` where ``mask``
    is a new graph input that the runner computes on the host with the reference's
    ``dropout_mask`` (so compiled dropout matches the reference exactly). Returns (graph, masks)
    with masks [{name, key, shape, salt, rate, dtype}]; the graph is unchanged when it has no
    dropout."""
    if not any(n.op == "dropout" for n in graph.nodes):
        return graph, []
    from kiln.frontend.graph import Node
    from kiln.frontend.types import TensorType
    g = graph.copy()
    masks, by_spec, nodes = [], {}, []
    for n in g.nodes:
        if n.op != "dropout":
            nodes.append(n)
            continue
        x, key = n.inputs
        t = g.types[x]
        spec = (key, t.shape, n.attrs["salt"], float(n.attrs["rate"]), t.dtype)
        if spec not in by_spec:
            name = f"{key}.mask{len(masks)}"
            g.types[name] = TensorType(t.shape, t.dtype)
            g.inputs.append(name)
            by_spec[spec] = name
            masks.append({"name": name, "key": key, "shape": list(t.shape), "salt": spec[2], "rate": spec[3],
                          "dtype": t.dtype})
        nodes.append(Node(n.name, "mul", [x, by_spec[spec]], {}))
    g.nodes = nodes
    g._producer = {}
    g.meta = dict(g.meta, dropout_masks=masks)
    return g.validate(), masks


def mask_values(masks, feeds):
    """{mask input name: array} for the masks of ``externalize_dropout`` from the key inputs."""
    from kiln.frontend.ops.nn import dropout_mask
    return {m["name"]: dropout_mask(tuple(m["shape"]), np.asarray(feeds[m["key"]]), m["salt"], m["rate"],
                                    m["dtype"]) for m in masks}
