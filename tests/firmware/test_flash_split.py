"""Model flash vs harness flash from the linker map (kiln.firmware.sizes.flash_split): every byte
of the image's flash is attributed exactly once, the model's share holds at least its weights,
and an independent count from the ELF's symbols (nm -S -l, file of each symbol from DWARF)
agrees with the map's attribution."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from kiln import boards
from kiln.firmware.sizes import BREAKDOWN_KEYS, MapError, flash_split, image_flash_split, parse_map
from tests.firmware import helpers

ALL = boards.board_names()


def _symbol_split(elf: Path, package_dir: Path) -> tuple[int, int]:
    """(bytes of sized flash symbols defined in the package folder, bytes of all other ones)."""
    out = subprocess.run(["arm-none-eabi-nm", "-S", "-l", str(elf)], capture_output=True, text=True,
                         check=True).stdout
    model = harness = 0
    for line in out.splitlines():
        head, _, where = line.partition("\t")
        p = head.split()
        if len(p) == 4 and p[2] in "tTrRdD":
            size = int(p[1], 16)
            src = Path(where.rsplit(":", 1)[0]) if where else None
            if src is not None and src.parent.resolve() == package_dir.resolve():
                model += size
            else:
                harness += size
    return model, harness


def _check(split, image, package_dir: Path):
    s = image.sizes
    assert split.flash_bytes == s.flash_used == s.text + s.rodata + s.data
    assert split.model_flash_bytes + split.harness_bytes == split.flash_bytes
    assert set(split.breakdown) == set(BREAKDOWN_KEYS)
    assert sum(split.breakdown.values()) == split.flash_bytes
    assert (split.breakdown["kernels_code"] + split.breakdown["model_constants"]
            + split.breakdown["runtime"]) == split.model_flash_bytes
    assert split.breakdown["harness"] == split.harness_bytes
    assert sum(split.by_file.values()) == split.flash_bytes
    assert all(v > 0 for v in split.breakdown.values()), split.breakdown
    weights = json.loads((package_dir / "manifest.json").read_text())["weight_bytes"]
    assert split.breakdown["model_constants"] >= weights
    assert split.model_flash_bytes >= weights
    # the harness is the protocol, drivers and startup: they are all there, and in the harness
    for f in ("main.c", "kiln_frame.c", "system.c", "startup.c"):
        assert split.by_file.get(f, 0) > 0, f
    assert split.harness_bytes >= sum(split.by_file[f] for f in ("main.c", "kiln_frame.c", "startup.c"))
    # independent count: symbols (by their DWARF source file) vs the map's sections. The map
    # also counts alignment padding and unnamed constants, so it is a little larger.
    sym_model, sym_harness = _symbol_split(image.elf, package_dir)
    assert sym_model <= split.model_flash_bytes <= sym_model + 512, (sym_model, split.breakdown)
    assert sym_harness <= split.harness_bytes <= sym_harness + 1024, (sym_harness, split.breakdown)


@pytest.mark.parametrize("name", ALL)
def test_fixture_flash_split_on_every_board(name, image_cache):
    img = image_cache(name, emulate=False)
    split = image_flash_split(img)
    _check(split, img, helpers.TINY_DENSE)
    # tiny_dense: kiln_model_run calls the dense kernel twice and copies the output
    nm = subprocess.run(["arm-none-eabi-nm", "-S", str(img.elf)], capture_output=True, text=True).stdout
    run = next(int(l.split()[1], 16) for l in nm.splitlines() if l.endswith(" kiln_model_run"))
    assert run <= split.breakdown["runtime"] < run + 16


def test_compiled_model_flash_split(shared_models, tmp_path):
    """A Kiln-compiled package (keyword spotting): kernels.c, model.c with the command buffer."""
    helpers.need_toolchain()
    from kiln import hil
    img, pkg = hil.build_for_board(os.path.join(shared_models, "kws_ref_model.tflite"), "mps2-an386",
                                   str(tmp_path))
    split = image_flash_split(img)
    _check(split, img, Path(pkg))
    assert split.by_file["kernels.c"] >= split.breakdown["kernels_code"]
    assert split.by_file["model.c"] == split.breakdown["runtime"] + (
        split.breakdown["model_constants"] - (split.by_file["kernels.c"] - split.breakdown["kernels_code"]))
    d = split.to_dict()
    assert d["model_flash_bytes"] == split.model_flash_bytes and d["breakdown"] == split.breakdown


MAP = """\
Discarded input sections

 .text.unused   0x00000000       0x40 /tmp/ccA.o

Memory Configuration

Linker script and memory map

LOAD /tmp/ccA.o
LOAD /tmp/ccB.o
START GROUP
LOAD /usr/lib/libc_nano.a
END GROUP

.text           0x00000000       0x70
 *(.text .text.*)
 .text.main     0x00000000       0x20 /tmp/ccA.o
                0x00000000                main
 .text.kiln_model_run_with_a_long_name
                0x00000020       0x1c /tmp/ccB.o
                0x00000020                kiln_model_run_with_a_long_name
 *fill*         0x0000003c        0x4 
 .text          0x00000040       0x28 /usr/lib/libc_nano.a(lib_a-memcpy.o)
                0x00000040                memcpy
                0x00000070                . = ALIGN (0x10)

.ARM.exidx
 *(.ARM.exidx*)

.rodata         0x00000070       0x30
 .rodata.str1.4
                0x00000070        0xd /tmp/ccA.o
                                 0x11 (size before relaxing)
 .rodata.str1.4
                0x0000007d        0x0 /tmp/ccB.o
                                  0x4 (size before relaxing)
 *fill*         0x0000007d        0x3 
 .rodata.weights
                0x00000080       0x20 /tmp/ccB.o

.data           0x20000000        0x8 load address 0x000000a0
 .data.counter  0x20000000        0x4 /tmp/ccA.o
 .data.scale    0x20000004        0x4 /tmp/ccB.o

.bss            0x20000008      0x100 load address 0x000000a8
 .bss.arena     0x20000008      0x100 /tmp/ccA.o
OUTPUT(fw.elf elf32-littlearm)
"""


def test_parse_map_attributes_padding_and_merged_sections(tmp_path):
    lm = parse_map(MAP)
    assert lm.objects == ["/tmp/ccA.o", "/tmp/ccB.o"]
    assert lm.outputs[".text"] == (0, 0x70) and lm.outputs[".data"] == (0x20000000, 8)
    assert ".ARM.exidx" not in lm.outputs
    names = [(s.output, s.name, s.size) for s in lm.inputs]
    assert (".text", ".text.kiln_model_run_with_a_long_name", 0x1c) in names
    assert not any(n == ".text.unused" for _, n, _ in names)       # discarded by --gc-sections
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (tmp_path / "main.c").write_text("int counter; int main(void) { return 0; }\n")
    (pkg / "model.c").write_text("const int weights[8]; int scale; int kiln_model_run_with_a_long_name(void);\n")
    (tmp_path / "fw.map").write_text(MAP)
    split = flash_split(tmp_path / "fw.map", pkg, [str(tmp_path / "main.c"), str(pkg / "model.c")])
    assert split.flash_bytes == 0x70 + 0x30 + 0x8
    # model.c: run loop 0x1c, weights 0x20 + the 3 bytes of fill before them, .data.scale 4
    assert split.breakdown == {"kernels_code": 0, "model_constants": 0x23 + 4, "runtime": 0x1c,
                               "harness": 0x20 + 0x4 + 0x28 + 0x8 + 0xd + 4}
    assert split.by_file["libc_nano.a(lib_a-memcpy.o)"] == 0x2c
    assert split.by_file["(linker script padding)"] == 0x8
    assert split.merged and "model.c" in split.merged[0]
    # sources given in the wrong order: the identifier check refuses to guess
    with pytest.raises(MapError):
        flash_split(tmp_path / "fw.map", pkg, [str(pkg / "model.c"), str(tmp_path / "main.c")])
    with pytest.raises(MapError):
        flash_split(tmp_path / "fw.map", pkg, [str(tmp_path / "main.c")])
