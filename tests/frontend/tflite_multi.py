"""A minimal .tflite writer for models with several subgraphs (control flow: IF), written with the
tflite schema's own builder functions. Float32, bool and int32 tensors; ops without options
except the ones passed explicitly."""
import flatbuffers
import numpy as np
import tflite

TYPES = {"float32": tflite.TensorType.FLOAT32, "bool": tflite.TensorType.BOOL, "int32": tflite.TensorType.INT32,
         "int8": tflite.TensorType.INT8, "int64": tflite.TensorType.INT64, "resource": tflite.TensorType.RESOURCE}


def _table(b, name, **fields):
    getattr(tflite, f"{name}Start")(b)
    for k, v in fields.items():
        if v is not None:
            getattr(tflite, f"{name}Add{k}")(b, v)
    return getattr(tflite, f"{name}End")(b)


def _ivec(b, v):
    return b.CreateNumpyVector(np.asarray(v, np.int32))


def _offvec(b, offs):
    b.StartVector(4, len(offs), 4)
    for o in reversed(offs):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


class Subgraph:
    def __init__(self, name):
        self.name, self.tensors, self.ops, self.inputs, self.outputs = name, [], [], [], []

    def tensor(self, name, shape, dtype="float32", data=None, scale=None, zero_point=0):
        self.tensors.append((name, tuple(shape), dtype, data, scale, zero_point))
        return len(self.tensors) - 1

    def op(self, opname, ins, outs, options=None, **fields):
        self.ops.append((opname, list(ins), list(outs), options, fields))


def build(subgraphs) -> bytes:
    b = flatbuffers.Builder(1024)
    buffers = [_table(b, "Buffer")]
    codes = sorted({op[0] for sg in subgraphs for op in sg.ops})
    sg_offs = []
    for sg in subgraphs:
        ten = []
        for name, shape, dtype, data, scale, zp in sg.tensors:
            buf = 0
            if data is not None:
                raw = np.asarray(data, dtype).tobytes()
                buffers.append(_table(b, "Buffer", Data=b.CreateByteVector(raw)))
                buf = len(buffers) - 1
            q = None
            if scale is not None:
                sc, zv = b.CreateNumpyVector(np.asarray([scale], np.float32)), b.CreateNumpyVector(np.asarray([zp], np.int64))
                q = _table(b, "QuantizationParameters", Scale=sc, ZeroPoint=zv)
            ten.append(_table(b, "Tensor", Shape=_ivec(b, shape), Type=TYPES[dtype], Buffer=buf, Name=b.CreateString(name),
                              Quantization=q))
        ops = []
        for opname, ins, outs, opts_name, fields in sg.ops:
            fields = {k: b.CreateString(v) if isinstance(v, str) else v for k, v in fields.items()}
            opts = _table(b, opts_name, **fields) if opts_name else None
            ops.append(_table(b, "Operator", OpcodeIndex=codes.index(opname), Inputs=_ivec(b, ins), Outputs=_ivec(b, outs),
                              BuiltinOptionsType=getattr(tflite.BuiltinOptions, opts_name) if opts_name else None,
                              BuiltinOptions=opts))
        sg_offs.append(_table(b, "SubGraph", Tensors=_offvec(b, ten), Inputs=_ivec(b, sg.inputs),
                              Outputs=_ivec(b, sg.outputs), Operators=_offvec(b, ops), Name=b.CreateString(sg.name)))
    oc = []
    for name in codes:
        code = getattr(tflite.BuiltinOperator, name)
        oc.append(_table(b, "OperatorCode", DeprecatedBuiltinCode=min(code, 127), BuiltinCode=code, Version=1))
    model = _table(b, "Model", Version=3, OperatorCodes=_offvec(b, oc), Subgraphs=_offvec(b, sg_offs),
                   Buffers=_offvec(b, buffers), Description=b.CreateString("kiln test"))
    b.Finish(model, file_identifier=b"TFL3")
    return bytes(b.Output())
