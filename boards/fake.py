"""A scriptable fake board on a local TCP socket: protocol v2 in Python, no QEMU, no plugin.

    with FakeBoard(inputs=[640], outputs=[10], model=fn, commands=2) as fb:
        dev = Device.open(fb.url)             # answers like a real board: DWT ticks, no
        outs, res = dev.infer([x.tobytes()])  # instruction counts
        fb.reset(boot=False)                  # reboot now, the BOOT frame lost on the way
    with FakeBoard(..., mode="empty-output") as fb:   # one of MODES: a misbehaving board

It keeps the firmware's rules (firmware/runtime/main.c): a session opened by HELLO, an input
buffer per input, INVOKE checked against the input's length and CRC-32, outputs handed out only
for the invocation that made them, a cached reply for retransmissions, state lost on reset (the
boot count survives). ``model(inputs: list[bytes]) -> list[bytes]`` computes the outputs (default
:func:`pattern_model`); kiln.hil.fake_board serves a compiled package with it.

Each mode in :data:`MODES` is one misbehaviour the host must survive: a clean DeviceError naming
what was wrong, or, for the ``reset-*`` modes, the right answer. ``wrong-answer`` computes a
wrong output on purpose: the protocol cannot know, so the host must report a mismatch.
"""
from __future__ import annotations

import random
import select
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .protocol import MAX_PAYLOAD, REPLY, VERSION, Decoder, Frame, Info, NakError, T, crc32, encode

MODES = {
    "ok": "a well-behaved board",
    "max-payload-0": "HELLO advertises a maximum payload of 0 bytes",
    "max-payload-4": "HELLO advertises a maximum payload of 4 bytes",
    "short-hello": "HELLO reply cut to 5 bytes",
    "short-info": "INFO reply cut to 20 bytes",
    "short-invoke": "INVOKE reply cut to 10 bytes",
    "short-profile": "GET_PROFILE reply claims 3 stamps and carries 1",
    "long-reply": "a 512-byte reply to HELLO (12 bytes expected)",
    "empty-output": "GET_OUTPUT replies carry no data",
    "huge-output": "INFO reports 0xFFFFFFF0 output bytes",
    "many-stamps": "GET_PROFILE claims 65,535 stamps",
    "boot-burst": "2,000 BOOT frames with rising boot counts before the first INVOKE reply",
    "ack-no-reply": "INVOKE acknowledged, never answered",
    "silent": "never answers anything",
    "garbage": "answers every request with random bytes",
    "wrong-session": "replies carry another session",
    "stale-output": "GET_OUTPUT replies echo another invocation id",
    "old-firmware": "speaks protocol v1",
    "nak-args": "refuses every SET_INPUT with NAK ARGS",
    "fault": "sends a FAULT frame instead of the INVOKE reply",
    "reset-before-output": "reboots once between the INVOKE reply and GET_OUTPUT (BOOT sent)",
    "reset-lost-boot": "reboots once after the inputs arrive, before INVOKE, its BOOT frame lost",
    "reset-mid-input": "reboots once after the first SET_INPUT, its BOOT frame lost",
    "reset-mid-output": "reboots once after the first GET_OUTPUT reply, its BOOT frame lost",
    "boot-loop": "reboots (BOOT sent) at every INVOKE",
    "wrong-answer": "flips one bit of every output: a real mismatch the host must report",
}
# modes after which the host must have the right answer (the others: a clean DeviceError)
RIGHT_ANSWER_MODES = ("ok", "reset-before-output", "reset-lost-boot", "reset-mid-input",
                      "reset-mid-output", "boot-burst")


def pattern_model(inputs: Sequence[bytes], output_sizes: Sequence[int]) -> list[bytes]:
    """A deterministic stand-in model: output k byte i = packed input byte (i mod n) + k + 1."""
    data = b"".join(inputs) or b"\0"
    return [bytes((data[i % len(data)] + k + 1) & 0xFF for i in range(n))
            for k, n in enumerate(output_sizes)]


@dataclass
class FakeStats:
    connections: int = 0
    requests: dict = field(default_factory=dict)     # type name -> count
    invokes: int = 0
    resets: int = 0


class FakeBoard:
    def __init__(self, inputs: Sequence[int], outputs: Sequence[int],
                 model: Callable[[list[bytes]], list[bytes]] | None = None, *, commands: int = 1,
                 command_cycles: Sequence[int] | None = None, mode: str = "ok", seed: int = 0,
                 board: str = "fake-board", core: str = "cortex-m4", clock_hz: int = 100_000_000,
                 max_payload: int = MAX_PAYLOAD, arena_bytes: int = 1024):
        if mode not in MODES:
            raise ValueError(f"unknown fake-board mode {mode!r}; modes: {', '.join(MODES)}")
        self.input_sizes, self.output_sizes = tuple(inputs), tuple(outputs)
        self.model = model or (lambda xs: pattern_model(xs, self.output_sizes))
        self.cycles = list(command_cycles or [1000 * (i + 1) for i in range(commands)])
        self.mode, self.rng = mode, random.Random(seed)
        self.info = Info(arena_bytes, sum(self.input_sizes), sum(self.output_sizes), len(self.cycles),
                         clock_hz, clock_hz, 8192, 0x20000000, "dwt", True, VERSION, board, core,
                         "fake", self.input_sizes, self.output_sizes)
        self.max_payload = max_payload
        self.stats = FakeStats()
        self.errors: list[str] = []
        self.boot_count = 1
        self._fired: set[str] = set()
        self._lock = threading.RLock()
        self._conn: socket.socket | None = None
        self._power_on()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(2)
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kiln-fake-board", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    def expected(self, inputs: Sequence[bytes]) -> list[bytes]:
        """What a correct board answers for these inputs."""
        return [bytes(b) for b in self.model([bytes(x) for x in inputs])]

    # ---- board state ---------------------------------------------------------------------
    def _power_on(self) -> None:
        self.session = 0
        self.inputs = [bytearray(n) for n in self.input_sizes]
        self.outputs: list[bytes] = [bytes(n) for n in self.output_sizes]
        self.out_id = self.prof_id = 0
        self.cache: tuple[int, int, bytes, bytes] | None = None

    def reset(self, boot: bool = True) -> None:
        """Reboot: everything but the boot count is lost; BOOT is sent unless ``boot`` is False."""
        with self._lock:
            self.stats.resets += 1
            self.boot_count += 1
            self._power_on()
            if boot:
                self._send(encode(T.BOOT, 0, struct.pack("<HI", self._version(), self.boot_count)))

    def _version(self) -> int:
        return 1 if self.mode == "old-firmware" else VERSION

    def _once(self, name: str) -> bool:
        if self.mode != name or name in self._fired:
            return False
        self._fired.add(name)
        return True

    # ---- serving -------------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                r, _, _ = select.select([self._server], [], [], 0.05)
            except (OSError, ValueError):      # closed under us
                return
            if not r:
                continue
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.stats.connections += 1
            with self._lock:
                self._conn = conn
            dec = Decoder()
            while not self._stop.is_set():
                r, _, _ = select.select([conn], [], [], 0.05)
                if not r:
                    continue
                try:
                    data = conn.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    break
                for f in dec.feed(data):
                    with self._lock:
                        try:
                            self._handle(f)
                        except Exception as e:      # a bug of the fake: keep it visible
                            self.errors.append(f"{f!r}: {type(e).__name__}: {e}")
            with self._lock:
                self._conn = None
            conn.close()

    def _send(self, data: bytes) -> None:
        if self._conn is not None:
            try:
                self._conn.sendall(data)
            except OSError:
                pass

    def _reply(self, f: Frame, body: bytes, session: bool = True, cache: bool = True) -> None:
        payload = (struct.pack("<I", self._reply_session()) if session else b"") + body
        frame = encode(f.type | REPLY, f.seq, payload[:MAX_PAYLOAD])
        if self.mode == "long-reply" and f.type == T.HELLO:
            frame = encode(f.type | REPLY, f.seq, (payload + bytes(MAX_PAYLOAD))[:MAX_PAYLOAD])
        if cache:
            self.cache = (f.seq, f.type, f.payload, frame)
        self._send(frame)

    def _reply_session(self) -> int:
        return self.session ^ 0x5A5A5A5A if self.mode == "wrong-session" else self.session

    def _nak(self, f: Frame, err: int) -> None:
        self.cache = None
        self._send(encode(T.NAK, f.seq, struct.pack("<IBB", self.session, err, f.type)))

    def _handle(self, f: Frame) -> None:
        name = T(f.type).name if f.type in T._value2member_map_ else hex(f.type)
        self.stats.requests[name] = self.stats.requests.get(name, 0) + 1
        if self.mode == "silent":
            return
        if self.mode == "garbage":
            self._send(bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 40))))
            return
        if f.type == T.HELLO:
            return self._hello(f)
        if len(f.payload) < 4 or self.session == 0 or struct.unpack_from("<I", f.payload)[0] != self.session:
            return self._nak(f, NakError.SESSION)
        if self.cache is not None and self.cache[:3] == (f.seq, f.type, f.payload):
            return self._send(self.cache[3])
        handler = {T.INFO: self._info, T.SET_INPUT: self._set_input, T.INVOKE: self._invoke,
                   T.GET_OUTPUT: self._get_output, T.GET_PROFILE: self._get_profile,
                   T.GET_STACK: self._get_stack, T.ECHO: self._echo,
                   T.EXIT: self._reset_cmd, T.RESET: self._reset_cmd}.get(f.type)
        if handler is None:
            return self._nak(f, NakError.TYPE)
        err = handler(f, f.payload[4:])
        if err:
            self._nak(f, err)

    def _hello(self, f: Frame) -> None:
        if len(f.payload) < 6 or struct.unpack_from("<I", f.payload, 2)[0] == 0:
            return self._nak(f, NakError.ARGS)
        self.session = struct.unpack_from("<I", f.payload, 2)[0]
        self.cache = None
        mp = {"max-payload-0": 0, "max-payload-4": 4}.get(self.mode, self.max_payload)
        body = struct.pack("<HIHI", self._version(), self.session, mp, self.boot_count)
        self._reply(f, body[:5] if self.mode == "short-hello" else body, session=False, cache=False)

    def _info(self, f: Frame, a: bytes) -> int:
        body = self.info.pack()
        if self.mode == "huge-output":
            body = body[:8] + struct.pack("<I", 0xFFFFFFF0) + body[12:]
        self._reply(f, body[:20] if self.mode == "short-info" else body)
        return 0

    def _set_input(self, f: Frame, a: bytes) -> int:
        if self.mode == "nak-args":
            return NakError.ARGS
        if len(a) < 5 or a[0] >= len(self.inputs):
            return NakError.ARGS
        buf, off, data = self.inputs[a[0]], struct.unpack_from("<I", a, 1)[0], a[5:]
        if off > len(buf) or len(data) > len(buf) - off:
            return NakError.ARGS
        buf[off:off + len(data)] = data
        self._reply(f, struct.pack("<I", off + len(data)))
        if self._once("reset-mid-input"):
            self.reset(boot=False)
        elif off + len(data) == len(buf) and a[0] == len(self.inputs) - 1 and self._once("reset-lost-boot"):
            self.reset(boot=False)
        return 0

    def _invoke(self, f: Frame, a: bytes) -> int:
        if len(a) != 12 or struct.unpack_from("<I", a)[0] == 0:
            return NakError.ARGS
        inv, n, crc = struct.unpack("<III", a)
        self._send(encode(T.ACK, f.seq, struct.pack("<IB", self.session, f.type)))
        if self.mode == "ack-no-reply":
            return 0
        data = b"".join(bytes(b) for b in self.inputs)
        if n != len(data) or crc != crc32(data):
            return NakError.INPUT
        if self.mode == "boot-loop":
            self.reset()
            return 0
        if self.mode == "fault":
            self._send(encode(T.FAULT, 0, struct.pack("<12I", 3, 1 << 16, 0, 0, 1, 2, 3, 12, 0xFFFFFFF9, 0x1000,
                                                   0x01000000, 0x20001000)))
            return 0
        self.stats.invokes += 1
        self.outputs = [bytes(b) for b in self.model([bytes(b) for b in self.inputs])]
        if self.mode == "wrong-answer":
            self.outputs = [bytes([b[0] ^ 1]) + b[1:] for b in self.outputs]
        self.out_id = self.prof_id = inv
        if self._once("boot-burst"):
            self._send(b"".join(encode(T.BOOT, 0, struct.pack("<HI", VERSION, self.boot_count + k))
                                for k in range(1, 2001)))
            self.boot_count += 2000
        body = struct.pack("<IiQIBB", inv, 0, sum(self.cycles), self.info.timer_hz, 1, len(self.cycles) + 1)
        self._reply(f, body[:10] if self.mode == "short-invoke" else body)
        if self._once("reset-before-output"):
            self.reset()
        return 0

    def _get_output(self, f: Frame, a: bytes) -> int:
        if len(a) != 11 or a[4] >= len(self.outputs):
            return NakError.ARGS
        inv, k, off, n = struct.unpack("<IBIH", a)
        out = self.outputs[k]
        if off > len(out) or n > len(out) - off or n > self.max_payload - 8:
            return NakError.ARGS
        if inv == 0 or inv != self.out_id:
            return NakError.STALE
        echo = inv ^ 1 if self.mode == "stale-output" else inv
        self._reply(f, struct.pack("<I", echo) + (b"" if self.mode == "empty-output" else out[off:off + n]))
        if self._once("reset-mid-output"):
            self.reset(boot=False)
        return 0

    def _get_profile(self, f: Frame, a: bytes) -> int:
        if len(a) != 8:
            return NakError.ARGS
        inv, first, want = struct.unpack("<IHH", a)
        total = len(self.cycles) + 1
        if first > total:
            return NakError.ARGS
        if inv == 0 or inv != self.prof_id:
            return NakError.STALE
        stamps = [0]
        for c in self.cycles:
            stamps.append(stamps[-1] + c)
        count = min(total - first, want, (self.max_payload - 16) // 8)
        chunk = stamps[first:first + count]
        if self.mode == "many-stamps":
            total = 0xFFFF
        claimed = 3 if self.mode == "short-profile" else count
        if self.mode == "short-profile":
            chunk = chunk[:1]
        self._reply(f, struct.pack("<I4H", inv, first, claimed, total, total) +
                    struct.pack(f"<{len(chunk)}Q", *chunk))
        return 0

    def _get_stack(self, f: Frame, a: bytes) -> int:
        self._reply(f, struct.pack("<3I", 8192, 512, 0x20000000))
        return 0

    def _echo(self, f: Frame, a: bytes) -> int:
        self._reply(f, a)
        return 0

    def _reset_cmd(self, f: Frame, a: bytes) -> int:
        self._reply(f, b"")
        self.reset()
        return 0

    # ---- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        try:
            self._server.close()
        except OSError:
            pass

    def __enter__(self) -> FakeBoard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def random_inputs(sizes: Sequence[int], seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [bytes(rng.randrange(256) for _ in range(n)) for n in sizes]


__all__ = ["FakeBoard", "MODES", "RIGHT_ANSWER_MODES", "pattern_model", "random_inputs"]
