"""C lowering of the int8 ``lstm`` (TFLite's 8x8_16 integer LSTM, frontend/ops/recurrent.py).

The same arithmetic as the int8 reference: the input-to-gate products of every step in one int32
stage (the input zero point, the recurrent zero point and the bias folded into per-gate constant
vectors), then per step four stages: the recurrent products of the 4 gates, the activated gates
(``kiln_lstm_gate``: requantise to Q3.12, saturating add, gemmlowp's int16 logistic / tanh), the
new int16 cell state (``kiln_lstm_cell``) and the new int8 hidden state (``kiln_lstm_hidden``),
all C functions of ``kiln_intrinsics.h``. The multipliers come from the reference's own
``lstm_int8_params``. Float LSTMs use the op's TE compute. Both keep every stage (no inlining).
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from kiln.frontend.ops.recurrent import lstm_int8_params

from .lower import lower_rule, lower_te
from .qmath import c


def _step(P, xp, h, cst, wh, t):
    N, H = (int(s) for s in h.shape)
    rh = te.reduce_axis((0, H), "rh")

    def rec_f(g, n, j):
        return te.sum(h[n, rh].astype("int32") * wh[g, j, rh].astype("int32"), axis=rh)
    rec = te.compute((4, N, H), rec_f, name=f"lstm_rec{t}")
    pm, bx, bh = P["pm"], P["bx"], P["bh"]

    def gate(g, n, j):
        return tirx.call_extern("int32", "kiln_lstm_gate", xp[g, n, t, j] + bx[g, j], rec[g, n, j] + bh[g, j],
                                pm[g, 0], pm[g, 1], pm[g, 2], pm[g, 3], tirx.Select(g == 2, c(1), c(0)))
    gates = te.compute((4, N, H), gate, name=f"lstm_gates{t}")
    c2 = te.compute((N, H), lambda n, j: tirx.call_extern(
        "int32", "kiln_lstm_cell", gates[1, n, j], cst[n, j].astype("int32"), gates[0, n, j], gates[2, n, j],
        c(30 + P["cell"]), c(P["clip"])).astype("int16"), name=f"lstm_cell{t}")
    h2 = te.compute((N, H), lambda n, j: tirx.call_extern(
        "int32", "kiln_lstm_hidden", gates[3, n, j], c2[n, j].astype("int32"), c(15 + P["cell"]), c(P["hm"]),
        c(P["hs"]), c(P["zo"])).astype("int8"), name=f"lstm_hidden{t}")
    return h2, c2


def _consts(k, node, ty):
    in_types = [k.type(v) for v in node.inputs]
    arrays = [k.value(v) for v in node.inputs]
    if any(arrays[j] is None for j in range(1, 13)):
        k.fail("the int8 LSTM needs constant weights and biases")
    p = lstm_int8_params(in_types, ty, arrays)
    s_c = np.float32(in_types[14].quant.scale[0])
    clip = node.attrs["cell_clip"]
    clip_q = int(np.float32(min(max(np.float32(clip) / s_c, -32768.0), 32767.0))) if clip > 0 else 0
    pm = np.asarray([[*p[f"mx{q}"], *p[f"mh{q}"]] for q in range(4)], np.int64).astype(np.int32)
    bx = np.stack([p[f"bx{q}"] + arrays[9 + q].astype(np.int64) for q in range(4)]).astype(np.int32)
    bh = np.stack([p[f"bh{q}"] for q in range(4)]).astype(np.int32)
    return dict(pm=k.const("lstm_m", pm), bx=k.const("lstm_bx", bx), bh=k.const("lstm_bh", bh), cell=p["cell"],
                clip=clip_q, hm=int(p["hidden"][0]), hs=int(p["hidden"][1]), zo=p["z_o"])


def _keep_stages(sch, out_block):
    return None


@lower_rule("lstm")
def lower_lstm(k, node, xs):
    ty = k.type(node.name)
    # every stage stays a loop nest of its own: inlining the per-step states into their consumers
    # (the default schedule) would recompute the whole recurrence in each later step
    k.schedule(_keep_stages)
    if ty.quant is None:
        return lower_te(k, node, xs)         # float: the op's TE compute
    P = _consts(k, node, ty)
    # the four gates' weights as one [4, H, K] constant each: the products index the gate directly
    # (a per-MAC select between four weight tensors cost ~3x the multiply-accumulate itself)
    wx = k.const("lstm_wx", np.stack([np.asarray(k.value(v), np.int8) for v in node.inputs[1:5]]))
    wh = k.const("lstm_wh", np.stack([np.asarray(k.value(v), np.int8) for v in node.inputs[5:9]]))
    x = xs[0]
    tm = node.attrs["time_major"]
    Tn, N, I = (int(s) for s in x.shape) if tm else (int(x.shape[1]), int(x.shape[0]), int(x.shape[2]))
    H = int(wx.shape[1])
    ri = te.reduce_axis((0, I), "ri")

    def xproj(g, n, t, j):
        xv = x[t, n, ri] if tm else x[n, t, ri]
        return te.sum(xv.astype("int32") * wx[g, j, ri].astype("int32"), axis=ri)
    xp = te.compute((4, N, Tn, H), xproj, name="lstm_xproj")
    h, cst = xs[13], xs[14]
    hs = []
    for t in range(Tn):
        h, cst = _step(P, xp, h, cst, wh, t)
        hs.append(h)

    def gather(*i):
        n, t, j = (i[1], i[0], i[2]) if tm else i
        v = hs[-1][n, j]
        for s in range(Tn - 2, -1, -1):
            v = tirx.Select(t == s, hs[s][n, j], v)
        return v
    return te.compute(ty.shape, gather, name="lstm")
