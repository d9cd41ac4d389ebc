"""Post-training quantisation of ``lstm`` (frontend/ops/recurrent.py) to TFLite's int8 LSTM (int8
activations, int16 cell state; computed as TFLite Micro does, recurrent_16x8.py), as TensorFlow's
converter quantises a Keras LSTM:

- input ``x``: int8 asymmetric from its calibrated range (as any activation);
- the 8 gate weight matrices: int8 symmetric *per tensor* (narrow range, scale max|w| / 127);
- the 4 gate biases: int32, scale ``s_x * s_w`` of that gate's input weights, zero point 0;
- the output, which is also the output state ``h0`` (TFLite's kernel feeds one step's output back as
  the next step's input): int8 from the symmetric range [-m, m], m the largest |h| calibration
  saw (scale 2m / 255, zero point 0: the hidden state lies in (-1, 1) and is symmetric);
- the cell state ``c0``: int16 with a power-of-two scale ``2**ceil(log2(m_c)) / 32768``, m_c the
  largest |c| calibration saw (the kernel's tanh needs it; TFLite's ``CheckedLog2``), bounded to
  the kernel's 2**-21 .. 2**-9;
- the converter's five intermediates are written by the exporter (recurrent_tflite.py).

``activations="int16"`` gives TFLite Micro's 16x8 LSTM instead: int16 symmetric input and output
(scale max|range| / 32767, zero point 0), the same int8 weights and power-of-two int16 cell state,
int64 biases with scale ``s_x * s_w``.

The cell state is internal to the op: calibration records it through ``observe`` (every step's c).
"""
from __future__ import annotations

import math

import numpy as np

from ..int8_convert import QuantizationError, qparams16_from_range, qparams_from_range, quantize_weights
from ..registry import Quant, get_op
from ..types import QParams
from .recurrent import GATES, _clip, _sigmoid

CELL_LOG2 = (-21, -9)       # cell scale exponents TFLite's integer LSTM accepts


def _cells(xs, a):
    """Every step's cell state of the float LSTM (the reference's recurrence)."""
    x, wx, wh, b, h, c = xs[0], xs[1:5], xs[5:9], xs[9:13], xs[13], xs[14]
    xb = np.swapaxes(x, 0, 1) if a["time_major"] else x
    cs, hs = [], []
    for t in range(xb.shape[1]):
        pre = [xb[:, t] @ wx[k].T + h @ wh[k].T + b[k] for k in range(4)]
        c = _clip(_sigmoid(pre[1]) * c + _sigmoid(pre[0]) * np.tanh(pre[2]), a["cell_clip"])
        h = _sigmoid(pre[3]) * np.tanh(c)
        cs.append(c)
        hs.append(h)
    if a.get("output") == "cell":          # a stateful LSTM's final-cell node: its h range, for h0's scale
        return {"cell": np.stack(cs), "hidden": np.stack(hs)}
    return {"cell": np.stack(cs)}


def cell_qparams(lo, hi):
    """int16 cell-state quantisation: power-of-two scale covering max(|lo|, |hi|)."""
    m = max(abs(float(lo)), abs(float(hi)))
    e = math.ceil(math.log2(m)) - 15 if m > 0 else CELL_LOG2[0]
    return QParams((2.0 ** min(max(e, CELL_LOG2[0]), CELL_LOG2[1]),), (0,))


def _const(conv, name, data, qp):
    return conv.q.add_const(conv.q.fresh(name), data, qp)


def _shared(conv, key, make):
    """One quantised constant per float input and role: a stateful LSTM's two nodes (sequence and
    final cell) read the same tensors, as the one TFLite operator they export as."""
    if (key, "lstm") not in conv.env:
        conv.env[(key, "lstm")] = make()
    return conv.env[(key, "lstm")]


def _lstm_convert(conv, n, dt):
    if dt not in ("int8", "int16"):
        raise QuantizationError(f"node {n.name!r}: lstm quantises to int8 (TFLite's int8 LSTM) or int16 "
                                f"(TFLite Micro's 16x8 LSTM) activations, not {dt}")
    tensors = conv.tensors
    missing = [v for v in n.inputs[1:] if v not in tensors]
    if missing:
        raise QuantizationError(f"node {n.name!r}: lstm weights, biases and initial states must be constants or "
                                f"parameters; {missing[0]!r} is computed")
    x = conv.operand(n.inputs[0], dt)
    s_x = conv.q.types[x].quant.scale[0]
    cell = n.attrs.get("output") == "cell"
    hkey = f"{n.name}:hidden" if cell else n.name
    if hkey not in conv.ranges or f"{n.name}:cell" not in conv.ranges:
        raise QuantizationError(f"node {n.name!r}: no calibration range for the lstm output or its cell state")
    m = max(abs(v) for v in conv.ranges[hkey])
    hq = qparams_from_range(-m, m) if dt == "int8" else qparams16_from_range(-m, m)
    cq = cell_qparams(*conv.ranges[f"{n.name}:cell"])
    ins = [x]
    scales = []
    for v in n.inputs[1:9]:
        wq, wqp = quantize_weights(tensors[v], per_channel=False)
        scales.append(wqp.scale[0])
        ins.append(_shared(conv, (v, "int8"), lambda: _const(conv, f"{v}_int8", wq, wqp)))
    bdt, blim = ("int32", 1 << 31) if dt == "int8" else ("int64", 1 << 40)
    for k, v in enumerate(n.inputs[9:13]):
        bs = float(np.float32(np.float32(s_x) * np.float32(scales[k])))
        bq = np.clip(np.round(np.asarray(tensors[v], np.float64) / bs), -blim, blim - 1).astype(bdt)
        ins.append(_shared(conv, (v, bdt, k, bs), lambda: _const(conv, f"{v}_{bdt}_{GATES[k]}", bq,
                                                                  QParams((bs,), (0,)))))
    for v, qp, sdt in ((n.inputs[13], hq, dt), (n.inputs[14], cq, "int16")):
        ins.append(_state(conv, n, v, qp, sdt))
    return (ins, cq, "int16") if cell else (ins, hq)


def _state(conv, n, v, qp, sdt):
    """The quantised initial state v; a graph state (a stateful LSTM) once for the LSTM's two nodes
    (sequence and final cell), kept a state of the quantised graph."""
    s, z = qp.scale[0], qp.zero_point[0]
    info = np.iinfo(sdt)
    data = np.clip(np.round(np.asarray(conv.tensors[v], np.float64) / s) + z, info.min, info.max).astype(sdt)
    if v not in conv.g.states:
        return _const(conv, f"{v}_{sdt}", data, qp)
    key = (v, "lstm_state")
    if key in conv.env:
        have = conv.q.types[conv.env[key]]
        if (have.dtype, have.quant) != (sdt, qp):
            raise QuantizationError(f"node {n.name!r}: the lstm state {v!r} is quantised as {have} by another node "
                                    f"and as {sdt} {qp} here; quantise a stateful LSTM's nodes alike")
        return conv.env[key]
    conv.env[key] = name = _const(conv, f"{v}_{sdt}", data, qp)
    conv.q.states[name] = conv.g.states[v]
    return name


get_op("lstm").quant = Quant(convert=_lstm_convert, observe=_cells)
