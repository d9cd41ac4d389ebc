"""UF2 files for boards flashed by copying onto a mass-storage bootloader (rpi-pico): the format
block by block (github.com/microsoft/uf2), the round trip back to the binary, the errors, and the
file Kiln's flasher writes for a real rpi-pico image."""
import random
import struct

import pytest

from kiln import boards
from kiln.boards import uf2
from kiln.boards.flash import write_uf2
from kiln.boards.schema import BoardError
from tests.firmware import helpers

BASE = 0x10000000


def test_blocks_one_by_one():
    data = bytes(range(256)) * 3 + b"\x7f"
    out = uf2.encode(data, BASE, uf2.RP2040_FAMILY)
    assert len(out) == 4 * 512
    for n in range(4):
        blk = out[512 * n:512 * (n + 1)]
        assert blk[:4] == b"UF2\n"
        assert struct.unpack_from("<8I", blk) == (0x0A324655, 0x9E5D5157, 0x00002000, BASE + 256 * n, 256, n, 4,
                                                  0xE48BFF56)
        assert struct.unpack_from("<I", blk, 508) == (0x0AB16F30,)
        payload = data[256 * n:256 * (n + 1)].ljust(256, b"\0")
        assert blk[32:288] == payload
        assert blk[288:508] == bytes(220)                 # unused data bytes are zero
    assert out[3 * 512 + 32:3 * 512 + 34] == b"\x7f\x00"  # last payload padded with zeros


def test_without_family_id_the_flag_is_clear():
    blk = uf2.encode(b"\x01" * 10, 0x08000000)
    flags, fam = struct.unpack_from("<I", blk, 8)[0], struct.unpack_from("<I", blk, 28)[0]
    assert (flags, fam) == (0, 0)
    assert uf2.decode(blk)[0].family_id is None


@pytest.mark.parametrize("size", [1, 255, 256, 257, 4096, 10_001])
def test_round_trip(size):
    data = random.Random(size).randbytes(size)
    blocks = uf2.decode(uf2.encode(data, BASE, uf2.RP2040_FAMILY))
    assert [b.number for b in blocks] == list(range(-(-size // 256)))
    assert all(b.family_id == uf2.RP2040_FAMILY and b.count == len(blocks) for b in blocks)
    base, back = uf2.to_binary(blocks, uf2.RP2040_FAMILY)
    assert base == BASE and back == data.ljust(256 * len(blocks), b"\0")


def test_bad_input_is_named():
    with pytest.raises(uf2.UF2Error, match="empty"):
        uf2.encode(b"", BASE)
    with pytest.raises(uf2.UF2Error, match="not a multiple of 256"):
        uf2.encode(b"x", BASE + 4)
    good = bytearray(uf2.encode(bytes(600), BASE, uf2.RP2040_FAMILY))
    with pytest.raises(uf2.UF2Error, match="whole number"):
        uf2.decode(bytes(good[:-1]))
    bad = bytearray(good)
    bad[512 + 508] ^= 1                                   # end magic of block 1
    with pytest.raises(uf2.UF2Error, match="block 1 .*magic"):
        uf2.decode(bytes(bad))
    bad = bytearray(good)
    struct.pack_into("<I", bad, 1024 + 20, 7)             # block 2 numbered 7
    with pytest.raises(uf2.UF2Error, match="block 2 .*numbered 7 of 3"):
        uf2.decode(bytes(bad))
    bad = bytearray(good)
    struct.pack_into("<I", bad, 512 + 12, BASE + 4096)    # block 1 not contiguous
    with pytest.raises(uf2.UF2Error, match="does not follow"):
        uf2.to_binary(uf2.decode(bytes(bad)))
    with pytest.raises(uf2.UF2Error, match="no block for main flash of family"):
        uf2.to_binary(uf2.decode(bytes(good)), 0x12345678)


def test_flasher_writes_the_pico_image_as_uf2(tmp_path):
    """A real rpi-pico build (boot2 at 0x10000000, then the vector table): firmware.uf2 beside
    firmware.bin holds exactly its bytes at the board's flash origin, RP2040 family."""
    helpers.need_toolchain()
    img = helpers.build_fixture("rpi-pico", tmp_path / "pico", emulate=False)
    path = write_uf2(img)
    assert path == img.bin.with_suffix(".uf2")
    binary = img.bin.read_bytes()
    blocks = uf2.decode(path.read_bytes())
    assert len(blocks) == -(-len(binary) // 256)
    assert {b.family_id for b in blocks} == {0xE48BFF56}
    base, back = uf2.to_binary(blocks, 0xE48BFF56)
    assert base == 0x10000000 and back[:len(binary)] == binary
    vectors = struct.unpack_from("<2I", back, 256)        # after boot2: initial SP, reset handler
    assert 0x20000000 <= vectors[0] <= 0x20042000 and vectors[1] & 1


def test_uf2_only_for_uf2_boards():
    class Img:
        board = boards.load("nucleo-l4r5zi")
        bin = "/nonexistent/firmware.bin"
    with pytest.raises(BoardError, match="not flashed with UF2"):
        write_uf2(Img())
