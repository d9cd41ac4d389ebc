"""Cortex-M DSP schedules (Armv7E-M / Armv8-M with the DSP extension).

conv2d (groups 1) and dense reduce over contiguous int8 runs: NHWC input channels and OHWI
weight rows. The schedule builds, per output pixel, the padded input patch ``[KH*KW*C_in]``
(im2col of one pixel; skipped for 1x1 stride-1 convs, whose pixel is already contiguous), keeps
4 (2, 1) int32 accumulators under a split output-channel loop, and tensorizes the (channel,
reduction) loops with a tensor intrinsic whose implementation calls ``kiln_dot{4,2,1}_w16``
(``kiln_intrinsics.h``: SXTB16/SMLAD against int16 weights packed at compile time by
``pack_w16``, two MACs per instruction, with a portable C version for host builds). The input
zero point is folded into the bias at compile time (``fold_zero_point``).
On Cortex-M0+/M3 (no DSP extension) the same helpers compile to their portable C versions
(``cpus.TargetSpec.kernels``); a target with ``kernels=False`` gets the default schedules of
``lower.py`` everywhere (tests use it to keep that path covered).
"""
from __future__ import annotations

import functools

import numpy as np
from tvm import s_tir, te, tirx
from tvm.script import tirx as T

from kiln.frontend.ops.nn import conv_geometry

from .qmath import c

_REGISTERED = set()


def channel_block(O):
    """Output channels per dot-product call (register blocking: each input word is loaded and
    sign-extended once for all of them)."""
    return 4 if O % 4 == 0 else 2 if O % 2 == 0 else 1


def packed_cols(K):
    """Row length (int8 elements) of the packed weight array for a reduction of length K: each
    weight becomes an int16, the reduction is padded to a multiple of 4."""
    return 2 * (-(-K // 4) * 4)


def pack_w16(w2, nb):
    """(O, K) int8 weights -> (O, packed_cols(K)) int8 bytes holding the int16 layout that
    ``kiln_dot{nb}_w16`` reads (see kiln_intrinsics.h): per block of nb output channels, per group
    of 4 reduction indices, per channel {w[k], w[k+2], w[k+1], w[k+3]}; then the K % 4 tail as one
    zero-padded 4-slot group per channel. Block b occupies rows b*nb .. b*nb+nb-1 of the result,
    so the TIR access w[b*nb, 0] points at it."""
    w2 = np.asarray(w2, dtype=np.int16)
    O, K = w2.shape
    G = K // 4
    wb = w2.reshape(O // nb, nb, K)
    main = wb[:, :, :4 * G].reshape(O // nb, nb, G, 4)[..., [0, 2, 1, 3]].transpose(0, 2, 1, 3)
    tail = np.zeros((O // nb, nb, 4), np.int16)
    tail[..., :K - 4 * G] = wb[:, :, 4 * G:]
    parts = [main.reshape(O // nb, -1)] + ([tail.reshape(O // nb, -1)] if K % 4 else [])
    packed = np.concatenate(parts, axis=1).astype("<i2")
    return packed.view(np.int8).reshape(O, packed_cols(K))


# Weight storage (the C backend's ``optimize`` setting, cpus.TargetSpec): "size" stores every
# conv/dense weight as int8 (pack_w8); "speed" keeps layers whose int8 weights are at most
# W16_MAX_BYTES in the int16 packing (pack_w16: no sign extension in the inner loop, twice the
# flash). docs/backend.md "Schedules" has the measured trade-off.
W16_MAX_BYTES = 4096


def weight_bits(O, K, optimize="size"):
    """8 or 16: how a conv/dense with (O, K) weights stores them (``optimize`` was checked by
    cpus.get)."""
    return 16 if optimize == "speed" and O * K <= W16_MAX_BYTES else 8


def pack_w8(w2, nb):
    """(O, K) int8 weights -> (O, ceil(K/4)*4) int8 in the order ``kiln_dot{nb}_w8`` reads: per
    block of nb output channels, per group of 4 reduction indices, per channel its 4 weights in
    natural order; the K % 4 tail zero-padded to one group. Block b occupies rows b*nb.."""
    w2 = np.asarray(w2, dtype=np.int8)
    O, K = w2.shape
    Kp = -(-K // 4) * 4
    wp = np.zeros((O, Kp), np.int8)
    wp[:, :K] = w2
    out = wp.reshape(O // nb, nb, Kp // 4, 4).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(out).reshape(O, Kp)


def pack_weights(wr, nb, optimize="size"):
    O, K = wr.shape
    return pack_w16(wr, nb) if weight_bits(O, K, optimize) == 16 else pack_w8(wr, nb)


def dotw_intrin(K, zx, nb, bits=16):
    """Register (once) acc[j] += sum_k (int32(a[k]) - zx) * W[j, k], j < nb, where W is a block of
    ``nb`` rows of a packed weight array (``pack_w16``). The description reads W[j, k] (k < K) of
    the packed rows: it is only the pattern the reduction is matched against; the implementation,
    ``kiln_dot{nb}_w16``, is what defines the packed layout and computes the true dot products."""
    name = f"kiln_dotw_s8_{K}_{zx}_{nb}_{bits}".replace("-", "m")
    if name in _REGISTERED:
        return name
    fn = f"kiln_dot{nb}_w{bits}"

    if nb == 1:
        @T.prim_func(s_tir=True)
        def desc(a: T.handle, b: T.handle, cc: T.handle):
            A = T.match_buffer(a, (K,), "int8", offset_factor=1)
            B = T.match_buffer(b, (K,), "int8", offset_factor=1)
            C = T.match_buffer(cc, (1,), "int32", offset_factor=1)
            with T.sblock("root"):
                T.reads(C[0], A[0:K], B[0:K])
                T.writes(C[0])
                for r in range(K):
                    with T.sblock("update"):
                        vr = T.axis.remap("R", [r])
                        C[0] = C[0] + (T.Cast("int32", A[vr]) - zx) * T.Cast("int32", B[vr])

        @T.prim_func(s_tir=True)
        def impl(a: T.handle, b: T.handle, cc: T.handle):
            A = T.match_buffer(a, (K,), "int8", offset_factor=1)
            B = T.match_buffer(b, (K,), "int8", offset_factor=1)
            C = T.match_buffer(cc, (1,), "int32", offset_factor=1)
            with T.sblock("root"):
                T.reads(C[0], A[0:K], B[0:K])
                T.writes(C[0])
                T.evaluate(T.call_extern("void", fn, A.access_ptr("r"), B.access_ptr("r"), K, -zx,
                                         C.access_ptr("rw")))
    else:
        @T.prim_func(s_tir=True)
        def desc(a: T.handle, b: T.handle, cc: T.handle):
            s0 = T.int32()
            A = T.match_buffer(a, (K,), "int8", offset_factor=1)
            B = T.match_buffer(b, (nb, K), "int8", strides=[s0, 1], offset_factor=1)
            C = T.match_buffer(cc, (nb,), "int32", offset_factor=1)
            with T.sblock("root"):
                T.reads(C[0:nb], A[0:K], B[0:nb, 0:K])
                T.writes(C[0:nb])
                for j, r in T.grid(nb, K):
                    with T.sblock("update"):
                        vj, vr = T.axis.remap("SR", [j, r])
                        C[vj] = C[vj] + (T.Cast("int32", A[vr]) - zx) * T.Cast("int32", B[vj, vr])

        @T.prim_func(s_tir=True)
        def impl(a: T.handle, b: T.handle, cc: T.handle):
            s0 = T.int32()
            A = T.match_buffer(a, (K,), "int8", offset_factor=1)
            B = T.match_buffer(b, (nb, K), "int8", strides=[s0, 1], offset_factor=1)
            C = T.match_buffer(cc, (nb,), "int32", offset_factor=1)
            with T.sblock("root"):
                T.reads(C[0:nb], A[0:K], B[0:nb, 0:K])
                T.writes(C[0:nb])
                T.evaluate(T.call_extern("void", fn, A.access_ptr("r"), B.access_ptr("r"), K, -zx,
                                         C.access_ptr("rw")))

    try:
        s_tir.TensorIntrin.register(name, desc, impl)
    except Exception:  # noqa: BLE001
        pass
    _REGISTERED.add(name)
    return name


def fold_zero_point(k, node, w2, zx):
    """sum_r (x - zx) * w = sum_r x * w - zx * sum_r w: the input zero point folded into a new
    bias constant at compile time (exact in int32, as TFLite accumulates; pad taps hold zx, so
    they contribute zx * w to the first sum and cancel). Returns (bias tensor, zx left for the
    kernel): (None, zx) when the bias is not a compile-time constant."""
    if zx == 0:
        return None, 0
    bias = None
    if len(node.inputs) >= 3:
        bias = k.value(node.inputs[2])
        if bias is None:
            return None, zx
    b = np.zeros(w2.shape[0], np.int64) if bias is None else np.asarray(bias, np.int64).reshape(-1)
    folded = b - int(zx) * w2.astype(np.int64).sum(axis=1)
    if np.abs(folded).max(initial=0) >= 2 ** 31:
        return None, zx
    return k.const("bias_zp", folded.astype(np.int32)), 0


def conv_patch_compute(k, node, xp, G, zx):
    """int32 accumulator of an int8 groups-1 conv as a single reduction of length KH*KW*C_in
    over a per-pixel patch (or the pixel itself for 1x1 stride-1 convs). Returns (acc, patch,
    folded bias or None, zero point the kernel still subtracts)."""
    warr = k.value(node.inputs[1])
    O, KH, KW, I = G["O"], G["KH"], G["KW"], G["I"]
    Kr = KH * KW * I
    wr = np.asarray(warr).reshape(O, Kr)
    bias, zx_k = fold_zero_point(k, node, wr, zx)
    w2 = k.const("w_packed", pack_weights(wr, channel_block(O), k.target.optimize))
    sh, sw, dh, dw = G["sh"], G["sw"], G["dh"], G["dw"]
    direct = KH == 1 and KW == 1 and sh == 1 and sw == 1 and not (G["pt"] or G["pb"] or G["pl"] or G["pr"])
    r = te.reduce_axis((0, Kr), "r")
    if direct:
        patch = None
        src = lambda n, oh, ow, rr: xp[n, oh, ow, rr]  # noqa: E731
    else:
        patch = te.compute((G["N"], G["oh"], G["ow"], Kr),
                           lambda n, oh, ow, rr: xp[n, oh * sh + tirx.floordiv(rr, KW * I) * dh,
                                                    ow * sw + tirx.floormod(tirx.floordiv(rr, I), KW) * dw,
                                                    tirx.floormod(rr, I)], name="patch")
        src = lambda n, oh, ow, rr: patch[n, oh, ow, rr]  # noqa: E731
    acc = te.compute((G["N"], G["oh"], G["ow"], O),
                     lambda n, oh, ow, o: te.sum((src(n, oh, ow, r).astype("int32") - c(zx_k)) * w2[o, r].astype("int32"),
                                                 axis=[r]), name="acc")
    return acc, patch, bias, zx_k


def _inline_rest(sch, keep):
    for b in sch.get_child_blocks(sch.get_sblock("root")):
        name = sch.get(b).name_hint
        if name in keep:
            continue
        try:
            sch.compute_inline(b)
        except Exception:  # noqa: BLE001
            pass


def _block_channels(sch, out_block, nb):
    """Split the output block's channel loop by nb, compute the accumulator (nb int32s) under
    the outer part and tensorize its (channel, reduction) loops; returns the outer loops."""
    loops = sch.get_loops(sch.get_sblock(out_block))
    if nb > 1:
        oo, _ = sch.split(loops[-1], factors=[None, nb])
    else:
        oo = loops[-1]
    sch.compute_at(sch.get_sblock("acc"), oo, preserve_unit_loops=False)
    return loops[:-1]


def _tensorize_acc(sch, intrin, nb):
    own = sch.get_loops(sch.get_sblock("acc"))
    at = -2 if nb > 1 else -1
    sch.decompose_reduction(sch.get_sblock("acc"), own[at])
    sch.tensorize(sch.get_loops(sch.get_sblock("acc_update"))[at], intrin)


def dsp_conv_schedule(G, zx, has_patch, optimize="size"):
    KH, KW, I = G["KH"], G["KW"], G["I"]
    Kr = KH * KW * I
    nb = channel_block(G["O"])
    intrin = dotw_intrin(Kr, zx, nb, weight_bits(G["O"], Kr, optimize))

    def sched(sch, out_block):
        _inline_rest(sch, {out_block, "acc", "patch"})
        n, oh, ow = _block_channels(sch, out_block, nb)
        if has_patch:
            sch.compute_at(sch.get_sblock("patch"), ow, preserve_unit_loops=False)
            pl = sch.get_loops(sch.get_sblock("patch"))[-1]
            sch.split(pl, factors=[KH, KW, I])
        _tensorize_acc(sch, intrin, nb)
    return sched


def dense_dot_compute(k, node, x, lead, N, K, zx):
    """Returns (acc, folded bias or None, zero point the kernel still subtracts)."""
    wr = np.asarray(k.value(node.inputs[1])).reshape(N, K)
    bias, zx_k = fold_zero_point(k, node, wr, zx)
    w2 = k.const("w_packed", pack_weights(wr, channel_block(N), k.target.optimize))
    r = te.reduce_axis((0, K), "r")
    return te.compute(tuple(lead) + (N,), lambda *i: te.sum(
        (x[i[:-1] + (r,)].astype("int32") - c(zx_k)) * w2[i[-1], r].astype("int32"), axis=[r]), name="acc"), bias, zx_k


def dsp_dense_schedule(K, zx, N, optimize="size"):
    nb = channel_block(N)
    intrin = dotw_intrin(K, zx, nb, weight_bits(N, K, optimize))

    def sched(sch, out_block):
        _inline_rest(sch, {out_block, "acc"})
        _block_channels(sch, out_block, nb)
        _tensorize_acc(sch, intrin, nb)
    return sched


def depthwise_schedule(sch, out_block, acc="acc"):
    """int8/float depthwise conv, plain C on every core: the accumulators of one output pixel
    (C_out int32s, a local array) are computed tap by tap with the channel loop innermost, so
    the padding test of a tap is loop-invariant in the channel loop and each input pixel and
    weight tap are read sequentially; injective stages (pad, bias, requantisation) inlined.
    ``acc``: the accumulating block ("acc" in the int8 kernels, "conv2d" in the op's TE compute)."""
    _inline_rest(sch, {out_block, acc})
    loops = sch.get_loops(sch.get_sblock(out_block))
    acc = sch.get_sblock(acc)
    # a kernel axis of size 1 (a Conv1d's (k, 1) kernel) keeps its unit loop, so the last three
    # loops are still (c, kh, kw)
    unit = any(int(iv.dom.extent) == 1 for iv in sch.get(acc).iter_vars if int(iv.iter_type) == 2)
    sch.compute_at(acc, loops[-2], preserve_unit_loops=unit)
    c, kh, kw = sch.get_loops(acc)[-3:]
    sch.reorder(kh, kw, c)
    sch.decompose_reduction(acc, kh)


# ---- depthwise conv on DSP cores: TVM loops over output pixels, kiln_dw_s8 per pixel ---------
def pack_dw(w, C):
    """(C, KH, KW) int8 depthwise weights -> int8 bytes of the int16 layout ``kiln_dw_s8`` reads
    (kiln_intrinsics.h): per block of 4 channels, per tap (kh, kw) row-major, the int16 values
    {2w[c0], 2w[c2], 2w[c1], 2w[c3]} (doubled: the requantisation is one SMMULR); shape
    (C // 4, KH * KW * 8)."""
    w = 2 * np.asarray(w, np.int16).reshape(C, -1)        # (C, T), doubled (see kiln_dw_requant)
    T_ = w.shape[1]
    blk = w.reshape(C // 4, 4, T_)[:, [0, 2, 1, 3], :].transpose(0, 2, 1)   # (C/4, T, 4)
    return np.ascontiguousarray(blk).astype("<i2").view(np.int8).reshape(C // 4, T_ * 8)


def dw_requant_table(bias, mult, shift, zy):
    """Per block of 4 channels {2 * bias x4, multiplier x4, half + (zy << shift) x4, right shift x4}."""
    C = len(mult)
    e = (-np.asarray(shift, np.int64))
    halfz = np.left_shift(np.int64(1), e - 1) + np.int64(zy) * np.left_shift(np.int64(1), e)
    tab = np.stack([2 * np.asarray(bias, np.int64), np.asarray(mult, np.int64), halfz, e], axis=0)  # (4, C)
    return tab.reshape(4, C // 4, 4).transpose(1, 0, 2).reshape(-1).astype(np.int32)


def dw_dsp_ok(w, bias, mult, shift, zx, zy):
    """The per-pixel DSP depthwise path applies (4-channel blocks, right shifts >= 1) and its
    requantisation shortcuts are exact: 2 * acc fits int32 and v + half + (zy << shift) - (v < 0)
    cannot overflow."""
    C = len(mult)
    if C % 4 or (np.asarray(shift) > -1).any():
        return False
    xmax = max(abs(-128 - zx), abs(127 - zx))
    bound = np.abs(np.asarray(w, np.int64)).reshape(C, -1).sum(axis=1) * xmax + np.abs(np.asarray(bias, np.int64))
    v = (bound * np.asarray(mult, np.int64) >> 31) + 2
    e = -np.asarray(shift, np.int64)
    halfz = np.left_shift(np.int64(1), e - 1) + abs(int(zy)) * np.left_shift(np.int64(1), e)
    return bool((2 * bound < 2 ** 31).all() and (v + halfz < 2 ** 31).all())


def dw_dsp_extern(x, w16, q, G, zx, zy, lo, hi):
    """The depthwise layer as one call of ``kiln_dwconv_s8`` per image: the output pixels, each
    with its in-bounds tap range (padding is handled per pixel, outside the channel and tap
    loops), are looped over in C (kiln_intrinsics.h)."""
    N, H, W, C = G["N"], G["H"], G["W"], G["C"]
    oh, ow, KH, KW = G["oh"], G["ow"], G["KH"], G["KW"]

    def fcompute(ins, outs):
        xb, wb, qb = ins
        yb = outs[0]
        n = tirx.Var("n", "int32")
        call = tirx.call_extern("void", "kiln_dwconv_s8", xb.access_ptr("r", offset=n * c(H * W * C)),
                                c(H), c(W), c(C), c(KH), c(KW), c(G["sh"]), c(G["sw"]), c(G["dh"]), c(G["dw"]),
                                c(G["pt"]), c(G["pl"]), c(oh), c(ow), c(zx), wb.access_ptr("r"), qb.access_ptr("r"),
                                c(lo), c(hi), yb.access_ptr("w", offset=n * c(oh * ow * C)))
        return tirx.For(n, c(0), c(N), tirx.ForKind.SERIAL, tirx.Evaluate(call))
    bufs = [tirx.decl_buffer(t.shape, t.dtype, name=t.op.name, elem_offset=0) for t in (x, w16, q)]
    yb = tirx.decl_buffer((N, oh, ow, C), "int8", name="dwconv", elem_offset=0)
    return te.extern((N, oh, ow, C), [x, w16, q], fcompute, name="dwconv", dtype="int8",
                     in_buffers=bufs, out_buffers=[yb])


def acc_bound(w2, bias, zx):
    """Per output channel, a bound on |acc + bias| of an int8 conv/dense with (O, K) weights
    w2 (inputs x - zx with x in [-128, 127]; pad taps hold zx, folded biases included)."""
    w2 = np.asarray(w2, np.int64).reshape(w2.shape[0], -1)
    b = np.zeros(w2.shape[0], np.int64) if bias is None else np.abs(np.asarray(bias, np.int64).reshape(-1))
    return np.abs(w2).sum(axis=1) * (128 + abs(int(zx))) + b


def requant_bound_ok(bound, mult, shift, zy):
    """kiln_rq_s8 is exact: right shifts >= 1, 2 * acc fits int32, and
    v + half + (zy << shift) - (v < 0) cannot overflow."""
    shift = np.asarray(shift, np.int64)
    if bound is None or (shift > -1).any():
        return False
    bound = np.asarray(bound, np.int64)
    v = (bound * np.asarray(mult, np.int64) >> 31) + 2
    e = -shift
    halfz = np.left_shift(np.int64(1), e - 1) + abs(int(zy)) * np.left_shift(np.int64(1), e)
    return bool((2 * bound < 2 ** 31).all() and (v + halfz < 2 ** 31).all())


# ---- fused conv on DSP cores: TVM loops over output rows, kiln_conv_row_s8 per row --------------
def conv_requant_table(bias, mult, shift, zy, const=None):
    """int32 words: per block of 2 channels {bias0, bias1, mult0, mult1, hz0, hz1} with
    hz = 2^(e-1) + (zy << e), then one byte per channel holding e = -shift, the right shift 1..31
    (padded to a whole word): kiln_conv_s8. 13 bytes per channel. ``const``: per channel an int8
    output or None; a channel with one (its weights are all zero, so its output is a compile-time
    constant c) gets bias 0, multiplier 0, e = 1 and hz = 2c + 1, which the kernel turns into c."""
    bias = np.asarray(bias, np.int64).reshape(-1).copy()
    mult = np.asarray(mult, np.int64).reshape(-1).copy()
    e = -np.asarray(shift, np.int64).reshape(-1).copy()
    fixed = np.zeros(e.size, bool) if const is None else np.array([v is not None for v in const])
    if fixed.any():
        cv = np.array([0 if v is None else int(v) for v in const], np.int64)
        bias[fixed], mult[fixed], e[fixed] = 0, 0, 1
    if (e < 1).any() or (e > 31).any():
        raise ValueError("conv_requant_table needs right shifts 1..31 (requant_bound_ok)")
    hz = np.left_shift(np.int64(1), e - 1) + np.int64(zy) * np.left_shift(np.int64(1), e)
    if fixed.any():
        hz[fixed] = 2 * cv[fixed] + 1
    if (np.abs(hz) >= 2 ** 31).any():
        raise ValueError("conv_requant_table: 2^(e-1) + (zy << e) must fit int32 (requant_bound_ok)")
    words = np.concatenate([bias.reshape(-1, 2), mult.reshape(-1, 2), hz.reshape(-1, 2)], axis=1).reshape(-1)
    eb = np.zeros(-(-e.size // 4) * 4, np.uint8)
    eb[:e.size] = e
    return np.concatenate([words.astype("<i4"), eb.view("<i4")]).astype(np.int32)


def conv_fused_extern(x, wp, q, G, zx, zy, lo, hi, bits, out_shape=None, narrow=False):
    """A groups-1 int8 conv as one call of ``kiln_conv_s8`` per image (patches of pixel pairs,
    2x2 dot-product tiles, requantisation and store; kiln_intrinsics.h), or of ``kiln_conv8_s8``
    (``narrow``: the int8 patch pair, not widened; int8 weights). The patch pair is a
    kernel-local buffer (lifted into the arena when large, tirc.lift_scratch)."""
    N, H, W, C = G["N"], G["H"], G["W"], G["C"]
    oh, ow, KH, KW, O = G["oh"], G["ow"], G["KH"], G["KW"], G["O"]
    K = KH * KW * C
    kp = (K + 3) // 4 * 4

    def fcompute(ins, outs):
        xb, wb, qb = ins
        yb = outs[0]
        n = tirx.Var("n", "int32")
        geo = [c(H), c(W), c(C), c(KH), c(KW), c(G["sh"]), c(G["sw"]), c(G["pt"]), c(G["pl"]), c(oh), c(ow), c(zx)]
        xp, yp = xb.access_ptr("r", offset=n * c(H * W * C)), yb.access_ptr("w", offset=n * c(oh * ow * O))
        if narrow:
            patch = tirx.decl_buffer((2 * kp + 8,), "int8", name="patch")
            call = tirx.call_extern("void", "kiln_conv8_s8", xp, *geo, patch.access_ptr("w"), wb.access_ptr("r"),
                                    c(K), c(O), qb.access_ptr("r"), c(lo), c(hi), yp)
        else:
            patch = tirx.decl_buffer(((4 if C % 4 == 0 else 6) * kp + 8,), "int8", name="patch")
            call = tirx.call_extern("void", "kiln_conv_s8", xp, *geo, patch.access_ptr("w"), wb.access_ptr("r"),
                                    c(K), c(O), c(bits), qb.access_ptr("r"), c(zy), c(lo), c(hi), yp)
        body = tirx.For(n, c(0), c(N), tirx.ForKind.SERIAL, tirx.Evaluate(call))
        return tirx.SeqStmt([tirx.AllocBuffer(patch), body])
    bufs = [tirx.decl_buffer(t.shape, t.dtype, name=t.op.name, elem_offset=0) for t in (x, wp, q)]
    shape = tuple(out_shape) if out_shape is not None else (N, oh, ow, O)   # dense: (rows, O)
    yb = tirx.decl_buffer(shape, "int8", name="conv", elem_offset=0)
    return te.extern(shape, [x, wp, q], fcompute, name="conv", dtype="int8",
                     in_buffers=bufs, out_buffers=[yb])


def _te_conv2d(in_types, out_type, attrs, target):
    """Float depthwise convs (the op's TE compute, reduction block "conv2d") on targets with Kiln
    kernels: ``depthwise_schedule``."""
    G = conv_geometry(in_types[0].shape, in_types[1].shape, attrs)
    if target.kernels and G["I"] == 1 and G["g"] == G["C"] and G["g"] > 1:
        return functools.partial(depthwise_schedule, acc="conv2d")
    return None


# op -> (in_types, out_type, attrs, target) -> schedule or None, for nodes the C backend lowers
# through the op's TE compute (every other one gets lower.default_schedule)
TE_SCHEDULES = {"conv2d": _te_conv2d}
