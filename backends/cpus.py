"""Compilation targets of the C backend: which schedules a core gets and how gcc builds for it.

``kernels``: int8 conv, depthwise, dense, add and softmax call Kiln's hand-written kernels in
``kiln_intrinsics.h`` (every target; TVM's default schedules remain the fallback for what they do
not cover). ``dsp``: the core has the Armv7E-M/Armv8-M DSP extension, so those kernels compile to
SXTB16/SMLAD (dual 16-bit MACs); on Cortex-M0+/M3 and the host (``__ARM_FEATURE_DSP`` undefined)
the same kernels use their portable C versions, which compute the same int32 results.
"""
from __future__ import annotations

import dataclasses

from kiln.frontend.errors import KilnError


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    name: str
    dsp: bool
    cflags: tuple = ()            # arm-none-eabi-gcc flags ("" for host)
    float_hw: bool = False
    optimize: str = "size"        # "size" | "speed": weight storage, schedules.weight_bits
    kernels: bool = True          # Kiln's kernels (kiln_intrinsics.h) where they apply

    @property
    def is_host(self):
        return self.name == "host"


_M = ("-mthumb",)
TARGETS = {t.name: t for t in [
    TargetSpec("host", dsp=True),
    TargetSpec("cortex-m0plus", dsp=False, cflags=("-mcpu=cortex-m0plus", *_M, "-mfloat-abi=soft")),
    TargetSpec("cortex-m3", dsp=False, cflags=("-mcpu=cortex-m3", *_M, "-mfloat-abi=soft")),
    TargetSpec("cortex-m4", dsp=True, cflags=("-mcpu=cortex-m4", *_M, "-mfpu=fpv4-sp-d16", "-mfloat-abi=hard"),
               float_hw=True),
    TargetSpec("cortex-m7", dsp=True, cflags=("-mcpu=cortex-m7", *_M, "-mfpu=fpv5-d16", "-mfloat-abi=hard"),
               float_hw=True),
    TargetSpec("cortex-m33", dsp=True, cflags=("-mcpu=cortex-m33", *_M, "-mfpu=fpv5-sp-d16", "-mfloat-abi=hard"),
               float_hw=True),
    TargetSpec("cortex-m55", dsp=True, cflags=("-mcpu=cortex-m55", *_M, "-mfloat-abi=hard"), float_hw=True),
]}


def get(name, optimize=None) -> TargetSpec:
    if isinstance(name, TargetSpec):
        return name if optimize is None else dataclasses.replace(name, optimize=_optimize(optimize))
    if name not in TARGETS:
        raise KilnError(f"unknown C backend target {name!r}; known: {', '.join(TARGETS)}")
    t = TARGETS[name]
    return t if optimize is None else dataclasses.replace(t, optimize=_optimize(optimize))


OPTIMIZE = ("size", "speed")


def _optimize(value):
    if value not in OPTIMIZE:
        raise KilnError(f"--optimize must be one of {', '.join(OPTIMIZE)}, got {value!r}")
    return value
