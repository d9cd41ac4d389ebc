""".tflite import: a TFLite flatbuffer (int8 or float32) -> a Kiln :class:`Graph` (NHWC).

Supported builtin ops: CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, AVERAGE_POOL_2D, MAX_POOL_2D,
ADD, MUL, RESHAPE, SOFTMAX, QUANTIZE, DEQUANTIZE, PAD, MEAN, CONCATENATION, LOGISTIC, TANH, RELU,
RELU6. Layouts follow docs/int8_ir.md: conv weights stay OHWI; depthwise weights
``[1, KH, KW, C*M]`` become ``[C*M, KH, KW, 1]`` (groups = C); dense weights stay ``[N, K]``.
A fused activation becomes the ``activation`` attribute of conv2d/dense, or a following
``relu``/``relu6`` node (same quantisation: a clamp) after pooling, ADD and MUL.

Files are untrusted. Every structural fact is checked before it is used: the file identifier,
vector lengths against the file size, tensor/buffer/opcode indices, shapes against Kiln's
limits, constant buffer sizes against shapes, and each node's shape rule against the shapes the
file records. Anything wrong raises :class:`TFLiteImportError` (a Kiln SerializationError) naming
the operator or tensor; flatbuffer decoding errors are caught and reported the same way.
An unsupported op fails with its name, its operator index and the list of every unsupported op in
the file.

The int8 ops ``quantize``/``dequantize`` and the ``int8_ref`` rules are registered by
``kiln.quantize``, which this module imports when it loads a file (the one place the frontend
needs it: a quantised graph is not runnable without those rules).
"""
from __future__ import annotations

import importlib
import math
import os
import re
import struct

import numpy as np

from .limits import check as check_limit
from .errors import KilnError, SerializationError, ShapeError
from .graph import Graph
from .registry import get_op
from .types import QParams, TensorType

SUPPORTED = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "AVERAGE_POOL_2D", "MAX_POOL_2D", "ADD",
             "MUL", "RESHAPE", "SOFTMAX", "QUANTIZE", "DEQUANTIZE", "PAD", "MEAN", "CONCATENATION",
             "LOGISTIC", "TANH", "RELU", "RELU6")
MAX_RANK = 8
MAX_FILE_BYTES = 1 << 31

# TFLite TensorType enum -> Kiln dtype (others are rejected by name)
_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16", 9: "int8",
          10: "float64"}
_TYPE_NAMES = {0: "FLOAT32", 1: "FLOAT16", 2: "INT32", 3: "UINT8", 4: "INT64", 5: "STRING", 6: "BOOL",
               7: "INT16", 8: "COMPLEX64", 9: "INT8", 10: "FLOAT64", 11: "COMPLEX128", 12: "UINT64",
               13: "RESOURCE", 14: "VARIANT", 15: "UINT32", 16: "UINT16", 17: "INT4"}
_ACT = {0: "none", 1: "relu", 3: "relu6"}
_ACT_NAMES = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
_PAD = {0: "same", 1: "valid"}


class TFLiteImportError(SerializationError):
    """A .tflite file is malformed, hostile or uses something Kiln does not import."""


def _op_names():
    import tflite
    return {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_") and isinstance(v, int)}


def load_tflite(path, name=None) -> Graph:
    """Import a .tflite file (path or bytes) into a Graph. Raises TFLiteImportError."""
    if isinstance(path, (bytes, bytearray, memoryview)):
        buf, where = bytes(path), "<bytes>"
    else:
        where = os.fspath(path)
        try:
            size = os.path.getsize(where)
            if size > MAX_FILE_BYTES:
                raise TFLiteImportError(f"{where}: {size:,} bytes is larger than the {MAX_FILE_BYTES:,} Kiln reads")
            with open(where, "rb") as f:
                buf = f.read()
        except OSError as e:
            raise TFLiteImportError(f"{where}: cannot read ({e})") from None
    importlib.import_module("kiln.quantize")   # registers quantize/dequantize and the int8 rules
    gname = name or (os.path.splitext(os.path.basename(where))[0] if where != "<bytes>" else "tflite")
    try:
        return _Importer(buf, where, gname).run()
    except KilnError as e:
        if isinstance(e, TFLiteImportError):
            raise
        raise TFLiteImportError(f"{where}: {e}") from None
    except (struct.error, IndexError, ValueError, TypeError, OverflowError, UnicodeDecodeError, AttributeError,
            KeyError, RecursionError, MemoryError) as e:
        raise TFLiteImportError(f"{where}: corrupt flatbuffer ({type(e).__name__}: {e})") from None


class _Importer:
    def __init__(self, buf, where, name):
        self.buf, self.where, self.name = buf, where, name
        self.g = Graph(name)
        self.values = {}      # tflite tensor index -> Kiln value name
        self.used_names = set()

    # ---- helpers --------------------------------------------------------------------------
    def err(self, msg):
        return TFLiteImportError(f"{self.where}: {msg}")

    def _len(self, n, what, elem=4):
        if not 0 <= n <= len(self.buf) // elem:
            raise self.err(f"{what}: vector length {n:,} does not fit in a {len(self.buf):,}-byte file")
        return n

    def run(self):
        import tflite
        buf = self.buf
        if len(buf) < 8:
            raise self.err(f"truncated: {len(buf)} bytes is too short for a TFLite flatbuffer")
        if buf[4:8] != b"TFL3":
            raise self.err(f"not a TFLite model: file identifier is {buf[4:8]!r}, expected b'TFL3'")
        root = struct.unpack_from("<I", buf, 0)[0]
        if not 8 <= root < len(buf):
            raise self.err(f"root table offset {root} is outside the file")
        m = tflite.Model.GetRootAs(buf, 0)
        self.model = m
        nsub = self._len(m.SubgraphsLength(), "subgraphs")
        if nsub < 1:
            raise self.err("the model has no subgraph")
        if nsub > 1:
            raise self.err(f"the model has {nsub} subgraphs (control flow); Kiln imports single-subgraph models")
        self.sg = m.Subgraphs(0)
        self._read_opcodes()
        self._read_tensors()
        self._check_ops()
        self._build()
        return self.g

    def _read_opcodes(self):
        m = self.model
        names = _op_names()
        self.opcodes = []
        for i in range(self._len(m.OperatorCodesLength(), "operator_codes")):
            oc = m.OperatorCodes(i)
            code = max(int(oc.BuiltinCode()), int(oc.DeprecatedBuiltinCode()))
            if code == 32:  # CUSTOM
                cc = oc.CustomCode()
                self.opcodes.append("CUSTOM:" + (cc.decode("utf-8", "replace") if cc else "?"))
            else:
                self.opcodes.append(names.get(code, f"BUILTIN_{code}"))

    def _read_tensors(self):
        sg, m = self.sg, self.model
        nb = self._len(m.BuffersLength(), "buffers")
        nt = self._len(sg.TensorsLength(), "tensors")
        self.tensors = []
        for i in range(nt):
            t = sg.Tensors(i)
            where = f"tensor {i}"
            raw_name = t.Name()
            tname = raw_name.decode("utf-8", "replace") if raw_name else f"t{i}"
            rank = t.ShapeLength()
            if rank > MAX_RANK:
                raise self.err(f"{where} ({tname!r}) has rank {rank}; Kiln imports up to rank {MAX_RANK}")
            shape = tuple(int(v) for v in (t.ShapeAsNumpy() if rank else ()))
            if any(d < 0 for d in shape):
                raise self.err(f"{where} ({tname!r}) has a negative or dynamic dimension {list(shape)}; "
                               f"Kiln imports static shapes")
            check_limit("max_tensor_elements", math.prod(shape), f"{self.where} {where} {tname!r}")
            ttype = int(t.Type())
            if ttype not in _TYPES:
                raise self.err(f"{where} ({tname!r}) has type {_TYPE_NAMES.get(ttype, ttype)}, which Kiln does not import")
            dtype = _TYPES[ttype]
            quant = self._quant(t, where, tname, shape)
            bidx = int(t.Buffer())
            if not 0 <= bidx < max(nb, 1) or (nb == 0 and bidx != 0):
                raise self.err(f"{where} ({tname!r}) refers to buffer {bidx}, but the file has {nb}")
            data = self._buffer_data(bidx, nb, where, tname, shape, dtype) if nb else None
            self.tensors.append(dict(name=tname, shape=shape, dtype=dtype, quant=quant, data=data))

    def _quant(self, t, where, tname, shape):
        q = t.Quantization()
        if q is None:
            return None
        ns = self._len(q.ScaleLength(), f"{where} scales")
        if ns == 0:
            return None
        scales = np.asarray(q.ScaleAsNumpy(), np.float32)
        nz = self._len(q.ZeroPointLength(), f"{where} zero points", 8)
        zps = np.asarray(q.ZeroPointAsNumpy(), np.int64) if nz else np.zeros(ns, np.int64)
        if len(zps) != ns:
            raise self.err(f"{where} ({tname!r}): {ns} scales but {len(zps)} zero points")
        if not np.all(np.isfinite(scales)) or np.any(scales <= 0):
            raise self.err(f"{where} ({tname!r}): quantisation scales must be finite and positive, got {scales[:4]}")
        if np.any(np.abs(zps) > (1 << 31)):
            raise self.err(f"{where} ({tname!r}): zero point out of int32 range")
        axis = int(q.QuantizedDimension())
        if ns > 1:
            if not 0 <= axis < len(shape) or shape[axis] != ns:
                raise self.err(f"{where} ({tname!r}): {ns} per-channel scales on axis {axis} of shape {list(shape)}")
            return QParams(tuple(scales.astype(np.float64).tolist()), tuple(zps.tolist()), axis)
        return QParams((float(scales[0]),), (int(zps[0]),), None)

    def _buffer_data(self, bidx, nb, where, tname, shape, dtype):
        b = self.model.Buffers(bidx)
        n = b.DataLength()
        off, size = int(b.Offset()), int(b.Size())
        if n == 0 and off > 1:
            # large models keep buffers after the flatbuffer: offset/size into the file
            if off + size > len(self.buf):
                raise self.err(f"{where} ({tname!r}): buffer {bidx} at offset {off} size {size} lies outside the file")
            raw = memoryview(self.buf)[off:off + size]
        elif n == 0:
            return None
        else:
            self._len(n, f"buffer {bidx}", 1)
            raw = b.DataAsNumpy()
        itemsize = np.dtype(dtype).itemsize
        want = math.prod(shape) * itemsize
        if len(raw) != want:
            raise self.err(f"{where} ({tname!r}): buffer {bidx} holds {len(raw):,} bytes but shape {list(shape)} "
                           f"of {dtype} needs {want:,}")
        return np.frombuffer(bytes(raw), dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape)

    def _check_ops(self):
        sg = self.sg
        nops = self._len(sg.OperatorsLength(), "operators")
        self.ops = []
        bad = []
        for k in range(nops):
            op = sg.Operators(k)
            idx = int(op.OpcodeIndex())
            if not 0 <= idx < len(self.opcodes):
                raise self.err(f"operator {k} uses opcode index {idx}, but the file has {len(self.opcodes)} opcodes")
            opname = self.opcodes[idx]
            ins = [int(v) for v in (op.InputsAsNumpy() if self._len(op.InputsLength(), f"operator {k} inputs") else ())]
            outs = [int(v) for v in (op.OutputsAsNumpy() if self._len(op.OutputsLength(), f"operator {k} outputs") else ())]
            for v in ins + outs:
                if not (-1 <= v < len(self.tensors)) or (v == -1 and v in outs):
                    raise self.err(f"operator {k} ({opname}) refers to tensor {v}, but the file has {len(self.tensors)}")
            if opname not in SUPPORTED:
                bad.append((opname, k))
            self.ops.append((opname, op, ins, outs))
        if bad:
            first, k = bad[0]
            listing = ", ".join(f"{n} (operator {i})" for n, i in bad)
            raise self.err(f"unsupported TFLite op {first} at operator {k}; unsupported ops in this file: {listing}. "
                           f"Kiln imports: {', '.join(SUPPORTED)}")

    # ---- graph building -------------------------------------------------------------------
    def _vname(self, base):
        base = base.split(";")[0]
        if len(base) > 48:      # converter names concatenate every fused op: keep the tail
            base = base.rsplit("/", 2)[-2] + "/" + base.rsplit("/", 1)[-1] if base.count("/") >= 2 else base[-48:]
        base = re.sub(r"[^A-Za-z0-9_./:-]", "_", base) or "t"
        name, i = base, 1
        while name in self.used_names or name in self.g.types:
            name = f"{base}_{i}"
            i += 1
        self.used_names.add(name)
        return name

    def _ttype(self, i):
        t = self.tensors[i]
        return TensorType(t["shape"], t["dtype"], t["quant"])

    def value(self, i, k, opname):
        """Kiln value for tflite tensor i used by operator k (constants are added on first use)."""
        if i in self.values:
            return self.values[i]
        t = self.tensors[i]
        if t["data"] is None:
            raise self.err(f"operator {k} ({opname}) reads tensor {i} ({t['name']!r}) before any operator "
                           f"produces it (and it is not a constant or a graph input)")
        name = self._vname(t["name"])
        self.g.add_const(name, t["data"], t["quant"])
        self.values[i] = name
        return name

    def const(self, i, k, opname, what):
        t = self.tensors[i]
        if t["data"] is None:
            raise self.err(f"operator {k} ({opname}): {what} (tensor {i}) must be a constant")
        return t["data"]

    def _build(self):
        sg = self.sg
        nin = self._len(sg.InputsLength(), "subgraph inputs")
        nout = self._len(sg.OutputsLength(), "subgraph outputs")
        ins = [int(v) for v in (sg.InputsAsNumpy() if nin else ())]
        outs = [int(v) for v in (sg.OutputsAsNumpy() if nout else ())]
        for i in ins + outs:
            if not 0 <= i < len(self.tensors):
                raise self.err(f"subgraph input/output refers to tensor {i}, but the file has {len(self.tensors)}")
        for i in ins:
            if i in self.values:
                raise self.err(f"tensor {i} is listed twice as a subgraph input")
            self.values[i] = self.g.add_input(self._vname(self.tensors[i]["name"]), self._ttype(i))
        for k, (opname, op, oins, oouts) in enumerate(self.ops):
            if len(oouts) != 1:
                raise self.err(f"operator {k} ({opname}) has {len(oouts)} outputs; expected 1")
            if oouts[0] in self.values:
                raise self.err(f"operator {k} ({opname}) writes tensor {oouts[0]}, which already has a value")
            _CONVERT[opname](self, k, op, [v for v in oins], oouts[0])
        for i in outs:
            if i not in self.values:
                self.value(i, len(self.ops), "graph output")
            self.g.outputs.append(self.values[i])
        self.g.meta["source"] = os.path.basename(self.where)
        self.g.meta["tflite_tensors"] = {v: i for i, v in self.values.items()}

    def emit(self, k, opname, kop, inputs, attrs, out, name=None, out_type=None):
        """Add a Kiln node; checks the op's shape rule against the shape the file records."""
        t = out_type or self._ttype(out)
        opdef = get_op(kop)
        attrs = opdef.normalize_attrs(attrs, f"operator {k} ({opname}): ")
        in_types = [self.g.types[v] for v in inputs]
        try:
            inferred = opdef.rule("infer")(in_types, attrs)
        except ShapeError as e:
            # float-only shape rules (activations, softmax) reject int8 types: the shape is the input's
            if not (in_types and in_types[0].quant is not None and kop in _SHAPE_PRESERVING):
                raise self.err(f"operator {k} ({opname}): {e}") from None
            inferred = in_types[0]
        if tuple(inferred.shape) != tuple(t.shape):
            raise self.err(f"operator {k} ({opname}): output tensor {out} ({self.tensors[out]['name']!r}) has shape "
                           f"{list(t.shape)} but the op computes {list(inferred.shape)}")
        if inferred.dtype != t.dtype and kop not in ("quantize", "dequantize", "cast"):
            raise self.err(f"operator {k} ({opname}): output dtype {t.dtype} but inputs are {in_types[0].dtype}")
        vname = name or self._vname(self.tensors[out]["name"])
        self.g.add_node(kop, inputs, attrs, name=vname, out_type=t)
        return vname

    def finish(self, k, opname, kop, inputs, attrs, out, act):
        """Emit an op then its fused activation as a relu/relu6 node with the output's type."""
        if act == "none":
            self.values[out] = self.emit(k, opname, kop, inputs, attrs, out)
            return
        pre = self.emit(k, opname, kop, inputs, attrs, out, name=self._vname(self.tensors[out]["name"] + "_preact"))
        self.values[out] = self.emit(k, opname, act, [pre], {}, out)


_SHAPE_PRESERVING = ("relu", "relu6", "sigmoid", "tanh", "softmax")


def _opts(imp, k, op, opname, cls_name):
    import tflite
    tab = op.BuiltinOptions()
    cls = getattr(tflite, cls_name)
    if tab is None:
        return None
    want = getattr(tflite.BuiltinOptions, cls_name, None)
    if want is not None and int(op.BuiltinOptionsType()) != want:
        raise imp.err(f"operator {k} ({opname}) carries options of type {int(op.BuiltinOptionsType())}, "
                      f"expected {cls_name}")
    o = cls()
    o.Init(tab.Bytes, tab.Pos)
    return o


def _act(imp, k, opname, code):
    code = int(code)
    if code not in _ACT:
        raise imp.err(f"operator {k} ({opname}): fused activation {_ACT_NAMES.get(code, code)} is not supported "
                      f"(Kiln imports NONE, RELU, RELU6)")
    return _ACT[code]


def _padding(imp, k, opname, code):
    if int(code) not in _PAD:
        raise imp.err(f"operator {k} ({opname}): unknown padding {int(code)}")
    return _PAD[int(code)]


def _need(imp, k, opname, ins, n_min, n_max=None):
    n_max = n_min if n_max is None else n_max
    real = [i for i in ins]
    if not n_min <= len(real) <= n_max or any(i < 0 for i in real[:n_min]):
        raise imp.err(f"operator {k} ({opname}) has inputs {ins}; expected {n_min}"
                      f"{'' if n_max == n_min else '-' + str(n_max)}")


def _conv(imp, k, op, ins, out):
    name = "CONV_2D"
    _need(imp, k, name, ins, 2, 3)
    o = _opts(imp, k, op, name, "Conv2DOptions")
    attrs = dict(stride=[o.StrideH(), o.StrideW()] if o else [1, 1], padding=_padding(imp, k, name, o.Padding() if o else 0),
                 dilation=[o.DilationHFactor(), o.DilationWFactor()] if o else [1, 1], groups=1)
    act = _act(imp, k, name, o.FusedActivationFunction() if o else 0)
    x, w = imp.value(ins[0], k, name), imp.value(ins[1], k, name)
    xt, wt = imp.g.types[x], imp.g.types[w]
    if len(wt.shape) == 4 and len(xt.shape) == 4 and wt.shape[3] and xt.shape[3] != wt.shape[3]:
        if xt.shape[3] % wt.shape[3]:
            raise imp.err(f"operator {k} ({name}): input channels {xt.shape[3]} and filter {list(wt.shape)} do not match")
        attrs["groups"] = xt.shape[3] // wt.shape[3]
    inputs = [x, w] + ([imp.value(ins[2], k, name)] if len(ins) == 3 and ins[2] >= 0 else [])
    imp.values[out] = imp.emit(k, name, "conv2d", inputs, dict(attrs, activation=act), out)


def _depthwise(imp, k, op, ins, out):
    name = "DEPTHWISE_CONV_2D"
    _need(imp, k, name, ins, 2, 3)
    o = _opts(imp, k, op, name, "DepthwiseConv2DOptions")
    x = imp.value(ins[0], k, name)
    xt = imp.g.types[x]
    wdata = imp.const(ins[1], k, name, "the depthwise filter")
    winfo = imp.tensors[ins[1]]
    if len(wdata.shape) != 4 or wdata.shape[0] != 1 or len(xt.shape) != 4 or xt.shape[3] == 0 \
            or wdata.shape[3] % xt.shape[3]:
        raise imp.err(f"operator {k} ({name}): filter {list(wdata.shape)} does not fit input {list(xt.shape)} "
                      f"(expected [1, KH, KW, C*M])")
    wq = winfo["quant"]
    if wq is not None and wq.axis is not None:
        if wq.axis != 3:
            raise imp.err(f"operator {k} ({name}): per-channel filter quantisation must be on axis 3, got {wq.axis}")
        wq = QParams(wq.scale, wq.zero_point, 0)
    wname = imp._vname(winfo["name"] + "_ohwi")
    imp.g.add_const(wname, np.ascontiguousarray(np.transpose(wdata, (3, 1, 2, 0))), wq)
    attrs = dict(stride=[o.StrideH(), o.StrideW()] if o else [1, 1], padding=_padding(imp, k, name, o.Padding() if o else 0),
                 dilation=[o.DilationHFactor(), o.DilationWFactor()] if o else [1, 1], groups=xt.shape[3])
    act = _act(imp, k, name, o.FusedActivationFunction() if o else 0)
    inputs = [x, wname] + ([imp.value(ins[2], k, name)] if len(ins) == 3 and ins[2] >= 0 else [])
    imp.values[out] = imp.emit(k, name, "conv2d", inputs, dict(attrs, activation=act), out)


def _fc(imp, k, op, ins, out):
    name = "FULLY_CONNECTED"
    _need(imp, k, name, ins, 2, 3)
    o = _opts(imp, k, op, name, "FullyConnectedOptions")
    if o is not None and int(o.WeightsFormat()) != 0:
        raise imp.err(f"operator {k} ({name}): shuffled weights format is not supported")
    act = _act(imp, k, name, o.FusedActivationFunction() if o else 0)
    keep = bool(o.KeepNumDims()) if o else False
    x, w = imp.value(ins[0], k, name), imp.value(ins[1], k, name)
    xt, wt = imp.g.types[x], imp.g.types[w]
    if len(wt.shape) != 2 or wt.shape[1] == 0 or xt.size % wt.shape[1]:
        raise imp.err(f"operator {k} ({name}): weights {list(wt.shape)} do not fit input {list(xt.shape)}")
    if not keep and len(xt.shape) != 2:
        flat = imp._vname(x + "_flat")
        imp.g.add_node("reshape", [x], {"shape": [xt.size // wt.shape[1], wt.shape[1]]}, name=flat,
                       out_type=TensorType((xt.size // wt.shape[1], wt.shape[1]), xt.dtype, xt.quant))
        x = flat
    inputs = [x, w] + ([imp.value(ins[2], k, name)] if len(ins) == 3 and ins[2] >= 0 else [])
    imp.values[out] = imp.emit(k, name, "dense", inputs, {"activation": act}, out)


def _pool(kop, name):
    def conv(imp, k, op, ins, out):
        _need(imp, k, name, ins, 1)
        o = _opts(imp, k, op, name, "Pool2DOptions")
        if o is None:
            raise imp.err(f"operator {k} ({name}) has no Pool2DOptions")
        attrs = dict(pool=[o.FilterHeight(), o.FilterWidth()], stride=[o.StrideH(), o.StrideW()],
                     padding=_padding(imp, k, name, o.Padding()))
        if min(attrs["pool"]) < 1:
            raise imp.err(f"operator {k} ({name}): filter size {attrs['pool']} must be >= 1")
        imp.finish(k, name, kop, [imp.value(ins[0], k, name)], attrs, out,
                   _act(imp, k, name, o.FusedActivationFunction()))
    return conv


def _binary(kop, name, opts_cls):
    def conv(imp, k, op, ins, out):
        _need(imp, k, name, ins, 2)
        o = _opts(imp, k, op, name, opts_cls)
        act = _act(imp, k, name, o.FusedActivationFunction() if o else 0)
        imp.finish(k, name, kop, [imp.value(i, k, name) for i in ins], {}, out, act)
    return conv


def _unary(kop, name):
    def conv(imp, k, op, ins, out):
        _need(imp, k, name, ins, 1)
        imp.values[out] = imp.emit(k, name, kop, [imp.value(ins[0], k, name)], {}, out)
    return conv


def _reshape(imp, k, op, ins, out):
    name = "RESHAPE"
    _need(imp, k, name, ins, 1, 2)
    x = imp.value(ins[0], k, name)
    shape = list(imp.tensors[out]["shape"])
    imp.values[out] = imp.emit(k, name, "reshape", [x], {"shape": shape}, out)


def _softmax(imp, k, op, ins, out):
    name = "SOFTMAX"
    _need(imp, k, name, ins, 1)
    o = _opts(imp, k, op, name, "SoftmaxOptions")
    beta = float(o.Beta()) if o else 1.0
    if beta != 1.0:
        raise imp.err(f"operator {k} ({name}): beta = {beta}; Kiln's softmax has beta 1")
    imp.values[out] = imp.emit(k, name, "softmax", [imp.value(ins[0], k, name)], {"axis": -1}, out)


def _quantize(imp, k, op, ins, out):
    name = "QUANTIZE"
    _need(imp, k, name, ins, 1)
    q = imp.tensors[out]["quant"]
    if q is None or q.per_channel:
        raise imp.err(f"operator {k} ({name}): output tensor {out} needs per-tensor quantisation parameters")
    attrs = {"scale": list(q.scale), "zero_point": list(q.zero_point), "dtype": imp.tensors[out]["dtype"]}
    imp.values[out] = imp.emit(k, name, "quantize", [imp.value(ins[0], k, name)], attrs, out)


def _dequantize(imp, k, op, ins, out):
    name = "DEQUANTIZE"
    _need(imp, k, name, ins, 1)
    x = imp.value(ins[0], k, name)
    xt = imp.g.types[x]
    if xt.quant is None:
        # float16 weights stored for a float model: a cast
        imp.values[out] = imp.emit(k, name, "cast", [x], {"dtype": imp.tensors[out]["dtype"]}, out)
        return
    imp.values[out] = imp.emit(k, name, "dequantize", [x], {"dtype": imp.tensors[out]["dtype"]}, out)


def _pad(imp, k, op, ins, out):
    name = "PAD"
    _need(imp, k, name, ins, 2)
    x = imp.value(ins[0], k, name)
    p = np.asarray(imp.const(ins[1], k, name, "paddings"), np.int64)
    nd = len(imp.g.types[x].shape)
    if p.shape != (nd, 2) or np.any(p < 0):
        raise imp.err(f"operator {k} ({name}): paddings {p.tolist()} must be non-negative with shape [{nd}, 2]")
    imp.values[out] = imp.emit(k, name, "pad", [x], {"pads": [int(v) for v in p.ravel()], "value": 0.0}, out)


def _mean(imp, k, op, ins, out):
    name = "MEAN"
    _need(imp, k, name, ins, 2)
    x = imp.value(ins[0], k, name)
    ax = np.atleast_1d(np.asarray(imp.const(ins[1], k, name, "axes"), np.int64))
    nd = len(imp.g.types[x].shape)
    if np.any(ax < -nd) or np.any(ax >= nd):
        raise imp.err(f"operator {k} ({name}): axes {ax.tolist()} out of range for rank {nd}")
    axes = sorted({int(a) % nd for a in ax})
    o = _opts(imp, k, op, name, "ReducerOptions")
    keep = bool(o.KeepDims()) if o else False
    imp.values[out] = imp.emit(k, name, "mean", [x], {"axes": axes, "keepdims": keep}, out)


def _concat(imp, k, op, ins, out):
    name = "CONCATENATION"
    if not ins or any(i < 0 for i in ins):
        raise imp.err(f"operator {k} ({name}) needs at least one input, got {ins}")
    o = _opts(imp, k, op, name, "ConcatenationOptions")
    axis = int(o.Axis()) if o else 0
    imp.finish(k, name, "concat", [imp.value(i, k, name) for i in ins], {"axis": axis}, out,
               _act(imp, k, name, o.FusedActivationFunction() if o else 0))


_CONVERT = {
    "CONV_2D": _conv, "DEPTHWISE_CONV_2D": _depthwise, "FULLY_CONNECTED": _fc,
    "AVERAGE_POOL_2D": _pool("avg_pool2d", "AVERAGE_POOL_2D"), "MAX_POOL_2D": _pool("max_pool2d", "MAX_POOL_2D"),
    "ADD": _binary("add", "ADD", "AddOptions"), "MUL": _binary("mul", "MUL", "MulOptions"),
    "RESHAPE": _reshape, "SOFTMAX": _softmax, "QUANTIZE": _quantize, "DEQUANTIZE": _dequantize, "PAD": _pad,
    "MEAN": _mean, "CONCATENATION": _concat, "LOGISTIC": _unary("sigmoid", "LOGISTIC"),
    "TANH": _unary("tanh", "TANH"), "RELU": _unary("relu", "RELU"), "RELU6": _unary("relu6", "RELU6"),
}
