"""C kernels of the ops with bool operands or results on quantised (int8) inputs: the comparisons
(TFLite's int8 EQUAL ... GREATER_EQUAL: both sides rescaled with left shift 8, then compared),
SELECT_V2 (``where``: int8 codes copied as they are) and CAST of a quantised tensor (its codes).
Bool tensors are one byte each in C (0 or 1, ``lower.c_storage``); float and bool-only cases
(logical ops, casts of float or bool) are the ops' TE computes."""
from __future__ import annotations

from tvm import te, tirx

from kiln.frontend.ops.elementwise_int8 import CMP_LEFT_SHIFT, cmp_params

from . import qmath
from .lower import lower_rule
from .ops_elementwise import _load, _out_shape, _q
from .qmath import c

_CMP = {"equal": lambda a, b: a == b, "not_equal": lambda a, b: a != b, "less": lambda a, b: a < b,
        "less_equal": lambda a, b: a <= b, "greater": lambda a, b: a > b, "greater_equal": lambda a, b: a >= b}


def _int8_operands(k, node, ts, what):
    for t in ts:
        if t.dtype != "int8" or t.quant is None or t.quant.per_channel:
            k.fail(f"int8 {node.op} needs per-tensor quantised int8 {what}, got {t}")


def _cmp_rule(name):
    def rule(k, node, xs):
        if not _q(k, node):
            return None                      # float and integer: the op's TE compute
        t1, t2, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
        _int8_operands(k, node, (t1, t2), "operands")
        (m1, e1), (m2, e2) = (cmp_params(t.quant.scale[0]) for t in (t1, t2))
        z1, z2 = (int(t.quant.zero_point[0]) for t in (t1, t2))
        a, b = xs

        def side(x, t, i, z, m, e):
            v = (_load(x, t, ty, i).astype("int32") - c(z)) * c(1 << CMP_LEFT_SHIFT)
            return qmath.mbqm(v, c(m), e)

        def body(*i):
            return qmath.let("c1", side(a, t1, i, z1, m1, e1), lambda u1: qmath.let(
                "c2", side(b, t2, i, z2, m2, e2), lambda u2: _CMP[name](u1, u2)))
        return te.compute(_out_shape(ty), body, name=name)
    return rule


for _n in _CMP:
    lower_rule(_n)(_cmp_rule(_n))


@lower_rule("where")
def _where_int8(k, node, xs):
    """SELECT_V2 on int8: the chosen operand's code, unchanged (both share the output's quantisation)."""
    if not _q(k, node):
        return None
    tc, t1, t2, ty = (k.type(v) for v in (*node.inputs, node.name))
    _int8_operands(k, node, (t1, t2, ty), "values and output")
    cnd, a, b = xs
    return te.compute(_out_shape(ty), lambda *i: te.if_then_else(_load(cnd, tc, ty, i), _load(a, t1, ty, i),
                                                                  _load(b, t2, ty, i)), name="where")


@lower_rule("cast")
def _cast_codes(k, node, xs):
    """CAST of a quantised tensor: TFLite converts the stored codes and ignores the quantisation
    (int8 -> bool is ``code != 0``, int8 -> float32 the code's value), as the op's reference does."""
    if not _q(k, node):
        return None
    x, tx, ty = xs[0], k.type(node.inputs[0]), k.type(node.name)
    k.inplace_hints_of_op()
    if ty.dtype == "bool":
        return te.compute(_out_shape(ty), lambda *i: _load(x, tx, ty, i) != tirx.const(0, x.dtype), name="cast")
    return te.compute(_out_shape(ty), lambda *i: _load(x, tx, ty, i).astype(ty.dtype), name="cast")
