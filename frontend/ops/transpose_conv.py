"""``transpose_conv2d``: TFLite's TRANSPOSE_CONV (float and int8), bias and activation fused.

It computes ``conv2d_grad_input`` (frontend/ops/nn.py: the transposed convolution) with TFLite's
filter layout [C_out, KH, KW, C_in] (the forward conv's OHWI weights are its axes 0 and 3
swapped), then the bias and the fused activation. The padding is the forward conv's on
``output_shape`` (TFLite's ``ComputePaddingHeightWidth``), so the input must be the size that
conv produces (``ceil(out / stride)`` for SAME, ``(out - K) // stride + 1`` for VALID), as
TFLite's Prepare checks. int8: ``reference_integer_ops::TransposeConv`` (int32 scatter of
``(x - z_x) * w``, + bias, per-channel ``MultiplyByQuantizedMultiplier`` with the conv's
multipliers, + z_out, activation clamp); symmetric filters, per tensor or per channel on axis 0.
"""
from __future__ import annotations

import numpy as np

from .. import fixedpoint as fp
from .. import functional as F
from .. import tflite_checks as chk
from ..errors import ShapeError
from ..registry import LINEAR, QUANTIZABLE, REQUIRED, Attr, defrule, get_op, register
from . import tflite_util as tfl
from ._util import tt
from .int8util import channel_params, clamp8, int8_io, need_int8
from .int16util import clamp16, int16_branch, int16_io, mbqm64, symmetric16
from .nn import ACT, act_grad, apply_act, conv2d_grad_input_ref, conv_geometry, conv_macs, requantize_params

NAME = "TRANSPOSE_CONV"


# ---- transpose_conv2d: TFLite's TRANSPOSE_CONV with its bias and activation fused -------------------
TC = {"stride": Attr("ints", (1, 1)), "padding": Attr("str", "same", ("same", "valid")),
      "output_shape": Attr("ints", REQUIRED), "activation": ACT}


def cgi_attrs(a):
    return {"stride": list(a["stride"]), "padding": a["padding"], "dilation": [1, 1], "groups": 1,
            "input_shape": list(a["output_shape"])}


def _tc_infer(ts, a):
    x, w = ts[0], ts[1]
    if len(w.shape) != 4 or len(x.shape) != 4 or w.shape[3] != x.shape[3]:
        raise ShapeError(f"transpose_conv2d: input {x} and filter {w} do not fit ([N, h, w, C_in], "
                         f"[C_out, KH, KW, C_in])")
    G = conv_geometry(tuple(a["output_shape"]), (w.shape[3], w.shape[1], w.shape[2], w.shape[0]), cgi_attrs(a))
    if (G["N"], G["oh"], G["ow"]) != tuple(x.shape[:3]) or G["C"] != w.shape[0]:
        raise ShapeError(f"transpose_conv2d: input {list(x.shape)} is not what a {a['padding']} conv of the "
                         f"output {a['output_shape']} gives ([{G['N']}, {G['oh']}, {G['ow']}, ...])")
    if len(ts) == 3 and ts[2].shape != (w.shape[0],):
        raise ShapeError(f"transpose_conv2d: bias must have shape ({w.shape[0]},), got {ts[2].shape}")
    return tt(a["output_shape"], x.dtype)


def _ohwi(w):
    return np.ascontiguousarray(np.transpose(w, (3, 1, 2, 0)))


def _tc_ref(xs, a):
    y = conv2d_grad_input_ref(xs[0], _ohwi(xs[1]), cgi_attrs(a))
    if len(xs) == 3:
        y = y + xs[2]
    return apply_act(y, a["activation"]).astype(xs[0].dtype, copy=False)


def _tc_vjp(n, xs, y, gy):
    x, w = xs[:2]
    g = act_grad(gy, y, n.attrs["activation"])
    ca = {k: v for k, v in cgi_attrs(n.attrs).items() if k != "input_shape"}
    w_ohwi = F.transpose(w, [3, 1, 2, 0])
    gw = F.transpose(F.conv2d_grad_weight(g, x, w_ohwi.shape, **ca), [3, 1, 2, 0])
    out = [F.conv2d(g, w_ohwi, None, **ca), gw]
    if len(xs) == 3:
        out.append(F.sum(g, [0, 1, 2]))
    return out


register("transpose_conv2d", attrs=TC, infer=_tc_infer, ref=_tc_ref, vjp=_tc_vjp, props={LINEAR, QUANTIZABLE},
         doc="TFLite TRANSPOSE_CONV: x [N, h, w, C_in], filter [C_out, KH, KW, C_in], optional bias [C_out], "
             "output_shape, fused activation")


@defrule("transpose_conv2d", "macs")
def _tc_macs(ts, out, a):
    return conv_macs(ts[0].shape, (ts[1].shape[3], ts[1].shape[1], ts[1].shape[2], ts[1].shape[0]))


@defrule("transpose_conv2d", "te")
def _tc_te(T, xs, a, out):
    x, w = xs[:2]
    O, KH, KW, I = T.shape(w)
    wt = T.te.compute((I, KH, KW, O), lambda i, kh, kw, o: w[o, kh, kw, i], name="tc_ohwi")
    y = get_op("conv2d_grad_input").te(T, [x, wt], cgi_attrs(a), out)
    b = xs[2] if len(xs) == 3 else None

    def epi(n, h, wp, o):
        v = y[n, h, wp, o]
        if b is not None:
            v = v + T.cast(b[o], T.dt(v))
        return T.cast(T.act(v, a["activation"]), out.dtype)
    return T.te.compute(out.shape, epi, name="transpose_conv2d")


@defrule("transpose_conv2d", "int8_ref")
def transpose_conv2d_int8(xs, attrs, in_types, out_type):
    """TFLite's reference_integer_ops::TransposeConv: sum (x - z_x) * w in int32 over the
    scattered taps, + bias, per-channel MultiplyByQuantizedMultiplier, + z_out, activation clamp."""
    (s_in, z_in), (s_out, z_out) = int8_io(in_types[:1], out_type, "transpose_conv2d")
    O = in_types[1].shape[0]
    ws, wz, _ = channel_params(in_types[1], O, "transpose_conv2d")
    if np.any(wz != 0):
        raise ShapeError("transpose_conv2d: TFLite's int8 TRANSPOSE_CONV needs symmetric filters (zero point 0)")
    acc = conv2d_grad_input_ref(xs[0].astype(np.int64) - z_in, _ohwi(xs[1].astype(np.int64)), cgi_attrs(attrs))
    if len(xs) == 3:
        acc = acc + xs[2].astype(np.int64)
    mult, shift = requantize_params(s_in, ws, s_out)
    y = fp.multiply_by_quantized_multiplier(acc, mult, shift) + z_out
    lo, hi = fp.activation_range(attrs["activation"], s_out, z_out)
    return clamp8(y, lo, hi)


def _output_shape(imp, k, i, out):
    """TRANSPOSE_CONV's output_shape: the constant, or (a tensor computed at run time, e.g. a graph
    input) the output tensor's static shape, which is all TFLite Micro reads."""
    t = imp.tensors[i]
    if i in imp.folded or t["data"] is not None:
        return [int(v) for v in np.ravel(imp.const(i, k, NAME, "output_shape"))]
    if t["dtype"] not in ("int32", "int64") or list(t["shape"]) != [4]:
        raise imp.err(f"{tfl.where(k, NAME)}: output_shape {imp.label(i)} is {t['dtype']}{list(t['shape'])}; "
                      f"TFLite needs an int32 tensor of 4 values")
    return [int(v) for v in imp.tensors[out]["shape"]]


@tfl.importer(NAME)
def _tfl_transpose_conv(imp, k, op, ins, out):
    w = tfl.where(k, NAME)
    tfl.need(imp, k, NAME, ins, 3, 4, optional=(3,))
    o = tfl.options(imp, k, op, NAME, "TransposeConvOptions")
    if o is None:
        raise imp.err(f"{w} has no TransposeConvOptions (TFLite then reads strides of 0 and rejects it)")
    attrs = tfl.window_attrs(imp, k, name=NAME, o=o, dilated=False)
    attrs["activation"] = tfl.activation(imp, k, NAME, o.FusedActivationFunction())
    attrs["output_shape"] = _output_shape(imp, k, ins[0], out)
    filt = imp.const(ins[1], k, NAME, "the filter")
    x = imp.operand(ins[2], k, NAME)
    xt, ft = imp.g.types[x], imp.tensors[ins[1]]
    want = "float32" if xt.dtype == "float32" else "int8"
    if ft["dtype"] != want:
        raise imp.err(f"{w}: a {xt.dtype} input with a {ft['dtype']} filter; TFLite needs a {want} filter")
    has_bias = len(ins) == 4 and ins[3] >= 0
    if len(attrs["output_shape"]) != 4 or filt.ndim != 4:
        raise imp.err(f"{w}: output_shape {attrs['output_shape']} and filter {list(filt.shape)} must be 4-D")
    if xt.dtype == "int16":
        symmetric16(imp.err, w, [("the input", xt.quant), ("the output", imp.tensors[out]["quant"])])
    if xt.dtype in ("int8", "int16"):
        chk.conv_quant(imp.err, w, xt.quant, ft["quant"], imp.tensors[ins[3]]["quant"] if has_bias else None,
                       imp.tensors[out]["quant"], filt.shape, filt.shape[0], attrs["activation"], lambda axis: axis == 0)
    wname = imp._vname(ft["name"])
    imp.g.add_const(wname, filt, ft["quant"])
    inputs = [x, wname]
    if has_bias:
        inputs.append(tfl.bias(imp, k, NAME, [ins[0], ins[1], ins[3]], xt.dtype, filt.shape[0]))
    imp.values[out] = imp.emit(k, NAME, "transpose_conv2d", inputs, attrs, out)


@tfl.exporter("transpose_conv2d", versions={NAME: 3})
def _tfl_export_tc(e, n, act, out, int8):
    a = n.attrs
    oshape = e.const(n.name + "/output_shape", np.asarray(a["output_shape"], np.int32))
    ins = [e.value(v) for v in n.inputs]
    e.op(NAME, [oshape, ins[1], ins[0]] + ins[2:], [e.tensor(out, e.g.types[out])], "TransposeConvOptions", int8,
         Padding=tfl.PAD_CODES[a["padding"]], StrideW=a["stride"][1], StrideH=a["stride"][0],
         FusedActivationFunction=tfl.ACT_CODES[a["activation"]])


# ---- int16 ----------------------------------------------------------------------------------------
def transpose_conv2d_int16(xs, attrs, in_types, out_type):
    """reference_integer_ops::TransposeConv, 16x8 (TFLite Micro): int16 input (zero point 0), int8
    symmetric filter, the scatter of ``x * w`` accumulated in int64, + the int64 (or int32/int16)
    bias, the int64 ``MultiplyByQuantizedMultiplier`` with the conv's per-channel multipliers, clamp."""
    (s_in, _), (s_out, z_out) = int16_io(in_types[:1], out_type, "transpose_conv2d")
    need_int8(in_types[1], "filter", "transpose_conv2d")
    O = in_types[1].shape[0]
    ws, wz, _ = channel_params(in_types[1], O, "transpose_conv2d")
    if np.any(wz != 0):
        raise ShapeError("transpose_conv2d: TFLite's 16x8 TRANSPOSE_CONV needs symmetric filters (zero point 0)")
    acc = conv2d_grad_input_ref(xs[0].astype(np.int64), _ohwi(xs[1].astype(np.int64)), cgi_attrs(attrs))
    acc = np.asarray(acc).astype(np.int64)
    if len(xs) == 3:
        acc = acc + np.asarray(xs[2]).astype(np.int64)
    mult, shift = requantize_params(s_in, ws, s_out)
    lo, hi = fp.activation_range(attrs["activation"], s_out, z_out, -32768, 32767)
    return clamp16(mbqm64(acc, mult, shift) + z_out, lo, hi)


int16_branch("transpose_conv2d", transpose_conv2d_int16)
