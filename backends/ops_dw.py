"""The 3x3 int8 depthwise kernel ``kiln_dw3_s8`` (include/kiln_dw.h) on Kiln-kernel targets:
depth multiplier 1, dilation 1, column stride 1 or 2, C % 4 == 0 (``ops_nn._depthwise_dsp`` picks
it before the per-pixel ``kiln_dwconv_s8``). Its compile-time constants: one 10-word record per
channel (``dw3_table``) and the size of its scratch (``dw3_scratch_bytes``: 3 widened rows per
block of 4 channels and one output row)."""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from .qmath import c

# scratch above this many bytes (very wide layers): the per-pixel kernel, which needs none
DW3_MAX_SCRATCH = 8192
# narrower outputs (stride 1, stride 2): the per-pixel kernel, whose cost has no per-row part (the
# widening of 3 rows per output row and the row copy). Measured on mps2-an386: VWW's 48, 24 and
# 12 wide stride-1 layers -35%, -23%, -15% instructions, its 24 wide stride-2 layer -4%; 6 wide
# +11%, 5 wide (KWS) +23%, 12 wide stride 2 +18%
DW3_MIN_OW = {1: 12, 2: 24}


def dw3_cols(ow, sw):
    """Padded int16 columns per channel row of a slot (kiln_dw3_cols)."""
    return (ow + 6) & ~3 if sw == 1 else (2 * ow + 7) & ~3


def dw3_scratch_bytes(ow, sw, C):
    """3 slots x 4 channel rows x dw3_cols int16, 8 bytes to align them, one output row."""
    return 24 * dw3_cols(ow, sw) + 8 + ow * C


def dw3_applies(G):
    """The geometry kiln_dw3_s8 handles and where it pays (DW3_MIN_OW), with at most
    DW3_MAX_SCRATCH bytes of scratch."""
    return (G["KH"] == 3 and G["KW"] == 3 and G["dh"] == 1 and G["dw"] == 1 and G["sw"] in DW3_MIN_OW
            and G["ow"] >= DW3_MIN_OW[G["sw"]] and G["C"] % 4 == 0
            and dw3_scratch_bytes(G["ow"], G["sw"], G["C"]) <= DW3_MAX_SCRATCH)


def dw3_table(w, bias, mult, shift, zy):
    """(C, 9) int8 weights (taps row-major) -> int32 (C * 10): per channel, per kernel row k the
    int16 pairs W01 = {2w[k][0], 2w[k][1]} and W12 = {2w[k][1], 2w[k][2]} (low half first), then
    2 * bias, the multiplier, half + (zy << e) and e = -shift (the requantisation of
    ``schedules.dw_requant_table``, per channel)."""
    w2 = (2 * np.asarray(w, np.int64).reshape(-1, 3, 3)) & 0xFFFF          # (C, 3, 3) as uint16
    w01 = w2[:, :, 0] | (w2[:, :, 1] << 16)
    w12 = w2[:, :, 1] | (w2[:, :, 2] << 16)
    words = np.stack([w01, w12], axis=2).reshape(-1, 6)                   # (C, 6)
    e = -np.asarray(shift, np.int64)
    halfz = np.left_shift(np.int64(1), e - 1) + np.int64(zy) * np.left_shift(np.int64(1), e)
    rq = np.stack([2 * np.asarray(bias, np.int64), np.asarray(mult, np.int64), halfz, e], axis=1)
    tab = np.concatenate([words, rq & 0xFFFFFFFF], axis=1)
    return tab.astype(np.uint32).view(np.int32).reshape(-1)


def dw3_extern(x, tab, G, zx, lo, hi):
    """The depthwise layer as one ``kiln_dw3_s8`` call per image; its scratch is a kernel-local
    buffer (lifted into the arena when large, tirc.lift_scratch)."""
    N, H, W, C = G["N"], G["H"], G["W"], G["C"]
    oh, ow = G["oh"], G["ow"]

    def fcompute(ins, outs):
        xb, tb = ins
        yb = outs[0]
        scratch = tirx.decl_buffer(((dw3_scratch_bytes(ow, G["sw"], C) + 1) // 2,), "int16", name="dwring")
        n = tirx.Var("n", "int32")
        call = tirx.call_extern("void", "kiln_dw3_s8", xb.access_ptr("r", offset=n * c(H * W * C)),
                                c(H), c(W), c(C), c(G["sh"]), c(G["sw"]), c(G["pt"]), c(G["pl"]), c(oh), c(ow),
                                c(zx), tb.access_ptr("r"), c(lo), c(hi), scratch.access_ptr("w"),
                                yb.access_ptr("w", offset=n * c(oh * ow * C)))
        body = tirx.For(n, c(0), c(N), tirx.ForKind.SERIAL, tirx.Evaluate(call))
        return tirx.SeqStmt([tirx.AllocBuffer(scratch), body])
    bufs = [tirx.decl_buffer(t.shape, t.dtype, name=t.op.name, elem_offset=0) for t in (x, tab)]
    yb = tirx.decl_buffer((N, oh, ow, C), "int8", name="dwconv", elem_offset=0)
    return te.extern((N, oh, ow, C), [x, tab], fcompute, name="dwconv", dtype="int8",
                     in_buffers=bufs, out_buffers=[yb])
