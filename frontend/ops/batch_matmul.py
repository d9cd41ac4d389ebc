"""TFLite's BATCH_MATMUL as Kiln's ``matmul`` (frontend/ops/nn.py): import (``adj_x`` / ``adj_y``
become a ``transpose`` of the last two axes), export, and the int8 reference of ``matmul``.

int8 (TFLite's reference ``BatchMatMul<int8_t, int32_t>``): per-tensor operands and output,
``acc = sum_k (a - z_a) * (b - z_b)`` in int32, requantised by ``MultiplyByQuantizedMultiplier``
with ``float32(s_a * s_b) / s_out`` (``GetQuantizedConvolutionMultipler``), plus the output zero
point, clamped to int8.
"""
from __future__ import annotations

import numpy as np

from .. import fixedpoint as fp
from ..registry import QUANTIZABLE, defrule, get_op
from ..types import TensorType
from . import nn  # noqa: F401  (registers matmul, which this module extends)
from . import tflite_util as tfl
from .int8util import clamp8, int8_io
from .int16util import clamp16, int16_branch, int16_io, mbqm64, symmetric16

NAME = "BATCH_MATMUL"


@defrule("matmul", "int8_ref")
def matmul_int8(xs, attrs, in_types, out_type):
    (sa, za), (sb, zb), (so, zo) = int8_io(in_types, out_type, "matmul", n=2)
    acc = np.matmul(xs[0].astype(np.int64) - za, xs[1].astype(np.int64) - zb)
    m, s = fp.quantize_multiplier(float(np.float32(np.float32(sa) * np.float32(sb))) / float(np.float32(so)))
    return clamp8(fp.multiply_by_quantized_multiplier(acc, m, s) + zo)


get_op("matmul").props = get_op("matmul").props | {QUANTIZABLE}


def _swap_last(imp, k, v, what):
    t = imp.g.types[v]
    if len(t.shape) < 2:
        raise imp.err(f"{tfl.where(k, NAME)}: {what} {list(t.shape)} needs rank >= 2 to be adjointed")
    perm = list(range(len(t.shape) - 2)) + [len(t.shape) - 1, len(t.shape) - 2]
    shape = tuple(t.shape[p] for p in perm)
    name = imp._vname(v + "_adj")
    imp.g.add_node("transpose", [v], {"perm": perm}, name=name, out_type=TensorType(shape, t.dtype, t.quant))
    return name


@tfl.importer(NAME)
def _tfl_batch_matmul(imp, k, op, ins, out):
    tfl.need(imp, k, NAME, ins, 2)
    o = tfl.options(imp, k, op, NAME, "BatchMatMulOptions")
    w = tfl.where(k, NAME)
    if o is not None and o.AsymmetricQuantizeInputs():
        raise imp.err(f"{w}: asymmetric_quantize_inputs is set (a hybrid op); Kiln imports float and int8 BATCH_MATMUL")
    a, b = imp.operand(ins[0], k, NAME), imp.operand(ins[1], k, NAME)
    ta, tb = imp.g.types[a], imp.g.types[b]
    if ta.dtype != tb.dtype:
        raise imp.err(f"{w}: operands are {ta.dtype} and {tb.dtype}; TFLite needs one type")
    if ta.dtype in ("int8", "int16"):
        for v, what in ((a, "lhs"), (b, "rhs"), (None, "output")):
            q = ta.quant if v == a else tb.quant if v == b else imp.tensors[out]["quant"]
            if q is None or len(q.scale) != 1:
                raise imp.err(f"{w}: {ta.dtype} {what} must be quantised per tensor, got {q}")
            if ta.dtype == "int16":
                symmetric16(imp.err, w, [(f"the {what}", q)])
    if o is not None and o.AdjX():
        a = _swap_last(imp, k, a, "lhs")
    if o is not None and o.AdjY():
        b = _swap_last(imp, k, b, "rhs")
    imp.values[out] = imp.emit(k, NAME, "matmul", [a, b], {}, out)


@tfl.exporter("matmul", versions={NAME: 2})
def _tfl_export_matmul(e, n, act, out, int8):
    e.op(NAME, [e.value(i) for i in n.inputs], [e.tensor(out, e.g.types[out])], "BatchMatMulOptions", int8,
         AdjX=False, AdjY=False)


# ---- int16 ----------------------------------------------------------------------------------------
def matmul_int16(xs, attrs, in_types, out_type):
    """TFLite Micro's BATCH_MATMUL int16 (reference_ops::BatchMatMul<int16_t, int64_t>): both
    operands int16 (zero points 0), ``sum_k a * b`` in int64, the int64
    ``MultiplyByQuantizedMultiplier`` of ``float32(s_a * s_b) / s_out``, clamped to int16."""
    (sa, _), (sb, _), (so, _) = int16_io(in_types, out_type, "matmul", n=2)
    acc = np.matmul(xs[0].astype(np.int64), xs[1].astype(np.int64))
    m, s = fp.quantize_multiplier(float(np.float32(np.float32(sa) * np.float32(sb))) / float(np.float32(so)))
    return clamp16(mbqm64(acc, m, s))


int16_branch("matmul", matmul_int16)
