"""The Cortex-M cores Kiln knows, in one table that the boards (how firmware is built and timed)
and the C backend (which kernels a core gets, how a package is measured) both read.

Per core: its architecture, the FPUs it can have and the GCC flags for each, the FPU a compile
target for the bare core assumes (``default_fpu``: a board file may name another one its part
has), whether it has the DSP extension (SXTB16/SMLAD: Kiln's dot-product kernels), DWT CYCCNT,
the ARMv8-M stack limit register and Helium (MVE). Adding a core means adding one entry here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Core:
    name: str
    arch: str                    # armv6-m, armv7-m, armv7e-m, armv8-m.main, armv8.1-m.main
    fpu_flags: dict              # fpu kind ("none" / "sp" / "dp") -> tuple of GCC flags
    default_fpu: str = "none"    # what `kiln compile --target <core>` assumes
    dsp: bool = False            # DSP extension (Armv7E-M / Armv8-M Main with DSP)
    has_cyccnt: bool = True      # DWT CYCCNT exists (ARMv6-M has none)
    has_msplim: bool = False     # ARMv8-M main stack limit register
    helium: bool = False         # MVE (M-profile vector extension)

    @property
    def macs_per_instruction_limit(self) -> int:
        """The most int8 multiply-accumulates one instruction of the core's ISA does (the ceiling
        of a per-layer roofline): MLA, 1, on cores without the DSP extension; SMLAD, 2 (two 16-bit
        products summed); Helium's VMLADAVA.S8, 16 (sixteen 8-bit lanes, executed in two beats
        pairs on the Cortex-M55)."""
        return 16 if self.helium else 2 if self.dsp else 1

    def cflags(self, fpu: str | None = None) -> list[str]:
        return [f"-mcpu={self.name}", "-mthumb", *self.fpu_flags[fpu or self.default_fpu]]


_SOFT = ("-mfloat-abi=soft",)

CORES: dict[str, Core] = {
    c.name: c
    for c in [
        Core("cortex-m0plus", "armv6-m", {"none": _SOFT}, has_cyccnt=False),
        Core("cortex-m3", "armv7-m", {"none": _SOFT}),
        Core("cortex-m4", "armv7e-m", {"none": _SOFT, "sp": ("-mfpu=fpv4-sp-d16", "-mfloat-abi=hard")},
             default_fpu="sp", dsp=True),
        Core("cortex-m7", "armv7e-m", {"none": _SOFT,
                                       "sp": ("-mfpu=fpv5-sp-d16", "-mfloat-abi=hard"),
                                       "dp": ("-mfpu=fpv5-d16", "-mfloat-abi=hard")},
             default_fpu="dp", dsp=True),
        Core("cortex-m33", "armv8-m.main", {"none": _SOFT, "sp": ("-mfpu=fpv5-sp-d16", "-mfloat-abi=hard")},
             default_fpu="sp", dsp=True, has_msplim=True),
        Core("cortex-m55", "armv8.1-m.main", {"none": _SOFT, "dp": ("-mfpu=auto", "-mfloat-abi=hard")},
             default_fpu="dp", dsp=True, has_msplim=True, helium=True),
    ]
}
