"""QDQ-quantised ONNX models (QuantizeLinear/DequantizeLinear around float ops, as
onnxruntime.quantization and PyTorch's PT2E export write them) -> Kiln int8 graphs with the model's
own scales.

At import, ``DequantizeLinear`` of a constant (int8 weights, int32 biases) becomes the float
constant it stands for, its scales kept for the weight; a ``QuantizeLinear`` -> ``DequantizeLinear``
pair on an activation is the identity, its scale and zero point kept for the value. The float graph
is then prepared (BatchNorm folded, ReLU fused) and converted to int8 by kiln.quantize with exactly
those parameters (``convert(qparams=..., weight_qparams=...)``): weights are the model's int8 values,
biases int32 with scale ``s_in * s_w``, activations per tensor (uint8 zero points shift by -128: the
same real values in int8). Inputs and outputs stay float: ``quantize`` at the inputs, ``dequantize``
at the outputs, as the QDQ model's own first Q and last DQ.

The int8 arithmetic is then TFLite's (docs/import.md, "ONNX integer semantics"): onnxruntime
requantises in float with round-half-to-even, Kiln with TFLite's fixed-point multipliers; outputs can
differ by an LSB where a value lands near a rounding boundary.
"""
from __future__ import annotations

import numpy as np

from .graph_passes import prepare
from .import_blocks import UnsupportedError
from .int8_convert import convert
from .registry import get_op
from .types import QParams

FOLDED_AFTER = ("relu", "relu6", "add", "mul")


def dequantize_const(v, scale, zp, axis):
    """The float array DequantizeLinear gives for constant int ``v`` (ONNX: (x - zp) * scale)."""
    x = np.asarray(v, np.float32)
    s = np.asarray(scale, np.float32)
    z = np.asarray(zp if zp is not None else 0, np.float32)
    if s.ndim == 1 and s.size > 1:
        shape = [1] * x.ndim
        shape[axis % x.ndim] = -1
        s, z = s.reshape(shape), np.broadcast_to(z, s.shape).reshape(shape)
    return ((x - z) * s).astype(np.float32)


def act_qparams(scale, zp, dtype):
    s = np.ravel(np.asarray(scale, np.float64))
    if s.size != 1:
        raise UnsupportedError("per-channel quantisation of an activation (Kiln quantises activations per tensor)")
    z = int(np.ravel(np.asarray(zp if zp is not None else 0))[0])
    if dtype == "uint8":
        z -= 128
    elif dtype != "int8":
        raise UnsupportedError(f"QuantizeLinear to {dtype} (Kiln imports int8 and uint8)")
    return QParams((float(np.float32(s[0])),), (z,))


def _carry(g, qp):
    """A ReLU, or a BatchNorm's mul/add, that prepare folds into the conv/dense before it hands its
    output parameters to that conv/dense (the fused node's output is the ReLU's)."""
    consts = set(g.params) | set(g.consts)
    uses = g.consumers()
    for n in reversed(g.nodes):
        if n.op not in FOLDED_AFTER or n.name not in qp:
            continue
        runtime = [i for i in n.inputs if i not in consts and g.producer(i) is not None]
        if len(runtime) != 1 or (n.op in ("add", "mul") and len(n.inputs) - len(runtime) != 1):
            continue
        src = g.producer(runtime[0])
        if src.op in ("conv2d", "dense") + FOLDED_AFTER and len(uses[src.name]) == 1 and src.name not in qp:
            qp[src.name] = qp[n.name]


def to_int8(graph, act_q, weight_q, params):
    """The int8 Graph of a QDQ model imported as ``graph`` (float) with activation parameters
    ``act_q`` {value: QParams} and weight scales ``weight_q`` {source name: QParams}; ``params``:
    the builder's {(source name, key): graph tensor}."""
    qp = dict(act_q)
    missing_in = [i for i in graph.inputs if i not in qp]
    if missing_in:
        raise UnsupportedError(f"QDQ model input(s) {missing_in} are not quantised by a QuantizeLinear")
    _carry(graph, qp)
    pg = prepare(graph)
    wq = {}
    for (src, _key), name in params.items():
        if src in weight_q and name in pg.params or name in pg.consts and src in weight_q:
            q = weight_q[src]
            n = pg.types[name].shape[0] if pg.types[name].shape else 1
            wq[name] = q if not q.per_channel or len(q.scale) == n else None
    wq = {k: v for k, v in wq.items() if v is not None}
    for n in pg.nodes:
        rule = get_op(n.op).quant
        if rule is not None and rule.output == "calibrated" and n.name not in qp:
            raise UnsupportedError(f"node {n.name!r} ({n.op}): its output has no QuantizeLinear; a QDQ model "
                                   f"quantises every op output Kiln computes in int8")
    q = convert(pg, {}, per_channel=True, int8_io=False, name=graph.name, qparams=qp, weight_qparams=wq)
    q.meta.update(graph.meta, quantized="int8", source_quantization="onnx-qdq")
    return q
