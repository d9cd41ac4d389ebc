"""Just enough of a 32-bit little-endian ELF reader for the QEMU harness: the symbol table
(name, address, size, type) and the bytes at an address, to find the code the instruction-count
plugin must leave out (boards/qemu.py: :func:`uncounted_ranges`).

    elf = Elf.read("firmware.elf")
    elf.symbols["kiln_systick_irq"]     # Symbol(address=0xee8, size=16, func=True)
    elf.words(addr, 4)                  # four little-endian 32-bit words at addr
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from kiln.common.errors import KilnError

SHT_SYMTAB = 2
SHT_NOBITS = 8
SHF_ALLOC = 2
STT_FUNC = 2


class ElfError(KilnError, ValueError):
    pass


@dataclass(frozen=True)
class Symbol:
    address: int
    size: int
    func: bool


@dataclass(frozen=True)
class _Section:
    addr: int
    offset: int
    size: int
    type: int
    flags: int


class Elf:
    def __init__(self, path: str | Path, data: bytes):
        self.path = Path(path)
        self.data = data
        if data[:4] != b"\x7fELF" or len(data) < 52:
            raise ElfError(f"{path}: not an ELF file")
        if data[4] != 1 or data[5] != 1:
            raise ElfError(f"{path}: not a 32-bit little-endian ELF (class {data[4]}, data {data[5]}): "
                           f"Kiln's QEMU boards run Arm Cortex-M images")
        shoff, = struct.unpack_from("<I", data, 32)
        shentsize, shnum = struct.unpack_from("<HH", data, 46)
        self.sections = []
        links = []
        for i in range(shnum):
            _, typ, flags, addr, off, size, link, _, _, _ = struct.unpack_from("<10I", data, shoff + i * shentsize)
            self.sections.append(_Section(addr, off, size, typ, flags))
            links.append(link)
        self.symbols: dict[str, Symbol] = {}
        for sec, link in zip(self.sections, links):
            if sec.type == SHT_SYMTAB:
                self._read_symtab(sec, self.sections[link])

    @classmethod
    def read(cls, path: str | Path) -> Elf:
        try:
            return cls(path, Path(path).read_bytes())
        except OSError as e:
            raise ElfError(f"cannot read ELF image {path}: {e.strerror or e}") from e
        except struct.error as e:
            raise ElfError(f"{path}: truncated or malformed ELF ({e})") from e

    def _read_symtab(self, sec: _Section, strtab: _Section) -> None:
        for off in range(sec.offset + 16, sec.offset + sec.size, 16):     # entry 0 is null
            name, value, size, info, _, shndx = struct.unpack_from("<IIIBBH", self.data, off)
            if not name or shndx == 0:
                continue
            start = strtab.offset + name
            label = self.data[start:self.data.index(b"\0", start)].decode(errors="replace")
            if label not in self.symbols or size:
                self.symbols[label] = Symbol(value, size, (info & 0xF) == STT_FUNC)

    def words(self, address: int, count: int) -> list[int]:
        """``count`` 32-bit words stored at ``address`` (a section with contents must hold them)."""
        for s in self.sections:
            if s.type != SHT_NOBITS and s.flags & SHF_ALLOC and s.addr <= address and address + 4 * count <= s.addr + s.size:
                return list(struct.unpack_from(f"<{count}I", self.data, s.offset + address - s.addr))
        raise ElfError(f"{self.path}: no section holds {4 * count} bytes at 0x{address:x}")
