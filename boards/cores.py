"""Cortex-M cores Kiln knows: architecture, which FPUs each can have, and the GCC flags for each.

A board file names a core and an FPU kind (``none``/``sp``/``dp``); this table turns that pair
into ``-mcpu/-mfpu/-mfloat-abi`` and tells the firmware which timing hardware exists. Adding a
core means adding one entry here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Core:
    name: str
    arch: str                    # armv6-m, armv7-m, armv7e-m, armv8-m.main, armv8.1-m.main
    fpu_flags: dict              # fpu kind -> tuple of GCC flags
    has_cyccnt: bool = True      # DWT CYCCNT exists (ARMv6-M has none)
    has_msplim: bool = False     # ARMv8-M main stack limit register
    helium: bool = False         # MVE (M-profile vector extension)
    qemu_cpu: str = ""           # QEMU -cpu name (informational)

    def cflags(self, fpu: str) -> list[str]:
        return [f"-mcpu={self.name}", "-mthumb", *self.fpu_flags[fpu]]


_SOFT = ("-mfloat-abi=soft",)

CORES: dict[str, Core] = {
    c.name: c
    for c in [
        Core("cortex-m0plus", "armv6-m", {"none": _SOFT}, has_cyccnt=False),
        Core("cortex-m3", "armv7-m", {"none": _SOFT}),
        Core("cortex-m4", "armv7e-m", {"none": ("-mfloat-abi=soft",),
                                       "sp": ("-mfpu=fpv4-sp-d16", "-mfloat-abi=hard")}),
        Core("cortex-m7", "armv7e-m", {"none": _SOFT,
                                       "sp": ("-mfpu=fpv5-sp-d16", "-mfloat-abi=hard"),
                                       "dp": ("-mfpu=fpv5-d16", "-mfloat-abi=hard")}),
        Core("cortex-m33", "armv8-m.main", {"none": _SOFT,
                                            "sp": ("-mfpu=fpv5-sp-d16", "-mfloat-abi=hard")},
             has_msplim=True),
        Core("cortex-m55", "armv8.1-m.main", {"none": _SOFT,
                                              "dp": ("-mfpu=auto", "-mfloat-abi=hard")},
             has_msplim=True, helium=True),
    ]
}
