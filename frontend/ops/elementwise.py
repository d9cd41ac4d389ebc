"""Element-wise ops: unary math, binary arithmetic with NumPy broadcasting, comparisons, where, cast.

Non-differentiable points follow PyTorch: relu'(0) = 0; relu6' is 0 at 0 and at 6;
maximum/minimum split the gradient equally between tied operands; sqrt'(0) = inf.

Each op's ``te`` rule (its float lowering, ``frontend/ops/te_helpers.py``) computes in the accumulation
dtype (float32 for 16-bit storage) and casts the result to the output's storage dtype.
"""
import numpy as np

from .. import fixedpoint as fp
from .. import functional as F
from .. import tflite_checks as chk
from ..errors import ShapeError
from ..registry import (
    BINARY,
    ELEMENTWISE,
    INT16,
    NONDIFF,
    QUANTIZABLE,
    UNARY,
    Attr,
    Quant,
    defrule,
    get_op,
    mark,
    register,
)
from ..types import DTYPES
from . import tflite_util as tfl
from ._util import bshape, need_float, same_dtype, tt
from .int8util import clamp8, f32, int8_io
from .int16util import (
    QMAX16,
    QMIN16,
    checked_log2,
    clamp16,
    int16_io,
    is_int16,
    logistic16,
    lut_activation_params,
    symmetric16,
    tanh16,
)


def _unary_infer(name):
    def infer(ts, attrs):
        need_float(ts[0], name)
        return ts[0]
    return infer


def unary_te(name, f):
    """TE rule of a unary op: ``f(T, v, attrs)`` on each element, in the accumulation dtype."""
    def rule(T, xs, a, out):
        x = xs[0]
        ad = T.acc_dtype(x.dtype)
        return T.te.compute(T.shape(x), lambda *i: T.cast(f(T, T.cast(x(*i), ad), a), out.dtype), name=name)
    return rule


def _unary(name, ref, vjp, te, props=(), doc="", quant=None):
    op = register(name, infer=_unary_infer(name), ref=lambda xs, a: ref(xs[0]).astype(xs[0].dtype, copy=False),
                  vjp=vjp, props={ELEMENTWISE, UNARY, *props}, arity=1, doc=doc, quant=quant)
    op.te = unary_te(name, te)


_unary("neg", np.negative, lambda n, xs, y, gy: [-gy], lambda T, v, a: -v, doc="-x")
_unary("exp", np.exp, lambda n, xs, y, gy: [gy * y], lambda T, v, a: T.te.exp(v), doc="e**x (VJP reads the output)")
_unary("log", np.log, lambda n, xs, y, gy: [gy / xs[0]], lambda T, v, a: T.te.log(v), doc="natural logarithm")
_unary("sqrt", np.sqrt, lambda n, xs, y, gy: [gy / (y * 2.0)], lambda T, v, a: T.te.sqrt(v),
       doc="square root; gradient inf at 0 (as torch)")
_unary("tanh", np.tanh, lambda n, xs, y, gy: [gy * (1.0 - y * y)], lambda T, v, a: T.te.tanh(v),
       props={QUANTIZABLE}, doc="hyperbolic tangent (VJP reads the output)", quant=Quant("fixed", (1.0 / 128, 0)))
_unary("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)), lambda n, xs, y, gy: [gy * (y * (1.0 - y))],
       lambda T, v, a: T.c(1, T.dt(v)) / (T.c(1, T.dt(v)) + T.te.exp(-v)),
       props={QUANTIZABLE}, doc="logistic 1 / (1 + e**-x) (VJP reads the output)", quant=Quant("fixed", (1.0 / 256, -128)))
# relu/relu6 VJPs read the output (y > 0 exactly when x > 0), as torch's threshold_backward does:
# the pre-activation then dies with the forward pass instead of living until the backward.
_unary("relu", lambda x: np.maximum(x, 0), lambda n, xs, y, gy: [F.where(y > 0.0, gy, 0.0)],
       lambda T, v, a: T.act(v, "relu"), props={QUANTIZABLE}, doc="max(x, 0); gradient 0 at 0 (as torch)",
       quant=Quant())
_unary("relu6", lambda x: np.minimum(np.maximum(x, 0), 6),
       lambda n, xs, y, gy: [F.where(F.logical_and(y > 0.0, y < 6.0), gy, 0.0)],
       lambda T, v, a: T.act(v, "relu6"), props={QUANTIZABLE},
       doc="min(max(x, 0), 6); gradient 0 at 0 and 6 (as torch)", quant=Quant())


def _pow_ref(xs, a):
    return np.power(xs[0], np.asarray(a["exponent"], xs[0].dtype)).astype(xs[0].dtype)


def _pow_vjp(n, xs, y, gy):
    p = n.attrs["exponent"]
    if p == 0:
        return [gy * 0.0]
    if p == 1:
        return [gy]
    if p == 2:
        return [gy * (xs[0] * 2.0)]
    return [gy * (F.pow(xs[0], p - 1) * float(p))]


def _pow_te(T, v, a):
    p = float(a["exponent"])
    if p == 2.0:
        return v * v
    if p == 1.0:
        return v
    if p == 0.0:
        return T.c(1, T.dt(v))
    if p == 0.5:
        return T.te.sqrt(v)
    if p == -1.0:
        return T.c(1, T.dt(v)) / v
    return T.te.power(v, T.c(p, T.dt(v)))


register("pow", attrs={"exponent": Attr("float", 2.0)}, infer=_unary_infer("pow"), ref=_pow_ref,
         vjp=_pow_vjp, props={ELEMENTWISE, UNARY}, arity=1, doc="x ** exponent (a constant)")
get_op("pow").te = unary_te("pow", _pow_te)


# ---- binary -----------------------------------------------------------------------------------
def _binary_infer(name, out_dtype=None):
    def infer(ts, attrs):
        dt = same_dtype(ts, name)
        return tt(bshape(ts, name), out_dtype or dt)
    return infer


def binary_te(name, f):
    """TE rule of a binary op with NumPy broadcasting: ``f(T, a, b)`` in the accumulation dtype."""
    def rule(T, xs, a, out):
        x, y = xs
        shape = out.shape
        ad = T.acc_dtype(x.dtype)
        return T.te.compute(shape, lambda *i: T.cast(f(T, T.cast(T.bidx(x, shape, i), ad),
                                                       T.cast(T.bidx(y, shape, i), ad)), out.dtype), name=name)
    return rule


def _binary(name, ref, vjp, te, props=(), quant=None):
    op = register(name, infer=_binary_infer(name), ref=lambda xs, a: ref(xs[0], xs[1]).astype(xs[0].dtype, copy=False),
                  vjp=vjp, props={ELEMENTWISE, BINARY, *props}, arity=2, quant=quant,
                  doc=f"elementwise {name}, NumPy broadcasting" + ("; a tie splits the gradient equally (as torch)"
                                                                  if name in ("maximum", "minimum") else ""))
    op.te = binary_te(name, te)


def _ub(g, x):
    return F.unbroadcast(g, x.shape)


_binary("add", np.add, lambda n, xs, y, gy: [_ub(gy, xs[0]), _ub(gy, xs[1])], lambda T, a, b: a + b,
        props={QUANTIZABLE}, quant=Quant())
_binary("sub", np.subtract, lambda n, xs, y, gy: [_ub(gy, xs[0]), _ub(-gy, xs[1])], lambda T, a, b: a - b)
_binary("mul", np.multiply, lambda n, xs, y, gy: [_ub(gy * xs[1], xs[0]), _ub(gy * xs[0], xs[1])],
        lambda T, a, b: a * b, props={QUANTIZABLE}, quant=Quant())
_binary("div", np.divide, lambda n, xs, y, gy: [_ub(gy / xs[1], xs[0]), _ub(-(gy * y) / xs[1], xs[1])],
        lambda T, a, b: a / b)


def _minmax_vjp(cmp):
    def vjp(n, xs, y, gy):
        a, b = xs
        wa = F.cast(cmp(a, b), gy.dtype) + F.cast(F.equal(a, b), gy.dtype) * 0.5
        return [_ub(gy * wa, a), _ub(gy * (1.0 - wa), b)]
    return vjp


_binary("maximum", np.maximum, _minmax_vjp(F.greater), lambda T, a, b: T.te.max(a, b))
_binary("minimum", np.minimum, _minmax_vjp(F.less), lambda T, a, b: T.te.min(a, b))


# ---- comparisons and logic (bool results, no gradient) ---------------------------------------
def _cmp(name, ref, te):
    op = register(name, infer=_binary_infer(name, "bool"), ref=lambda xs, a: ref(xs[0], xs[1]),
                  vjp=lambda n, xs, y, gy: [None, None], props={ELEMENTWISE, BINARY, NONDIFF}, arity=2,
                  doc="bool result, NumPy broadcasting; no gradient")
    op.te = binary_te(name, te)


_cmp("equal", np.equal, lambda T, a, b: T.tirx.EQ(a, b))
_cmp("not_equal", np.not_equal, lambda T, a, b: T.tirx.NE(a, b))
_cmp("less", np.less, lambda T, a, b: a < b)
_cmp("less_equal", np.less_equal, lambda T, a, b: a <= b)
_cmp("greater", np.greater, lambda T, a, b: a > b)
_cmp("greater_equal", np.greater_equal, lambda T, a, b: a >= b)
_cmp("logical_and", np.logical_and, lambda T, a, b: T.tirx.And(a, b))
_cmp("logical_or", np.logical_or, lambda T, a, b: T.tirx.Or(a, b))
register("logical_not", infer=lambda ts, a: tt(ts[0].shape, "bool"), ref=lambda xs, a: np.logical_not(xs[0]), doc="bool not",
         vjp=lambda n, xs, y, gy: [None], props={ELEMENTWISE, UNARY, NONDIFF}, arity=1)


@defrule("logical_not", "te")
def _logical_not_te(T, xs, a, out):
    x = xs[0]
    return T.te.compute(T.shape(x), lambda *i: T.tirx.Not(x(*i)), name="logical_not")


def _where_infer(ts, attrs):
    c, a, b = ts
    if c.dtype != "bool":
        raise ShapeError(f"where: condition must be bool, got {c.dtype}")
    dt = same_dtype([a, b], "where")
    return tt(bshape(ts, "where"), dt)


def _where_vjp(n, xs, y, gy):
    c, a, b = xs
    return [None, _ub(F.where(c, gy, 0.0), a), _ub(F.where(c, 0.0, gy), b)]


register("where", infer=_where_infer, ref=lambda xs, a: np.where(xs[0], xs[1], xs[2]), vjp=_where_vjp,
         props={ELEMENTWISE}, arity=3, doc="where(cond, a, b), NumPy broadcasting")


@defrule("where", "te")
def _where_te(T, xs, a, out):
    c, p, q = xs
    shape = out.shape
    return T.te.compute(shape, lambda *i: T.tirx.Select(T.bidx(c, shape, i), T.bidx(p, shape, i), T.bidx(q, shape, i)),
                        name="where")


def _cast_infer(ts, attrs):
    return tt(ts[0].shape, attrs["dtype"])


def _cast_vjp(n, xs, y, gy):
    if xs[0].type.is_float and y.type.is_float:
        return [F.cast(gy, xs[0].dtype)]
    return [None]


register("cast", attrs={"dtype": Attr("str", "float32", DTYPES)}, infer=_cast_infer,
         ref=lambda xs, a: xs[0].astype(a["dtype"]), vjp=_cast_vjp, props={ELEMENTWISE, UNARY}, arity=1,
         doc="dtype conversion; the gradient flows between float dtypes only")


@defrule("cast", "te")
def _cast_te(T, xs, a, out):
    x = xs[0]
    if out.dtype == "bool":
        return T.te.compute(T.shape(x), lambda *i: T.tirx.NE(x(*i), T.c(0, x.dtype)), name="cast")
    return T.te.compute(T.shape(x), lambda *i: x(*i).astype(out.dtype), name="cast")


# ---- int8 references (LiteRT's reference kernels) ---------------------------------------------------
# int8 reference rules for element-wise ops and activations, as LiteRT's reference kernels
# compute them:
#
# - ``add``: both inputs rescaled to a common scale with ``left_shift = 20`` (TFLite int8 ADD).
# - ``mul``: one requantisation of the product by ``s1 * s2 / s_out`` (formed in float32, as TFLite).
# - ``relu``/``relu6``: TFLite's ReluX: requantise input -> output scale, clamp to the activation range.
# - ``sigmoid`` (LOGISTIC) / ``tanh``: 256-entry tables populated in float32 (LUTPopulate).

ADD_LEFT_SHIFT = 20


def add_params(s1, s2, s_out):
    """TFLite int8 ADD prepare: ((m1, sh1), (m2, sh2), (m_out, sh_out)), all shifts <= 0."""
    twice_max = float(2 * np.float32(max(f32(s1), f32(s2))))
    r1 = f32(s1) / twice_max
    r2 = f32(s2) / twice_max
    r_out = twice_max / float(np.float32((1 << ADD_LEFT_SHIFT) * np.float32(s_out)))
    return fp.quantize_multiplier(r1), fp.quantize_multiplier(r2), fp.quantize_multiplier(r_out)


@defrule("add", "int8_ref")
def add_int8(xs, attrs, in_types, out_type):
    if is_int16(in_types[0]):
        return add_int16(xs, attrs, in_types, out_type)
    (s1, z1), (s2, z2), (so, zo) = int8_io(in_types, out_type, "add", 2)
    (m1, e1), (m2, e2), (mo, eo) = add_params(s1, s2, so)
    a = (xs[0].astype(np.int64) - z1) << ADD_LEFT_SHIFT
    b = (xs[1].astype(np.int64) - z2) << ADD_LEFT_SHIFT
    a = fp.multiply_by_quantized_multiplier(a, m1, e1)
    b = fp.multiply_by_quantized_multiplier(b, m2, e2)
    y = fp.multiply_by_quantized_multiplier(fp.wrap_int32(a + b), mo, eo) + zo
    return clamp8(y)


def mul_params(s1, s2, s_out):
    return fp.quantize_multiplier(float(np.float32(np.float32(s1) * np.float32(s2)) / np.float32(s_out)))


@defrule("mul", "int8_ref")
def mul_int8(xs, attrs, in_types, out_type):
    if is_int16(in_types[0]):
        return mul_int16(xs, attrs, in_types, out_type)
    (s1, z1), (s2, z2), (so, zo) = int8_io(in_types, out_type, "mul", 2)
    m, e = mul_params(s1, s2, so)
    prod = fp.wrap_int32((xs[0].astype(np.int64) - z1) * (xs[1].astype(np.int64) - z2))
    return clamp8(fp.multiply_by_quantized_multiplier(prod, m, e) + zo)


def _relu_x(op, act):
    def rule(xs, attrs, in_types, out_type):
        if is_int16(in_types[0]):
            return relu_x_int16(xs, in_types, out_type, op, act)
        (si, zi), (so, zo) = int8_io(in_types, out_type, op)
        m, e = fp.quantize_multiplier(float(np.float32(si) / np.float32(so)))  # float32 division, as TFLite
        lo, hi = fp.activation_range(act, so, zo)
        y = fp.multiply_by_quantized_multiplier(xs[0].astype(np.int64) - zi, m, e) + zo
        return clamp8(y, lo, hi)
    rule.__name__ = f"{op}_int8"
    return defrule(op, "int8_ref")(rule)


_relu_x("relu", "relu")
_relu_x("relu6", "relu6")


def _lut(op, fn):
    def rule(xs, attrs, in_types, out_type):
        if is_int16(in_types[0]):
            return lut_int16(xs, in_types, out_type, op, fn)
        (si, zi), (so, zo) = int8_io(in_types, out_type, op)
        if fn == "logistic" and so != 1.0 / 256:
            raise ShapeError(f"{op}: TFLite's int8 LOGISTIC needs output scale 1/256, got {so}")
        table = fp.lut_int8(fn, si, zi, so, zo)
        return table[xs[0].astype(np.int64) + 128].astype(np.int8)
    rule.__name__ = f"{op}_int8"
    return defrule(op, "int8_ref")(rule)


_lut("sigmoid", "logistic")
_lut("tanh", "tanh")


# ---- TFLite import ----------------------------------------------------------
# ADD, MUL (fused activations as a following relu/relu6), LOGISTIC, TANH, RELU, RELU6
def _tfl_binary(kop, name, opts_cls):
    def conv(imp, k, op, ins, out):
        tfl.need(imp, k, name, ins, 2)
        o = tfl.options(imp, k, op, name, opts_cls)
        act = tfl.activation(imp, k, name, o.FusedActivationFunction() if o else 0)
        xs = [imp.operand(i, k, name) for i in ins]
        ts = [imp.g.types[v] for v in xs]
        if ts[0].dtype == "int8" and ts[1].dtype == "int8":
            check = chk.add_quant if kop == "add" else chk.mul_quant
            check(imp.err, tfl.where(k, name), ts[0].quant, ts[1].quant, imp.tensors[out]["quant"], act)
        if kop == "mul" and ts[0].dtype == "int16":
            symmetric16(imp.err, tfl.where(k, name), [("input 0", ts[0].quant), ("input 1", ts[1].quant),
                                                      ("the output", imp.tensors[out]["quant"])])
        imp.finish(k, name, kop, xs, {}, out, act)
    return conv


def _tfl_unary(kop, name):
    def conv(imp, k, op, ins, out):
        tfl.need(imp, k, name, ins, 1)
        tfl.options(imp, k, op, name, None)
        x = imp.operand(ins[0], k, name)
        xt, oq, w = imp.g.types[x], imp.tensors[out]["quant"], tfl.where(k, name)
        if xt.dtype == "int8":
            if kop == "sigmoid":
                chk.logistic_quant(imp.err, w, xt.quant, oq)
            elif kop == "tanh":
                chk.per_tensor(imp.err, w, xt.quant, "the input")
                chk.per_tensor(imp.err, w, oq, "the output")
            else:
                chk.ratio_quant(imp.err, w, xt.quant, oq)
                chk.activation_range(imp.err, w, kop, oq.scale[0])
        if xt.dtype == "int16" and kop in ("sigmoid", "tanh"):
            lut16_quant(imp.err, w, xt.quant, oq, name)
        imp.values[out] = imp.emit(k, name, kop, [x], {}, out)
    return conv


tfl.importer("ADD")(_tfl_binary("add", "ADD", "AddOptions"))
tfl.importer("MUL")(_tfl_binary("mul", "MUL", "MulOptions"))
tfl.importer("LOGISTIC")(_tfl_unary("sigmoid", "LOGISTIC"))
tfl.importer("TANH")(_tfl_unary("tanh", "TANH"))
tfl.importer("RELU")(_tfl_unary("relu", "RELU"))
tfl.importer("RELU6")(_tfl_unary("relu6", "RELU6"))


# ---- TFLite export ------------------------------------------------------------------------------
@tfl.exporter("add", "mul", versions={"ADD": 2, "MUL": 2}, fuses_activation=True)
def _tfl_export_binary(e, n, act, out, int8):
    extra = {"PotScaleInt16": False} if n.op == "add" and e.g.types[out].dtype == "int16" else {}   # 16x8: general scales
    e.op(n.op.upper(), [e.value(i) for i in n.inputs], [e.tensor(out, e.g.types[out])],
         "AddOptions" if n.op == "add" else "MulOptions", int8, FusedActivationFunction=tfl.ACT_CODES[act], **extra)


_UNARY_BUILTINS = {"sigmoid": "LOGISTIC", "tanh": "TANH", "relu": "RELU", "relu6": "RELU6"}


@tfl.exporter(*_UNARY_BUILTINS, versions={b: 2 for b in _UNARY_BUILTINS.values()})
def _tfl_export_unary(e, n, act, out, int8):
    e.op(_UNARY_BUILTINS[n.op], [e.value(i) for i in n.inputs], [e.tensor(out, e.g.types[out])], None, int8)


@tfl.exporter("cast")
def _tfl_export_cast(e, n, act, out, int8):
    e.op("CAST", [e.value(i) for i in n.inputs], [e.tensor(out, e.g.types[out])], None, False)


# ---- int16 ----------------------------------------------------------------------------------------
# TFLite's 16x8 elementwise kernels (int16 activations, zero point 0 where the kernels need it):
# - ADD: the general int8 path with ``left_shift = 15`` (TFLM; LiteRT when pot_scale_int16 is false);
# - MUL: the int8 arithmetic (one requantisation of the int32 product) clamped to int16;
# - RELU/RELU6: ReluX, as int8, clamped to the int16 activation range;
# - LOGISTIC/TANH: reference_integer_ops' table interpolation (int16util.logistic16 / tanh16).
ADD_LEFT_SHIFT_16 = 15


def add_int16(xs, attrs, in_types, out_type):
    (s1, z1), (s2, z2), (so, zo) = int16_io(in_types, out_type, "add", 2, symmetric=False)
    twice_max = 2.0 * max(s1, s2)
    m1, e1 = fp.quantize_multiplier(s1 / twice_max)
    m2, e2 = fp.quantize_multiplier(s2 / twice_max)
    mo, eo = fp.quantize_multiplier(twice_max / ((1 << ADD_LEFT_SHIFT_16) * so))
    a = fp.multiply_by_quantized_multiplier((xs[0].astype(np.int64) - z1) << ADD_LEFT_SHIFT_16, m1, e1)
    b = fp.multiply_by_quantized_multiplier((xs[1].astype(np.int64) - z2) << ADD_LEFT_SHIFT_16, m2, e2)
    return clamp16(fp.multiply_by_quantized_multiplier(fp.wrap_int32(a + b), mo, eo) + zo)


def mul_int16(xs, attrs, in_types, out_type):
    (s1, z1), (s2, z2), (so, zo) = int16_io(in_types, out_type, "mul", 2)
    m, e = mul_params(s1, s2, so)
    prod = fp.wrap_int32((xs[0].astype(np.int64) - z1) * (xs[1].astype(np.int64) - z2))
    return clamp16(fp.multiply_by_quantized_multiplier(prod, m, e) + zo)


def relu_x_int16(xs, in_types, out_type, op, act):
    (si, zi), (so, zo) = int16_io(in_types, out_type, op, symmetric=False)
    m, e = fp.quantize_multiplier(float(np.float32(si) / np.float32(so)))
    lo, hi = fp.activation_range(act, so, zo, QMIN16, QMAX16)
    return clamp16(fp.multiply_by_quantized_multiplier(xs[0].astype(np.int64) - zi, m, e) + zo, lo, hi)


def lut_int16(xs, in_types, out_type, op, fn):
    (si, _), (so, _) = int16_io(in_types, out_type, op)
    pot, log2 = checked_log2(so)
    if not pot or log2 != -15:
        raise ShapeError(f"{op}: TFLite's int16 {fn.upper()} needs output scale 1/32768, got {so}")
    if fn == "logistic":
        mult, shift = lut_activation_params(si, lambda sh: sh == 0)
        return logistic16(xs[0], mult, shift)
    mult, shift = lut_activation_params(si, lambda sh: sh in (0, 1))
    return tanh16(xs[0], mult, shift)


def lut16_quant(err, where, qi, qo, name):
    """int16 LOGISTIC / TANH Prepare: zero points 0, output scale 1/32768."""
    symmetric16(err, where, [("the input", qi), ("the output", qo)])
    pot, log2 = checked_log2(qo.scale[0])
    if not pot or log2 != -15:
        raise err(f"{where}: output scale {qo.scale[0]!r} is out of range: allowed 1/32768 (TFLite's int16 {name})")


mark(INT16, "add", "mul", "relu", "relu6", "sigmoid", "tanh")   # the 16x8 rules above
