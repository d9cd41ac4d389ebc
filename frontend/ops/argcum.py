"""``argmax`` / ``argmin`` (TFLite ARG_MAX / ARG_MIN: the first index of the extreme value along
one axis, int32 or int64; int8 inputs compare their raw values, which orders them as the real
values since the scale is positive) and ``cumsum`` (TFLite CUMSUM: float32 / int32, exclusive and
reverse). Also the float import of LOG_SOFTMAX (its int8 kernel is not implemented: Kiln refuses
it with a named reason).
"""
from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import tflite_checks as chk
from ..errors import ShapeError
from ..registry import NONDIFF, QUANTIZABLE, REDUCTION, Attr, defrule, register
from . import reduce_shape  # noqa: F401  (registers log_softmax, sum first)
from . import tflite_util as tfl
from ._util import tt

chk.VERSIONS.update({"ARG_MAX": 2, "ARG_MIN": 2, "CUMSUM": 1, "LOG_SOFTMAX": 2})
_ARG = {"axis": Attr("int", -1), "dtype": Attr("str", "int32", ("int32", "int64"))}


def _axis(a, nd, name):
    if not -nd <= a["axis"] < nd:
        raise ShapeError(f"{name}: axis {a['axis']} out of range for rank {nd}")
    return a["axis"] % nd


def _arg_infer(name):
    def infer(ts, a):
        ax = _axis(a, ts[0].ndim, name)
        if ts[0].shape[ax] == 0:
            raise ShapeError(f"{name}: axis {ax} is empty")
        return tt(ts[0].shape[:ax] + ts[0].shape[ax + 1:], a["dtype"])
    return infer


def _arg_ref(fn):
    def ref(xs, a):
        return fn(xs[0], axis=_axis(a, xs[0].ndim, "arg")).astype(a["dtype"])
    return ref


for _name, _fn in (("argmax", np.argmax), ("argmin", np.argmin)):
    register(_name, attrs=_ARG, infer=_arg_infer(_name), ref=_arg_ref(_fn), props={REDUCTION, NONDIFF, QUANTIZABLE},
             arity=1, doc=f"index of the first {'largest' if _name == 'argmax' else 'smallest'} value along axis "
                          f"(int32 or int64)")
    defrule(_name, "int8_ref")(lambda xs, attrs, in_types, out_type, _n=_name: _arg_ref(
        np.argmax if _n == "argmax" else np.argmin)(xs, attrs))


def _arg_te(kind):
    def rule(T, xs, a, out):
        x = xs[0]
        shape = T.shape(x)
        ax = a["axis"] % len(shape)
        n = shape[ax]

        def at(i, k):
            return list(i[:ax]) + [k] + list(i[ax:])
        r = T.te.reduce_axis((0, n), "r")
        red = T.te.max if kind == "argmax" else T.te.min
        m = T.te.compute(out.shape, lambda *i: red(x(*at(i, r)), axis=r), name=f"{kind}_value")
        r2 = T.te.reduce_axis((0, n), "r2")
        # the first index holding the extreme value
        return T.te.compute(out.shape, lambda *i: T.te.min(T.tirx.Select(
            x(*at(i, r2)) == m(*i), r2.var.astype(out.dtype), T.c(n, out.dtype)), axis=r2), name=kind)
    return rule


defrule("argmax", "te")(_arg_te("argmax"))
defrule("argmin", "te")(_arg_te("argmin"))


# ---- cumsum ---------------------------------------------------------------------------------------
_CUM = {"axis": Attr("int", 0), "exclusive": Attr("bool", False), "reverse": Attr("bool", False)}


def _cumsum_ref(xs, a):
    x = xs[0]
    ax = _axis(a, x.ndim, "cumsum")
    y = np.flip(x, ax) if a["reverse"] else x
    c = np.cumsum(y, axis=ax, dtype=x.dtype)
    if a["exclusive"]:
        c = np.concatenate([np.zeros_like(np.take(c, [0], axis=ax)), np.delete(c, -1, axis=ax)], axis=ax) \
            if x.shape[ax] else c
    return (np.flip(c, ax) if a["reverse"] else c).astype(x.dtype)


register("cumsum", attrs=_CUM, infer=lambda ts, a: (_axis(a, ts[0].ndim, "cumsum"), ts[0])[1], ref=_cumsum_ref,
         vjp=lambda n, xs, y, gy: [F.emit("cumsum", [gy], axis=n.attrs["axis"], exclusive=n.attrs["exclusive"],
                                          reverse=not n.attrs["reverse"])],
         arity=1, doc="cumulative sum along axis (exclusive: shifted by one; reverse: from the end)")


@defrule("cumsum", "te")
def _cumsum_te(T, xs, a, out):
    x = xs[0]
    shape = T.shape(x)
    ax = a["axis"] % len(shape)
    r = T.te.reduce_axis((0, shape[ax]), "r")
    acc = T.acc_dtype(x.dtype)

    def f(*i):
        j = i[ax]
        take = (r > j if a["exclusive"] else r >= j) if a["reverse"] else (r < j if a["exclusive"] else r <= j)
        idx = list(i[:ax]) + [r] + list(i[ax + 1:])
        return T.te.sum(T.tirx.Select(take, T.cast(x(*idx), acc), T.c(0, acc)), axis=r)
    y = T.te.compute(out.shape, f, name="cumsum")
    return T.to_out(y, out, "cumsum_cast")


# ---- TFLite import / export -----------------------------------------------------------------------
def _arg_importer(name, kop):
    def conv(imp, k, op, ins, out):
        w = tfl.where(k, name)
        tfl.need(imp, k, name, ins, 2)
        tfl.options(imp, k, op, name, "ArgMaxOptions" if kop == "argmax" else "ArgMinOptions")
        x = imp.operand(ins[0], k, name)
        nd = len(imp.g.types[x].shape)
        ax = np.asarray(imp.const(ins[1], k, name, "axis")).ravel()
        if ax.size != 1 or not -nd <= int(ax[0]) < nd:
            raise imp.err(f"{w}: axis {ax.tolist()} is out of range: one axis in {-nd}..{nd - 1}")
        dt = imp.tensors[out]["dtype"]
        if dt not in ("int32", "int64"):
            raise imp.err(f"{w}: output type {dt} is out of range: TFLite writes int32 or int64")
        imp.values[out] = imp.emit(k, name, kop, [x], {"axis": int(ax[0]) % nd, "dtype": dt}, out)
    return conv


tfl.importer("ARG_MAX")(_arg_importer("ARG_MAX", "argmax"))
tfl.importer("ARG_MIN")(_arg_importer("ARG_MIN", "argmin"))


@tfl.exporter("argmax", "argmin", versions={"ARG_MAX": 2, "ARG_MIN": 2})
def _tfl_export_arg(e, n, act, out, int8):
    builtin, opts = ("ARG_MAX", "ArgMaxOptions") if n.op == "argmax" else ("ARG_MIN", "ArgMinOptions")
    nd = len(e.g.types[n.inputs[0]].shape)
    code = 2 if n.attrs["dtype"] == "int32" else 4       # TensorType INT32 / INT64
    e.op(builtin, [e.value(n.inputs[0]), e.const(out + "/axis", np.asarray([n.attrs["axis"] % nd], np.int32))],
         [e.tensor(out, e.g.types[out])], opts, int8, OutputType=code)


@tfl.importer("CUMSUM")
def _tfl_cumsum(imp, k, op, ins, out):
    name = "CUMSUM"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 2)
    o = tfl.options(imp, k, op, name, "CumsumOptions")
    x = imp.value(ins[0], k, name)
    xt = imp.g.types[x]
    if xt.dtype not in ("float32", "int32") or xt.quant is not None:
        raise imp.err(f"{w}: input {xt} is out of range: TFLite's CUMSUM takes float32 or int32")
    nd = len(xt.shape)
    ax = np.asarray(imp.const(ins[1], k, name, "axis")).ravel()
    if ax.size != 1 or not -nd <= int(ax[0]) < nd:
        raise imp.err(f"{w}: axis {ax.tolist()} is out of range: one axis in {-nd}..{nd - 1}")
    attrs = {"axis": int(ax[0]) % nd, "exclusive": bool(o.Exclusive()) if o else False,
             "reverse": bool(o.Reverse()) if o else False}
    imp.values[out] = imp.emit(k, name, "cumsum", [x], attrs, out)


@tfl.exporter("cumsum")
def _tfl_export_cumsum(e, n, act, out, int8):
    e.op("CUMSUM", [e.value(n.inputs[0]), e.const(out + "/axis", np.asarray(n.attrs["axis"], np.int32))],
         [e.tensor(out, e.g.types[out])], "CumsumOptions", int8, Exclusive=bool(n.attrs["exclusive"]),
         Reverse=bool(n.attrs["reverse"]))


def _float_only(imp, k, name, x):
    if imp.g.types[x].dtype != "float32":
        raise imp.err(f"{tfl.where(k, name)}: input {imp.g.types[x]} is int8; Kiln imports the float32 {name} "
                      f"(its int8 kernel is not implemented)")


@tfl.importer("LOG_SOFTMAX")
def _tfl_log_softmax(imp, k, op, ins, out):
    name = "LOG_SOFTMAX"
    tfl.need(imp, k, name, ins, 1)
    tfl.options(imp, k, op, name, "LogSoftmaxOptions")
    x = imp.operand(ins[0], k, name)
    _float_only(imp, k, name, x)
    imp.values[out] = imp.emit(k, name, "log_softmax", [x], {"axis": -1}, out)


@tfl.exporter("log_softmax")
def _tfl_export_log_softmax(e, n, act, out, int8):
    ot = e.g.types[out]
    if int8 or n.attrs["axis"] % len(ot.shape) != len(ot.shape) - 1:
        raise tfl.ExportError(f"node {n.name!r}: LOG_SOFTMAX exports float32 on the last axis")
    e.op("LOG_SOFTMAX", [e.value(n.inputs[0])], [e.tensor(out, ot)], "LogSoftmaxOptions", False)
