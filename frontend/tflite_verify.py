"""Structural check of a .tflite flatbuffer before anything reads it: the same rules as the
flatbuffers ``Verifier`` that TFLite runs on every model it loads (``VerifyModelBuffer``).

Every table reached from the root (the model, its subgraphs, tensors, quantisation parameters,
operators with their builtin options, operator codes, buffers, metadata and signatures) must have
its vtable inside the file; every present field must lie inside the file and be aligned to its
size; every offset must point forward, not at itself, and inside the file; every vector and
string must fit (strings end with a NUL byte); tables nest at most 64 deep and number at most a
million. The file is smaller than 2 GiB and carries the ``TFL3`` identifier.

Sub-tables that Kiln never imports (sparsity, variant sub-types, custom quantisation details,
second builtin options, external buffers) are checked as offsets only: the importer rejects a file
that has them, by name. :func:`verify` raises :class:`FlatbufferError` naming the table path, the
field and the byte offset.
"""
from __future__ import annotations

import struct

from .errors import SerializationError

MAX_BUFFER = (1 << 31) - 1
MAX_DEPTH = 64
MAX_TABLES = 1_000_000

# Scalar kinds: (struct format, size). Others: "str", "vec<N>" (N-byte elements), "vstr" (vector of
# strings), "vtab:T" (vector of tables), "tab:T", "union:U" (after its "_type" u8 field), "opaque"
# (an offset Kiln does not follow), "skip" (a deprecated field the schema no longer verifies).
_SCALAR = {"u8": ("<B", 1), "i8": ("<b", 1), "bool": ("<B", 1), "u16": ("<H", 2), "i32": ("<i", 4),
           "u32": ("<I", 4), "f32": ("<f", 4), "u64": ("<Q", 8), "i64": ("<q", 8)}

# Field order is the schema's (schema.fbs of TFLite): the vtable slot of field i is 4 + 2 * i.
SCHEMA = {
    "Model": ["version:u32", "operator_codes:vtab:OperatorCode", "subgraphs:vtab:SubGraph", "description:str",
              "buffers:vtab:Buffer", "metadata_buffer:vec4", "metadata:vtab:Metadata",
              "signature_defs:vtab:SignatureDef", "external_buffer_groups:opaque", "external_buffers:opaque"],
    "SubGraph": ["tensors:vtab:Tensor", "inputs:vec4", "outputs:vec4", "operators:vtab:Operator", "name:str",
                 "debug_metadata_index:i32"],
    "Tensor": ["shape:vec4", "type:i8", "buffer:u32", "name:str", "quantization:tab:QuantizationParameters",
               "is_variable:bool", "sparsity:opaque", "shape_signature:vec4", "has_rank:bool",
               "variant_tensors:opaque", "external_buffer:u32"],
    "QuantizationParameters": ["min:vec4", "max:vec4", "scale:vec4", "zero_point:vec8", "details_type:u8",
                               "details:opaque", "quantized_dimension:i32"],
    "Buffer": ["data:vec1", "offset:u64", "size:u64"],
    "OperatorCode": ["deprecated_builtin_code:i8", "custom_code:str", "version:i32", "builtin_code:i32"],
    "Operator": ["opcode_index:u32", "inputs:vec4", "outputs:vec4", "builtin_options_type:u8",
                 "builtin_options:union:BuiltinOptions", "custom_options:vec1", "custom_options_format:i8",
                 "mutating_variable_inputs:vec1", "intermediates:vec4", "large_custom_options_offset:u64",
                 "large_custom_options_size:u64", "builtin_options_2_type:u8", "builtin_options_2:opaque",
                 "debug_metadata_index:i32"],
    "Metadata": ["name:str", "buffer:u32"],
    "SignatureDef": ["inputs:vtab:TensorMap", "outputs:vtab:TensorMap", "signature_key:str", "deprecated_tag:skip",
                     "subgraph_index:u32"],
    "TensorMap": ["name:str", "tensor_index:u32"],
    # builtin options of the ops Kiln imports
    "Conv2DOptions": ["padding:i8", "stride_w:i32", "stride_h:i32", "fused_activation_function:i8",
                      "dilation_w_factor:i32", "dilation_h_factor:i32", "quantized_bias_type:i8"],
    "DepthwiseConv2DOptions": ["padding:i8", "stride_w:i32", "stride_h:i32", "depth_multiplier:i32",
                               "fused_activation_function:i8", "dilation_w_factor:i32", "dilation_h_factor:i32"],
    "FullyConnectedOptions": ["fused_activation_function:i8", "weights_format:i8", "keep_num_dims:bool",
                              "asymmetric_quantize_inputs:bool", "quantized_bias_type:i8"],
    "Pool2DOptions": ["padding:i8", "stride_w:i32", "stride_h:i32", "filter_width:i32", "filter_height:i32",
                      "fused_activation_function:i8"],
    "AddOptions": ["fused_activation_function:i8", "pot_scale_int16:bool"],
    "MulOptions": ["fused_activation_function:i8"],
    "ReshapeOptions": ["new_shape:vec4"],
    "SoftmaxOptions": ["beta:f32"],
    "QuantizeOptions": [], "DequantizeOptions": [], "PadOptions": [],
    "ReducerOptions": ["keep_dims:bool"],
    "ConcatenationOptions": ["axis:i32", "fused_activation_function:i8"],
}
# BuiltinOptions union member numbers (tflite.BuiltinOptions) of the tables above; any other member
# is checked as a table start only (Kiln rejects an operator whose options it does not read)
UNIONS = {"BuiltinOptions": {1: "Conv2DOptions", 2: "DepthwiseConv2DOptions", 5: "Pool2DOptions",
                             8: "FullyConnectedOptions", 9: "SoftmaxOptions", 10: "ConcatenationOptions",
                             11: "AddOptions", 17: "ReshapeOptions", 21: "MulOptions", 22: "PadOptions",
                             27: "ReducerOptions", 38: "DequantizeOptions", 89: "QuantizeOptions"}}


def _fields(table):
    out = []
    for i, spec in enumerate(SCHEMA[table]):
        name, kind = spec.split(":", 1)
        out.append((4 + 2 * i, name, kind))
    return out


_FIELDS = {t: _fields(t) for t in SCHEMA}


class TFLiteImportError(SerializationError):
    """A .tflite file is malformed, hostile or uses something Kiln does not import."""


class FlatbufferError(TFLiteImportError):
    """A .tflite file fails the flatbuffer structure check (what TFLite's verifier rejects)."""


class _Verifier:
    def __init__(self, buf, where):
        self.b, self.n, self.where = buf, len(buf), where
        self.depth = self.tables = 0

    def fail(self, path, msg):
        raise FlatbufferError(f"{self.where}: not a valid TFLite flatbuffer: {path}: {msg} "
                              f"(TFLite's verifier rejects this file)")

    def inside(self, pos, length, path, what):
        if not (length < self.n and 0 <= pos <= self.n - length):
            self.fail(path, f"{what} at byte {pos} ({length} bytes) lies outside the {self.n:,}-byte file")

    def aligned(self, pos, align, path, what):
        if pos % align:
            self.fail(path, f"{what} at byte {pos} is not aligned to {align} bytes")

    def u32(self, pos):
        return struct.unpack_from("<I", self.b, pos)[0]

    def offset(self, pos, path):
        """Target of the uoffset stored at pos (checked)."""
        self.aligned(pos, 4, path, "offset")
        self.inside(pos, 4, path, "offset")
        o = self.u32(pos)
        if o == 0 or o >= 1 << 31:
            self.fail(path, f"offset {o:#x} at byte {pos} must be in 1..2^31-1")
        self.inside(pos + o, 1, path, "target")
        return pos + o

    def vector(self, pos, elem, path):
        self.aligned(pos, 4, path, "vector length")
        self.inside(pos, 4, path, "vector length")
        count = self.u32(pos)
        if count >= MAX_BUFFER // elem:
            self.fail(path, f"vector of {count:,} elements is larger than a flatbuffer can be")
        self.inside(pos, 4 + elem * count, path, f"vector of {count:,} elements")
        return count

    def string(self, pos, path):
        count = self.vector(pos, 1, path)
        end = pos + 4 + count
        self.inside(end, 1, path, "string terminator")
        if self.b[end] != 0:
            self.fail(path, f"string at byte {pos} is not NUL-terminated")

    def table_start(self, pos, path):
        self.aligned(pos, 4, path, "table")
        self.inside(pos, 4, path, "table")
        vt = pos - struct.unpack_from("<i", self.b, pos)[0]
        self.depth += 1
        self.tables += 1
        if self.depth > MAX_DEPTH or self.tables > MAX_TABLES:
            self.fail(path, f"tables nest deeper than {MAX_DEPTH} or number more than {MAX_TABLES:,}")
        self.aligned(vt, 2, path, "vtable")
        self.inside(vt, 2, path, "vtable")
        vsize = struct.unpack_from("<H", self.b, vt)[0]
        if vsize & 1:
            self.fail(path, f"vtable at byte {vt} has odd size {vsize}")
        self.inside(vt, vsize, path, "vtable")
        return vt, vsize

    def field_pos(self, pos, vt, vsize, slot):
        if slot >= vsize:
            return None
        o = struct.unpack_from("<H", self.b, vt + slot)[0]
        return pos + o if o else None

    def table(self, pos, tname, path):
        vt, vsize = self.table_start(pos, path)
        if tname in _FIELDS:
            union_type = {}
            for slot, name, kind in _FIELDS[tname]:
                f = self.field_pos(pos, vt, vsize, slot)
                if f is None or kind == "skip":
                    continue
                self.field(f, name, kind, f"{path}.{name}", union_type)
        self.depth -= 1

    def field(self, f, name, kind, path, union_type):
        if kind in _SCALAR:
            fmt, size = _SCALAR[kind]
            self.aligned(f, size, path, "field")
            self.inside(f, size, path, "field")
            if name.endswith("_type"):
                union_type[name[:-5]] = struct.unpack_from(fmt, self.b, f)[0]
            return
        target = self.offset(f, path)
        if kind == "str":
            self.string(target, path)
        elif kind.startswith("vec") and kind[3:].isdigit():
            self.vector(target, int(kind[3:]), path)
        elif kind.startswith("vtab:"):
            count = self.vector(target, 4, path)
            for i in range(count):
                # elements are followed unchecked (flatbuffers' VerifyVectorOfTables): 0 is the element itself
                e = target + 4 + 4 * i
                self.table(e + self.u32(e), kind[5:], f"{path}[{i}]")
        elif kind.startswith("tab:"):
            self.table(target, kind[4:], path)
        elif kind.startswith("union:"):
            member = UNIONS[kind[6:]].get(union_type.get(name, 0))
            if union_type.get(name, 0):
                self.table(target, member or "?", f"{path}<{member or union_type[name]}>")


def verify(buf: bytes, where: str = "<bytes>") -> None:
    """Raise FlatbufferError unless ``buf`` passes the flatbuffer structure check."""
    v = _Verifier(buf, where)
    if len(buf) >= MAX_BUFFER:
        v.fail("file", f"{len(buf):,} bytes: a flatbuffer is smaller than 2 GiB")
    if len(buf) < 12:
        v.fail("file", f"{len(buf)} bytes is too short for a flatbuffer")
    if buf[4:8] != b"TFL3":
        v.fail("file", f"file identifier is {bytes(buf[4:8])!r}, expected b'TFL3'")
    v.table(v.offset(0, "root"), "Model", "model")
