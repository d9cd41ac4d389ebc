"""Kiln serial protocol, host side: frame encoding, a resynchronising decoder, payload layouts.

Mirror of firmware/runtime/kiln_frame.h (and docs/firmware.md, "Protocol"):

    A5 5A | LEN u16 | TYPE u8 | SEQ u8 | HCRC u8 | PAYLOAD[LEN] | CRC32 u32

HCRC is CRC-8 (poly 0x07) of LEN/TYPE/SEQ, CRC32 is zlib's CRC-32 of LEN..PAYLOAD; all
integers little-endian. A reply to request type T has type ``T | 0x80``.
"""
from __future__ import annotations

import struct
import zlib
from collections import deque
from dataclasses import dataclass
from enum import IntEnum

VERSION = 1
SYNC = b"\xA5\x5A"
HEADER = 7
TRAILER = 4
MAX_PAYLOAD = 512
REPLY = 0x80


class T(IntEnum):
    """Frame types."""
    HELLO = 0x01
    INFO = 0x02
    SET_INPUT = 0x03
    INVOKE = 0x04
    GET_OUTPUT = 0x05
    GET_PROFILE = 0x06
    GET_STACK = 0x07
    EXIT = 0x08
    ECHO = 0x09
    RESET = 0x0A
    BOOT = 0x70
    FAULT = 0x71
    ACK = 0x7E
    NAK = 0x7F


class NakError(IntEnum):
    CRC = 1
    LENGTH = 2
    TYPE = 3
    ARGS = 4
    MODEL = 5


TIMER_KINDS = {0: "none", 1: "dwt", 2: "systick"}


def crc8(data: bytes) -> int:
    crc = 0
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def encode(ftype: int, seq: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds the protocol maximum {MAX_PAYLOAD}")
    hdr = struct.pack("<HBB", len(payload), ftype & 0xFF, seq & 0xFF)
    body = hdr + bytes([crc8(hdr)]) + payload
    return SYNC + body + struct.pack("<I", zlib.crc32(body))


@dataclass(frozen=True)
class Frame:
    type: int
    seq: int
    payload: bytes

    def __repr__(self) -> str:
        try:
            name = T(self.type & 0x7F if self.type & REPLY else self.type).name
        except ValueError:
            name = f"0x{self.type:02x}"
        if self.type & REPLY:
            name += "_REPLY"
        return f"Frame({name}, seq={self.seq}, {len(self.payload)} B)"


class Decoder:
    """Byte-stream -> frames. Garbage, bad header checks and bad CRCs are skipped one byte at a
    time and the rest re-scanned, so a good frame after (or inside) garbage is still found.
    Keeps the last bytes seen for error messages."""

    def __init__(self, history: int = 64):
        self.buf = bytearray()
        self.recent: deque[int] = deque(maxlen=history)
        self.skipped = 0
        self.crc_errors = 0

    def feed(self, data: bytes) -> list[Frame]:
        self.buf += data
        self.recent.extend(data)
        frames = []
        while True:
            f = self._next()
            if f is None:
                return frames
            frames.append(f)

    def _drop(self, n: int = 1) -> None:
        del self.buf[:n]
        self.skipped += n

    def _next(self) -> Frame | None:
        b = self.buf
        while True:
            i = b.find(SYNC)
            if i < 0:
                keep = 1 if b[-1:] == SYNC[:1] else 0
                self.skipped += len(b) - keep
                del b[:len(b) - keep]
                return None
            if i:
                self._drop(i)
            if len(b) < HEADER:
                return None
            if crc8(b[2:6]) != b[6]:
                self._drop(1)
                continue
            length, ftype, seq = struct.unpack_from("<HBB", b, 2)
            if length > MAX_PAYLOAD:
                self._drop(1)
                continue
            total = HEADER + length + TRAILER
            if len(b) < total:
                return None
            (crc,) = struct.unpack_from("<I", b, HEADER + length)
            if crc != zlib.crc32(bytes(b[2:HEADER + length])):
                self.crc_errors += 1
                self._drop(1)
                continue
            frame = Frame(ftype, seq, bytes(b[HEADER:HEADER + length]))
            del b[:total]
            return frame

    def recent_hex(self) -> str:
        data = bytes(self.recent)
        return data.hex(" ") if data else "(nothing)"


# ---- payload layouts -------------------------------------------------------------------------
@dataclass(frozen=True)
class Info:
    arena_bytes: int
    input_bytes: int
    output_bytes: int
    num_commands: int
    clock_hz: int
    timer_hz: int
    stack_bytes: int
    arena_addr: int
    timer: str
    fpu: bool
    protocol: int
    board: str
    core: str
    build_id: str

    @classmethod
    def unpack(cls, p: bytes) -> "Info":
        vals = struct.unpack_from("<8I4B", p, 0)
        strs = p[36:].split(b"\0")
        strs = [s.decode("ascii", "replace") for s in strs] + ["", "", ""]
        return cls(*vals[:8], TIMER_KINDS.get(vals[8], str(vals[8])), bool(vals[9]), vals[10],
                   strs[0], strs[1], strs[2])


@dataclass(frozen=True)
class InvokeResult:
    rc: int
    ticks: int
    timer_hz: int
    timer: str
    marks: int
    instructions: int | None = None      # exact, from the QEMU plugin when available
    instruction_source: str | None = None

    @classmethod
    def unpack(cls, p: bytes) -> "InvokeResult":
        rc, ticks, hz, kind, marks = struct.unpack_from("<iQIBB", p, 0)
        return cls(rc, ticks, hz, TIMER_KINDS.get(kind, str(kind)), marks)

    @property
    def seconds(self) -> float:
        return self.ticks / self.timer_hz if self.timer_hz else float("nan")


@dataclass(frozen=True)
class StackInfo:
    size: int
    used: int
    base: int

    @property
    def free(self) -> int:
        return self.size - self.used


@dataclass(frozen=True)
class Fault:
    ipsr: int
    cfsr: int
    hfsr: int
    r0: int
    r1: int
    r2: int
    r3: int
    r12: int
    lr: int
    pc: int
    xpsr: int
    sp: int

    @classmethod
    def unpack(cls, p: bytes) -> "Fault":
        return cls(*struct.unpack_from("<12I", p, 0))

    def __str__(self) -> str:
        return (f"exception {self.ipsr & 0x1FF} at pc=0x{self.pc:08x} lr=0x{self.lr:08x} "
                f"sp=0x{self.sp:08x} CFSR=0x{self.cfsr:08x} HFSR=0x{self.hfsr:08x}")
