"""Reproducible mutants of a .tflite flatbuffer, for the import campaign (test_tflite_campaign.py).

``mutant(buf, seed, index)`` returns ``(kind, description, bytes)``; the same arguments always give
the same bytes, so any failure is reproduced from (model, seed, index) alone. Kinds:

- byte level: ``flip`` (1-8 random bytes), ``truncate``, ``word`` (an extreme 32-bit word at an
  aligned position), ``zero`` (a zeroed range), ``dup`` (a duplicated range);
- field level, written in place at the field's own position in the flatbuffer: ``dim`` (a shape
  element), ``scale``, ``zero_point``, ``qdim`` (quantized_dimension), ``type`` (tensor type),
  ``buffer`` (a tensor's buffer index), ``op_io`` (an operator's input/output tensor index),
  ``opcode`` (an operator's opcode index or an operator code's builtin code), ``option`` (a field
  of an operator's builtin options: strides, dilations, filter sizes, padding, activation...),
  ``offset`` (a uoffset that points at a table, vector or string), ``veclen`` (a vector's length
  prefix), ``weights`` (bytes of a constant buffer; extreme int32 values in biases).

90% of the byte-level point mutations hit the flatbuffer structure, 10% the weights.
"""
from __future__ import annotations

import struct

import numpy as np

KINDS = ("flip", "truncate", "word", "zero", "dup", "dim", "scale", "zero_point", "qdim", "type", "buffer",
         "op_io", "opcode", "option", "offset", "veclen", "weights")
EXTREMES = (0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x00010000, 0x40000000, 0x0FFFFFFF, 1, 0)

# vtable slots of the TFLite schema fields the mutators write (schema.fbs field order * 2 + 4)
_T_SHAPE, _T_TYPE, _T_BUFFER, _T_NAME, _T_QUANT = 4, 6, 8, 10, 12
_Q_SCALE, _Q_ZP, _Q_DIM = 8, 10, 16
_OP_OPCODE, _OP_IN, _OP_OUT, _OP_OPTS = 4, 6, 8, 12
_OC_DEPRECATED, _OC_BUILTIN = 4, 10
_SG_TENSORS, _SG_IN, _SG_OUT, _SG_OPS = 4, 6, 8, 10
_M_CODES, _M_SUBGRAPHS, _M_BUFFERS = 6, 8, 12
_B_DATA = 4


def _vec(tab, slot):
    """(start, length) of vector field ``slot`` of a flatbuffers Table, or None."""
    o = tab.Offset(slot)
    if not o:
        return None
    return tab.Vector(o), tab.VectorLen(o)


def _pos(tab, slot):
    o = tab.Offset(slot)
    return tab.Pos + o if o else None


def _table_fields(buf, tab_pos):
    """(position, size) of every present field of the table at tab_pos (sizes from the gaps
    between field offsets, at most 4 bytes): the options tables' scalars."""
    vt = tab_pos - struct.unpack_from("<i", buf, tab_pos)[0]
    vt_len, tab_len = struct.unpack_from("<HH", buf, vt)
    offs = sorted({struct.unpack_from("<H", buf, vt + 4 + 2 * i)[0] for i in range((vt_len - 4) // 2)} - {0})
    out = []
    for k, o in enumerate(offs):
        end = offs[k + 1] if k + 1 < len(offs) else tab_len
        size = max(1, min(4, end - o))
        size = 4 if size >= 4 else (2 if size >= 2 else 1)
        out.append((tab_pos + o, size))
    return out


class FieldMap:
    """Positions of the fields the field-level mutators write, found with the tflite accessors."""

    def __init__(self, buf: bytes):
        import tflite
        m = tflite.Model.GetRootAs(buf, 0)
        self.f = {k: [] for k in KINDS}
        self.n_tensors = 0
        self.n_buffers = m.BuffersLength()
        self.n_codes = m.OperatorCodesLength()
        self.len = len(buf)
        self._model(m, buf)

    def add(self, kind, pos, fmt, what):
        if pos is not None:
            self.f[kind].append((pos, fmt, what))

    def _ref(self, tab, slot, what):
        self.add("offset", _pos(tab, slot), "<I", what)
        v = _vec(tab, slot)
        if v is not None:
            self.add("veclen", v[0] - 4, "<I", what + " length")
        return v

    def _model(self, m, buf):
        mt = m._tab
        for slot, what in ((_M_CODES, "operator_codes"), (_M_SUBGRAPHS, "subgraphs"), (_M_BUFFERS, "buffers")):
            self._ref(mt, slot, "model." + what)
        for i in range(self.n_codes):
            t = m.OperatorCodes(i)._tab
            self.add("opcode", _pos(t, _OC_BUILTIN), "<i", f"operator_code {i}.builtin_code")
            self.add("opcode", _pos(t, _OC_DEPRECATED), "<b", f"operator_code {i}.deprecated_builtin_code")
        for i in range(self.n_buffers):
            b = m.Buffers(i)
            v = self._ref(b._tab, _B_DATA, f"buffer {i}.data")
            if v is not None and v[1]:
                self.f["weights"].append((v[0], v[1], f"buffer {i}"))
        sg = m.Subgraphs(0)
        st = sg._tab
        for slot, what in ((_SG_TENSORS, "tensors"), (_SG_IN, "inputs"), (_SG_OUT, "outputs"), (_SG_OPS, "operators")):
            v = self._ref(st, slot, "subgraph." + what)
            if v is not None and slot in (_SG_IN, _SG_OUT):
                for k in range(v[1]):
                    self.add("op_io", v[0] + 4 * k, "<i", f"subgraph.{what}[{k}]")
        self.n_tensors = sg.TensorsLength()
        for i in range(self.n_tensors):
            self._tensor(sg.Tensors(i), i)
        for k in range(sg.OperatorsLength()):
            self._operator(sg.Operators(k), k, buf)

    def _tensor(self, t, i):
        tt = t._tab
        v = self._ref(tt, _T_SHAPE, f"tensor {i}.shape")
        if v is not None:
            for k in range(v[1]):
                self.add("dim", v[0] + 4 * k, "<i", f"tensor {i}.shape[{k}]")
        self.add("type", _pos(tt, _T_TYPE), "<b", f"tensor {i}.type")
        self.add("buffer", _pos(tt, _T_BUFFER), "<I", f"tensor {i}.buffer")
        self._ref(tt, _T_NAME, f"tensor {i}.name")
        self.add("offset", _pos(tt, _T_QUANT), "<I", f"tensor {i}.quantization")
        q = t.Quantization()
        if q is None:
            return
        qt = q._tab
        v = self._ref(qt, _Q_SCALE, f"tensor {i}.scale")
        if v is not None:
            for k in range(v[1]):
                self.add("scale", v[0] + 4 * k, "<f", f"tensor {i}.scale[{k}]")
        v = self._ref(qt, _Q_ZP, f"tensor {i}.zero_point")
        if v is not None:
            for k in range(v[1]):
                self.add("zero_point", v[0] + 8 * k, "<q", f"tensor {i}.zero_point[{k}]")
        self.add("qdim", _pos(qt, _Q_DIM), "<i", f"tensor {i}.quantized_dimension")

    def _operator(self, op, k, buf):
        ot = op._tab
        self.add("opcode", _pos(ot, _OP_OPCODE), "<I", f"operator {k}.opcode_index")
        for slot, what in ((_OP_IN, "inputs"), (_OP_OUT, "outputs")):
            v = self._ref(ot, slot, f"operator {k}.{what}")
            if v is not None:
                for j in range(v[1]):
                    self.add("op_io", v[0] + 4 * j, "<i", f"operator {k}.{what}[{j}]")
        p = _pos(ot, _OP_OPTS)
        if p is not None:
            self.add("offset", p, "<I", f"operator {k}.builtin_options")
            tab = p + struct.unpack_from("<I", buf, p)[0]
            for fp, size in _table_fields(buf, tab):
                self.add("option", fp, {1: "<B", 2: "<H", 4: "<i"}[size], f"operator {k}.options@{fp - tab}")


def structural_positions(buf: bytes):
    """Byte offsets outside the constant-data buffers: where the flatbuffer structure lives."""
    import tflite
    m = tflite.Model.GetRootAs(buf, 0)
    mask = np.ones(len(buf), bool)
    for i in range(m.BuffersLength()):
        b = m.Buffers(i)
        if b.DataLength():
            o = b._tab.Vector(b._tab.Offset(4))
            mask[o:o + b.DataLength()] = False
    return np.flatnonzero(mask)


def _values(kind, old, rng, fm):
    """Candidate new values for a field of ``kind`` whose current value is ``old``."""
    if kind == "dim":
        return [0, 1, -1, old + 1, max(old - 1, 0), 2 * old, 65536, (1 << 31) - 1, -(1 << 31), 3]
    if kind == "scale":
        return [0.0, -old, float("nan"), float("inf"), -float("inf"), 1e30, 3.4e38, 1e-40, 1e-45, old * 2, old / 2,
                old * 1e6, old * 1e-6, 1e12, 1e-12, 1e9, 2e-10, float(np.nextafter(np.float32(old), np.float32(1)))]
    if kind == "zero_point":
        return [256, -129, 128, 127, -128, 255, -1, 1, old + 1, old - 1, 1 << 31, -(1 << 31) - 1, (1 << 31) - 1,
                (1 << 63) - 1, -(1 << 63), 32767, 32768, -32768, 5]
    if kind == "qdim":
        return [-1, 0, 1, 2, 3, 4, 100, (1 << 31) - 1]
    if kind == "type":
        return [v for v in range(18) if v != old]
    if kind == "buffer":
        return [0, old + 1, max(old - 1, 0), int(rng.integers(0, max(fm.n_buffers, 1))), fm.n_buffers, 1 << 31,
                0xFFFFFFFF]
    if kind == "op_io":
        return [-1, old + 1, old - 1, int(rng.integers(0, max(fm.n_tensors, 1))), fm.n_tensors, (1 << 31) - 1, -2]
    if kind == "opcode":
        return [0, old + 1, max(old - 1, 0), fm.n_codes, 32, 3, 4, 9, 17, 22, 25, 40, 43, 127, -1, 1 << 20]
    if kind == "option":
        return [0, 1, 2, 3, 4, 5, 6, -1, 255, 1 << 16, 1 << 30, (1 << 31) - 1, -(1 << 31), old + 1, 2 * old]
    if kind == "offset":
        return [old + 4, old - 4, old + 1, old + 8, 0, 0xFFFFFFFF, 0x7FFFFFFF, fm.len, int(rng.integers(0, fm.len))]
    if kind == "veclen":
        return [0, max(old - 1, 0), old + 1, 2 * old, 0x7FFFFFFF, 0xFFFFFFFF, 0x10000000]
    raise ValueError(kind)


def _write(b, pos, fmt, value):
    lim = {"<b": (-128, 127), "<B": (0, 255), "<H": (0, 65535), "<i": (-(1 << 31), (1 << 31) - 1),
           "<I": (0, (1 << 32) - 1), "<q": (-(1 << 63), (1 << 63) - 1)}.get(fmt)
    if lim is not None:
        value = int(value)
        value = (value - lim[0]) % (lim[1] - lim[0] + 1) + lim[0]    # wrap into the field's type
    struct.pack_into(fmt, b, pos, value)


def _field_mutant(buf, kind, rng, fm):
    if kind == "weights":
        if not fm.f["weights"]:
            return None
        start, n, what = fm.f["weights"][int(rng.integers(0, len(fm.f["weights"])))]
        b = bytearray(buf)
        if n % 4 == 0 and rng.random() < 0.5:          # an extreme word (int32 bias)
            p = start + 4 * int(rng.integers(0, n // 4))
            v = int(rng.choice([(1 << 31) - 1, -(1 << 31), 1 << 30, -(1 << 30), 1 << 24]))
            struct.pack_into("<i", b, p, v)
            return f"{what}: int32 at +{p - start} = {v}", bytes(b)
        for _ in range(int(rng.integers(1, 9))):
            b[start + int(rng.integers(0, n))] = int(rng.integers(0, 256))
        return f"{what}: bytes changed", bytes(b)
    fields = fm.f[kind]
    if not fields:
        return None
    pos, fmt, what = fields[int(rng.integers(0, len(fields)))]
    old = struct.unpack_from(fmt, buf, pos)[0]
    cands = _values(kind, old, rng, fm)
    new = cands[int(rng.integers(0, len(cands)))]
    b = bytearray(buf)
    _write(b, pos, fmt, new)
    return f"{what}: {old!r} -> {struct.unpack_from(fmt, b, pos)[0]!r}", bytes(b)


def _byte_mutant(buf, kind, rng, struct_pos):
    L = len(buf)

    def pos():
        if rng.random() < 0.9:
            return int(struct_pos[int(rng.integers(0, len(struct_pos)))])
        return int(rng.integers(0, L))
    b = bytearray(buf)
    if kind == "flip":
        ps = [pos() for _ in range(int(rng.integers(1, 9)))]
        for p in ps:
            b[p] = int(rng.integers(0, 256))
        return f"bytes at {ps[:8]} changed", bytes(b)
    if kind == "truncate":
        n = int(rng.integers(0, L))
        return f"truncated to {n} bytes", bytes(b[:n])
    if kind == "word":
        p = min(pos(), L - 4) & ~3
        w = int(EXTREMES[int(rng.integers(0, len(EXTREMES)))])
        b[p:p + 4] = w.to_bytes(4, "little")
        return f"word at {p} = {w:#x}", bytes(b)
    if kind == "zero":
        p, k = pos(), int(rng.integers(1, 64))
        b[p:p + k] = bytes(len(b[p:p + k]))
        return f"{k} bytes at {p} zeroed", bytes(b)
    p, q = sorted(int(v) for v in rng.integers(0, L, 2))
    return f"bytes {p}..{q} duplicated", bytes(b[:q] + b[p:q] + b[q:])


_CACHE = {}


def mutant(buf: bytes, seed: int, index: int):
    """Mutant ``index`` of ``buf`` for ``seed``: (kind, description, bytes). Kinds rotate through
    KINDS; a kind with nothing to mutate in this model falls back to a byte flip."""
    key = hash(buf)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = (FieldMap(buf), structural_positions(buf))
    fm, struct_pos = _CACHE[key]
    rng = np.random.default_rng([seed, index])
    kind = KINDS[index % len(KINDS)]
    if kind in ("flip", "truncate", "word", "zero", "dup"):
        desc, data = _byte_mutant(buf, kind, rng, struct_pos)
        return kind, desc, data
    r = _field_mutant(buf, kind, rng, fm)
    if r is None:
        desc, data = _byte_mutant(buf, "flip", rng, struct_pos)
        return "flip", desc, data
    return kind, r[0], r[1]
