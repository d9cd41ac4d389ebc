"""``gather``: ``np.take(x, indices, axis)``, TFLite's GATHER (batch_dims 0) and
EMBEDDING_LOOKUP (axis 0). The indices are an int32 tensor (a constant or a computed value);
an index outside ``0..size-1`` is an error in the reference (as TFLite's kernel returns an
error), and the generated code clamps it into range so that it never reads outside the
tensor. int8 copies the raw values and keeps the input's quantisation.
"""
from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import tflite_checks as chk
from ..errors import ShapeError
from ..registry import QUANTIZABLE, SAME_AS_INPUT, SHAPE, Attr, defrule, register
from . import tflite_util as tfl
from ._util import tt
from .int8util import need_int8, same_quant

chk.VERSIONS.update({"GATHER": 8, "EMBEDDING_LOOKUP": 5})


def _axis(a, nd, name="gather"):
    ax = a["axis"]
    if not -nd <= ax < nd:
        raise ShapeError(f"{name}: axis {ax} out of range for rank {nd}")
    return ax % nd


def _infer(ts, a):
    x, idx = ts
    if idx.dtype not in ("int32", "int64"):
        raise ShapeError(f"gather: indices must be int32, got {idx}")
    ax = _axis(a, x.ndim)
    return tt(x.shape[:ax] + idx.shape + x.shape[ax + 1:], x.dtype, x.quant)


def _ref(xs, a):
    x, idx = xs
    ax = _axis(a, x.ndim)
    idx = np.asarray(idx, np.int64)
    bad = (idx < 0) | (idx >= x.shape[ax])
    if bad.any():
        raise ShapeError(f"gather: index {int(idx[bad][0])} out of range for axis {ax} of size {x.shape[ax]}")
    return np.take(x, idx, axis=ax)


def _vjp(n, xs, y, gy):
    return [F.emit("gather_grad", [gy, xs[1]], shape=list(xs[0].shape), axis=n.attrs["axis"]), None]


register("gather", attrs={"axis": Attr("int", 0)}, infer=_infer, ref=_ref, vjp=_vjp,
         props={SHAPE, QUANTIZABLE}, arity=2, doc="take slices of x along axis at int32 indices (np.take)",
         quant=SAME_AS_INPUT)


def _grad_ref(xs, a):
    g, idx = xs
    shape = tuple(a["shape"])
    ax = _axis(a, len(shape))
    out = np.zeros(shape, g.dtype)
    idx = np.asarray(idx, np.int64)
    moved = np.moveaxis(out, ax, 0)
    gm = g.reshape(shape[:ax] + (idx.size,) + shape[ax + 1:])
    np.add.at(moved, idx.ravel(), np.moveaxis(gm, ax, 0))
    return out


register("gather_grad", attrs={"shape": Attr("ints", ()), "axis": Attr("int", 0)},
         infer=lambda ts, a: tt(a["shape"], ts[0].dtype), ref=_grad_ref, arity=2,
         vjp=lambda n, xs, y, gy: [F.gather(gy, xs[1], n.attrs["axis"]), None],
         doc="scatter-add a gather's output gradient back onto x's shape")


@defrule("gather", "te")
def _gather_te(T, xs, a, out):
    x, idx = xs
    xs_ = T.shape(x)
    ax = _axis(a, len(xs_))
    ni = len(T.shape(idx))

    def f(*i):
        j = T.cast(idx(*i[ax:ax + ni]), "int32")
        j = T.te.max(T.te.min(j, T.c(xs_[ax] - 1, "int32")), T.c(0, "int32"))
        return x(*i[:ax], j, *i[ax + ni:])
    return T.te.compute(out.shape, f, name="gather")


@defrule("gather_grad", "te")
def _gather_grad_te(T, xs, a, out):
    g, idx = xs
    shape = tuple(a["shape"])
    ax = _axis(a, len(shape))
    ishape = T.shape(idx)
    r = [T.te.reduce_axis((0, n), f"r{d}") for d, n in enumerate(ishape)]
    zero = T.c(0, g.dtype)

    def f(*i):
        hit = T.cast(idx(*r), "int32") == T.cast(i[ax], "int32")
        return T.te.sum(T.tirx.Select(hit, g(*i[:ax], *r, *i[ax + 1:]), zero), axis=r)
    if not ishape:
        return T.te.compute(out.shape, lambda *i: T.tirx.Select(T.cast(idx(), "int32") == T.cast(i[ax], "int32"),
                                                                g(*i[:ax], *i[ax + 1:]), zero), name="gather_grad")
    return T.te.compute(out.shape, f, name="gather_grad")


@defrule("gather", "int8_ref")
def gather_int8(xs, attrs, in_types, out_type):
    need_int8(in_types[0], "input", "gather")
    same_quant(in_types[0], out_type, "gather")
    return _ref(xs, attrs)


# ---- TFLite import / export -------------------------------------------------------------------
def _indices(imp, k, name, i):
    t = imp.tensors[i]
    if t["dtype"] not in ("int32", "int64"):
        raise imp.err(f"{tfl.where(k, name)}: indices {imp.label(i)} are {t['dtype']}; TFLite needs int32 or int64")
    if t["data"] is not None:
        data = np.asarray(t["data"], np.int64)
        if data.size and (data.min() < -(1 << 31) or data.max() >= 1 << 31):
            raise imp.err(f"{tfl.where(k, name)}: indices {imp.label(i)} do not fit int32")
    return imp.value(i, k, name)


def _emit(imp, k, name, x, i, axis, out):
    xt = imp.g.types[x]
    n = xt.shape[axis]
    data = imp.tensors[i]["data"]
    if data is not None:
        flat = np.asarray(data).ravel()
        bad = flat[(flat < 0) | (flat >= n)]
        if bad.size:
            raise imp.err(f"{tfl.where(k, name)}: index {int(bad[0])} in {imp.label(i)} is out of range: allowed "
                          f"0..{n - 1} (axis {axis})")
    if xt.dtype == "int8":
        chk.same_quant(imp.err, tfl.where(k, name), xt.quant, imp.tensors[out]["quant"], "the input's")
    imp.values[out] = imp.emit(k, name, "gather", [x, _indices(imp, k, name, i)], {"axis": axis}, out)


@tfl.importer("GATHER")
def _tfl_gather(imp, k, op, ins, out):
    name = "GATHER"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 2)
    o = tfl.options(imp, k, op, name, "GatherOptions")
    x = imp.operand(ins[0], k, name)
    nd = len(imp.g.types[x].shape)
    if o is not None and int(o.BatchDims()) != 0:
        raise imp.err(f"{w}: batch_dims = {int(o.BatchDims())} is out of range: Kiln imports batch_dims 0")
    axis = int(o.Axis()) if o else 0
    if not -nd <= axis < nd:
        raise imp.err(f"{w}: axis = {axis} is out of range: allowed {-nd}..{nd - 1}")
    _emit(imp, k, name, x, ins[1], axis % nd, out)


@tfl.importer("EMBEDDING_LOOKUP")
def _tfl_embedding_lookup(imp, k, op, ins, out):
    name = "EMBEDDING_LOOKUP"
    tfl.need(imp, k, name, ins, 2)
    tfl.options(imp, k, op, name, None)
    x = imp.operand(ins[1], k, name)
    if len(imp.tensors[ins[0]]["shape"]) != 1:
        raise imp.err(f"{tfl.where(k, name)}: ids {imp.label(ins[0])} must be 1-D")
    _emit(imp, k, name, x, ins[0], 0, out)


@tfl.exporter("gather", versions={"GATHER": 2})
def _tfl_export_gather(e, n, act, out, int8):
    e.op("GATHER", [e.value(v) for v in n.inputs], [e.tensor(out, e.g.types[out])], "GatherOptions", int8,
         Axis=n.attrs["axis"], BatchDims=0)
