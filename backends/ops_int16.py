"""C lowerings of TFLite's int16 (16x8) kernels that the per-family modules (``ops_elementwise.py``,
``ops_nn.py``, ...) do not cover: each is the int16 branch of an op whose other dtypes keep their
own rule (``int16_first``). The arithmetic is the op's int16 reference
(``frontend/ops/elementwise_int16.py``), with the same compile-time multipliers."""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from kiln.frontend.ops.elementwise import ADD_LEFT_SHIFT_16
from kiln.frontend.ops.elementwise_int8 import leaky_params
from kiln.frontend.ops.elementwise_int16 import prelu16_params, sqdiff16_params, sub16_params
from kiln.frontend.ops.nn import conv_geometry
from kiln.frontend.ops.transpose_conv import cgi_attrs
from kiln.frontend.registry import OPS

from . import ops_elementwise, ops_linalg, ops_misc, ops_nn, ops_shape, qmath  # noqa: F401  (rules int16_first wraps)
from .lower import BACKEND, PENDING, lower_rule
from .ops_elementwise import _load, _out_shape
from .ops_nn import _bias64, requant16_epilogue
from .qmath import c

QMIN16, QMAX16 = -32768, 32767


def _is16(t):
    return t.dtype == "int16" and t.quant is not None


def int16_first(op_name, claims=None, hints=True):
    """Decorator: ``fn(k, node, xs)`` lowers ``op_name`` when ``claims(input 0 type, output type)``
    (default: either is a quantised int16 tensor); any other node goes to the rule registered
    before (or the TE compute). ``hints``: the op's usual in-place hints (element-wise ops)."""
    claims = claims or (lambda t0, ty: _is16(t0) or _is16(ty))

    def deco(fn):
        prev = OPS[op_name].lower.get(BACKEND) if op_name in OPS else PENDING.get(op_name)

        def rule(k, node, xs):
            if claims(k.type(node.inputs[0]), k.type(node.name)):
                if hints:
                    k.inplace_hints_of_op()
                return fn(k, node, xs)
            return prev(k, node, xs) if prev is not None else None
        rule.__name__ = f"lower_{op_name}_int16_first"
        lower_rule(op_name)(rule)
        return fn
    return deco


def _io16(k, node, n):
    """(types of inputs 0..n-1 and the output), each per-tensor quantised int16, or a LoweringError."""
    ts = [k.type(v) for v in node.inputs[:n]] + [k.type(node.name)]
    for t in ts:
        if t.dtype != "int16" or t.quant is None or (t.quant.per_channel and len(t.quant.scale) != 1):
            k.fail(f"int16 {node.op} needs per-tensor quantised int16 operands, got {t}")
    return ts


def _sz(t):
    return float(np.float32(t.quant.scale[0])), int(t.quant.zero_point[0])


def _clamp16(v):
    return qmath.clamp(v, QMIN16, QMAX16).astype("int16")


# ---- sub: TFLM's SubElementwise / BroadcastQuantSubSlow with left_shift 15 ------------------------
@int16_first("sub")
def lower_sub16(k, node, xs):
    t1, t2, ty = _io16(k, node, 2)
    (s1, z1), (s2, z2), (so, zo) = _sz(t1), _sz(t2), _sz(ty)
    (m1, sh1), (m2, sh2), (mo, sho) = sub16_params(s1, s2, so)
    a, b = xs

    def scaled(x, t, z, m, sh, i):
        return qmath.mbqm((_load(x, t, ty, i).astype("int32") - c(z)) * c(1 << ADD_LEFT_SHIFT_16), c(m), sh)

    def body(*i):
        return qmath.let("s1", scaled(a, t1, z1, m1, sh1, i), lambda u1: qmath.let(
            "s2", scaled(b, t2, z2, m2, sh2, i), lambda u2: _clamp16(qmath.mbqm(u1 - u2, c(mo), sho) + c(zo))))
    return te.compute(_out_shape(ty), body, name="sub16")


# ---- leaky_relu: QuantizeLeakyRelu<int16_t> ----------------------------------------------------------
@int16_first("leaky_relu")
def lower_leaky_relu16(k, node, xs):
    tx, ty = _io16(k, node, 1)
    (si, zi), (so, zo) = _sz(tx), _sz(ty)
    (mi, ei), (ma, ea) = leaky_params(si, so, node.attrs["alpha"])
    x = xs[0]

    def neg(v):             # elementwise_int8.leaky_apply: a negative multiplier by magnitude, negated
        return c(0) - qmath.mbqm(v, c(-ma), ea) if ma < 0 else qmath.mbqm(v, c(ma), ea)

    def body(*i):
        return qmath.let("v", x(*i).astype("int32") - c(zi), lambda v: _clamp16(tirx.Select(
            v >= c(0), qmath.mbqm(v, c(mi), ei), neg(v)) + c(zo)))
    return te.compute(_out_shape(ty), body, name="leaky_relu16")


# ---- transpose_conv2d 16x8: reference_integer_ops::TransposeConv<int64_t> ----------------------------
@int16_first("transpose_conv2d", hints=False)
def lower_transpose_conv16(k, node, xs):
    """Each output gathers the taps TFLite's scatter adds to it: out[oy] += x[iy] * w[ky] where
    oy = iy * stride - pad + ky. int32 accumulation where constant weights bound the sum below
    2^31 (the value TFLite's int64 scratch holds), int64 otherwise."""
    x, w = xs[0], xs[1]
    tx, tw, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
    if not _is16(tx) or not _is16(ty) or tw.dtype != "int8" or tw.quant is None:
        k.fail(f"16x8 transpose_conv2d needs quantised int16 input and output and int8 weights, got {tx}, {tw}, {ty}")
    if any(z != 0 for z in tw.quant.zero_point) or int(tx.quant.zero_point[0]) != 0:
        k.fail("16x8 kernels need symmetric weights and an input zero point of 0 (TFLite)")
    O, KH, KW, I = tw.shape
    G = conv_geometry(tuple(ty.shape), (I, KH, KW, O), cgi_attrs(node.attrs))
    sh, sw, pt, pl, H, W = G["sh"], G["sw"], G["pt"], G["pl"], tx.shape[1], tx.shape[2]
    wv = k.value(node.inputs[1])
    wide = wv is None or (np.abs(np.asarray(wv, np.int64)).reshape(O, -1).sum(axis=1) * 32768).max() >= 2 ** 31
    adt = "int64" if wide else "int32"
    ky, kx, kc = te.reduce_axis((0, KH), "ky"), te.reduce_axis((0, KW), "kx"), te.reduce_axis((0, I), "kc")

    def tap(n, oy, ox, o):
        ty_, tx_ = oy + c(pt) - ky, ox + c(pl) - kx
        iy, ix = tirx.floordiv(ty_, c(sh)), tirx.floordiv(tx_, c(sw))
        ok = tirx.all(tirx.floormod(ty_, c(sh)) == c(0), tirx.floormod(tx_, c(sw)) == c(0),
                      iy >= c(0), iy < c(H), ix >= c(0), ix < c(W))
        prod = x[n, iy, ix, kc].astype("int32").astype(adt) * w[o, ky, kx, kc].astype("int32").astype(adt)
        return tirx.if_then_else(ok, prod, tirx.const(0, adt))
    acc = te.compute(ty.shape, lambda n, oy, ox, o: te.sum(tap(n, oy, ox, o), axis=[ky, kx, kc]), name="tacc")
    if not wide:
        acc = te.compute(acc.shape, lambda *i: acc(*i).astype("int64"), name="tacc64")
    bias = _bias64(k, node, O)
    if bias is not None:
        acc = te.compute(acc.shape, lambda n, oy, ox, o: acc[n, oy, ox, o] + bias(o), name="tbias")
    k.macs(int(np.prod(tx.shape)) * KH * KW * O)
    mult, shift = qmath.linear_requant(tx, tw, ty, O)
    return requant16_epilogue(k, acc, mult, shift, ty, lambda idx: idx[3], node.attrs["activation"])


# ---- quantize with an int32 side: reference_ops::Requantize (TFLite Micro) ---------------------------
def _int32_side(tx, ty):
    return "int32" in (tx.dtype, ty.dtype) and tx.quant is not None and ty.quant is not None


@int16_first("quantize", claims=_int32_side, hints=False)
def lower_quantize_int32(k, node, xs):
    """int32 -> int8/int16 and int8/int16 -> int32: (x - z_in) times the multiplier of
    s_in / s_out (double), + z_out, clamped to the output type."""
    tx, ty = k.type(node.inputs[0]), k.type(node.name)
    if tx.dtype not in ("int8", "int16", "int32") or ty.dtype not in ("int8", "int16", "int32") or \
            tx.dtype == ty.dtype == "int32":
        k.fail(f"quantize {tx} -> {ty}: TFLite Micro requantises int32 to int8/int16 and int8/int16 to int32")
    (si, zi), (so, zo) = _sz(tx), _sz(ty)
    m, sh = qmath.quantize_multiplier(si / so)
    lo, hi = int(np.iinfo(ty.dtype).min), int(np.iinfo(ty.dtype).max)
    x = xs[0]

    def body(*i):
        v = qmath.mbqm(x(*i).astype("int32") - c(zi), c(m), sh) + c(zo)
        return v if ty.dtype == "int32" else qmath.clamp(v, lo, hi).astype(ty.dtype)
    return te.compute(_out_shape(ty), body, name="requantize32")


# ---- maximum / minimum / abs / squared_difference / prelu (frontend/ops/elementwise_int16.py) --------
def _minmax16(fn):
    def lower(k, node, xs):
        t1, t2, ty = _io16(k, node, 2)
        a, b = xs
        if node.inputs[0] == node.inputs[1]:     # max(x, x) = x (gcc -Werror rejects the self-comparison)
            return te.compute(_out_shape(ty), lambda *i: _load(a, t1, ty, i), name=node.op + "16")
        return te.compute(_out_shape(ty), lambda *i: fn(_load(a, t1, ty, i), _load(b, t2, ty, i)), name=node.op + "16")
    return lower


int16_first("maximum")(_minmax16(tirx.max))
int16_first("minimum")(_minmax16(tirx.min))


@int16_first("abs")
def lower_abs16(k, node, xs):
    tx, ty = _io16(k, node, 1)
    (si, _), (so, _) = _sz(tx), _sz(ty)
    x = xs[0]

    def body(*i):
        v = qmath.let("av", x(*i).astype("int32"), lambda u: tirx.Select(u < c(0), -u, u))
        if np.float32(si) != np.float32(so):
            m, e = qmath.quantize_multiplier(float(np.float32(si) / np.float32(so)))
            v = qmath.mbqm(v, c(m), e)
        return _clamp16(v)
    return te.compute(_out_shape(ty), body, name="abs16")


@int16_first("squared_difference")
def lower_sqdiff16(k, node, xs):
    t1, t2, ty = _io16(k, node, 2)
    (s1, _), (s2, _), (so, _) = _sz(t1), _sz(t2), _sz(ty)
    (m1, e1), (m2, e2), (mo, eo) = sqdiff16_params(s1, s2, so)
    a, b = xs

    def body(*i):
        d = (qmath.mbqm(_load(a, t1, ty, i).astype("int32"), c(m1), e1)
             - qmath.mbqm(_load(b, t2, ty, i).astype("int32"), c(m2), e2))
        return qmath.let("d", d, lambda dv: _clamp16(qmath.mbqm(dv * dv, c(mo), eo)))
    return te.compute(_out_shape(ty), body, name="squared_difference16")


@int16_first("prelu")
def lower_prelu16(k, node, xs):
    tx, ta, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
    if not (_is16(tx) and _is16(ty)) or ta.dtype != "int8" or ta.quant is None:
        k.fail(f"int16 prelu needs int16 input and output and a quantised int8 alpha, got {tx}, {ta}, {ty}")
    (si, zi), (sa, za), (so, zo) = _sz(tx), _sz(ta), _sz(ty)
    (m1, e1), (m2, e2) = prelu16_params(si, sa, so)
    x, al = xs

    def body(*i):
        def on(v):
            neg = qmath.mbqm(v * (_load(al, ta, ty, i).astype("int32") - c(za)), c(m2), e2)
            return _clamp16(tirx.Select(v >= c(0), qmath.mbqm(v, c(m1), e1), neg) + c(zo))
        return qmath.let("v", _load(x, tx, ty, i).astype("int32") - c(zi), on)
    return te.compute(_out_shape(ty), body, name="prelu16")


# ---- matmul: TFLite Micro's BatchMatMul<int16_t, int64_t> ----------------------------------------------
@int16_first("matmul", hints=False)
def lower_matmul16(k, node, xs):
    ta, tb, ty = _io16(k, node, 2)
    if any(int(t.quant.zero_point[0]) for t in (ta, tb, ty)):
        k.fail("int16 matmul needs zero points of 0 (TFLite)")
    a, b = xs
    nb = len(ty.shape) - 2
    kk = te.reduce_axis((0, int(ta.shape[-1])), "k")

    def bidx(t, bi):
        lead = nb - (len(t.shape) - 2)
        return [0 if int(t.shape[j]) == 1 else bi[lead + j] for j in range(len(t.shape) - 2)]

    def f(*i):
        ai, bj = bidx(ta, i[:nb]) + [i[-2], kk], bidx(tb, i[:nb]) + [kk, i[-1]]
        return te.sum(a(*ai).astype("int32").astype("int64") * b(*bj).astype("int32").astype("int64"), axis=kk)
    acc = te.compute(ty.shape, f, name="macc16")
    k.macs(int(np.prod(ty.shape)) * int(ta.shape[-1]))
    (sa, _), (sb, _), (so, _) = _sz(ta), _sz(tb), _sz(ty)
    m, s = qmath.quantize_multiplier(float(np.float32(np.float32(sa) * np.float32(sb))) / so)
    return requant16_epilogue(k, acc, np.asarray([m], np.int64), np.asarray([s], np.int64), ty, lambda idx: 0, "none")
