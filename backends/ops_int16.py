"""C lowerings of TFLite's int16 (16x8) kernels that the per-family modules (``ops_elementwise.py``,
``ops_nn.py``, ...) do not cover: each is the int16 branch of an op whose other dtypes keep their
own rule (``int16_first``). The arithmetic is the op's int16 reference
(``frontend/ops/elementwise_int16.py``), with the same compile-time multipliers."""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from kiln.frontend.ops.elementwise import ADD_LEFT_SHIFT_16
from kiln.frontend.ops.elementwise_int16 import sub16_params
from kiln.frontend.ops.elementwise_int8 import leaky_params
from kiln.frontend.registry import OPS

from . import qmath
from .lower import BACKEND, PENDING, lower_rule
from .ops_elementwise import _load, _out_shape
from .qmath import c

QMIN16, QMAX16 = -32768, 32767


def int16_first(op_name):
    """Decorator: ``fn(k, node, xs)`` lowers ``op_name`` when its input 0 or output is a quantised
    int16 tensor; any other node goes to the rule registered before (or the TE compute)."""
    def deco(fn):
        prev = OPS[op_name].lower.get(BACKEND) if op_name in OPS else PENDING.get(op_name)

        def rule(k, node, xs):
            t0, ty = k.type(node.inputs[0]), k.type(node.name)
            if (t0.dtype == "int16" and t0.quant is not None) or (ty.dtype == "int16" and ty.quant is not None):
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

    def body(*i):
        return qmath.let("v", x(*i).astype("int32") - c(zi), lambda v: _clamp16(tirx.Select(
            v >= c(0), qmath.mbqm(v, c(mi), ei), qmath.mbqm(v, c(ma), ea)) + c(zo)))
    return te.compute(_out_shape(ty), body, name="leaky_relu16")
