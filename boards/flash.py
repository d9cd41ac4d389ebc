"""Put an image on a real board, by the method its board file names.

    flash(image)                     # uses image.board.flash
    flash_command(image, serial=...) # the command line, for logs and tests

openocd and pyocd program the ELF through a debug probe; copy-to-drive writes a UF2 file
(boards/uf2.py; :func:`write_uf2` puts ``firmware.uf2`` next to the image) onto the board's USB
mass-storage drive (RP2040 boot ROM). Emulated boards need no flashing.
"""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from . import uf2
from .schema import Board, BoardError

UF2_MAGIC = (uf2.MAGIC_START0, uf2.MAGIC_START1, uf2.MAGIC_END)
UF2_FLAG_FAMILY = uf2.FLAG_FAMILY_ID


def to_uf2(binary: bytes, base: int, family_id: int | None = None) -> bytes:
    """Wrap a flat binary loaded at ``base`` in 256-byte UF2 blocks (:func:`kiln.boards.uf2.encode`)."""
    return uf2.encode(binary, base, family_id)


def write_uf2(image) -> Path:
    """Write ``image`` (its flat binary, at the board's flash origin, with the board file's
    ``family_id``) as ``firmware.uf2`` next to ``image.bin``; returns its path."""
    board: Board = image.board
    fmt = board.flash.options.get("format")
    if board.flash.method != "copy-to-drive" or fmt != "uf2":
        raise BoardError(f"board {board.name} is not flashed with UF2 files (flash method "
                         f"{board.flash.method}{f', format {fmt}' if fmt else ''})")
    path = Path(image.bin).with_suffix(".uf2")
    path.write_bytes(to_uf2(Path(image.bin).read_bytes(), _base(board), board.flash.options.get("family_id")))
    return path


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
    shutil.copyfile(write_uf2(image), drive / "kiln.uf2")
