"""Kiln firmware: C runtime, UART drivers, startup/linker templates, QEMU plugin, build helpers.

Public API:
    build(package_dir, board, out_dir, *, emulate=False, stack_size=8192, ...) -> Image
    plugin_path(build=True) -> Path            # the QEMU instruction-count plugin (.so)
    build_fuzzer(out_dir) -> Path; run_fuzzer(exe, iterations, seed) -> dict
    check_no_malloc(elf) -> None               # raises if malloc/free/_sbrk are linked
"""
from .build import DRIVERS, FIRMWARE_DIR, FirmwareError, Image, ImageTooLarge, build, read_symbols, render, size_report
from .fuzzing import build_fuzzer, run_fuzzer
from .plugin import build_plugin, plugin_path
from .sizes import SizeReport
from .symbols import FORBIDDEN_SYMBOLS, check_no_malloc

__all__ = ["build", "Image", "SizeReport", "FirmwareError", "ImageTooLarge", "plugin_path",
           "check_no_malloc", "FORBIDDEN_SYMBOLS", "read_symbols", "render", "size_report",
           "DRIVERS", "FIRMWARE_DIR", "build_plugin", "build_fuzzer", "run_fuzzer"]
