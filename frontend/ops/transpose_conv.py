"""TFLite's TRANSPOSE_CONV (float) as Kiln's ``conv2d_grad_input`` (frontend/ops/nn.py), which is
the same computation: the transposed convolution of the input by the filter.

TFLite's filter is [C_out, KH, KW, C_in]; ``conv2d_grad_input`` takes the forward conv's OHWI
weights [C_in, KH, KW, C_out] (its output channels are the transposed conv's input channels), so
the importer transposes axes 0 and 3 and the exporter transposes them back. The padding is the
forward conv's on ``output_shape`` (TFLite's ``ComputePaddingHeightWidth``), so Kiln imports the
models whose input size is what that conv produces (``ceil(out / stride)`` for SAME,
``(out - K) // stride + 1`` for VALID: what the converter writes for Keras' Conv2DTranspose).
The optional bias becomes an ``add``, a fused RELU / RELU6 a ``relu`` / ``relu6`` node.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from . import nn  # noqa: F401  (registers conv2d_grad_input, which this module exports)
from . import tflite_util as tfl

NAME = "TRANSPOSE_CONV"


@tfl.importer(NAME)
def _tfl_transpose_conv(imp, k, op, ins, out):
    w = tfl.where(k, NAME)
    tfl.need(imp, k, NAME, ins, 3, 4, optional=(3,))
    o = tfl.options(imp, k, op, NAME, "TransposeConvOptions")
    if o is None:
        raise imp.err(f"{w} has no TransposeConvOptions (TFLite then reads strides of 0 and rejects it)")
    attrs = tfl.window_attrs(imp, k, name=NAME, o=o, dilated=False)
    act = tfl.activation(imp, k, NAME, o.FusedActivationFunction())
    shape = [int(v) for v in np.ravel(imp.const(ins[0], k, NAME, "output_shape"))]
    filt = imp.const(ins[1], k, NAME, "the filter")
    x = imp.operand(ins[2], k, NAME)
    xt = imp.g.types[x]
    if xt.dtype != "float32" or imp.tensors[ins[1]]["dtype"] != "float32":
        raise imp.err(f"{w}: Kiln imports float32 TRANSPOSE_CONV (input {xt.dtype}, filter "
                      f"{imp.tensors[ins[1]]['dtype']})")
    if len(shape) != 4 or filt.ndim != 4 or len(xt.shape) != 4 or filt.shape[3] != xt.shape[3] \
            or filt.shape[0] != shape[3]:
        raise imp.err(f"{w}: output_shape {shape}, filter {list(filt.shape)} and input {list(xt.shape)} do not fit "
                      f"(need [N, H, W, C_out], [C_out, KH, KW, C_in], [N, h, w, C_in])")
    wname = imp._vname(imp.tensors[ins[1]]["name"] + "_ohwi")
    imp.g.add_const(wname, np.ascontiguousarray(np.transpose(filt, (3, 1, 2, 0))))
    a = dict(attrs, input_shape=shape, dilation=[1, 1], groups=1)
    has_bias = len(ins) == 4 and ins[3] >= 0
    last = {"conv": not has_bias and act == "none", "bias": act == "none"}
    tname = imp.tensors[out]["name"]
    try:
        y = imp.emit(k, NAME, "conv2d_grad_input", [x, wname], a, out,
                     name=None if last["conv"] else imp._vname(tname + "_conv"))
    except ShapeError as e:
        raise imp.err(f"{w}: {e}") from None
    if has_bias:
        b = tfl.bias(imp, k, NAME, [ins[0], ins[1], ins[3]], "float32", shape[3])
        y = imp.emit(k, NAME, "add", [y, b], {}, out, name=None if last["bias"] else imp._vname(tname + "_bias"))
    imp.values[out] = imp.emit(k, NAME, act, [y], {}, out) if act != "none" else y


@tfl.exporter("conv2d_grad_input")
def _tfl_export_transpose_conv(e, n, act, out, int8):
    a = n.attrs
    if int8:
        raise tfl.ExportError(f"node {n.name!r}: Kiln exports float TRANSPOSE_CONV only")
    if a["padding"] not in tfl.PAD_CODES or a["dilation"] != [1, 1] or a["groups"] != 1:
        raise tfl.ExportError(f"node {n.name!r}: TRANSPOSE_CONV needs 'same'/'valid' padding, no dilation and no "
                              f"groups, got {a['padding']}, {a['dilation']}, {a['groups']}")
    g = e.g
    wv = g.consts.get(n.inputs[1], g.params.get(n.inputs[1]))
    if wv is None:
        raise tfl.ExportError(f"node {n.name!r}: TRANSPOSE_CONV needs constant weights")
    filt = e.const(n.inputs[1] + "/ohwi_to_tflite", np.ascontiguousarray(np.transpose(np.asarray(wv), (3, 1, 2, 0))))
    oshape = e.const(n.name + "/output_shape", np.asarray(a["input_shape"], np.int32))
    e.op(NAME, [oshape, filt, e.value(n.inputs[0])], [e.tensor(out, g.types[out])], "TransposeConvOptions", False,
         Padding=tfl.PAD_CODES[a["padding"]], StrideW=a["stride"][1], StrideH=a["stride"][0])

