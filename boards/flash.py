"""Put an image on a real board, by the method its board file names.

    flash(image)                     # uses image.board.flash
    flash_command(image, serial=...) # the command line, for logs and tests

openocd and pyocd program the ELF through a debug probe; copy-to-drive writes a UF2 file onto
the board's USB mass-storage drive (RP2040 boot ROM). Emulated boards need no flashing.
"""
from __future__ import annotations

import shutil
import struct
import subprocess
import time
from pathlib import Path

from .schema import Board, BoardError

UF2_MAGIC = (0x0A324655, 0x9E5D5157, 0x0AB16F30)
UF2_FLAG_FAMILY = 0x00002000


def to_uf2(binary: bytes, base: int, family_id: int | None = None) -> bytes:
    """Wrap a flat binary loaded at ``base`` in 256-byte UF2 blocks."""
    chunks = [binary[i:i + 256] for i in range(0, len(binary), 256)] or [b""]
    out = bytearray()
    for n, chunk in enumerate(chunks):
        flags = UF2_FLAG_FAMILY if family_id is not None else 0
        hdr = struct.pack("<8I", UF2_MAGIC[0], UF2_MAGIC[1], flags, base + 256 * n, 256, n,
                          len(chunks), family_id or 0)
        out += hdr + chunk.ljust(476, b"\0") + struct.pack("<I", UF2_MAGIC[2])
    return bytes(out)


def _base(board: Board) -> int:
    return board.flash_region.origin


def flash_command(image, serial: str | None = None) -> list[str] | None:
    """The command that programs ``image`` (None for copy-to-drive and emulated boards)."""
    board: Board = image.board
    m = board.flash
    if m.method == "openocd":
        cmd = ["openocd"]
        for cfg in m.options["config"]:
            cmd += ["-f", cfg]
        if serial:
            cmd += ["-c", f"adapter serial {serial}"]
        cmd += ["-c", f"program {image.elf} verify reset exit"]
        return cmd
    if m.method == "pyocd":
        cmd = ["pyocd", "flash", "-t", m.options["target"]]
        if serial:
            cmd += ["-u", serial]
        return cmd + [str(image.elf)]
    if m.method == "picotool":
        return ["picotool", "load", "-x", str(image.elf)]
    return None


def _find_drive(label: str) -> Path | None:
    for root in (Path("/media"), Path("/run/media"), Path("/mnt"), Path("/Volumes")):
        if root.exists():
            for p in list(root.glob(label)) + list(root.glob(f"*/{label}")):
                if p.is_dir():
                    return p
    return None


def flash(image, serial: str | None = None, timeout: float = 120.0) -> None:
    board: Board = image.board
    if board.emulated or board.emulates:
        return
    cmd = flash_command(image, serial)
    if cmd is not None:
        if not shutil.which(cmd[0]):
            raise BoardError(f"board {board.name}: flashing needs {cmd[0]}, not found on PATH")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise BoardError(f"flashing {board.name} failed (exit {p.returncode}):\n  "
                             f"{' '.join(cmd)}\n{(p.stderr + p.stdout)[-3000:]}")
        return
    opts = board.flash.options
    drive = None
    deadline = time.monotonic() + timeout
    while drive is None and time.monotonic() < deadline:
        drive = _find_drive(opts["drive_label"])
        if drive is None:
            time.sleep(0.5)
    if drive is None:
        raise BoardError(f"board {board.name}: no drive labelled {opts['drive_label']} mounted "
                         f"(hold BOOTSEL while plugging the board in)")
    data = to_uf2(Path(image.bin).read_bytes(), _base(board), opts.get("family_id"))
    (drive / "kiln.uf2").write_bytes(data)
