"""Firmware builds for every board, size reports, overflow errors, no heap."""
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from kiln import boards
from kiln.firmware import FirmwareError, ImageTooLarge, build, check_no_malloc, render
from tests.firmware import helpers

ALL = boards.board_names()


@pytest.mark.parametrize("name", ALL)
def test_builds_for_every_board_with_its_real_memory(name, image_cache):
    img = image_cache(name, emulate=False)
    b = boards.load(name)
    s = img.sizes
    assert s.flash_total == b.flash_region.size and s.ram_total == b.ram_region.size
    assert s.flash_used == s.text + s.rodata + s.data
    assert s.ram_used == s.data + s.bss + s.stack + s.sections.get(".noinit", 0)
    assert s.rodata > 20000            # the fixture's weights
    assert s.arena == 112 and s.bss >= s.arena and s.stack == 8192
    for f in (img.elf, img.bin, img.hex, img.map):
        assert Path(f).stat().st_size > 0
    # vector table: initial SP at the top of the stack (bottom of RAM), reset handler in flash
    # (after the 256-byte second-stage bootloader on boards that boot through one)
    sp, reset = struct.unpack_from("<II", Path(img.bin).read_bytes(), 256 if b.boot2 else 0)
    assert sp == b.ram_region.origin + 8192
    assert reset & 1 and b.flash_region.origin <= reset < b.flash_region.end
    header = (img.elf.parent / "generated" / "kiln_board.h").read_text()
    assert f"#define KILN_UART_BASE 0x{b.uart.base:08X}u" in header
    check_no_malloc(img.elf)


@pytest.mark.parametrize("name", ALL)
def test_startup_enables_fpu_only_with_an_fpu(tmp_path, name):
    b = boards.load(name)
    files = render(b, tmp_path, stack_size=4096, semihosting=False)
    startup = files["startup.c"].read_text()
    assert ("0xE000ED88" in startup) == (b.fpu != "none")
    if b.fpu != "none":     # CPACR is the first thing the reset handler does
        body = startup[startup.index("void Reset_Handler(void)\n{"):]
        assert body.index("0xE000ED88") < body.index("__stack_top")
    assert ("msplim" in startup) == b.core_info.has_msplim
    assert f"IRQ {b.uart.rx_irq}: UART RX" in startup
    ld = files["linker.ld"].read_text()
    assert f"ORIGIN = 0x{b.ram_region.origin:08X}, LENGTH = 0x{b.ram_region.size:08X}" in ld


def test_emulated_stand_in_links_real_sizes(image_cache):
    img = image_cache("nrf52840-dk", emulate=True)
    assert img.board.name == "nrf52840-dk@mps2-an386"
    assert img.sizes.ram_total == 256 << 10 and img.sizes.flash_total == 1 << 20


def _variant(tmp_path: Path, name: str, edit) -> Path:
    pkg = tmp_path / name
    shutil.copytree(helpers.TINY_DENSE, pkg)
    edit(pkg)
    return pkg


def test_ram_overflow_reports_bytes(tmp_path):
    helpers.need_toolchain()

    def big_arena(pkg):
        h = pkg / "model.h"
        h.write_text(re.sub(r"#define KILN_ARENA_SIZE\s+\d+", "#define KILN_ARENA_SIZE    300000",
                            h.read_text()))
    pkg = _variant(tmp_path, "big_arena", big_arena)
    with pytest.raises(ImageTooLarge) as e:
        build(pkg, "nrf52840-dk", tmp_path / "fw")
    err = e.value
    assert "does not fit board nrf52840-dk" in str(err) and "RAM overflowed by" in str(err)
    over = err.overflow["RAM"]
    assert err.sizes is not None and err.sizes.arena == 300000
    assert abs((err.sizes.ram_used - err.sizes.ram_total) - over) <= 64
    assert over == pytest.approx(300000 + 8192 + 3000 - (256 << 10), abs=1024)
    # every part of the RAM is named, and the parts add up to what the image needs
    m = re.search(r"RAM needed ([\d,]+) B = arena 300,000 B \+ input buffer 640 B \+ output buffer 10 B \+ "
                  r"stack 8,192 B \+ the firmware's other .data/.bss ([\d,]+) B; the board has 262,144 B", str(err))
    assert m, str(err)
    total, other = (int(g.replace(",", "")) for g in m.groups())
    assert total == err.sizes.ram_used == 300000 + 640 + 10 + 8192 + other and 0 < other < 8192


def test_flash_overflow_reports_bytes(tmp_path):
    helpers.need_toolchain()

    def big_weights(pkg):
        c = pkg / "model.c"
        c.write_text(c.read_text().replace(
            "int kiln_model_run(", "const uint8_t kiln_big_blob[1100000] = {1};\n"
            "int kiln_model_run(").replace(
            "    return 0;\n}", "    return *(volatile const uint8_t *)&kiln_big_blob[1099999];\n}"))
    pkg = _variant(tmp_path, "big_weights", big_weights)
    with pytest.raises(ImageTooLarge) as e:
        build(pkg, "stm32f746g-disco", tmp_path / "fw")
    over = e.value.overflow["FLASH"]
    assert 1100000 + 20000 - (1 << 20) < over < 1100000 + 40000 - (1 << 20)
    assert f"FLASH overflowed by {over} bytes" in str(e.value)
    # the same model fits the 2 MB NUCLEO-L4R5ZI
    img = build(pkg, "nucleo-l4r5zi", tmp_path / "fw2")
    assert img.sizes.flash_used > 1100000


def test_malloc_is_refused(tmp_path):
    helpers.need_toolchain()

    def uses_malloc(pkg):
        c = pkg / "model.c"
        c.write_text("#include <stdlib.h>\n" + c.read_text().replace(
            "    MARK(0);", "    void *volatile leak = malloc(16);\n    (void)leak;\n    MARK(0);"))
    pkg = _variant(tmp_path, "malloc", uses_malloc)
    with pytest.raises(FirmwareError) as e:
        img = build(pkg, "mps2-an386", tmp_path / "fw")
        check_no_malloc(img.elf)
    assert "sbrk" in str(e.value) or "malloc" in str(e.value)


def test_no_heap_symbols_in_fixture_image(image_cache):
    img = image_cache("mps2-an386")
    nm = subprocess.run(["arm-none-eabi-nm", str(img.elf)], capture_output=True, text=True,
                        check=True).stdout
    names = {line.split()[-1] for line in nm.splitlines()}
    assert not names & {"malloc", "free", "_sbrk", "_malloc_r", "_free_r", "calloc", "realloc"}


def test_compile_error_is_reported(tmp_path):
    helpers.need_toolchain()
    pkg = _variant(tmp_path, "broken", lambda p: (p / "kernels.c").write_text("int x = ;\n"))
    with pytest.raises(FirmwareError, match=r"(?s)building firmware for mps2-an386 failed.*kernels\.c:1:9: error"):
        build(pkg, "mps2-an386", tmp_path / "fw")


def test_not_a_package(tmp_path):
    with pytest.raises(FirmwareError, match="not a C package"):
        build(tmp_path, "mps2-an386", tmp_path / "fw")
