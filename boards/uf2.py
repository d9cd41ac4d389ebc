"""UF2, the USB Flashing Format (github.com/microsoft/uf2): what a mass-storage bootloader such as
the RP2040 boot ROM's (the RPI-RP2 drive) takes as a file copied onto it.

    data = encode(binary, base=0x10000000, family_id=RP2040_FAMILY)   # bytes of a .uf2 file
    blocks = decode(data)                                             # [Block], checked
    image = to_binary(blocks)                                         # (base, bytes) back

A UF2 file is a sequence of 512-byte blocks, each self-describing: 32-byte header (two start
magics, flags, target address, payload size, block number, number of blocks, family id), 476
data bytes of which the first ``payload size`` count, and an end magic; little-endian. Kiln
writes 256-byte payloads at consecutive 256-byte aligned addresses (the RP2040 boot ROM accepts
nothing else) with the family id flag set.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .schema import BoardError

BLOCK = 512
PAYLOAD = 256
DATA_BYTES = 476
MAGIC_START0 = 0x0A324655       # "UF2\n"
MAGIC_START1 = 0x9E5D5157
MAGIC_END = 0x0AB16F30
FLAG_NOT_MAIN_FLASH = 0x00000001
FLAG_FILE_CONTAINER = 0x00001000
FLAG_FAMILY_ID = 0x00002000
FLAG_MD5 = 0x00004000
FLAG_EXTENSIONS = 0x00008000
RP2040_FAMILY = 0xE48BFF56
_HEADER = struct.Struct("<8I")


class UF2Error(BoardError):
    pass


@dataclass(frozen=True)
class Block:
    flags: int
    address: int
    payload: bytes
    number: int
    count: int
    family_id: int | None       # None when the family flag is clear (the word is a file size)


def encode(binary: bytes, base: int, family_id: int | None = None) -> bytes:
    """``binary`` (a flat image loaded at ``base``) as UF2 blocks of 256 bytes; the last payload
    is padded with zeros to 256 bytes."""
    if not binary:
        raise UF2Error("UF2: the image is empty: nothing to flash (build the firmware first)")
    if base % PAYLOAD:
        raise UF2Error(f"UF2: load address 0x{base:08x} is not a multiple of {PAYLOAD} (the RP2040 boot ROM "
                       f"only takes 256-byte aligned blocks)")
    if base + len(binary) > 1 << 32:
        raise UF2Error(f"UF2: {len(binary)} bytes at 0x{base:08x} run past the 32-bit address space")
    if family_id is not None and not 0 <= family_id < 1 << 32:
        raise UF2Error(f"UF2: family id {family_id:#x} does not fit 32 bits")
    count = -(-len(binary) // PAYLOAD)
    flags = FLAG_FAMILY_ID if family_id is not None else 0
    out = bytearray()
    for n in range(count):
        chunk = binary[n * PAYLOAD:(n + 1) * PAYLOAD].ljust(PAYLOAD, b"\0")
        out += _HEADER.pack(MAGIC_START0, MAGIC_START1, flags, base + n * PAYLOAD, PAYLOAD, n, count,
                            family_id or 0)
        out += chunk.ljust(DATA_BYTES, b"\0") + struct.pack("<I", MAGIC_END)
    return bytes(out)


def decode(data: bytes) -> list[Block]:
    """The blocks of a UF2 file, each checked (magics, payload size, numbering); raises
    :class:`UF2Error` naming the first bad block."""
    if not data or len(data) % BLOCK:
        raise UF2Error(f"UF2: {len(data)} bytes is not a whole number of {BLOCK}-byte blocks")
    blocks = []
    for i in range(len(data) // BLOCK):
        raw = data[i * BLOCK:(i + 1) * BLOCK]
        m0, m1, flags, addr, size, number, count, family = _HEADER.unpack_from(raw)
        (end,) = struct.unpack_from("<I", raw, BLOCK - 4)
        where = f"UF2 block {i} (file offset {i * BLOCK})"
        if (m0, m1, end) != (MAGIC_START0, MAGIC_START1, MAGIC_END):
            raise UF2Error(f"{where}: bad magic numbers {m0:#010x} {m1:#010x} ... {end:#010x}")
        if size > DATA_BYTES:
            raise UF2Error(f"{where}: payload size {size} exceeds the {DATA_BYTES} data bytes")
        if number != i or count != len(data) // BLOCK:
            raise UF2Error(f"{where}: numbered {number} of {count}, expected {i} of {len(data) // BLOCK}")
        blocks.append(Block(flags, addr, raw[32:32 + size], number, count,
                            family if flags & FLAG_FAMILY_ID else None))
    return blocks


def to_binary(blocks: list[Block], family_id: int | None = None) -> tuple[int, bytes]:
    """(base address, contiguous bytes) of the main-flash blocks (of ``family_id`` if given);
    the blocks must follow each other without gaps."""
    picked = [b for b in blocks if not b.flags & FLAG_NOT_MAIN_FLASH
              and (family_id is None or b.family_id == family_id)]
    if not picked:
        raise UF2Error("UF2: no block for main flash" + (f" of family {family_id:#x}" if family_id else ""))
    picked.sort(key=lambda b: b.address)
    out = bytearray(picked[0].payload)
    for prev, b in zip(picked, picked[1:]):
        if b.address != prev.address + len(prev.payload):
            raise UF2Error(f"UF2: block {b.number} at 0x{b.address:08x} does not follow block {prev.number} "
                           f"(0x{prev.address:08x} + {len(prev.payload)})")
        out += b.payload
    return picked[0].address, bytes(out)
