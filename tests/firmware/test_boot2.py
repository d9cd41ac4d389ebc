"""The RP2040 second-stage bootloader (firmware/boot2.py): checksum, placement, code."""
from __future__ import annotations

import binascii
import struct
import subprocess

import numpy as np
import pytest

from kiln import boards
from kiln.firmware import boot2

from .helpers import build_fixture, need_toolchain


def _sdk_style_checksum(data: bytes) -> int:
    """pico-sdk's pad_checksum formulation: zlib CRC-32 over bit-reversed bytes, un-inverted and
    bit-reversed (an independent route to the same CRC-32/MPEG-2)."""
    def rev(x, width):
        return int(f"{x:0{width}b}"[::-1], 2)
    return rev((binascii.crc32(bytes(rev(b, 8) for b in data), 0) ^ 0xFFFFFFFF) & 0xFFFFFFFF, 32)


def test_crc_is_crc32_mpeg2():
    assert boot2.crc32_mpeg2(b"123456789") == 0x0376E6E7        # the catalogue check value
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 252):
        data = rng.integers(0, 256, n).astype(np.uint8).tobytes()
        assert boot2.crc32_mpeg2(data) == _sdk_style_checksum(data)


def test_pad_and_checksum():
    blob = boot2.pad_and_checksum(b"\x01\x02\x03")
    assert len(blob) == 256 and blob[3:252] == bytes(249)
    assert struct.unpack("<I", blob[252:])[0] == boot2.crc32_mpeg2(blob[:252])
    with pytest.raises(boot2.Boot2Error, match="1 more than the 252"):
        boot2.pad_and_checksum(bytes(253))


def test_kinds_match_the_board_schema():
    assert tuple(boot2.KINDS) == boards.schema.BOOT2_KINDS
    assert boards.load("rpi-pico").boot2 == "rp2040-generic-03h"


def test_pico_image_starts_with_a_valid_boot2_then_the_vectors(tmp_path):
    need_toolchain()
    img = build_fixture("rpi-pico", tmp_path / "real", emulate=False)
    head = img.bin.read_bytes()[:260]
    assert struct.unpack("<I", head[252:256])[0] == boot2.crc32_mpeg2(head[:252])
    syms = {line.split()[2]: int(line.split()[0], 16) for line in subprocess.run(
        ["arm-none-eabi-nm", str(img.elf)], capture_output=True, text=True, check=True).stdout.splitlines()
        if len(line.split()) == 3}
    assert syms["kiln_boot2"] == 0x10000000 and syms["kiln_vectors"] == 0x10000100
    sp, reset = struct.unpack("<II", img.bin.read_bytes()[256:264])
    assert 0x20000000 < sp <= 0x20042000 and 0x10000100 < reset < 0x10200000 and reset & 1   # Thumb
    # the code: SSI set up for 03h XIP reads, then VTOR, MSP and the reset handler
    dis = subprocess.run(["arm-none-eabi-objdump", "-D", "-j", ".boot2", "-M", "force-thumb", str(img.elf)],
                         capture_output=True, text=True, check=True).stdout
    assert "msr\tMSP, r0" in dis and "ldmia\tr0, {r0, r1}" in dis
    words = set(struct.unpack("<64I", head[:256]))
    assert {0x18000000, 0x001F0300, 0x03000218, 0x180000F4, 0x10000100, 0xE000ED08} <= words


def test_pico_stand_in_has_no_boot2(tmp_path):
    need_toolchain()
    img = build_fixture("rpi-pico", tmp_path / "emu", emulate=True)
    out = subprocess.run(["arm-none-eabi-nm", str(img.elf)], capture_output=True, text=True, check=True).stdout
    assert "kiln_boot2" not in out and " kiln_vectors" in out
