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
    ``int8_io`` then means integer (int16) input and output. ``activations`` may also map node
    names to "int8" / "int16" (the key "*" sets the default, else int8): mixed per-layer
    precision, with a QUANTIZE (int8 <-> int16 requantisation) wherever an operand's type changes;
    the graph's inputs and (with ``int8_io``) outputs take the default type."""
    layer = activations if isinstance(activations, dict) else {"*": activations}
    bad = sorted({str(v) for v in layer.values()} - set(_ACT))
    if bad:
        raise QuantizationError(f"activations must be 'int8' or 'int16', got {bad[0]!r}")
    unknown = sorted(set(layer) - {"*"} - {n.name for n in graph.nodes})
    if unknown:
        raise QuantizationError(f"activations names node(s) {unknown} that the graph does not have")
    c = _Converter(graph, ranges, per_channel, qparams or {}, weight_qparams or {}, layer)
    kinds = {layer.get(n.name, c.default) for n in graph.nodes} | {c.default}
    tag = "int8" if kinds == {"int8"} else "16x8" if kinds == {"int16"} else "mixed"
    q = c.run(int8_io, name or f"{graph.name}_{tag}")
    q.meta.update(quantized=tag, per_channel=bool(per_channel), int8_io=bool(int8_io))
    if tag == "mixed":
        q.meta["int16_layers"] = sorted(n.name for n in graph.nodes if layer.get(n.name, c.default) == "int16")
    return q


class _Converter:
    """One conversion: every quantised value is kept per activation type ``(value, dtype)``."""

    def __init__(self, graph, ranges, per_channel, qparams, weight_qparams, layer):
        self.g, self.ranges, self.per_channel = graph, ranges, per_channel
        self.qparams, self.weight_qparams, self.layer = qparams, weight_qparams, layer
        self.default = layer.get("*", "int8")
        self.tensors = {**graph.consts, **graph.params}
        self.env, self.qp, self.home = {}, {}, {}

    def need_range(self, v, dt):
        if v in self.qparams:
            return self.qparams[v]
        if v not in self.ranges:
            raise QuantizationError(f"no calibration range for value {v!r}")
        return _ACT[dt][1](*self.ranges[v])

    def put(self, v, dt, qv, qq):
        self.env[(v, dt)], self.qp[(v, dt)] = qv, qq
        self.home.setdefault(v, dt)
        return qv

    def const(self, v, dt):
        """An activation-like constant operand (add/mul): per tensor with its own range. A graph
        state (its reset value) is read as an activation: its range covers the reset value and the
        calibrated range of the state's next value (what later runs read)."""
        a = np.asarray(self.tensors[v], np.float64)
        lo, hi = self.ranges.get(self.g.states.get(v), (0.0, 0.0))
        qq = _ACT[dt][1](min(lo, float(a.min(initial=0.0))), max(hi, float(a.max(initial=0.0))))
        s, z = qq.scale[0], qq.zero_point[0]
        data = np.clip(np.round(a / s) + z, np.iinfo(dt).min, np.iinfo(dt).max).astype(dt)
        return self.put(v, dt, self.q.add_const(self.q.fresh(v + "_q"), data, qq), qq)

    def operand(self, v, dt):
        """v as a ``dt`` value: as computed, or requantised from the type it was computed in."""
        if (v, dt) in self.env:
            return self.env[(v, dt)]
        if v in self.tensors and v not in self.home and np.asarray(self.tensors[v]).dtype.kind in "iu":
            if (v, "index") not in self.env:       # integer data (gather indices) stays as it is
                self.env[(v, "index")] = self.q.add_const(self.q.fresh(v), np.asarray(self.tensors[v]))
            return self.env[(v, "index")]
        if v in self.tensors and v not in self.home:
            return self.const(v, dt)
        if v not in self.home:
            raise QuantizationError(f"value {v!r} is used before it is defined")
        return self.requant(v, dt, self.need_range(v, dt), cache=True)

    def requant(self, v, dt, target: QParams, cache=False):
        src_dt = self.home[v] if cache else dt
        src = self.env[(v, src_dt)] if cache else self.operand(v, dt)
        if not cache and self.qp[(v, dt)] == target:
            return src
        qv = self.q.add_node("quantize", [src], {"scale": list(target.scale), "zero_point": list(target.zero_point),
                                                 "dtype": dt},
                             name=self.q.fresh(v + ("_" + dt if cache else "_requant")),
                             out_type=TensorType(self.q.types[src].shape, dt, target))
        return self.put(v, dt, qv, target) if cache else qv

    def node(self, n):
        rule = get_op(n.op).quant
        if rule is None:
            raise QuantizationError(f"node {n.name!r}: op '{n.op}' has no int8 kernel; int8 graphs support "
                                    f"{', '.join(quantizable_ops())}")
        dt = self.layer.get(n.name, self.default)
        _, _, fixed16, qbias = _ACT[dt]
        out_dt = dt
        if rule.convert is not None:           # the op quantises its own operands (lstm; svdf_state: int16 out)
            inputs, oq, *out_type = rule.convert(self, n, dt)
            out_dt = out_type[0] if out_type else dt
        elif rule.inputs == "weights":
            x = self.operand(n.inputs[0], dt)
            inputs = [x] + _weights_and_bias(self.q, n, self.tensors, self.q.types[x].quant.scale[0],
                                             self.per_channel, self.weight_qparams, qbias)
            oq = self.need_range(n.name, dt)
        elif rule.output == "fixed":
            inputs = [self.operand(v, dt) for v in n.inputs]
            oq = fixed16 or _qp(rule.fixed)
        elif rule.output == "input":
            inputs = [self.operand(v, dt) for v in n.inputs]
            oq = self.qp[(n.inputs[0], dt)]
        elif rule.inputs == "requantize":
            oq = self.need_range(n.name, dt)
            inputs = [self.requant(v, dt, oq) for v in n.inputs]
        else:   # calibrated output, integer operands (add, mul, mean, relu, relu6)
            inputs = [self.operand(v, dt) for v in n.inputs]
            oq = self.need_range(n.name, dt)
        out_t = self.g.types[n.name]
        self.put(n.name, out_dt, self.q.add_node(n.op, inputs, n.attrs, name=n.name,
                                                 out_type=TensorType(out_t.shape, out_dt, oq)), oq)

    def keep_states(self):
        """Graph states read as activations (``const``; an LSTM's or SVDF's own states are kept by
        their rules) stay states of the quantised graph: the next value is requantised to the
        state's quantisation where the two differ, since the next run reads it as the state."""
        for s, nxt in self.g.states.items():
            for dt in _ACT:
                if (s, dt) in self.env and self.env[(s, dt)] not in self.q.states:
                    self.q.states[self.env[(s, dt)]] = self.requant(nxt, dt, self.qp[(s, dt)])

    def run(self, int_io, name):
        g, dt = self.g, self.default
        self.q = q = Graph(name)
        for i in g.inputs:
            t = g.types[i]
            qq = self.need_range(i, dt)
            if int_io:
                self.put(i, dt, q.add_input(i, TensorType(t.shape, dt, qq)), qq)
            else:
                q.add_input(i, t)
                self.put(i, dt, q.add_node("quantize", [i], {"scale": list(qq.scale), "zero_point": list(qq.zero_point),
                                                             "dtype": dt},
                                           name=q.fresh(i + "_quant"), out_type=TensorType(t.shape, dt, qq)), qq)
        for n in g.nodes:
            self.node(n)
        self.keep_states()
        for o in g.outputs:
            v = self.env[(o, self.home[o])]
            if int_io:
                q.outputs.append(self.operand(o, dt))
            else:
                t = g.types[o]
                q.outputs.append(q.add_node("dequantize", [v], {"dtype": t.dtype}, name=q.fresh(o + "_dequant"),
                                            out_type=TensorType(t.shape, t.dtype)))
        return q
