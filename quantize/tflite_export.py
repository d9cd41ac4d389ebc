"""Export a Kiln graph (int8 as produced by the importer or PTQ/QAT, or float32) to a .tflite
flatbuffer with builtin ops, which LiteRT loads and runs bit-exactly like Kiln's int8 reference.

Layouts are converted back (depthwise ``[C*M, KH, KW, 1]`` -> ``[1, KH, KW, C*M]``, quantised
dimension 3). A ``relu``/``relu6`` node that only clamps (same quantisation as its input) right
after ADD, MUL, pooling or CONCATENATION is fused back into that op's ``fused_activation_function``.
Explicit conv padding becomes a PAD (filled with the zero point) followed by a VALID conv.
"""
from __future__ import annotations

import os

import flatbuffers
import numpy as np

from kiln.frontend.errors import GraphError, KilnError
from kiln.frontend.ops.nn import conv_geometry
from kiln.frontend.types import QParams, TensorType

_TYPE = {"float32": 0, "float16": 1, "int32": 2, "uint8": 3, "int64": 4, "bool": 6, "int16": 7, "int8": 9,
         "float64": 10}
_ACT = {"none": 0, "relu": 1, "relu6": 3}
_PAD = {"same": 0, "valid": 1}
# op versions LiteRT accepts for int8 kernels (float uses version 1)
_INT8_VERSION = {"CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 4, "ADD": 2, "MUL": 2,
                 "AVERAGE_POOL_2D": 2, "MAX_POOL_2D": 2, "SOFTMAX": 2, "QUANTIZE": 2, "DEQUANTIZE": 2, "PAD": 2,
                 "MEAN": 2, "CONCATENATION": 2, "LOGISTIC": 2, "TANH": 2, "RELU": 2, "RELU6": 2, "RESHAPE": 1}


class ExportError(KilnError):
    """A graph uses something the .tflite exporter cannot express."""


def _tfl():
    import tflite
    return tflite


def _table(b, name, **fields):
    """Build table ``name`` (a tflite schema table) with fields given by their schema names."""
    t = _tfl()
    getattr(t, f"{name}Start")(b)
    for k, v in fields.items():
        if v is not None:
            getattr(t, f"{name}Add{k}")(b, v)
    return getattr(t, f"{name}End")(b)


def _ivec(b, values, dtype=np.int32):
    return b.CreateNumpyVector(np.asarray(values, dtype).ravel())


def _offvec(b, offs):
    b.StartVector(4, len(offs), 4)
    for o in reversed(offs):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def _bytes16(b, data: bytes):
    """A ubyte vector aligned to 16 bytes (TFLite aligns buffer data)."""
    b.StartVector(1, len(data), 16)
    b.head = b.head - len(data)
    b.Bytes[b.head:b.head + len(data)] = data
    b.vectorNumElems = len(data)
    return b.EndVector()


class _Exporter:
    def __init__(self, graph):
        self.g = graph
        self.tensors = []          # dicts: name, shape, dtype, quant, data
        self.index = {}            # Kiln value -> tensor index
        self.ops = []              # (opname, inputs, outputs, options_name, options_fields)
        self.opcodes = {}          # opname -> index
        self.int8_ops = set()      # opnames used with int8 tensors (need newer op versions)

    # ---- tensors --------------------------------------------------------------------------
    def tensor(self, name, ttype: TensorType, data=None):
        if name in self.index:
            return self.index[name]
        if ttype.dtype not in _TYPE:
            raise ExportError(f"value {name!r}: dtype {ttype.dtype} has no TFLite tensor type")
        self.tensors.append(dict(name=name, shape=ttype.shape, dtype=ttype.dtype, quant=ttype.quant, data=data))
        self.index[name] = len(self.tensors) - 1
        return self.index[name]

    def value(self, v):
        """Tensor index of Kiln value v (constants get their data)."""
        if v in self.index:
            return self.index[v]
        g = self.g
        data = g.consts.get(v, g.params.get(v))
        return self.tensor(v, g.types[v], None if data is None else np.asarray(data))

    def const(self, name, arr, quant=None):
        arr = np.asarray(arr)
        return self.tensor(self._fresh(name), TensorType(arr.shape, arr.dtype.name, quant), arr)

    def _fresh(self, base):
        name, i = base, 1
        while name in self.index:
            name = f"{base}_{i}"
            i += 1
        return name

    def op(self, opname, inputs, outputs, options=None, int8=False, **fields):
        self.opcodes.setdefault(opname, len(self.opcodes))
        if int8:
            self.int8_ops.add(opname)
        self.ops.append((opname, list(inputs), list(outputs), options, fields))

    # ---- graph walk -----------------------------------------------------------------------
    def run(self):
        g = self.g
        cons = g.consumers()
        fused = {}                  # node name -> (activation, the relu node that carries the output)
        skip = set()
        for n in g.nodes:
            if n.op in ("relu", "relu6"):
                src = g.producer(n.inputs[0])
                if (src is not None and src.op in ("add", "mul", "avg_pool2d", "max_pool2d", "concat")
                        and len(cons[src.name]) == 1 and src.name not in g.outputs and src.name not in fused
                        and g.types[src.name].quant == g.types[n.name].quant
                        and g.types[src.name].dtype == g.types[n.name].dtype):
                    fused[src.name] = (n.op, n.name)
                    skip.add(n.name)
        for i in g.inputs:
            self.value(i)
        for n in g.nodes:
            if n.name in skip:
                continue
            act, out = fused.get(n.name, ("none", n.name))
            self.node(n, act, out)
        self.inputs = [self.index[i] for i in g.inputs]
        self.outputs = [self.value(o) for o in g.outputs]

    def node(self, n, act, out):
        g = self.g
        ot = g.types[out]
        int8 = ot.quant is not None or any(g.types[i].quant is not None for i in n.inputs)
        a = n.attrs
        op = n.op
        if op == "conv2d":
            self.conv(n, self.tensor(out, ot), int8)
            return
        xs = [self.value(i) for i in n.inputs]
        y = self.tensor(out, ot)
        if op == "dense":
            x_t = g.types[n.inputs[0]]
            self.op("FULLY_CONNECTED", xs, [y], "FullyConnectedOptions", int8,
                    FusedActivationFunction=_ACT[a["activation"]], KeepNumDims=len(x_t.shape) != 2)
        elif op in ("avg_pool2d", "max_pool2d"):
            if op == "avg_pool2d" and a.get("count_include_pad"):
                raise ExportError(f"node {n.name!r}: TFLite's AVERAGE_POOL_2D excludes padding (count_include_pad)")
            pad = a["padding"]
            if pad not in _PAD:
                raise ExportError(f"node {n.name!r}: pooling padding must be 'same' or 'valid' for TFLite, got {pad}")
            st = a["stride"] or a["pool"]
            self.op("AVERAGE_POOL_2D" if op == "avg_pool2d" else "MAX_POOL_2D", xs, [y], "Pool2DOptions", int8,
                    Padding=_PAD[pad], StrideW=st[1], StrideH=st[0], FilterWidth=a["pool"][1],
                    FilterHeight=a["pool"][0], FusedActivationFunction=_ACT[act])
        elif op in ("add", "mul"):
            self.op(op.upper(), xs, [y], "AddOptions" if op == "add" else "MulOptions", int8,
                    FusedActivationFunction=_ACT[act])
        elif op == "concat":
            axis = a["axis"] % len(ot.shape)
            self.op("CONCATENATION", xs, [y], "ConcatenationOptions", int8, Axis=axis,
                    FusedActivationFunction=_ACT[act])
        elif op == "reshape":
            shp = self.const(out + "/shape", np.asarray(ot.shape, np.int32))
            self.op("RESHAPE", xs + [shp], [y], "ReshapeOptions", int8, NewShape=list(ot.shape))
        elif op == "softmax":
            if a["axis"] % len(ot.shape) != len(ot.shape) - 1:
                raise ExportError(f"node {n.name!r}: TFLite's SOFTMAX works on the last axis")
            self.op("SOFTMAX", xs, [y], "SoftmaxOptions", int8, Beta=1.0)
        elif op == "quantize":
            self.op("QUANTIZE", xs, [y], "QuantizeOptions", True)
        elif op == "dequantize":
            self.op("DEQUANTIZE", xs, [y], "DequantizeOptions", True)
        elif op == "cast":
            self.op("CAST", xs, [y], None, False)
        elif op == "pad":
            it = g.types[n.inputs[0]]
            if a["value"] != 0.0:
                raise ExportError(f"node {n.name!r}: only zero padding exports (TFLite PAD)")
            p = np.asarray(a["pads"], np.int32).reshape(len(it.shape), 2)
            self.op("PAD", xs + [self.const(out + "/paddings", p)], [y], "PadOptions", int8)
        elif op == "mean":
            it = g.types[n.inputs[0]]
            axes = a["axes"] if a["axes"] is not None else list(range(len(it.shape)))
            self.op("MEAN", xs + [self.const(out + "/axes", np.asarray(axes, np.int32))], [y], "ReducerOptions",
                    int8, KeepDims=bool(a["keepdims"]))
        elif op in ("sigmoid", "tanh", "relu", "relu6"):
            name = {"sigmoid": "LOGISTIC", "tanh": "TANH", "relu": "RELU", "relu6": "RELU6"}[op]
            self.op(name, xs, [y], None, int8)
        else:
            raise ExportError(f"node {n.name!r}: op '{op}' has no TFLite builtin in Kiln's exporter")

    def conv(self, n, y, int8):
        g, a = self.g, n.attrs
        xt, wt = g.types[n.inputs[0]], g.types[n.inputs[1]]
        G = conv_geometry(xt.shape, wt.shape, a)
        is_dw = G["g"] > 1 and G["I"] == 1 and G["g"] == G["C"]
        xs = [self.value(i) if not (k == 1 and is_dw) else -1 for k, i in enumerate(n.inputs)]
        pad = a["padding"]
        if pad not in _PAD:
            # explicit padding: PAD with the zero point, then a VALID conv
            pads = [0, 0, G["pt"], G["pb"], G["pl"], G["pr"], 0, 0]
            q = xt.quant
            padded_t = TensorType((G["N"], G["H"] + G["pt"] + G["pb"], G["W"] + G["pl"] + G["pr"], G["C"]), xt.dtype, q)
            p = self.tensor(self._fresh(n.name + "/pad"), padded_t)
            self.op("PAD", [xs[0], self.const(n.name + "/paddings", np.asarray(pads, np.int32).reshape(4, 2))], [p],
                    "PadOptions", int8)
            xs = [p] + xs[1:]
            pad = "valid"
        common = dict(Padding=_PAD[pad], StrideW=a["stride"][1], StrideH=a["stride"][0],
                      DilationWFactor=a["dilation"][1], DilationHFactor=a["dilation"][0],
                      FusedActivationFunction=_ACT[a["activation"]])
        bias = xs[2:]
        if not bias and int8:
            # LiteRT's int8 conv kernels require a bias: add zeros with scale s_in * s_w[c]
            wq, s_in = wt.quant, xt.quant.scale[0]
            bq = QParams(tuple(float(np.float32(s_in) * np.float32(s)) for s in wq.scale), (0,) * len(wq.scale),
                         0 if len(wq.scale) > 1 else None)
            bias = [self.const(n.name + "/zero_bias", np.zeros(G["O"], np.int32), bq)]
        elif not bias and not is_dw:
            # TFLite's CONV_2D requires a bias in every dtype (its Prepare() checks has_bias)
            bias = [self.const(n.name + "/zero_bias", np.zeros(G["O"], xt.dtype))]
        if is_dw:
            w = np.asarray(g.consts.get(n.inputs[1], g.params.get(n.inputs[1])))
            q = wt.quant
            if q is not None and q.per_channel:
                q = QParams(q.scale, q.zero_point, 3)
            wi = self.const(n.inputs[1] + "/1hwo", np.ascontiguousarray(np.transpose(w, (3, 1, 2, 0))), q)
            self.op("DEPTHWISE_CONV_2D", [xs[0], wi] + bias, [y], "DepthwiseConv2DOptions", int8,
                    DepthMultiplier=G["O"] // G["C"], **common)
        else:
            self.op("CONV_2D", xs[:2] + bias, [y], "Conv2DOptions", int8, **common)

    # ---- serialisation --------------------------------------------------------------------
    def build(self) -> bytes:
        t = _tfl()
        b = flatbuffers.Builder(1024)
        # buffers: 0 is the empty sentinel
        buf_offs = [_table(b, "Buffer")]
        tensor_buf = []
        for td in self.tensors:
            if td["data"] is None:
                tensor_buf.append(0)
                continue
            arr = np.ascontiguousarray(np.asarray(td["data"]).astype(np.dtype(td["dtype"]).newbyteorder("<")))
            data = _bytes16(b, arr.tobytes())
            buf_offs.append(_table(b, "Buffer", Data=data))
            tensor_buf.append(len(buf_offs) - 1)
        ten_offs = []
        for k, td in enumerate(self.tensors):
            name = b.CreateString(td["name"])
            shape = _ivec(b, td["shape"])
            quant = None
            q = td["quant"]
            if q is not None:
                sc = b.CreateNumpyVector(np.asarray(q.scale, np.float32))
                zp = b.CreateNumpyVector(np.asarray(q.zero_point, np.int64))
                quant = _table(b, "QuantizationParameters", Scale=sc, ZeroPoint=zp,
                               QuantizedDimension=int(q.axis or 0))
            ten_offs.append(_table(b, "Tensor", Shape=shape, Type=_TYPE[td["dtype"]], Buffer=tensor_buf[k],
                                   Name=name, Quantization=quant))
        op_offs = []
        for opname, ins, outs, opts_name, fields in self.ops:
            fields = dict(fields)
            opts = None
            if opts_name is not None:
                vec_fields = {}
                for k, v in list(fields.items()):
                    if isinstance(v, list):
                        vec_fields[k] = _ivec(b, v)
                        del fields[k]
                opts = _table(b, opts_name, **fields, **vec_fields)
            iv, ov = _ivec(b, ins), _ivec(b, outs)
            op_offs.append(_table(b, "Operator", OpcodeIndex=self.opcodes[opname], Inputs=iv, Outputs=ov,
                                  BuiltinOptionsType=getattr(t.BuiltinOptions, opts_name) if opts_name else None,
                                  BuiltinOptions=opts))
        sg = _table(b, "SubGraph", Tensors=_offvec(b, ten_offs), Inputs=_ivec(b, self.inputs),
                    Outputs=_ivec(b, self.outputs), Operators=_offvec(b, op_offs), Name=b.CreateString(self.g.name))
        codes = []
        for opname in sorted(self.opcodes, key=self.opcodes.get):
            code = getattr(t.BuiltinOperator, opname)
            ver = _INT8_VERSION.get(opname, 1) if opname in self.int8_ops else 1
            codes.append(_table(b, "OperatorCode", DeprecatedBuiltinCode=min(code, 127), BuiltinCode=code, Version=ver))
        desc = b.CreateString("Kiln")
        model = _table(b, "Model", Version=3, OperatorCodes=_offvec(b, codes), Subgraphs=_offvec(b, [sg]),
                       Description=desc, Buffers=_offvec(b, buf_offs))
        b.Finish(model, file_identifier=b"TFL3")
        return bytes(b.Output())


def export_tflite(graph, path=None) -> bytes:
    """Serialise ``graph`` as a .tflite model (bytes); also writes ``path`` when given. An int8
    ``dense`` becomes FULLY_CONNECTED, which LiteRT's reference kernels compute exactly as Kiln
    does (``round(double(acc) * eff)``, see docs/int8_ir.md)."""
    e = _Exporter(graph)
    try:
        e.run()
    except GraphError as err:
        raise ExportError(f"graph {graph.name!r}: {err}") from None
    data = e.build()
    if path is not None:
        d = os.path.dirname(os.path.abspath(os.fspath(path)))
        os.makedirs(d, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return data
