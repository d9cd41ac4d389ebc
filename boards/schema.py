"""Board data: the dataclasses a board file turns into, and the validator that checks it.

A board is one TOML file in this folder (see docs/firmware.md, "Adding a board"). The validator
is deliberately small: every field is declared once in ``_SCHEMA`` with its type and, where it
matters, its allowed values; any problem raises :class:`BoardError` naming the file and the
dotted field path, what was expected and what was found.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.common.cores import CORES, Core
from kiln.common.errors import KilnError

UART_KINDS = ("cmsdk", "stm32-usart", "nrf-uarte", "rp2040-pl011")
FPU_KINDS = ("none", "sp", "dp")
BOOT2_KINDS = ("rp2040-generic-03h",)   # second-stage bootloaders kiln.firmware.boot2 builds
FLASH_METHODS = {
    # method -> {option: (type, required)}
    "qemu": {},
    "openocd": {"config": (list, True), "adapter_serial_option": (str, False)},
    "pyocd": {"target": (str, True)},
    "picotool": {},
    "copy-to-drive": {"drive_label": (str, True), "format": (str, True), "family_id": (int, False)},
}


class BoardError(KilnError, ValueError):
    """A board file is missing, unreadable, or does not match the schema."""


@dataclass(frozen=True)
class Region:
    origin: int
    size: int

    @property
    def end(self) -> int:
        return self.origin + self.size


@dataclass(frozen=True)
class RegWrite:
    """One step of a UART init sequence: read-modify-write, plain write, or wait for bits."""
    addr: int
    set: int = 0
    clear: int = 0
    value: int | None = None
    wait_set: int = 0


@dataclass(frozen=True)
class Uart:
    kind: str
    base: int
    baud: int
    rx_irq: int
    clock_hz: int
    tx_pin: int = -1
    rx_pin: int = -1
    brr_multiplier: int = 1
    init: tuple[RegWrite, ...] = ()


@dataclass(frozen=True)
class FlashMethod:
    method: str
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Qemu:
    machine: str
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    emulated: bool
    core: str
    fpu: str
    dsp: bool
    clock_hz: int
    irq_count: int
    flash_region: Region
    ram_region: Region
    uart: Uart
    flash: FlashMethod
    qemu: Qemu
    path: Path | None = None
    emulates: str | None = None      # set on a derived board: the real board it stands in for
    boot2: str | None = None         # second-stage bootloader placed at the start of flash
    core_clock_hz: int = 0           # the clock Kiln's firmware runs the core at (0: clock_hz)
    flash_wait_states: int = 0       # code memory wait states at that clock (boards/timing.py)

    @property
    def run_clock_hz(self) -> int:
        """The core clock under Kiln's firmware: the reset clock on boards whose PLL set-up Kiln
        does not do (``core_clock_hz``), else ``clock_hz``. Cycle counts convert to time with it."""
        return self.core_clock_hz or self.clock_hz

    @property
    def core_info(self) -> Core:
        return CORES[self.core]

    def cflags(self) -> list[str]:
        """GCC -mcpu/-mthumb/-mfpu/-mfloat-abi for this board."""
        return self.core_info.cflags(self.fpu)

    def replace(self, **changes: Any) -> Board:
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------
# Validation. A spec is {key: (type, required[, allowed values])}; nested tables are dicts.
_INT = int
_SCHEMA: dict[str, Any] = {
    "name": (str, True),
    "description": (str, False),
    "emulated": (bool, True),
    "core": (str, True, tuple(CORES)),
    "fpu": (str, True, FPU_KINDS),
    "dsp": (bool, True),
    "clock_hz": (_INT, True),
    "core_clock_hz": (_INT, False),
    "flash_wait_states": (_INT, False),
    "irq_count": (_INT, True),
    "boot2": (str, False, BOOT2_KINDS),
    "memory": {
        "flash": {"origin": (_INT, True), "size": (_INT, True)},
        "ram": {"origin": (_INT, True), "size": (_INT, True)},
    },
    "uart": {
        "kind": (str, True, UART_KINDS),
        "base": (_INT, True),
        "baud": (_INT, True),
        "rx_irq": (_INT, True),
        "clock_hz": (_INT, True),
        "tx_pin": (_INT, False),
        "rx_pin": (_INT, False),
        "brr_multiplier": (_INT, False),
        "init": (list, False),
    },
    "flash": "flash",   # validated by _check_flash (options depend on the method)
    "qemu": {"machine": (str, True), "extra_args": (list, False)},
}
_REGWRITE_KEYS = {"addr", "set", "clear", "value", "wait_set"}


def _tname(t: type) -> str:
    return {int: "integer", str: "string", bool: "boolean", list: "array", dict: "table"}.get(t, t.__name__)


def _found(v: Any) -> str:
    return f"{_tname(type(v))} {v!r}"


def _check_value(where: str, key: str, v: Any, spec: tuple) -> None:
    t = spec[0]
    ok = isinstance(v, t) and not (t is int and isinstance(v, bool))
    if not ok:
        raise BoardError(f"{where}: field '{key}': expected {_tname(t)}, found {_found(v)}")
    if len(spec) > 2 and v not in spec[2]:
        raise BoardError(f"{where}: field '{key}': expected one of {list(spec[2])}, found {v!r}")
    if t is int and v < 0:
        raise BoardError(f"{where}: field '{key}': expected a non-negative integer, found {v}")


def _check_table(where: str, prefix: str, data: Any, spec: dict) -> None:
    if not isinstance(data, dict):
        raise BoardError(f"{where}: field '{prefix.rstrip('.')}': expected table, found {_found(data)}")
    for key in data:
        if key not in spec:
            raise BoardError(f"{where}: field '{prefix}{key}': unknown field "
                             f"(known: {', '.join(sorted(spec))})")
    for key, sub in spec.items():
        path = f"{prefix}{key}"
        if isinstance(sub, dict):
            if key not in data:
                raise BoardError(f"{where}: field '{path}': missing (required table)")
            _check_table(where, path + ".", data[key], sub)
        elif sub == "flash":
            if key not in data:
                raise BoardError(f"{where}: field '{path}': missing (required table)")
            _check_flash(where, data[key])
        elif key in data:
            _check_value(where, path, data[key], sub)
        elif sub[1]:
            raise BoardError(f"{where}: field '{path}': missing (required {_tname(sub[0])})")


def _check_flash(where: str, data: Any) -> None:
    if not isinstance(data, dict):
        raise BoardError(f"{where}: field 'flash': expected table, found {_found(data)}")
    if "method" not in data:
        raise BoardError(f"{where}: field 'flash.method': missing (required string)")
    _check_value(where, "flash.method", data["method"], (str, True, tuple(FLASH_METHODS)))
    opts = FLASH_METHODS[data["method"]]
    spec = {"method": (str, True), **opts}
    _check_table(where, "flash.", data, spec)


def _check_semantics(where: str, d: dict) -> None:
    core = CORES[d["core"]]
    if d["fpu"] not in core.fpu_flags:
        raise BoardError(f"{where}: field 'fpu': {d['core']} cannot have fpu={d['fpu']!r} "
                         f"(allowed: {sorted(core.fpu_flags)})")
    for reg in ("flash", "ram"):
        r = d["memory"][reg]
        if r["size"] == 0 or r["size"] % 4:
            raise BoardError(f"{where}: field 'memory.{reg}.size': expected a non-zero multiple "
                             f"of 4, found {r['size']}")
        if r["origin"] + r["size"] > 1 << 32:
            raise BoardError(f"{where}: field 'memory.{reg}': region ends past 4 GB")
    f, r = d["memory"]["flash"], d["memory"]["ram"]
    if f["origin"] < r["origin"] + r["size"] and r["origin"] < f["origin"] + f["size"]:
        raise BoardError(f"{where}: field 'memory': flash and ram regions overlap")
    if d["uart"]["rx_irq"] >= d["irq_count"]:
        raise BoardError(f"{where}: field 'uart.rx_irq': {d['uart']['rx_irq']} is not below "
                         f"irq_count={d['irq_count']}")
    if d["clock_hz"] == 0 or d["uart"]["baud"] == 0 or d["uart"]["clock_hz"] == 0:
        raise BoardError(f"{where}: field 'clock_hz'/'uart.baud'/'uart.clock_hz' must be non-zero")
    if not 0 <= d.get("flash_wait_states", 0) <= 15:
        raise BoardError(f"{where}: field 'flash_wait_states': expected 0..15, found {d['flash_wait_states']}")
    if d.get("core_clock_hz") is not None and not 0 < d["core_clock_hz"] <= d["clock_hz"]:
        raise BoardError(f"{where}: field 'core_clock_hz': expected 1..clock_hz ({d['clock_hz']}), "
                         f"found {d['core_clock_hz']}")
    for i, step in enumerate(d["uart"].get("init", [])):
        key = f"uart.init[{i}]"
        if not isinstance(step, dict):
            raise BoardError(f"{where}: field '{key}': expected table, found {_found(step)}")
        unknown = set(step) - _REGWRITE_KEYS
        if unknown:
            raise BoardError(f"{where}: field '{key}.{sorted(unknown)[0]}': unknown field "
                             f"(known: {', '.join(sorted(_REGWRITE_KEYS))})")
        if "addr" not in step:
            raise BoardError(f"{where}: field '{key}.addr': missing (required integer)")
        for k, v in step.items():
            _check_value(where, f"{key}.{k}", v, (int, True))
        if len(set(step) & {"set", "clear", "value", "wait_set"}) == 0:
            raise BoardError(f"{where}: field '{key}': needs one of set/clear/value/wait_set")
        if "value" in step and ({"set", "clear"} & set(step)):
            raise BoardError(f"{where}: field '{key}': 'value' cannot be combined with set/clear")
    for i, a in enumerate(d["qemu"].get("extra_args", [])):
        if not isinstance(a, str):
            raise BoardError(f"{where}: field 'qemu.extra_args[{i}]': expected string, found {_found(a)}")
    if d["flash"]["method"] == "openocd":
        for i, c in enumerate(d["flash"]["config"]):
            if not isinstance(c, str):
                raise BoardError(f"{where}: field 'flash.config[{i}]': expected string, found {_found(c)}")


def validate(data: dict, where: str) -> Board:
    """Check a parsed board file and build the :class:`Board`. ``where`` names the file."""
    _check_table(where, "", data, _SCHEMA)
    _check_semantics(where, data)
    u = dict(data["uart"])
    init = tuple(RegWrite(**s) for s in u.pop("init", []))
    fl = dict(data["flash"])
    q = data["qemu"]
    return Board(
        name=data["name"],
        description=data.get("description", data["name"]),
        emulated=data["emulated"],
        core=data["core"],
        fpu=data["fpu"],
        dsp=data["dsp"],
        clock_hz=data["clock_hz"],
        core_clock_hz=data.get("core_clock_hz", 0),
        flash_wait_states=data.get("flash_wait_states", 0),
        irq_count=data["irq_count"],
        flash_region=Region(**data["memory"]["flash"]),
        ram_region=Region(**data["memory"]["ram"]),
        uart=Uart(init=init, **u),
        flash=FlashMethod(method=fl.pop("method"), options=fl),
        qemu=Qemu(machine=q["machine"], extra_args=tuple(q.get("extra_args", ()))),
        path=Path(where),
        boot2=data.get("boot2"),
    )
