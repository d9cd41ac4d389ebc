"""C override of int8 ``dense`` (FULLY_CONNECTED), bit-exact with LiteRT's reference kernel
(requantisation in double: docs/int8_ir.md), or with TensorFlow Lite Micro's where the node's
``requant`` attribute is "fixed" (the conv's fixed-point multiplier; ``nn.fixed_requant``). With
Kiln kernels and constant weights a layer is one call of ``kiln_fc_mv_s8`` (include/kiln_dense.h;
``kiln_fc_mv_s8_fx`` for TensorFlow Lite Micro's requantisation): weights packed at compile time
for its 4-column SMLAD loop, the input zero point folded into the bias, the requantisation fused.
Weights that several layers share (the time steps of an unrolled RNN, each with its own input zero
point and bias) are packed once with zero biases, and each layer passes its own folded biases
(``kiln_fc_mv_s8_b``), so flash holds one copy of them. Otherwise the tensorized dot product of
``schedules.py`` or TVM's default schedule, requantised by ``fc_requant_epilogue`` (or the conv's
``requant_epilogue``). The 16x8 (int16 activation) dense stays in ``ops_nn.py``."""
from __future__ import annotations

import collections
import hashlib
import weakref

import numpy as np
from tvm import te, tirx

from kiln.frontend.ops.int8util import channel_params, per_tensor
from kiln.frontend.ops.nn import fc_effective_scales, fc_requant_constants, fixed_requant, requantize_params

from . import qmath, schedules
from .lower import lower_rule
from .ops_nn import _check_int8, _zp, lower_dense_16x8, quantized, requant_epilogue
from .qmath import c


def fc_requant_epilogue(k, acc, tx, tw, ty, channels, act):
    """acc (int32 te tensor, bias added, channels last) -> int8 as LiteRT's reference
    FULLY_CONNECTED requantises: ``round(double(acc) * eff[c])`` + zero point, activation clamp,
    computed in integers by ``kiln_fc_s8`` (kiln_intrinsics.h; no double-precision FPU needed)."""
    s_in, _ = per_tensor(tx, "input", "dense")
    s_out, zy = per_tensor(ty, "output", "dense")
    ws, _, _ = channel_params(tw, channels, "dense")
    mh, ml, sh = fc_requant_constants(fc_effective_scales(s_in, ws, s_out))
    lo, hi = qmath.activation_range(act, s_out, zy)
    if len(set(zip(mh.tolist(), ml.tolist(), sh.tolist()))) == 1:
        consts = (lambda ch: c(int(mh[0])), lambda ch: c(int(ml[0]), "uint32"), lambda ch: c(int(sh[0])))
    else:
        tmh = k.const("fc_mh", mh.astype(np.int32))
        tml = k.const("fc_ml", ml.astype(np.uint32))
        tsh = k.const("fc_s", sh.astype(np.int32))
        consts = (lambda ch: tmh[ch], lambda ch: tml[ch], lambda ch: tsh[ch])

    def body(*idx):
        ch = idx[-1]
        return tirx.call_extern("int32", "kiln_fc_s8", acc(*idx), consts[0](ch).astype("uint32"), consts[1](ch),
                                consts[2](ch), c(zy), c(lo), c(hi)).astype("int8")
    return te.compute(acc.shape, body, name="requant")


@lower_rule("dense")
def lower_dense(k, node, xs):
    if not quantized(k, node):
        return None                          # float: the op's TE compute
    if k.type(node.inputs[0]).dtype == "int16":
        return lower_dense_16x8(k, node, xs)
    x, w = xs[0], xs[1]
    tx, tw, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
    K = tx.shape[-1]
    N = tw.shape[0]
    lead = tx.shape[:-1]
    bias = xs[2] if len(xs) == 3 else None
    kk = te.reduce_axis((0, K), "k")
    _check_int8(k, node, [node.inputs[0], node.inputs[1], node.name])
    zx = _zp(tx)
    zws = tw.quant.zero_point
    if len(set(zws)) != 1:
        k.fail("int8 dense needs one weight zero point")
    zw = zws[0]
    if k.target.kernels and zw == 0:
        y = _dense_kernel(k, node, x, ty)
        if y is not None:
            return y
    if k.target.kernels and zw == 0 and k.value(node.inputs[1]) is not None:
        # the tensorized dot product against packed weights (the zero point folded into the bias)
        acc, folded, zx_k = schedules.dense_dot_compute(k, node, x, lead, N, K, zx)
        bias = folded if folded is not None else bias
        k.schedule(schedules.dsp_dense_schedule(K, zx_k, N, k.target.optimize))
    else:
        acc = te.compute(lead + (N,), lambda *i: te.sum(
            (x[i[:-1] + (kk,)].astype("int32") - c(zx)) * (w[i[-1], kk].astype("int32") - c(zw)), axis=[kk]),
            name="acc")
    acc2 = te.compute(acc.shape, lambda *i: acc(*i) + bias[i[-1]], name="bias") if bias is not None else acc
    if fixed_requant(node.attrs):           # TensorFlow Lite Micro's: the conv's requantisation
        return requant_epilogue(k, node, acc2, ty, N, lambda idx: idx[-1], node.attrs["activation"],
                                bound=_bound(k, node, zx))
    return fc_requant_epilogue(k, acc2, tx, tw, ty, N, node.attrs["activation"])


def _bound(k, node, zx):
    """The largest |acc| of a dense with constant weights and bias (``acc_bound``), else None."""
    w = k.value(node.inputs[1])
    b = k.value(node.inputs[2]) if len(node.inputs) >= 3 else 0
    if w is None or b is None:
        return None
    zw = np.asarray(k.type(node.inputs[1]).quant.zero_point, np.int64).reshape(-1)[:1]
    return acc_bound(np.asarray(w, np.int64) - zw, np.broadcast_to(np.asarray(b, np.int64), (w.shape[0],)), zx)


# ---- the kiln_fc_mv_s8 kernel (include/kiln_dense.h) -----------------------------------------
def pack_dense(w, bias):
    """(N, K) int8 weights and int32 biases -> the int8 stream ``kiln_fc_mv_s8`` reads: per block
    of 4 columns the 4 biases (int32, little-endian), then per group of 4 reduction indices the 4
    columns' weights in natural order (the K % 4 tail zero-padded to a group); then the N % 4
    remaining columns, each its bias and its K weights padded to a multiple of 4."""
    w = np.asarray(w, np.int8)
    N, K = w.shape
    Kp = -(-K // 4) * 4
    wp = np.zeros((N, Kp), np.int8)
    wp[:, :K] = w
    b = np.asarray(bias, "<i4").view(np.int8).reshape(N, 4)
    N4 = N // 4 * 4
    blocks = wp[:N4].reshape(N4 // 4, 4, Kp // 4, 4).transpose(0, 2, 1, 3).reshape(N4 // 4, 4 * Kp)
    head = np.concatenate([b[:N4].reshape(N4 // 4, 16), blocks], axis=1)
    return np.concatenate([head.reshape(-1), np.concatenate([b[N4:], wp[N4:]], axis=1).reshape(-1)])


def fold_bias(w, bias, zx):
    """bias - zx * sum_k w[n, k] as int32, modulo 2^32 (the accumulator wraps the same way, so the
    sum is the one TFLite's (x - zx) * w accumulation gives)."""
    folded = np.asarray(bias, np.int64) - int(zx) * np.asarray(w, np.int64).sum(axis=1)
    return ((folded + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int32)


def requant_guard(bound, mh, ml, sh):
    """(m, c1, c2) of kiln_dense_rq's fast path (kiln_dense.h): m = floor(eff * 2^32) per channel,
    the guard G = bound + 2^10 (``bound``: the largest |acc|), c1 = 2^31 + G and c2 = 2^32 - 2G as
    uint32. c2 = 0 (never the fast path) when some eff >= 1/2 or G >= 2^31."""
    m = [(int(a) << 32 | int(b)) >> (int(s) - 32) if int(s) >= 32 else 2 ** 31 for a, b, s in zip(mh, ml, sh)]
    G = int(bound) + 1024
    if max(m) >= 2 ** 31 or G >= 2 ** 31:
        return np.zeros(len(m), np.int32), 0, 0
    return np.asarray(m, np.int32), 2 ** 31 + G, 2 ** 32 - 2 * G


def acc_bound(w, bias, zx):
    """The largest |acc| any int8 input can give: sum |w| * max |x - zx| + |bias| per column."""
    xmax = max(abs(-128 - zx), abs(127 - zx))
    return int((np.abs(np.asarray(w, np.int64)).sum(axis=1) * xmax + np.abs(np.asarray(bias, np.int64))).max(initial=0))


def prepare_dense(w, bias, zx, s_in, w_scales, s_out, zy, act, bias_apart=False, fixed=False):
    """Everything ``kiln_fc_mv_s8`` takes besides the input and output, computed at compile time:
    {"stream": packed weights and folded biases, "m", "rq": fast and exact requantisation
    constants (one channel when all are equal), "mstep", "c1", "c2", "lo", "hi"}. With
    ``bias_apart`` the stream's biases are zero and "bias" holds the folded biases (int32 [N],
    ``kiln_fc_mv_s8_b``): the stream depends on the weights alone. ``fixed`` (TensorFlow Lite
    Micro's requantisation, ``kiln_fc_mv_s8_fx``): "rq" and "c1" as ``fixed_constants`` gives
    them, "m" one unused word, c2 = 0."""
    w = np.asarray(w, np.int8)
    N = w.shape[0]
    lo, hi = qmath.activation_range(act, s_out, zy)
    if fixed:
        rq, c1 = fixed_constants(s_in, w_scales, s_out, acc_bound(w, bias, zx), zy)
        m, c2, one = np.zeros(1, np.int32), 0, rq.size == 3
    else:
        m, rq, c1, c2, one = _double_constants(w, bias, zx, s_in, w_scales, s_out)
    folded = fold_bias(w, np.asarray(bias, np.int64).reshape(N), zx)
    p = {"stream": pack_dense(w, np.zeros(N, np.int32) if bias_apart else folded), "m": m, "rq": rq,
         "mstep": 0 if one else 1, "c1": c1, "c2": c2, "lo": lo, "hi": hi}
    if bias_apart:
        p["bias"] = folded
    return p


def _double_constants(w, bias, zx, s_in, w_scales, s_out):
    """(m, rq, c1, c2, one) of LiteRT's requantisation for ``kiln_fc_mv_s8`` (prepare_dense)."""
    mh, ml, sh = fc_requant_constants(fc_effective_scales(s_in, w_scales, s_out))
    one = len(set(zip(mh.tolist(), ml.tolist(), sh.tolist()))) == 1
    if one:
        mh, ml, sh = mh[:1], ml[:1], sh[:1]
    m, c1, c2 = requant_guard(acc_bound(w, bias, zx), mh, ml, sh)
    rq = np.stack([mh, ml, sh], axis=1).astype(np.uint32).view(np.int32).reshape(-1)
    return m, rq, c1, c2, one


def fixed_constants(s_in, w_scales, s_out, bound, zy):
    """(rq, form) of TensorFlow Lite Micro's requantisation (the conv's ``requantize_params``) for
    ``kiln_fc_mv_s8_fx``: form 1, int32 {multiplier, 2^(e-1), e} per channel, when the conv's
    SMMULR shortcut is exact for every |acc| <= ``bound`` (``schedules.requant_bound_ok``: right
    shifts e >= 1); else form 0, {multiplier, left shift, minus the right shift} as ``kiln_mbqm``
    takes them. One triple when all channels are equal."""
    mult, shift = (np.asarray(a, np.int64) for a in requantize_params(s_in, np.ravel(w_scales), s_out))
    form = int(schedules.requant_bound_ok(bound, mult, shift, zy))
    if form:
        rq = np.stack([mult, np.left_shift(np.int64(1), -shift - 1), -shift], axis=1)
    else:
        rq = np.stack([mult, np.maximum(shift, 0), np.minimum(shift, 0)], axis=1)
    if len({tuple(r) for r in rq.tolist()}) == 1:
        rq = rq[:1]
    return rq.astype(np.int32).reshape(-1), form


def kernel_operands(k, node, x):
    """What a batch-1 dense kernel (``kiln_fc_mv_s8``, ops_helium's ``kiln_mve_fc_s8``) is
    prepared from: (the arguments of ``prepare_dense`` / ``prepare_fc``, rows, K, N, output zero
    point), or None (weights or bias not constant, or an input that is not a kernel argument)."""
    if not isinstance(x.op, te.PlaceholderOp):
        return None
    tx, tw, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
    N, K = tw.shape
    w = k.value(node.inputs[1])
    b = k.value(node.inputs[2]) if len(node.inputs) >= 3 else np.zeros(N, np.int64)
    if w is None or b is None:
        return None
    s_in, zx = per_tensor(tx, "input", "dense")
    s_out, zy = per_tensor(ty, "output", "dense")
    ws, _, _ = channel_params(tw, N, "dense")
    rows = int(np.prod(tx.shape[:-1], dtype=np.int64))
    return (np.asarray(w).reshape(N, K), b, zx, s_in, ws, s_out, zy, node.attrs["activation"]), rows, K, N, zy


def _dense_kernel(k, node, x, ty):
    """One ``kiln_fc_mv_s8`` call for the layer (``kiln_fc_mv_s8_b`` when other layers have the
    same weights), or None (``kernel_operands``)."""
    ops = kernel_operands(k, node, x)
    if ops is None:
        return None
    args, rows, K, N, zy = ops
    apart, fx = weights_shared(k, args[0]), fixed_requant(node.attrs)
    p = prepare_dense(*args, bias_apart=apart, fixed=fx)
    consts = (k.const("w_dense", p["stream"]),) + ((k.const("bias_dense", p["bias"]),) if apart else ()) + (
        k.const("rq_m", p["m"]), k.const("rq_fixed" if fx else "rq_exact", p["rq"]))
    k.schedule(lambda sch, out_block: None)
    fn = "kiln_fc_mv_s8" + ("_b" if apart else "") + ("_fx" if fx else "")
    return dense_extern(fn, x, consts, rows, K, N, p, zy, ty.shape)


_WEIGHTS = weakref.WeakKeyDictionary()      # graph -> (its constants, Counter of dense weights' digests)


def _digest(a):
    a = np.ascontiguousarray(a)
    return str(a.dtype), hashlib.sha256(a.tobytes()).digest()


def weights_shared(k, w):
    """Whether another dense node of the graph has constant weights equal to ``w`` (the time
    steps of an unrolled RNN): counted once per graph and set of constants."""
    seen = _WEIGHTS.get(k.graph)
    if seen is None or seen[0] is not k.consts:
        count = collections.Counter(_digest(k.consts[n.inputs[1]]) for n in k.graph.nodes
                                    if n.op == "dense" and len(n.inputs) > 1 and n.inputs[1] in k.consts)
        seen = _WEIGHTS[k.graph] = (k.consts, count)
    return seen[1][_digest(w)] > 1


def dense_extern(fn, x, consts, rows, K, N, p, zy, out_shape):
    """``fn(x, rows, K, N, *consts, mstep, c1, c2, zy, lo, hi, y)`` as one extern stage: the call
    of ``kiln_fc_mv_s8`` and of ``kiln_mve_fc_s8``."""
    def fcompute(ins, outs):
        call = tirx.call_extern("void", fn, ins[0].access_ptr("r"), c(rows), c(K), c(N),
                                *[b.access_ptr("r") for b in ins[1:]], c(p["mstep"]),
                                c(p["c1"], "uint32"), c(p["c2"], "uint32"), c(zy), c(p["lo"]), c(p["hi"]),
                                outs[0].access_ptr("w"))
        return tirx.Evaluate(call)
    ins = [x] + list(consts)
    bufs = [tirx.decl_buffer(t.shape, t.dtype, name=t.op.name, elem_offset=0) for t in ins]
    yb = tirx.decl_buffer(tuple(out_shape), "int8", name="dense", elem_offset=0)
    return te.extern(tuple(out_shape), ins, fcompute, name="dense", dtype="int8", in_buffers=bufs, out_buffers=[yb])
