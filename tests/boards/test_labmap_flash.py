"""Lab map parsing and flash command construction (no hardware needed)."""
import re
import struct
from pathlib import Path

import pytest

from kiln import boards
from kiln.boards import BoardError
from kiln.boards.flash import UF2_MAGIC, flash_command, to_uf2
from kiln.boards.labmap import load_lab_map


def test_lab_map(tmp_path):
    f = tmp_path / "lab.toml"
    f.write_text('[[board]]\nname = "nucleo-l4r5zi"\nport = "/dev/ttyACM0"\nserial = "0668FF"\n'
                 '[[board]]\nname = "rpi-pico"\nport = "rfc2217://pi:4000"\nbaud = 921600\n')
    lab = load_lab_map(f)
    assert lab.boards() == ["nucleo-l4r5zi", "rpi-pico"]
    assert lab.find("nucleo-l4r5zi").serial == "0668FF"
    assert lab.find("rpi-pico").baud == 921600
    with pytest.raises(BoardError, match="no entry for board 'nrf52840-dk'.*nucleo-l4r5zi@/dev/ttyACM0"):
        lab.find("nrf52840-dk")


@pytest.mark.parametrize("text,msg", [
    ('[[board]]\nport = "/dev/x"\n', "board[0].name"),
    ('[[board]]\nname = "a"\nport = "/dev/x"\nspeed = 1\n', "board[0].speed': unknown"),
    ('[[board]]\nname = "a"\nport = "/dev/x"\nbaud = "fast"\n', "board[0].baud': expected integer"),
    ('[boards]\n', "field 'boards': unknown"),
])
def test_lab_map_errors(tmp_path, text, msg):
    f = tmp_path / "lab.toml"
    f.write_text(text)
    with pytest.raises(BoardError, match=re.escape(msg)):
        load_lab_map(f)
    with pytest.raises(BoardError, match="lab map not found"):
        load_lab_map(tmp_path / "missing.toml")


class _Img:
    def __init__(self, board):
        self.board = boards.load(board)
        self.elf = Path("/x/firmware.elf")
        self.bin = Path("/x/firmware.bin")


def test_flash_commands():
    assert flash_command(_Img("nucleo-l4r5zi"), serial="0668FF") == [
        "openocd", "-f", "interface/stlink.cfg", "-f", "target/stm32l4x.cfg",
        "-c", "adapter serial 0668FF", "-c", "program /x/firmware.elf verify reset exit"]
    assert flash_command(_Img("nrf52840-dk"))[:4] == ["pyocd", "flash", "-t", "nrf52840"]
    assert flash_command(_Img("rpi-pico")) is None          # copy-to-drive (UF2)
    assert flash_command(_Img("mps2-an386")) is None


def test_uf2_blocks():
    data = bytes(range(256)) * 3 + b"\x01"
    uf2 = to_uf2(data, 0x10000000, 0xE48BFF56)
    assert len(uf2) == 4 * 512
    for n in range(4):
        blk = uf2[512 * n:512 * (n + 1)]
        m0, m1, flags, addr, size, idx, total, fam = struct.unpack_from("<8I", blk)
        assert (m0, m1, addr, size, idx, total, fam) == (UF2_MAGIC[0], UF2_MAGIC[1],
                                                         0x10000000 + 256 * n, 256, n, 4, 0xE48BFF56)
        assert struct.unpack_from("<I", blk, 508)[0] == UF2_MAGIC[2]
    assert uf2[32:32 + 256] == data[:256]
