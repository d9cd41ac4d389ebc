"""One device-under-test interface for every transport, chosen by pyserial URL.

    with Device.open("socket://127.0.0.1:4321") as dev:   # QEMU (boards/qemu.py starts it)
    with Device.open("/dev/ttyACM0") as dev:              # a real board (see boards/labmap.py)
    with Device.open("rfc2217://lab-pi:4000") as dev:     # a board on a remote serial server
        info = dev.info()                    # sizes of every input and output, timer, names
        outs, res = dev.infer([a.tobytes(), b.tobytes()])   # one array per input -> per output
        y, res = dev.run(x.tobytes())        # single buffer: the inputs packed back to back
        prof = dev.get_profile()             # per-command ticks (and instructions under QEMU)
        stack = dev.get_stack()

An inference is one transaction: upload every input, INVOKE naming the length and CRC-32 of the
whole input (the firmware refuses to run on anything else) and a fresh invocation id, read every
output naming that id (the firmware refuses to hand out another invocation's output). Every
request carries the session opened by HELLO, every reply the board's session, so a board that
rebooted (even with its BOOT frame lost) answers "unknown session" instead of running on a
zeroed input. Whenever the board lost its state, :meth:`infer` re-opens the session and redoes
the whole transaction (at most ``max_restarts`` times), so a reset gives the right answer or a
clear :class:`DeviceError`, never a wrong output.

Every field the board reports is checked against sane limits and, with ``expect`` (the package's
manifest), against the model; every loop is bounded; every wait has a deadline (per attempt, the
link's patience, the INVOKE budget after its ACK, and one overall deadline per transaction).
The low-level calls (set_input, invoke, get_output) raise :class:`DeviceReset` instead of
redoing anything.
"""
from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from .errors import (
    DeviceError,
    DeviceFault,
    DeviceMismatch,
    DeviceProtocolError,
    DeviceReset,
    DeviceTimeout,
    DeviceVersionError,
)
from .link import Link, Stats
from .protocol import (
    MAX_COMMANDS,
    MAX_IO_BYTES,
    MAX_PAYLOAD,
    MIN_PAYLOAD,
    VERSION,
    Hello,
    Info,
    InvokeResult,
    ProfileChunk,
    ProtocolError,
    StackInfo,
    T,
    crc32,
)

__all__ = ["Device", "DeviceError", "DeviceTimeout", "DeviceFault", "DeviceProtocolError",
           "DeviceReset", "DeviceVersionError", "DeviceMismatch", "IOSpec", "Profile", "Stats"]

MIN_CHUNK = 16       # SET_INPUT / GET_OUTPUT data bytes below which a frame is not split further
SHRINK, GROW = 0.7, 1.55   # frame size after a lost / a delivered frame (see Device._chunked)


@dataclass(frozen=True)
class IOSpec:
    """What the host expects the board to run: bytes of each input and output, commands."""
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    commands: int | None = None


@dataclass
class Profile:
    """Per-command cost of the last invoke. ticks[i] is command i (kiln_command_names order)."""
    ticks: list[int]
    marks: int
    timer_hz: int
    instructions: list[int] | None = None

    @property
    def total_ticks(self) -> int:
        return sum(self.ticks)


def _nonce() -> int:
    return int.from_bytes(os.urandom(4), "little") or 1


def _split(data: bytes, sizes: Sequence[int]) -> list[bytes]:
    out, off = [], 0
    for n in sizes:
        out.append(data[off:off + n])
        off += n
    return out


@dataclass
class Device:
    url: str
    timeout: float = 1.0            # longest wait per attempt (the adaptive one is usually shorter)
    min_timeout: float = 0.02       # shortest wait per attempt
    invoke_timeout: float = 60.0    # INVOKE: longest wait for the reply after the board's ACK
    retries: int = 5                # retransmissions at least, before the link is declared dead
    patience: float = 5.0           # ... and at least this many seconds of trying
    reconnect_timeout: float = 10.0
    baudrate: int = 115200
    chunk: int | None = None        # largest SET_INPUT data bytes per frame (default: adaptive)
    log_path: str | None = None     # mentioned in errors (e.g. the QEMU log)
    instruction_counter: Callable[[float], tuple[int, list[int]] | None] | None = None
    icount_fallback: Callable[[int], int] | None = None   # ticks -> instructions estimate
    expect: IOSpec | None = None    # the model the board must run (the package's manifest)
    transaction_timeout: float | None = None   # one inference, all retries (default: sized)
    max_restarts: int = 3           # redos of one inference after the board lost its state
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self):
        self._link = Link(self.url, baudrate=self.baudrate, timeout=self.timeout,
                          min_timeout=self.min_timeout, retries=self.retries,
                          patience=self.patience, reconnect_timeout=self.reconnect_timeout,
                          log_path=self.log_path, stats=self.stats)
        self._link.on_reconnect = self._on_reconnect
        self.max_payload = MAX_PAYLOAD
        self._info: Info | None = None
        self._inputs: list[bytes | None] = []
        self._invocation = 0          # the invocation whose output the board holds (0: none)
        self._profiled = 0            # the invocation whose profile the board holds
        self._last_invoke: InvokeResult | None = None
        self._last_icount: tuple[int, list[int]] | None = None
        self._invoke_wall: float | None = None

    # ---- connection ----------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, **kw) -> Device:
        dev = cls(url, **kw)
        dev.connect()
        return dev

    def connect(self) -> None:
        """Open the URL (retrying until reconnect_timeout: QEMU may still be starting) and
        perform the handshake."""
        self._link.open()
        self.handshake()

    def close(self) -> None:
        self._link.close()

    def __enter__(self) -> Device:
        if self._link.port is None:
            self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def boot_count(self) -> int | None:
        return self._link.boot_count

    @property
    def session(self) -> int:
        return self._link.session

    def _where(self) -> str:
        return self._link.where()

    def _protocol_error(self, e: ProtocolError, what: str) -> DeviceProtocolError:
        return DeviceProtocolError(f"{self.url}: {what}: {e}; {self._link.wire()}")

    def _on_reconnect(self) -> None:
        if self.handshake()["rebooted"]:
            raise DeviceReset(f"{self.url}: the connection dropped and the board rebooted meanwhile")

    def _forget(self) -> None:
        """The board lost (or may have lost) its input and output."""
        self._inputs = [None] * len(self._inputs)
        self._invocation = self._profiled = 0

    def _request(self, ftype: T, body: bytes = b"", **kw) -> bytes:
        try:
            return self._link.request(ftype, body, **kw)
        except DeviceReset as e:
            self._forget()
            try:
                self.handshake()
            except DeviceError as again:
                raise again from e
            raise

    @contextmanager
    def _deadline(self, seconds: float):
        old = self._link.deadline
        new = time.monotonic() + seconds
        self._link.deadline = new if old is None else min(old, new)
        try:
            yield
        finally:
            self._link.deadline = old

    # ---- commands ------------------------------------------------------------------------
    def handshake(self) -> dict:
        """HELLO: check the version, open a new session, learn the boot count."""
        nonce = _nonce()
        p = self._link.request(T.HELLO, struct.pack("<HI", VERSION, nonce), hello=True)
        try:
            h = Hello.unpack(p)
        except ProtocolError as e:
            raise self._protocol_error(e, "handshake") from None
        if h.version != VERSION:
            raise DeviceVersionError(
                f"{self.url}: the firmware speaks protocol v{h.version}, this Kiln speaks "
                f"v{VERSION}: rebuild the firmware with this Kiln (kiln build, or kiln run which "
                f"rebuilds it) and flash it again; {self._link.wire()}")
        if h.nonce != nonce:
            raise DeviceProtocolError(f"{self.url}: handshake nonce mismatch (sent {nonce:#x}, "
                                      f"got {h.nonce:#x}); {self._link.wire()}")
        if not MIN_PAYLOAD <= h.max_payload <= MAX_PAYLOAD:
            raise DeviceProtocolError(
                f"{self.url}: the board advertises a maximum payload of {h.max_payload} bytes; "
                f"Kiln needs {MIN_PAYLOAD}..{MAX_PAYLOAD} (KILN_MAX_PAYLOAD in "
                f"firmware/runtime/kiln_frame.h); {self._link.wire()}")
        link = self._link
        rebooted = link.boot_count is not None and h.boot_count != link.boot_count
        if rebooted:
            self.stats.reboots_seen += 1
            self._forget()
            self._info = None
        link.boot_count, link.session = h.boot_count, nonce
        self.max_payload = h.max_payload
        return {"version": h.version, "max_payload": h.max_payload, "boot_count": h.boot_count,
                "rebooted": rebooted}

    def info(self) -> Info:
        """INFO, validated (sizes add up, sane limits, and ``expect`` when given)."""
        p = self._request(T.INFO)
        try:
            info = Info.unpack(p)
        except ProtocolError as e:
            raise self._protocol_error(e, "INFO") from None
        self._check_info(info)
        if self._info is None or self._info.input_sizes != info.input_sizes:
            self._inputs = [None] * len(info.input_sizes)
        self._info = info
        return info

    def _ensure_info(self) -> Info:
        return self._info if self._info is not None else self.info()

    def _check_info(self, i: Info) -> None:
        problems = []
        if i.protocol != VERSION:
            problems.append(f"protocol byte {i.protocol} (HELLO said {VERSION})")
        for what, total, sizes in (("input", i.input_bytes, i.input_sizes),
                                   ("output", i.output_bytes, i.output_sizes)):
            if sum(sizes) != total or total > MAX_IO_BYTES or min(sizes) == 0:
                problems.append(f"{what} bytes {total} with sizes {list(sizes)} (must add up, "
                                f"each >= 1, at most {MAX_IO_BYTES} in all)")
        if i.num_commands > MAX_COMMANDS:
            problems.append(f"{i.num_commands} commands (at most {MAX_COMMANDS})")
        if problems:
            raise DeviceProtocolError(f"{self.url}: INFO reports {'; '.join(problems)}; "
                                      f"{self._link.wire()}")
        e = self.expect
        if e is not None and (i.input_sizes != tuple(e.inputs) or i.output_sizes != tuple(e.outputs)
                              or (e.commands is not None and i.num_commands != e.commands)):
            raise DeviceMismatch(
                f"{self.url}: the board ({i.board}, build {i.build_id!r}) runs a model with inputs "
                f"{list(i.input_sizes)} B, outputs {list(i.output_sizes)} B and {i.num_commands} "
                f"commands, but the package's manifest says inputs {list(e.inputs)} B, outputs "
                f"{list(e.outputs)} B and {e.commands} commands: flash the firmware built from "
                f"this package")

    def echo(self, data: bytes) -> bytes:
        return self._request(T.ECHO, bytes(data))

    def set_input(self, data: bytes, index: int | None = None) -> None:
        """Upload one input (``index``), or all of them packed back to back (index None)."""
        info = self._ensure_info()
        data = bytes(data)
        if index is None:
            if len(data) != info.input_bytes:
                raise DeviceError(f"{self.url}: input of {len(data)} bytes, the board's model takes "
                                  f"{info.input_bytes} ({' + '.join(map(str, info.input_sizes))})")
            for i, part in enumerate(_split(data, info.input_sizes)):
                self._set_one(i, part)
            return
        if not 0 <= index < len(info.input_sizes) or len(data) != info.input_sizes[index]:
            raise DeviceError(f"{self.url}: input {index} of {len(data)} bytes; the board's model "
                              f"takes inputs of {list(info.input_sizes)} bytes")
        self._set_one(index, data)

    def _set_one(self, index: int, data: bytes) -> None:
        self._inputs[index] = None

        def send(off: int, n: int, retries: int | None) -> None:
            p = self._request(T.SET_INPUT, struct.pack("<BI", index, off) + data[off:off + n],
                              retries=retries)
            if len(p) != 4 or struct.unpack("<I", p)[0] != off + n:
                raise DeviceProtocolError(f"{self.url}: SET_INPUT {index} at {off}: reply {p.hex(' ')} "
                                          f"is not the end offset {off + n}; {self._link.wire()}")
        cap = self.max_payload - 9
        self._chunked("in", min(cap, self.chunk or cap), len(data), MIN_CHUNK, send)
        self._inputs[index] = data

    def _chunked(self, kind: str, cap: int, total: int, floor: int,
                 send: Callable[[int, int, int | None], None]) -> None:
        """Move ``total`` units in frames of an adaptive size remembered per link: a frame that
        does not get through (one attempt each) shrinks the size by SHRINK, one that does grows
        it by GROW, which settles where about 45% of the frames get through: the size that moves
        the most data per second on a link losing bytes at random (about 40 data bytes at 1%
        loss; the largest frame on a clean link). At ``floor`` units a frame gets the full
        retries and patience."""
        st = self._link.state.chunks.setdefault(kind, [float(cap)])
        off = 0
        while off < total:
            size = int(max(floor, min(st[0], cap)))
            n = min(size, total - off)
            try:
                send(off, n, None if size <= floor else 0)
            except DeviceTimeout:
                if size <= floor:
                    raise
                st[0] = max(float(floor), size * SHRINK)
                continue
            off += n
            st[0] = min(float(cap), max(st[0], floor) * GROW)
        if kind == "in":
            self.stats.chunk = int(min(st[0], cap))

    def invoke(self) -> InvokeResult:
        """Run one inference on the inputs uploaded in this session. Returns rc and ticks
        (cycles with DWT), plus the exact instruction count under QEMU with the plugin."""
        info = self._ensure_info()
        missing = [i for i, b in enumerate(self._inputs) if b is None]
        if missing or not self._inputs:
            raise DeviceError(f"{self.url}: input(s) {missing} not on the board (set_input first; "
                              f"a reboot of the board clears them)")
        data = b"".join(self._inputs)
        inv = _nonce()
        if self.instruction_counter is not None:
            self.instruction_counter(0)     # drop windows from earlier, unrelated runs
        # A reply lost after the ACK is asked for again after `pace` (1 s, then twice the
        # measured invoke time: a duplicate reaching a busy board waits in its RX ring and is
        # answered from its reply cache); invoke_timeout is the budget for any answer at all.
        pace = (max(self.timeout, 1.0) if self._invoke_wall is None
                else max(self.min_timeout, 2 * self._invoke_wall + 0.02))
        retx, t0 = self.stats.retransmits, time.monotonic()
        self._invocation = self._profiled = 0
        p = self._request(T.INVOKE, struct.pack("<III", inv, info.input_bytes, crc32(data)),
                          busy=self.invoke_timeout, pace=pace)
        try:
            res = InvokeResult.unpack(p)
        except ProtocolError as e:
            raise self._protocol_error(e, "INVOKE") from None
        if res.invocation != inv:
            raise DeviceProtocolError(f"{self.url}: INVOKE reply names invocation "
                                      f"{res.invocation:#x}, sent {inv:#x}; {self._link.wire()}")
        if self.stats.retransmits == retx:
            self._invoke_wall = time.monotonic() - t0
        self._invocation = inv if res.rc == 0 else 0
        self._profiled = inv
        self._last_icount = None
        if self.instruction_counter is not None:
            got = self.instruction_counter(5.0)
            if got is not None:
                self._last_icount = got
                res = _with_insns(res, got[0], "qemu-plugin")
        elif self.icount_fallback is not None:
            res = _with_insns(res, self.icount_fallback(res.ticks), "timer-estimate")
        self._last_invoke = res
        return res

    def get_output(self, index: int | None = None) -> bytes:
        """One output of the last invoke, or all of them packed back to back (index None)."""
        info = self._ensure_info()
        if not self._invocation:
            raise DeviceError(f"{self.url}: no successful invoke in this session to read the "
                              f"output of")
        if index is None:
            return b"".join(self.get_output(k) for k in range(len(info.output_sizes)))
        if not 0 <= index < len(info.output_sizes):
            raise DeviceError(f"{self.url}: output {index}: the board's model has "
                              f"{len(info.output_sizes)} outputs")
        inv, size, out = self._invocation, info.output_sizes[index], bytearray()

        def send(off: int, n: int, retries: int | None) -> None:
            p = self._request(T.GET_OUTPUT, struct.pack("<IBIH", inv, index, off, n), retries=retries)
            if len(p) != 4 + n or struct.unpack_from("<I", p)[0] != inv:
                raise DeviceProtocolError(
                    f"{self.url}: GET_OUTPUT {index} at {off}: reply of {len(p)} bytes, expected "
                    f"the invocation id {inv:#x} and {n} data bytes; {self._link.wire()}")
            out.extend(p[4:])
        self._chunked("out", self.max_payload - 8, size, MIN_CHUNK, send)
        return bytes(out)

    def get_profile(self) -> Profile:
        """Per-command ticks of the last invoke (and instructions under QEMU's plugin)."""
        info = self._ensure_info()
        if not self._profiled:
            raise DeviceError(f"{self.url}: no invoke in this session to profile")
        inv, total, stamps, marks = self._profiled, info.num_commands + 1, [], [0]

        def send(first: int, n: int, retries: int | None) -> None:
            p = self._request(T.GET_PROFILE, struct.pack("<IHH", inv, first, n), retries=retries)
            try:
                c = ProfileChunk.unpack(p)
            except ProtocolError as e:
                raise self._protocol_error(e, "GET_PROFILE") from None
            if (c.invocation, c.first, c.total, len(c.stamps)) != (inv, first, total, n):
                raise DeviceProtocolError(
                    f"{self.url}: GET_PROFILE reply says invocation {c.invocation:#x}, stamps "
                    f"{c.first}..+{len(c.stamps)} of {c.total}; asked for {inv:#x}, {first}..+{n} "
                    f"of {total}; {self._link.wire()}")
            stamps.extend(c.stamps)
            marks[0] = c.marks
        self._chunked("profile", (self.max_payload - 16) // 8, total, 2, send)
        ticks = [b - a for a, b in zip(stamps, stamps[1:])]
        hz = self._last_invoke.timer_hz if self._last_invoke else 0
        insns = None
        if self._last_icount is not None and len(self._last_icount[1]) >= 2:
            m = self._last_icount[1]
            insns = [b - a for a, b in zip(m, m[1:])]
        return Profile(ticks=ticks, marks=marks[0], timer_hz=hz, instructions=insns)

    def get_stack(self, repaint: bool = False) -> StackInfo:
        p = self._request(T.GET_STACK, bytes([1 if repaint else 0]))
        try:
            return StackInfo.unpack(p)
        except ProtocolError as e:
            raise self._protocol_error(e, "GET_STACK") from None

    def exit(self, code: int = 0) -> None:
        """Ask the firmware to exit (semihosting under QEMU) or reset (real board)."""
        try:
            self._request(T.EXIT, struct.pack("<i", code))
        finally:
            self.close()

    def reset(self) -> None:
        """Reboot the device (system reset) and open a new session with it."""
        self._request(T.RESET)
        self._forget()
        self.handshake()

    # ---- transactions --------------------------------------------------------------------
    def infer(self, inputs: Sequence[bytes]) -> tuple[list[bytes], InvokeResult]:
        """One inference: every input uploaded, invoked, every output read, as one transaction
        redone from the start whenever the board lost its state. Returns (outputs, result);
        raises DeviceError when the model returns rc != 0 or the link gives up."""
        inputs = [bytes(b) for b in inputs]
        known = self._info
        size = (known.input_bytes + known.output_bytes) if known else sum(map(len, inputs))
        budget = self.transaction_timeout or (self.invoke_timeout + 30.0 + 4 * size / 1000)
        last = None
        with self._deadline(budget):
            for attempt in range(self.max_restarts + 1):
                if attempt:
                    self.stats.restarts += 1
                try:
                    info = self._ensure_info()
                    if [len(b) for b in inputs] != list(info.input_sizes):
                        raise DeviceError(
                            f"{self.url}: inputs of {[len(b) for b in inputs]} bytes; the board's "
                            f"model takes {list(info.input_sizes)}")
                    for i, b in enumerate(inputs):
                        self._set_one(i, b)
                    res = self.invoke()
                    if res.rc != 0:
                        raise DeviceError(f"{self.url}: kiln_model_run returned {res.rc}{self._where()}")
                    return [self.get_output(k) for k in range(len(info.output_sizes))], res
                except DeviceReset as e:
                    last = e
        raise DeviceError(f"{self.url}: the board lost its state {self.max_restarts + 1} times in "
                          f"one inference; last: {last}; {self._link.wire()}")

    def run(self, data: bytes) -> tuple[bytes, InvokeResult]:
        """:meth:`infer` with the inputs packed back to back in one buffer, and the outputs
        returned the same way."""
        info = self._ensure_info()
        if len(data) != info.input_bytes:
            raise DeviceError(f"{self.url}: input of {len(data)} bytes, the board's model takes "
                              f"{info.input_bytes}")
        outs, res = self.infer(_split(bytes(data), info.input_sizes))
        return b"".join(outs), res


def _with_insns(res: InvokeResult, n: int, source: str) -> InvokeResult:
    return InvokeResult(res.rc, res.ticks, res.timer_hz, res.timer, res.marks, n, source,
                        res.invocation)
