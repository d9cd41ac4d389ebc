"""Open a device for a built image, wherever it runs: QEMU, a port, or the lab map.

    with open_device(image) as dev:                       # emulated board or stand-in: QEMU
    with open_device(image, port="/dev/ttyACM0") as dev:  # real board on a port
    with open_device(image, lab_map=load_lab_map()) as dev:

The same test code runs against all three; only how the board is reached differs.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .device import Device
from .flash import flash as flash_image
from .labmap import LabMap
from .qemu import Qemu
from .schema import BoardError


@contextmanager
def open_device(image, *, port: str | None = None, lab_map: LabMap | None = None,
                flash: bool = True, qemu_kw: dict | None = None, **device_kw) -> Iterator[Device]:
    board = image.board
    serial = None
    if port is None and lab_map is not None and not (board.emulated or board.emulates):
        entry = lab_map.find(board.name)
        port, serial = entry.port, entry.serial
        if entry.baud:
            device_kw.setdefault("baudrate", entry.baud)
    if port is None:
        if not (board.emulated or board.emulates):
            raise BoardError(f"board {board.name} is real hardware: pass a port (--port) or a "
                             f"lab map entry, or build with emulate=True to run it in QEMU")
        with Qemu(image, **(qemu_kw or {})) as q:
            dev = q.device(**device_kw)
            try:
                yield dev
            finally:
                dev.close()
        return
    if flash:
        flash_image(image, serial=serial)
    device_kw.setdefault("baudrate", board.uart.baud)
    dev = Device.open(port, **device_kw)
    try:
        yield dev
    finally:
        dev.close()
