"""C lowerings of element-wise ops (float32 with NumPy broadcasting; int8 with TFLite's ADD/MUL
rescaling, and a 256-entry table for any unary int8 op, built at compile time from the op's int8
reference so it is bit-exact by construction)."""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from kiln.frontend.registry import get_op

from . import inplace, qmath
from .lower import lower_rule
from .qmath import c

F32 = "float32"


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


def _hint_inplace(k, node):
    ty = k.type(node.name)
    for v in node.inputs:
        t = k.type(v)
        s = inplace.elementwise_shift(t, ty)
        if s is not None:
            k.inplace(v, s)


def _out_shape(t):
    return t.shape or (1,)


def _need_f32(k, node):
    for v in list(node.inputs) + [node.name]:
        if k.type(v).dtype != F32:
            k.fail(f"{node.op} on {k.type(v)} is not supported by the C backend (float32, or int8 with quantisation)")


# ---- float unary ----------------------------------------------------------------------------
_UNARY = {
    "neg": lambda v, a: -v,
    "exp": lambda v, a: tirx.exp(v),
    "log": lambda v, a: tirx.log(v),
    "sqrt": lambda v, a: tirx.sqrt(v),
    "tanh": lambda v, a: tirx.tanh(v),
    "sigmoid": lambda v, a: tirx.const(1.0, F32) / (tirx.const(1.0, F32) + tirx.exp(-v)),
    "relu": lambda v, a: tirx.max(v, tirx.const(0.0, F32)),
    "relu6": lambda v, a: tirx.min(tirx.max(v, tirx.const(0.0, F32)), tirx.const(6.0, F32)),
    "pow": lambda v, a: _pow(v, a["exponent"]),
}


def _pow(v, p):
    if float(p) == 2.0:
        return v * v
    if float(p) == 1.0:
        return v
    return tirx.power(v, tirx.const(float(p), F32))


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
        x = xs[0]
        tx, ty = k.type(node.inputs[0]), k.type(node.name)
        _hint_inplace(k, node)
        if _q(k, node):
            if tx.dtype != "int8" or tx.quant is None:
                k.fail(f"int8 {name} needs a quantised int8 input, got {tx}")
            if name in ("relu", "relu6") and tx.quant == ty.quant:
                lo, hi = qmath.activation_range(name, float(ty.quant.scale[0]), int(ty.quant.zero_point[0]))
                return te.compute(_out_shape(ty), lambda *i: tirx.max(tirx.min(x(*i), tirx.const(hi, "int8")),
                                                                      tirx.const(lo, "int8")), name=name)
            table = k.const("table", int8_table(k, node))
            return te.compute(_out_shape(ty), lambda *i: table[x(*i).astype("int32") + c(128)], name=name)
        _need_f32(k, node)
        return te.compute(_out_shape(ty), lambda *i: _UNARY[name](x(*i), node.attrs), name=name)
    return rule


for _n in _UNARY:
    lower_rule(_n)(_unary_rule(_n))


# ---- binary ---------------------------------------------------------------------------------
_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "maximum": tirx.max, "minimum": tirx.min,
}


def _add_int8(k, node, xs, t1, t2, ty):
    """TFLite reference int8 ADD: both inputs rescaled to 2 * max scale with left_shift 20."""
    from kiln.quantize.int8_elementwise import ADD_LEFT_SHIFT, add_params
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
    from kiln.quantize.int8_elementwise import mul_params
    z1, z2, zo = (int(t.quant.zero_point[0]) for t in (t1, t2, ty))
    m, sh = mul_params(float(np.float32(t1.quant.scale[0])), float(np.float32(t2.quant.scale[0])),
                       float(np.float32(ty.quant.scale[0])))
    a, b = xs

    def body(*i):
        v = (_load(a, t1, ty, i).astype("int32") - c(z1)) * (_load(b, t2, ty, i).astype("int32") - c(z2))
        return qmath.clamp(qmath.mbqm(v, c(m), sh) + c(zo), -128, 127).astype("int8")
    return te.compute(_out_shape(ty), body, name="mul")


def _binary_rule(name):
    def rule(k, node, xs):
        t1, t2, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
        _hint_inplace(k, node)
        if _q(k, node):
            for t in (t1, t2, ty):
                if t.dtype != "int8" or t.quant is None or t.quant.per_channel:
                    k.fail(f"int8 {name} needs per-tensor quantised int8 operands, got {t}")
            if name == "add":
                return _add_int8(k, node, xs, t1, t2, ty)
            if name == "mul":
                return _mul_int8(k, node, xs, t1, t2, ty)
            k.fail(f"{name} has no int8 kernel (TFLite int8 has ADD and MUL)")
        _need_f32(k, node)
        a, b = xs
        return te.compute(_out_shape(ty), lambda *i: _BINARY[name](_load(a, t1, ty, i), _load(b, t2, ty, i)),
                          name=name)
    return rule


for _n in _BINARY:
    lower_rule(_n)(_binary_rule(_n))


@lower_rule("where")
def lower_where(k, node, xs):
    k.fail("where needs a bool condition; bool tensors are not supported by the C backend")


@lower_rule("cast")
def lower_cast(k, node, xs):
    tx, ty = k.type(node.inputs[0]), k.type(node.name)
    ok = ("float32", "int32", "int8", "uint8", "int16")
    if tx.dtype not in ok or ty.dtype not in ok or tx.quant is not None or ty.quant is not None:
        k.fail(f"cast {tx} -> {ty} is not supported by the C backend")
    x = xs[0]
    return te.compute(_out_shape(ty), lambda *i: x(*i).astype(ty.dtype), name="cast")
