"""C overrides of element-wise ops: int8 with TFLite's ADD/MUL rescaling, and a 256-entry table
for the unary int8 ops, built at compile time from the op's int8 reference so it is bit-exact by
construction. Float (and every other element-wise op) is the op's TE compute (``lower.lower_te``)."""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from kiln.frontend.fixedpoint import get_reciprocal
from kiln.frontend.ops.elementwise import ADD_LEFT_SHIFT, ADD_LEFT_SHIFT_16, add_params, mul_params
from kiln.frontend.ops.elementwise_int8 import (
    SQDIFF_LEFT_SHIFT,
    count_leading_sign_bits,
    div_params,
    prelu_params,
    sqdiff_params,
    sub_params,
)
from kiln.frontend.ops.int16util import SIGMOID_TABLE_U16, checked_log2, lut_activation_params
from kiln.frontend.registry import get_op

from . import qmath
from .lower import lower_rule
from .qmath import c


def _q(k, node):
    return any(k.type(v).quant is not None for v in list(node.inputs) + [node.name])


def _bcast_index(t_in, t_out, idx):
    off = len(t_out.shape) - len(t_in.shape)
    return tuple(0 if t_in.shape[d] == 1 and t_out.shape[off + d] != 1 else idx[off + d]
                 for d in range(len(t_in.shape)))


def _load(x, t_in, t_out, idx):
    if not t_in.shape:
        return x[0]
    return x[_bcast_index(t_in, t_out, idx)]


def _out_shape(t):
    return t.shape or (1,)


# ---- unary ----------------------------------------------------------------------------------
# unary ops with an int8 kernel: a clamp (relu/relu6 on one quantisation) or a table
_UNARY = ("neg", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "relu6", "pow")


def int8_table(k, node):
    """Evaluate the op's int8 reference on all 256 int8 inputs (compile time)."""
    op = get_op(node.op)
    if op.int8_ref is None:
        k.fail(f"int8 {node.op} needs the op's int8 reference (kiln.quantize) to build its table")
    xs = np.arange(-128, 128, dtype=np.int8)
    tin = k.type(node.inputs[0])
    tout = k.type(node.name)
    t_in = tin.with_shape((256,))
    t_out = tout.with_shape((256,))
    y = op.int8_ref([xs], node.attrs, [t_in], t_out)
    return np.asarray(y).astype(tout.dtype)


def _unary_rule(name):
    def rule(k, node, xs):
        if not _q(k, node):
            return None                      # float: the op's TE compute
        x = xs[0]
        tx, ty = k.type(node.inputs[0]), k.type(node.name)
        k.inplace_hints_of_op()
        if tx.dtype == "int16":
            return unary16(k, node, x, tx, ty)
        if tx.dtype != "int8" or tx.quant is None:
            k.fail(f"int8 {name} needs a quantised int8 input, got {tx}")
        if name in ("relu", "relu6") and tx.quant == ty.quant:
            lo, hi = qmath.activation_range(name, float(ty.quant.scale[0]), int(ty.quant.zero_point[0]))
            return te.compute(_out_shape(ty), lambda *i: tirx.max(tirx.min(x(*i), tirx.const(hi, "int8")),
                                                                  tirx.const(lo, "int8")), name=name)
        table = k.const("table", int8_table(k, node))
        return te.compute(_out_shape(ty), lambda *i: table[x(*i).astype("int32") + c(128)], name=name)
    return rule


for _n in _UNARY:
    lower_rule(_n)(_unary_rule(_n))


# ---- binary: TFLite's int8 ADD and MUL ------------------------------------------------------
def _add_int8(k, node, xs, t1, t2, ty):
    """TFLite reference int8 ADD: both inputs rescaled to 2 * max scale with left_shift 20."""
    z1, z2, zo = (int(t.quant.zero_point[0]) for t in (t1, t2, ty))
    left_shift = ADD_LEFT_SHIFT
    (m1, sh1), (m2, sh2), (mo, sho) = add_params(t1.quant.scale[0], t2.quant.scale[0], ty.quant.scale[0])
    a, b = xs
    if k.target.kernels and left_shift == 20 and max(sh1, sh2, sho) <= 0:
        # kiln_add_s8 (kiln_intrinsics.h): the same arithmetic with SMMULR, exact for these bounds
        def fast(*i):
            v = tirx.call_extern("int32", "kiln_add_s8", _load(a, t1, ty, i).astype("int32"),
                                 _load(b, t2, ty, i).astype("int32"), c(-z1 << 20), c(m1), c(-sh1),
                                 c(-z2 << 20), c(m2), c(-sh2), c(mo), c(-sho), c(zo))
            return qmath.clamp(v, -128, 127).astype("int8")
        return te.compute(_out_shape(ty), fast, name="add")

    def body(*i):
        v1 = (_load(a, t1, ty, i).astype("int32") - c(z1)) * c(1 << left_shift)
        v2 = (_load(b, t2, ty, i).astype("int32") - c(z2)) * c(1 << left_shift)
        return qmath.let("s1", qmath.mbqm(v1, c(m1), sh1), lambda u1: qmath.let(
            "s2", qmath.mbqm(v2, c(m2), sh2), lambda u2: qmath.clamp(
                qmath.mbqm(u1 + u2, c(mo), sho) + c(zo), -128, 127).astype("int8")))
    return te.compute(_out_shape(ty), body, name="add")


def _mul_int8(k, node, xs, t1, t2, ty):
    z1, z2, zo = (int(t.quant.zero_point[0]) for t in (t1, t2, ty))
    m, sh = mul_params(float(np.float32(t1.quant.scale[0])), float(np.float32(t2.quant.scale[0])),
                       float(np.float32(ty.quant.scale[0])))
    a, b = xs

    def body(*i):
        v = (_load(a, t1, ty, i).astype("int32") - c(z1)) * (_load(b, t2, ty, i).astype("int32") - c(z2))
        return qmath.clamp(qmath.mbqm(v, c(m), sh) + c(zo), -128, 127).astype("int8")
    return te.compute(_out_shape(ty), body, name="mul")


def _binary_rule(name, kernel):
    def rule(k, node, xs):
        if not _q(k, node):
            return None                      # float: the op's TE compute
        t1, t2, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
        k.inplace_hints_of_op()
        if t1.dtype == "int16":
            return binary16(k, node, xs, t1, t2, ty)
        for t in (t1, t2, ty):
            if t.dtype != "int8" or t.quant is None or t.quant.per_channel:
                k.fail(f"int8 {name} needs per-tensor quantised int8 operands, got {t}")
        return kernel(k, node, xs, t1, t2, ty)
    return rule


lower_rule("add")(_binary_rule("add", _add_int8))
lower_rule("mul")(_binary_rule("mul", _mul_int8))


# ---- int16 ----------------------------------------------------------------------------------------
# TFLite's 16x8 ADD (left shift 15), MUL, RELU/RELU6 (requantise and clamp) and LOGISTIC/TANH (the
# interpolated 256-entry sigmoid table of reference_integer_ops), as the int16 references compute them.
def binary16(k, node, xs, t1, t2, ty):
    if node.op not in ("add", "mul"):
        k.fail(f"int16 {node.op} has no C kernel (int16: add, mul)")
    for t in (t1, t2, ty):
        if t.dtype != "int16" or t.quant is None or t.quant.per_channel:
            k.fail(f"int16 {node.op} needs per-tensor quantised int16 operands, got {t}")
    z1, z2, zo = (int(t.quant.zero_point[0]) for t in (t1, t2, ty))
    s1, s2, so = (float(np.float32(t.quant.scale[0])) for t in (t1, t2, ty))
    a, b = xs
    if node.op == "mul":
        m, sh = mul_params(s1, s2, so)

        def body(*i):
            v = (_load(a, t1, ty, i).astype("int32") - c(z1)) * (_load(b, t2, ty, i).astype("int32") - c(z2))
            return qmath.clamp(qmath.mbqm(v, c(m), sh) + c(zo), -32768, 32767).astype("int16")
        return te.compute(_out_shape(ty), body, name="mul16")
    twice = 2.0 * max(s1, s2)
    (m1, sh1), (m2, sh2) = qmath.quantize_multiplier(s1 / twice), qmath.quantize_multiplier(s2 / twice)
    mo, sho = qmath.quantize_multiplier(twice / ((1 << ADD_LEFT_SHIFT_16) * so))

    def add(*i):
        v1 = (_load(a, t1, ty, i).astype("int32") - c(z1)) * c(1 << ADD_LEFT_SHIFT_16)
        v2 = (_load(b, t2, ty, i).astype("int32") - c(z2)) * c(1 << ADD_LEFT_SHIFT_16)
        return qmath.let("s1", qmath.mbqm(v1, c(m1), sh1), lambda u1: qmath.let(
            "s2", qmath.mbqm(v2, c(m2), sh2), lambda u2: qmath.clamp(
                qmath.mbqm(u1 + u2, c(mo), sho) + c(zo), -32768, 32767).astype("int16")))
    return te.compute(_out_shape(ty), add, name="add16")


def unary16(k, node, x, tx, ty):
    name = node.op
    if tx.quant is None or ty.quant is None or ty.dtype != "int16":
        k.fail(f"int16 {name} needs quantised int16 input and output, got {tx} -> {ty}")
    si, zi = float(np.float32(tx.quant.scale[0])), int(tx.quant.zero_point[0])
    so, zo = float(np.float32(ty.quant.scale[0])), int(ty.quant.zero_point[0])
    if name in ("relu", "relu6"):
        m, sh = qmath.quantize_multiplier(float(np.float32(si) / np.float32(so)))
        lo, hi = qmath.activation_range(name, so, zo, -32768, 32767)
        return te.compute(_out_shape(ty), lambda *i: qmath.clamp(
            qmath.mbqm(x(*i).astype("int32") - c(zi), c(m), sh) + c(zo), lo, hi).astype("int16"), name=name + "16")
    if name not in ("sigmoid", "tanh"):
        k.fail(f"int16 {name} has no C kernel (int16: relu, relu6, sigmoid, tanh)")
    pot, log2 = checked_log2(so)
    if zi or zo or not pot or log2 != -15:
        k.fail(f"int16 {name} needs zero points 0 and output scale 1/32768 (TFLite), got {tx} -> {ty}")
    mult, shift = lut_activation_params(si, (lambda s: s == 0) if name == "sigmoid" else (lambda s: s in (0, 1)))
    if mult == 0:
        mult, shift = 3 << shift, 0
    table = k.const("sigtab", SIGMOID_TABLE_U16.astype(np.int32))
    frac = 9 if name == "sigmoid" else 8
    rnd = (1 << (shift - 1)) if shift > 0 else 0

    v = te.compute(_out_shape(ty), lambda *i: (x(*i).astype("int32") * c(mult) + c(rnd)) >> c(shift), name="lv")
    a = te.compute(_out_shape(ty), lambda *i: tirx.Select(v(*i) < c(0), -v(*i), v(*i)), name="la")
    return te.compute(_out_shape(ty), lambda *i: _lut16_tail(name, v(*i), a(*i), a(*i) >> c(frac), table, frac),
                      name=name + "16")


def _lut16_tail(name, v, a, uh, table, frac):
    idx = tirx.min(uh, c(254))
    ua, ub = table[idx], table[idx + c(1)]
    mask = c((1 << frac) - 1)
    sat = c(0x7FFF << 10) if name == "sigmoid" else c(0xFFFF << 8)
    r = tirx.Select(uh >= c(255), sat, (ua << c(frac)) + tirx.bitwise_and(a, mask) * (ub - ua))
    if name == "sigmoid":
        r = tirx.Select(v >= c(0), r + c(1 << 9), c(1 << 25) - r + c((1 << 9) - 1))
        return (r >> c(10)).astype("int16")
    r = tirx.Select(v >= c(0), r - c(1 << 23) + c(1 << 7), c(1 << 23) - r + c((1 << 7) - 1))
    return (r >> c(8)).astype("int16")


# ---- TFLite's element-wise family: int8 kernels (frontend/ops/elementwise_int8.py) -----------
# unary int8 ops: a 256-entry table from the op's int8 reference (bit-exact by construction)
for _n in ("leaky_relu", "hard_swish", "abs", "rsqrt", "elu"):
    lower_rule(_n)(_unary_rule(_n))


def _zps(*ts):
    return tuple(int(t.quant.zero_point[0]) for t in ts)


def _scaled(x, t, ty, i, z, left_shift, m, sh):
    """MultiplyByQuantizedMultiplierSmallerThanOneExp((x - z) << left_shift, m, sh) of one operand."""
    v = (_load(x, t, ty, i).astype("int32") - c(z)) * c(1 << left_shift)
    return qmath.mbqm(v, c(m), sh)


def _sub_int8(k, node, xs, t1, t2, ty):
    """TFLite int8 SUB: ADD's arithmetic with the second multiplier negated."""
    z1, z2, zo = _zps(t1, t2, ty)
    (m1, sh1), (m2, sh2), (mo, sho) = sub_params(t1.quant.scale[0], t2.quant.scale[0], ty.quant.scale[0])
    a, b = xs

    def body(*i):
        return qmath.let("s1", _scaled(a, t1, ty, i, z1, ADD_LEFT_SHIFT, m1, sh1), lambda u1: qmath.let(
            "s2", _scaled(b, t2, ty, i, z2, ADD_LEFT_SHIFT, m2, sh2), lambda u2: qmath.clamp(
                qmath.mbqm(u1 + u2, c(mo), sho) + c(zo), -128, 127).astype("int8")))
    return te.compute(_out_shape(ty), body, name="sub")


def _sqdiff_int8(k, node, xs, t1, t2, ty):
    z1, z2, zo = _zps(t1, t2, ty)
    (m1, sh1), (m2, sh2), (mo, sho) = sqdiff_params(t1.quant.scale[0], t2.quant.scale[0], ty.quant.scale[0])
    a, b = xs

    def body(*i):
        d = _scaled(a, t1, ty, i, z1, SQDIFF_LEFT_SHIFT, m1, sh1) - _scaled(b, t2, ty, i, z2, SQDIFF_LEFT_SHIFT, m2, sh2)
        return qmath.let("d", d, lambda dv: qmath.clamp(qmath.mbqm(dv * dv, c(mo), sho) + c(zo), -128, 127)
                         .astype("int8"))
    return te.compute(_out_shape(ty), body, name="squared_difference")


def _minmax_int8(fn):
    def kernel(k, node, xs, t1, t2, ty):
        a, b = xs
        if node.inputs[0] == node.inputs[1]:     # max(x, x) = x (gcc -Werror rejects the self-comparison)
            return te.compute(_out_shape(ty), lambda *i: _load(a, t1, ty, i), name=node.op)
        return te.compute(_out_shape(ty), lambda *i: fn(_load(a, t1, ty, i), _load(b, t2, ty, i)), name=node.op)
    return kernel


def _prelu_int8(k, node, xs, t1, t2, ty):
    z1, z2, zo = _zps(t1, t2, ty)
    (m1, sh1), (m2, sh2) = prelu_params(t1.quant.scale[0], t2.quant.scale[0], ty.quant.scale[0])
    x, al = xs

    def body(*i):
        def on(v):
            pos = qmath.mbqm(v, c(m1), sh1)
            neg = qmath.mbqm(v * (_load(al, t2, ty, i).astype("int32") - c(z2)), c(m2), sh2)
            return qmath.clamp(tirx.Select(v >= c(0), pos, neg) + c(zo), -128, 127).astype("int8")
        return qmath.let("v", _load(x, t1, ty, i).astype("int32") - c(z1), on)
    return te.compute(_out_shape(ty), body, name="prelu")


lower_rule("sub")(_binary_rule("sub", _sub_int8))
lower_rule("squared_difference")(_binary_rule("squared_difference", _sqdiff_int8))
lower_rule("maximum")(_binary_rule("maximum", _minmax_int8(tirx.max)))
lower_rule("minimum")(_binary_rule("minimum", _minmax_int8(tirx.min)))
lower_rule("prelu")(_binary_rule("prelu", _prelu_int8))


# ---- div: TFLite's reciprocal arithmetic -------------------------------------------------------
def div_tables():
    """Compile-time tables of TFLite's int8 DIV: for |divisor| d in 1..255 the Q0.31 reciprocal and
    num_bits_over_unit (GetReciprocal(d, 31)); for numerator n in -255..255 CountLeadingSignBits(n)."""
    d = np.arange(256, dtype=np.int64)
    inv, rs = get_reciprocal(np.maximum(d, 1), 31)
    n = np.arange(-255, 256, dtype=np.int64)
    return inv.astype(np.int32), rs.astype(np.int8), count_leading_sign_bits(n).astype(np.int8)


def _rdbpot_any(x, e):
    """rounding_divide_by_pot_x86 (elementwise_int8.py) for an int32 exponent e >= 0 of any size."""
    def body(xv, ev):
        mask = tirx.Select(ev >= c(32), c(-1),
                           ((c(1, "int64") << tirx.min(ev, c(31)).astype("int64")) - c(1, "int64")).astype("int32"))
        return qmath.let("dm", mask, lambda mv: (xv >> tirx.bitwise_and(ev, c(31))) + tirx.Select(
            tirx.bitwise_and(xv, mv) > (mv >> c(1)) + tirx.Select(xv < c(0), c(1), c(0)), c(1), c(0)))
    return qmath.let("dx", x, lambda xv: qmath.let("de", e, lambda ev: body(xv, ev)))


def _div_int8(k, node, xs, t1, t2, ty):
    z1, z2, zo = _zps(t1, t2, ty)
    m, e = div_params(t1.quant.scale[0], t2.quant.scale[0], ty.quant.scale[0])
    inv_t, rs_t, hr_t = div_tables()
    inv, rs, hr = k.const("recip", inv_t), k.const("recip_shift", rs_t), k.const("headroom", hr_t)
    a, b = xs

    def body(*i):
        # table indices stay plain expressions (a Let variable may not index a buffer in TE)
        av = _load(a, t1, ty, i).astype("int32") - c(z1)
        bv = _load(b, t2, ty, i).astype("int32") - c(z2)
        n = tirx.Select(bv < c(0), -av, av)
        d = tirx.Select(bv < c(0), -bv, bv)
        h = hr[n + c(255)].astype("int32")
        shifted = (n.astype("int64") * (c(1, "int64") << h.astype("int64"))).astype("int32")
        return qmath.let("q", qmath.srdhm(shifted, inv[d].astype("int32")), lambda qv: qmath.clamp(
            _rdbpot_any(qmath.srdhm(qv, c(m)), c(-e) + rs[d].astype("int32") + h) + c(zo), -128, 127)).astype("int8")
    return te.compute(_out_shape(ty), body, name="div")


lower_rule("div")(_binary_rule("div", _div_int8))
