"""Lab map: which real board is on which serial port (a per-machine TOML file, not code).

    # ~/.config/kiln/lab.toml  (or --lab-map FILE, or $KILN_LAB_MAP)
    [[board]]
    name = "nucleo-l4r5zi"          # a board file name
    port = "/dev/ttyACM0"           # any pyserial URL: /dev/tty*, rfc2217://host:port, socket://
    serial = "0668FF383333524157"   # probe serial number (picks the probe when flashing)
    baud = 115200                   # optional, default from the board file

Several boards of one kind may be listed; :meth:`LabMap.find` returns the first, or the one
with a given ``serial``.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .schema import BoardError

DEFAULT_PATH = Path.home() / ".config" / "kiln" / "lab.toml"


@dataclass(frozen=True)
class LabEntry:
    name: str
    port: str
    serial: str | None = None
    baud: int | None = None


@dataclass(frozen=True)
class LabMap:
    entries: tuple[LabEntry, ...]
    path: Path | None = None

    def find(self, board: str, serial: str | None = None) -> LabEntry:
        for e in self.entries:
            if e.name == board and (serial is None or e.serial == serial):
                return e
        have = ", ".join(f"{e.name}@{e.port}" for e in self.entries) or "nothing"
        raise BoardError(f"lab map {self.path}: no entry for board {board!r}"
                         f"{' with serial ' + serial if serial else ''} (it lists {have})")

    def boards(self) -> list[str]:
        return [e.name for e in self.entries]


def load_lab_map(path: str | os.PathLike | None = None) -> LabMap:
    """Load a lab map; path defaults to $KILN_LAB_MAP, then ~/.config/kiln/lab.toml.
    A missing default file gives an empty map; a missing explicit file is an error."""
    explicit = path is not None or "KILN_LAB_MAP" in os.environ
    p = Path(path or os.environ.get("KILN_LAB_MAP") or DEFAULT_PATH)
    if not p.exists():
        if explicit:
            raise BoardError(f"{p}: lab map not found")
        return LabMap((), p)
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise BoardError(f"{p}: not valid TOML: {e}") from None
    unknown = set(data) - {"board"}
    if unknown:
        raise BoardError(f"{p}: field '{sorted(unknown)[0]}': unknown (a lab map has [[board]] tables)")
    entries = []
    for i, b in enumerate(data.get("board", [])):
        where = f"{p}: field 'board[{i}]"
        if not isinstance(b, dict):
            raise BoardError(f"{where}': expected table")
        for key in ("name", "port"):
            if not isinstance(b.get(key), str):
                raise BoardError(f"{where}.{key}': expected string, found {b.get(key)!r}")
        extra = set(b) - {"name", "port", "serial", "baud"}
        if extra:
            raise BoardError(f"{where}.{sorted(extra)[0]}': unknown field")
        if "serial" in b and not isinstance(b["serial"], str):
            raise BoardError(f"{where}.serial': expected string, found {b['serial']!r}")
        if "baud" in b and (not isinstance(b["baud"], int) or isinstance(b["baud"], bool)):
            raise BoardError(f"{where}.baud': expected integer, found {b['baud']!r}")
        entries.append(LabEntry(b["name"], b["port"], b.get("serial"), b.get("baud")))
    return LabMap(tuple(entries), p)
