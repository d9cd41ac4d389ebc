"""TFLite import and export of the data-movement builtins that map onto Kiln's ``transpose``,
``slice``, ``reshape`` and ``concat`` (frontend/ops/reduce_shape.py): TRANSPOSE, STRIDED_SLICE
(begin/end/ellipsis/new-axis/shrink masks, negative strides), SLICE, SQUEEZE, EXPAND_DIMS, SPLIT,
SPLIT_V, PACK and UNPACK. int8 data movement copies the raw values, so every int8 input must
share the output's scale and zero point (Kiln refuses a file where they differ).
"""
from __future__ import annotations

import numpy as np

from .. import tflite_checks as chk
from . import reduce_shape  # noqa: F401  (registers transpose, slice, reshape, concat first)
from . import tflite_util as tfl
from .split_export import export_as_split

MAX_RANK = 5   # TFLite's STRIDED_SLICE, SLICE, TRANSPOSE (reference kernels) handle up to rank 5
# op versions LiteRT's reference resolver registers (register_ref.cc) for the builtins below
chk.VERSIONS.update({"TRANSPOSE": 8, "STRIDED_SLICE": 4, "SLICE": 8, "SQUEEZE": 1, "EXPAND_DIMS": 1, "SPLIT": 5,
                     "SPLIT_V": 3, "PACK": 5, "UNPACK": 6})


def _same_quant(imp, k, name, x, out, what="the input's"):
    xt = imp.g.types[x]
    if xt.dtype == "int8":
        chk.same_quant(imp.err, tfl.where(k, name), xt.quant, imp.tensors[out]["quant"], what)


def _int_const(imp, i, k, name, what, ndim=None):
    t = imp.tensors[i]
    if t["dtype"] not in ("int32", "int64"):
        raise imp.err(f"{tfl.where(k, name)}: {what} {imp.label(i)} is {t['dtype']}; TFLite needs int32")
    v = np.asarray(imp.const(i, k, name, what), np.int64)
    if ndim is not None and v.ndim != ndim:
        raise imp.err(f"{tfl.where(k, name)}: {what} {imp.label(i)} has shape {list(v.shape)}; TFLite needs a "
                      f"{'scalar' if ndim == 0 else f'{ndim}-D tensor'}")
    return [int(a) for a in v.ravel()]


def _axis(imp, k, name, axis, rank):
    if not -rank <= axis < rank:
        raise imp.err(f"{tfl.where(k, name)}: axis = {axis} is out of range: allowed {-rank}..{rank - 1}")
    return axis % rank


def _rank_ok(imp, k, name, x):
    nd = len(imp.g.types[x].shape)
    if nd > MAX_RANK:
        raise imp.err(f"{tfl.where(k, name)}: input rank {nd} is out of range: TFLite's kernel allows up to "
                      f"rank {MAX_RANK}")
    return nd


def _emit_slice(imp, k, name, x, begin, end, strides, out, shape=None):
    """slice node (then a reshape to ``shape`` when that differs) for TFLite tensor ``out``."""
    attrs = {"begin": begin, "end": end, "strides": None if all(s == 1 for s in strides) else strides}
    if shape is None or list(shape) == [len(range(b, e, s)) for b, e, s in zip(begin, end, strides)]:
        return imp.emit(k, name, "slice", [x], attrs, out)
    xt = imp.g.types[x]
    sl = [len(range(b, e, s)) for b, e, s in zip(begin, end, strides)]
    pre = imp.emit(k, name, "slice", [x], attrs, out, name=imp._vname(imp.tensors[out]["name"] + "_slice"),
                   out_type=type(xt)(tuple(sl), xt.dtype, xt.quant))
    return imp.emit(k, name, "reshape", [pre], {"shape": list(shape)}, out)


# ---- TRANSPOSE ----------------------------------------------------------------------------------
@tfl.importer("TRANSPOSE")
def _tfl_transpose(imp, k, op, ins, out):
    name = "TRANSPOSE"
    tfl.need(imp, k, name, ins, 2)
    tfl.options(imp, k, op, name, "TransposeOptions")
    x = imp.operand(ins[0], k, name)
    nd = len(imp.g.types[x].shape)
    if nd > 6:
        raise imp.err(f"{tfl.where(k, name)}: input rank {nd} is out of range: TFLite transposes up to rank 6")
    perm = _int_const(imp, ins[1], k, name, "the permutation", 1)
    perm = [p + nd if p < 0 else p for p in perm]
    if sorted(perm) != list(range(nd)):
        raise imp.err(f"{tfl.where(k, name)}: perm {perm} is not a permutation of the input's {nd} axes")
    _same_quant(imp, k, name, x, out)
    imp.values[out] = imp.emit(k, name, "transpose", [x], {"perm": perm}, out)


@tfl.exporter("transpose", versions={"TRANSPOSE": 2})
def _tfl_export_transpose(e, n, act, out, int8):
    it = e.g.types[n.inputs[0]]
    perm = n.attrs["perm"] if n.attrs["perm"] is not None else list(reversed(range(len(it.shape))))
    e.op("TRANSPOSE", [e.value(n.inputs[0]), e.const(out + "/perm", np.asarray(perm, np.int32))],
         [e.tensor(out, e.g.types[out])], "TransposeOptions", int8)


# ---- STRIDED_SLICE / SLICE ----------------------------------------------------------------------
def _dense_spec(shape, n, ellipsis_mask, new_axis_mask):
    """TensorFlow's BuildDenseSpec: for every entry of the output index the sparse position it
    reads (``("dim", sparse_i, input_axis)``, ``("ellipsis", None, input_axis)``) or
    ``("new", sparse_i, None)``; no ellipsis bit means one implied after the last entry."""
    nd = len(shape)
    if not ellipsis_mask:
        ellipsis_mask = 1 << n
        n += 1
    consumed = sum(1 for i in range(n) if not (ellipsis_mask >> i & 1) and not (new_axis_mask >> i & 1))
    entries, axis = [], 0
    seen_ellipsis = False
    for i in range(n):
        if ellipsis_mask >> i & 1 and not seen_ellipsis:
            seen_ellipsis = True
            if nd - consumed < 1 and i < n - 1:
                return None, "the ellipsis covers no axis (LiteRT's kernel and TensorFlow disagree there)"
            for _ in range(nd - consumed):
                entries.append(("ellipsis", None, axis))
                axis += 1
        elif ellipsis_mask >> i & 1:
            return None, "more than one ellipsis_mask bit is set"
        elif new_axis_mask >> i & 1:
            entries.append(("new", i, None))
        else:
            entries.append(("dim", i, axis))
            axis += 1
    if axis != nd:
        return None, f"the spec indexes {axis} axes of a rank-{nd} input"
    return entries, None


def _axis_range(size, b, e, s, bmask, emask, shrink):
    """(begin, end, stride) of one axis in Kiln's ``slice`` form (range(begin, end, stride)),
    TFLite's StartForAxis / StopForAxis: negative indices count from the end, then clamp."""
    if shrink:     # TFLite applies begin_mask before shrinking (TensorFlow ignores it there)
        b = 0 if bmask else (b + size if b < 0 else b)
        return (b, b + 1, 1) if 0 <= b < size else None
    lo, hi = (0, size) if s > 0 else (-1, size - 1)
    if bmask:
        b = lo if s > 0 else hi
    else:
        b = min(max(b + size if b < 0 else b, lo), hi)
    if emask:
        e = hi if s > 0 else lo
    else:
        e = min(max(e + size if e < 0 else e, lo), hi)
    if (s > 0 and e < b) or (s < 0 and e > b):
        e = b                      # an empty range
    if s < 0 and b == -1:
        b = e = -1
    return b, e, s


def strided_slice_plan(shape, begin, end, strides, bm, em, elm, nam, sam):
    """(begin, end, strides over the input's axes, final output shape) or (None, why)."""
    n = len(begin)
    if not (len(end) == len(strides) == n):
        return None, f"begin, end and strides have {n}, {len(end)} and {len(strides)} entries"
    if any(s == 0 for s in strides):
        return None, f"strides {list(strides)} contain 0"
    entries, why = _dense_spec(shape, n, elm, nam)
    if entries is None:
        return None, why
    B, E, S, out = [], [], [], []
    for kind, i, ax in entries:
        if kind == "new":
            out.append(1)
            continue
        if kind == "ellipsis":
            r = (0, shape[ax], 1)
            shrink = False
        else:
            shrink = bool(sam >> i & 1)
            if shrink and strides[i] < 0:
                return None, f"entry {i} shrinks an axis with a negative stride ({strides[i]})"
            r = _axis_range(shape[ax], begin[i], end[i], strides[i], bm >> i & 1, em >> i & 1, shrink)
            if r is None:
                return None, f"shrink index {begin[i]} is out of range for axis {ax} of size {shape[ax]}"
        B.append(r[0]), E.append(r[1]), S.append(r[2])
        if not shrink:
            out.append(len(range(*r)))
    return (B, E, S, out), None


@tfl.importer("STRIDED_SLICE")
def _tfl_strided_slice(imp, k, op, ins, out):
    name = "STRIDED_SLICE"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 4)
    o = tfl.options(imp, k, op, name, "StridedSliceOptions")
    x = imp.operand(ins[0], k, name)
    shape = imp.g.types[x].shape
    _rank_ok(imp, k, name, x)
    b, e, s = (_int_const(imp, i, k, name, what, 1) for i, what in zip(ins[1:], ("begin", "end", "strides")))
    masks = [int(getattr(o, f)()) if o else 0 for f in ("BeginMask", "EndMask", "EllipsisMask", "NewAxisMask",
                                                         "ShrinkAxisMask")]
    if o is not None and o.Offset():
        raise imp.err(f"{w}: offset = true is not supported (Kiln imports begin/end as absolute indices)")
    plan, why = strided_slice_plan(shape, b, e, s, *masks)
    if plan is None:
        raise imp.err(f"{w}: {why} (input shape {list(shape)}, begin {b}, end {e}, strides {s})")
    _same_quant(imp, k, name, x, out)
    B, E, S, oshape = plan
    imp.values[out] = _emit_slice(imp, k, name, x, B, E, S, out, oshape)


@tfl.importer("SLICE")
def _tfl_slice(imp, k, op, ins, out):
    name = "SLICE"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 3)
    tfl.options(imp, k, op, name, "SliceOptions")
    x = imp.operand(ins[0], k, name)
    shape = imp.g.types[x].shape
    _rank_ok(imp, k, name, x)
    b = _int_const(imp, ins[1], k, name, "begin", 1)
    size = _int_const(imp, ins[2], k, name, "size", 1)
    if len(b) != len(shape) or len(size) != len(shape):
        raise imp.err(f"{w}: begin {b} and size {size} need one entry per input axis ({len(shape)})")
    end = []
    for ax, (bb, sz, n) in enumerate(zip(b, size, shape)):
        ee = n if sz == -1 else bb + sz
        if not (0 <= bb <= ee <= n) or sz < -1:
            raise imp.err(f"{w}: begin {bb} size {sz} is out of range for axis {ax} of size {n}")
        end.append(ee)
    _same_quant(imp, k, name, x, out)
    imp.values[out] = _emit_slice(imp, k, name, x, b, end, [1] * len(b), out)


@tfl.exporter("slice", versions={"STRIDED_SLICE": 2, "SPLIT": 2})
def _tfl_export_slice(e, n, act, out, int8):
    if export_as_split(e, n, out):      # equal parts of one axis: one SPLIT (frontend/ops/split_export.py)
        return
    it = e.g.types[n.inputs[0]]
    nd = len(it.shape)
    st = list(n.attrs["strides"] or [1] * nd)
    begin, end = list(n.attrs["begin"]), list(n.attrs["end"])
    for d in range(nd):
        if not len(range(begin[d], end[d], st[d])):
            begin[d], end[d], st[d] = 0, 0, 1           # empty: TFLite would read begin -1 as the last index
    # a negative stride's end -1 ("down to index 0") would read as "the last index": use end_mask
    end_mask = sum(1 << d for d in range(nd) if st[d] < 0 and end[d] == -1)
    end = [0 if end_mask >> d & 1 else v for d, v in enumerate(end)]
    ins = [e.value(n.inputs[0])] + [e.const(f"{out}/{w}", np.asarray(v, np.int32))
                                    for w, v in (("begin", begin), ("end", end), ("strides", st))]
    e.op("STRIDED_SLICE", ins, [e.tensor(out, e.g.types[out])], "StridedSliceOptions", int8, BeginMask=0,
         EndMask=end_mask, EllipsisMask=0, NewAxisMask=0, ShrinkAxisMask=0)


# ---- SQUEEZE / EXPAND_DIMS ----------------------------------------------------------------------
def _emit_reshape(imp, k, name, x, out, shape):
    _same_quant(imp, k, name, x, out)
    imp.values[out] = imp.emit(k, name, "reshape", [x], {"shape": list(shape)}, out)


@tfl.importer("SQUEEZE")
def _tfl_squeeze(imp, k, op, ins, out):
    name = "SQUEEZE"
    tfl.need(imp, k, name, ins, 1)
    o = tfl.options(imp, k, op, name, "SqueezeOptions")
    x = imp.operand(ins[0], k, name)
    shape = imp.g.types[x].shape
    dims = [int(d) for d in o.SqueezeDimsAsNumpy()] if o is not None and o.SqueezeDimsLength() else []
    if dims:
        axes = {_axis(imp, k, name, d, len(shape)) for d in dims}
        bad = [a for a in axes if shape[a] != 1]
        if bad:
            raise imp.err(f"{tfl.where(k, name)}: squeeze_dims {dims} name axis {bad[0]} of size {shape[bad[0]]}; "
                          f"only size-1 axes can be squeezed")
    else:
        axes = {a for a, n in enumerate(shape) if n == 1}
    _emit_reshape(imp, k, name, x, out, [n for a, n in enumerate(shape) if a not in axes])


@tfl.importer("EXPAND_DIMS")
def _tfl_expand_dims(imp, k, op, ins, out):
    name = "EXPAND_DIMS"
    tfl.need(imp, k, name, ins, 2)
    tfl.options(imp, k, op, name, "ExpandDimsOptions")
    x = imp.operand(ins[0], k, name)
    shape = list(imp.g.types[x].shape)
    ax = _int_const(imp, ins[1], k, name, "axis")
    if len(ax) != 1:
        raise imp.err(f"{tfl.where(k, name)}: axis {imp.label(ins[1])} holds {len(ax)} values; TFLite needs one")
    a = _axis(imp, k, name, ax[0], len(shape) + 1)
    _emit_reshape(imp, k, name, x, out, shape[:a] + [1] + shape[a:])


# ---- SPLIT / SPLIT_V / UNPACK (several outputs) / PACK ------------------------------------------
def _split_outputs(imp, k, name, x, outs, axis, sizes, drop_axis=False):
    shape = list(imp.g.types[x].shape)
    off = 0
    for o, sz in zip(outs, sizes):
        b, e = [0] * len(shape), list(shape)
        b[axis], e[axis] = off, off + sz
        off += sz
        _same_quant(imp, k, name, x, o)
        oshape = [n for a, n in enumerate(shape) if a != axis] if drop_axis else None
        imp.values[o] = _emit_slice(imp, k, name, x, b, e, [1] * len(shape), o, oshape)


def _multi(fn):
    fn.multi_output = True
    return fn


@tfl.importer("SPLIT")
@_multi
def _tfl_split(imp, k, op, ins, outs):
    name = "SPLIT"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 2)
    o = tfl.options(imp, k, op, name, "SplitOptions")
    x = imp.operand(ins[1], k, name)
    shape = imp.g.types[x].shape
    ax = _int_const(imp, ins[0], k, name, "axis")
    if len(ax) != 1:
        raise imp.err(f"{w}: axis {imp.label(ins[0])} holds {len(ax)} values; TFLite needs one")
    axis = _axis(imp, k, name, ax[0], len(shape))
    num = int(o.NumSplits()) if o else 0
    if num != len(outs) or num < 1 or shape[axis] % num:
        raise imp.err(f"{w}: num_splits = {num} with {len(outs)} outputs cannot split axis {axis} of size "
                      f"{shape[axis]} evenly")
    _split_outputs(imp, k, name, x, outs, axis, [shape[axis] // num] * num)


@tfl.importer("SPLIT_V")
@_multi
def _tfl_split_v(imp, k, op, ins, outs):
    name = "SPLIT_V"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 3)
    o = tfl.options(imp, k, op, name, "SplitVOptions")
    x = imp.operand(ins[0], k, name)
    shape = imp.g.types[x].shape
    sizes = _int_const(imp, ins[1], k, name, "size_splits", 1)
    ax = _int_const(imp, ins[2], k, name, "axis")
    if len(ax) != 1:
        raise imp.err(f"{w}: axis {imp.label(ins[2])} holds {len(ax)} values; TFLite needs one")
    axis = _axis(imp, k, name, ax[0], len(shape))
    num = int(o.NumSplits()) if o else 0
    if num != len(outs) or len(sizes) != num:
        raise imp.err(f"{w}: num_splits = {num}, {len(sizes)} size_splits and {len(outs)} outputs must agree")
    if sizes.count(-1) > 1 or any(v < -1 for v in sizes):
        raise imp.err(f"{w}: size_splits {sizes} are out of range: sizes >= 0 and at most one -1")
    if -1 in sizes:
        sizes[sizes.index(-1)] = shape[axis] - (sum(sizes) + 1)
    if sum(sizes) != shape[axis] or any(v < 0 for v in sizes):
        raise imp.err(f"{w}: size_splits {sizes} do not add up to axis {axis}'s size {shape[axis]}")
    _split_outputs(imp, k, name, x, outs, axis, sizes)


@tfl.importer("UNPACK")
@_multi
def _tfl_unpack(imp, k, op, ins, outs):
    name = "UNPACK"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 1)
    o = tfl.options(imp, k, op, name, "UnpackOptions")
    x = imp.operand(ins[0], k, name)
    shape = imp.g.types[x].shape
    axis = _axis(imp, k, name, int(o.Axis()) if o else 0, len(shape))
    num = int(o.Num()) if o else 0
    if num != len(outs) or shape[axis] != num:
        raise imp.err(f"{w}: num = {num} with {len(outs)} outputs; axis {axis} has size {shape[axis]}")
    _split_outputs(imp, k, name, x, outs, axis, [1] * num, drop_axis=True)


@tfl.importer("PACK")
def _tfl_pack(imp, k, op, ins, out):
    name = "PACK"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 1, 1 << 16)
    o = tfl.options(imp, k, op, name, "PackOptions")
    xs = [imp.operand(i, k, name) for i in ins]
    shape = list(imp.g.types[xs[0]].shape)
    if o is None or int(o.ValuesCount()) != len(xs):
        raise imp.err(f"{w}: values_count = {int(o.ValuesCount()) if o else 0} but the operator has {len(xs)} inputs")
    for v in xs:
        if list(imp.g.types[v].shape) != shape or imp.g.types[v].dtype != imp.g.types[xs[0]].dtype:
            raise imp.err(f"{w}: inputs {imp.g.types[xs[0]]} and {imp.g.types[v]} differ; PACK stacks equal tensors")
        _same_quant(imp, k, name, v, out, f"input {v!r}")
    axis = _axis(imp, k, name, int(o.Axis()), len(shape) + 1)
    one = shape[:axis] + [1] + shape[axis:]
    xt = imp.g.types[xs[0]]
    parts = [imp.emit(k, name, "reshape", [v], {"shape": one}, out, name=imp._vname(f"{imp.tensors[out]['name']}_{j}"),
                      out_type=type(xt)(tuple(one), xt.dtype, xt.quant)) for j, v in enumerate(xs)]
    imp.values[out] = imp.emit(k, name, "concat", parts, {"axis": axis}, out)
