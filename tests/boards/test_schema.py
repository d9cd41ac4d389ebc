"""Board files: every one validates; broken ones fail naming the file and the field."""
import tomllib
from pathlib import Path

import pytest

from kiln import boards
from kiln.boards import BoardError, load_file

ALL = boards.board_names()


def test_expected_boards_present():
    assert {"mps2-an385", "mps2-an386", "mps2-an500", "mps2-an505", "mps3-an547",
            "nucleo-l4r5zi", "stm32f746g-disco", "nrf52840-dk", "rpi-pico"} <= set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_board_file_valid(name):
    b = boards.load(name)
    assert b.name == name
    assert b.flash_region.size > 0 and b.ram_region.size > 0
    assert b.core in boards.CORES and b.fpu in b.core_info.fpu_flags
    assert b.uart.rx_irq < b.irq_count
    flags = b.cflags()
    assert flags[0] == f"-mcpu={b.core}"
    assert ("-mfloat-abi=hard" in flags) == (b.fpu != "none")


def test_table_values():
    an505 = boards.load("mps2-an505")
    assert (an505.flash_region.origin, an505.ram_region.origin, an505.uart.base) == \
        (0x10000000, 0x38000000, 0x50200000)
    nucleo = boards.load("nucleo-l4r5zi")
    assert (nucleo.clock_hz, nucleo.flash_region.size, nucleo.ram_region.size) == \
        (120_000_000, 2 << 20, 640 << 10)
    pico = boards.load("rpi-pico")
    assert pico.core == "cortex-m0plus" and not pico.core_info.has_cyccnt


@pytest.mark.parametrize("name", [n for n in ALL if not boards.load(n).emulated])
def test_real_boards_have_a_qemu_stand_in(name):
    real = boards.load(name)
    emu = boards.for_qemu(real)
    assert emu.emulates == name and emu.qemu.machine == real.qemu.machine
    assert emu.flash_region.size == real.flash_region.size
    assert emu.ram_region.size == real.ram_region.size
    assert (emu.core, emu.fpu) == (real.core, real.fpu)
    host = next(b for b in boards.all_boards() if b.emulated and b.qemu.machine == real.qemu.machine)
    assert emu.uart == host.uart and emu.flash_region.origin == host.flash_region.origin


def _toml(d, prefix=""):
    out, tables = [], []
    for k, v in d.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            out.append(f"{k} = {_val(v)}")
    for k, v in tables:
        out.append(f"[{prefix}{k}]")
        out.append(_toml(v, prefix=f"{prefix}{k}."))
    return "\n".join(out) + "\n"


def _val(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(_val(x) if not isinstance(x, dict) else
                               "{" + ", ".join(f"{a} = {_val(b)}" for a, b in x.items()) + "}"
                               for x in v) + "]"
    return str(v)


def _base():
    with open(boards.BOARD_DIR / "mps2-an386.toml", "rb") as f:
        return tomllib.load(f)


def _set(d, path, value):
    keys = path.split(".")
    for k in keys[:-1]:
        d = d[k]
    if value is _DELETE:
        del d[keys[-1]]
    else:
        d[keys[-1]] = value


_DELETE = object()

BROKEN = [
    ("core", _DELETE, "field 'core': missing"),
    ("core", "cortex-a53", "field 'core': expected one of"),
    ("clock_hz", "fast", "field 'clock_hz': expected integer, found string"),
    ("fpu", "dp", "field 'fpu': cortex-m4 cannot have fpu='dp'"),
    ("dsp", 1, "field 'dsp': expected boolean"),
    ("uart.kind", "16550", "field 'uart.kind': expected one of"),
    ("uart.base", _DELETE, "field 'uart.base': missing"),
    ("uart.rx_irq", 40, "field 'uart.rx_irq'"),
    ("uart.parity", "even", "field 'uart.parity': unknown field"),
    ("memory.ram", _DELETE, "field 'memory.ram': missing"),
    ("memory.flash.size", 0, "field 'memory.flash.size'"),
    ("memory.ram.origin", 0x100, "field 'memory': flash and ram regions overlap"),
    ("flash.method", "jtag-magic", "field 'flash.method': expected one of"),
    ("flash", {"method": "openocd"}, "field 'flash.config': missing"),
    ("flash", {"method": "pyocd", "target": "x", "speed": 4}, "field 'flash.speed': unknown"),
    ("qemu.machine", _DELETE, "field 'qemu.machine': missing"),
    ("uart.init", [{"addr": 4, "bogus": 1}], "field 'uart.init[0].bogus'"),
    ("uart.init", [{"addr": 4}], "field 'uart.init[0]': needs one of"),
    ("name", "other", "field 'name': expected 'mps2-an386'"),
]


@pytest.mark.parametrize("path,value,message", BROKEN, ids=[b[0] + ":" + b[2][:20] for b in BROKEN])
def test_broken_board_names_file_and_field(tmp_path, path, value, message):
    d = _base()
    _set(d, path, value)
    f = tmp_path / "mps2-an386.toml"
    f.write_text(_toml(d))
    with pytest.raises(BoardError) as e:
        load_file(f)
    assert str(f) in str(e.value)
    assert message in str(e.value)


def test_roundtrip_of_helper_is_valid(tmp_path):
    f = tmp_path / "mps2-an386.toml"
    f.write_text(_toml(_base()))
    assert load_file(f).uart.base == 0x40004000


def test_bad_toml_and_unknown_board(tmp_path):
    f = tmp_path / "x.toml"
    f.write_text("core = [")
    with pytest.raises(BoardError, match=r"x\.toml: not valid TOML"):
        load_file(f)
    with pytest.raises(BoardError, match="unknown board 'nope'.*known boards: .*mps2-an386"):
        boards.load("nope")


def test_adding_a_board_is_adding_a_file(tmp_path, monkeypatch):
    d = _base()
    d["name"] = "my-m4"
    (tmp_path / "my-m4.toml").write_text(_toml(d))
    monkeypatch.setattr(boards, "BOARD_DIR", Path(tmp_path))
    boards.load.cache_clear()
    try:
        assert boards.board_names() == ["my-m4"]
        assert boards.load("my-m4").core == "cortex-m4"
    finally:
        boards.load.cache_clear()
