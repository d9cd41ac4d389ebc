"""Link-time checks on a built image."""
from __future__ import annotations

from pathlib import Path

from .build import FirmwareError, read_symbols

# Anything that means a heap got linked in.
FORBIDDEN_SYMBOLS = ("malloc", "free", "calloc", "realloc", "_sbrk", "_sbrk_r", "_malloc_r",
                     "_free_r", "__malloc_av_", "sbrk")


def check_no_malloc(elf: str | Path, prefix: str = "arm-none-eabi-") -> None:
    """Raise FirmwareError naming the symbols if the image links a heap allocator."""
    syms = read_symbols(Path(elf), prefix)
    found = sorted(s for s in FORBIDDEN_SYMBOLS if s in syms)
    if found:
        raise FirmwareError(f"{elf}: heap allocator linked ({', '.join(found)}); Kiln firmware "
                            f"must not use malloc. See the .map file next to it for who pulls it in.")
