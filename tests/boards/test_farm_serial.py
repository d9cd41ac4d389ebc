"""Kiln's serial code (boards/link.py over pyserial URLs) with the `serial` module installed beside
labgrid, whose extra brings pyserial-labgrid (a fork that installs the same `serial` package):
socket:// and rfc2217:// (through ser2net, as a labgrid exporter serves a board) carry whole
inferences bit for bit."""
import importlib.metadata as md
import os
import select
import shutil
import socket
import subprocess
import threading
import time

import pytest
import serial

from kiln.boards.device import Device, IOSpec
from kiln.boards.fake import FakeBoard, random_inputs
from kiln.boards.qemu import _owns_listener

INS, OUTS = (300, 200), (10, 700)


def _installed(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def test_the_serial_module_is_one_kiln_supports():
    """Whichever distribution supplied `serial` (pyserial, or labgrid's pyserial-labgrid), it is a
    pyserial 3.5 with the URL handlers Kiln uses."""
    assert _installed("pyserial") or _installed("pyserial-labgrid")
    if _installed("labgrid"):
        assert _installed("pyserial-labgrid"), "labgrid without its pyserial fork"
    assert serial.__version__.startswith("3.5")
    for handler in ("serial.urlhandler.protocol_socket", "serial.urlhandler.protocol_rfc2217"):
        __import__(handler)


def _infer_through(url, fb):
    xs = random_inputs(INS, seed=3)
    with Device.open(url, expect=IOSpec(INS, OUTS, 1), timeout=5.0) as dev:
        outs, _ = dev.infer(xs)
    assert outs == fb.expected(xs)


def test_socket_url():
    with FakeBoard(INS, OUTS) as fb:
        _infer_through(fb.url, fb)


def _bridge(master_fd, sock, stop):
    """Copy bytes both ways between a pseudo-terminal's master side and a TCP socket."""
    while not stop.is_set():
        ready, _, _ = select.select([master_fd, sock], [], [], 0.05)
        for r in ready:
            try:
                data = os.read(master_fd, 4096) if r is master_fd else sock.recv(4096)
            except OSError:
                return
            if not data:
                return
            if r is master_fd:
                sock.sendall(data)
            else:
                os.write(master_fd, data)


@pytest.fixture
def ser2net_rfc2217(tmp_path):
    """ser2net serving a serial device over RFC 2217, exactly as labgrid's exporter serves a
    board's USB serial port; the device is a pseudo-terminal whose other side is a fake board.
    Yields (url, fake board)."""
    exe = shutil.which("ser2net") or ("/usr/sbin/ser2net" if os.path.exists("/usr/sbin/ser2net") else None)
    if exe is None:
        pytest.skip("ser2net not installed (bash scripts/setup.sh --test installs it)")
    master, slave = os.openpty()
    tty = os.ttyname(slave)
    stop = threading.Event()
    with FakeBoard(INS, OUTS) as fb, socket.create_connection(("127.0.0.1", fb.port)) as link:
        bridge = threading.Thread(target=_bridge, args=(master, link, stop), daemon=True)
        bridge.start()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log = open(tmp_path / "ser2net.log", "wb")
        p = subprocess.Popen([exe, "-d", "-n", "-Y", f"connection: &kiln#  accepter: telnet(rfc2217,mode=server),"
                              f"tcp,127.0.0.1,{port}", "-Y",
                              f"  connector: serialdev(nouucplock=true),{tty},115200n81,local"],
                             stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 10     # listening (checked without connecting to it)
            while time.monotonic() < deadline and not _owns_listener(p.pid, port):
                time.sleep(0.1)
            yield f"rfc2217://127.0.0.1:{port}?ign_set_control", fb
        finally:
            p.terminate()
            p.wait(5)
            stop.set()
            bridge.join(5)
            log.close()
            os.close(master)
            os.close(slave)


def test_rfc2217_url_through_ser2net(ser2net_rfc2217):
    """Was: NotImplementedError ("write_timeout is currently not supported") from pyserial's
    RFC 2217 client, for every rfc2217:// port."""
    url, fb = ser2net_rfc2217
    _infer_through(url, fb)
