"""C overrides for int8 ``sum`` and int8 bilinear ``resize`` (TFLite semantics). The other data
movement ops (transpose, slice, gather, nearest resize, max/min) copy raw values, so their int8
form is the op's own TE compute, like float."""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from kiln.frontend.ops import norm_axes
from kiln.frontend.ops import te_helpers as T
from kiln.frontend.ops.l2norm import OUTPUT_SHIFT
from kiln.frontend.ops.resize import bilinear_int
from kiln.frontend.registry import get_op

from . import gemmlowp, qmath
from .lower import decompose_reductions, lower_rule
from .qmath import c


def _q(k, node):
    return any(k.type(v).quant is not None for v in list(node.inputs) + [node.name])


def int32_sum(x, tx, ty, attrs, name="acc"):
    """The int32 sum of the integer tensor ``x`` (type ``tx``) over ``attrs["axes"]`` (``keepdims``
    as the attributes say), as a TE compute of the output's shape ((1,) for a scalar ``ty``).
    Returns (acc, shape, count): ``count`` is the number of elements summed into each output.
    The int8/int16 SUM and MEAN lowerings share it."""
    axes = norm_axes(attrs["axes"], len(tx.shape))
    raxes = {a: te.reduce_axis((0, tx.shape[a]), f"r{a}") for a in axes}
    count = int(np.prod([tx.shape[a] for a in axes])) if axes else 1
    shape = tuple(ty.shape) or (1,)

    def src(i):
        it, idx = iter(i if ty.shape else ()), []
        for d in range(len(tx.shape)):
            if d in raxes:
                idx.append(raxes[d])
                if attrs["keepdims"]:
                    next(it)
            else:
                idx.append(next(it))
        return x[tuple(idx)].astype("int32")
    if raxes:
        acc = te.compute(shape, lambda *i: te.sum(src(i), axis=[raxes[a] for a in axes]), name=name)
    else:
        acc = te.compute(shape, lambda *i: src(i), name=name)
    return acc, shape, count


@lower_rule("sum")
def lower_sum(k, node, xs):
    """TensorFlow Lite Micro's int8 and int16 SUM (QuantizedMeanOrSum with compute_sum; the
    reference is frontend/ops/reductions.requantised_sum): the int32 sum less ``z_in * count``,
    ``MultiplyByQuantizedMultiplier`` of ``s_in / s_out``, plus ``z_out``, clamped."""
    if not _q(k, node):
        return None                          # float: the op's TE compute
    tx, ty = k.type(node.inputs[0]), k.type(node.name)
    if ty.dtype not in ("int8", "int16") or tx.dtype != ty.dtype:
        k.fail(f"quantised sum needs int8 or int16 input and output of one type, got {tx}, {ty}")
    acc, shape, count = int32_sum(xs[0], tx, ty, node.attrs)
    si, so = float(np.float32(tx.quant.scale[0])), float(np.float32(ty.quant.scale[0]))
    zi, zo = int(tx.quant.zero_point[0]), int(ty.quant.zero_point[0])
    m, sh = qmath.quantize_multiplier(si / so)
    info = np.iinfo(ty.dtype)
    return te.compute(shape, lambda *i: qmath.clamp(qmath.mbqm(acc(*i) - c(zi * count), c(m), sh) + c(zo),
                                                    int(info.min), int(info.max)).astype(ty.dtype), name="sum")


@lower_rule("resize")
def lower_resize(k, node, xs):
    """int8 bilinear: ResizeBilinearInteger (10-bit positions; the sum of the four products fits
    int32: |x| <= 128 and each weight pair is at most 2^11 x 2^11)."""
    tx = k.type(node.inputs[0])
    if tx.quant is None or node.attrs["mode"] != "bilinear":
        return None                          # float, and int8 nearest (raw copies): the TE compute
    x = xs[0]
    ty = k.type(node.name)
    _, H, W, _ = tx.shape
    oh, ow = node.attrs["size"]
    ac, hp = node.attrs["align_corners"], node.attrs["half_pixel_centers"]
    # per output row/column: lower index, upper index, the 10-bit fraction (tables in flash)
    tabs = []
    for n_in, n_out, tag in ((H, oh, "y"), (W, ow, "x")):
        v, lo, hi = bilinear_int(n_in, n_out, ac, hp)
        tabs.append(k.const(f"resize_{tag}", np.stack([lo, hi, v - 1024 * lo]).astype(np.int32)))
    ty_, tx_ = tabs
    one = c(1024)

    def body(b, i, j, ch):
        y0, y1, fy = ty_[0, i], ty_[1, i], ty_[2, i]
        x0, x1, fx = tx_[0, j], tx_[1, j], tx_[2, j]

        def at(yy, xx):
            return x[b, yy, xx, ch].astype("int32")
        s = (at(y0, x0) * (one - fy) * (one - fx) + at(y1, x0) * fy * (one - fx)
             + at(y0, x1) * (one - fy) * fx + at(y1, x1) * fy * fx)
        r = tirx.Select(s > c(0), c(1 << 19), c(-(1 << 19)))
        return tirx.truncdiv(s + r, c(1 << 20)).astype("int8")
    return te.compute(ty.shape, body, name="resize")


def _raw_reduce(k, node, xs):
    """int8 max/min: the op's TE compute on the raw values (TFLite keeps the quantisation)."""
    tx, ty = k.type(node.inputs[0]), k.type(node.name)
    if tx.quant is None:
        return None                          # float: the op's TE compute
    if ty.quant != tx.quant:
        k.fail(f"int8 {node.op} keeps the quantisation: input {tx} and output {ty} must share it (TFLite)")
    y = get_op(node.op).te(T, xs, node.attrs, ty)
    return y if ty.shape else te.compute((1,), lambda i: y(), name=node.op)


lower_rule("max")(_raw_reduce)
lower_rule("min")(_raw_reduce)


@lower_rule("argmax")
def lower_argmax(k, node, xs):
    """int8 argmax/argmin compare raw values (the op's TE compute); the output is an int32 index."""
    if k.type(node.inputs[0]).quant is None:
        return None
    return get_op(node.op).te(T, xs, node.attrs, k.type(node.name))


lower_rule("argmin")(lower_argmax)


# ---- int8 l2_normalize: reference_integer_ops::L2Normalization ------------------------------------
def _srmbpot(x, e):
    return gemmlowp.srmbpot_tir(x, e)


def _newton_step(xp, half):
    """x = Rescale<3>(3/2 x - (input/2) Rescale<3>(x^3)) in gemmlowp's F3 format."""
    def step(*i):
        x3 = _srmbpot(qmath.srdhm(qmath.srdhm(xp(*i), xp(*i)), xp(*i)), 6)
        return _srmbpot(qmath.srdhm(c((1 << 28) + (1 << 27)), xp(*i)) - qmath.srdhm(half(*i), x3), 3)
    return step


@lower_rule("l2_normalize")
def lower_l2_normalize(k, node, xs):
    """Per row: the int32 sum of squares, GetInvSqrtQuantizedMultiplierExp as small per-row
    stages (normalisation by even shifts, five F3 Newton-Raphson steps), then each element's
    MultiplyByQuantizedMultiplier by the row's multiplier and shift + 7."""
    tx, ty = k.type(node.inputs[0]), k.type(node.name)
    if tx.quant is None:
        return None                          # float: the op's TE compute
    if ty.quant is None or ty.quant.zero_point[0] != 0 or abs(ty.quant.scale[0] - 1 / 128) > 1e-9:
        k.fail(f"int8 l2_normalize needs output scale 1/128 and zero point 0 (TFLite), got {ty}")
    x = xs[0]
    zi = int(tx.quant.zero_point[0])
    shape = tuple(tx.shape)
    R, D = shape[:-1] or (1,), shape[-1]
    d = len(shape) - 1

    def row(i):
        return tuple(i) if d else ()
    r = te.reduce_axis((0, D), "r")

    def sq(i, j):
        v = x[row(i) + (j,)].astype("int32") - c(zi)
        return v * v
    acc = te.compute(R, lambda *i: te.sum(sq(i, r), axis=r), name="l2_acc")
    # input <= 1: multiplier INT32_MAX, shift 0; else normalise into [2^27, 2^29) by bit pairs
    v0 = te.compute(R, lambda *i: tirx.max(acc(*i), c(2)), name="l2_v0")
    big = te.compute(R, lambda *i: tirx.Select(v0(*i) >= c(1 << 29), c(1), c(0)), name="l2_big")
    v1 = te.compute(R, lambda *i: tirx.Select(big(*i) == c(1), tirx.truncdiv(v0(*i), c(4)), v0(*i)), name="l2_v1")
    pairs = te.compute(R, lambda *i: tirx.truncdiv(gemmlowp.clz_positive(v1(*i)) - c(1), c(2)) - c(1),
                       name="l2_pairs")
    half = te.compute(R, lambda *i: qmath.rdbpot((v1(*i) << (pairs(*i) * c(2))) >> c(1), 1), name="l2_half")
    xn = te.compute(R, lambda *i: c(1 << 28), name="l2_x0")
    for it in range(5):
        xn = te.compute(R, _newton_step(xn, half), name=f"l2_x{it + 1}")
    # right shift s = 11 + big - pairs; s < 0 shifts the multiplier left instead
    mult = te.compute(R, lambda *i: tirx.Select(acc(*i) <= c(1), c(2 ** 31 - 1), qmath.let(
        "ls", c(11) + big(*i) - pairs(*i), lambda s: tirx.Select(
            s < c(0), qmath.srdhm(xn(*i), c(1518500250)) << (c(0) - s), qmath.srdhm(xn(*i), c(1518500250))))),
        name="l2_mult")
    rshift = te.compute(R, lambda *i: tirx.Select(acc(*i) <= c(1), c(0),
                                                  tirx.max(c(11) + big(*i) - pairs(*i), c(0))), name="l2_rshift")
    k.schedule(lambda sch, out_block: decompose_reductions(sch))

    def body(*i):
        ri = row(i[:-1]) or (0,)
        v = x[i].astype("int32") - c(zi)
        total = c(OUTPUT_SHIFT) - rshift[ri]          # MultiplyByQuantizedMultiplier's shift
        left = tirx.max(total, c(0))
        right = tirx.max(c(0) - total, c(0))
        return qmath.clamp(qmath.mbqm(v, mult[ri], (left, right)), -128, 127).astype("int8")
    return te.compute(shape, body, name="l2_normalize")
