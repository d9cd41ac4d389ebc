"""Recurrent ops: ``lstm``, TFLite's UNIDIRECTIONAL_SEQUENCE_LSTM (one layer, one direction).

Inputs (15): ``x`` [N, T, I] (``time_major``: [T, N, I]); the input weights of the input, forget,
cell and output gates ``w_xi, w_xf, w_xc, w_xo`` [H, I]; the recurrent weights ``w_hi, w_hf,
w_hc, w_ho`` [H, H]; the gate biases ``b_i, b_f, b_c, b_o`` [H]; the initial output state ``h0``
and cell state ``c0`` [N, H]. Output: every step's hidden state, [N, T, H] ([T, N, H] time major);
with ``output="cell"`` the final cell state [N, H] instead (c0's type: int16 in a quantised
LSTM), the value a stateful LSTM carries to its next run (``graph.states``, recurrent_tflite.py).
Per step (TFLite's ``lstm_eval.cc``)::

    i = sigmoid(x W_xi^T + h W_hi^T + b_i)    f, o likewise,   g = act(x W_xc^T + h W_hc^T + b_c)
    c = f * c + i * g   (clipped to [-cell_clip, cell_clip] when cell_clip > 0)
    h = o * act(c)

``activation`` is the fused activation TFLite applies to the cell gate and the cell (tanh).
The gradient (``vjp``) is backpropagation through time written with Kiln primitives (the forward
recomputed step by step), so it is itself differentiable.

int8 and int16 (TensorFlow Lite Micro's ``EvalLstm``): ``frontend/ops/recurrent_16x8.py``.
Peephole, projection, layer-norm and CIFG LSTMs are not supported (the importer says so).
"""
from __future__ import annotations

import numpy as np

from .. import functional as F
from ..errors import ShapeError
from ..registry import LINEAR, QUANTIZABLE, Attr, defrule, register
from ._util import tt

GATES = ("i", "f", "c", "o")
LSTM_INPUTS = (["x"] + [f"w_x{g}" for g in GATES] + [f"w_h{g}" for g in GATES] + [f"b_{g}" for g in GATES]
               + ["h0", "c0"])
LSTM_ATTRS = {"time_major": Attr("bool", False), "cell_clip": Attr("float", 0.0),
              "activation": Attr("str", "tanh", ("tanh",)), "output": Attr("str", "sequence", ("sequence", "cell"))}


def lstm_dims(shapes, time_major, where="lstm"):
    """(N, T, I, H) from the input shapes, or a ShapeError naming the operand that does not fit."""
    if len(shapes) != len(LSTM_INPUTS):
        raise ShapeError(f"{where} takes {len(LSTM_INPUTS)} inputs ({', '.join(LSTM_INPUTS)}), got {len(shapes)}")
    x = shapes[0]
    if len(x) != 3:
        raise ShapeError(f"{where}: input x must be 3-D [N, T, I] ([T, N, I] time major), got {list(x)}")
    T, N = (x[0], x[1]) if time_major else (x[1], x[0])
    I, H = x[2], shapes[1][0] if len(shapes[1]) == 2 else -1
    want = [(H, I)] * 4 + [(H, H)] * 4 + [(H,)] * 4 + [(N, H)] * 2
    for name, s, w in zip(LSTM_INPUTS[1:], shapes[1:], want):
        if tuple(s) != w:
            raise ShapeError(f"{where}: {name} has shape {list(s)}, expected {list(w)} (x {list(x)}, H = {H})")
    return N, T, I, H


def _lstm_infer(ts, a):
    N, T, I, H = lstm_dims([t.shape for t in ts], a["time_major"])
    if a.get("output") == "cell":
        return tt((N, H), ts[14].dtype)
    shape = (T, N, H) if a["time_major"] else (N, T, H)
    return tt(shape, ts[0].dtype)


def _clip(c, clip):
    return np.clip(c, -clip, clip) if clip > 0 else c


def _sigmoid(v):
    with np.errstate(over="ignore"):             # exp(-v) = inf for v << 0: 1 / (1 + inf) = 0, as wanted
        return (1.0 / (1.0 + np.exp(-v))).astype(v.dtype, copy=False)


def lstm_states(xs, a):
    """The float recurrence run once: (every step's hidden state in the output's layout, the final
    cell state). A stateful LSTM's two nodes (the sequence and its cell twin) share it (executor)."""
    x, wx, wh, b, h, c = xs[0], xs[1:5], xs[5:9], xs[9:13], xs[13], xs[14]
    xb = np.swapaxes(x, 0, 1) if a["time_major"] else x         # [N, T, I]
    out = np.zeros(xb.shape[:2] + (wx[0].shape[0],), x.dtype)
    for t in range(xb.shape[1]):
        pre = [xb[:, t] @ wx[k].T + h @ wh[k].T + b[k] for k in range(4)]
        i, f, o = _sigmoid(pre[0]), _sigmoid(pre[1]), _sigmoid(pre[3])
        c = _clip(f * c + i * np.tanh(pre[2]), a["cell_clip"])
        h = o * np.tanh(c)
        out[:, t] = h
    seq = np.swapaxes(out, 0, 1).copy() if a["time_major"] else out
    return seq, np.asarray(c, x.dtype)


def _lstm_ref(xs, a):
    seq, cell = lstm_states(xs, a)
    return cell if a.get("output") == "cell" else seq


register("lstm", attrs=LSTM_ATTRS, infer=_lstm_infer, ref=_lstm_ref, props={LINEAR, QUANTIZABLE},
         arity=len(LSTM_INPUTS),
         doc="one-layer unidirectional LSTM over a sequence (TFLite UNIDIRECTIONAL_SEQUENCE_LSTM): "
             "inputs x, 4 input and 4 recurrent gate weights (i, f, c, o), 4 biases, h0, c0; output='cell' "
             "gives the final cell state instead (a stateful LSTM's next c0: h0 and c0 persist between runs "
             "as graph states, TFLite's variable tensors)")


@defrule("lstm", "macs")
def _lstm_macs(ts, out, a):
    N, T, I, H = lstm_dims([t.shape for t in ts], a["time_major"])
    return N * T * 4 * H * (I + H)


# ---- gradient: backpropagation through time with Kiln primitives -----------------------------
def _step_x(x, t, time_major):
    n = x.shape
    if time_major:
        return F.reshape(F.slice(x, [t, 0, 0], [t + 1, n[1], n[2]]), [n[1], n[2]])
    return F.reshape(F.slice(x, [0, t, 0], [n[0], t + 1, n[2]]), [n[0], n[2]])


def _forward_steps(xs, a):
    """Recompute the forward pass; per step (x_t, h_prev, c_prev, i, f, g, o, c_pre, c, tanh c)."""
    x, wx, wh, b = xs[0], xs[1:5], xs[5:9], xs[9:13]
    h, c = xs[13], xs[14]
    T = x.shape[0] if a["time_major"] else x.shape[1]
    steps = []
    for t in range(T):
        xt = _step_x(x, t, a["time_major"])
        pre = [F.add(F.add(F.matmul(xt, F.transpose(wx[k], [1, 0])), F.matmul(h, F.transpose(wh[k], [1, 0]))), b[k])
               for k in range(4)]
        i, f, g, o = F.sigmoid(pre[0]), F.sigmoid(pre[1]), F.tanh(pre[2]), F.sigmoid(pre[3])
        c_pre = F.add(F.mul(f, c), F.mul(i, g))
        c_new = F.minimum(F.maximum(c_pre, -a["cell_clip"]), a["cell_clip"]) if a["cell_clip"] > 0 else c_pre
        tc = F.tanh(c_new)
        steps.append((xt, h, c, i, f, g, o, c_pre, c_new, tc))
        h, c = F.mul(o, tc), c_new
    return steps


def _step_gy(gy, t, time_major):
    return _step_x(gy, t, time_major)


def _gate_grads(s, dh, dc, clip):
    """The pre-activation gradients of one step and the cell gradient flowing to the previous one."""
    xt, h, c, i, f, g, o, c_pre, c_new, tc = s
    do = F.mul(dh, tc)
    dc = F.add(dc, F.mul(F.mul(dh, o), F.sub(1.0, F.mul(tc, tc))))
    if clip > 0:
        dc = F.where(F.less_equal(F.abs(c_pre), clip), dc, 0.0)
    da = [F.mul(F.mul(F.mul(dc, g), i), F.sub(1.0, i)),
          F.mul(F.mul(F.mul(dc, c), f), F.sub(1.0, f)),
          F.mul(F.mul(dc, i), F.sub(1.0, F.mul(g, g))),
          F.mul(F.mul(do, o), F.sub(1.0, o))]
    return da, F.mul(dc, f)


def _acc(total, v):
    return v if total is None else F.add(total, v)


def _lstm_vjp(n, xs, y, gy):
    a = n.attrs
    wx, wh = xs[1:5], xs[5:9]
    steps = _forward_steps(xs, a)
    gw = [None] * 8
    gb = [None] * 4
    gxs = [None] * len(steps)
    dh, dc = None, None
    if a.get("output") == "cell":              # the final cell state only: the gradient enters at c_T
        dh, dc = F.mul(gy, 0.0), gy
    for t in range(len(steps) - 1, -1, -1):
        s = steps[t]
        if a.get("output") != "cell":
            g_t = _step_gy(gy, t, a["time_major"])
            dh = g_t if dh is None else F.add(dh, g_t)
        da, dc = _gate_grads(s, dh, dc if dc is not None else F.mul(g_t, 0.0), a["cell_clip"])
        xt, h = s[0], s[1]
        dx = dhp = None
        for k in range(4):
            gw[k] = _acc(gw[k], F.matmul(F.transpose(da[k], [1, 0]), xt))
            gw[4 + k] = _acc(gw[4 + k], F.matmul(F.transpose(da[k], [1, 0]), h))
            gb[k] = _acc(gb[k], F.sum(da[k], [0]))
            dx = _acc(dx, F.matmul(da[k], wx[k]))
            dhp = _acc(dhp, F.matmul(da[k], wh[k]))
        gxs[t] = dx
        dh = dhp
    ax = 0 if a["time_major"] else 1
    gx = F.concat([F.reshape(d, [1, *d.shape] if ax == 0 else [d.shape[0], 1, d.shape[1]]) for d in gxs], ax)
    return [gx] + gw + gb + [dh, dc]


defrule("lstm", "vjp")(_lstm_vjp)


# ---- TE lowering (float): the input projections at once, then 3 stages per time step ----------
def _te_pick(T, ts, k, *idx):
    v = ts[3](*idx)
    for j in (2, 1, 0):
        v = T.tirx.Select(k == j, ts[j](*idx), v)
    return v


def _te_sigmoid(T, v):
    return T.c(1.0, T.dt(v)) / (T.c(1.0, T.dt(v)) + T.te.exp(-v))


def _te_step(T, xp, b, h, c, wh, t, clip, dtype):
    """One time step: the 4 gates' recurrent products in one stage, the new cell, the new hidden."""
    N, H = T.shape(h)
    rh = T.te.reduce_axis((0, H), "rh")
    rec = T.te.compute((4, N, H), lambda k, n, j: T.te.sum(h[n, rh] * _te_pick(T, wh, k, j, rh), axis=rh),
                       name=f"lstm_rec{t}")

    def pre(k, n, j):
        return xp[k, n, t, j] + b[k](j) + rec[k, n, j]

    def cell(n, j):
        v = _te_sigmoid(T, pre(1, n, j)) * c[n, j] + _te_sigmoid(T, pre(0, n, j)) * T.te.tanh(pre(2, n, j))
        if clip > 0:
            v = T.te.min(T.te.max(v, T.c(-clip, dtype)), T.c(clip, dtype))
        return v
    c2 = T.te.compute((N, H), cell, name=f"lstm_cell{t}")

    def hidden(n, j):
        return _te_sigmoid(T, pre(3, n, j)) * T.te.tanh(c2[n, j])
    return T.te.compute((N, H), hidden, name=f"lstm_hidden{t}"), c2


def lstm_te_states(T, xs, a):
    """The recurrence's TE stages: (every step's hidden state, the final cell state), [N, H] each."""
    x, wx, wh, b = xs[0], xs[1:5], xs[5:9], xs[9:13]
    tm = a["time_major"]
    Tn, N, I = T.shape(x) if tm else (T.shape(x)[1], T.shape(x)[0], T.shape(x)[2])
    H = T.shape(wx[0])[0]
    ri = T.te.reduce_axis((0, I), "ri")

    def xproj(k, n, t, j):
        xv = x[t, n, ri] if tm else x[n, t, ri]
        return T.te.sum(xv * _te_pick(T, wx, k, j, ri), axis=ri)
    xp = T.te.compute((4, N, Tn, H), xproj, name="lstm_xproj")
    h, c = xs[13], xs[14]
    hs = []
    for t in range(Tn):
        h, c = _te_step(T, xp, b, h, c, wh, t, a["cell_clip"], str(x.dtype))
        hs.append(h)
    return hs, c


def lstm_te_gather(T, hs, a, shape):
    """The sequence output [N, T, H] ([T, N, H] time major) from every step's hidden state."""
    tm = a["time_major"]

    def gather(*i):
        n, t, j = (i[1], i[0], i[2]) if tm else i
        v = hs[-1][n, j]
        for s in range(len(hs) - 2, -1, -1):
            v = T.tirx.Select(t == s, hs[s][n, j], v)
        return v
    return T.te.compute(shape, gather, name="lstm")


@defrule("lstm", "te")
def _lstm_te(T, xs, a, out):
    hs, c = lstm_te_states(T, xs, a)
    return c if a.get("output") == "cell" else lstm_te_gather(T, hs, a, out.shape)
