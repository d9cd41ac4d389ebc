"""C overrides of the linear and window ops for int8: conv2d (incl. depthwise and padding), avg/max
pooling (int8 dense: ``ops_dense.py``; the 16x8 dense is here), following TFLite's reference kernels (per-channel requantisation, zero points,
fused activation clamp) bit for bit, with the DSP kernels of ``schedules.py``. Float (and matmul)
is the op's TE compute (``lower.lower_te``; float depthwise keeps ``schedules.depthwise_schedule``
through ``schedules.TE_SCHEDULES``)."""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from kiln.frontend.fixedpoint import multiply_by_quantized_multiplier
from kiln.frontend.ops.int8util import channel_params, per_tensor
from kiln.frontend.ops.nn import conv_geometry, fc_effective_scales, fc_requant_constants, fixed_requant, pool_geometry

from . import ops_dw, ops_mve, qmath, schedules
from .lower import lower_rule
from .qmath import c


def quantized(k, node):
    return any(k.type(v).quant is not None for v in list(node.inputs) + [node.name])


def _zp(t):
    return int(t.quant.zero_point[0])


def _scale(t):
    return float(t.quant.scale[0])


def _inb(h, w, G):
    return tirx.all(h >= G["pt"], h < G["pt"] + G["H"], w >= G["pl"], w < G["pl"] + G["W"])


def _check_int8(k, node, names):
    for v in names:
        t = k.type(v)
        if t.dtype != "int8" or t.quant is None:
            k.fail(f"int8 kernel needs quantised int8 {v!r}, got {t}")


def requant_epilogue(k, node, acc, out_type, channels, axis_index, act, bound=None):
    """acc (int32 te tensor) -> int8: MultiplyByQuantizedMultiplier per channel, + zero point,
    activation clamp. ``axis_index(idx) -> channel expr``. ``bound``: per-channel bound on
    |acc| known at compile time; on DSP cores, when it allows, one ``kiln_rq_s8`` per output
    (SMMULR + folded zero point, exactly the same result; schedules.requant_bound_ok)."""
    mult, shift = qmath.linear_requant(k.type(node.inputs[0]), k.type(node.inputs[1]), out_type, channels)
    zy = _zp(out_type)
    lo, hi = qmath.activation_range(act, _scale(out_type), zy)
    if k.target.kernels and schedules.requant_bound_ok(bound, mult, shift, zy):
        e = (-np.asarray(shift, np.int64))
        halfz = (np.left_shift(np.int64(1), e - 1) + np.int64(zy) * np.left_shift(np.int64(1), e)).astype(np.int32)
        if len(set(mult.tolist())) == 1 and len(set(shift.tolist())) == 1:
            consts = (lambda ch: c(int(mult[0])), lambda ch: c(int(halfz[0])), lambda ch: c(int(e[0])))
        else:
            tm, th, tsh = k.const("mult", mult), k.const("halfz", halfz), k.const("rshift", e.astype(np.int32))
            consts = (lambda ch: tm[ch], lambda ch: th[ch], lambda ch: tsh[ch])

        def fast(*idx):
            ch = axis_index(idx)
            return tirx.call_extern("int32", "kiln_rq_s8", acc(*idx), consts[0](ch), consts[1](ch), consts[2](ch),
                                    c(lo), c(hi)).astype("int8")
        return te.compute(acc.shape, fast, name="requant")
    if len(set(mult.tolist())) == 1 and len(set(shift.tolist())) == 1:
        m0, s0 = int(mult[0]), int(shift[0])

        def req(v, ch):
            return qmath.mbqm(v, c(m0), s0)
    else:
        tm = k.const("mult", mult)
        rs = k.const("rshift", np.maximum(-shift, 0).astype(np.int32))
        ls = k.const("lshift", np.maximum(shift, 0).astype(np.int32)) if (shift > 0).any() else None

        def req(v, ch):
            return qmath.mbqm(v, tm[ch], (None if ls is None else ls[ch], rs[ch]))
    shape = acc.shape

    def body(*idx):
        ch = axis_index(idx)
        return qmath.clamp(req(acc(*idx), ch) + c(zy), lo, hi).astype("int8")
    return te.compute(shape, body, name="requant")


# ---- conv2d ---------------------------------------------------------------------------------
@lower_rule("conv2d")
def lower_conv2d(k, node, xs):
    if not quantized(k, node):
        return None                          # float: the op's TE compute
    if k.type(node.inputs[0]).dtype == "int16":
        return lower_conv2d_16x8(k, node, xs)
    a = node.attrs
    x, w = xs[0], xs[1]
    tx, tw, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
    G = conv_geometry(tx.shape, tw.shape, a)
    g, I, O = G["g"], G["I"], G["O"]
    Og = O // g
    depthwise = I == 1 and g == G["C"] and g > 1   # C_in == 1: a regular (groups 1) conv
    k.inplace_hints_of_op()
    _check_int8(k, node, [node.inputs[0], node.inputs[1], node.name])
    zx = _zp(tx)
    if any(z != 0 for z in tw.quant.zero_point):
        k.fail("int8 conv2d needs symmetric weights (weight zero point 0)")
    pad_val = tirx.const(zx, tx.dtype)
    xp = te.compute((G["N"], G["H"] + G["pt"] + G["pb"], G["W"] + G["pl"] + G["pr"], G["C"]),
                    lambda n, h, ww, ch: tirx.if_then_else(_inb(h, ww, G), x[n, h - G["pt"], ww - G["pl"], ch], pad_val),
                    name="pad") if (G["pt"] or G["pb"] or G["pl"] or G["pr"]) else x

    def term(xv, wv):
        return (xv.astype("int32") - c(zx)) * wv.astype("int32")

    kh = te.reduce_axis((0, G["KH"]), "kh")
    kw = te.reduce_axis((0, G["KW"]), "kw")
    sh, sw, dh, dw = G["sh"], G["sw"], G["dh"], G["dw"]
    dsp = k.target.kernels   # Kiln kernels (DSP or portable C)
    bias = xs[2] if len(xs) == 3 else None
    bound = None
    if dsp and k.target.helium:             # Helium (MVE) kernels: ops_mve.py
        y = ops_mve.lower_conv2d(k, node, x, G, depthwise and Og == 1)
        if y is not None:
            return y
    if depthwise and dsp and Og == 1:
        y = _depthwise_dsp(k, node, x, G, zx, tx, tw, ty)
        if y is not None:
            return y
    if dsp and g == 1 and not depthwise:
        y = _conv_dsp_fused(k, node, x, G, zx, tx, tw, ty)
        if y is not None:
            return y
    if depthwise:
        M = Og  # depth multiplier
        acc = te.compute((G["N"], G["oh"], G["ow"], O),
                         lambda n, oh, ow, o: te.sum(term(xp[n, oh * sh + kh * dh, ow * sw + kw * dw, o // M],
                                                          w[o, kh, kw, 0]), axis=[kh, kw]), name="acc")
        if k.target.kernels:
            k.schedule(schedules.depthwise_schedule)
    elif dsp and g == 1 and k.value(node.inputs[1]) is not None:
        bvals = k.value(node.inputs[2]) if len(node.inputs) >= 3 else np.zeros(O, np.int64)
        if bvals is not None:
            bound = schedules.acc_bound(np.asarray(k.value(node.inputs[1])).reshape(O, -1), bvals, zx)
        acc, patch, folded, zx_k = schedules.conv_patch_compute(k, node, xp, G, zx)
        bias = folded if folded is not None else bias
        k.schedule(schedules.dsp_conv_schedule(G, zx_k, patch is not None, k.target.optimize))
    else:
        kc = te.reduce_axis((0, I), "kc")
        acc = te.compute((G["N"], G["oh"], G["ow"], O),
                         lambda n, oh, ow, o: te.sum(term(xp[n, oh * sh + kh * dh, ow * sw + kw * dw, (o // Og) * I + kc],
                                                          w[o, kh, kw, kc]), axis=[kh, kw, kc]), name="acc")
    if bias is not None:
        acc2 = te.compute(acc.shape, lambda n, oh, ow, o: acc[n, oh, ow, o] + bias[o], name="bias")
    else:
        acc2 = acc
    return requant_epilogue(k, node, acc2, ty, O, lambda idx: idx[3], a["activation"], bound)


def _const_weights_bias(k, node, O):
    """(weights, int64 bias[O]) when both are compile-time constants (no bias: zeros), else None."""
    w = k.value(node.inputs[1])
    if w is None:
        return None
    if len(node.inputs) < 3:
        return w, np.zeros(O, np.int64)
    b = k.value(node.inputs[2])
    if b is None:
        return None
    return w, np.asarray(b, np.int64).reshape(-1)


def _conv_dsp_fused(k, node, x, G, zx, tx, tw, ty, out_shape=None):
    """int8 groups-1 conv on DSP cores, one ``kiln_conv_s8`` call per image
    (``schedules.conv_fused_extern``): None when it does not apply (weights/bias not constant,
    C_out odd, dilation, the zero point not foldable, a left shift or an accumulator bound the
    requantisation shortcut does not allow, an input that is not a kernel argument). A channel
    whose weights are all zero outputs a compile-time constant (its bias requantised), whatever
    its multiplier and shift (pruned channels often carry huge biases and scales)."""
    if not isinstance(x.op, te.PlaceholderOp) or G["O"] % 2 or G["dh"] != 1 or G["dw"] != 1:
        return None
    O = G["O"]
    wb = _const_weights_bias(k, node, O)
    if wb is None:
        return None
    w, bias = wb
    wr = np.asarray(w).reshape(O, -1)
    mult, shift = qmath.linear_requant(tx, tw, ty, O)
    zy = _zp(ty)
    lo, hi = qmath.activation_range(node.attrs["activation"], _scale(ty), zy)
    live = wr.any(axis=1)
    if not schedules.requant_bound_ok(schedules.acc_bound(wr[live], bias[live], zx), mult[live], shift[live], zy):
        return None
    folded = bias - int(zx) * wr.astype(np.int64).sum(axis=1)
    if np.abs(folded[live]).max(initial=0) >= 2 ** 31:
        return None
    fixed = np.clip(multiply_by_quantized_multiplier(bias, mult, shift) + zy, lo, hi)
    const = [None if lv else int(v) for lv, v in zip(live, fixed)]
    Kp = -(-wr.shape[1] // 4) * 4     # the patch is zero-padded to Kp: no tail loop
    wpad = np.zeros((O, Kp), np.int8)
    wpad[:, :wr.shape[1]] = wr
    narrow = _narrow_patch(G, wr.shape[1], k.target.optimize)
    bits = 8 if narrow else _fused_weight_bits(O, wr.shape[1], G, k.target.optimize)
    wp = k.const("w_packed", schedules.pack_w16(wpad, 2) if bits == 16 else schedules.pack_w8(wpad, 2))
    q = k.const("convq", schedules.conv_requant_table(folded, mult, shift, zy, const))
    k.schedule(lambda sch, out_block: None)
    return schedules.conv_fused_extern(x, wp, q, G, zx, zy, lo, hi, bits, out_shape, narrow)


# --optimize size still packs a layer's weights as int16 when its output has this many pixels
# (per weight byte the flash buys the most instructions there: ResNet-8's 32x32 3x3 convs)
W16_SIZE_MIN_PIXELS = 1024


# --optimize size: layers with fewer MACs than this use kiln_conv8_s8 (the int8 patch pair): the
# widened pair saves them too few instructions for its scratch (twice the bytes) and code
NARROW_MAX_MACS = 100_000


def _narrow_patch(G, K, optimize):
    """kiln_conv8_s8 (no widened patch) for small layers under --optimize size."""
    return optimize == "size" and G["N"] * G["oh"] * G["ow"] * G["O"] * K < NARROW_MAX_MACS


def _fused_weight_bits(O, K, G, optimize):
    """8 or 16 for kiln_conv_s8's weights: ``schedules.weight_bits``, and int16 under "size" too
    for layers of at most W16_MAX_BYTES whose output has W16_SIZE_MIN_PIXELS pixels or more."""
    if optimize == "size" and G["N"] * G["oh"] * G["ow"] >= W16_SIZE_MIN_PIXELS:
        optimize = "speed"
    return schedules.weight_bits(O, K, optimize)


def _depthwise_dsp(k, node, x, G, zx, tx, tw, ty):
    """int8 depthwise (multiplier 1) with Kiln kernels: ``ops_dw.dw3_extern`` for 3x3 windows
    on DSP cores (ops_dw.dw3_applies), otherwise ``schedules.dw_dsp_extern`` (None when neither
    applies: weights/bias not constant, C % 4, a left shift, or an input that is not a
    kernel argument)."""
    if not isinstance(x.op, te.PlaceholderOp):
        return None
    O = G["O"]
    wb = _const_weights_bias(k, node, O)
    if wb is None:
        return None
    w, bias = wb
    mult, shift = qmath.linear_requant(tx, tw, ty, O)
    wc = np.asarray(w).reshape(O, G["KH"] * G["KW"])
    zy = _zp(ty)
    if not schedules.dw_dsp_ok(wc, bias, mult, shift, zx, zy):
        return None
    lo, hi = qmath.activation_range(node.attrs["activation"], _scale(ty), zy)
    if k.target.dsp and ops_dw.dw3_applies(G):   # 3x3: two taps per SMLAD (portable C: no gain)
        tab = k.const("dw3", ops_dw.dw3_table(wc, bias, mult, shift, zy))
        k.schedule(lambda sch, out_block: None)
        return ops_dw.dw3_extern(x, tab, G, zx, lo, hi)
    w16 = k.const("w_dw", schedules.pack_dw(wc, O))
    q = k.const("dwq", schedules.dw_requant_table(bias, mult, shift, zy))
    k.schedule(lambda sch, out_block: None)
    return schedules.dw_dsp_extern(x, w16, q, G, zx, zy, lo, hi)


# ---- pooling --------------------------------------------------------------------------------
def _pool_common(k, node):
    tx, ty = k.type(node.inputs[0]), k.type(node.name)
    G = pool_geometry(tx.shape, node.attrs)
    k.inplace_hints_of_op()
    return tx, ty, G


def _window_count(oh, ow, G):
    """Number of in-bounds taps of the window at (oh, ow) (TFLite's filter_count)."""
    hs = oh * G["sh"] - G["pt"]
    ws = ow * G["sw"] - G["pl"]
    ch = tirx.min(hs + G["KH"], G["H"]) - tirx.max(hs, 0)
    cw = tirx.min(ws + G["KW"], G["W"]) - tirx.max(ws, 0)
    return ch * cw


@lower_rule("avg_pool2d")
def lower_avg_pool(k, node, xs):
    if not quantized(k, node):
        return None                          # float: the op's TE compute
    x = xs[0]
    tx, ty, G = _pool_common(k, node)
    kh = te.reduce_axis((0, G["KH"]), "kh")
    kw = te.reduce_axis((0, G["KW"]), "kw")
    dt = "int32"
    zero = tirx.const(0, dt)

    def tap(n, oh, ow, ch):
        h = oh * G["sh"] + kh
        w_ = ow * G["sw"] + kw
        v = x[n, h - G["pt"], w_ - G["pl"], ch].astype(dt)
        if G["pt"] or G["pb"] or G["pl"] or G["pr"]:
            return tirx.if_then_else(_inb(h, w_, G), v, zero)
        return v
    acc = te.compute(ty.shape, lambda n, oh, ow, ch: te.sum(tap(n, oh, ow, ch), axis=[kh, kw]), name="acc")
    if tx.dtype == "int16":
        return avg_pool_16(k, acc, tx, ty, G)
    _check_int8(k, node, [node.inputs[0], node.name])
    if tx.quant != ty.quant:
        k.fail("int8 avg_pool2d needs the same quantisation on input and output (TFLite)")
    if k.target.kernels and k.target.helium:   # Helium (MVE): ops_mve.py
        y = ops_mve.lower_avg_pool_mve(k, node, x, G)
        if y is not None:
            return y

    def body(n, oh, ow, ch):
        cnt = _window_count(oh, ow, G)
        s = acc[n, oh, ow, ch]
        half = tirx.truncdiv(cnt, 2)
        r = tirx.Select(s > 0, tirx.truncdiv(s + half, cnt), tirx.truncdiv(s - half, cnt))
        return qmath.clamp(r, -128, 127).astype("int8")
    return te.compute(ty.shape, body, name="avgpool")


@lower_rule("max_pool2d")
def lower_max_pool(k, node, xs):
    if not quantized(k, node):
        return None                          # float: the op's TE compute
    x = xs[0]
    tx, ty, G = _pool_common(k, node)
    kh = te.reduce_axis((0, G["KH"]), "kh")
    kw = te.reduce_axis((0, G["KW"]), "kw")
    if tx.quant != ty.quant:
        k.fail("int8 max_pool2d needs the same quantisation on input and output (TFLite)")
    lowest = tirx.const(-128, "int8") if tx.dtype == "int8" else tirx.min_value(tx.dtype)

    def tap(n, oh, ow, ch):
        h = oh * G["sh"] + kh
        w_ = ow * G["sw"] + kw
        v = x[n, h - G["pt"], w_ - G["pl"], ch]
        if G["pt"] or G["pb"] or G["pl"] or G["pr"]:
            return tirx.if_then_else(_inb(h, w_, G), v, lowest)
        return v
    # the window maximum accumulates in a scalar and is stored once (in-place safe: every read of
    # an output element's window happens before its store)
    acc = te.compute(ty.shape, lambda n, oh, ow, ch: te.max(tap(n, oh, ow, ch), axis=[kh, kw]), name="acc")
    return te.compute(ty.shape, lambda *i: acc(*i), name="maxpool")


# ---- int16 ----------------------------------------------------------------------------------------
# TFLite's 16x8 kernels: int16 input (zero point 0), int8 symmetric weights, int64 bias, an int64
# accumulator, the int64 MultiplyByQuantizedMultiplier (a 16-bit multiplier and one rounding shift;
# frontend/ops/int16util.mbqm64), the int16 activation clamp. Dense requantises as LiteRT's reference
# FULLY_CONNECTED does for int8 too (round(double(acc) * eff), kiln_fc_s8 in kiln_intrinsics.h, whose
# clamp bounds are any int32 pair).
I64 = "int64"
U64 = "uint64"


def _check_16x8(k, node):
    tx, tw, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
    if tx.quant is None or ty.dtype != "int16" or ty.quant is None or tw.dtype != "int8" or tw.quant is None:
        k.fail(f"16x8 {node.op} needs a quantised int16 input and output and int8 weights, got {tx}, {tw}, {ty}")
    if any(z != 0 for z in tw.quant.zero_point) or _zp(tx) != 0:
        k.fail("16x8 kernels need symmetric weights and an input zero point of 0 (TFLite)")
    return tx, tw, ty


def _bias64(k, node, n):
    """ch -> int64 bias expression, from the compile-time int64 (or int32) bias, or None: int32
    constants when every value fits, else high and low 32-bit halves."""
    if len(node.inputs) < 3:
        return None
    b = k.value(node.inputs[2])
    if b is None:
        k.fail("16x8 conv2d/dense needs a constant bias")
    b = np.asarray(b, np.int64).reshape(-1)
    if np.abs(b).max(initial=0) < 2 ** 31:
        t = k.const("bias32", b.astype(np.int32))
        return lambda ch: t[ch].astype(I64)
    hi = k.const("bias_hi", (b >> 32).astype(np.int32))
    lo = k.const("bias_lo", (b & 0xFFFFFFFF).astype(np.uint32))
    return lambda ch: hi[ch].astype(I64) * tirx.const(1 << 32, I64) + lo[ch].astype(I64)


def requant16_epilogue(k, acc, mult, shift, ty, channels_of, act):
    """acc (int64) -> int16: the int64 MultiplyByQuantizedMultiplier per channel + zero point,
    activation clamp."""
    red = np.where(mult < 0x7FFF0000, (mult.astype(np.int64) + (1 << 15)) >> 16, 0x7FFF).astype(np.int32)
    total = (15 - shift.astype(np.int64)).astype(np.int32)
    zy = _zp(ty)
    lo, hi = qmath.activation_range(act, _scale(ty), zy, -32768, 32767)
    if len(set(red.tolist())) == 1 and len(set(total.tolist())) == 1:
        r0, t0 = int(red[0]), int(total[0])
        rm, ts = (lambda ch: c(r0, I64)), (lambda ch: c(t0, I64))
    else:
        tr, tt_ = k.const("rq_mult16", red), k.const("rq_shift16", total)
        rm, ts = (lambda ch: tr[ch].astype(I64)), (lambda ch: tt_[ch].astype(I64))

    def body(*idx):
        ch = channels_of(idx)
        sh = ts(ch)
        # modulo 2^64 (uint64: C defines the wrap the compiled TFLite's int64 product does past
        # |acc| * m16 = 2^63), read back as int64 for the arithmetic shift, then TFLite's int32_t result:
        # the low 32 bits (frontend/ops/int16util.wrap32), the zero point and the clamp in int32
        u = acc(*idx).astype(U64) * rm(ch).astype(U64) + (c(1, U64) << (sh.astype(U64) - c(1, U64)))
        v = (tirx.reinterpret(I64, u) >> sh).astype("int32")
        return tirx.max(tirx.min(v + c(zy), c(hi)), c(lo)).astype("int16")
    return te.compute(acc.shape, body, name="requant16")


def lower_conv2d_16x8(k, node, xs):
    a = node.attrs
    x, w = xs[0], xs[1]
    tx, tw, ty = _check_16x8(k, node)
    G = conv_geometry(tx.shape, tw.shape, a)
    I, O, Og = G["I"], G["O"], G["O"] // G["g"]
    k.inplace_hints_of_op()
    zero = tirx.const(0, tx.dtype)
    xp = te.compute((G["N"], G["H"] + G["pt"] + G["pb"], G["W"] + G["pl"] + G["pr"], G["C"]),
                    lambda n, h, ww, ch: tirx.if_then_else(_inb(h, ww, G), x[n, h - G["pt"], ww - G["pl"], ch], zero),
                    name="pad") if (G["pt"] or G["pb"] or G["pl"] or G["pr"]) else x
    kh = te.reduce_axis((0, G["KH"]), "kh")
    kw = te.reduce_axis((0, G["KW"]), "kw")
    kc = te.reduce_axis((0, I), "kc")
    sh, sw, dh, dw = G["sh"], G["sw"], G["dh"], G["dw"]

    # int32 accumulation where the sum provably fits (constant weights: sum |w| * 32768 < 2^31; the
    # value is the same as TFLite's int64 accumulator), int64 otherwise
    wv = k.value(node.inputs[1])
    wide = wv is None or (np.abs(np.asarray(wv, np.int64)).reshape(O, -1).sum(axis=1) * 32768).max() >= 2 ** 31
    adt = I64 if wide else "int32"

    def term(xv, wv_):
        return xv.astype("int32").astype(adt) * wv_.astype("int32").astype(adt)
    acc = te.compute((G["N"], G["oh"], G["ow"], O), lambda n, oh, ow, o: te.sum(
        term(xp[n, oh * sh + kh * dh, ow * sw + kw * dw, (o // Og) * I + kc], w[o, kh, kw, kc]),
        axis=[kh, kw, kc]), name="acc")
    if not wide:
        acc = te.compute(acc.shape, lambda *i: acc(*i).astype(I64), name="acc64")
    bias = _bias64(k, node, O)
    if bias is not None:
        acc = te.compute(acc.shape, lambda n, oh, ow, o: acc[n, oh, ow, o] + bias(o), name="bias")
    mult, shift = qmath.linear_requant(tx, tw, ty, O)
    return requant16_epilogue(k, acc, mult, shift, ty, lambda idx: idx[3], a["activation"])


def dense16_bias(k, node, K, N):
    """The 16x8 dense's int64 bias [N] (zeros without one) where its int32 accumulator is shown to
    fit: constant weights and bias with sum |w| * 32768 + |b| < 2^31 per channel (the CUDA rule
    keeps int32 only; the C rule below widens to int64); fails otherwise."""
    b, bound = _dense16_bound(k, node, N)
    if bound >= 2 ** 31:
        k.fail(f"16x8 dense: the accumulator may reach {bound} (K = {K}), beyond the int32 this "
               f"kernel keeps it in; run the model on the C backend, split the layer or use int8 activations")
    return b


def _dense16_bound(k, node, N):
    """(int64 bias [N], the largest |acc| any int16 input can give) of a 16x8 dense."""
    wv = k.value(node.inputs[1])
    b = k.value(node.inputs[2]) if len(node.inputs) == 3 else np.zeros(N, np.int64)
    if wv is None or b is None:
        k.fail("16x8 dense needs constant weights and bias")
    b = np.asarray(b, np.int64).reshape(-1)
    return b, int((np.abs(np.asarray(wv, np.int64)).sum(axis=1) * 32768 + np.abs(b)).max(initial=0))


def lower_dense_16x8(k, node, xs):
    """16x8 FULLY_CONNECTED. The accumulator is int32 when every |acc| is bounded at compile time
    (constant weights and bias, |x| <= 32768) below 2^31, where LiteRT's int64 accumulator holds
    the same value, and ``kiln_fc_rq`` (kiln_intrinsics.h) gives round(double(acc) * eff) exactly;
    otherwise (long inputs, large biases) it is int64 as LiteRT's and ``_fc_rq_double`` requantises."""
    x, w = xs[0], xs[1]
    tx, tw, ty = _check_16x8(k, node)
    K, N, lead = tx.shape[-1], tw.shape[0], tx.shape[:-1]
    b, bound = _dense16_bound(k, node, N)
    wide = bound >= 2 ** 31
    at = I64 if wide else "int32"
    kk = te.reduce_axis((0, K), "k")
    acc = te.compute(lead + (N,), lambda *i: te.sum(
        x[i[:-1] + (kk,)].astype("int32").astype(at) * w[i[-1], kk].astype("int32").astype(at), axis=[kk]), name="acc")
    if len(node.inputs) == 3 and wide:
        bias = _bias64(k, node, N)     # modulo 2^64, as LiteRT's int64 acc += bias wraps
        acc = te.compute(acc.shape, lambda *i: tirx.reinterpret(I64, acc(*i).astype("uint64") + bias(i[-1])
                                                                .astype("uint64")), name="bias")
    elif len(node.inputs) == 3:
        tb = k.const("bias32", b.astype(np.int32))
        acc = te.compute(acc.shape, lambda *i: acc(*i) + tb[i[-1]], name="bias")
    s_in, _ = per_tensor(tx, "input", "dense")
    s_out, zy = per_tensor(ty, "output", "dense")
    ws, _, _ = channel_params(tw, N, "dense")
    if fixed_requant(node.attrs):
        return _dense16_fixed(k, node, acc, wide, ty)
    eff = fc_effective_scales(s_in, ws, s_out)
    lo, hi = qmath.activation_range(node.attrs["activation"], s_out, zy, -32768, 32767)
    mh, ml, sh = fc_requant_constants(eff)
    tmh, tml, tsh = (k.const("fc_mh", mh.astype(np.int32)), k.const("fc_ml", ml.astype(np.uint32)),
                     k.const("fc_s", sh.astype(np.int32)))
    one = len(set(zip(mh.tolist(), ml.tolist(), sh.tolist()))) == 1
    if wide:
        return _fc_rq_double(acc, lambda ch: (tmh[ch], tml[ch], tsh[ch]), one, zy, lo, hi)

    def body(*idx):
        ch = 0 if one else idx[-1]
        return tirx.call_extern("int32", "kiln_fc_s8", acc(*idx), tmh[ch].astype("uint32"), tml[ch], tsh[ch],
                                c(zy), c(lo), c(hi)).astype("int16")
    return te.compute(acc.shape, body, name="requant16")


def _dense16_fixed(k, node, acc, wide, ty):
    """TensorFlow Lite Micro's 16x8 FULLY_CONNECTED requantisation (the node's requant "fixed";
    frontend/ops/nn.py: _dense16_fixed): with an int32 bias an int32 accumulator (wrapping) and
    the int32 MultiplyByQuantizedMultiplier (``qmath.mbqm``, as the int8 conv), otherwise the int64
    one with the reduced multiplier (``requant16_epilogue``, as the 16x8 conv)."""
    N = ty.shape[-1]
    mult, shift = qmath.linear_requant(k.type(node.inputs[0]), k.type(node.inputs[1]), ty, N)
    if len(node.inputs) < 3 or k.type(node.inputs[2]).dtype != "int32":
        acc64 = te.compute(acc.shape, lambda *i: acc(*i).astype(I64), name="acc64") if not wide else acc
        return requant16_epilogue(k, acc64, mult, shift, ty, lambda idx: idx[-1], node.attrs["activation"])
    acc32 = te.compute(acc.shape, lambda *i: acc(*i).astype("int32"), name="acc32") if wide else acc
    zy = _zp(ty)
    lo, hi = qmath.activation_range(node.attrs["activation"], _scale(ty), zy, -32768, 32767)
    tm = k.const("mult", mult)
    rs = k.const("rshift", np.maximum(-shift, 0).astype(np.int32))
    ls = k.const("lshift", np.maximum(shift, 0).astype(np.int32)) if (shift > 0).any() else None

    def body(*idx):
        ch = idx[-1]
        v = qmath.mbqm(acc32(*idx), tm[ch], (None if ls is None else ls[ch], rs[ch]))
        return qmath.clamp(v + c(zy), lo, hi).astype("int16")
    return te.compute(acc.shape, body, name="requant16")


def _fc_rq_double(acc, consts, one, zy, lo, hi):
    """int64 acc -> int16: LiteRT's ``(int32_t)round((double)acc * eff)`` (frontend/ops/nn.
    fc_requantize) in IEEE double (the FPU, or libgcc's correctly rounded soft float on cores
    without one), the int32 saturation, the zero point and the activation clamp. ``eff`` is
    rebuilt exactly from its 53-bit significand and exponent (``fc_requant_constants``: (mh * 2^32
    + ml) / 2^s, divisions by powers of two). C's round is formed without libm and without a
    subtraction GCC could contract into an FMA: t = trunc(v), then t +- 1 where v lies at least
    half-way to the next integer (t +- 0.5 is exact below 2^52; v is clamped to about +-2^40 first,
    as C prints the bound: any bound in [2^32, 2^52) is lost in the int32 saturation)."""
    F = "float64"
    big = tirx.const(2.0 ** 40, F)

    def pow2(e):
        return (c(1, I64) << e.astype(I64)).astype(F)

    def body(*idx):
        mh, ml, s = consts(0 if one else idx[-1])
        m = ((mh.astype(I64) << c(32, I64)) + ml.astype(I64)).astype(F)
        # s > 124 (eff < 2^-71) would give 0 for every int64 acc either way
        eff = m / pow2(tirx.min(s, c(62))) / pow2(tirx.min(tirx.max(s - c(62), c(0)), c(62)))
        v = tirx.max(tirx.min(acc(*idx).astype(F) * eff, big), -big)

        def rounded(vv):
            return qmath.let("t", vv.astype(I64), lambda t: qmath.let("tf", t.astype(F), lambda tf: (
                t + tirx.Select(vv >= tf + tirx.const(0.5, F), c(1, I64), c(0, I64))
                - tirx.Select(vv <= tf - tirx.const(0.5, F), c(1, I64), c(0, I64))), F), I64)
        r = qmath.let("fv", v, rounded, F)
        r = tirx.max(tirx.min(r, c(2 ** 31 - 1, I64)), c(-2 ** 31, I64)) + c(zy, I64)
        return tirx.max(tirx.min(r, c(hi, I64)), c(lo, I64)).astype("int16")
    return te.compute(acc.shape, body, name="requant16")


def avg_pool_16(k, acc, tx, ty, G):
    if tx.quant != ty.quant:
        k.fail("int16 avg_pool2d needs the same quantisation on input and output (TFLite)")

    def body(n, oh, ow, ch):
        cnt = _window_count(oh, ow, G)
        s = acc[n, oh, ow, ch]
        half = tirx.truncdiv(cnt, 2)
        r = tirx.Select(s > 0, tirx.truncdiv(s + half, cnt), tirx.truncdiv(s - half, cnt))
        return qmath.clamp(r, -32768, 32767).astype("int16")
    return te.compute(ty.shape, body, name="avgpool")
