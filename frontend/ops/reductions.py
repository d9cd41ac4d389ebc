"""int8 rules and TFLite import/export of the reductions SUM, REDUCE_MAX and REDUCE_MIN (``sum``
and ``max`` are defined in frontend/ops/reduce_shape.py; ``min`` here).

int8 follows TFLite's reduce kernels (reference_ops::QuantizedMeanOrSum with compute_sum, and
the generic max/min reducer):

- ``sum``: the raw int32 sum less ``zero_point * count``, requantised with the multiplier of
  ``in_scale / out_scale`` (no 1/count folded in, unlike ``mean``), plus the output zero point,
  clamped. This is TensorFlow Lite Micro's kernel (and Kiln's oracle for int8 SUM, kiln/tflm.py):
  older TFLite Micro releases computed a float32 ``round(sum * scale + bias)`` and wrapped it,
  LiteRT's BUILTIN_REF kernel gives other values for negative sums, and LiteRT's optimised
  kernel differs from both where the float and fixed-point roundings disagree;
- ``max``, ``min``: on the raw int8 values; input and output share scale and zero point.
"""
from __future__ import annotations

import numpy as np

from .. import fixedpoint as fp
from .. import tflite_checks as chk
from ..registry import QUANTIZABLE, REDUCTION, SAME_AS_INPUT, defrule, get_op, register
from . import reduce_shape as rs
from . import tflite_util as tfl
from ._util import norm_axes, reduced_shape
from .int8util import clamp8, int8_io, need_int8, same_quant
from .int16util import clamp16, int16_branch, int16_io

chk.VERSIONS.update({"SUM": 2, "REDUCE_MAX": 3, "REDUCE_MIN": 3})


def _min_ref(xs, a):
    return np.min(xs[0], axis=rs._axes(a, xs[0]), keepdims=a["keepdims"])


def _min_infer(ts, a):
    return rs._red_infer("min")(ts, a)


register("min", attrs=rs._RED, infer=_min_infer, ref=_min_ref, vjp=rs._max_vjp,
         props={REDUCTION, QUANTIZABLE}, arity=1, doc="min over axes; ties share the gradient equally (torch.amin)",
         quant=SAME_AS_INPUT)


def reduce_te(T, x, a, reducer, name):
    """The TE compute of a reduction over ``a["axes"]`` (``keepdims`` as the attribute says) with
    ``reducer(value, axis=...)`` (``te.min``, or a ``te.comm_reducer``)."""
    shape = T.shape(x)
    axes = norm_axes(a["axes"], len(shape), name)
    rax = {ax: T.te.reduce_axis((0, shape[ax]), f"r{ax}") for ax in axes}

    def f(*i):
        it = iter(i)
        idx = []
        for d in range(len(shape)):
            if d in rax:
                idx.append(rax[d])
                if a["keepdims"]:
                    next(it)
            else:
                idx.append(next(it))
        return reducer(x(*idx), axis=[rax[d] for d in axes]) if axes else x(*idx)
    return T.te.compute(reduced_shape(shape, axes, a["keepdims"]), f, name=name)


@defrule("min", "te")
def _min_te(T, xs, a, out):
    return reduce_te(T, xs[0], a, T.te.min, "min")


def requantised_sum(xs, attrs, si, zi, so, zo, clamp):
    """reference_ops::QuantizedMeanOrSum with compute_sum, TensorFlow Lite Micro's int8 and int16
    SUM: the int32 sum less ``z_in * count`` (wrapping in int32), the
    ``MultiplyByQuantizedMultiplier`` of double ``s_in / s_out``, plus ``z_out``, then ``clamp``."""
    x = xs[0].astype(np.int64)
    axes = norm_axes(attrs["axes"], x.ndim, "sum")
    count = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    total = fp.wrap_int32(x.sum(axis=axes, keepdims=attrs["keepdims"]) - zi * count)
    m, e = fp.quantize_multiplier(si / so)
    return clamp(fp.multiply_by_quantized_multiplier(total, m, e) + zo)


@defrule("sum", "int8_ref")
def sum_int8(xs, attrs, in_types, out_type):
    (si, zi), (so, zo) = int8_io(in_types, out_type, "sum")
    return requantised_sum(xs, attrs, si, zi, so, zo, clamp8)


def _keep_quant(op):
    def rule(xs, attrs, in_types, out_type):
        need_int8(in_types[0], "input", op)
        same_quant(in_types[0], out_type, op)
        return get_op(op).ref(xs, attrs)
    rule.__name__ = f"{op}_int8"
    return defrule(op, "int8_ref")(rule)


_keep_quant("max")
_keep_quant("min")


# ---- TFLite import / export -------------------------------------------------------------------
_BUILTINS = {"SUM": "sum", "REDUCE_MAX": "max", "REDUCE_MIN": "min"}


def _importer(name):
    kop = _BUILTINS[name]

    def conv(imp, k, op, ins, out):
        w = tfl.where(k, name)
        tfl.need(imp, k, name, ins, 2)
        x = imp.operand(ins[0], k, name)
        if imp.tensors[ins[1]]["dtype"] != "int32":
            raise imp.err(f"{w}: axes {imp.label(ins[1])} are {imp.tensors[ins[1]]['dtype']}; TFLite needs int32")
        ax = np.atleast_1d(np.asarray(imp.const(ins[1], k, name, "axes"), np.int64)).ravel()
        nd = len(imp.g.types[x].shape)
        if np.any(ax < -nd) or np.any(ax >= nd):
            raise imp.err(f"{w}: axes {ax.tolist()} are out of range: allowed {-nd}..{nd - 1}")
        o = tfl.options(imp, k, op, name, "ReducerOptions")
        keep = bool(o.KeepDims()) if o else False
        xt = imp.g.types[x]
        if xt.dtype == "int8":
            if kop == "sum":
                chk.ratio_quant(imp.err, w, xt.quant, imp.tensors[out]["quant"])
            else:
                chk.same_quant(imp.err, w, xt.quant, imp.tensors[out]["quant"], "the input's")
        axes = sorted({int(a) % nd for a in ax})
        imp.values[out] = imp.emit(k, name, kop, [x], {"axes": axes, "keepdims": keep}, out)
    return conv


for _name in _BUILTINS:
    tfl.importer(_name)(_importer(_name))


@tfl.exporter("sum", "max", "min", versions={"SUM": 2, "REDUCE_MAX": 2, "REDUCE_MIN": 2})
def _tfl_export_reduce(e, n, act, out, int8):
    it = e.g.types[n.inputs[0]]
    axes = n.attrs["axes"] if n.attrs["axes"] is not None else list(range(len(it.shape)))
    axes = [a % max(len(it.shape), 1) for a in axes]
    builtin = {v: k for k, v in _BUILTINS.items()}[n.op]
    e.op(builtin, [e.value(n.inputs[0]), e.const(out + "/axes", np.asarray(axes, np.int32))],
         [e.tensor(out, e.g.types[out])], "ReducerOptions", int8, KeepDims=bool(n.attrs["keepdims"]))


# ---- int16 ----------------------------------------------------------------------------------------
def sum_int16(xs, attrs, in_types, out_type):
    (si, zi), (so, zo) = int16_io(in_types, out_type, "sum", symmetric=False)
    return requantised_sum(xs, attrs, si, zi, so, zo, clamp16)


int16_branch("sum", sum_int16)
