"""Ops that exist because of quantisation: ``quantize``, ``dequantize`` and ``fake_quant``.

- ``quantize(x; scale, zero_point, dtype)``: float -> int8 or int16 as TFLite's QUANTIZE computes it
  (``round_half_away(float32(x) / float32(scale)) + zp``, clamped), or int8/int16 -> int8/int16
  requantisation (``multiply_by_quantized_multiplier`` by ``in_scale / out_scale``).
- ``dequantize(q)``: ``float32(double(scale) * (q - zp))``.
- ``fake_quant(x; scale, zero_point, axis, qmin, qmax)``: float -> float, the quantise-dequantise
  round trip used in QAT; its VJP is the straight-through estimator (gradient passes where x lies
  inside the representable range, zero outside).

The output type of ``quantize`` carries its QParams, so a graph stays self-describing.
"""
from __future__ import annotations

import numpy as np

from .. import fixedpoint as fp
from .. import functional as F
from .. import tflite_checks as chk
from ..errors import ShapeError
from ..registry import (
    ELEMENTWISE,
    INT16,
    NONDIFF,
    QUANTIZABLE,
    REQUIRED,
    UNARY,
    Attr,
    get_op,
    mark,
    register,
)
from ..types import QParams, TensorType
from . import tflite_util as tfl
from .int8util import f32, per_tensor

_INT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "int32": (-(1 << 31), (1 << 31) - 1)}


# ---- quantize ---------------------------------------------------------------------------------
def _quantize_infer(ts, a):
    if a["dtype"] not in _INT_RANGE:
        raise ShapeError(f"quantize: dtype must be one of {sorted(_INT_RANGE)}, got {a['dtype']}")
    if len(a["scale"]) != 1 or len(a["zero_point"]) != 1:
        raise ShapeError("quantize: activations are quantised per tensor (one scale, one zero point)")
    return TensorType(ts[0].shape, a["dtype"], QParams(tuple(a["scale"]), tuple(a["zero_point"])))


def quantize_array(x, scale, zero_point, dtype="int8"):
    """TFLite AffineQuantize: float32 division, round half away from zero, clamp."""
    lo, hi = _INT_RANGE[dtype]
    q = fp.round_half_away(np.asarray(x, np.float32) / np.float32(scale))
    q = np.clip(q.astype(np.float64), lo - zero_point, hi - zero_point).astype(np.int64) + zero_point
    return q.astype(dtype)


def _quantize_ref(xs, a, in_types=None, out_type=None):
    x = xs[0]
    dtype = a["dtype"]
    so, zo = f32(a["scale"][0]), int(a["zero_point"][0])
    lo, hi = _INT_RANGE[dtype]
    if np.asarray(x).dtype.kind == "f":
        return quantize_array(x, so, zo, dtype)
    if in_types is None or in_types[0].quant is None:
        raise ShapeError("quantize: an integer input needs quantisation parameters to be requantised")
    si, zi = per_tensor(in_types[0], "input", "quantize")
    m, e = fp.quantize_multiplier(si / so)
    y = fp.multiply_by_quantized_multiplier(np.asarray(x, np.int64) - zi, m, e) + zo
    return np.clip(y, lo, hi).astype(dtype)


register("quantize", attrs={"scale": Attr("any", REQUIRED), "zero_point": Attr("ints", (0,)),
                            "dtype": Attr("str", "int8")},
         infer=_quantize_infer, ref=lambda xs, a: _quantize_ref(xs, a), props={QUANTIZABLE, UNARY, ELEMENTWISE, NONDIFF},
         arity=1, doc="float -> int8 or int16 (TFLite QUANTIZE), or int8/int16 -> int8/int16/int32 and int32 -> int8/int16 "
             "requantisation")


def _quantize_int8(xs, a, in_types, out_type):
    return _quantize_ref(xs, a, in_types, out_type)


get_op("quantize").int8_ref = _quantize_int8


# ---- dequantize -------------------------------------------------------------------------------
def _dequantize_infer(ts, a):
    if ts[0].quant is None:
        raise ShapeError(f"dequantize: input {ts[0]} has no quantisation parameters")
    return TensorType(ts[0].shape, a["dtype"])


def dequantize_array(q, scale, zero_point, dtype="float32"):
    return (float(scale) * (np.asarray(q, np.float64) - zero_point)).astype(dtype)


def _dequantize_int8(xs, a, in_types, out_type):
    q = in_types[0].quant
    if q.per_channel and len(q.scale) > 1:
        shape = [1] * xs[0].ndim
        shape[q.axis] = -1
        s = np.asarray([f32(v) for v in q.scale]).reshape(shape)
        z = np.asarray(q.zero_point, np.float64).reshape(shape)
        return (s * (xs[0].astype(np.float64) - z)).astype(a["dtype"])
    return dequantize_array(xs[0], f32(q.scale[0]), int(q.zero_point[0]), a["dtype"])


def _dequantize_noquant(xs, a):
    raise ShapeError("dequantize: input has no quantisation parameters")


register("dequantize", attrs={"dtype": Attr("str", "float32", ("float32", "float64"))},
         infer=_dequantize_infer, ref=_dequantize_noquant, props={QUANTIZABLE, UNARY, ELEMENTWISE, NONDIFF}, arity=1,
         doc="int8 or int16 -> float: scale * (q - zero_point) (TFLite DEQUANTIZE)")
get_op("dequantize").int8_ref = _dequantize_int8


# ---- fake_quant -------------------------------------------------------------------------------
def _fq_infer(ts, a):
    if not ts[0].is_float:
        raise ShapeError(f"fake_quant needs a float input, got {ts[0]}")
    s = a["scale"]
    if a["axis"] is None and len(s) != 1:
        raise ShapeError("fake_quant: per-tensor fake quantisation takes one scale (set axis for per-channel)")
    if a["axis"] is not None and len(s) != ts[0].shape[a["axis"]]:
        raise ShapeError(f"fake_quant: {len(s)} scales for axis {a['axis']} of {ts[0]}")
    return ts[0]


def _fq_bounds(a, ndim, dtype):
    shape = [1] * ndim
    if a["axis"] is not None:
        shape[a["axis"]] = -1
    s = np.asarray([f32(v) for v in a["scale"]], np.float32).reshape(shape)
    z = np.asarray(a["zero_point"], np.float32).reshape(shape) if len(a["zero_point"]) > 1 or a["axis"] is None \
        else np.full(len(a["scale"]), a["zero_point"][0], np.float32).reshape(shape)
    lo = ((a["qmin"] - z) * s).astype(dtype)
    hi = ((a["qmax"] - z) * s).astype(dtype)
    return s, z, lo, hi


def fake_quant_array(x, a):
    s, z, _, _ = _fq_bounds(a, x.ndim, x.dtype)
    q = np.clip(fp.round_half_away((x.astype(np.float32) / s).astype(np.float32)) + z, a["qmin"], a["qmax"])
    # dequantise as TFLite's DEQUANTIZE does: double(scale) * (q - zp), then to the float type
    return ((q - z).astype(np.float64) * s.astype(np.float64)).astype(x.dtype)


def _fq_vjp(n, xs, y, gy):
    # straight-through estimator: pass the gradient where x is inside [lo, hi]
    x = xs[0]
    _, _, lo, hi = _fq_bounds(n.attrs, len(x.shape), np.dtype(x.dtype))
    inside = F.logical_and(F.greater_equal(x, lo), F.less_equal(x, hi))
    return [F.where(inside, gy, 0.0)]


register("fake_quant", attrs={"scale": Attr("any", (1.0,)), "zero_point": Attr("ints", (0,)),
                              "axis": Attr("any", None), "qmin": Attr("int", -128), "qmax": Attr("int", 127)},
         infer=_fq_infer, ref=lambda xs, a: fake_quant_array(xs[0], a), vjp=_fq_vjp, props={ELEMENTWISE, UNARY},
         arity=1, doc="quantise-dequantise round trip (QAT); straight-through gradient")


# ---- TFLite import ----------------------------------------------------------
# QUANTIZE, DEQUANTIZE (of a constant: folded into a float32 constant)
def _quantize_operand(imp, k, i):
    """QUANTIZE's input: an operand, or a quantised int32 tensor (TFLite Micro requantises int32 to
    int8 or int16)."""
    t = imp.tensors[i]
    if t["dtype"] != "int32":
        return imp.operand(i, k, "QUANTIZE")
    if t["quant"] is None:
        raise imp.err(f"{tfl.where(k, 'QUANTIZE')}: int32 input {imp.label(i)} has no quantisation parameters; "
                      f"TFLite's QUANTIZE requantises quantised int32 tensors only")
    return imp.value(i, k, "QUANTIZE")


@tfl.importer("QUANTIZE")
def _tfl_quantize(imp, k, op, ins, out):
    name = "QUANTIZE"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 1)
    tfl.options(imp, k, op, name, "QuantizeOptions")
    x = _quantize_operand(imp, k, ins[0])
    ot = imp.tensors[out]
    if ot["dtype"] not in ("int8", "int16", "int32"):
        raise imp.err(f"{w}: output {imp.label(out)} is {ot['dtype']}; Kiln's QUANTIZE produces int8, int16 or int32")
    chk.per_tensor(imp.err, w, ot["quant"], f"output {imp.label(out)}")
    q = ot["quant"]
    if ot["dtype"] == "int32" and imp.g.types[x].dtype not in ("int8", "int16"):
        raise imp.err(f"{w}: an int32 output needs an int8 or int16 input (TFLite Micro's requantisations), got "
                      f"{imp.g.types[x].dtype}")
    if imp.g.types[x].dtype in ("int8", "int16", "int32"):
        chk.ratio_quant(imp.err, w, imp.g.types[x].quant, q)
    attrs = {"scale": list(q.scale), "zero_point": list(q.zero_point), "dtype": ot["dtype"]}
    imp.values[out] = imp.emit(k, name, "quantize", [x], attrs, out)


@tfl.importer("DEQUANTIZE")
def _tfl_dequantize(imp, k, op, ins, out):
    """A DEQUANTIZE of a constant (fp16 or int8 weights) folds into a float32 constant; of an int8
    activation it is a dequantize node."""
    name = "DEQUANTIZE"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 1)
    tfl.options(imp, k, op, name, "DequantizeOptions")
    ot = imp.tensors[out]
    it = imp.tensors[ins[0]]
    if ot["dtype"] != "float32" or tuple(ot["shape"]) != tuple(it["shape"]):
        raise imp.err(f"{w}: output {imp.label(out)} is {ot['dtype']}{list(ot['shape'])}; TFLite's DEQUANTIZE "
                      f"writes float32{list(it['shape'])}")
    if ins[0] in imp.folded or it["data"] is not None:
        imp.folded[out] = tfl.dequantized(imp, ins[0], k, name, "the input")
        return
    x = imp.operand(ins[0], k, name)
    if imp.g.types[x].dtype not in ("int8", "int16"):
        raise imp.err(f"{w}: input {imp.label(ins[0])} is {imp.g.types[x].dtype}; TFLite's DEQUANTIZE reads int8, int16 "
                      f"(or constant float16) tensors")
    chk.per_tensor(imp.err, w, imp.g.types[x].quant, "the input")
    imp.values[out] = imp.emit(k, name, "dequantize", [x], {"dtype": "float32"}, out)


# ---- TFLite export ------------------------------------------------------------------------------
@tfl.exporter("quantize", "dequantize", versions={"QUANTIZE": 2, "DEQUANTIZE": 2})
def _tfl_export_quant(e, n, act, out, int8):
    name = "QUANTIZE" if n.op == "quantize" else "DEQUANTIZE"
    e.op(name, [e.value(i) for i in n.inputs], [e.tensor(out, e.g.types[out])], name.title() + "Options", True)


mark(INT16, "quantize", "dequantize")   # int8/int16 <-> float, int8 <-> int16
