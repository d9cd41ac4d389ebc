""".tflite import: a TFLite flatbuffer (int8, float32 or dynamic-range "hybrid") -> a Kiln
:class:`Graph` (NHWC).

Supported builtin ops: every op with an import converter (:func:`supported`; each converter lives
with its op's definition in frontend/ops, registered with ``tflite_util.importer``). Layouts follow docs/int8_ir.md: conv weights stay OHWI;
depthwise weights ``[1, KH, KW, C*M]`` become ``[C*M, KH, KW, 1]`` (groups = C); dense weights
stay ``[N, K]``. A fused activation becomes the ``activation`` attribute of conv2d/dense, or a
following ``relu``/``relu6`` node (same quantisation: a clamp) after pooling, ADD and MUL.
Models may have several inputs and outputs, of different dtypes.

Dynamic-range ("hybrid") models keep float activations and store constant weights as int8 with
per-tensor or per-channel scales; a constant int8 (or float16) weight feeding a float op, and an
explicit DEQUANTIZE of a constant, become float32 constants at import, ``float32(scale) * (q - zp)``
as TFLite's DEQUANTIZE computes them, so the model stays a float model.

Files are untrusted. Before anything reads the file, :func:`.tflite_verify.verify` applies the
flatbuffer structure rules of TFLite's verifier. Then every fact is checked before it is used
(:mod:`.tflite_checks`): tensor/buffer/opcode indices, op versions, shapes against Kiln's limits,
constant buffer sizes, quantisation parameters (scale/zero-point counts, finite scales in
[2^-63, 2^63], zero points in the dtype's range, quantized_dimension), each op's inputs, options
and quantisation as TFLite's kernels' Prepare() require, and each node's shape rule against the
shapes the file records. Anything wrong raises :class:`TFLiteImportError` naming the tensor or
operator, the field, the value and the allowed range. An unsupported op fails with its name, its
operator index and the list of every unsupported op in the file.
"""
from __future__ import annotations

import math
import os
import re
import struct

import numpy as np
from flatbuffers import number_types as _fbt

from . import tflite_checks as chk
from .errors import KilnError, ShapeError
from .graph import Graph
from .limits import check as check_limit
from .registry import TFLITE_IMPORTERS, get_op
from .tflite_verify import TFLiteImportError, verify
from .types import TensorType

MAX_RANK = 8
MAX_FILE_BYTES = (1 << 31) - 1

# TFLite TensorType enum -> Kiln dtype (others are rejected by name)
_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16", 9: "int8",
          10: "float64", 13: "resource"}    # resource: a variable's handle (frontend/ops/variables.py)
_TYPE_NAMES = {0: "FLOAT32", 1: "FLOAT16", 2: "INT32", 3: "UINT8", 4: "INT64", 5: "STRING", 6: "BOOL",
               7: "INT16", 8: "COMPLEX64", 9: "INT8", 10: "FLOAT64", 11: "COMPLEX128", 12: "UINT64",
               13: "RESOURCE", 14: "VARIANT", 15: "UINT32", 16: "UINT16", 17: "INT4"}
# dtypes an op operand (activation) may have: float32, or int8 with quantisation parameters
ACTIVATION_DTYPES = ("float32", "int8", "int16")   # int16: TFLite's 16x8 quantisation
MAX_SUBGRAPH_DEPTH = 8                              # nested control flow (IF branches) Kiln inlines


def _raw(tab, slot, flags, default):
    """Scalar field ``slot`` of a flatbuffers table as stored (``default`` when absent)."""
    o = tab.Offset(slot)
    return int(tab.Get(flags, tab.Pos + o)) if o else default


def opcode_name(oc, names=None):
    """Name of a flatbuffer OperatorCode as TFLite's GetBuiltinCode resolves it: max(builtin_code,
    deprecated_builtin_code), read raw (the tflite package's BuiltinCode() returns the deprecated
    field for codes below 127); CUSTOM:<custom_code> for custom ops."""
    code = max(_raw(oc._tab, 10, _fbt.Int32Flags, 0), int(oc.DeprecatedBuiltinCode()))
    if code == 32:
        cc = oc.CustomCode()
        return "CUSTOM:" + (cc.decode("utf-8", "replace") if cc else "?")
    return (names or _op_names()).get(code, f"BUILTIN_{code}")


def _op_names():
    import tflite
    return {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_") and isinstance(v, int)}


def supported() -> list[str]:
    """The TFLite builtin ops Kiln imports (sorted)."""
    return sorted(TFLITE_IMPORTERS)


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
    gname = name or (os.path.splitext(os.path.basename(where))[0] if where != "<bytes>" else "tflite")
    try:
        if len(buf) < 8:
            raise TFLiteImportError(f"{where}: truncated: {len(buf)} bytes is too short for a TFLite flatbuffer")
        if buf[4:8] != b"TFL3":
            raise TFLiteImportError(f"{where}: not a TFLite model: file identifier is {buf[4:8]!r}, expected b'TFL3'")
        verify(buf, where)
        return _Importer(buf, where, gname).run()
    except KilnError as e:
        if isinstance(e, TFLiteImportError):
            raise
        raise TFLiteImportError(f"{where}: {e}") from None
    except (struct.error, IndexError, ValueError, TypeError, OverflowError, UnicodeDecodeError, AttributeError,
            KeyError, RecursionError) as e:
        raise TFLiteImportError(f"{where}: corrupt flatbuffer ({type(e).__name__}: {e})") from None
    except MemoryError:
        raise TFLiteImportError(f"{where}: out of memory while importing (MemoryError); the file asks for more "
                                f"than this machine has") from None


class _Importer:
    def __init__(self, buf, where, name):
        self.buf, self.where, self.name = buf, where, name
        self.g = Graph(name)
        self.values = {}      # tflite tensor index -> Kiln value name
        self.used_names = set()
        self.folded = {}      # tflite tensor index -> float32 array (DEQUANTIZE of a constant)
        self.finishers = []   # f(importer) run once after the main subgraph's operators
        self.shared = {}      # what ops share across subgraphs (resource variables by name)

    # ---- helpers --------------------------------------------------------------------------
    def err(self, msg):
        return TFLiteImportError(f"{self.where}: {msg}")

    def label(self, i):
        return chk.label(self.tensors[i], i)

    def run(self):
        import tflite
        m = tflite.Model.GetRootAs(self.buf, 0)
        self.model = m
        nsub = m.SubgraphsLength()
        if nsub < 1:
            raise self.err("the model has no subgraph")
        self.sg = m.Subgraphs(0)
        self._read_opcodes()
        if nsub > 1 and not {"IF", "WHILE", "CALL_ONCE"} & set(self.opcodes):
            raise self.err(f"the model has {nsub} subgraphs (control flow); Kiln imports single-subgraph models, "
                           f"IF's branch subgraphs, WHILE's cond/body subgraphs and CALL_ONCE's initialisation "
                           f"subgraph")
        self._read_tensors()
        self._read_ops()
        self._build()
        return self.g

    def _read_opcodes(self):
        names = _op_names()
        self.opcodes = []
        for i in range(self.model.OperatorCodesLength()):
            oc = self.model.OperatorCodes(i)
            name = opcode_name(oc, names)
            if name in TFLITE_IMPORTERS:
                chk.check_version(self.err, name, i, int(oc.Version()))
            self.opcodes.append(name)

    def _read_tensors(self):
        sg, m = self.sg, self.model
        nb = m.BuffersLength()
        self.tensors = []
        for i in range(sg.TensorsLength()):
            t = sg.Tensors(i)
            raw_name = t.Name()
            tname = raw_name.decode("utf-8", "replace") if raw_name else f"t{i}"
            where = f"tensor {i} ({tname!r})"
            rank = t.ShapeLength()
            if rank > MAX_RANK:
                raise self.err(f"{where}: rank {rank} is out of range: Kiln imports up to rank {MAX_RANK}")
            shape = tuple(int(v) for v in (t.ShapeAsNumpy() if rank else ()))
            if any(d < 0 for d in shape):
                raise self.err(f"{where}: shape {list(shape)} has a negative or dynamic dimension; Kiln imports "
                               f"static shapes (every dimension >= 0)")
            check_limit("max_tensor_elements", math.prod(shape), f"{self.where} {where}")
            ttype = int(t.Type())
            if ttype not in _TYPES:
                raise self.err(f"{where}: type {_TYPE_NAMES.get(ttype, ttype)} is not one Kiln imports")
            dtype = _TYPES[ttype]
            self._unsupported_tensor_fields(t, where)
            if dtype == "resource":            # a variable's handle: no data, no quantisation
                if t.Quantization() is not None or (nb and self.model.Buffers(int(t.Buffer())).DataLength()
                                                    if 0 <= int(t.Buffer()) < nb else False):
                    raise self.err(f"{where}: a RESOURCE (variable handle) tensor holds data or quantisation "
                                   f"parameters; TFLite's VAR_HANDLE outputs carry neither")
                self.tensors.append(dict(name=tname, shape=shape, dtype=dtype, quant=None, data=None,
                                         variable=bool(t.IsVariable())))
                continue
            quant = self._quant(t, where, dtype, shape)
            bidx = int(t.Buffer())
            if not 0 <= bidx < max(nb, 1) or (nb == 0 and bidx != 0):
                raise self.err(f"{where}: buffer = {bidx} is out of range: the file has {nb} buffers")
            data = self._buffer_data(bidx, where, shape, dtype) if nb else None
            self.tensors.append(dict(name=tname, shape=shape, dtype=dtype, quant=quant, data=data,
                                     variable=bool(t.IsVariable()), dynamic=self._dynamic(t)))

    @staticmethod
    def _dynamic(t):
        """The tensor's shape_signature has a -1 (its shape is a placeholder, known at run time)."""
        return bool(t.ShapeSignatureLength()) and bool(np.any(t.ShapeSignatureAsNumpy() < 0))

    def _unsupported_tensor_fields(self, t, where):
        tab = t._tab
        for slot, what in ((16, "sparsity parameters (a sparse tensor)"), (22, "variant_tensors"),
                           (24, "an external_buffer")):
            o = tab.Offset(slot)
            if o and (slot != 24 or _raw(tab, slot, _fbt.Uint32Flags, 0)):
                raise self.err(f"{where}: has {what}, which Kiln does not import")

    def _quant(self, t, where, dtype, shape):
        q = t.Quantization()
        if q is None:
            return None
        if int(q.DetailsType()) != 0:
            raise self.err(f"{where}: custom quantisation details (type {int(q.DetailsType())}) are not supported")
        scales = q.ScaleAsNumpy() if q.ScaleLength() else np.zeros(0, np.float32)
        zps = q.ZeroPointAsNumpy() if q.ZeroPointLength() else np.zeros(0, np.int64)
        return chk.quantization(self.err, where, dtype, shape, np.asarray(scales, np.float32),
                                np.asarray(zps, np.int64), int(q.QuantizedDimension()))

    def _buffer_data(self, bidx, where, shape, dtype):
        b = self.model.Buffers(bidx)
        n = b.DataLength()
        off, size = int(b.Offset()), int(b.Size())
        if n == 0 and off > 1:
            # large models keep buffers after the flatbuffer: offset/size into the file
            if off + size > len(self.buf):
                raise self.err(f"{where}: buffer {bidx} at offset {off} size {size} lies outside the file")
            raw = memoryview(self.buf)[off:off + size]
        elif n == 0:     # no data: a run-time tensor, or an empty index vector (RESHAPE's shape [] of a scalar)
            return np.zeros(shape, dtype) if shape == (0,) and dtype in ("int32", "int64") else None
        else:
            raw = b.DataAsNumpy()
        itemsize = np.dtype(dtype).itemsize
        want = math.prod(shape) * itemsize
        if len(raw) != want:
            raise self.err(f"{where}: buffer {bidx} holds {len(raw):,} bytes but shape {list(shape)} "
                           f"of {dtype} needs {want:,}")
        return np.frombuffer(bytes(raw), dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape)

    def _read_ops(self):
        sg = self.sg
        self.ops = []
        bad = []
        nt = len(self.tensors)
        for k in range(sg.OperatorsLength()):
            op = sg.Operators(k)
            idx = int(op.OpcodeIndex())
            if not 0 <= idx < len(self.opcodes):
                raise self.err(f"operator {k}: opcode_index = {idx} is out of range: the file has "
                               f"{len(self.opcodes)} operator codes")
            opname = self.opcodes[idx]
            ins = [int(v) for v in (op.InputsAsNumpy() if op.InputsLength() else ())]
            outs = [int(v) for v in (op.OutputsAsNumpy() if op.OutputsLength() else ())]
            for v in ins + outs:
                if not (-1 <= v < nt) or (v == -1 and v in outs):
                    raise self.err(f"operator {k} ({opname}): tensor index {v} is out of range: allowed "
                                   f"{'0' if v in outs else '-1'}..{nt - 1}")
            if opname not in TFLITE_IMPORTERS:
                bad.append((opname, k))
            elif _raw(op._tab, 26, _fbt.Uint8Flags, 0):
                raise self.err(f"operator {k} ({opname}) has builtin_options_2, which Kiln does not import")
            self.ops.append((opname, op, ins, outs))
        if bad:
            first, k = bad[0]
            listing = ", ".join(f"{n} (operator {i})" for n, i in bad)
            raise self.err(f"unsupported TFLite op {first} at operator {k}; unsupported ops in this file: {listing}. "
                           f"Kiln imports: {', '.join(supported())}")
        unused = [f"{n} (operator code {i})" for i, n in enumerate(self.opcodes) if n not in TFLITE_IMPORTERS]
        if unused:
            raise self.err(f"the file lists operator codes Kiln does not import: {', '.join(unused)}; "
                           f"Kiln imports: {', '.join(supported())}")

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
        if t["dtype"] == "resource":
            raise self.err(f"{self.label(i)} is a RESOURCE (variable handle) tensor where a value is expected; "
                           f"only VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE use handles")
        return TensorType(t["shape"], t["dtype"], t["quant"])

    def _io_list(self, what, vec_len, vec):
        idx = [int(v) for v in (vec() if vec_len() else ())]
        for i in idx:
            if not 0 <= i < len(self.tensors):
                raise self.err(f"subgraph {what}: tensor index {i} is out of range: allowed 0..{len(self.tensors) - 1}")
        if len(set(idx)) != len(idx):
            raise self.err(f"subgraph {what} {idx} list a tensor twice")
        return idx

    def _build(self):
        sg = self.sg
        ins = self._io_list("inputs", sg.InputsLength, sg.InputsAsNumpy)
        outs = self._io_list("outputs", sg.OutputsLength, sg.OutputsAsNumpy)
        if not self.ops:
            raise self.err("the subgraph has no operators: there is nothing to compute")
        if not ins:
            raise self.err("the subgraph has no inputs; Kiln imports models that read at least one input")
        if not outs:
            raise self.err("the subgraph has no outputs")
        for i in ins:
            t = self.tensors[i]
            if t["data"] is not None:
                raise self.err(f"graph input {self.label(i)} holds constant data; an input is fed at run time")
            if t["dtype"] != "int32":          # int32 inputs: indices (GATHER, DYNAMIC_UPDATE_SLICE starts), QUANTIZE, TRANSPOSE_CONV's shape
                self.activation_type(i, "graph input")
            self.values[i] = self.g.add_input(self._vname(t["name"]), self._ttype(i))
        self._run_ops()
        for finish in self.finishers:        # e.g. resource variables' states (frontend/ops/variables.py)
            finish(self)
        for i in outs:
            if self.tensors[i]["data"] is not None or i in self.folded:
                raise self.err(f"graph output {self.label(i)} is a constant; Kiln compiles outputs that operators "
                               f"compute (or graph inputs)")
            if i not in self.values:
                raise self.err(f"graph output {self.label(i)} is never computed: no operator writes it and it "
                               f"is not an input")
            self.g.outputs.append(self.values[i])
        self.g.meta["source"] = os.path.basename(self.where)
        self.g.meta["tflite_tensors"] = {v: i for i, v in self.values.items()}

    def _run_ops(self):
        """Convert the subgraph's operators in order (the values of its inputs are set)."""
        fold = getattr(self, "fold_op", None)
        for k, (opname, op, oins, oouts) in enumerate(self.ops):
            if fold is not None and fold(self, k, opname, op, oins, oouts):
                continue
            # converters marked multi_output (SPLIT, UNPACK) get the list of output tensors
            multi = getattr(TFLITE_IMPORTERS[opname], "multi_output", False)
            if len(oouts) != 1 and not (multi and (oouts or getattr(TFLITE_IMPORTERS[opname], "no_outputs", False))):
                raise self.err(f"operator {k} ({opname}) has {len(oouts)} outputs; expected 1")
            for o in oouts:
                if o in self.values or o in self.folded or self.tensors[o]["data"] is not None or oouts.count(o) > 1:
                    raise self.err(f"operator {k} ({opname}) writes {self.label(o)}, which already has a value "
                                   f"(a graph input, a constant or another operator's output)")
            o = oouts if multi else oouts[0]
            for i in oins:
                if (i >= 0 and i not in self.values and i not in self.folded and self.tensors[i]["data"] is None
                        and not self.tensors[i]["variable"]):
                    raise self.err(f"operator {k} ({opname}) reads {self.label(i)} before any operator produces "
                                   f"it (and it is not a constant or a graph input)")
            TFLITE_IMPORTERS[opname](self, k, op, list(oins), o)

    def inline_subgraph(self, index, args, where, consts=False, fold=None):
        """Import subgraph ``index`` into this graph with its inputs bound to ``args`` (a
        control-flow op's branch): Kiln value names, this subgraph's tensor indices for constants
        (the branch reads their data) or arrays (constants computed at import: WHILE's counters).
        Returns the values of its outputs; with ``consts`` an output the subgraph does not compute
        (a constant, or a constant input passed through) is returned as its array. ``fold(sub, k,
        opname, op, ins, outs)`` may compute an operator at import (it returns True when it set
        the outputs' data): WHILE's integer counter chain."""
        nsub = self.model.SubgraphsLength()
        depth = getattr(self, "depth", 0) + 1
        if not 0 < index < nsub:
            raise self.err(f"{where}: subgraph index {index} is out of range: allowed 1..{nsub - 1}")
        if depth > MAX_SUBGRAPH_DEPTH:
            raise self.err(f"{where}: subgraphs nest deeper than {MAX_SUBGRAPH_DEPTH} (a cycle?)")
        sub = _Importer(self.buf, f"{self.where} (subgraph {index})", self.name)
        sub.g, sub.used_names, sub.model, sub.opcodes, sub.depth = self.g, self.used_names, self.model, self.opcodes, depth
        sub.finishers, sub.shared, sub.fold_op = self.finishers, self.shared, fold
        sub.sg = self.model.Subgraphs(index)
        sub._read_tensors()
        sub._read_ops()
        ins = sub._io_list("inputs", sub.sg.InputsLength, sub.sg.InputsAsNumpy)
        outs = sub._io_list("outputs", sub.sg.OutputsLength, sub.sg.OutputsAsNumpy)
        if len(ins) != len(args):
            raise self.err(f"{where}: subgraph {index} takes {len(ins)} inputs, the op passes {len(args)}")
        for i, a in zip(ins, args):
            want = sub._ttype(i)
            is_array = isinstance(a, np.ndarray)
            got = (self.g.types[a] if isinstance(a, str) else
                   TensorType(a.shape, str(a.dtype), want.quant) if is_array else self._ttype(a))
            if (tuple(want.shape), want.dtype, want.quant) != (tuple(got.shape), got.dtype, got.quant):
                raise self.err(f"{where}: subgraph {index} input {sub.label(i)} is {want}, the op passes {got}")
            if isinstance(a, str):
                sub.values[i] = a
            else:                           # a constant stays one in the branch (weights it reads)
                sub.tensors[i]["data"] = a if is_array else self.folded.get(a, self.tensors[a]["data"])
        sub._run_ops()
        if consts:
            return [sub.values[o] if o in sub.values else sub.folded.get(o, sub.tensors[o]["data"]) for o in outs]
        missing = [sub.label(o) for o in outs if o not in sub.values]
        if missing:
            raise self.err(f"{where}: subgraph {index} output {missing[0]} is never computed (a constant output?)")
        return [sub.values[o] for o in outs]

    def activation_type(self, i, where):
        """Check tensor i can be an op operand (float32, or int8 with quantisation parameters)."""
        t = self.tensors[i]
        if t["dtype"] not in ACTIVATION_DTYPES:
            raise self.err(f"{where}: {self.label(i)} has type {t['dtype']}; Kiln imports float32, int8 and int16 operands")
        if t["dtype"] in ("int8", "int16") and t["quant"] is None:
            raise self.err(f"{where}: {self.label(i)} is {t['dtype']} without quantisation parameters (scale and zero "
                           f"point); Kiln imports quantised int8 tensors")
        return t

    def value(self, i, k, opname):
        """Kiln value for tflite tensor i used by operator k (constants are added on first use)."""
        if i in self.values:
            return self.values[i]
        t = self.tensors[i]
        data = self.folded.get(i, t["data"])
        if t["variable"]:
            raise self.err(f"operator {k} ({opname}) reads variable tensor {self.label(i)}; Kiln imports variable "
                           f"tensors only as the state of recurrent ops (UNIDIRECTIONAL_SEQUENCE_LSTM)")
        if data is None:
            raise self.err(f"operator {k} ({opname}) reads {self.label(i)} before any operator produces it "
                           f"(and it is not a constant or a graph input)")
        name = self._vname(t["name"])
        self.g.add_const(name, data, None if i in self.folded else t["quant"])
        self.values[i] = name
        return name

    def operand(self, i, k, opname):
        """value() of an activation-like operand (float32, or quantised int8)."""
        if i not in self.folded:
            self.activation_type(i, f"operator {k} ({opname})")
        return self.value(i, k, opname)

    def const(self, i, k, opname, what):
        t = self.tensors[i]
        data = self.folded.get(i, t["data"])
        if data is None:
            raise self.err(f"operator {k} ({opname}): {what} ({self.label(i)}) must be a constant")
        return data

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
        if tuple(inferred.shape) != tuple(t.shape) and self.tensors[out].get("dynamic") and \
                getattr(self, "fold_op", None) is not None:
            # an unrolled WHILE body: a dynamic shape (a lowered tensor list's slice) is known now
            t = TensorType(inferred.shape, t.dtype, t.quant)
            self.tensors[out]["shape"] = tuple(inferred.shape)
        if tuple(inferred.shape) != tuple(t.shape):
            raise self.err(f"operator {k} ({opname}): output {self.label(out)} has shape {list(t.shape)} but the "
                           f"op computes {list(inferred.shape)}")
        if inferred.dtype != t.dtype and kop not in ("quantize", "dequantize", "cast"):
            raise self.err(f"operator {k} ({opname}): output {self.label(out)} has type {t.dtype} but the inputs "
                           f"are {in_types[0].dtype}")
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
