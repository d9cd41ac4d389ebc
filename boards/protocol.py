"""Kiln serial protocol, host side: frame encoding, a resynchronising decoder, payload layouts.

Mirror of firmware/runtime/kiln_frame.h (and docs/firmware.md, "Protocol"):

    A5 5A | LEN u16 | TYPE u8 | SEQ u8 | HCRC u8 | PAYLOAD[LEN] | CRC32 u32

HCRC is CRC-8 (poly 0x07) of LEN/TYPE/SEQ, CRC32 is zlib's CRC-32 of LEN..PAYLOAD; all
integers little-endian. A reply to request type T has type ``T | 0x80``.

Version 2: every request but HELLO starts with the u32 session the host opened with HELLO, and
every reply but HELLO's starts with the board's session; INVOKE carries an invocation id plus the
length and CRC-32 of the whole input, and GET_OUTPUT / GET_PROFILE must name that invocation.
HELLO's and BOOT's layouts never change between versions, so a host always learns the board's
version before anything else.

Every ``unpack`` checks the payload's length against its layout and raises
:class:`ProtocolError` naming the field; values are range-checked by the host (boards/device.py).
"""
from __future__ import annotations

import struct
import zlib
from collections import deque
from dataclasses import dataclass
from enum import IntEnum

VERSION = 2
SYNC = b"\xA5\x5A"
HEADER = 7
TRAILER = 4
MAX_PAYLOAD = 512
MIN_PAYLOAD = 64        # the least max-payload a board may advertise (INFO must fit)
REPLY = 0x80
SESSION_BYTES = 4
MAX_IO = 32             # inputs + outputs a board may report
MAX_IO_BYTES = 16 << 20  # total input or output bytes a board may report
MAX_COMMANDS = 4096     # commands (profile stamps - 1) a board may report


class ProtocolError(ValueError):
    """A frame's payload does not match its layout (too short, too long, bad field)."""


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
    CRC = 1         # frame CRC mismatch: retransmit
    LENGTH = 2      # declared length above the maximum
    TYPE = 3        # unknown request type
    ARGS = 4        # payload malformed or out of range
    MODEL = 5       # reserved
    SESSION = 6     # the request's session is not the board's (it rebooted, or never said HELLO)
    INPUT = 7       # INVOKE: the board's input does not have the length/CRC the host named
    STALE = 8       # GET_OUTPUT/GET_PROFILE: the board holds no result of that invocation
    GAP = 9         # a frame stopped arriving mid-way (inter-byte timeout): retransmit


# NAKs after which the same frame is simply sent again
RETRANSMIT_NAKS = (NakError.CRC, NakError.LENGTH, NakError.GAP)
TIMER_KINDS = {0: "none", 1: "dwt", 2: "systick"}


def crc8(data: bytes) -> int:
    crc = 0
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def crc32(data: bytes) -> int:
    """The input check INVOKE carries (the firmware's kiln_crc32, zlib's CRC-32)."""
    return zlib.crc32(data) & 0xFFFFFFFF


def encode(ftype: int, seq: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds the protocol maximum {MAX_PAYLOAD}")
    hdr = struct.pack("<HBB", len(payload), ftype & 0xFF, seq & 0xFF)
    body = hdr + bytes([crc8(hdr)]) + payload
    return SYNC + body + struct.pack("<I", zlib.crc32(body))


def type_name(ftype: int) -> str:
    base = ftype & 0x7F if ftype & REPLY else ftype
    try:
        name = T(base).name
    except ValueError:
        name = f"0x{base:02x}"
    return name + ("_REPLY" if ftype & REPLY else "")


@dataclass(frozen=True)
class Frame:
    type: int
    seq: int
    payload: bytes

    def __repr__(self) -> str:
        return f"Frame({type_name(self.type)}, seq={self.seq}, {len(self.payload)} B)"


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

    def in_frame(self) -> bool:
        """A frame with a valid header is half-way in: the rest has not arrived yet."""
        b = self.buf
        return len(b) >= HEADER and b[:2] == SYNC and crc8(b[2:6]) == b[6]

    def discard(self) -> None:
        """Drop what is buffered (a frame that stopped arriving)."""
        self.skipped += len(self.buf)
        self.buf.clear()

    def recent_hex(self) -> str:
        data = bytes(self.recent)
        return data.hex(" ") if data else "(nothing)"


# ---- payload layouts -------------------------------------------------------------------------
def _need(what: str, p: bytes, n: int, exact: bool = True) -> None:
    if len(p) < n or (exact and len(p) != n):
        raise ProtocolError(f"{what} has {len(p)} bytes, expected {'' if exact else 'at least '}{n}")


def split_session(what: str, p: bytes) -> tuple[int, bytes]:
    """(session, rest) of a reply payload."""
    _need(what, p, SESSION_BYTES, exact=False)
    return struct.unpack_from("<I", p, 0)[0], p[SESSION_BYTES:]


@dataclass(frozen=True)
class Hello:
    """HELLO reply (layout frozen across versions): u16 version, u32 nonce, u16 max payload,
    u32 boot count."""
    version: int
    nonce: int
    max_payload: int
    boot_count: int

    @classmethod
    def unpack(cls, p: bytes) -> Hello:
        _need("HELLO reply", p, 2, exact=False)
        (version,) = struct.unpack_from("<H", p, 0)
        # a board of another version may append fields: check the length only for ours
        _need("HELLO reply", p, 12, exact=version == VERSION)
        return cls(*struct.unpack_from("<HIHI", p, 0))


@dataclass(frozen=True)
class Boot:
    """BOOT (layout frozen across versions): u16 version, u32 boot count."""
    version: int
    boot_count: int

    @classmethod
    def unpack(cls, p: bytes) -> Boot:
        _need("BOOT frame", p, 6)
        return cls(*struct.unpack_from("<HI", p, 0))


INFO_FIXED = struct.Struct("<8I4B2H")   # after the session


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
    input_sizes: tuple[int, ...] = ()
    output_sizes: tuple[int, ...] = ()

    @classmethod
    def unpack(cls, p: bytes) -> Info:
        """p: the INFO reply without its session."""
        _need("INFO reply", p, INFO_FIXED.size, exact=False)
        vals = INFO_FIXED.unpack_from(p, 0)
        n_in, n_out = vals[12], vals[13]
        if not (1 <= n_in and 1 <= n_out and n_in + n_out <= MAX_IO):
            raise ProtocolError(f"INFO reply reports {n_in} inputs and {n_out} outputs "
                                f"(expected at least 1 each, at most {MAX_IO} together)")
        sizes_end = INFO_FIXED.size + 4 * (n_in + n_out)
        _need("INFO reply", p, sizes_end, exact=False)
        sizes = struct.unpack_from(f"<{n_in + n_out}I", p, INFO_FIXED.size)
        tail = p[sizes_end:]
        if tail and not tail.endswith(b"\0"):
            raise ProtocolError(f"INFO reply: names {tail[:40]!r} are not NUL-terminated")
        strs = [s.decode("ascii", "replace") for s in tail.split(b"\0")[:-1]] if tail else []
        if len(strs) > 3:
            raise ProtocolError(f"INFO reply: {len(strs)} names, expected board, core, build id")
        strs += [""] * (3 - len(strs))
        return cls(*vals[:8], TIMER_KINDS.get(vals[8], str(vals[8])), bool(vals[9]), vals[10],
                   strs[0], strs[1], strs[2], tuple(sizes[:n_in]), tuple(sizes[n_in:]))

    def pack(self) -> bytes:
        """The INFO reply without its session (the fake board and tests use it)."""
        kind = {v: k for k, v in TIMER_KINDS.items()}.get(self.timer, 0)
        head = INFO_FIXED.pack(self.arena_bytes, self.input_bytes, self.output_bytes,
                               self.num_commands, self.clock_hz, self.timer_hz, self.stack_bytes,
                               self.arena_addr, kind, int(self.fpu), self.protocol, 0,
                               len(self.input_sizes), len(self.output_sizes))
        sizes = struct.pack(f"<{len(self.input_sizes) + len(self.output_sizes)}I",
                            *self.input_sizes, *self.output_sizes)
        names = b"".join(s.encode("ascii") + b"\0" for s in (self.board, self.core, self.build_id))
        return head + sizes + names


INVOKE_REPLY = struct.Struct("<IiQIBB")   # after the session


@dataclass(frozen=True)
class InvokeResult:
    rc: int
    ticks: int
    timer_hz: int
    timer: str
    marks: int
    instructions: int | None = None      # exact, from the QEMU plugin when available
    instruction_source: str | None = None
    invocation: int = 0

    @classmethod
    def unpack(cls, p: bytes) -> InvokeResult:
        """p: the INVOKE reply without its session."""
        _need("INVOKE reply", p, INVOKE_REPLY.size)
        inv, rc, ticks, hz, kind, marks = INVOKE_REPLY.unpack(p)
        return cls(rc, ticks, hz, TIMER_KINDS.get(kind, str(kind)), marks, invocation=inv)

    @property
    def seconds(self) -> float:
        return self.ticks / self.timer_hz if self.timer_hz else float("nan")


PROFILE_HEAD = struct.Struct("<I4H")   # invocation, first, count, total, marks


@dataclass(frozen=True)
class ProfileChunk:
    invocation: int
    first: int
    total: int
    marks: int
    stamps: tuple[int, ...]

    @classmethod
    def unpack(cls, p: bytes) -> ProfileChunk:
        """p: the GET_PROFILE reply without its session."""
        _need("GET_PROFILE reply", p, PROFILE_HEAD.size, exact=False)
        inv, first, count, total, marks = PROFILE_HEAD.unpack_from(p, 0)
        _need(f"GET_PROFILE reply with {count} stamps", p, PROFILE_HEAD.size + 8 * count)
        return cls(inv, first, total, marks, struct.unpack_from(f"<{count}Q", p, PROFILE_HEAD.size))


@dataclass(frozen=True)
class StackInfo:
    size: int
    used: int
    base: int

    @classmethod
    def unpack(cls, p: bytes) -> StackInfo:
        _need("GET_STACK reply", p, 12)
        return cls(*struct.unpack("<3I", p))

    @property
    def free(self) -> int:
        return self.size - self.used


@dataclass(frozen=True)
class Nak:
    session: int
    error: int
    request: int

    @classmethod
    def unpack(cls, p: bytes) -> Nak:
        _need("NAK frame", p, 6)
        return cls(*struct.unpack("<IBB", p))

    @property
    def name(self) -> str:
        try:
            return NakError(self.error).name
        except ValueError:
            return str(self.error)


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
    def unpack(cls, p: bytes) -> Fault:
        _need("FAULT frame", p, 48)
        return cls(*struct.unpack_from("<12I", p, 0))

    def __str__(self) -> str:
        return (f"exception {self.ipsr & 0x1FF} at pc=0x{self.pc:08x} lr=0x{self.lr:08x} "
                f"sp=0x{self.sp:08x} CFSR=0x{self.cfsr:08x} HFSR=0x{self.hfsr:08x}")
