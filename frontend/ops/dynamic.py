"""TFLite Micro builtins of the last block: DYNAMIC_UPDATE_SLICE, REDUCE_ALL and BROADCAST_ARGS.

- ``dynamic_update_slice(x, update, start)``: ``x`` with ``update`` written at ``start`` (an
  int32 tensor known only at run time), each start index clamped to ``[0, x.dim - update.dim]``
  as TFLite's ``CalculateClampedStartIndices`` does. Data movement: int8/int16 operands copy their
  raw values, so ``x``, ``update`` and the output share one quantisation.
- ``dynamic_slice(x, start; size)``: the block of ``size`` at the clamped ``start`` (no TFLite
  builtin: the gradient of ``dynamic_update_slice`` with respect to ``update``).
- ``reduce_all(x; axes, keepdims)``: logical AND of a bool tensor over axes (TFLite REDUCE_ALL).
- BROADCAST_ARGS (the broadcast shape of two shape vectors) is folded at import: its inputs are
  constants (or SHAPE results, which Kiln folds), as in every static-shape model.
"""
from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import tflite_checks as chk
from ..errors import ShapeError
from ..registry import NONDIFF, QUANTIZABLE, REDUCTION, SHAPE, Attr, defrule, get_op, register
from . import reduce_shape as rs
from . import tflite_util as tfl
from ._util import norm_axes, tt
from .int8util import same_quant
from .reductions import reduce_te

chk.VERSIONS.update({"DYNAMIC_UPDATE_SLICE": 1, "REDUCE_ALL": 1, "BROADCAST_ARGS": 1})


def clamped_start(start, xshape, ushape):
    """TFLite's CalculateClampedStartIndices."""
    s = np.asarray(start, np.int64).reshape(-1)
    return [int(min(max(0, int(v)), int(xd) - int(ud))) for v, xd, ud in zip(s, xshape, ushape)]


def _start_type(t, n, op):
    if t.dtype not in ("int32", "int64") or t.shape != (n,):
        raise ShapeError(f"{op}: start indices must be int32 or int64 of shape ({n},), got {t}")


# ---- dynamic_update_slice -------------------------------------------------------------------------
def _dus_infer(ts, a):
    x, u, s = ts
    if x.dtype != u.dtype or x.ndim != u.ndim or any(ud > xd for ud, xd in zip(u.shape, x.shape)):
        raise ShapeError(f"dynamic_update_slice: update {u} must have x's dtype and rank and fit in x {x}")
    _start_type(s, x.ndim, "dynamic_update_slice")
    if x.quant != u.quant:
        raise ShapeError(f"dynamic_update_slice copies raw values: x {x} and update {u} must share a quantisation")
    return tt(x.shape, x.dtype)


def _block(start, shape):
    return tuple(slice(b, b + n) for b, n in zip(start, shape))


def _dus_ref(xs, a):
    x, u, s = xs
    y = np.array(x, copy=True)
    y[_block(clamped_start(s, x.shape, u.shape), u.shape)] = u
    return y


def _dus_vjp(n, xs, y, gy):
    x, u, s = xs
    return [F.dynamic_update_slice(gy, np.zeros(tuple(u.shape), u.dtype), s), F.dynamic_slice(gy, s, list(u.shape)), None]


def _clamp_te(T, s, d, xd, ud):
    v = T.cast(s[d], "int32")
    return T.tirx.max(T.tirx.min(v, T.c(xd - ud, "int32")), T.c(0, "int32"))


def _dus_te(T, xs, a, out):
    x, u, s = xs
    xshape, ushape = T.shape(x), T.shape(u)

    def f(*i):
        st = [_clamp_te(T, s, d, xshape[d], ushape[d]) for d in range(len(i))]
        inside = T.tirx.all(*[T.tirx.all(i[d] >= st[d], i[d] < st[d] + ushape[d]) for d in range(len(i))])
        ui = [T.tirx.min(T.tirx.max(i[d] - st[d], T.c(0, "int32")), T.c(ushape[d] - 1, "int32")) for d in range(len(i))]
        return T.tirx.if_then_else(inside, u(*ui), x(*i))
    return T.te.compute(xshape, f, name="dynamic_update_slice")


register("dynamic_update_slice", infer=_dus_infer, ref=_dus_ref, vjp=_dus_vjp, props={SHAPE, QUANTIZABLE},
         arity=3, doc="x with update written at start (int32, run time), clamped into x (TFLite DYNAMIC_UPDATE_SLICE)")


# ---- dynamic_slice (the gradient of dynamic_update_slice's update) --------------------------------
def _ds_infer(ts, a):
    x, s = ts
    _start_type(s, x.ndim, "dynamic_slice")
    if len(a["size"]) != x.ndim or any(not 0 <= n <= d for n, d in zip(a["size"], x.shape)):
        raise ShapeError(f"dynamic_slice: size {a['size']} does not fit x {x}")
    return tt(tuple(a["size"]), x.dtype)


def _ds_ref(xs, a):
    x, s = xs
    return np.array(x[_block(clamped_start(s, x.shape, a["size"]), a["size"])])


def _ds_vjp(n, xs, y, gy):
    x, s = xs
    return [F.dynamic_update_slice(np.zeros(tuple(x.shape), x.dtype), gy, s), None]


def _ds_te(T, xs, a, out):
    x, s = xs
    xshape, size = T.shape(x), list(a["size"])

    def f(*i):
        return x(*[_clamp_te(T, s, d, xshape[d], size[d]) + i[d] for d in range(len(i))])
    return T.te.compute(tuple(size), f, name="dynamic_slice")


register("dynamic_slice", attrs={"size": Attr("ints", ())}, infer=_ds_infer, ref=_ds_ref, vjp=_ds_vjp,
         props={SHAPE, QUANTIZABLE}, arity=2, doc="the block of size at start (int32, run time), clamped into x")


# ---- reduce_all -----------------------------------------------------------------------------------
def _all_infer(ts, a):
    if ts[0].dtype != "bool":
        raise ShapeError(f"reduce_all takes a bool tensor, got {ts[0]}")
    return rs._red_infer("reduce_all")(ts, a)


def _all_ref(xs, a):
    return np.all(xs[0], axis=rs._axes(a, xs[0]), keepdims=a["keepdims"])


def _all_te(T, xs, a, out):
    land = T.te.comm_reducer(lambda p, q: T.tirx.all(p, q), lambda t: T.c(True, "bool"), name="land")
    return reduce_te(T, xs[0], a, land, "reduce_all")


register("reduce_all", attrs=rs._RED, infer=_all_infer, ref=_all_ref, props={REDUCTION, NONDIFF},
         arity=1, doc="logical AND over axes of a bool tensor (TFLite REDUCE_ALL); no gradient")


# ---- TFLite import / export -----------------------------------------------------------------------
@tfl.importer("DYNAMIC_UPDATE_SLICE")
def _tfl_dus(imp, k, op, ins, out):
    name = "DYNAMIC_UPDATE_SLICE"
    tfl.need(imp, k, name, ins, 3)
    x, u = (imp.value(i, k, name) for i in ins[:2])
    s = imp.value(ins[2], k, name)
    for v, what in ((x, "operand"), (u, "update")):
        if imp.g.types[v].quant is not None:
            chk.same_quant(imp.err, tfl.where(k, name), imp.g.types[v].quant, imp.tensors[out]["quant"], f"the {what}'s")
    imp.values[out] = imp.emit(k, name, "dynamic_update_slice", [x, u, s], {}, out)


@tfl.importer("REDUCE_ALL")
def _tfl_reduce_all(imp, k, op, ins, out):
    name = "REDUCE_ALL"
    tfl.need(imp, k, name, ins, 2)
    x = imp.value(ins[0], k, name)
    nd = len(imp.g.types[x].shape)
    ax = np.atleast_1d(np.asarray(imp.const(ins[1], k, name, "axes"), np.int64)).ravel()
    if np.any(ax < -nd) or np.any(ax >= nd):
        raise imp.err(f"{tfl.where(k, name)}: axes {ax.tolist()} are out of range: allowed {-nd}..{nd - 1}")
    o = tfl.options(imp, k, op, name, "ReducerOptions")
    attrs = {"axes": sorted({int(a) % nd for a in ax}), "keepdims": bool(o.KeepDims()) if o else False}
    imp.values[out] = imp.emit(k, name, "reduce_all", [x], attrs, out)


@tfl.importer("BROADCAST_ARGS")
def _tfl_broadcast_args(imp, k, op, ins, out):
    name = "BROADCAST_ARGS"
    tfl.need(imp, k, name, ins, 2)
    shapes = [tuple(int(v) for v in np.asarray(imp.const(i, k, name, f"shape {j}")).ravel()) for j, i in enumerate(ins)]
    try:
        b = np.broadcast_shapes(*shapes)
    except ValueError:
        raise imp.err(f"{tfl.where(k, name)}: shapes {list(shapes[0])} and {list(shapes[1])} do not broadcast") from None
    t = imp.tensors[out]
    if list(t["shape"]) != [len(b)]:
        raise imp.err(f"{tfl.where(k, name)}: output {imp.label(out)} has shape {list(t['shape'])}, the op gives [{len(b)}]")
    imp.folded[out] = np.asarray(b, t["dtype"])


@tfl.exporter("dynamic_update_slice", versions={"DYNAMIC_UPDATE_SLICE": 1})
def _tfl_export_dus(e, n, act, out, int8):
    e.op("DYNAMIC_UPDATE_SLICE", [e.value(i) for i in n.inputs], [e.tensor(out, e.g.types[out])], None, int8)


@tfl.exporter("reduce_all")
def _tfl_export_reduce_all(e, n, act, out, int8):
    it = e.g.types[n.inputs[0]]
    axes = list(norm_axes(n.attrs["axes"], len(it.shape), "reduce_all"))
    e.op("REDUCE_ALL", [e.value(n.inputs[0]), e.const(out + "/axes", np.asarray(axes, np.int32))],
         [e.tensor(out, e.g.types[out])], "ReducerOptions", False, KeepDims=bool(n.attrs["keepdims"]))


defrule("dynamic_update_slice", "te")(_dus_te)
defrule("dynamic_slice", "te")(_ds_te)
defrule("reduce_all", "te")(_all_te)


def _raw_copy(op, n_quantised):
    """int8 / int16: the raw values move (TFLite copies bytes), so the quantised operands and the
    output share one quantisation."""
    def rule(xs, attrs, in_types, out_type):
        for t in in_types[:n_quantised]:
            same_quant(t, out_type, op)
        return get_op(op).ref(xs, attrs)
    rule.__name__ = f"{op}_int8"
    return rule


defrule("dynamic_update_slice", "int8_ref")(_raw_copy("dynamic_update_slice", 2))
defrule("dynamic_slice", "int8_ref")(_raw_copy("dynamic_slice", 1))

