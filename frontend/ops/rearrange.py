"""TFLite builtins imported as compositions of Kiln's data-movement ops (so their int8 form,
gradients and C lowering are those of the parts): CAST, REVERSE_V2 (negative-stride ``slice``),
BROADCAST_TO, DEPTH_TO_SPACE / SPACE_TO_DEPTH and BATCH_TO_SPACE_ND / SPACE_TO_BATCH_ND
(``reshape`` + ``transpose`` + ``reshape``, with ``pad``/``slice`` for the block paddings and
crops), MIRROR_PAD (one ``gather`` per padded axis, constant indices), PADV2 (``pad`` with a
value), GATHER_ND with constant indices (``reshape`` + ``gather`` + ``reshape``), and the
constant-producing SHAPE, FILL and ZEROS_LIKE (folded into constants at import).
"""
from __future__ import annotations

import math

import numpy as np

from .. import fixedpoint as fp
from .. import tflite_checks as chk
from ..registry import QUANTIZABLE, SAME_AS_INPUT, defrule, get_op
from ..types import TensorType
from . import gather as _gather  # noqa: F401  (registers gather first)
from . import reduce_shape  # noqa: F401  (registers transpose, slice, reshape, pad, broadcast_to first)
from . import tflite_util as tfl
from .int8util import need_int8, same_quant
from .movement import _int_const, _rank_ok, _same_quant

chk.VERSIONS.update({"CAST": 9, "REVERSE_V2": 4, "BROADCAST_TO": 4, "DEPTH_TO_SPACE": 1, "SPACE_TO_DEPTH": 2,
                     "BATCH_TO_SPACE_ND": 4, "SPACE_TO_BATCH_ND": 4, "MIRROR_PAD": 3, "PADV2": 6, "GATHER_ND": 6,
                     "SHAPE": 1, "FILL": 5, "ZEROS_LIKE": 1})


def chain(imp, k, name, x, steps, out):
    """Emit ``steps`` [(op, attrs)] one after the other from ``x``; intermediates keep x's
    quantisation, the last node takes TFLite tensor ``out``. Returns the last value."""
    v = x
    xt = imp.g.types[x]
    for j, (op, attrs) in enumerate(steps):
        if j == len(steps) - 1:
            return imp.emit(k, name, op, [v], attrs, out)
        opdef = get_op(op)
        a = opdef.normalize_attrs(attrs)
        t = opdef.infer([imp.g.types[v]], a)
        v = imp.emit(k, name, op, [v], attrs, out, name=imp._vname(f"{imp.tensors[out]['name']}_{op}"),
                     out_type=TensorType(t.shape, xt.dtype, xt.quant))
    return v


def _err(imp, k, name, msg):
    return imp.err(f"{tfl.where(k, name)}: {msg}")


# ---- CAST ---------------------------------------------------------------------------------------
@tfl.importer("CAST")
def _tfl_cast(imp, k, op, ins, out):
    name = "CAST"
    tfl.need(imp, k, name, ins, 1)
    if op.BuiltinOptionsType():
        tfl.options(imp, k, op, name, "CastOptions")
    x = imp.value(ins[0], k, name)
    xt, ot = imp.g.types[x], imp.tensors[out]
    if xt.quant is not None or ot["quant"] is not None:
        raise _err(imp, k, name, f"casts quantised tensors ({xt} -> {ot['dtype']}); TFLite's CAST converts raw "
                                 f"values and ignores scales: Kiln imports casts between unquantised float32 and "
                                 f"integer tensors")
    if ot["dtype"] not in ("float32", "int32", "int16", "int8", "uint8", "bool"):
        raise _err(imp, k, name, f"output type {ot['dtype']} is out of range for Kiln's cast")
    imp.values[out] = imp.emit(k, name, "cast", [x], {"dtype": ot["dtype"]}, out)


# ---- REVERSE_V2, BROADCAST_TO ---------------------------------------------------------------------
@tfl.importer("REVERSE_V2")
def _tfl_reverse(imp, k, op, ins, out):
    name = "REVERSE_V2"
    tfl.need(imp, k, name, ins, 2)
    tfl.options(imp, k, op, name, "ReverseV2Options")
    x = imp.operand(ins[0], k, name)
    shape = imp.g.types[x].shape
    nd = _rank_ok(imp, k, name, x)
    axes = _int_const(imp, ins[1], k, name, "axis", 1)
    if any(not -nd <= a < nd for a in axes) or len({a % nd for a in axes}) != len(axes):
        raise _err(imp, k, name, f"axis {axes} is out of range: distinct axes in {-nd}..{nd - 1}")
    rev = {a % nd for a in axes}
    if not rev or max(rev) - min(rev) + 1 != len(rev):
        raise _err(imp, k, name, f"axis {axes} is out of range: TFLite reverses one or more contiguous axes")
    b = [n - 1 if a in rev else 0 for a, n in enumerate(shape)]
    e = [-1 if a in rev else n for a, n in enumerate(shape)]
    s = [-1 if a in rev else 1 for a in range(nd)]
    _same_quant(imp, k, name, x, out)
    imp.values[out] = imp.emit(k, name, "slice", [x], {"begin": b, "end": e, "strides": s}, out)


@defrule("broadcast_to", "int8_ref")
def broadcast_to_int8(xs, attrs, in_types, out_type):
    need_int8(in_types[0], "input", "broadcast_to")
    same_quant(in_types[0], out_type, "broadcast_to")
    return get_op("broadcast_to").ref(xs, attrs)


_bt = get_op("broadcast_to")
_bt.quant = SAME_AS_INPUT
_bt.props = _bt.props | {QUANTIZABLE}


@tfl.importer("BROADCAST_TO")
def _tfl_broadcast_to(imp, k, op, ins, out):
    name = "BROADCAST_TO"
    tfl.need(imp, k, name, ins, 2)
    tfl.options(imp, k, op, name, "BroadcastToOptions")
    x = imp.operand(ins[0], k, name)
    shape = _int_const(imp, ins[1], k, name, "shape", 1)
    if len(shape) > 8:
        raise _err(imp, k, name, f"shape {shape} has rank {len(shape)}; TFLite broadcasts up to rank 8")
    _same_quant(imp, k, name, x, out)
    imp.values[out] = imp.emit(k, name, "broadcast_to", [x], {"shape": shape}, out)


@tfl.exporter("broadcast_to", versions={"BROADCAST_TO": 2})
def _tfl_export_broadcast_to(e, n, act, out, int8):
    e.op("BROADCAST_TO", [e.value(n.inputs[0]), e.const(out + "/shape", np.asarray(n.attrs["shape"], np.int32))],
         [e.tensor(out, e.g.types[out])], "BroadcastToOptions", True)   # version 2 for every type (LiteRT)


# ---- DEPTH_TO_SPACE / SPACE_TO_DEPTH ------------------------------------------------------------
def _block(imp, k, name, o, x):
    bs = int(o.BlockSize()) if o else 0
    shape = imp.g.types[x].shape
    if len(shape) != 4:
        raise _err(imp, k, name, f"input {imp.g.types[x]} must be rank 4 (NHWC)")
    if bs < 1:
        raise _err(imp, k, name, f"block_size = {bs} is out of range: allowed >= 1")
    return bs, shape


@tfl.importer("DEPTH_TO_SPACE")
def _tfl_depth_to_space(imp, k, op, ins, out):
    name = "DEPTH_TO_SPACE"
    tfl.need(imp, k, name, ins, 1)
    x = imp.operand(ins[0], k, name)
    bs, (n, h, w, c) = _block(imp, k, name, tfl.options(imp, k, op, name, "DepthToSpaceOptions"), x)
    if c % (bs * bs):
        raise _err(imp, k, name, f"depth {c} is not a multiple of block_size^2 = {bs * bs}")
    cc = c // (bs * bs)
    _same_quant(imp, k, name, x, out)
    imp.values[out] = chain(imp, k, name, x, [("reshape", {"shape": [n, h, w, bs, bs, cc]}),
                                              ("transpose", {"perm": [0, 1, 3, 2, 4, 5]}),
                                              ("reshape", {"shape": [n, h * bs, w * bs, cc]})], out)


@tfl.importer("SPACE_TO_DEPTH")
def _tfl_space_to_depth(imp, k, op, ins, out):
    name = "SPACE_TO_DEPTH"
    tfl.need(imp, k, name, ins, 1)
    x = imp.operand(ins[0], k, name)
    bs, (n, h, w, c) = _block(imp, k, name, tfl.options(imp, k, op, name, "SpaceToDepthOptions"), x)
    if h % bs or w % bs:
        raise _err(imp, k, name, f"height {h} and width {w} must be multiples of block_size {bs}")
    _same_quant(imp, k, name, x, out)
    imp.values[out] = chain(imp, k, name, x, [("reshape", {"shape": [n, h // bs, bs, w // bs, bs, c]}),
                                              ("transpose", {"perm": [0, 1, 3, 2, 4, 5]}),
                                              ("reshape", {"shape": [n, h // bs, w // bs, bs * bs * c]})], out)


# ---- BATCH_TO_SPACE_ND / SPACE_TO_BATCH_ND --------------------------------------------------------
def _spatial(imp, k, name, x, ins):
    shape = list(imp.g.types[x].shape)
    if len(shape) not in (3, 4):
        raise _err(imp, k, name, f"input {imp.g.types[x]} must be rank 3 or 4")
    block = _int_const(imp, ins[1], k, name, "block_shape", 1)
    m = len(block)
    if m != len(shape) - 2 or any(b < 1 for b in block):
        raise _err(imp, k, name, f"block_shape {block} needs {len(shape) - 2} entries >= 1")
    pads = np.asarray(imp.const(ins[2], k, name, "paddings/crops"), np.int64)
    if pads.shape != (m, 2) or np.any(pads < 0):
        raise _err(imp, k, name, f"paddings/crops {pads.tolist()} must be non-negative with shape [{m}, 2]")
    return shape, block, [[int(v) for v in p] for p in pads]


@tfl.importer("SPACE_TO_BATCH_ND")
def _tfl_space_to_batch(imp, k, op, ins, out):
    name = "SPACE_TO_BATCH_ND"
    tfl.need(imp, k, name, ins, 3)
    tfl.options(imp, k, op, name, "SpaceToBatchNDOptions")
    x = imp.operand(ins[0], k, name)
    shape, block, pads = _spatial(imp, k, name, x, ins)
    m = len(block)
    padded = [shape[1 + i] + pads[i][0] + pads[i][1] for i in range(m)]
    if any(p % b for p, b in zip(padded, block)):
        raise _err(imp, k, name, f"padded spatial shape {padded} is not a multiple of block_shape {block}")
    n, rest = shape[0], shape[1 + m:]
    flat = [0, 0] + [v for p in pads for v in p] + [0, 0] * len(rest)
    split = [n] + [v for p, b in zip(padded, block) for v in (p // b, b)] + rest
    perm = [2 + 2 * i for i in range(m)] + [0] + [1 + 2 * i for i in range(m)] + \
        [1 + 2 * m + j for j in range(len(rest))]
    steps = [("pad", {"pads": flat, "value": 0.0})] if any(flat) else []
    steps += [("reshape", {"shape": split}), ("transpose", {"perm": perm}),
              ("reshape", {"shape": [n * math.prod(block)] + [p // b for p, b in zip(padded, block)] + rest})]
    _same_quant(imp, k, name, x, out)
    imp.values[out] = chain(imp, k, name, x, steps, out)


@tfl.importer("BATCH_TO_SPACE_ND")
def _tfl_batch_to_space(imp, k, op, ins, out):
    name = "BATCH_TO_SPACE_ND"
    tfl.need(imp, k, name, ins, 3)
    tfl.options(imp, k, op, name, "BatchToSpaceNDOptions")
    x = imp.operand(ins[0], k, name)
    shape, block, crops = _spatial(imp, k, name, x, ins)
    m, nb = len(block), math.prod(block)
    if shape[0] % nb:
        raise _err(imp, k, name, f"batch {shape[0]} is not a multiple of prod(block_shape) = {nb}")
    n, sp, rest = shape[0] // nb, shape[1:1 + m], shape[1 + m:]
    full = [s * b for s, b in zip(sp, block)]
    if any(c[0] + c[1] > f for c, f in zip(crops, full)):
        raise _err(imp, k, name, f"crops {crops} remove more than the spatial size {full}")
    perm = [m] + [v for i in range(m) for v in (m + 1 + i, i)] + [2 * m + 1 + j for j in range(len(rest))]
    steps = [("reshape", {"shape": list(block) + [n] + sp + rest}), ("transpose", {"perm": perm}),
             ("reshape", {"shape": [n] + full + rest})]
    if any(c for p in crops for c in p):
        steps.append(("slice", {"begin": [0] + [c[0] for c in crops] + [0] * len(rest),
                                "end": [n] + [f - c[1] for f, c in zip(full, crops)] + rest}))
    _same_quant(imp, k, name, x, out)
    imp.values[out] = chain(imp, k, name, x, steps, out)


# ---- MIRROR_PAD, PADV2 ----------------------------------------------------------------------------
def mirror_indices(n, lo, hi, mode):
    """Source index of every padded position (np.pad 'reflect' / 'symmetric')."""
    return np.pad(np.arange(n), (lo, hi), mode=mode).astype(np.int32)


@tfl.importer("MIRROR_PAD")
def _tfl_mirror_pad(imp, k, op, ins, out):
    name = "MIRROR_PAD"
    tfl.need(imp, k, name, ins, 2)
    o = tfl.options(imp, k, op, name, "MirrorPadOptions")
    mode = {0: "reflect", 1: "symmetric"}.get(int(o.Mode()) if o else 0)
    x = imp.operand(ins[0], k, name)
    shape = imp.g.types[x].shape
    p = np.asarray(imp.const(ins[1], k, name, "paddings"), np.int64)
    if p.shape != (len(shape), 2) or np.any(p < 0):
        raise _err(imp, k, name, f"paddings {p.tolist()} must be non-negative with shape [{len(shape)}, 2]")
    lim = 1 if mode == "reflect" else 0
    for a, (n, (lo, hi)) in enumerate(zip(shape, p)):
        if max(lo, hi) > n - lim:
            raise _err(imp, k, name, f"padding {[int(lo), int(hi)]} of axis {a} (size {n}) is out of range: "
                                     f"{mode.upper()} allows at most {n - lim}")
    _same_quant(imp, k, name, x, out)
    axes = [a for a in range(len(shape)) if p[a].any()]
    if not axes:
        imp.values[out] = imp.emit(k, name, "reshape", [x], {"shape": list(shape)}, out)
        return
    v = x
    for j, a in enumerate(axes):
        idx = mirror_indices(shape[a], int(p[a][0]), int(p[a][1]), mode)
        cname = imp._vname(f"{imp.tensors[out]['name']}_idx{a}")
        imp.g.add_const(cname, idx)
        last = j == len(axes) - 1
        t = imp.g.types[v]
        oshape = list(t.shape)
        oshape[a] = len(idx)
        v = imp.emit(k, name, "gather", [v, cname], {"axis": a}, out,
                     name=None if last else imp._vname(f"{imp.tensors[out]['name']}_pad{a}"),
                     out_type=None if last else TensorType(tuple(oshape), t.dtype, t.quant))
    imp.values[out] = v


@tfl.importer("PADV2")
def _tfl_padv2(imp, k, op, ins, out):
    name = "PADV2"
    tfl.need(imp, k, name, ins, 2, 3, optional=(2,))
    tfl.options(imp, k, op, name, "PadV2Options")
    x = imp.operand(ins[0], k, name)
    xt = imp.g.types[x]
    p = np.asarray(imp.const(ins[1], k, name, "paddings"), np.int64)
    if p.shape != (len(xt.shape), 2) or np.any(p < 0) or len(xt.shape) > chk.PAD_MAX_RANK:
        raise _err(imp, k, name, f"paddings {p.tolist()} must be non-negative with shape [{len(xt.shape)}, 2] "
                                 f"(rank <= {chk.PAD_MAX_RANK})")
    value = 0.0
    if len(ins) == 3 and ins[2] >= 0:
        cv = np.asarray(imp.const(ins[2], k, name, "constant_values")).ravel()
        if cv.size != 1:
            raise _err(imp, k, name, f"constant_values {imp.label(ins[2])} must hold one value")
        if xt.dtype == "int8":
            cq = imp.tensors[ins[2]]["quant"]
            if imp.tensors[ins[2]]["dtype"] != "int8" or cq is None or cq != xt.quant:
                raise _err(imp, k, name, "int8 constant_values must be int8 with the input's scale and zero point")
            value = float((int(cv[0]) - xt.quant.zero_point[0]) * np.float64(np.float32(xt.quant.scale[0])))
            if int(np.clip(fp.quantize_value(value, xt.quant.scale[0], xt.quant.zero_point[0]), -128, 127)) != int(cv[0]):
                raise _err(imp, k, name, f"constant value {int(cv[0])} does not survive dequantise/quantise")
        else:
            value = float(cv[0])
    _same_quant(imp, k, name, x, out)
    imp.values[out] = imp.emit(k, name, "pad", [x], {"pads": [int(v) for v in p.ravel()], "value": value}, out)


# ---- GATHER_ND (constant indices) ----------------------------------------------------------------
@tfl.importer("GATHER_ND")
def _tfl_gather_nd(imp, k, op, ins, out):
    name = "GATHER_ND"
    tfl.need(imp, k, name, ins, 2)
    tfl.options(imp, k, op, name, "GatherNdOptions")
    x = imp.operand(ins[0], k, name)
    shape = list(imp.g.types[x].shape)
    if imp.tensors[ins[1]]["data"] is None:
        raise _err(imp, k, name, "indices must be a constant (Kiln imports GATHER_ND with constant indices)")
    idx = np.asarray(imp.const(ins[1], k, name, "indices"), np.int64)
    depth = idx.shape[-1] if idx.ndim else 0
    if idx.ndim < 1 or not 1 <= depth <= len(shape):
        raise _err(imp, k, name, f"indices shape {list(idx.shape)} needs a last dimension in 1..{len(shape)}")
    lead = shape[:depth]
    if np.any(idx < 0) or np.any(idx >= np.asarray(lead)):
        raise _err(imp, k, name, f"an index in {imp.label(ins[1])} is out of range for the leading dims {lead}")
    flat = np.ravel_multi_index(tuple(np.moveaxis(idx, -1, 0)), lead).astype(np.int32)
    cname = imp._vname(f"{imp.tensors[out]['name']}_flat_idx")
    imp.g.add_const(cname, flat)
    xt = imp.g.types[x]
    rest = shape[depth:]
    _same_quant(imp, k, name, x, out)
    r = imp.emit(k, name, "reshape", [x], {"shape": [math.prod(lead)] + rest}, out,
                 name=imp._vname(f"{imp.tensors[out]['name']}_flat"),
                 out_type=TensorType((math.prod(lead), *rest), xt.dtype, xt.quant))
    if list(flat.shape) + rest == list(imp.tensors[out]["shape"]):
        imp.values[out] = imp.emit(k, name, "gather", [r, cname], {"axis": 0}, out)
        return
    raise _err(imp, k, name, f"output shape {list(imp.tensors[out]['shape'])} is not {list(flat.shape) + rest}")


# ---- SHAPE, FILL, ZEROS_LIKE (constants) -----------------------------------------------------------
def _fold(imp, k, name, out, data):
    t = imp.tensors[out]
    if t["quant"] is not None:
        raise _err(imp, k, name, f"output {imp.label(out)} is quantised; Kiln folds only unquantised {name} results")
    data = np.asarray(data).astype(t["dtype"])
    if list(data.shape) != list(t["shape"]):
        raise _err(imp, k, name, f"output {imp.label(out)} has shape {list(t['shape'])}, the op gives "
                                 f"{list(data.shape)}")
    imp.folded[out] = data


@tfl.importer("SHAPE")
def _tfl_shape(imp, k, op, ins, out):
    name = "SHAPE"
    tfl.need(imp, k, name, ins, 1)
    tfl.options(imp, k, op, name, "ShapeOptions")
    src = imp.tensors[ins[0]]
    _fold(imp, k, name, out, np.asarray(src["shape"], np.int64))


@tfl.importer("FILL")
def _tfl_fill(imp, k, op, ins, out):
    name = "FILL"
    tfl.need(imp, k, name, ins, 2)
    tfl.options(imp, k, op, name, "FillOptions")
    dims = _int_const(imp, ins[0], k, name, "dims", 1)
    value = np.asarray(imp.const(ins[1], k, name, "value")).ravel()
    if value.size != 1 or any(d < 0 for d in dims):
        raise _err(imp, k, name, f"dims {dims} must be >= 0 and value a scalar")
    if list(dims) != list(imp.tensors[out]["shape"]):       # (before allocating anything)
        raise _err(imp, k, name, f"output {imp.label(out)} has shape {list(imp.tensors[out]['shape'])}, dims say "
                                 f"{dims}")
    _fold(imp, k, name, out, np.full(dims, value[0]))


@tfl.importer("ZEROS_LIKE")
def _tfl_zeros_like(imp, k, op, ins, out):
    name = "ZEROS_LIKE"
    tfl.need(imp, k, name, ins, 1)
    tfl.options(imp, k, op, name, "ZerosLikeOptions")
    _fold(imp, k, name, out, np.zeros(imp.tensors[ins[0]]["shape"]))
