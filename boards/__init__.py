"""Boards: one validated TOML data file per board, plus the hardware-in-the-loop harness.

    >>> from kiln import boards
    >>> b = boards.load("mps2-an386")
    >>> b.core, b.fpu, hex(b.uart.base)
    ('cortex-m4', 'sp', '0x40004000')

Adding a board means adding ``<name>.toml`` next to this file (see docs/firmware.md).
The harness (``device`` over ``link`` and ``protocol``, ``errors``, ``qemu``, ``proxy``,
``labmap``, and for testing it ``fake`` and ``campaign``) is imported lazily by callers; this
module only loads board data.
"""
from __future__ import annotations

import tomllib
from functools import cache, lru_cache
from pathlib import Path

from kiln.common.cores import CORES, Core

from .schema import Board, BoardError, FlashMethod, Qemu, Region, RegWrite, Uart, validate

BOARD_DIR = Path(__file__).resolve().parent

__all__ = ["Board", "BoardError", "Region", "Uart", "RegWrite", "FlashMethod", "Qemu", "Core",
           "CORES", "load", "load_file", "all_boards", "board_names", "for_qemu", "BOARD_DIR"]


def load_file(path: str | Path) -> Board:
    """Load and validate one board file; errors name the file and the field."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise BoardError(f"{path}: board file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise BoardError(f"{path}: not valid TOML: {e}") from None
    board = validate(data, str(path))
    if board.name != path.stem:
        raise BoardError(f"{path}: field 'name': expected {path.stem!r} (the file name), "
                         f"found {board.name!r}")
    return board


def board_names() -> list[str]:
    return sorted(p.stem for p in BOARD_DIR.glob("*.toml"))


@cache
def load(name: str) -> Board:
    """Load the board called ``name`` (a file ``boards/<name>.toml``)."""
    path = BOARD_DIR / f"{name}.toml"
    if not path.exists():
        raise BoardError(f"unknown board {name!r}: no file {path} "
                         f"(known boards: {', '.join(board_names())})")
    return load_file(path)


def all_boards() -> list[Board]:
    """Every board in the folder, validated, sorted by name."""
    return [load(n) for n in board_names()]


def for_qemu(board: Board | str) -> Board:
    """The board to build when running ``board``'s image under QEMU.

    An emulated board is returned unchanged. A real board maps to the emulated board whose
    QEMU machine it names (same core family): peripherals, memory origins and clock come from
    the emulated board, while the core/FPU flags and the flash/RAM *sizes* stay the real
    board's, so an image that links here also fits the real part.
    """
    if isinstance(board, str):
        board = load(board)
    if board.emulated:
        return board
    hosts = [b for b in all_boards() if b.emulated and b.qemu.machine == board.qemu.machine]
    if not hosts:
        raise BoardError(f"{board.path}: field 'qemu.machine': no emulated board runs QEMU "
                         f"machine {board.qemu.machine!r}")
    host = hosts[0]
    for reg in ("flash_region", "ram_region"):
        if getattr(board, reg).size > getattr(host, reg).size:
            raise BoardError(f"{board.name}: {reg.split('_')[0]} ({getattr(board, reg).size} B) "
                             f"is larger than {host.name}'s; pick a bigger qemu.machine")
    return host.replace(
        name=f"{board.name}@{host.name}",
        description=f"{board.description}, emulated on {host.name}",
        core=board.core,
        fpu=board.fpu,
        dsp=board.dsp,
        flash_region=Region(host.flash_region.origin, board.flash_region.size),
        ram_region=Region(host.ram_region.origin, board.ram_region.size),
        emulates=board.name,
    )
