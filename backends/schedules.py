"""Cortex-M DSP schedules (Armv7E-M / Armv8-M with the DSP extension).

conv2d (groups 1) and dense reduce over contiguous int8 runs: NHWC input channels and OHWI
weight rows. The schedule builds, per output pixel, the padded input patch ``[KH*KW*C_in]``
(im2col of one pixel; skipped for 1x1 stride-1 convs, whose pixel is already contiguous), keeps
the accumulator a scalar under the output-channel loop, and tensorizes the reduction with a
tensor intrinsic whose implementation calls ``kiln_dot_s8`` (``kiln_intrinsics.h``:
SXTAB16/SXTB16/SMLAD, two MACs per instruction, with a portable C version for host builds).
The input zero point rides in the SXTAB16 add, so the arithmetic is TFLite's exactly.
Plain-C targets (Cortex-M0+/M3) keep the default schedule of ``lower.py``.
"""
from __future__ import annotations

import numpy as np
from tvm import s_tir, te, tirx
from tvm.script import tirx as T

from .qmath import c

ENABLED = True
_REGISTERED = set()


def dot_intrin(K, zx):
    """Register (once) the tensor intrinsic acc += sum_k (int32(a[k]) - zx) * int32(b[k])."""
    name = f"kiln_dot_s8_{K}_{zx}".replace("-", "m")
    if name in _REGISTERED:
        return name

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
            C[0] = T.call_extern("int32", "kiln_dot_s8", A.access_ptr("r"), B.access_ptr("r"), K, -zx, C[0])

    try:
        s_tir.TensorIntrin.register(name, desc, impl)
    except Exception:  # noqa: BLE001 (registered by an earlier compile in this process)
        pass
    _REGISTERED.add(name)
    return name


def conv_patch_compute(k, node, xp, G, zx):
    """int32 accumulator of an int8 groups-1 conv as a single reduction of length KH*KW*C_in
    over a per-pixel patch (or the pixel itself for 1x1 stride-1 convs). Returns (acc, patch)."""
    warr = k.value(node.inputs[1])
    O, KH, KW, I = G["O"], G["KH"], G["KW"], G["I"]
    Kr = KH * KW * I
    w2 = k.const("w", np.asarray(warr).reshape(O, Kr))
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
                     lambda n, oh, ow, o: te.sum((src(n, oh, ow, r).astype("int32") - c(zx)) * w2[o, r].astype("int32"),
                                                 axis=[r]), name="acc")
    return acc, patch


def _inline_rest(sch, keep):
    for b in sch.get_child_blocks(sch.get_sblock("root")):
        name = sch.get(b).name_hint
        if name in keep:
            continue
        try:
            sch.compute_inline(b)
        except Exception:  # noqa: BLE001
            pass


def dsp_conv_schedule(G, zx, has_patch):
    KH, KW, I = G["KH"], G["KW"], G["I"]
    Kr = KH * KW * I
    intrin = dot_intrin(Kr, zx)

    def sched(sch, out_block):
        _inline_rest(sch, {out_block, "acc", "patch"})
        n, oh, ow, o = sch.get_loops(sch.get_sblock(out_block))
        sch.compute_at(sch.get_sblock("acc"), o, preserve_unit_loops=False)
        if has_patch:
            sch.compute_at(sch.get_sblock("patch"), ow, preserve_unit_loops=False)
            pl = sch.get_loops(sch.get_sblock("patch"))[-1]
            sch.split(pl, factors=[KH, KW, I])
        own = sch.get_loops(sch.get_sblock("acc"))
        sch.decompose_reduction(sch.get_sblock("acc"), own[-1])
        sch.tensorize(sch.get_loops(sch.get_sblock("acc_update"))[-1], intrin)
    return sched


def dense_dot_compute(k, node, x, lead, N, K, zx):
    warr = k.value(node.inputs[1])
    w2 = k.const("w", np.asarray(warr).reshape(N, K))
    r = te.reduce_axis((0, K), "r")
    return te.compute(tuple(lead) + (N,), lambda *i: te.sum(
        (x[i[:-1] + (r,)].astype("int32") - c(zx)) * w2[i[-1], r].astype("int32"), axis=[r]), name="acc")


def dsp_dense_schedule(K, zx):
    intrin = dot_intrin(K, zx)

    def sched(sch, out_block):
        _inline_rest(sch, {out_block, "acc"})
        loops = sch.get_loops(sch.get_sblock(out_block))
        sch.compute_at(sch.get_sblock("acc"), loops[-1], preserve_unit_loops=False)
        own = sch.get_loops(sch.get_sblock("acc"))
        sch.decompose_reduction(sch.get_sblock("acc"), own[-1])
        sch.tensorize(sch.get_loops(sch.get_sblock("acc_update"))[-1], intrin)
    return sched
