"""Helium (MVE) lowerings for cores with the M-profile Vector Extension (the Cortex-M55):
int8 conv2d (groups 1) as a GEMM with VMLADAVA (16 output pixels per channel block for reductions
of at most 32), int8 depthwise conv with channels across the vector lanes and average pooling,
all requantising with VQRDMULH and a rounding shift, plus the constants of the int8 ADD and MUL
kernels (``lower_binary_mve``; ``ops_helium.py`` claims those ops and FULLY_CONNECTED). The
kernels are in ``kiln_mve.h``, which also holds the portable C versions a host build of the same
package runs.

Each lowering returns None when it does not apply (weights or bias not compile-time constants,
an input that is not a kernel argument, dilation in a regular conv, a depth multiplier other
than 1, a folded bias beyond int32, broadcasting operands), and the generic or DSP lowering goes
on. Prepare (packing, the folded bias, the requantisation table) happens here at compile time;
the kernels only compute.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from kiln.frontend.ops.elementwise import ADD_LEFT_SHIFT
from kiln.frontend.ops.elementwise import add_params as add_qparams
from kiln.frontend.ops.elementwise import mul_params as mul_qparams

from .qmath import activation_range, c, linear_requant

DW_MAX_TAPS = 64      # KILN_MVE_DW_MAX_TAPS in kiln_mve.h
GEMM_GROUP = 16       # KILN_MVE_GROUP: the largest group of output pixels of kiln_mve_conv_s8


def pack_gemm(w2):
    """(O, K) int8 weights -> the layout ``kiln_mve_gemm`` reads: O padded to a multiple of 4 and
    K to a multiple of 16 with zeros; per block of 4 output channels, per 16-wide chunk of the
    reduction, the 4 channels' 16 bytes. Shape (Op // 4, Kp // 16 * 64)."""
    w2 = np.asarray(w2, np.int8)
    O, K = w2.shape
    Op, Kp = -(-O // 4) * 4, -(-K // 16) * 16
    wp = np.zeros((Op, Kp), np.int8)
    wp[:O, :K] = w2
    blk = wp.reshape(Op // 4, 4, Kp // 16, 16).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(blk).reshape(Op // 4, Kp * 4)


def dw_perm(C):
    """How ``kiln_mve_dw_s8`` orders a depthwise conv's channels in its accumulator vectors: 16
    (C % 16 == 0), 8 (C % 8 == 0) or 0 (channel order)."""
    return 16 if C % 16 == 0 else 8 if C % 8 == 0 else 0


def slots(n, perm=0):
    """Table slot of each of n channels (``kiln_mve_slot``): the channel itself (perm 0); with
    perm 16 the depthwise accumulator order {0,4,8,12}, {2,6,10,14}, {1,5,9,13}, {3,7,11,15} within
    each 16, with perm 8 {0,2,4,6}, {1,3,5,7} within each 8."""
    c = np.arange(n)
    if perm == 16:
        cc = c & 15
        return (c & ~15) + ((((cc & 1) << 1) | ((cc >> 1) & 1)) << 2) + (cc >> 2)
    if perm == 8:
        return (c & ~7) + ((c & 1) << 2) + ((c & 7) >> 1)
    return c


def requant_table(bias, mult, shift, perm=0):
    """int32 words, per block of 4 channel slots {bias x4, mult x4, left shift x4, -right shift x4}
    (the layout kiln_mve.h documents; N padded to a multiple of 4). ``bias`` already holds the
    folded input zero point."""
    n = len(mult)
    np_ = -(-n // 4) * 4
    shift = np.asarray(shift, np.int64)
    tab = np.zeros((4, np_), np.int64)
    s = slots(n, perm)
    tab[0, s] = bias
    tab[1, s] = mult
    tab[2, s] = np.maximum(shift, 0)
    tab[3, s] = np.minimum(shift, 0)
    return tab.reshape(4, np_ // 4, 4).transpose(1, 0, 2).reshape(-1).astype(np.int32)


def _constants(k, node, O):
    """(weights, int64 bias[O]) when both are compile-time constants (no bias: zeros), else None."""
    w = k.value(node.inputs[1])
    if w is None:
        return None
    b = np.zeros(O, np.int64) if len(node.inputs) < 3 else k.value(node.inputs[2])
    if b is None:
        return None
    return np.asarray(w), np.asarray(b, np.int64).reshape(-1)


def _folded(bias, w2, zx):
    """bias - zx * sum(w) per output channel, or None when it leaves int32."""
    folded = bias - int(zx) * np.asarray(w2, np.int64).sum(axis=1)
    return None if np.abs(folded).max(initial=0) >= 2 ** 31 else folded


def _io(k, node):
    tx, ty = k.type(node.inputs[0]), k.type(node.name)
    zx, zy = int(tx.quant.zero_point[0]), int(ty.quant.zero_point[0])
    lo, hi = activation_range(node.attrs["activation"], float(ty.quant.scale[0]), zy)
    return tx, ty, zx, zy, lo, hi


def lower_conv_mve(k, node, x, G, out_shape=None):
    """int8 groups-1 conv2d as one ``kiln_mve_conv_s8`` call per image (None: not applicable)."""
    if not isinstance(x.op, te.PlaceholderOp) or G["dh"] != 1 or G["dw"] != 1:
        return None
    O = G["O"]
    wb = _constants(k, node, O)
    if wb is None:
        return None
    tx, ty, zx, zy, lo, hi = _io(k, node)
    w2 = wb[0].reshape(O, -1)
    folded = _folded(wb[1], w2, zx)
    if folded is None:
        return None
    mult, shift = linear_requant(tx, k.type(node.inputs[1]), ty, O)
    direct = G["KH"] == 1 and G["KW"] == 1 and G["pt"] == 0 and G["pl"] == 0
    v = node.inputs[0]
    if v in k.inplace_hints:
        k.inplace(v, max(k.inplace_hints[v], group_inplace_shift(G, direct, gemm_group(G))))
    wp = k.const("w_mve", pack_gemm(w2))
    q = k.const("rq_mve", requant_table(folded, mult, shift))
    k.schedule(lambda sch, out_block: None)
    return _conv_extern(x, wp, q, G, (zx, zy, lo, hi, int(np.max(shift) > 0)), out_shape)


def gemm_group(G):
    """Output pixels computed per pass: GEMM_GROUP (``kiln_mve_conv_grp_s8``) when the reduction is
    at most 32 (one or two 16-byte chunks: a block's table, and for one chunk its weights, stay in
    registers for the group), else 1 (``kiln_mve_conv_s8``)."""
    return GEMM_GROUP if G["KH"] * G["KW"] * G["C"] <= 32 else 1


def group_inplace_shift(G, direct, group=1):
    """The smallest safe in-place shift of ``kiln_mve_conv_s8`` (``backends/inplace.py``'s measure,
    for its write order): it writes ``group`` output pixels at a time, channel by channel, so a
    group's outputs must not reach input bytes that group still reads (a 1x1 conv reads its
    pixels in place: the group's own inputs count) or that any later group reads."""
    N, H, W, C, O = G["N"], G["H"], G["W"], G["C"], G["O"]
    oh, ow = G["oh"], G["ow"]
    h0 = np.clip(np.arange(oh) * G["sh"] - G["pt"], 0, H - 1)[:, None]
    w0 = np.clip(np.arange(ow) * G["sw"] - G["pl"], 0, W - 1)[None, :]
    pix = (h0 * W + w0).reshape(-1)
    ends, reads = [], []
    for n in range(N):
        for p in range(0, oh * ow, group):
            q = min(p + group, oh * ow)
            reads.append((n * H * W + pix[p:q].min()) * C)
            ends.append((n * oh * ow + q) * O)
    r = np.asarray(reads, np.int64)
    later = np.minimum.accumulate(r[::-1])[::-1]          # min over groups >= j
    if not direct:                                         # patches are copied before any write
        later = np.append(later[1:], np.iinfo(np.int64).max // 4)
    return int(max(0, (np.asarray(ends, np.int64) - later).max()))


def _conv_extern(x, wp, q, G, consts, out_shape):
    N, H, W, C = G["N"], G["H"], G["W"], G["C"]
    oh, ow, KH, KW, O = G["oh"], G["ow"], G["KH"], G["KW"], G["O"]
    K = KH * KW * C
    zx, zy, lo, hi, lsh = consts
    group = gemm_group(G)
    direct = KH == 1 and KW == 1 and G["pt"] == 0 and G["pl"] == 0
    fn = "kiln_mve_conv_grp_s8" if group > 1 else "kiln_mve_conv_s8"

    def fcompute(ins, outs):
        xb, wb, qb = ins
        patch = tirx.decl_buffer((1 if direct else group * K + (32 if group > 1 else 0),), "int8", name="patch")
        n = tirx.Var("n", "int32")
        call = tirx.call_extern("void", fn, xb.access_ptr("r", offset=n * c(H * W * C)),
                                c(H), c(W), c(C), c(KH), c(KW), c(G["sh"]), c(G["sw"]), c(G["pt"]), c(G["pl"]),
                                c(oh), c(ow), c(zx), patch.access_ptr("w"), wb.access_ptr("r"), c(O),
                                qb.access_ptr("r"), c(zy), c(lo), c(hi), c(lsh),
                                outs[0].access_ptr("w", offset=n * c(oh * ow * O)))
        body = tirx.For(n, c(0), c(N), tirx.ForKind.SERIAL, tirx.Evaluate(call))
        return tirx.SeqStmt([tirx.AllocBuffer(patch), body])
    return _extern(x, wp, q, fcompute, tuple(out_shape) if out_shape is not None else (N, oh, ow, O), "conv")


def _extern(x, wp, q, fcompute, shape, name):
    bufs = [tirx.decl_buffer(t.shape, t.dtype, name=t.op.name, elem_offset=0) for t in (x, wp, q)]
    yb = tirx.decl_buffer(shape, "int8", name=name, elem_offset=0)
    return te.extern(shape, [x, wp, q], fcompute, name=name, dtype="int8", in_buffers=bufs, out_buffers=[yb])


def lower_depthwise_mve(k, node, x, G):
    """int8 depthwise conv2d (depth multiplier 1) as one ``kiln_mve_dw_s8`` call per image."""
    if not isinstance(x.op, te.PlaceholderOp) or G["O"] != G["C"] or G["KH"] * G["KW"] > DW_MAX_TAPS:
        return None
    C = G["C"]
    wb = _constants(k, node, C)
    if wb is None:
        return None
    tx, ty, zx, zy, lo, hi = _io(k, node)
    wc = wb[0].reshape(C, G["KH"] * G["KW"])
    folded = _folded(wb[1], wc, zx)
    if folded is None:
        return None
    mult, shift = linear_requant(tx, k.type(node.inputs[1]), ty, C)
    lsh = int(np.max(shift) > 0)
    wt = np.ascontiguousarray(wc.T).astype(np.int8)
    qt = requant_table(folded, mult, shift, perm=dw_perm(C))
    pair = int(C == 8 and G["sw"] == 1)
    if pair:    # two neighbouring pixels as one of 16 channels: weights and table twice, after the others
        wt = np.concatenate([wt.ravel(), np.tile(wt, (1, 2)).ravel()])
        qt = np.concatenate([qt, requant_table(np.tile(folded, 2), np.tile(mult, 2), np.tile(shift, 2), perm=16)])
    wt = k.const("w_dw_mve", wt)
    q = k.const("rq_mve", qt)
    k.schedule(lambda sch, out_block: None)
    N, H, W = G["N"], G["H"], G["W"]
    oh, ow = G["oh"], G["ow"]

    def fcompute(ins, outs):
        xb, wbuf, qb = ins
        zrow = tirx.decl_buffer((C,), "int8", name="zrow")
        n = tirx.Var("n", "int32")
        call = tirx.call_extern("void", "kiln_mve_dw_s8", xb.access_ptr("r", offset=n * c(H * W * C)),
                                c(H), c(W), c(C), c(G["KH"]), c(G["KW"]), c(G["sh"]), c(G["sw"]), c(G["pt"]),
                                c(G["pl"]), c(G["dh"]), c(G["dw"]), c(oh), c(ow), c(zx), zrow.access_ptr("w"),
                                wbuf.access_ptr("r"), qb.access_ptr("r"), c(zy), c(lo), c(hi), c(pair), c(lsh),
                                outs[0].access_ptr("w", offset=n * c(oh * ow * C)))
        body = tirx.For(n, c(0), c(N), tirx.ForKind.SERIAL, tirx.Evaluate(call))
        return tirx.SeqStmt([tirx.AllocBuffer(zrow), body])
    return _extern(x, wt, q, fcompute, (N, oh, ow, C), "dwconv")


def lower_avg_pool_mve(k, node, x, G):
    """int8 average pooling as one ``kiln_mve_avgpool_s8`` call per image (None: an input that
    is not a kernel argument, or windows of more than 256 taps, whose int16 sums could overflow)."""
    if not isinstance(x.op, te.PlaceholderOp) or G["KH"] * G["KW"] > 256:
        return None
    N, H, W, C, oh, ow = G["N"], G["H"], G["W"], G["C"], G["oh"], G["ow"]

    def fcompute(ins, outs):
        sm = tirx.decl_buffer((-(-C // 8) * 8,), "int16", name="psum")
        n = tirx.Var("n", "int32")
        call = tirx.call_extern("void", "kiln_mve_avgpool_s8", ins[0].access_ptr("r", offset=n * c(H * W * C)),
                                c(H), c(W), c(C), c(G["KH"]), c(G["KW"]), c(G["sh"]), c(G["sw"]), c(G["pt"]),
                                c(G["pl"]), c(oh), c(ow), sm.access_ptr("w"), c(-128), c(127),
                                outs[0].access_ptr("w", offset=n * c(oh * ow * C)))
        return tirx.SeqStmt([tirx.AllocBuffer(sm),
                             tirx.For(n, c(0), c(N), tirx.ForKind.SERIAL, tirx.Evaluate(call))])
    k.schedule(lambda sch, out_block: None)
    xb = tirx.decl_buffer(x.shape, x.dtype, name=x.op.name, elem_offset=0)
    yb = tirx.decl_buffer((N, oh, ow, C), "int8", name="avgpool", elem_offset=0)
    return te.extern((N, oh, ow, C), [x], fcompute, name="avgpool", dtype="int8", in_buffers=[xb],
                     out_buffers=[yb])


def lower_conv2d(k, node, x, G, depthwise):
    """The Helium kernel for this conv2d, or None (ops_nn's DSP kernels then)."""
    if depthwise:
        return lower_depthwise_mve(k, node, x, G)
    if G["g"] == 1:
        return lower_conv_mve(k, node, x, G)
    return None


# ---- int8 ADD and MUL (ops_helium.py claims them on Helium targets) ---------------------------------
def _extern_n(ins, fcompute, shape, name):
    bufs = [tirx.decl_buffer(t.shape, t.dtype, name=t.op.name, elem_offset=0) for t in ins]
    yb = tirx.decl_buffer(shape, "int8", name=name, elem_offset=0)
    return te.extern(shape, ins, fcompute, name=name, dtype="int8", in_buffers=bufs, out_buffers=[yb])


def _shift_words(shift):
    """(left shift, minus the right shift) of a TFLite multiplier's shift."""
    return max(int(shift), 0), min(int(shift), 0)


def add_params(t1, t2, ty, lo=-128, hi=127):
    """``kiln_mve_add_s8``'s 14 int32 constants for TFLite's int8 ADD of these operand types."""
    (m1, sh1), (m2, sh2), (mo, sho) = add_qparams(t1.quant.scale[0], t2.quant.scale[0], ty.quant.scale[0])
    (l1, r1), (l2, r2), (lo_, ro) = _shift_words(sh1), _shift_words(sh2), _shift_words(sho)
    z1, z2, zy = (int(t.quant.zero_point[0]) for t in (t1, t2, ty))
    return np.array([z1, ADD_LEFT_SHIFT + l1, m1, r1, z2, ADD_LEFT_SHIFT + l2, m2, r2, lo_, mo, ro, zy, lo, hi],
                    np.int64).astype(np.int32)


def mul_params(t1, t2, ty, lo=-128, hi=127):
    """``kiln_mve_mul_s8``'s 8 int32 constants for TFLite's int8 MUL of these operand types."""
    m, sh = mul_qparams(float(np.float32(t1.quant.scale[0])), float(np.float32(t2.quant.scale[0])),
                        float(np.float32(ty.quant.scale[0])))
    left, rneg = _shift_words(sh)
    z1, z2, zy = (int(t.quant.zero_point[0]) for t in (t1, t2, ty))
    return np.array([z1, z2, left, m, rneg, zy, lo, hi], np.int64).astype(np.int32)


def lower_binary_mve(k, node, xs, name, lo=-128, hi=127):
    """int8 ``add`` / ``mul`` of two same-shape kernel arguments as one ``kiln_mve_add_s8`` /
    ``kiln_mve_mul_s8`` call over all elements, clamped to [lo, hi] (a fused relu); None otherwise
    (broadcasting, fused inputs)."""
    t1, t2, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
    if any(t.dtype != "int8" or t.quant is None or t.quant.per_channel for t in (t1, t2, ty)):
        return None
    if t1.shape != ty.shape or t2.shape != ty.shape or not all(isinstance(x.op, te.PlaceholderOp) for x in xs):
        return None
    params = (add_params if name == "add" else mul_params)(t1, t2, ty, lo, hi)
    n = int(np.prod(ty.shape, dtype=np.int64))
    k.inplace_hints_of_op()
    tab = k.const(f"{name}_mve", params)
    k.schedule(lambda sch, out_block: None)

    def fcompute(ins, outs):
        return tirx.Evaluate(tirx.call_extern("void", f"kiln_mve_{name}_s8", ins[0].access_ptr("r"),
                                              ins[1].access_ptr("r"), c(n), ins[2].access_ptr("r"),
                                              outs[0].access_ptr("w")))
    return _extern_n([xs[0], xs[1], tab], fcompute, tuple(ty.shape) or (1,), name)
