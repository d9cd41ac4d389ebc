"""A board on a labgrid farm: acquire a place, find out which Kiln board it holds, reach its serial
port, release it on every path.

    spec = FarmSpec(place="lab-an386")                 # or tags={"board": "nucleo-l4r5zi"}, env="env.yaml"
    with Lease(spec) as lease:                         # acquired (or waited for); released on exit
        lease.board                                    # "mps2-an386": the place's 'board' tag
        lease.url                                      # "rfc2217://pi:50123?ign_set_control" (NetworkSerialPort)
        lease.flash(image)                             # labgrid's BootstrapProtocol driver, or Kiln's flasher

The coordinator is ``FarmSpec.coordinator``, else the environment file's ``coordinator_address``
option, else ``$LG_COORDINATOR``, else 127.0.0.1:20408 (labgrid's own order). A place that
another user holds is a :class:`PlaceBusy` error unless ``wait`` allows a labgrid reservation
to wait for it; a coordinator that does not answer is :class:`CoordinatorUnreachable`.

A crash must never leave a place locked: the lease releases in ``__exit__`` (normal exit, an
exception, Ctrl-C), turns SIGTERM into the same path, and a small guard process (``python -m
kiln.boards.farm guard``, in its own session) releases the place if this process dies without
releasing it (SIGKILL, a segfault): it holds a pipe whose end closes when this process dies.

labgrid is an optional extra (``pip install 'kiln-ml[farm]'``) and is imported only here, when
a lease starts.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from .flash import flash as kiln_flash
from .flash import write_uf2
from .schema import BoardError

DEFAULT_COORDINATOR = "127.0.0.1:20408"
TAG_KEY = re.compile(r"^[a-z][a-z0-9_]+$")       # labgrid's rules for tag keys and values
TAG_VAL = re.compile(r"^[a-z0-9_-]*$")
BOARD_TAG = "board"                               # the tag naming the Kiln board of a place
INSTALL_HINT = "install the farm extra: pip install 'kiln-ml[farm]' (bash scripts/setup.sh --test does it)"


class FarmError(BoardError):
    """A labgrid farm could not give a board (exit 2): the message says what to do."""


class PlaceBusy(FarmError):
    """The place is held by someone else (and no wait was asked for, or the wait ran out)."""


class CoordinatorUnreachable(FarmError):
    """No labgrid coordinator answers at the address."""


@dataclass(frozen=True)
class FarmSpec:
    place: str | None = None            # a place name (or a unique pattern, as labgrid-client -p)
    tags: dict = field(default_factory=dict)   # pick any free place with these tags
    env: str | None = None              # a labgrid environment file (RemotePlace, options)
    coordinator: str | None = None      # HOST[:PORT]
    wait: float = 0.0                   # seconds to wait for a busy place (0: fail at once)


def parse_tags(texts) -> dict:
    """['board=mps2-an386', ...] -> {'board': 'mps2-an386'} (labgrid's key/value rules)."""
    tags = {}
    for text in texts or ():
        key, sep, value = text.partition("=")
        if not sep or not TAG_KEY.match(key) or not TAG_VAL.match(value):
            raise FarmError(f"--labgrid-tag {text!r}: expected key=value with a lower-case key "
                            f"([a-z][a-z0-9_]+) and a value of [a-z0-9_-], e.g. board=mps2-an386")
        tags[key] = value
    return tags


def _labgrid():
    """labgrid's client module and protobuf messages (imported here only)."""
    try:
        from labgrid.remote import client
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2
    except ImportError as e:
        raise FarmError(f"a labgrid farm needs labgrid ({e}): {INSTALL_HINT}") from None
    return client, pb2


def read_env(path) -> dict:
    """What Kiln reads from a labgrid environment file: the RemotePlace name, the Kiln board
    (option ``kiln_board`` of the target, or of the file) and ``coordinator_address``."""
    try:
        import yaml
    except ImportError:
        raise FarmError(f"--lg-env {path}: reading it needs PyYAML: {INSTALL_HINT}") from None
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        raise FarmError(f"--lg-env {path}: cannot read it: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise FarmError(f"--lg-env {path}: not valid YAML: {e}") from None
    options = data.get("options") or {}
    found = {"place": None, "board": options.get("kiln_board"),
             "coordinator": options.get("coordinator_address")}
    for target in (data.get("targets") or {}).values():
        res = (target or {}).get("resources") or {}
        items = res.items() if isinstance(res, dict) else [kv for r in res for kv in r.items()]
        for cls, args in items:
            if cls == "RemotePlace":
                found["place"] = (args or {}).get("name")
        found["board"] = ((target or {}).get("options") or {}).get("kiln_board", found["board"])
        if found["place"]:
            return found
    raise FarmError(f"--lg-env {path}: no target with a RemotePlace resource (targets: main: resources: "
                    f"RemotePlace: name: PLACE)")


def coordinator_address(spec: FarmSpec, env: dict | None = None) -> str:
    """labgrid's order: the option, the environment file's coordinator_address, $LG_COORDINATOR."""
    return (spec.coordinator or (env or {}).get("coordinator") or os.environ.get("LG_COORDINATOR")
            or DEFAULT_COORDINATOR)


def start_session(client, address: str):
    """labgrid's ``start_session``, but on a gRPC channel of its own: gRPC shares one connection
    between the channels of a process, and the coordinator takes a second session arriving on
    the same connection for the first one (it fails), so two leases in one process (two
    places, a fixture and a waiting client) each need their own."""
    import grpc
    from labgrid.remote.generated import labgrid_coordinator_pb2_grpc
    from labgrid.util.proxy import proxymanager
    loop = client.ensure_event_loop()
    address = proxymanager.get_grpc_address(address, default_port=20408)
    session = client.ClientSession(address, loop)
    session.channel = grpc.aio.insecure_channel(target=address, options=[
        ("grpc.keepalive_time_ms", 7500), ("grpc.keepalive_timeout_ms", 10000),
        ("grpc.http2.ping_timeout_ms", 10000), ("grpc.http2.max_pings_without_data", 0),
        ("grpc.use_local_subchannel_pool", 1)])
    session.stub = labgrid_coordinator_pb2_grpc.CoordinatorStub(session.channel)
    loop.run_until_complete(session.start())
    return session


class Lease:
    """One acquired place (a context manager). See the module docstring."""

    def __init__(self, spec: FarmSpec):
        if not (spec.place or spec.tags or spec.env):
            raise FarmError("name a place (--labgrid PLACE), tags (--labgrid-tag key=value) or an "
                            "environment file (--lg-env env.yaml)")
        self.spec = spec
        self.env = read_env(spec.env) if spec.env else {}
        self.address = coordinator_address(spec, self.env)
        self.place_name = spec.place or self.env.get("place")
        self.session = None
        self.acquired = False
        self.reservation = None
        self._guard = None
        self._old_term = None

    # ---- coordinator ---------------------------------------------------------------------
    def _run(self, coro):
        return self.session.loop.run_until_complete(coro)

    def _rpc(self, call, request, what):
        import grpc
        try:
            return self._run(call(request))
        except grpc.aio.AioRpcError as e:
            raise FarmError(f"labgrid coordinator {self.address}: {what}: {e.details()}") from None

    def _connect(self) -> None:
        client, _ = _labgrid()
        try:
            self.session = start_session(client, self.address)
        except (client.Error, OSError) as e:
            raise CoordinatorUnreachable(
                f"cannot reach the labgrid coordinator at {self.address} ({e}): start "
                f"labgrid-coordinator there, or point LG_COORDINATOR (or --lg-coordinator) at yours") from None

    @property
    def user(self) -> str:
        return f"{self.session.gethostname()}/{self.session.getuser()}"

    def _place(self, name):
        place = self.session.places.get(name)
        if place is None:
            have = ", ".join(sorted(self.session.places)) or "none"
            raise FarmError(f"labgrid coordinator {self.address}: no place {name!r} (places: {have}); "
                            f"create it with `labgrid-client -p {name} create`")
        return place

    # ---- acquire / release ---------------------------------------------------------------
    def _filters(self) -> dict:
        return {"name": self.place_name} if self.place_name else dict(self.spec.tags)

    def _pick(self) -> str | None:
        """A free place matching the spec now (None when every match is held)."""
        if self.place_name:
            place = self._place(self.place_name)
            return None if (place.acquired or place.reservation) else place.name
        want = self.spec.tags.items()
        matching = [p for p in self.session.places.values() if all(p.tags.get(k) == v for k, v in want)]
        if not matching:
            raise FarmError(f"labgrid coordinator {self.address}: no place has the tags "
                            f"{' '.join(f'{k}={v}' for k, v in want)}")
        free = [p.name for p in sorted(matching, key=lambda p: p.name) if not (p.acquired or p.reservation)]
        return free[0] if free else None

    def _busy(self) -> PlaceBusy:
        what = self.place_name or " ".join(f"{k}={v}" for k, v in self.spec.tags.items())
        held = ""
        if self.place_name:
            p = self._place(self.place_name)
            held = f" (acquired by {p.acquired})" if p.acquired else " (reserved)"
        return PlaceBusy(f"labgrid place {what} is busy{held}: wait for it with --labgrid-wait SECONDS, "
                         f"or ask its holder to release it (`labgrid-client -p PLACE release`)")

    def _acquire(self) -> None:
        _, pb2 = _labgrid()
        name = self._pick()
        if name is None:
            if self.spec.wait <= 0:
                raise self._busy()
            name = self._wait_reservation()
        self._start_guard(name)     # before acquiring: a crash right after it is covered too
        try:
            self._rpc(self.session.stub.AcquirePlace, pb2.AcquirePlaceRequest(placename=name), f"acquire {name}")
        except FarmError as e:
            if "already acquired" in str(e) or "not reserved for" in str(e):   # taken a moment ago
                raise self._busy() from None
            raise
        self._run(self.session.sync_with_coordinator())
        self.place_name = name
        self.acquired = True

    def _wait_reservation(self) -> str:
        """A labgrid reservation for the spec, polled until the coordinator allocates a place
        (it refreshes the reservation) or the wait runs out."""
        _, pb2 = _labgrid()
        filters = {"main": pb2.Reservation.Filter(filter=self._filters())}
        got = self._rpc(self.session.stub.CreateReservation, pb2.CreateReservationRequest(filters=filters, prio=0.0),
                        "create a reservation")
        self.reservation = got.reservation.token
        deadline = time.monotonic() + self.spec.wait
        while True:
            res = self._rpc(self.session.stub.PollReservation, pb2.PollReservationRequest(token=self.reservation),
                            "poll the reservation").reservation
            if res.allocations.get("main"):        # filter group -> the place allocated to it
                return res.allocations["main"]
            if time.monotonic() >= deadline:
                raise self._busy()
            time.sleep(0.5)

    def release(self) -> None:
        """Release the place and cancel the reservation (safe to call twice)."""
        if self.session is None:
            return
        _, pb2 = _labgrid()
        try:
            if self.acquired:
                self.acquired = False
                self._rpc(self.session.stub.ReleasePlace,
                          pb2.ReleasePlaceRequest(placename=self.place_name, fromuser=self.user),
                          f"release {self.place_name}")
            if self.reservation:
                token, self.reservation = self.reservation, None
                self._rpc(self.session.stub.CancelReservation, pb2.CancelReservationRequest(token=token),
                          "cancel the reservation")
        finally:
            self._stop_guard(released=True)

    # ---- what the place holds ------------------------------------------------------------
    @property
    def board(self) -> str:
        place = self._place(self.place_name)
        name = self.env.get("board") or place.tags.get(BOARD_TAG)
        if not name:
            raise FarmError(f"labgrid place {self.place_name} names no Kiln board: tag it "
                            f"(`labgrid-client -p {self.place_name} set-tags board=mps2-an386`) or set "
                            f"option kiln_board in the environment file")
        return name

    def serial(self) -> tuple[str, int | None]:
        """(pyserial URL, baud rate) of the place's NetworkSerialPort."""
        place = self._place(self.place_name)
        resources = self.session.get_target_resources(place)
        ports = [r for (_, cls), r in sorted(resources.items()) if cls == "NetworkSerialPort"]
        if not ports:
            raise FarmError(f"labgrid place {self.place_name} has no NetworkSerialPort (its resources: "
                            f"{', '.join(sorted(c for _, c in resources)) or 'none'}): export the board's "
                            f"serial port (docs/farm.md)")
        r = ports[0]
        if not r.avail:
            raise FarmError(f"labgrid place {self.place_name}: its serial port is not available "
                            f"(is the board plugged in and its exporter running?)")
        args = r.args
        if args.get("protocol") == "raw":
            return f"socket://{args['host']}:{args['port']}", args.get("speed")
        # ser2net does not answer RFC 2217's SET_CONTROL: pyserial must not wait for it (as
        # labgrid's own SerialDriver does)
        return f"rfc2217://{args['host']}:{args['port']}?ign_set_control", args.get("speed")

    @property
    def url(self) -> str:
        return self.serial()[0]

    def flash(self, image, serial: str | None = None) -> str:
        """Put ``image`` on the place's board: labgrid's BootstrapProtocol driver (OpenOCD,
        pyOCD, ...) when the environment file configures one; for a board flashed with UF2
        files (rpi-pico), labgrid's USBStorageDriver when it configures that (the UF2 file is
        copied onto the boot ROM's drive, partition 1); else Kiln's own flasher
        (boards/flash.py; emulated boards run the image their exporter host started).
        Returns how it was flashed."""
        if self.spec.env:
            from labgrid import Environment
            target = Environment(self.spec.env).get_target()
            if image.board.flash.options.get("format") == "uf2" and not (image.board.emulated
                                                                          or image.board.emulates):
                storage = _driver(target, "USBStorageDriver")
                if storage is not None:
                    target.activate(storage)
                    storage.write_files([str(write_uf2(image))], PurePosixPath("/"), 1)
                    return "labgrid USBStorageDriver (UF2)"
            driver = _driver(target, "BootstrapProtocol")
            if driver is not None:
                target.activate(driver)
                driver.load(str(image.elf))
                return f"labgrid {type(driver).__name__}"
        kiln_flash(image, serial=serial)
        return "kiln" if not (image.board.emulated or image.board.emulates) else "none (emulated)"

    # ---- crash safety --------------------------------------------------------------------
    def _start_guard(self, place: str) -> None:
        cmd = [sys.executable, "-m", "kiln.boards.farm", "guard", self.address, place, self.user]
        self._guard = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)

    def _stop_guard(self, released: bool) -> None:
        g, self._guard = self._guard, None
        if g is None:
            return
        try:
            g.stdin.write(b"released\n" if released else b"")
            g.stdin.close()
            g.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            g.kill()

    def _on_term(self, signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    def __enter__(self) -> Lease:
        self._connect()
        if threading.current_thread() is threading.main_thread():
            self._old_term = signal.signal(signal.SIGTERM, self._on_term)
        try:
            self._acquire()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        try:
            self.release()
        finally:
            if self._old_term is not None:
                signal.signal(signal.SIGTERM, self._old_term)
                self._old_term = None
            if self.session is not None:
                try:
                    self._run(self.session.stop())
                except Exception:
                    pass
                self.session = None

    def __exit__(self, *exc) -> None:
        self.close()


def guard(address: str, place: str, user: str) -> int:
    """Wait until the parent says it released ``place`` or dies (its pipe closes), then release
    the place if ``user`` still holds it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    line = sys.stdin.readline()
    if line.strip() == "released":
        return 0
    client, pb2 = _labgrid()
    for _ in range(30):
        try:
            session = start_session(client, address)
            break
        except client.Error:
            time.sleep(1.0)
    else:
        return 1
    session.loop.run_until_complete(
        session.stub.ReleasePlace(pb2.ReleasePlaceRequest(placename=place, fromuser=user)))
    session.loop.run_until_complete(session.stop())
    return 0


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "guard":
    sys.exit(guard(*sys.argv[2:]))


def _driver(target, name: str):
    """The labgrid target's driver (or protocol) ``name``, None when it has none."""
    try:
        return target.get_driver(name)
    except Exception:
        return None
