"""Flash/RAM accounting from ``arm-none-eabi-size -A``.

flash = .text (+ .ARM.exidx) + .rodata + .data (its load image)
RAM   = .data + .bss + .stack + .noinit        (the arena is part of .bss)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

_FLASH_ONLY = (".text", ".rodata", ".ARM.exidx")
_RAM_ONLY = (".bss", ".stack", ".noinit")


@dataclass
class SizeReport:
    text: int
    rodata: int
    data: int
    bss: int
    stack: int
    arena: int
    flash_used: int
    flash_total: int
    ram_used: int
    ram_total: int
    sections: dict[str, int] = field(default_factory=dict)

    @property
    def flash_free(self) -> int:
        return self.flash_total - self.flash_used

    @property
    def ram_free(self) -> int:
        return self.ram_total - self.ram_used

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(flash_free=self.flash_free, ram_free=self.ram_free)
        return d

    def __str__(self) -> str:
        def pct(a, b):
            return f"{100.0 * a / b:5.1f}%" if b else "  n/a"
        return (f"  .text {self.text:>9} B   .rodata {self.rodata:>9} B   .data {self.data:>7} B\n"
                f"  .bss  {self.bss:>9} B   (arena {self.arena} B)   .stack {self.stack:>7} B\n"
                f"  flash {self.flash_used:>9} / {self.flash_total} B ({pct(self.flash_used, self.flash_total)})\n"
                f"  RAM   {self.ram_used:>9} / {self.ram_total} B ({pct(self.ram_used, self.ram_total)})")


def parse_size_output(text: str, *, flash_total: int, ram_total: int, arena: int = 0) -> SizeReport:
    sections: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].startswith(".") and parts[1].isdigit():
            sections[parts[0]] = int(parts[1])
    g = sections.get
    text_b = g(".text", 0) + g(".ARM.exidx", 0)
    data = g(".data", 0)
    flash_used = sum(g(s, 0) for s in _FLASH_ONLY) + data
    ram_used = data + sum(g(s, 0) for s in _RAM_ONLY)
    return SizeReport(text=text_b, rodata=g(".rodata", 0), data=data, bss=g(".bss", 0),
                      stack=g(".stack", 0), arena=arena, flash_used=flash_used,
                      flash_total=flash_total, ram_used=ram_used, ram_total=ram_total,
                      sections=sections)
