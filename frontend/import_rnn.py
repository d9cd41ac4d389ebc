"""LSTM and GRU, unrolled over time from Kiln primitives (dense, slice, sigmoid, tanh, mul, add).

Per layer and direction: one ``dense`` projects every time step's input at once ([N, T, I] ->
[N, T, G*H]); each step slices its projection, adds ``dense(h, W_hh, b_hh)`` (only ``b_hh`` at the
first step when the initial state is zero), slices the gates and updates the state. Parameters
keep PyTorch's names and shapes (``lstm.weight_ih_l0`` [4H, I], gate order i, f, g, o; GRU r, z, n);
the ONNX importer reorders ONNX's gates (LSTM i, o, f, c; GRU z, r, h) into these.

The sequence output is kept batch-leading ([N, T, D*H] physically) whatever the logical layout.
"""
from __future__ import annotations

import numpy as np

from . import import_blocks as B
from .import_blocks import UnsupportedError
from .import_layout import Builder, V


def _state(b, s, index, n, h):
    """Initial state ``index`` of s [L*D, N, H] (None when absent or all zeros)."""
    if s is None:
        return None
    if s.is_const and not s.trainable and not np.any(s.array):
        return None
    if s.shape[1:] != (n, h):
        raise UnsupportedError(f"initial state of shape {s.shape}, expected [layers*directions, {n}, {h}]")
    return B.select(b, s, 0, index)


def _gates(b, v, count, h):
    return [B.slice_(b, v, 1, k * h, (k + 1) * h) for k in range(count)]


def _steps(x_proj: V, time_axis, reverse):
    T = x_proj.shape[time_axis]
    return range(T - 1, -1, -1) if reverse else range(T)


def _project(b, x: V, w_ih: V, b_ih: V | None, time_axis):
    from .import_nn import linear
    xp = linear(b, x, w_ih, b_ih)
    return xp


def _step_input(b, xp: V, time_axis, t):
    xt = B.select(b, xp, time_axis, t)
    return xt


def _recur(b, h, w_hh, b_hh, xt):
    from .import_nn import linear
    if h is None:
        return B.binary(b, "add", xt, b_hh) if b_hh is not None else xt, None
    return None, linear(b, h, w_hh, b_hh)


def lstm_direction(b: Builder, x: V, p: dict, time_axis, reverse, h0=None, c0=None):
    """One direction of one layer; returns ([h_t in time order], h_last, c_last)."""
    H = p["w_hh"].shape[1]
    xp = _project(b, x, p["w_ih"], p.get("b_ih"), time_axis)
    h, c = h0, c0
    outs = {}
    for t in _steps(xp, time_axis, reverse):
        xt = _step_input(b, xp, time_axis, t)
        only, rec = _recur(b, h, p["w_hh"], p.get("b_hh"), xt)
        gates = only if only is not None else B.binary(b, "add", xt, rec)
        i, f, g, o = _gates(b, gates, 4, H)
        i, f, o = (B.unary(b, "sigmoid", v) for v in (i, f, o))
        g = B.unary(b, "tanh", g)
        ig = B.binary(b, "mul", i, g)
        c = ig if c is None else B.binary(b, "add", B.binary(b, "mul", f, c), ig)
        h = B.binary(b, "mul", o, B.unary(b, "tanh", c))
        outs[t] = h
    return [outs[t] for t in sorted(outs)], h, c


def gru_direction(b: Builder, x: V, p: dict, time_axis, reverse, h0=None):
    """One GRU direction (PyTorch's form: n = tanh(W_in x + b_in + r * (W_hn h + b_hn)))."""
    H = p["w_hh"].shape[1]
    xp = _project(b, x, p["w_ih"], p.get("b_ih"), time_axis)
    h = h0
    outs = {}
    for t in _steps(xp, time_axis, reverse):
        xr, xz, xn = _gates(b, _step_input(b, xp, time_axis, t), 3, H)
        if h is None:
            bh = p.get("b_hh")
            hr, hz, hn = _gates(b, bh, 3, H) if bh is not None else (None, None, None)
        else:
            from .import_nn import linear
            hr, hz, hn = _gates(b, linear(b, h, p["w_hh"], p.get("b_hh")), 3, H)
        add = lambda a, c: a if c is None else B.binary(b, "add", a, c)
        r = B.unary(b, "sigmoid", add(xr, hr))
        z = B.unary(b, "sigmoid", add(xz, hz))
        n = B.unary(b, "tanh", add(xn, None if hn is None else B.binary(b, "mul", r, hn)))
        keep = B.binary(b, "mul", n, B.affine(b, z, -1.0, 1.0))          # (1 - z) * n
        h = keep if h is None else B.binary(b, "add", keep, B.binary(b, "mul", z, h))
        outs[t] = h
    return [outs[t] for t in sorted(outs)], h, None


def _stack(b, vs, axis):
    """Stack [N, H] values on a new ``axis`` of a batch-leading result."""
    parts = [B.reshape(b, v, v.shape[:axis] + (1,) + v.shape[axis:]) for v in vs]
    return parts[0] if len(parts) == 1 else B.concat(b, parts, axis)


def rnn(b: Builder, kind, x: V, layers, batch_first, h0=None, c0=None):
    """LSTM ('lstm') or GRU ('gru'). ``layers``: per layer a list of one or two direction dicts
    (w_ih, w_hh, b_ih, b_hh as V constants, PyTorch's gate order). Returns (y, h_n, c_n) in
    PyTorch's logical layouts: y [N, T, D*H] (batch_first) or [T, N, D*H]; h_n, c_n
    [layers*D, N, H] (c_n None for a GRU)."""
    if x.rank != 3:
        raise UnsupportedError(f"{kind.upper()} input of rank {x.rank} (expected [N, T, I] or [T, N, I])")
    time_axis = 1 if batch_first else 0
    N = x.shape[1 - time_axis]
    hs, cs = [], []
    inp, ta = x, time_axis
    for li, dirs in enumerate(layers):
        H = dirs[0]["w_hh"].shape[1]
        seqs = []
        for di, p in enumerate(dirs):
            k = li * len(dirs) + di
            hi, ci = _state(b, h0, k, N, H), _state(b, c0, k, N, H)
            rev = p.get("reverse", di == 1)
            if kind == "lstm":
                seq, h, c = lstm_direction(b, inp, p, ta, rev, hi, ci)
            else:
                seq, h, c = gru_direction(b, inp, p, ta, rev, hi)
            seqs.append(seq)
            hs.append(h)
            cs.append(c)
        steps = [B.concat(b, list(hts), 1) if len(hts) > 1 else hts[0] for hts in zip(*seqs)]
        inp, ta = _stack(b, steps, 1), 1                      # [N, T, D*H], batch-leading
    y = inp if batch_first else B.permute(b, inp, (1, 0, 2))
    h_n = B.permute(b, _stack(b, hs, 1), (1, 0, 2))
    c_n = B.permute(b, _stack(b, cs, 1), (1, 0, 2)) if kind == "lstm" else None
    return y, h_n, c_n
