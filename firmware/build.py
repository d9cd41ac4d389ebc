"""Build a firmware image: C package (docs/c_package.md) + board data -> .elf/.bin/.hex + sizes.

    >>> from kiln.firmware import build
    >>> img = build("out/kws_pkg", "nucleo-l4r5zi", "out/fw")          # the real board
    >>> img = build("out/kws_pkg", "nucleo-l4r5zi", "out/fw", emulate=True)  # its QEMU stand-in
    >>> print(img.sizes)

The startup code, linker script and board header are rendered from jinja2 templates with the
board's data; the runtime (firmware/runtime) and the UART driver named by ``uart.kind``
(firmware/drivers) are compiled with the package in one arm-none-eabi-gcc call. Nothing here
knows a board by name.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from kiln import boards as _boards
from kiln.boards import Board, Region

from .boot2 import build as build_boot2
from .errors import FirmwareError
from .plugin import plugin_path
from .sizes import SizeReport, parse_size_output

FIRMWARE_DIR = Path(__file__).resolve().parent
RUNTIME_DIR = FIRMWARE_DIR / "runtime"
DRIVER_DIR = FIRMWARE_DIR / "drivers"
TEMPLATE_DIR = FIRMWARE_DIR / "templates"

# uart.kind -> driver source (adding a UART kind = one driver file + one entry here)
DRIVERS = {
    "cmsdk": "uart_cmsdk.c",
    "stm32-usart": "uart_stm32.c",
    "nrf-uarte": "uart_nrf_uarte.c",
    "rp2040-pl011": "uart_rp2040_pl011.c",
}

COMMON_CFLAGS = [
    "-std=gnu11", "-g3", "-Wall", "-Wno-unused-function",
    "-ffunction-sections", "-fdata-sections", "-fno-tree-loop-distribute-patterns",
    "-fno-common", "-ffreestanding", "-fno-exceptions", "-fno-unwind-tables",
    "-fno-asynchronous-unwind-tables",
]
LDFLAGS = ["-nostartfiles", "--specs=nano.specs", "-Wl,--gc-sections", "-Wl,--no-warn-rwx-segments"]
LIBS = ["-Wl,--start-group", "-lc", "-lm", "-lgcc", "-Wl,--end-group"]   # -lm: floorf/expf of float kernels
MARKERS = ("kiln_marker_begin", "kiln_marker_end", "kiln_marker_mark")


class ImageTooLarge(FirmwareError):
    """The image links but does not fit the board: ``overflow`` maps region -> bytes over."""

    def __init__(self, message: str, overflow: dict[str, int], sizes: SizeReport | None):
        super().__init__(message)
        self.overflow = overflow
        self.sizes = sizes


@dataclass
class Image:
    """A built firmware image and what the harness needs to know about it."""
    board: Board
    elf: Path
    bin: Path
    hex: Path
    map: Path
    sizes: SizeReport
    symbols: dict[str, int] = field(default_factory=dict)
    package_dir: Path | None = None
    semihosting: bool = False

    @property
    def qemu_plugin(self) -> Path:
        """The QEMU instruction-count plugin that counts this image's instructions between its
        markers (boards/qemu.py loads it; built on demand, see firmware/plugin.py)."""
        return plugin_path()

    @property
    def markers(self) -> dict[str, int]:
        """Addresses (Thumb bit cleared) of the QEMU plugin marker functions."""
        return {k: self.symbols[k] & ~1 for k in MARKERS if k in self.symbols}

    def to_dict(self) -> dict:
        return {
            "board": self.board.name, "emulates": self.board.emulates,
            "elf": str(self.elf), "bin": str(self.bin), "hex": str(self.hex),
            "map": str(self.map), "sizes": self.sizes.to_dict(),
            "markers": {k: hex(v) for k, v in self.markers.items()},
            "semihosting": self.semihosting,
        }


def tool(name: str, prefix: str = "arm-none-eabi-") -> str:
    path = shutil.which(prefix + name)
    if not path:
        raise FirmwareError(f"{prefix}{name} not found on PATH: install gcc-arm-none-eabi and "
                            f"libnewlib-arm-none-eabi (bash scripts/setup.sh does it)")
    return path


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        out = (p.stderr + p.stdout).strip()
        raise FirmwareError(f"{what} failed (exit {p.returncode}):\n  {' '.join(cmd)}\n{out[-4000:]}")
    return p


def _model_defines(package_dir: Path) -> dict[str, int]:
    text = (package_dir / "model.h").read_text()
    return {k: int(v, 0) for k, v in re.findall(r"#define\s+(KILN_\w+)\s+\(?([0-9xXa-fA-F]+)u?\)?", text)}


def render(board: Board, out_dir: Path, *, stack_size: int, semihosting: bool,
           flash: Region | None = None, ram: Region | None = None) -> dict[str, Path]:
    """Write kiln_board.h, startup.c and linker.ld for ``board`` into out_dir."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    entries = 16 + board.irq_count
    ctx = dict(board=board, core=board.core_info, semihosting=semihosting, stack_size=stack_size,
               vector_align=max(128, 1 << (entries * 4 - 1).bit_length()),
               flash=flash or board.flash_region, ram=ram or board.ram_region)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for tpl, name in (("kiln_board.h.j2", "kiln_board.h"), ("startup.c.j2", "startup.c"),
                      ("linker.ld.j2", "linker.ld")):
        path = out_dir / name
        path.write_text(env.get_template(tpl).render(**ctx))
        files[name] = path
    return files


def _overflows(stderr: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"region `(\w+)' overflowed by (\d+) bytes", stderr)}


def build(package_dir: str | os.PathLike, board: Board | str, out_dir: str | os.PathLike, *,
          emulate: bool = False, stack_size: int = 8192, opt: str = "-O2",
          semihosting: bool | None = None, profile: bool = True,
          extra_cflags: list[str] | tuple[str, ...] = (), build_id: str | None = None,
          prefix: str = "arm-none-eabi-") -> Image:
    """Compile and link ``package_dir`` for ``board`` into ``out_dir``.

    emulate: build the QEMU stand-in of a real board (:func:`kiln.boards.for_qemu`): same core
        flags and flash/RAM sizes, peripherals of the emulated machine.
    semihosting: exit through semihosting (default: on for emulated boards only; on a real
        board without a debugger the BKPT would fault).
    profile: compile the package with -DKILN_PROFILE so it calls kiln_profile_mark().
    Raises :class:`ImageTooLarge` (with the overflow in bytes) when the model does not fit,
    :class:`FirmwareError` for anything else.
    """
    package_dir = Path(package_dir).resolve()
    out_dir = Path(out_dir).resolve()
    if isinstance(board, str):
        board = _boards.load(board)
    if emulate:
        board = _boards.for_qemu(board)
    if semihosting is None:
        semihosting = board.emulated or board.emulates is not None
    if not (package_dir / "model.h").exists():
        raise FirmwareError(f"{package_dir}: not a C package (no model.h; see docs/c_package.md)")
    if board.uart.kind not in DRIVERS:
        raise FirmwareError(f"board {board.name}: no driver for uart.kind={board.uart.kind!r}")
    gcc = tool("gcc", prefix)
    gen = out_dir / "generated"
    render(board, gen, stack_size=stack_size, semihosting=semihosting)

    sources = sorted(RUNTIME_DIR.glob("*.c")) + [DRIVER_DIR / DRIVERS[board.uart.kind],
                                                 DRIVER_DIR / "uart_common.c", gen / "startup.c"]
    if board.boot2:
        sources.append(build_boot2(board.boot2, gen, gcc, tool("objcopy", prefix)))
    sources += sorted(package_dir.glob("*.c"))
    elf = out_dir / "firmware.elf"
    mapf = out_dir / "firmware.map"
    bid = build_id or f"{package_dir.name}@{board.name}"
    cflags = [*board.cflags(), opt, *COMMON_CFLAGS, f"-I{gen}", f"-I{RUNTIME_DIR}",
              f"-I{DRIVER_DIR}", f"-I{package_dir}", f'-DKILN_BUILD_ID="{bid}"',
              *(["-DKILN_PROFILE"] if profile else []), *extra_cflags]

    def link(linker: Path, target: Path) -> subprocess.CompletedProcess:
        cmd = [gcc, *cflags, *map(str, sources), "-T", str(linker), *LDFLAGS,
               f"-Wl,-Map={mapf}", "-o", str(target), *LIBS]
        return subprocess.run(cmd, capture_output=True, text=True), cmd

    p, cmd = link(gen / "linker.ld", elf)
    (out_dir / "build_command.txt").write_text(" ".join(cmd) + "\n")
    if p.returncode != 0:
        over = _overflows(p.stderr)
        if not over:
            raise FirmwareError(f"building firmware for {board.name} failed (exit {p.returncode}):\n"
                                f"{(p.stderr + p.stdout).strip()[-4000:]}\n"
                                f"command: {' '.join(cmd)} (also in {out_dir / 'build_command.txt'})")
        raise _too_large(board, over, package_dir, gen, link, prefix, stack_size, semihosting)

    _run([tool("objcopy", prefix), "-O", "binary", str(elf), str(out_dir / "firmware.bin")], "objcopy")
    _run([tool("objcopy", prefix), "-O", "ihex", str(elf), str(out_dir / "firmware.hex")], "objcopy")
    sizes = size_report(elf, board, package_dir, prefix)
    symbols = read_symbols(elf, prefix)
    img = Image(board=board, elf=elf, bin=out_dir / "firmware.bin", hex=out_dir / "firmware.hex",
                map=mapf, sizes=sizes, symbols=symbols, package_dir=package_dir,
                semihosting=semihosting)
    (out_dir / "image.json").write_text(json.dumps(img.to_dict(), indent=2) + "\n")
    return img


def _too_large(board, over, package_dir, gen, link, prefix, stack_size, semihosting) -> ImageTooLarge:
    """Relink with inflated regions to report full sizes, then build the error."""
    big = gen / "oversize"
    regions = {}
    for key, r in (("flash", board.flash_region), ("ram", board.ram_region)):
        regions[key] = Region(r.origin, min(r.size * 64, (1 << 32) - r.origin - 4) & ~3)
    render(board, big, stack_size=stack_size, semihosting=semihosting, **regions)
    p, _ = link(big / "linker.ld", big / "oversize.elf")
    sizes = size_report(big / "oversize.elf", board, package_dir, prefix) if p.returncode == 0 else None
    parts = [f"{region} overflowed by {n} bytes" for region, n in over.items()]
    detail = f"\n{sizes}" if sizes else ""
    if sizes and any("RAM" in r.upper() for r in over):
        detail += "\n" + _ram_parts(sizes, _model_defines(package_dir))
    name = board.emulates or board.name
    return ImageTooLarge(f"model in {package_dir} does not fit board {name}: {'; '.join(parts)}"
                         f"{detail}", over, sizes)


def _ram_parts(sizes: SizeReport, defines: dict[str, int]) -> str:
    """What the board needs in RAM, part by part (the parts sum to sizes.ram_used)."""
    parts = {"arena": sizes.arena, "input buffer": defines.get("KILN_INPUT_BYTES", 0),
             "output buffer": defines.get("KILN_OUTPUT_BYTES", 0), "stack": sizes.stack}
    parts["the firmware's other .data/.bss"] = sizes.ram_used - sum(parts.values())
    return (f"  RAM needed {sizes.ram_used:,} B = " + " + ".join(f"{k} {v:,} B" for k, v in parts.items())
            + f"; the board has {sizes.ram_total:,} B")


def size_report(elf: Path, board: Board, package_dir: Path | None = None,
                prefix: str = "arm-none-eabi-") -> SizeReport:
    p = _run([tool("size", prefix), "-A", str(elf)], "arm-none-eabi-size")
    arena = 0
    if package_dir is not None and (package_dir / "model.h").exists():
        arena = _model_defines(package_dir).get("KILN_ARENA_SIZE", 0)
    return parse_size_output(p.stdout, flash_total=board.flash_region.size,
                             ram_total=board.ram_region.size, arena=arena)


def read_symbols(elf: Path, prefix: str = "arm-none-eabi-") -> dict[str, int]:
    """Global and local symbol name -> address (from arm-none-eabi-nm)."""
    p = _run([tool("nm", prefix), str(elf)], "arm-none-eabi-nm")
    out = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[parts[2]] = int(parts[0], 16)
    return out
