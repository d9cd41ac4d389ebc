"""C overrides of softmax, mean, pad and concat for int8 (TFLite semantics), and (de)quantisation.
Float (and data movement, which is exact for int8 too) is the op's TE compute (``lower.lower_te``)."""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from kiln.frontend import fixedpoint as fp
from kiln.frontend.ops.int16util import softmax16_tables
from kiln.frontend.ops.reduce_shape import (
    SOFTMAX_ACCUMULATION_INTEGER_BITS,
    SOFTMAX_SCALED_DIFF_INTEGER_BITS,
    mean_params,
    softmax_params,
)

from . import gemmlowp, inplace, qmath
from .lower import decompose_reductions, lower_rule, lower_te
from .ops_elementwise import int8_table
from .ops_shape import int32_sum
from .qmath import c

F32 = "float32"


def _q(k, node):
    return any(k.type(v).quant is not None for v in list(node.inputs) + [node.name])


def _shape(t):
    return t.shape or (1,)


# ---- softmax --------------------------------------------------------------------------------
def _newton(hd, prev):
    return lambda *i: gemmlowp.newton_step(hd(*i), prev(*i))


def row_reciprocal(sm, R, acc_bits):
    """TFLite's GetReciprocal(sum, 12) of each row sum ``sm`` (shape ``R``), one small per-row TE
    stage per step (no deep Let nesting): (scale, number of integer bits) per row. The int8 softmax
    of the C backend and of CUDA share it."""
    clz = te.compute(R, lambda *i: gemmlowp.clz_positive(sm(*i)), name="rowclz")
    xr = te.compute(R, lambda *i: ((sm(*i).astype("uint32") << clz(*i).astype("uint32"))
                                   - tirx.const(1 << 31, "uint32")).astype("int32"), name="rowx")
    hd = te.compute(R, lambda *i: gemmlowp.rounding_half_sum_max(xr(*i)), name="rowhalf")
    nr = te.compute(R, lambda *i: c(1515870810) + qmath.srdhm(hd(*i), c(-1010580540)), name="nr0")
    for it in range(3):
        nr = te.compute(R, _newton(hd, nr), name=f"nr{it + 1}")
    scale = te.compute(R, lambda *i: gemmlowp.srmbpot_tir(nr(*i), 1), name="rowscale")
    nbits = te.compute(R, lambda *i: c(acc_bits) - clz(*i), name="rowbits")
    return scale, nbits


def softmax_exp_table(mult, left, diff_min):
    """The int8 softmax's exp table: ``(lo, table)``. ``table[d - lo + 1]`` is gemmlowp's
    exp_on_negative_values of the rescaled difference ``d = x - max`` for ``d`` in ``[lo, 0]``,
    and ``table[0] = 0`` stands for every ``d < lo`` (the kernel reads
    ``table[max(d, lo - 1) - (lo - 1)]``; when ``lo == -255`` every int8 difference is in range
    and there is no zero entry: ``table[d + 255]``).

    ``lo >= max(diff_min, -255)`` is the first difference whose sum term
    ``RoundingDivideByPOT(e, 12)`` is non-zero. Every ``d < lo`` gives the same bits as ``e = 0``
    (the reference's value below diff_min): its term is 0 (e < 2^11), and its output
    ``RoundingDivideByPOT(SRDHM(scale, e), bits + 23)`` is 0 too, hence -128, because
    ``SRDHM(scale, e) <= e < 2^22`` (scale <= INT32_MAX) and ``bits >= 0`` (the row maximum alone
    adds ``2^19`` to the sum)."""
    d = np.arange(-255, 1, dtype=np.int64)
    e = fp.exp_on_negative_values(fp.multiply_by_quantized_multiplier_greater_than_one(d, mult, left),
                                  SOFTMAX_SCALED_DIFF_INTEGER_BITS)
    e = np.where(d >= diff_min, e, 0)
    term = fp.rounding_divide_by_pot(e, SOFTMAX_ACCUMULATION_INTEGER_BITS)
    lo = int(d[term != 0].min())       # exp(0) = INT32_MAX, so there is one
    assert (e[d < lo] < 1 << 22).all()
    tab = e[d >= lo] if lo == -255 else np.concatenate([[0], e[d >= lo]])
    return lo, np.asarray(tab, np.int32)


def _softmax_int8(k, node, x, tx, ty):
    bits = 16 if ty.dtype == "int16" else 8      # int8 -> int16: TFLite's Softmax<int8_t, int16_t>
    if ty.quant is None or abs(ty.quant.scale[0] - 1 / (1 << bits)) > 0.001 / (1 << bits) \
            or ty.quant.zero_point[0] != -(1 << (bits - 1)):
        k.fail(f"int8 softmax needs output scale 1/256 and zero point -128 (int16 output: 1/65536 and -32768; "
               f"TFLite), got {ty}")
    axis = node.attrs["axis"] % len(tx.shape)
    if axis != len(tx.shape) - 1:
        k.fail("int8 softmax runs over the last axis")
    acc_bits = SOFTMAX_ACCUMULATION_INTEGER_BITS
    mult, left, diff_min = softmax_params(tx.quant.scale[0])
    # Every int8 difference d = x - max lies in [-255, 0]. Only exp(d) is tabulated, and only from
    # the first d >= diff_min whose sum term is non-zero (plus one zero entry that every smaller d
    # is clamped onto; see softmax_exp_table for why that is bit-exact); the sum term is computed
    # from exp (no second table). The shared models: ResNet-8 d in [-80, 0], 82 entries (328 B),
    # KWS d in [-95, 0], 97 entries (388 B), instead of two 256-entry tables (2 KiB). Computing
    # exp in the kernel with no table at all (gemmlowp's polynomial + barrel shifter as
    # per-element stages) is bit-exact but was bigger on Cortex-M4: 1692 B of code against 948 B
    # of code + a 504 B table at the time (and this table is smaller still).
    tab_lo, tab_e = softmax_exp_table(mult, left, diff_min) if bits == 8 else _exp_table_full(mult, left, diff_min)
    texp = k.const("exp", tab_e)
    D = tx.shape[-1]
    lead = tx.shape[:-1]
    if k.target.softmax_helper and isinstance(x.op, te.PlaceholderOp) and bits == 8:
        # one call of kiln_softmax_s8 (kiln_intrinsics.h): the same arithmetic as the stages
        # below in ~250 B of code instead of ~950 B (CLZ instruction, no inline int64 chains)
        return _softmax_int8_extern(k, x, texp, tab_lo, int(np.prod(lead)) if lead else 1, D, ty)
    r = te.reduce_axis((0, D), "r")
    mx = te.compute(lead or (1,), lambda *i: te.max(x[(i if lead else ()) + (r,)], axis=[r]), name="rowmax")
    r2 = te.reduce_axis((0, D), "r2")

    def exp(i, col):
        dd = x[i + (col,)].astype("int32") - mx[i or (0,)].astype("int32")
        if tab_lo == -255:
            return texp[dd + c(255)]
        # a clamp onto the zero entry: branch-free, 32 B less code than an if_then_else on the M4
        return texp[tirx.max(dd, c(tab_lo - 1)) - c(tab_lo - 1)]

    def term(e):
        # SaturatingRoundingMultiplyByPOT<-12>(e) = RoundingDivideByPOT(e, 12) for e >= 0, i.e.
        # (e + 2^11) >> 12; in uint32 so that e = INT32_MAX does not overflow
        return ((e.astype("uint32") + tirx.const(1 << (acc_bits - 1), "uint32"))
                >> tirx.const(acc_bits, "uint32")).astype("int32")
    sm = te.compute(lead or (1,), lambda *i: te.sum(term(exp(i if lead else (), r2)), axis=[r2]), name="rowsum")

    scale, nbits = row_reciprocal(sm, lead or (1,), acc_bits)
    k.schedule(lambda sch, out_block: decompose_reductions(sch))   # per-row stages stay separate

    def body(*i):
        row = i[:-1]
        ri = row or (0,)
        e = exp(row, i[-1])
        v = qmath.rdbpot(qmath.srdhm(scale[ri], e), nbits[ri] + c(31 - bits))
        lo = -(1 << (bits - 1))
        return qmath.clamp(v + c(lo), lo, -lo - 1).astype(ty.dtype)
    return te.compute(_shape(ty), body, name="softmax")


def _exp_table_full(mult, left, diff_min):
    """exp of every int8 difference in [-255, 0] (0 below diff_min): the int16-output softmax
    cannot use softmax_exp_table's trimming (its argument holds for 8 output bits only)."""
    d = np.arange(-255, 1, dtype=np.int64)
    e = fp.exp_on_negative_values(fp.multiply_by_quantized_multiplier_greater_than_one(d, mult, left),
                                  SOFTMAX_SCALED_DIFF_INTEGER_BITS)
    return -255, np.asarray(np.where(d >= diff_min, e, 0), np.int32)


def _softmax_int8_extern(k, x, texp, tab_lo, rows, D, ty):
    base = tab_lo - 1 if tab_lo > -255 else -255      # softmax_exp_table's layout
    k.schedule(lambda sch, out_block: None)

    def fcompute(ins, outs):
        xb, tb = ins
        return tirx.Evaluate(tirx.call_extern("void", "kiln_softmax_s8", xb.access_ptr("r"), c(rows), c(D),
                                              tb.access_ptr("r"), c(base), outs[0].access_ptr("w")))
    bufs = [tirx.decl_buffer(t.shape, t.dtype, name=t.op.name, elem_offset=0) for t in (x, texp)]
    yb = tirx.decl_buffer(_shape(ty), "int8", name="softmax", elem_offset=0)
    return te.extern(_shape(ty), [x, texp], fcompute, name="softmax", dtype="int8", in_buffers=bufs,
                     out_buffers=[yb])


@lower_rule("softmax")
def lower_softmax(k, node, xs):
    if not _q(k, node):
        return None                          # float: the op's TE compute
    tx, ty = k.type(node.inputs[0]), k.type(node.name)
    if tx.dtype == "int16":
        return softmax16(k, node, xs[0], tx, ty)
    if tx.dtype != "int8" or tx.quant is None:
        k.fail(f"int8 softmax needs a quantised int8 input, got {tx}")
    return _softmax_int8(k, node, xs[0], tx, ty)


# ---- int8 mean ------------------------------------------------------------------------------
@lower_rule("mean")
def lower_mean(k, node, xs):
    if not _q(k, node):
        return None                          # float: the op's TE compute
    tx, ty = k.type(node.inputs[0]), k.type(node.name)
    acc, shape, count = int32_sum(xs[0], tx, ty, node.attrs)
    zi, zo = int(tx.quant.zero_point[0]), int(ty.quant.zero_point[0])
    m, sh = mean_params(tx.quant.scale[0], ty.quant.scale[0], count)

    lo, hi = (-32768, 32767) if ty.dtype == "int16" else (-128, 127)     # int16: TFLite's 16x8 MEAN

    def body(*i):
        v = qmath.mbqm(acc(*i) - c(zi * count), c(m), sh)
        return qmath.clamp(v + c(zo), lo, hi).astype(ty.dtype)
    return te.compute(shape, body, name="mean")


# ---- int8 data movement ---------------------------------------------------------------------
@lower_rule("pad")
def lower_pad(k, node, xs):
    """int8 pads with the quantised fill value (the zero point for 0.0), as the int8 reference."""
    tx = k.type(node.inputs[0])
    if tx.quant is None:
        return None                          # the op's TE compute, with its fill value
    fill = int(np.clip(fp.quantize_value(node.attrs["value"], tx.quant.scale[0], tx.quant.zero_point[0]), -128, 127))
    return lower_te(k, node, xs, dict(node.attrs, value=fill))


@lower_rule("concat")
def lower_concat(k, node, xs):
    ty = k.type(node.name)
    if ty.quant is not None and any(k.type(v).quant != ty.quant for v in node.inputs):
        k.fail("int8 concat needs the same quantisation on every input and the output")
    return None                              # data movement: the op's TE compute


# ---- (de)quantisation -----------------------------------------------------------------------
def _round_half_away(v):
    """C round() / TfLiteRound exactly: floor(|v|), +1 if the fraction is >= 0.5, sign restored
    (floor(v + 0.5) is wrong for 0.49999997)."""
    def body(vv):
        return qmath.let("qa", tirx.Select(vv < tirx.const(0.0, F32), -vv, vv), lambda a: qmath.let(
            "qf", tirx.floor(a), lambda f: qmath.let(
                "qr", tirx.Select(a - f >= tirx.const(0.5, F32), f + tirx.const(1.0, F32), f),
                lambda r: tirx.Select(vv < tirx.const(0.0, F32), -r, r), F32), F32), F32)
    return qmath._bind("qx", v, body, F32)


@lower_rule("quantize")
def lower_quantize(k, node, xs):
    x = xs[0]
    tx, ty = k.type(node.inputs[0]), k.type(node.name)
    int32_out = ty.dtype == "int32" and tx.dtype == "int16"       # TFLite's int16 -> int32 requantise
    if ty.quant is None or ty.quant.per_channel or (ty.dtype not in ("int8", "int16") and not int32_out):
        k.fail(f"quantize to {ty}: per-tensor int8 or int16 output (or int32 from int16) expected")
    qlo, qhi = {"int32": (-(1 << 31), (1 << 31) - 1), "int16": (-32768, 32767)}.get(ty.dtype, (-128, 127))
    zo, so = int(ty.quant.zero_point[0]), float(np.float32(ty.quant.scale[0]))
    k.inplace(node.inputs[0], inplace.elementwise_shift(tx, ty) or 0)
    if tx.dtype == F32:
        # the scale as a float32 constant array: C literals printed by TVM keep only 7 digits
        sc = k.const("scale", np.asarray([so], np.float32))
        lo, hi = float(qlo - zo), float(qhi - zo)
        return te.compute(_shape(ty), lambda *i: (qmath.let("qv", _round_half_away(x(*i) / sc[0]), lambda r: tirx.max(
            tirx.min(r, tirx.const(hi, F32)), tirx.const(lo, F32)), F32).astype("int32") + c(zo)).astype(ty.dtype),
            name="quantize")
    if tx.dtype in ("int8", "int16") and tx.quant is not None:
        zi = int(tx.quant.zero_point[0])
        m, sh = qmath.quantize_multiplier(float(np.float32(tx.quant.scale[0])) / so)
        return te.compute(_shape(ty), lambda *i: qmath.clamp(
            qmath.mbqm(x(*i).astype("int32") - c(zi), c(m), sh) + c(zo), qlo, qhi).astype(ty.dtype), name="requantize")
    k.fail(f"quantize from {tx} is not supported")


@lower_rule("dequantize")
def lower_dequantize(k, node, xs):
    x = xs[0]
    tx, ty = k.type(node.inputs[0]), k.type(node.name)
    if tx.quant is None or tx.quant.per_channel or ty.dtype != F32:
        k.fail(f"dequantize {tx} -> {ty}: per-tensor quantised input and float32 output expected")
    if tx.dtype == "int16":
        return dequantize16(k, x, tx, ty)
    # 256 possible inputs: the table is the int8 reference's own result (exact)
    table = k.const("table", int8_table(k, node).astype(np.float32))
    return te.compute(_shape(ty), lambda *i: table[x(*i).astype("int32") + c(128)], name="dequantize")


# ---- int16 ----------------------------------------------------------------------------------------
# TFLite's int16 SOFTMAX (reference_ops::SoftmaxInt16: 513-entry exp and 1/(1+x) tables with 7-bit
# interpolation, frontend/ops/int16util.softmax16_rows) and int16 DEQUANTIZE.
def dequantize16(k, x, tx, ty):
    """float32(double(scale) * (q - zp)) is the float32 product of float32(scale) and (q - zp):
    |q - zp| < 2^17 makes the double product exact, so both round once, to the same float."""
    sc = k.const("scale", np.asarray([np.float32(tx.quant.scale[0])], np.float32))
    zi = int(tx.quant.zero_point[0])
    return te.compute(_shape(ty), lambda *i: (x(*i).astype("int32") - c(zi)).astype(F32) * sc[0], name="dequantize")


def _lut16(tab, v):
    """LUTLookup(int16 v, 513-entry table): 9-bit index, 7-bit interpolation (slopes fit int16).
    ``v`` is an expression free of Let bindings (it indexes the table)."""
    idx = (v >> c(7)) + c(256)
    base = tab[idx]
    return base + (((tab[idx + c(1)] - base) * tirx.bitwise_and(v, c(0x7F)) + c(64)) >> c(7))


def softmax16(k, node, x, tx, ty):
    si, zi = float(np.float32(tx.quant.scale[0])), int(tx.quant.zero_point[0])
    if zi or ty.quant is None or int(ty.quant.zero_point[0]) or abs(ty.quant.scale[0] - 1 / 32768) > 0.001 / 32768:
        k.fail(f"int16 softmax needs zero points 0 and output scale 1/32768 (TFLite), got {tx} -> {ty}")
    if node.attrs["axis"] % len(tx.shape) != len(tx.shape) - 1:
        k.fail("int16 softmax runs over the last axis")
    exp_lut, rec_lut = softmax16_tables()
    for t in (exp_lut, rec_lut):
        assert np.abs(np.diff(t)).max() < 32768          # the kernel's int16 slopes do not wrap
    texp, trec = k.const("exptab", exp_lut.astype(np.int32)), k.const("rectab", rec_lut.astype(np.int32))
    m, sh = qmath.quantize_multiplier(si * 1.0 / (10.0 / 65535.0))
    D, lead = tx.shape[-1], tx.shape[:-1]
    R = lead or (1,)
    r = te.reduce_axis((0, D), "r")
    mx = te.compute(R, lambda *i: te.max(x[(i if lead else ()) + (r,)], axis=[r]), name="rowmax")

    sym = te.compute(tx.shape, lambda *i: qmath.clamp(qmath.mbqm(
        x(*i).astype("int32") - mx[i[:-1] or (0,)].astype("int32"), c(m), sh) + c(32767), -32768, 32767), name="sym")
    ex = te.compute(tx.shape, lambda *i: _lut16(texp, sym(*i)), name="expv")

    def exp(row, col):
        return ex[row + (col,)]
    r2 = te.reduce_axis((0, D), "r2")
    sm = te.compute(R, lambda *i: te.sum(exp(i if lead else (), r2), axis=[r2]), name="rowsum")
    h = te.compute(R, lambda *i: gemmlowp.clz_positive(sm(*i)), name="rowclz")
    ssum = te.compute(R, lambda *i: qmath.clamp(
        (((sm(*i).astype("int64") << (h(*i) - c(1)).astype("int64")) + c(1 << 13, "int64")) >> c(14, "int64"))
        .astype("int32") - c((1 << 15) + (1 << 16)), -32768, 32767), name="rowsym")
    rec = te.compute(R, lambda *i: _lut16(trec, ssum(*i)), name="rowrec")
    k.schedule(lambda sch, out_block: decompose_reductions(sch))

    def body(*i):
        row = i[:-1]
        ri = row or (0,)
        rs = (c(31) - h[ri]).astype("int64")
        v = (exp(row, i[-1]).astype("int64") * rec[ri].astype("int64") + (c(1, "int64") << (rs - c(1, "int64")))) >> rs
        return tirx.max(tirx.min(v, c(32767, "int64")), c(0, "int64")).astype("int16")
    return te.compute(_shape(ty), body, name="softmax16")
