"""One device-under-test interface for every transport, chosen by pyserial URL.

    with Device.open("socket://127.0.0.1:4321") as dev:   # QEMU (boards/qemu.py starts it)
    with Device.open("/dev/ttyACM0") as dev:              # a real board (see boards/labmap.py)
    with Device.open("rfc2217://lab-pi:4000") as dev:     # a board on a remote serial server
        info = dev.info()
        dev.set_input(x.tobytes())
        res = dev.invoke()               # InvokeResult: rc, ticks (+ instructions under QEMU)
        y = dev.get_output()
        prof = dev.get_profile()         # per-command ticks (and instructions)
        stack = dev.get_stack()

Every request is a frame with a sequence number; the reply must carry the same number and a
valid CRC. A missing or NAKed reply is retransmitted (the firmware answers a retransmission
from its cache instead of running the command twice); a dropped connection is reopened, the
handshake redone and, if the board rebooted meanwhile, the input re-sent. Every wait has a
deadline; when the retries run out the error quotes the last bytes received.
"""
from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field
from typing import Callable

import serial

from kiln.common.errors import KilnError

from .protocol import (MAX_PAYLOAD, REPLY, Decoder, Fault, Frame, Info, InvokeResult, NakError,
                       StackInfo, T, VERSION, encode)


class DeviceError(KilnError, RuntimeError):
    """Talking to the device failed; the message says what was expected and what was seen."""


class DeviceTimeout(DeviceError):
    pass


class DeviceFault(DeviceError):
    def __init__(self, message: str, fault: Fault):
        super().__init__(message)
        self.fault = fault


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


@dataclass
class Stats:
    frames_sent: int = 0
    retransmits: int = 0
    naks: int = 0
    timeouts: int = 0
    reconnects: int = 0
    reboots_seen: int = 0
    bytes_skipped: int = 0
    crc_errors: int = 0


@dataclass
class Device:
    url: str
    timeout: float = 1.0            # per attempt, ordinary commands
    invoke_timeout: float = 60.0    # per attempt, INVOKE
    retries: int = 5
    reconnect_timeout: float = 10.0
    baudrate: int = 115200
    chunk: int | None = None        # SET_INPUT chunk size (default: what the device allows)
    log_path: str | None = None     # mentioned in errors (e.g. the QEMU log)
    instruction_counter: Callable[[float], tuple[int, list[int]] | None] | None = None
    icount_fallback: Callable[[int], int] | None = None   # ticks -> instructions estimate
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self):
        self._port = None
        self._seq = 0
        self._decoder = Decoder()
        self._input: bytes | None = None
        self._boot_count: int | None = None
        self.max_payload = MAX_PAYLOAD
        self._last_icount: tuple[int, list[int]] | None = None
        self._in_restore = False
        self._last_invoke: InvokeResult | None = None
        self._invoke_wall: float | None = None
        self._info: Info | None = None
        self._retx_before_invoke = 0

    # ---- connection ----------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, **kw) -> "Device":
        dev = cls(url, **kw)
        dev.connect()
        return dev

    def connect(self) -> None:
        """Open the URL (retrying until reconnect_timeout: QEMU may still be starting) and
        perform the handshake."""
        self._open_port()
        self.handshake()

    def _open_port(self) -> None:
        deadline = time.monotonic() + self.reconnect_timeout
        last = None
        while True:
            try:
                self._port = serial.serial_for_url(self.url, baudrate=self.baudrate, timeout=0.05,
                                                   write_timeout=self.timeout)
                return
            except (serial.SerialException, OSError, ValueError) as e:
                last = e
            if time.monotonic() > deadline:
                raise DeviceError(f"{self.url}: cannot open within {self.reconnect_timeout:.1f} s: "
                                  f"{last}{self._where()}")
            time.sleep(0.05)

    def close(self) -> None:
        if self._port is not None:
            try:
                self._port.close()
            except Exception:
                pass
            self._port = None

    def __enter__(self) -> "Device":
        if self._port is None:
            self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _reconnect(self) -> None:
        """Reopen the port (keeping the last bytes seen for error messages) and handshake."""
        self.stats.reconnects += 1
        self.close()
        recent = self._decoder.recent
        self._decoder = Decoder()
        self._decoder.recent.extend(recent)
        self._open_port()
        self.handshake()

    def _where(self) -> str:
        return f" (log: {self.log_path})" if self.log_path else ""

    # ---- framing -------------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFF
        return self._seq

    def _write(self, data: bytes) -> None:
        self._port.write(data)
        self._port.flush()

    def _read_frames(self, deadline: float) -> list[Frame]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return []
        self._port.timeout = min(0.05, remaining)
        n = max(1, self._port.in_waiting)
        data = self._port.read(n)
        frames = self._decoder.feed(data) if data else []
        self.stats.bytes_skipped = self._decoder.skipped
        self.stats.crc_errors = self._decoder.crc_errors
        return frames

    def _transact(self, ftype: T, payload: bytes = b"", timeout: float | None = None,
                  retries: int | None = None, busy_timeout: float | None = None) -> bytes:
        """Send one request and return its reply payload, retransmitting on NAK or silence.
        busy_timeout: once the device ACKs (long commands), wait this long for the reply."""
        timeout = self.timeout if timeout is None else timeout
        retries = self.retries if retries is None else retries
        last_problem = "no reply"
        reconnects = 0
        attempt = 0
        seq = self._next_seq()
        frame = encode(ftype, seq, payload)
        while attempt <= retries:
            if attempt:
                self.stats.retransmits += 1
            attempt += 1
            try:
                self._write(frame)
                self.stats.frames_sent += 1
                deadline = time.monotonic() + timeout
                resend = False
                acked = False
                while not resend and time.monotonic() < deadline:
                    for f in self._read_frames(deadline):
                        if f.type == T.FAULT:
                            fault = Fault.unpack(f.payload)
                            raise DeviceFault(f"{self.url}: device faulted while handling "
                                              f"{ftype.name}: {fault}{self._where()}", fault)
                        if f.type == T.BOOT:
                            if self._boot_count is None:
                                continue    # the banner of the first boot
                            self.stats.reboots_seen += 1
                            last_problem = "device rebooted"
                            self._after_reboot()
                            seq = self._next_seq()
                            frame = encode(ftype, seq, payload)
                            resend = True
                            break
                        if f.seq != seq:
                            continue        # stale reply to an earlier retransmission
                        if f.type == T.ACK:
                            if busy_timeout is not None and not acked:
                                deadline = time.monotonic() + busy_timeout
                            acked = True
                            continue
                        if f.type == T.NAK:
                            err = f.payload[0] if f.payload else 0
                            self.stats.naks += 1
                            try:
                                name = NakError(err).name
                            except ValueError:
                                name = str(err)
                            if err in (NakError.TYPE, NakError.ARGS):
                                raise DeviceError(f"{self.url}: device rejected {ftype.name} "
                                                  f"({len(payload)} B payload): NAK {name}{self._where()}")
                            last_problem = f"NAK {name}"
                            resend = True
                            break
                        if f.type == (ftype | REPLY):
                            return f.payload
                        last_problem = f"unexpected {f!r}"
                if not resend:
                    self.stats.timeouts += 1
                    last_problem = (f"acknowledged, but no reply within {busy_timeout:.2f} s"
                                    if acked and busy_timeout else f"no reply within {timeout:.2f} s")
            except (serial.SerialException, OSError) as e:
                if self._in_restore:
                    raise
                reconnects += 1
                last_problem = f"connection lost ({e})"
                if reconnects > retries:
                    break
                self._reconnect()
                seq = self._next_seq()
                frame = encode(ftype, seq, payload)
        raise DeviceTimeout(
            f"{self.url}: no valid reply to {ftype.name} (seq {seq}) after {attempt} attempts "
            f"({timeout:.2f} s each); last problem: {last_problem}; last bytes received: "
            f"{self._decoder.recent_hex()}{self._where()}")

    def _after_reboot(self) -> None:
        """The device rebooted: redo the handshake and restore the input it lost."""
        self.handshake()

    # ---- commands ------------------------------------------------------------------------
    def handshake(self) -> dict:
        nonce = int.from_bytes(os.urandom(4), "little")
        p = self._transact(T.HELLO, struct.pack("<HI", VERSION, nonce))
        version, echo, max_payload, boot_count = struct.unpack_from("<HIHI", p, 0)
        if echo != nonce:
            raise DeviceError(f"{self.url}: handshake nonce mismatch (sent {nonce:#x}, got {echo:#x})")
        if version != VERSION:
            raise DeviceError(f"{self.url}: device speaks protocol v{version}, host v{VERSION}: "
                              f"rebuild the firmware or update Kiln")
        self.max_payload = min(max_payload, MAX_PAYLOAD)
        rebooted = self._boot_count is not None and boot_count != self._boot_count
        self._boot_count = boot_count
        if rebooted and self._input is not None and not self._in_restore:
            self._in_restore = True
            try:
                self._send_input(self._input)
            finally:
                self._in_restore = False
        return {"version": version, "max_payload": max_payload, "boot_count": boot_count}

    def info(self) -> Info:
        self._info = Info.unpack(self._transact(T.INFO))
        return self._info

    def echo(self, data: bytes) -> bytes:
        return self._transact(T.ECHO, data)

    def set_input(self, data: bytes) -> None:
        data = bytes(data)
        self._input = data
        self._send_input(data)

    def _send_input(self, data: bytes) -> None:
        """Chunked upload. A chunk that keeps failing (a noisy link corrupts long frames more
        often) is retried in halves, down to 16 bytes, before giving up."""
        step = min(self.chunk or self.max_payload - 4, self.max_payload - 4)
        off = 0
        while off < len(data):
            part = data[off:off + step]
            try:
                p = self._transact(T.SET_INPUT, struct.pack("<I", off) + part,
                                   retries=min(self.retries, 2) if step > 16 else None)
            except DeviceTimeout:
                if step <= 16:
                    raise
                step //= 2
                continue
            (end,) = struct.unpack_from("<I", p, 0)
            if end != off + len(part):
                raise DeviceError(f"{self.url}: SET_INPUT at {off}: device acknowledged up to {end}, "
                                  f"expected {off + len(part)}")
            off = end

    def invoke(self) -> InvokeResult:
        """Run one inference on the last input. Returns rc and ticks (cycles with DWT), plus the
        exact instruction count when the device runs in QEMU with the plugin."""
        if self.instruction_counter is not None:
            self.instruction_counter(0)     # drop windows from earlier, unrelated runs
        self._retx_before_invoke = self.stats.retransmits
        # After one invoke we know how long it takes: a reply lost after the ACK then costs a
        # few times that, not the whole invoke_timeout.
        busy = self.invoke_timeout
        if self._invoke_wall is not None:
            busy = min(busy, max(4 * self._invoke_wall + 1.0, self.timeout))
        t0 = time.monotonic()
        res = InvokeResult.unpack(self._transact(T.INVOKE, busy_timeout=busy))
        if self.stats.retransmits == self._retx_before_invoke:
            self._invoke_wall = time.monotonic() - t0
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

    def get_output(self, nbytes: int | None = None) -> bytes:
        if nbytes is None:
            nbytes = (self._info or self.info()).output_bytes
        out = bytearray()
        while len(out) < nbytes:
            n = min(self.max_payload, nbytes - len(out))
            out += self._transact(T.GET_OUTPUT, struct.pack("<IH", len(out), n))
        return bytes(out)

    def get_profile(self) -> Profile:
        stamps: list[int] = []
        total = 1
        marks = 0
        while len(stamps) < total:
            p = self._transact(T.GET_PROFILE, struct.pack("<H", len(stamps)))
            first, count, total, marks = struct.unpack_from("<4H", p, 0)
            if count == 0:
                break
            stamps += list(struct.unpack_from(f"<{count}Q", p, 8))
        ticks = [b - a for a, b in zip(stamps, stamps[1:])]
        hz = self._last_invoke.timer_hz if self._last_invoke else 0
        insns = None
        if self._last_icount is not None and len(self._last_icount[1]) >= 2:
            m = self._last_icount[1]
            insns = [b - a for a, b in zip(m, m[1:])]
        return Profile(ticks=ticks, marks=marks, timer_hz=hz, instructions=insns)

    def get_stack(self, repaint: bool = False) -> StackInfo:
        p = self._transact(T.GET_STACK, bytes([1 if repaint else 0]))
        return StackInfo(*struct.unpack_from("<3I", p, 0))

    def exit(self, code: int = 0) -> None:
        """Ask the firmware to exit (semihosting under QEMU) or reset (real board)."""
        try:
            self._transact(T.EXIT, struct.pack("<i", code))
        finally:
            self.close()

    def reset(self) -> None:
        """Reboot the device (system reset). The next command notices the BOOT frame, redoes
        the handshake and re-sends the input."""
        self._transact(T.RESET)

    def run(self, data: bytes) -> tuple[bytes, InvokeResult]:
        """set_input + invoke + get_output; raises DeviceError when the model returns rc != 0."""
        self.set_input(data)
        res = self.invoke()
        if res.rc != 0:
            raise DeviceError(f"{self.url}: kiln_model_run returned {res.rc}{self._where()}")
        return self.get_output(), res


def _with_insns(res: InvokeResult, n: int, source: str) -> InvokeResult:
    return InvokeResult(res.rc, res.ticks, res.timer_hz, res.timer, res.marks, n, source)
