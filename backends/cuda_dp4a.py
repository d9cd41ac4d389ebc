"""int8 dot products on CUDA: CONV_2D and FULLY_CONNECTED with ``__dp4a`` (4 int8 products summed
into an int32 per instruction, sm_61 and later).

TFLite's int8 kernels accumulate ``(x - zx) * w`` (weights are symmetric). With constant weights
and bias the input zero point folds into the bias at compile time,

    acc = sum(x * w) - zx * sum(w) + bias = sum(x * w) + (bias - zx * sum(w)),

so the inner product is int8 x int8 -> int32 on the raw input bytes. The reduction axis (a
convolution's (kh, kw, c), a dense layer's k) is cut into words of 4 bytes: the weights are
packed into int32 words at compile time (zero bytes pad a reduction length that is not a
multiple of 4), the input's 4 bytes are packed in the kernel, and each word pair is one
``kiln.dp4a`` call. A padded border reads the input zero point, which the folded bias cancels
exactly as TFLite's ``(zx - zx) * w = 0``. Every partial sum is exact: |sum(x * w)| <= R * 2^14
fits int32 for every reduction length R this rule accepts (``MAX_REDUCTION``), and the folded
bias fits int32 (else the rule does not apply), so the accumulator is TFLite's to the bit.

``kiln.dp4a(a, b, c)`` is a TIR op of its own, lowered per target (``LowerIntrin``): to CUDA's
``__dp4a`` for ``cuda``; for every other target (OpenCL for cuda-sim, LLVM for the plan
interpreter) to its exact definition, ``c + sum_j sext(a.byte j) * sext(b.byte j)``, so cuda-sim
runs the very schedule the GPU runs.

Not covered (the C rule's plain int32 path instead): depthwise convolutions (their reduction runs
over kh x kw, not over packed channels), weights or biases computed at run time, a weight zero
point other than 0, int16 inputs.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx
from tvm.ir import register_op_attr
from tvm.tirx import CallEffectKind
from tvm.tirx.op import register_intrin_lowering

from kiln.frontend.ops.nn import conv_geometry

from .qmath import c

OP = "kiln.dp4a"
MAX_REDUCTION = (2 ** 31 - 1) // (128 * 128)    # R * 128 * 128 stays below 2^31

register_op_attr(OP, "TCallEffectKind", CallEffectKind.Pure.value)
register_op_attr(OP, "TScriptPrinterName", "kiln_dp4a")


def _sext_byte(v, j):
    """Byte ``j`` of the int32 ``v`` as a signed value (no shift into the sign bit)."""
    b = tirx.bitwise_and(v >> c(8 * j), c(255)) if j < 3 else v >> c(24)
    return b if j == 3 else tirx.bitwise_xor(b, c(128)) - c(128)


def _lower_exact(call):
    a, b, acc = call.args
    s = acc
    for j in range(4):
        s = s + _sext_byte(a, j) * _sext_byte(b, j)
    return s


def _lower_cuda(call):
    return tirx.call_pure_extern("int32", "__dp4a", *call.args)


register_intrin_lowering(OP, "default", f=_lower_exact, level=10)
register_intrin_lowering(OP, "cuda", f=_lower_cuda, level=10)


def dp4a(a, b):
    """sum over 4 byte lanes of int8(a) * int8(b) as an int32 (``__dp4a(a, b, 0)`` on CUDA)."""
    return tirx.call_intrin("int32", OP, a, b, c(0))


# ---- packing --------------------------------------------------------------------------------
def pack_rows(w):
    """int8 rows [O, R] -> int32 words [O, ceil(R / 4)], byte j of word i = w[:, 4 i + j]
    (little endian, as the kernels unpack them), zero bytes after R."""
    w = np.asarray(w, np.int64)
    r4 = -(-w.shape[1] // 4)
    pad = np.zeros((w.shape[0], 4 * r4), np.int64)
    pad[:, :w.shape[1]] = w
    b = (pad.reshape(w.shape[0], r4, 4) & 255) << np.array([0, 8, 16, 24], np.int64)
    return b.sum(axis=2).astype(np.uint32).view(np.int32)


def pack_word(byte_of):
    """The int32 word whose byte j is ``byte_of(j)`` (int8 expressions), built in uint32."""
    u = None
    for j in range(4):
        b = tirx.bitwise_and(byte_of(j).astype("uint32"), tirx.const(255, "uint32"))
        b = b << tirx.const(8 * j, "uint32") if j else b
        u = b if u is None else tirx.bitwise_or(u, b)
    return u.astype("int32")


def folded_bias(bias, w_rows, zx):
    """bias - zx * sum(w) per output channel as int32, or None when it leaves int32."""
    f = np.asarray(bias, np.int64).reshape(-1) - np.int64(zx) * np.asarray(w_rows, np.int64).sum(axis=1)
    return f.astype(np.int32) if f.size == 0 or (f.min() >= -2 ** 31 and f.max() < 2 ** 31) else None


def _constants(k, node, n_out):
    """(weights [O, R] int64, bias [O] int64) when both are compile-time constants and the
    weights are symmetric int8; else None."""
    tw = k.type(node.inputs[1])
    if tw.dtype != "int8" or tw.quant is None or any(int(z) != 0 for z in tw.quant.zero_point):
        return None
    w = k.value(node.inputs[1])
    b = k.value(node.inputs[2]) if len(node.inputs) >= 3 else np.zeros(n_out, np.int64)
    if w is None or b is None:
        return None
    w = np.asarray(w, np.int64).reshape(n_out, -1)
    return (w, np.asarray(b, np.int64)) if w.shape[1] <= MAX_REDUCTION else None


def _folded_operands(k, node, n_out):
    """(packed weights [O, R/4] int32, bias with the input zero point folded in, input zero
    point) as kernel constants, or None when the weights are not symmetric int8 constants or the
    folded bias leaves int32."""
    wb = _constants(k, node, n_out)
    if wb is None:
        return None
    zx = int(k.type(node.inputs[0]).quant.zero_point[0])
    fold = folded_bias(wb[1], wb[0], zx)
    if fold is None:
        return None
    return k.const("w4", pack_rows(wb[0])), k.const("bias_zx", fold), zx


def _int8_io(k, node):
    return all(k.type(v).dtype == "int8" and k.type(v).quant is not None for v in (node.inputs[0], node.name))


# ---- conv2d ---------------------------------------------------------------------------------
def conv2d_acc(k, node, x):
    """int8 conv2d (groups allowed, not depthwise) -> the int32 accumulator with the folded
    bias, reduced with dp4a; None when the rule does not apply (see the module docstring)."""
    tx, tw = k.type(node.inputs[0]), k.type(node.inputs[1])
    if not _int8_io(k, node):
        return None
    G = conv_geometry(tx.shape, tw.shape, node.attrs)
    g, I, O, KH, KW = G["g"], G["I"], G["O"], G["KH"], G["KW"]
    if I == 1 and g == G["C"] and g > 1:
        return None                                     # depthwise
    ops = _folded_operands(k, node, O)
    if ops is None:
        return None
    wp, fb, zx = ops
    Og, R = O // g, KH * KW * I
    padded = bool(G["pt"] or G["pb"] or G["pl"] or G["pr"])

    def byte(n, oh, ow, o, kh, kw, ch):
        h, w_ = oh * G["sh"] + kh * G["dh"] - G["pt"], ow * G["sw"] + kw * G["dw"] - G["pl"]
        ci = ch if g == 1 else (o // Og) * I + ch
        v = x[n, h, w_, ci]
        if padded:
            v = tirx.if_then_else(tirx.all(h >= 0, h < G["H"], w_ >= 0, w_ < G["W"]), v, tirx.const(zx, "int8"))
        return v

    if I % 4 == 0:
        I4 = I // 4
        kh, kw, c4 = te.reduce_axis((0, KH), "kh"), te.reduce_axis((0, KW), "kw"), te.reduce_axis((0, I4), "c4")
        axes = [kh, kw, c4]

        def term(n, oh, ow, o):
            xw = pack_word(lambda j: byte(n, oh, ow, o, kh, kw, c4 * 4 + j))
            return dp4a(xw, wp[o, (kh * KW + kw) * I4 + c4])
    else:                                               # (kh, kw, c) flattened, the last word padded
        r4 = te.reduce_axis((0, -(-R // 4)), "r4")
        axes = [r4]

        def term(n, oh, ow, o):
            def b(j):
                r = r4 * 4 + j
                v = byte(n, oh, ow, o, r // (KW * I), (r // I) % KW, r % I)
                return v if R % 4 == 0 else tirx.if_then_else(r < R, v, tirx.const(0, "int8"))
            return dp4a(pack_word(b), wp[o, r4])
    acc = te.compute((G["N"], G["oh"], G["ow"], O), lambda n, oh, ow, o: te.sum(term(n, oh, ow, o), axis=axes),
                     name="acc_dp4a")
    return te.compute(acc.shape, lambda n, oh, ow, o: acc[n, oh, ow, o] + fb[o], name="bias")


# ---- dense ----------------------------------------------------------------------------------
def dense_acc(k, node, x):
    """int8 dense [..., K] x [N, K] -> the int32 accumulator with the folded bias, reduced with
    dp4a; None when the rule does not apply."""
    tx, tw = k.type(node.inputs[0]), k.type(node.inputs[1])
    if not _int8_io(k, node):
        return None
    K, N, lead = tx.shape[-1], tw.shape[0], tuple(tx.shape[:-1])
    ops = _folded_operands(k, node, N)
    if ops is None:
        return None
    wp, fb, _ = ops
    k4 = te.reduce_axis((0, -(-K // 4)), "k4")

    def term(i):
        def b(j):
            v = x[tuple(i[:-1]) + (k4 * 4 + j,)]
            return v if K % 4 == 0 else tirx.if_then_else(k4 * 4 + j < K, v, tirx.const(0, "int8"))
        return dp4a(pack_word(b), wp[i[-1], k4])
    acc = te.compute(lead + (N,), lambda *i: te.sum(term(i), axis=[k4]), name="acc_dp4a")
    return te.compute(acc.shape, lambda *i: acc(*i) + fb[i[-1]], name="bias")
