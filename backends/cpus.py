"""Compilation targets of the C backend: which schedules a core gets and how gcc builds for it.

``kernels``: int8 conv, depthwise, dense, add and softmax call Kiln's hand-written kernels in
``kiln_intrinsics.h`` (every target; TVM's default schedules remain the fallback for what they do
not cover). ``dsp``: the core has the Armv7E-M/Armv8-M DSP extension, so those kernels compile to
SXTB16/SMLAD (dual 16-bit MACs); on Cortex-M0+/M3 and the host (``__ARM_FEATURE_DSP`` undefined)
the same kernels use their portable C versions, which compute the same int32 results.
"""
from __future__ import annotations

import dataclasses

from kiln.common.cores import CORES
from kiln.frontend.errors import KilnError


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    name: str
    dsp: bool
    cflags: tuple = ()            # arm-none-eabi-gcc flags ("" for host)
    float_hw: bool = False
    optimize: str = "size"        # "size" | "speed": weight storage, schedules.weight_bits
    kernels: bool = True          # Kiln's kernels (kiln_intrinsics.h) where they apply; False: TVM's
                                  # default schedules everywhere (the fallback, kept covered by tests)
    helium: bool = False          # MVE kernels (kiln_mve.h, ops_mve.py) where they apply
    softmax_helper: bool = True   # int8 softmax of a kernel argument as one kiln_softmax_s8 call; False:
                                  # TVM's per-row stages (the path of a softmax fused behind another op)

    @property
    def is_host(self):
        return self.name == "host"


def _core_target(core) -> TargetSpec:
    """A bare core's compile target, from the one core table (kiln.common.cores): its DSP
    extension and the FPU a package for it assumes (a board's firmware build uses its own FPU)."""
    return TargetSpec(core.name, dsp=core.dsp, cflags=tuple(core.cflags()), float_hw=core.default_fpu != "none",
                      helium=core.helium)


TARGETS = {"host": TargetSpec("host", dsp=True), **{name: _core_target(c) for name, c in CORES.items()}}


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
