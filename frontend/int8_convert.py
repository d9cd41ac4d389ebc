"""Float graph -> int8 graph, given every activation's quantisation parameters: the conversion
step of post-training quantisation (kiln.quantize.ptq, which calibrates the ranges first), of
QAT (kiln.quantize.qat) and of imported int8 models that carry their own scales (ONNX QDQ,
frontend/onnx_qdq.py). Each op's ``OpDef.quant`` rule (frontend/ops) says how its operands and
output are quantised: weights int8 symmetric (per output channel, or per tensor), biases int32 with
scale ``s_in * s_w``, activations int8 asymmetric per tensor; ops whose output quantisation TFLite
fixes get it (softmax/sigmoid 1/256 zp -128, tanh 1/128 zp 0; pooling, reshape and pad keep their
input's). By default the graph takes and returns float (``quantize`` at the input, ``dequantize`` at
the output); ``int8_io=True`` gives int8 input and output, as firmware wants.

``activations="int16"`` converts to TFLite's 16x8 scheme instead: int16 activations, symmetric
(zero point 0, scale max|range| / 32767), int8 weights, int64 biases with scale ``s_in * s_w``;
softmax, sigmoid and tanh outputs get scale 1/32768 and zero point 0."""
from __future__ import annotations

import numpy as np

from .errors import KilnError
from .graph import Graph
from .registry import get_op, quantizable_ops
from .types import QParams, TensorType


def qparams_from_range(lo, hi, qmin=-128, qmax=127) -> QParams:
    """TFLite-style asymmetric per-tensor int8 parameters covering [lo, hi] (and 0)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = (hi - lo) / (qmax - qmin)
    if not scale > 0 or not np.isfinite(scale):
        scale = 1e-8 if np.isfinite(scale) else 1.0
    scale = float(np.float32(scale))
    zp = int(np.clip(np.round(qmin - lo / scale), qmin, qmax))
    return QParams((scale,), (zp,))


class QuantizationError(KilnError):
    """A graph cannot be quantised as asked (unsupported op, missing ranges, ...)."""


def quantize_weights(w, per_channel=True, bits=8):
    """Symmetric int8 weights: (int8 array, QParams on axis 0 or per tensor)."""
    w = np.asarray(w, np.float64)
    qmax = (1 << (bits - 1)) - 1
    if per_channel:
        m = np.max(np.abs(w.reshape(w.shape[0], -1)), axis=1)
    else:
        m = np.full(1, np.max(np.abs(w)) if w.size else 0.0)
    s = np.where(m > 0, m / qmax, 1e-8).astype(np.float32).astype(np.float64)
    shape = (-1,) + (1,) * (w.ndim - 1) if per_channel else ()
    q = np.clip(np.round(w / s.reshape(shape) if per_channel else w / s[0]), -qmax, qmax).astype(np.int8)
    if per_channel:
        return q, QParams(tuple(s.tolist()), (0,) * len(s), 0)
    return q, QParams((float(s[0]),), (0,))


def quantize_weights_as(w, qp: QParams):
    """int8 weights with given symmetric scales (an imported int8 model's own: ONNX QDQ)."""
    w = np.asarray(w, np.float64)
    s = np.asarray(qp.scale, np.float64)
    s = s.reshape((-1,) + (1,) * (w.ndim - 1)) if qp.per_channel else s[0]
    return np.clip(np.round(w / s), -128, 127).astype(np.int8), qp


def quantize_bias(b, s_in, w_q: QParams, n):
    """int32 bias with scale float32(s_in) * float32(s_w[c]) (as the TFLite converter forms it)."""
    ws = np.broadcast_to(np.asarray(w_q.scale, np.float32), (n,))
    bs = (np.float32(s_in) * ws).astype(np.float32)
    b = np.zeros(n) if b is None else np.asarray(b, np.float64)
    q = np.clip(np.round(b / bs.astype(np.float64)), -(1 << 31), (1 << 31) - 1).astype(np.int32)
    if w_q.per_channel:
        return q, QParams(tuple(float(v) for v in bs), (0,) * n, 0)
    return q, QParams((float(bs[0]),), (0,))


def qparams16_from_range(lo, hi) -> QParams:
    """TFLite 16x8 activation parameters: symmetric int16 (zero point 0), scale max|range| / 32767."""
    m = max(abs(float(lo)), abs(float(hi)))
    scale = m / 32767.0
    if not scale > 0 or not np.isfinite(scale):
        scale = 1e-8 if np.isfinite(scale) else 1.0
    return QParams((float(np.float32(scale)),), (0,))


def quantize_bias64(b, s_in, w_q: QParams, n):
    """16x8 bias: int64 with scale float32(s_in) * float32(s_w[c]) (as the TFLite converter forms it)."""
    ws = np.broadcast_to(np.asarray(w_q.scale, np.float32), (n,))
    bs = (np.float32(s_in) * ws).astype(np.float32)
    b = np.zeros(n) if b is None else np.asarray(b, np.float64)
    q = np.clip(np.round(b / bs.astype(np.float64)), -(1 << 40), 1 << 40).astype(np.int64)
    if w_q.per_channel:
        return q, QParams(tuple(float(v) for v in bs), (0,) * n, 0)
    return q, QParams((float(bs[0]),), (0,))


# what differs between int8 and 16x8 activations: (dtype, range -> QParams, fixed output QParams, bias)
_ACT = {"int8": ("int8", qparams_from_range, None, quantize_bias),
        "int16": ("int16", qparams16_from_range, QParams((1.0 / 32768,), (0,)), quantize_bias64)}


def _qp(scale_zp):
    s, z = scale_zp
    return QParams((float(np.float32(s)),), (int(z),))


def _weights_and_bias(q, n, tensors, s_in, per_channel, weight_qparams, qbias=quantize_bias):
    """The int8 weights and int32 (16x8: int64) bias constants of a conv/dense node ``n``, added to ``q``."""
    wname = n.inputs[1]
    if wname not in tensors:
        raise QuantizationError(f"node {n.name!r}: weights {wname!r} must be a parameter or constant")
    wq, wqp = (quantize_weights_as(tensors[wname], weight_qparams[wname]) if wname in weight_qparams
               else quantize_weights(tensors[wname], per_channel))
    wn = q.add_const(q.fresh(wname + "_int8"), wq, wqp)
    bias = n.inputs[2] if len(n.inputs) == 3 else None
    bq, bqp = qbias(tensors[bias] if bias else None, s_in, wqp, wq.shape[0])
    bn = q.add_const(q.fresh((bias or n.name + "_bias") + "_" + bq.dtype.name), bq, bqp)
    return [wn, bn]


def convert(graph: Graph, ranges: dict, per_channel=True, int8_io=False, name=None, qparams=None,
            weight_qparams=None, activations="int8") -> Graph:
    """Quantise a prepared float graph given activation ranges {value: (lo, hi)}; ``qparams``
    {value: QParams} and ``weight_qparams`` {weight: QParams} give parameters outright instead
    (an imported int8 model's own scales). ``activations="int16"``: TFLite's 16x8 scheme
    (int16 symmetric activations, int8 weights, int64 biases; softmax/sigmoid/tanh outputs 1/32768);
    ``int8_io`` then means integer (int16) input and output."""
    if activations not in _ACT:
        raise QuantizationError(f"activations must be 'int8' or 'int16', got {activations!r}")
    adt, from_range, fixed16, qbias = _ACT[activations]
    qparams, weight_qparams = qparams or {}, weight_qparams or {}
    g = graph
    q = Graph(name or f"{g.name}_{'int8' if adt == 'int8' else '16x8'}")
    env, qp = {}, {}
    tensors = {**g.consts, **g.params}

    def need_range(v):
        if v in qparams:
            return qparams[v]
        if v not in ranges:
            raise QuantizationError(f"no calibration range for value {v!r}")
        return from_range(*ranges[v])

    def const_int8(v):
        """An activation-like constant operand (add/mul): int8 per tensor with its own range."""
        if v in env:
            return env[v]
        a = np.asarray(tensors[v], np.float64)
        qq = from_range(float(a.min(initial=0.0)), float(a.max(initial=0.0)))
        s, z = qq.scale[0], qq.zero_point[0]
        lo, hi = np.iinfo(adt).min, np.iinfo(adt).max
        data = np.clip(np.round(a / s) + z, lo, hi).astype(adt)
        env[v] = q.add_const(q.fresh(v + "_q"), data, qq)
        qp[v] = qq
        return env[v]

    for i in g.inputs:
        t = g.types[i]
        qq = need_range(i)
        qp[i] = qq
        if int8_io:
            env[i] = q.add_input(i, TensorType(t.shape, adt, qq))
        else:
            q.add_input(i, t)
            env[i] = q.add_node("quantize", [i], {"scale": list(qq.scale), "zero_point": list(qq.zero_point),
                                                  "dtype": adt},
                                name=q.fresh(i + "_quant"), out_type=TensorType(t.shape, adt, qq))

    def operand(v):
        if v in env:
            return env[v]
        if v in tensors:
            return const_int8(v)
        raise QuantizationError(f"value {v!r} is used before it is defined")

    def requant_to(v, target: QParams):
        """v's int8 value, requantised to ``target`` when its parameters differ (concat inputs)."""
        src = operand(v)
        if qp[v] == target:
            return src
        t = q.types[src]
        return q.add_node("quantize", [src], {"scale": list(target.scale), "zero_point": list(target.zero_point),
                                              "dtype": adt},
                          name=q.fresh(v + "_requant"), out_type=TensorType(t.shape, adt, target))

    for n in g.nodes:
        rule = get_op(n.op).quant
        if rule is None:
            raise QuantizationError(f"node {n.name!r}: op '{n.op}' has no int8 kernel; int8 graphs support "
                                    f"{', '.join(quantizable_ops())}")
        out_t = g.types[n.name]
        if rule.inputs == "weights":
            inputs = [operand(n.inputs[0])] + _weights_and_bias(q, n, tensors, qp[n.inputs[0]].scale[0],
                                                                per_channel, weight_qparams, qbias)
            oq = need_range(n.name)
        elif rule.output == "fixed":
            inputs = [operand(v) for v in n.inputs]
            oq = fixed16 or _qp(rule.fixed)
        elif rule.output == "input":
            inputs = [operand(n.inputs[0])] + [operand(v) for v in n.inputs[1:]]
            oq = qp[n.inputs[0]]
        elif rule.inputs == "requantize":
            oq = need_range(n.name)
            inputs = [requant_to(v, oq) for v in n.inputs]
        else:   # calibrated output, int8 operands (add, mul, mean, relu, relu6)
            inputs = [operand(v) for v in n.inputs]
            oq = need_range(n.name)
        env[n.name] = q.add_node(n.op, inputs, n.attrs, name=n.name, out_type=TensorType(out_t.shape, adt, oq))
        qp[n.name] = oq

    for o in g.outputs:
        if int8_io:
            q.outputs.append(env[o])
        else:
            t = g.types[o]
            q.outputs.append(q.add_node("dequantize", [env[o]], {"dtype": t.dtype}, name=q.fresh(o + "_dequant"),
                                        out_type=TensorType(t.shape, t.dtype)))
    q.meta.update(quantized="int8" if adt == "int8" else "16x8", per_channel=bool(per_channel), int8_io=bool(int8_io))
    return q
