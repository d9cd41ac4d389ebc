"""Small hand-built .tflite models for import tests (through the serialiser of Kiln's exporter),
and in-place field patches of a model's bytes (through the mutation campaign's FieldMap)."""
from __future__ import annotations

import struct

import numpy as np

from kiln.frontend import Graph, QParams
from kiln.quantize.tflite_export import _Exporter
from tests.frontend.tflite_mutants import KINDS, FieldMap


class Builder:
    """``b.tensor(...)`` returns a tensor index, ``b.op(...)`` adds an operator, ``b.build(ins, outs)``
    gives the flatbuffer bytes. Options are given by their schema field names (CamelCase)."""

    def __init__(self, name="test"):
        self.e = _Exporter(Graph(name))

    def tensor(self, name, shape, dtype="float32", data=None, scale=None, zero_point=0, axis=None):
        q = None
        if scale is not None:
            scales = tuple(float(np.float32(s)) for s in np.atleast_1d(scale))
            zps = tuple(int(z) for z in np.broadcast_to(np.atleast_1d(zero_point), (len(scales),)))
            q = QParams(scales, zps, axis if len(scales) > 1 or axis is not None else None)
        self.e.tensors.append(dict(name=name, shape=tuple(shape), dtype=dtype, quant=q,
                                   data=None if data is None else np.asarray(data, dtype).reshape(shape)))
        return len(self.e.tensors) - 1

    def op(self, opname, inputs, outputs, options=None, int8=False, **fields):
        self.e.op(opname, inputs, outputs, options, int8, **fields)

    def build(self, inputs, outputs) -> bytes:
        self.e.inputs, self.e.outputs = list(inputs), list(outputs)
        return self.e.build()


def field(buf: bytes, what: str):
    """(position, struct format) of the field the campaign's FieldMap calls ``what``, e.g.
    'tensor 3.zero_point[0]', 'operator 0.opcode_index', 'tensor 2.scale length'."""
    fm = FieldMap(buf)
    for kind in KINDS:
        for entry in fm.f[kind]:
            if kind != "weights" and entry[2] == what:
                return entry[0], entry[1]
    raise KeyError(f"no field {what!r} in this model")


def patch(buf: bytes, what: str, value) -> bytes:
    """buf with field ``what`` overwritten in place by ``value``."""
    pos, fmt = field(buf, what)
    b = bytearray(buf)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


def option_pos(buf: bytes, op_index: int, slot: int) -> int:
    """Byte position of field ``slot`` (vtable offset, e.g. 12 for Conv2DOptions.dilation_w) in
    operator ``op_index``'s builtin options table (the field must be present)."""
    import tflite
    op = tflite.Model.GetRootAs(buf, 0).Subgraphs(0).Operators(op_index)
    tab = op.BuiltinOptions()
    o = struct.unpack_from("<H", buf, tab.Pos - struct.unpack_from("<i", buf, tab.Pos)[0] + slot)[0]
    if not o:
        raise KeyError(f"operator {op_index} options have no field at slot {slot}")
    return tab.Pos + o


def int8_conv_model(out_scale=0.05, w_zp=0, act=0, depthwise=False, stride=1, dilation=1, bias=True, relu=False,
                    seed=0):
    """input int8[1,8,8,4] -> CONV_2D (or DEPTHWISE_CONV_2D) 3x3 SAME, per-channel int8 filters,
    int32 bias -> int8 output (``relu``: then a RELU, operator 1, into tensor 4). Tensor indices:
    0 input, 1 filter, 2 bias, 3 output."""
    rng = np.random.default_rng(seed)
    b = Builder("conv")
    O = 4
    ws = rng.uniform(0.005, 0.02, O)
    x = b.tensor("x", (1, 8, 8, 4), "int8", scale=0.1, zero_point=3)
    wshape = (1, 3, 3, O) if depthwise else (O, 3, 3, 4)
    w = b.tensor("w", wshape, "int8", rng.integers(-127, 128, wshape), scale=ws, zero_point=w_zp,
                 axis=3 if depthwise else 0)
    bi = b.tensor("b", (O,), "int32", rng.integers(-500, 500, O), scale=0.1 * ws, zero_point=0, axis=0)
    y = b.tensor("y", (1, 8 // stride, 8 // stride, O), "int8", scale=out_scale, zero_point=-5)
    common = dict(Padding=0, StrideW=stride, StrideH=stride, DilationWFactor=dilation, DilationHFactor=dilation,
                  FusedActivationFunction=act)
    ins = [x, w, bi] if bias else [x, w]
    if depthwise:
        b.op("DEPTHWISE_CONV_2D", ins, [y], "DepthwiseConv2DOptions", True, DepthMultiplier=1, **common)
    else:
        b.op("CONV_2D", ins, [y], "Conv2DOptions", True, **common)
    if relu:
        r = b.tensor("r", (1, 8 // stride, 8 // stride, O), "int8", scale=out_scale, zero_point=-5)
        b.op("RELU", [y], [r], None, True)
        return b.build([x], [r])
    return b.build([x], [y])
