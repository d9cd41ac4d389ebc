"""A fault-injecting TCP serial proxy, to prove the harness survives a bad link.

    with FaultProxy(upstream_port=q.port, seed=1) as px:
        px.set_faults("to_device", drop=0.01, corrupt=0.01)
        px.set_faults("to_host", delay=0.002, garbage=0.01)
        dev = Device.open(px.url)
        px.drop_next("to_host", 5)         # lose the next 5 bytes of a reply
        px.disconnect()                    # cut the link, as a board reset / USB re-plug does
        px.on_frame("to_device", T.GET_OUTPUT, lambda f: q.system_reset())   # act on a frame

It listens on a free local port, accepts the host, connects to the upstream (QEMU's serial
socket) and pumps bytes both ways, dropping, corrupting (one bit flipped), inserting garbage or
delaying them as configured. Random faults come from a seeded generator, so a failing run can
be replayed. Directions: ``to_device`` (host -> board) and ``to_host`` (board -> host).
"""
from __future__ import annotations

import random
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .protocol import Decoder, Frame

DIRECTIONS = ("to_device", "to_host")


@dataclass
class Trigger:
    direction: str
    ftype: int
    action: Callable[[Frame], None]
    when: str = "before"     # run the action before / after forwarding the chunk with the frame
    count: int = 1           # the n-th such frame (then the trigger is spent)


@dataclass
class Faults:
    drop: float = 0.0       # probability a byte is dropped
    corrupt: float = 0.0    # probability a byte gets one bit flipped
    garbage: float = 0.0    # probability a random byte is inserted before a byte
    delay: float = 0.0      # seconds added before each forwarded chunk
    drop_next: int = 0      # drop exactly this many upcoming bytes
    corrupt_next: int = 0   # corrupt exactly this many upcoming bytes


@dataclass
class ProxyStats:
    forwarded: dict = field(default_factory=lambda: {d: 0 for d in DIRECTIONS})
    dropped: dict = field(default_factory=lambda: {d: 0 for d in DIRECTIONS})
    corrupted: dict = field(default_factory=lambda: {d: 0 for d in DIRECTIONS})
    inserted: dict = field(default_factory=lambda: {d: 0 for d in DIRECTIONS})
    connections: int = 0
    disconnects: int = 0


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1", seed: int = 0,
                 connect_timeout: float = 10.0):
        self.upstream = (upstream_host, upstream_port)
        self.rng = random.Random(seed)
        self.faults = {d: Faults() for d in DIRECTIONS}
        self.stats = ProxyStats()
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(4)
        self.port = self._server.getsockname()[1]
        self._up: socket.socket | None = None
        self._client: socket.socket | None = None
        self._stop = threading.Event()
        self._cut = threading.Event()
        self._triggers: list[Trigger] = []
        self._watch = {d: Decoder() for d in DIRECTIONS}
        self._thread = threading.Thread(target=self._serve, name="kiln-fault-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    # ---- configuration -------------------------------------------------------------------
    def set_faults(self, direction: str, **kw) -> None:
        with self._lock:
            f = self.faults[direction]
            for k, v in kw.items():
                if not hasattr(f, k):
                    raise ValueError(f"unknown fault {k!r} (known: {', '.join(vars(f))})")
                setattr(f, k, v)

    def clear_faults(self) -> None:
        with self._lock:
            self.faults = {d: Faults() for d in DIRECTIONS}

    def drop_next(self, direction: str, n: int) -> None:
        self.set_faults(direction, drop_next=n)

    def corrupt_next(self, direction: str, n: int) -> None:
        self.set_faults(direction, corrupt_next=n)

    def on_frame(self, direction: str, ftype: int, action: Callable[[Frame], None], *,
                 when: str = "before", count: int = 1) -> None:
        """Call ``action(frame)`` when the ``count``-th frame of type ``ftype`` (e.g. T.INVOKE,
        or T.INVOKE | REPLY) passes in ``direction``, before or after forwarding the chunk that
        ends it (in the proxy's thread). One-shot."""
        if direction not in DIRECTIONS or when not in ("before", "after"):
            raise ValueError(f"direction must be one of {DIRECTIONS}, when 'before' or 'after'")
        with self._lock:
            self._triggers.append(Trigger(direction, ftype, action, when, count))

    def _fire(self, direction: str, data: bytes) -> tuple[list, list]:
        """Triggers the frames in ``data`` set off: (before, after) lists of (action, frame)."""
        if not self._triggers:
            return [], []
        fired: dict[str, list] = {"before": [], "after": []}
        for f in self._watch[direction].feed(data):
            with self._lock:
                for t in list(self._triggers):
                    if t.direction == direction and t.ftype == f.type:
                        t.count -= 1
                        if t.count == 0:
                            self._triggers.remove(t)
                            fired[t.when].append((t.action, f))
        return fired["before"], fired["after"]

    def disconnect(self, drop_upstream: bool = False) -> None:
        """Close the host's connection (it sees EOF). With drop_upstream, the connection to the
        board is closed too and reopened when the host reconnects (bytes in flight are lost)."""
        self._cut_upstream = drop_upstream
        self._cut.set()

    # ---- pumping -------------------------------------------------------------------------
    def _mangle(self, direction: str, data: bytes) -> bytes:
        out = bytearray()
        with self._lock:
            f = self.faults[direction]
            for b in data:
                if f.garbage and self.rng.random() < f.garbage:
                    out.append(self.rng.randrange(256))
                    self.stats.inserted[direction] += 1
                if f.drop_next > 0:
                    f.drop_next -= 1
                    self.stats.dropped[direction] += 1
                    continue
                if f.drop and self.rng.random() < f.drop:
                    self.stats.dropped[direction] += 1
                    continue
                if f.corrupt_next > 0 or (f.corrupt and self.rng.random() < f.corrupt):
                    if f.corrupt_next > 0:
                        f.corrupt_next -= 1
                    b ^= 1 << self.rng.randrange(8)
                    self.stats.corrupted[direction] += 1
                out.append(b)
            self.stats.forwarded[direction] += len(out)
            delay = f.delay
        if delay:
            time.sleep(delay)
        return bytes(out)

    def _connect_upstream(self) -> socket.socket:
        deadline = time.monotonic() + self.connect_timeout
        while True:
            try:
                s = socket.create_connection(self.upstream, timeout=1.0)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return s
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _serve(self) -> None:
        self._cut_upstream = False
        while not self._stop.is_set():
            r, _, _ = select.select([self._server], [], [], 0.1)
            if not r:
                continue
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.stats.connections += 1
            try:
                if self._up is None:
                    self._up = self._connect_upstream()
            except OSError:
                client.close()
                continue
            self._client = client
            self._pump(client, self._up)
            client.close()
            self._client = None
            if self._cut_upstream and self._up is not None:
                self._up.close()
                self._up = None
                self._cut_upstream = False

    def _pump(self, client: socket.socket, up: socket.socket) -> None:
        peers = {client: (up, "to_device"), up: (client, "to_host")}
        while not self._stop.is_set():
            if self._cut.is_set():
                self._cut.clear()
                self.stats.disconnects += 1
                return
            r, _, _ = select.select(list(peers), [], [], 0.02)
            for s in r:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    if s is up:
                        self._up.close()
                        self._up = None
                    return
                dst, direction = peers[s]
                before, after = self._fire(direction, data)
                for action, f in before:
                    action(f)
                data = self._mangle(direction, data)
                if data:
                    try:
                        dst.sendall(data)
                    except OSError:
                        return
                for action, f in after:
                    action(f)

    def close(self) -> None:
        self._stop.set()
        try:
            self._server.close()
        except OSError:
            pass
        self._thread.join(2)
        for s in (self._client, self._up):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
