"""Export a Kiln graph (int8 as produced by the importer or PTQ/QAT, or float32) to a .tflite
flatbuffer with builtin ops, which LiteRT loads and runs bit-exactly like Kiln's int8 reference.

This module builds the flatbuffer; how each op is written (which builtin(s), options, layouts:
depthwise ``[C*M, KH, KW, 1]`` back to ``[1, KH, KW, C*M]``, explicit conv padding as a PAD then
a VALID conv) lives with the op's definition (``OpDef.tflite``, frontend/ops). A
``relu``/``relu6`` node that only clamps (same quantisation as its input) right after an op that
fuses activations (ADD, MUL, pooling, CONCATENATION) is folded into its
``fused_activation_function``. Graph states that no op carries as its own variable tensor become
resource variables with a CALL_ONCE initialisation subgraph (tflite_variables.py).
"""
from __future__ import annotations

import os

import flatbuffers
import numpy as np

from kiln.frontend.errors import GraphError
from kiln.frontend.ops.tflite_util import ExportError
from kiln.frontend.registry import get_op, tflite_int8_versions
from kiln.frontend.types import TensorType

from . import tflite_variables

_TYPE = {"float32": 0, "float16": 1, "int32": 2, "uint8": 3, "int64": 4, "bool": 6, "int16": 7, "int8": 9,
         "float64": 10, "resource": 13}
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
        self.skip = set()          # nodes not to write (fused, or covered by an earlier exporter)
        self.variables = {}        # graph state -> its resource handle tensor (tflite_variables.py)
        self.subgraphs = []        # further subgraphs (_Exporters sharing the opcodes), e.g. CALL_ONCE's
        self.name = graph.name

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
        """Tensor index of Kiln value v (constants get their data; a graph state that no op's
        exporter carries itself is read from a resource variable, tflite_variables.py)."""
        g = self.g
        if v in self.index:
            if v in g.states and self.tensors[self.index[v]].get("variable"):
                tflite_variables.refuse_shared(v)
            return self.index[v]
        if v in g.states:
            return tflite_variables.read(self, v)
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

    def subgraph(self, name):
        """A further subgraph sharing this model's opcodes: (its exporter, its subgraph index)."""
        sub = _Exporter(self.g)
        sub.opcodes, sub.int8_ops, sub.name, sub.inputs, sub.outputs = self.opcodes, self.int8_ops, name, [], []
        self.subgraphs.append(sub)
        return sub, len(self.subgraphs)

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
        skip = self.skip = set()    # nodes written by another's exporter (it may add to this set)
        for n in g.nodes:
            if n.op in ("relu", "relu6"):
                src = g.producer(n.inputs[0])
                spec = get_op(src.op).tflite if src is not None else None
                if (spec is not None and spec.fuses_activation
                        and len(cons[src.name]) == 1 and src.name not in g.outputs and src.name not in fused
                        and src.name not in g.states.values()
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
        tflite_variables.finish(self)

    def node(self, n, act, out):
        """Write one node through its op's exporter (frontend/ops: ``OpDef.tflite``)."""
        g = self.g
        spec = get_op(n.op).tflite
        if spec is None:
            raise ExportError(f"node {n.name!r}: op '{n.op}' has no TFLite builtin in Kiln's exporter")
        ot = g.types[out]
        int8 = ot.quant is not None or any(g.types[i].quant is not None for i in n.inputs)
        spec.fn(self, n, act, out, int8)

    # ---- serialisation --------------------------------------------------------------------
    def build(self) -> bytes:
        t = _tfl()
        b = flatbuffers.Builder(1024)
        buf_offs = [_table(b, "Buffer")]        # buffers: 0 is the empty sentinel
        sgs = [_subgraph(b, ex, buf_offs) for ex in [self, *self.subgraphs]]
        codes = []
        versions = tflite_int8_versions()
        for opname in sorted(self.opcodes, key=self.opcodes.get):
            if opname.startswith("CUSTOM:"):
                codes.append(_table(b, "OperatorCode", DeprecatedBuiltinCode=t.BuiltinOperator.CUSTOM,
                                    BuiltinCode=t.BuiltinOperator.CUSTOM, Version=1,
                                    CustomCode=b.CreateString(opname[len("CUSTOM:"):])))
                continue
            code = getattr(t.BuiltinOperator, opname)
            ver = versions.get(opname, 1) if opname in self.int8_ops else 1
            codes.append(_table(b, "OperatorCode", DeprecatedBuiltinCode=min(code, 127), BuiltinCode=code, Version=ver))
        desc = b.CreateString("Kiln")
        model = _table(b, "Model", Version=3, OperatorCodes=_offvec(b, codes), Subgraphs=_offvec(b, sgs),
                       Description=desc, Buffers=_offvec(b, buf_offs))
        b.Finish(model, file_identifier=b"TFL3")
        return bytes(b.Output())


def _subgraph(b, ex, buf_offs):
    """Serialise exporter ``ex``'s tensors and operators as one SubGraph (its constants' buffers
    appended to ``buf_offs``)."""
    t = _tfl()
    tensor_buf = []
    for td in ex.tensors:
        if td["data"] is None:
            tensor_buf.append(0)
            continue
        arr = np.ascontiguousarray(np.asarray(td["data"]).astype(np.dtype(td["dtype"]).newbyteorder("<")))
        data = _bytes16(b, arr.tobytes())
        buf_offs.append(_table(b, "Buffer", Data=data))
        tensor_buf.append(len(buf_offs) - 1)
    ten_offs = []
    for k, td in enumerate(ex.tensors):
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
                               Name=name, Quantization=quant, IsVariable=True if td.get("variable") else None))
    op_offs = []
    for opname, ins, outs, opts_name, fields in ex.ops:
        fields = dict(fields)
        inter = fields.pop("intermediates", None)      # LSTM: the converter's intermediate tensors
        custom = fields.pop("custom_options", None)    # a CUSTOM:<code> op's flexbuffer options
        opts = None
        if opts_name is not None:
            ref_fields = {}                             # vectors and strings: built before the table
            for k, v in list(fields.items()):
                if isinstance(v, (list, str)):
                    ref_fields[k] = b.CreateString(v) if isinstance(v, str) else _ivec(b, v)
                    del fields[k]
            opts = _table(b, opts_name, **fields, **ref_fields)
        iv, ov = _ivec(b, ins), _ivec(b, outs)
        op_offs.append(_table(b, "Operator", OpcodeIndex=ex.opcodes[opname], Inputs=iv, Outputs=ov,
                              BuiltinOptionsType=getattr(t.BuiltinOptions, opts_name) if opts_name else None,
                              BuiltinOptions=opts, Intermediates=_ivec(b, inter) if inter else None,
                              CustomOptions=b.CreateByteVector(custom) if custom is not None else None))
    return _table(b, "SubGraph", Tensors=_offvec(b, ten_offs), Inputs=_ivec(b, ex.inputs),
                  Outputs=_ivec(b, ex.outputs), Operators=_offvec(b, op_offs), Name=b.CreateString(ex.name))


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
