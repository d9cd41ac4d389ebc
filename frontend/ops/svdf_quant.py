"""Post-training quantisation of a float SVDF (``svdf_state`` + ``svdf``, frontend/ops/svdf.py) to
TFLite's integer SVDF, as TensorFlow's converter quantises one:

- input ``x``: int8 from its calibrated range (as any activation);
- feature weights: int8 symmetric per tensor (scale max|w| / 127);
- the activation state: int16 symmetric (zero point 0), scale max|range| / 32767 of the calibrated
  new state (its newest column is ``weights_feature @ x``; the older columns are earlier runs'
  columns, so that range covers the whole state); its reset value (zeros) is the state constant,
  and the quantised graph keeps ``states[int16 state] = new state``;
- time weights: int16 symmetric per tensor (scale max|w| / 32767), the state's type;
- bias: int32 with scale ``s_state * s_time_weights`` (the integer kernel adds it to
  ``sum(weights_time * state)``), zero point 0;
- the output: int8 from its calibrated range. TFLite's integer SVDF takes only a RELU SVDF, and
  does not apply the RELU: it lives in the output range (calibrated after the RELU, so the zero
  point sits at 0.0). An SVDF without activation is refused.
"""
from __future__ import annotations

import numpy as np

from ..int8_convert import QuantizationError, quantize_weights
from ..registry import Quant, get_op
from ..types import QParams

STATE_DTYPE = "int16"


def _symmetric16(a):
    """int16 symmetric per-tensor data and QParams (scale max|a| / 32767, float32 as TFLite stores it)."""
    a = np.asarray(a, np.float64)
    m = float(np.max(np.abs(a))) if a.size else 0.0
    s = float(np.float32(m / 32767 if m > 0 else 1e-8))
    return np.clip(np.round(a / s), -32767, 32767).astype(np.int16), QParams((s,), (0,))


def _weights(conv, n, names):
    missing = [v for v in names if v not in conv.tensors]
    if missing:
        raise QuantizationError(f"node {n.name!r}: {n.op} weights and bias must be constants or parameters; "
                                f"{missing[0]!r} is computed")
    return [conv.tensors[v] for v in names]


def _state_convert(conv, n, dt):
    if dt != "int8":
        raise QuantizationError(f"node {n.name!r}: svdf quantises to TFLite's integer SVDF (int8 activations); "
                                f"16x8 SVDFs are not supported")
    x, wf, st = n.inputs
    if st not in conv.g.states:
        raise QuantizationError(f"node {n.name!r}: the svdf state {st!r} must be a graph state (graph.states)")
    (w,) = _weights(conv, n, [wf])
    xq = conv.operand(x, dt)
    wq, wqp = quantize_weights(w, per_channel=False)
    if n.name not in conv.ranges:
        raise QuantizationError(f"node {n.name!r}: no calibration range for the svdf state")
    lo, hi = conv.ranges[n.name]
    m = max(abs(float(lo)), abs(float(hi)))
    sqp = QParams((float(np.float32(m / 32767 if m > 0 else 1e-8)),), (0,))
    reset = np.asarray(conv.tensors[st], np.float64)
    sdata = np.clip(np.round(reset / sqp.scale[0]), -32768, 32767).astype(np.int16)
    q = conv.q
    sname = q.add_const(q.fresh(st + "_int16"), sdata, sqp)
    q.states[sname] = n.name
    return [xq, q.add_const(q.fresh(wf + "_int8"), wq, wqp), sname], sqp, STATE_DTYPE


def _out_convert(conv, n, dt):
    st, wt, b = n.inputs
    if n.attrs["activation"] != "relu":
        raise QuantizationError(f"node {n.name!r}: an svdf with activation {n.attrs['activation']!r}: TFLite's "
                                f"integer SVDF takes only RELU (LiteRT's kernel refuses others); train the layer "
                                f"with activation='relu', or keep it float")
    if (st, STATE_DTYPE) not in conv.env:
        raise QuantizationError(f"node {n.name!r}: svdf reads {st!r}, which is not the int16 state of an svdf_state")
    w, bias = _weights(conv, n, [wt, b])
    s_st = conv.qp[(st, STATE_DTYPE)].scale[0]
    wq, wqp = _symmetric16(w)
    bs = float(np.float32(np.float32(s_st) * np.float32(wqp.scale[0])))
    bq = np.clip(np.round(np.asarray(bias, np.float64) / bs), -(1 << 31), (1 << 31) - 1).astype(np.int32)
    q = conv.q
    ins = [conv.env[(st, STATE_DTYPE)], q.add_const(q.fresh(wt + "_int16"), wq, wqp),
           q.add_const(q.fresh(b + "_int32"), bq, QParams((bs,), (0,)))]
    return ins, conv.need_range(n.name, dt)


get_op("svdf_state").quant = Quant(convert=_state_convert)
get_op("svdf").quant = Quant(convert=_out_convert)
