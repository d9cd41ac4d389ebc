"""One request, one reply, over a noisy serial link: the stop-and-wait layer under Device.

:meth:`Link.request` sends a frame (the session prefixed), and waits for the reply with the same
sequence number, retransmitting the *same* frame on silence or on a NAK that says the frame was
damaged (the firmware answers a duplicate from its reply cache, so nothing runs twice). Every
wait is bounded three ways: the per-attempt timeout (adaptive: a few round trips measured on this
link, between ``min_timeout`` and ``timeout``), the link's patience (how long a request may go
unanswered before the link is declared dead) and the caller's overall deadline.

What the host learns about a link (round-trip times, the frame sizes that get through) lives in
a :class:`LinkState` kept per URL, so a later Device on the same port starts from it.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import serial

from .errors import DeviceError, DeviceFault, DeviceProtocolError, DeviceReset, DeviceTimeout
from .protocol import (
    REPLY,
    RETRANSMIT_NAKS,
    Boot,
    Decoder,
    Fault,
    Frame,
    Nak,
    NakError,
    ProtocolError,
    T,
    encode,
    split_session,
    type_name,
)


@dataclass
class Stats:
    frames_sent: int = 0
    retransmits: int = 0
    naks: int = 0
    timeouts: int = 0
    reconnects: int = 0
    reboots_seen: int = 0
    restarts: int = 0            # transactions redone from the start (reset, lost input/output)
    stale_frames: int = 0        # frames for an earlier request or session, ignored
    bytes_skipped: int = 0
    crc_errors: int = 0
    chunk: int = 0               # SET_INPUT data bytes per frame, as last adapted


@dataclass
class LinkState:
    """What the host has learnt about one link (kept per URL for the process)."""
    rtt: dict = field(default_factory=dict)     # (type, size class) -> [srtt, rttvar]
    chunks: dict = field(default_factory=dict)  # "in" / "out" / "profile" -> [frame size]


_LINKS: dict[str, LinkState] = {}


def link_state(url: str) -> LinkState:
    return _LINKS.setdefault(url, LinkState())


class Link:
    def __init__(self, url: str, *, baudrate: int, timeout: float, min_timeout: float,
                 retries: int, patience: float, reconnect_timeout: float,
                 log_path: str | None, stats: Stats):
        self.url = url
        self.baudrate = baudrate
        self.timeout = timeout
        self.min_timeout = min(min_timeout, timeout)
        self.retries = retries
        self.patience = patience
        self.reconnect_timeout = reconnect_timeout
        self.log_path = log_path
        self.stats = stats
        self.state = link_state(url)
        self.port = None
        self.seq = 0
        self.decoder = Decoder()
        self.session = 0
        self.boot_count: int | None = None
        self.deadline: float | None = None       # overall, set by Device for a transaction
        self.on_reconnect: Callable[[], None] | None = None
        self._reconnecting = False
        self._note: str | None = None
        self._heard = False
        self._last_rx = 0.0

    # ---- port ----------------------------------------------------------------------------
    def open(self) -> None:
        """Open the URL, retrying until reconnect_timeout (QEMU may still be starting)."""
        deadline = time.monotonic() + self.reconnect_timeout
        last = None
        while True:
            try:
                self.port = serial.serial_for_url(self.url, baudrate=self.baudrate, timeout=0.05,
                                                  **self._write_timeout())
                return
            except (serial.SerialException, OSError, ValueError) as e:
                last = e
            if time.monotonic() > deadline:
                raise DeviceError(f"{self.url}: cannot open within {self.reconnect_timeout:.1f} s: "
                                  f"{last}{self.where()}")
            time.sleep(0.05)

    def _write_timeout(self) -> dict:
        """pyserial's RFC 2217 client refuses a write timeout (NotImplementedError, in pyserial
        and in labgrid's fork): an rfc2217:// port writes into a TCP socket without one."""
        return {} if self.url.startswith("rfc2217://") else {"write_timeout": self.timeout}

    def close(self) -> None:
        if self.port is not None:
            try:
                self.port.close()
            except Exception:
                pass
            self.port = None

    def reconnect(self) -> None:
        """Reopen the port (keeping the last bytes seen for error messages), then let the
        Device redo its handshake."""
        self.stats.reconnects += 1
        self.close()
        recent = self.decoder.recent
        self.decoder = Decoder()
        self.decoder.recent.extend(recent)
        self.open()
        if self.on_reconnect is not None:
            self._reconnecting = True
            try:
                self.on_reconnect()
            finally:
                self._reconnecting = False

    def where(self) -> str:
        return f" (log: {self.log_path})" if self.log_path else ""

    def wire(self) -> str:
        return f"last bytes received: {self.decoder.recent_hex()}{self.where()}"

    # ---- timing --------------------------------------------------------------------------
    def _rto(self, key) -> float:
        """Per-attempt timeout: srtt + 4 rttvar of this request kind (TCP's rule); for a kind
        not measured yet, 4x the slowest kind measured on this link; on a new link a quarter of
        ``timeout`` (each timeout multiplies the wait by 1.5, up to ``timeout``)."""
        est = self.state.rtt.get(key)
        if est is None:
            known = [e[0] for e in self.state.rtt.values()]
            rto = 4 * max(known) if known else self.timeout / 4
        else:
            rto = est[0] + 4 * est[1]
        return min(self.timeout, max(self.min_timeout, rto))

    def _sample(self, key, rtt: float) -> None:
        est = self.state.rtt.get(key)
        if est is None:
            self.state.rtt[key] = [rtt, rtt / 2]
        else:
            est[1] = 0.75 * est[1] + 0.25 * abs(est[0] - rtt)
            est[0] = 0.875 * est[0] + 0.125 * rtt

    def _reply_gap(self) -> float:
        """How long a frame may pause half-way before it counts as cut short: the shortest
        round trip measured on this link (a reply arrives faster than that), 3..30 ms."""
        known = [e[0] for e in self.state.rtt.values()]
        return min(0.03, max(0.003, min(known))) if known else 0.03

    def _check_deadline(self, what: str, problem: str) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise DeviceTimeout(f"{self.url}: transaction deadline passed while waiting for {what}; "
                                f"last problem: {problem}; {self.wire()}")

    # ---- framing -------------------------------------------------------------------------
    def _frame(self, ftype: int, body: bytes, hello: bool) -> tuple[int, bytes]:
        self.seq = (self.seq + 1) & 0xFF
        payload = body if hello else self.session.to_bytes(4, "little") + body
        return self.seq, encode(ftype, self.seq, payload)

    def _read_frames(self, until: float) -> list[Frame]:
        remaining = until - time.monotonic()
        if remaining <= 0:
            return []
        self.port.timeout = min(0.005 if self.decoder.in_frame() else 0.02, remaining)
        data = self.port.read(max(1, min(self.port.in_waiting, 4096)))
        if data:
            self._last_rx = time.monotonic()
            self._heard = True
        frames = self.decoder.feed(data) if data else []
        self.stats.bytes_skipped = self.decoder.skipped
        self.stats.crc_errors = self.decoder.crc_errors
        return frames

    def request(self, ftype: T, body: bytes = b"", *, hello: bool = False,
                retries: int | None = None, busy: float | None = None,
                pace: float | None = None) -> bytes:
        """Send one request, return its reply payload without the session.

        retries: at least this many retransmissions before giving up (default self.retries);
            with the default the link's patience also applies (keep trying that long).
        busy: the request is long-running (INVOKE): after the board's ACK, wait at most this
            long in total for the reply; ``pace`` is how long to wait after an ACK before
            retransmitting in case the reply was lost (default: busy).
        hello: HELLO: no session, BOOT frames are expected and ignored.
        Raises DeviceTimeout, DeviceFault, DeviceProtocolError, or DeviceReset (the board
        rebooted or lost the state the request needs)."""
        min_attempts = 1 + (self.retries if retries is None else retries)
        patience = self.patience if retries is None else 0.0
        start = time.monotonic()
        key = (int(ftype), len(body).bit_length())
        wait = self._rto(key)
        seq, frame = self._frame(ftype, body, hello)
        attempts = reconnects = 0
        acked_at = None
        problem = "no reply"
        while True:
            self._check_deadline(type_name(ftype), problem)
            attempts += 1
            if attempts > 1:
                self.stats.retransmits += 1
            try:
                self._write(frame)
                sent = time.monotonic()
                got = self._await(ftype, seq, sent, wait, hello, busy, pace, acked_at)
            except (serial.SerialException, OSError) as e:
                if self._reconnecting:
                    raise DeviceError(f"{self.url}: connection lost again while reconnecting ({e})"
                                      f"{self.where()}") from None
                reconnects += 1
                problem = f"connection lost ({e})"
                if reconnects > min_attempts:
                    raise DeviceTimeout(f"{self.url}: connection lost {reconnects} times during "
                                        f"{type_name(ftype)}: {e}; {self.wire()}") from None
                self.reconnect()
                seq, frame = self._frame(ftype, body, hello)
                continue
            kind, value, acked_at = got
            if kind == "reply":
                if attempts == 1:
                    self._sample(key, value[1])
                return value[0]
            problem = value
            if kind == "busy-expired":
                raise DeviceTimeout(f"{self.url}: {type_name(ftype)} acknowledged, but no reply "
                                    f"within {busy:.1f} s ({problem}); {self.wire()}")
            if kind == "timeout":
                self.stats.timeouts += 1
                if acked_at is None and not self._heard:
                    wait = min(self.timeout, wait * 1.5)    # silence: maybe slower than thought
            if acked_at is not None:
                continue        # acknowledged: only the busy budget ends the wait
            if attempts >= min_attempts and time.monotonic() - start >= patience:
                raise DeviceTimeout(
                    f"{self.url}: no valid reply to {type_name(ftype)} (seq {seq}) after {attempts} "
                    f"attempts in {time.monotonic() - start:.1f} s; last problem: {problem}; "
                    f"{self.wire()}")

    def _write(self, frame: bytes) -> None:
        self.port.write(frame)
        self.port.flush()
        self.stats.frames_sent += 1

    def _await(self, ftype, seq, sent, wait, hello, busy, pace, acked_at):
        """Wait for the reply to one attempt. Returns (kind, value, acked_at): ("reply",
        (payload, rtt)), ("resend", problem) after a NAK asking for it, ("timeout", problem),
        ("busy-expired", problem)."""
        problem = f"no reply within {wait:.2f} s"
        self._note = None
        self._heard = False
        gap = self._reply_gap()
        while True:
            if acked_at is None:
                until = sent + wait
            else:
                until = min(sent + (busy if pace is None else pace), acked_at + busy)
                problem = "acknowledged, no reply yet"
            if self.deadline is not None:
                until = min(until, self.deadline)
            now = time.monotonic()
            if now >= until:
                if self._note:
                    problem = f"{problem}; {self._note}"
                if acked_at is not None and now >= acked_at + busy:
                    return "busy-expired", problem, acked_at
                return "timeout", problem, acked_at
            frames = self._read_frames(until)
            if not frames and self.decoder.in_frame() and time.monotonic() - self._last_rx > gap:
                self.decoder.discard()
                return "resend", "a reply stopped arriving half-way (bytes lost)", acked_at
            for f in frames:
                r = self._on_frame(f, ftype, seq, hello)
                if r is None:
                    continue
                if r == "ack":
                    if acked_at is None:
                        acked_at = time.monotonic()
                        if busy is None:
                            busy = wait
                    continue
                if isinstance(r, tuple):
                    return "reply", (r[1], time.monotonic() - sent), acked_at
                return "resend", r, acked_at

    def _on_frame(self, f: Frame, ftype, seq, hello):
        """None: ignore; "ack"; ("reply", payload); a string: retransmit now because of it."""
        try:
            if f.type == T.FAULT:
                fault = Fault.unpack(f.payload)
                raise DeviceFault(f"{self.url}: device faulted while handling {type_name(ftype)}: "
                                  f"{fault}; {self.wire()}", fault)
            if f.type == T.BOOT:
                return self._on_boot(Boot.unpack(f.payload), hello)
            if f.seq != seq:
                self.stats.stale_frames += 1
                return None
            if f.type == T.ACK:
                session, _ = split_session("ACK frame", f.payload)
                return "ack" if hello or session == self.session else None
            if f.type == T.NAK:
                return self._on_nak(Nak.unpack(f.payload), ftype)
            if f.type != (ftype | REPLY):
                self.stats.stale_frames += 1
                return None
            if hello:
                return "reply", f.payload
            session, rest = split_session(f"{type_name(ftype)} reply", f.payload)
            if session != self.session:
                self.stats.stale_frames += 1
                self._note = (f"ignored a reply of session 0x{session:08x} (this session is "
                              f"0x{self.session:08x})")
                return None
            return "reply", rest
        except ProtocolError as e:
            raise DeviceProtocolError(f"{self.url}: {e} (while waiting for the reply to "
                                      f"{type_name(ftype)}); {self.wire()}") from None

    def _on_boot(self, boot: Boot, hello: bool):
        if hello or self.boot_count is None or boot.boot_count == self.boot_count:
            self.stats.stale_frames += 1      # a banner we already know about
            return None
        raise DeviceReset(f"{self.url}: the board rebooted (BOOT frame, boot count "
                          f"{self.boot_count} -> {boot.boot_count})")

    def _on_nak(self, nak: Nak, ftype):
        self.stats.naks += 1
        if nak.error in RETRANSMIT_NAKS:
            return f"NAK {nak.name}"
        if nak.error == NakError.SESSION:
            raise DeviceReset(f"{self.url}: the board does not know session 0x{self.session:08x} "
                              f"(it has 0x{nak.session:08x}): it rebooted")
        if nak.error == NakError.INPUT:
            raise DeviceReset(f"{self.url}: the board's input is not the one sent (length or "
                              f"CRC-32 differ): it lost part of it")
        if nak.error == NakError.STALE:
            raise DeviceReset(f"{self.url}: the board holds no result of this invocation "
                              f"(it was reset or re-invoked)")
        raise DeviceProtocolError(f"{self.url}: device rejected {type_name(ftype)}: NAK {nak.name}; "
                                  f"{self.wire()}")
